"""One descriptor schema on a PostgreSQL server: the store's repository on the server's connections.

Contract: :class:`PostgresDatabase` is the PostgreSQL side of
:class:`store.backend.Database`: every connection maps the models onto its
schema (``schema_translate_map``), reads run in read-only transactions,
writes take the schema's write lock first
(:func:`store.backends.postgres.generations.write_lock`: they take turns),
are retried by the storage's policy, and every driver error is typed
(:mod:`store.backends.postgres.errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TypeVar

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from store.backend import Database
from store.backends.postgres.errors import raise_translated
from store.backends.postgres.generations import write_lock
from store.backends.postgres.registry import quoted, schema_name, schema_options
from store.backends.postgres.rows import PostgresClaimTable, PostgresRepository
from store.errors import DatabaseMissingError, ReadTransactionWriteError
from store.layout import Location, StoredMetadata
from store.schema import VERSION_TABLE
from store.settings import Settings

T = TypeVar("T")


class Server(Protocol):
    """What a schema's database uses of its storage (:class:`~.storage.PostgresStorage`)."""

    url: str
    settings: Settings
    readonly: bool

    def location_where(self, location: Location) -> str: ...

    def connect(self) -> Connection: ...

    def connection(self, *, write: bool = False) -> AbstractContextManager[Connection]: ...

    def retry(self, attempt: Callable[[], T], *, where: str | None = None) -> T: ...

    def metadata(self, conn: Connection, location: Location) -> StoredMetadata | None: ...

    def size_of(self, location: Location) -> int: ...


class PostgresDatabase(Database):
    """One descriptor schema: the same repository as SQLite, on the server's connections."""

    def __init__(self, storage: Server, location: Location, stored: StoredMetadata | None = None) -> None:
        """``stored``: the registry's record as opening read it (it never changes for a schema)."""
        self.storage = storage
        self._stored = stored
        self.location = location
        self.where = storage.location_where(location)
        self.settings = storage.settings
        self.readonly = storage.readonly
        self._options = schema_options(location)
        self._schema = schema_name(location)
        # As long as a write waits for a locked SQLite file in all (each try's busy timeout, then the retries): a
        # writer frozen inside its transaction (a suspended job) held every other writer of the schema, silently.
        self._patience_ms = self.settings.busy_timeout_ms * (self.settings.lock_retries + 1)

    def _repository(self, conn: Connection) -> PostgresRepository:
        return PostgresRepository(conn, self.location.role)

    def _refuse_another_revision(self, conn: Connection) -> None:
        """Inside a write transaction, after its write lock, which an upgrade holds while it migrates
        (:mod:`~store.backends.postgres.upgrade`): one indexed SELECT per write transaction (was: one each second,
        outside it, so a write made within a second of another process's upgrade went in)."""
        found = conn.execute(text(f"SELECT version_num FROM {quoted(self._schema)}.{VERSION_TABLE}")).scalars()
        self._refuse_revision(list(found))

    def _claim_table(self, conn: Connection) -> PostgresClaimTable:
        return PostgresClaimTable(conn, self.location.role)

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[Connection]:
        with self.storage.connect() as conn:
            # A read is one snapshot, as on SQLite (Database.reading's contract): under READ COMMITTED each
            # statement took its own, so the figures of one `stats` came from different moments of a writer's work
            reading = {"postgresql_readonly": True, "isolation_level": "REPEATABLE READ"}
            conn = conn.execution_options(**self._options, **({} if write else reading))
            try:
                with conn.begin():
                    if write:  # before any row: writers deadlocked over the generation counter (see write_lock)
                        write_lock(conn, self._schema, wait_ms=self._patience_ms)
                        self._refuse_another_revision(conn)
                    yield conn
            except DBAPIError as e:  # a write in our read-only transaction: the same error as on SQLite
                if not write and getattr(e.orig, "sqlstate", None) == "25006" and _writes(e.statement):
                    raise ReadTransactionWriteError(self.where) from e
                raise

    @contextmanager
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> Iterator[None]:
        try:
            yield
        except DBAPIError as e:
            raise_translated(self.storage.url, e, where=self.where)

    def _retry(self, attempt: Callable[[], T]) -> T:
        return self.storage.retry(attempt, where=self.where)

    def _stable(self, attempt: Callable[[], T]) -> T:
        """A read that returns whole (a lookup, a count) runs again after a connection lost or a server restarting,
        as a write does: a copy's read-back, a cache's lookup, did not."""
        return self.storage.retry(attempt, where=self.where)

    def size_bytes(self) -> int:
        return self.storage.size_of(self.location)

    def metadata(self) -> StoredMetadata:
        if self._stored is not None:
            return self._stored
        with self.storage.connection() as conn:
            stored = self.storage.metadata(conn, self.location)
        if stored is None:
            raise DatabaseMissingError(self.where, "is not in this store's registry")
        return stored


_WRITING_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "DROP", "ALTER", "TRUNCATE"})


def _writes(statement: str | None) -> bool:
    """Whether a statement the server refused in a read-only transaction was a write of the caller's (a standby's
    refusal of anything else stays the server's error)."""
    words = (statement or "").split(None, 1)
    return bool(words) and words[0].upper() in _WRITING_VERBS
