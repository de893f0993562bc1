"""Where the store's databases live: SQLite files in a folder (:mod:`.sqlite`), schemas on a server (:mod:`.postgres`).

Contract: each backend implements the seam of :mod:`store.backend` (a
``Storage`` of ``Database`` s) and owns everything that differs between the
two: connections, the hot statements, what a driver failure means, schema
checks, upgrades, verification and vacuuming. Nothing above the seam
branches on a dialect or touches a folder or a URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from store.errors import InvalidInputError, JudgestoreError
from store.settings import home_expanded, no_url

if TYPE_CHECKING:
    from store.backend import Storage
    from store.settings import Settings


def open_storage(settings: Settings, *, root: Path | str | None, url: str | None, readonly: bool) -> Storage:
    """The storage a store of these settings is: ``url`` (a server), else ``root``, else what the settings say.

    An explicit ``root`` means that folder whatever ``JUDGESTORE_STORE_URL`` says; both at once are refused.
    Only a server's store imports the PostgreSQL driver.
    """
    if root is not None and url is not None:
        raise InvalidInputError("a store is a folder (root) or a server (url), not both")
    # An empty one would be the working directory, or no server at all (the folder store, silently)
    if url is not None and not url.strip():
        raise InvalidInputError("the store's URL is empty: give a server's URL, or leave it out")
    if root is not None and not str(root).strip():
        raise InvalidInputError("the store's folder is empty: give its path ('.' for the working directory)")
    if root is not None:
        no_url(str(root), "the store's folder (root)")
    if url is None and root is None:
        check_settings_url(settings)
        url = settings.store_url
    if url:
        from store.backends.postgres.storage import PostgresStorage

        return PostgresStorage(url, settings, readonly=readonly)
    from store.backends.sqlite.storage import SqliteStorage

    # a ~ a caller passes on (Store(root="~/x")) is the home folder, as in every setting and option
    return SqliteStorage(home_expanded(Path(root)) if root is not None else settings.store_root, settings,
                         readonly=readonly)  # fmt: skip


def check_settings_url(settings: Settings) -> None:
    """InvalidInputError naming where the settings' store URL came from (``JUDGESTORE_STORE_URL``, an exported
    variable the user may have forgotten, or a caller's ``Settings(store_url=...)``) if it is not a store's URL."""
    if settings.store_url:
        from store.backends.postgres.connections import checked_store_url

        try:
            checked_store_url(settings.store_url)
        except InvalidInputError as e:
            exported = os.environ.get("JUDGESTORE_STORE_URL", "").strip() == settings.store_url.strip()
            raise InvalidInputError(f"{'JUDGESTORE_STORE_URL' if exported else 'Settings.store_url'}: {e}") from e


def typed_error(error: BaseException, *, root: Path, url: str | None) -> JudgestoreError:
    """The typed error of a driver or filesystem failure no library path translated (a command's last defence).

    The server's words for what its driver raised (never SQLite's), naming ``url``; the folder's for anything
    else, naming ``root``.
    """
    from sqlalchemy.exc import DBAPIError

    if isinstance(error, DBAPIError) and (url or type(error.orig).__module__.startswith("psycopg")):
        from store.backends.postgres.errors import translated as server_error

        return server_error(str(url or "postgresql://"), error)
    from store.backends.sqlite.errors import translated as file_error

    return file_error(root, error)
