"""The state of one file of a store, read-only: what ``ls``, ``db status`` and upgrades start from.

Contract:

* :func:`database_info` classifies one database of a store read-only, file
  and metadata.json included, into one :class:`~store.schema.DatabaseState`
  (with :func:`~.connections.classify`), counts its rows and its claims when
  it is current, and never raises for a bad file: what is wrong becomes a
  state and a message naming the file. It reads in one transaction, made
  again if a writer changed the file under a read without locks
  (:func:`~.connections.stable_read`): a file is never called damaged for
  a concurrent write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy.exc import DBAPIError

from store import schema
from store.backends.sqlite.connections import checked_transaction, classify, create_sqlite_engine, stable_read
from store.backends.sqlite.errors import translated
from store.backends.sqlite.rows import SqliteClaimTable, SqliteRepository
from store.errors import JudgestoreError, MetadataMismatchError, MetadataMissingError
from store.layout import Location, database_size, read_location_metadata
from store.reports import DatabaseInfo
from store.schema import DatabaseState, Revisions, failed_state, status_error
from store.settings import Settings

if TYPE_CHECKING:
    from store.claim_table import ClaimsSummary

T = TypeVar("T")


def database_info(
    root: Path, location: Location, settings: Settings, *, known: Revisions | None = None, count_rows: bool = True
) -> DatabaseInfo:
    """Classify one database read-only (and count its rows when it is current); never raises for a bad file."""
    known = known or schema.revisions()  # the module's attribute: tests stand in another line of scripts
    path = location.db_path(root)
    size = database_size(path)
    revision: str | None = None
    rows: int | None = None
    error: str | None = None
    claims: ClaimsSummary | None = None

    def attempt() -> tuple[DatabaseState, str | None, str | None, ClaimsSummary | None, int | None]:
        claims: ClaimsSummary | None = None
        rows: int | None = None
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            with checked_transaction(engine, path) as conn:  # read again if a writer changed it under a lockless read
                status = classify(conn, path, known)
                if status.state is DatabaseState.CURRENT:
                    claims = SqliteClaimTable(conn, location.role).summary()  # an empty table but while jobs run
                if status.state is DatabaseState.CURRENT and count_rows:
                    rows = SqliteRepository(conn, location.role).count()
                elif status.state is DatabaseState.EMPTY and count_rows:
                    rows = 0  # no tables yet: empty, nothing to read (store.store's one meaning of it)
        finally:
            engine.dispose()
        return status.state, status.revision, status_error(status, path), claims, rows

    try:
        state, revision, error, claims, rows = stable_read(path, attempt)
    except DBAPIError as e:
        failure = translated(path, e)
        state, error = failed_state(failure), str(failure)
    except (JudgestoreError, OSError) as e:
        state, error = failed_state(e), str(e)
    if state not in (DatabaseState.NOT_A_DATABASE, DatabaseState.CORRUPT, DatabaseState.UNREADABLE):
        try:
            read_location_metadata(root, location)
        except MetadataMissingError as e:
            state, error = DatabaseState.METADATA_MISSING, str(e)
        except MetadataMismatchError as e:
            state, error = DatabaseState.METADATA_MISMATCH, str(e)
        except OSError as e:  # unreadable (permissions): say so, never a traceback
            state, error = DatabaseState.UNREADABLE, f"{location.metadata_path(root)}: {e}"
    return DatabaseInfo(location, str(path), state, revision, known.head, rows, size, error, claims)


def database_infos(
    root: Path, locations: Iterable[Location], settings: Settings, *, count_rows: bool = True
) -> Iterator[DatabaseInfo]:
    for location in locations:
        yield database_info(root, location, settings, count_rows=count_rows)


# ---------------------------------------------------------------- opening a file
