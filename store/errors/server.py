"""A PostgreSQL store's server: what it refuses, cannot do, or failed at.

Contract: every driver error on a server store reaches the caller as a
:class:`ServerError` (:func:`store.backends.postgres.errors.translated`
chooses which); its ``url`` is shown without its password. A transaction a
:class:`ServerError` ends was rolled back.
"""

from __future__ import annotations

from store.errors.base import JudgestoreError
from store.errors.inputs import InvalidInputError

__all__ = [
    "STORE_UNUSABLE",
    "ForeignSchemaError",
    "ServerAuthError",
    "ServerBusyError",
    "ServerDamagedError",
    "ServerError",
    "ServerFullError",
    "ServerPermissionError",
    "ServerSchemaError",
    "ServerURLError",
    "ServerUnavailableError",
    "ServerValueError",
    "UnexpectedServerError",
]


class ServerError(JudgestoreError):
    """A PostgreSQL store's server cannot be used as asked (``url`` is shown without its password)."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        super().__init__(f"{url}: {message}")


class ServerUnavailableError(ServerError):
    """The server cannot be reached, or dropped the connection and stayed away past every retry."""


class ServerURLError(ServerError):
    """The store's URL names no database on the server, or a connection option libpq does not know."""


class ServerAuthError(ServerError):
    """The server refused the credentials."""


# The server as a whole cannot be used (not one database, not one row): a long command (an import, a copy, a fetch)
# stops at the first, rather than meet it again for each database or group after waiting out every retry.
STORE_UNUSABLE: tuple[type[ServerError], ...] = (ServerUnavailableError, ServerAuthError, ServerURLError)


class ServerPermissionError(ServerError):
    """The store's user may not do what the store needs (create schemas, write rows)."""


class ForeignSchemaError(ServerError):
    """A schema judgestore would use exists but belongs to something else; it is never touched."""


class ServerBusyError(ServerError):
    """The server kept aborting the transaction (serialisation failures, deadlocks, lock or statement timeouts)
    past every retry; it was rolled back."""


class ServerFullError(ServerError):
    """The server ran out of a resource (disk, memory, connection slots); the transaction was rolled back."""


class ServerValueError(ServerError, InvalidInputError):
    """The server, or its driver, refused a value judgestore sent; nothing of the statement was kept.

    :func:`store.tables.row_checks.check_values` refuses such values on both
    backends before anything is sent: this is what a value that passed it
    meets."""


class ServerSchemaError(ServerError):
    """A table or column the schema's revision promises is missing on the server: another tool edited it."""


class ServerDamagedError(ServerError):
    """The server reports damaged data (an index or a page): its administrator must repair it."""


class UnexpectedServerError(ServerError):
    """PostgreSQL or its driver failed in a way judgestore has no name for; the message carries their words."""
