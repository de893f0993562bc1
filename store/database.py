"""One descriptor database and the transactions over it, whatever holds it: an SQLite file or a PostgreSQL schema.

Contract:

* :class:`Database` is what callers get from :class:`~store.store.Store`:
  :meth:`~Database.get_many`, :meth:`~Database.put_many`,
  :meth:`~Database.delete`, :meth:`~Database.count` and
  :meth:`~Database.query`, each in a transaction of its own, the writes
  retried as a whole unit when the backend says the attempt may simply run
  again (a lock held too long, a serialisation failure, a dropped
  connection); or :meth:`~Database.transaction` / :meth:`~Database.reading`
  for several statements in one transaction. Every failure is raised as a
  typed error naming the database (``where``) and the next step.
* A read-only database refuses every write before touching anything.
* Subclasses say how to connect, retry and translate: :class:`SqliteDatabase`
  here (``BEGIN IMMEDIATE`` writers; a read-only file read as immutable is
  read again if a writer changed it meanwhile),
  :class:`store.postgres_storage.PostgresDatabase` for a server.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from store.engine import file_stamp, sqlite_engine
from store.errors import (
    CorruptDatabaseError,
    DatabaseBusyError,
    DatabaseFileError,
    NotADatabaseError,
    StoreFullError,
)
from store.layout import Location, StoredMetadata, database_size, read_metadata
from store.records import Record, RowFilter
from store.repository import Repository
from store.row_statements import OnConflict, check_keys, gc_paused, journaled_bytes
from store.settings import Settings
from store.sqlite_errors import retry_while_locked, translated
from store.sqlite_rows import sqlite_get_many, sqlite_insert

T = TypeVar("T")
READONLY_READ_ATTEMPTS = 5


class Database:
    """One descriptor database (see the module docstring); built by the store, never directly."""

    location: Location
    where: str  # how messages name it: a file's path, or a server's schema
    path: Path | None  # the SQLite file, for what only a file has (size, VACUUM); None on a server
    settings: Settings
    readonly: bool

    @property
    def role(self) -> str:
        return self.location.role

    # ------------------------------------------------------------ what a backend says

    def _connect(self, *, write: bool) -> AbstractContextManager[Connection]:
        """A connection inside a transaction that commits on success (a writer's when ``write``)."""
        raise NotImplementedError

    @contextmanager
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> Iterator[None]:
        """Raise every driver or filesystem failure as its typed error (``needed_bytes()`` sizes a full disk's)."""
        raise NotImplementedError
        yield

    def _retry(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` again after a failure that a second attempt may not meet."""
        raise NotImplementedError

    def _stable(self, attempt: Callable[[], T]) -> T:
        """Run a read; a backend may run it again if what it read changed under it."""
        return attempt()

    def metadata(self) -> StoredMetadata:
        """What the descriptor folder's metadata.json (or a server's registry) records."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this database holds open."""

    def size_bytes(self) -> int:
        """Bytes it takes on disk (or on the server)."""
        raise NotImplementedError

    # ------------------------------------------------------------ transactions

    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise DatabaseFileError(
                self.where, "was opened read-only: writes are refused (open the store without readonly)"
            )

    @contextmanager
    def transaction(self) -> Iterator[Repository]:
        """A write transaction: commits on success, rolls back on error."""
        self._refuse_if_readonly()
        with self._translated(), self._connect(write=True) as conn:
            yield Repository(conn, self.location.role)

    @contextmanager
    def reading(self) -> Iterator[Repository]:
        """A read transaction: one consistent snapshot for everything done inside it."""
        with self._translated(), self._connect(write=False) as conn:
            yield Repository(conn, self.location.role)

    def _write(self, work: Callable[[Repository], T], needed_bytes: Callable[[], int] | None = None) -> T:
        self._refuse_if_readonly()

        def attempt() -> T:
            with self._connect(write=True) as conn:
                return work(Repository(conn, self.location.role))

        with self._translated(needed_bytes):
            return self._retry(attempt)

    def _read(self, work: Callable[[Repository], T]) -> T:
        def attempt() -> T:
            with self.reading() as repo:
                return work(repo)

        return self._stable(attempt)

    # ------------------------------------------------------------ rows

    def get_many(self, hashes: Iterable[str]) -> dict[str, Record]:
        keys = list(hashes)
        return self._read(lambda repo: repo.get_many(keys))

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        rows = list(records)
        return self._write(lambda repo: repo.put_many(rows, on_conflict), needed_bytes=lambda: journaled_bytes(rows))

    def delete(self, flt: RowFilter) -> int:
        return self._write(lambda repo: repo.delete(flt))

    def count(self, flt: RowFilter | None = None) -> int:
        return self._read(lambda repo: repo.count(flt))

    def query(self, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        """Stream matching rows; the read transaction stays open until the iterator is exhausted or closed."""
        with self.reading() as repo:
            yield from repo.query(flt, limit=limit)


def stable_read(path: Path, read: Callable[[], T]) -> T:
    """Run a read-only ``read`` of a file; run it again if a writer changed the file under it."""
    for _ in range(READONLY_READ_ATTEMPTS):
        before = file_stamp(path)
        try:
            result = read()
        except (CorruptDatabaseError, NotADatabaseError):
            if file_stamp(path) == before:
                raise
            continue
        after = file_stamp(path)
        if after == before or (before.wal_exists and after.wal_exists):  # with a WAL, SQLite's locks held
            return result
    raise DatabaseBusyError(
        path, f"changed under {READONLY_READ_ATTEMPTS} read-only reads in a row (writers are busy); try again"
    )


class SqliteDatabase(Database):
    """One SQLite file of a store root: ``BEGIN IMMEDIATE`` writers, immutable read-only reads re-checked.

    :meth:`get_many` and :meth:`put_many` run on a sqlite3 connection with the
    store's pragmas (:mod:`store.repository`'s SQLite paths): the one that
    found the file current when it was opened, kept for them (a second thread
    meanwhile, and every read-only read, gets a connection of its own). Everything
    else goes through an SQLAlchemy engine, created the first time something
    needs it (:attr:`engine`): opening a database and reading or writing its
    rows never builds one.
    """

    def __init__(
        self,
        location: Location,
        path: Path,
        connect: Callable[[], sqlite3.Connection],
        settings: Settings,
        readonly: bool,
        *,
        connection: sqlite3.Connection | None = None,
        engine: Engine | None = None,
    ) -> None:
        """``connect`` opens a connection with the store's pragmas (:func:`store.engine.sqlite_connector`);
        ``connection`` is one already open (read-write only), ``engine`` one the opener built."""
        self.location = location
        self.path = path
        self.where = str(path)
        self.settings = settings
        self.readonly = readonly
        self._connect_fn = connect
        self._connection = connection
        self._connection_lock = threading.Lock()
        self._engine = engine
        self._engine_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine over this file (created on first use; the ORM's way in)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = sqlite_engine(self._connect_fn, None, pooled=not self.readonly)
        return self._engine

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[Connection]:
        if not write:
            with self.engine.connect() as conn, conn.begin():
                yield conn
            return
        conn = self.engine.connect().execution_options(write=True)
        try:
            self._retry(conn.begin)  # BEGIN IMMEDIATE: waits for the write lock up front
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    @contextmanager
    def _driver(self) -> Iterator[sqlite3.Connection]:
        """A sqlite3 connection in autocommit mode: the kept one if it is free, else one for this call only."""
        if not self.readonly and self._connection_lock.acquire(blocking=False):
            try:
                if self._connection is None:
                    self._connection = self._connect_fn()
                conn = self._connection
                try:
                    yield conn
                finally:
                    if conn.in_transaction:  # a failure left it there: never hand it on like that
                        self._connection = None
                        conn.close()
            finally:
                self._connection_lock.release()
            return
        conn = self._connect_fn()  # read-only connections are made afresh (see store.engine)
        try:
            yield conn
        finally:
            conn.close()

    def get_many(self, hashes: Iterable[str]) -> dict[str, Record]:
        keys = list(hashes)
        if not keys:
            return {}

        def attempt() -> dict[str, Record]:
            with self._translated(), self._driver() as conn:
                return sqlite_get_many(conn, self.location.role, keys)

        return self._stable(attempt)

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        """Insert in a write transaction of its own; keys are checked after binding, before the commit.

        What :meth:`Repository.put_many` checks first is checked here too, and
        nothing of a batch holding a malformed row is committed; the row
        processing is done before the write lock is taken.
        """
        self._refuse_if_readonly()
        insert = sqlite_insert(self.location.role, on_conflict)
        records = list(records)
        with gc_paused():  # a batch of tuples that outlive the loop: the GC would rescan them
            rows = insert.rows(records)
        if not rows:
            return 0

        def attempt() -> int:
            with self._driver() as conn:
                conn.execute("BEGIN IMMEDIATE")  # waits for the write lock up front
                try:
                    written = insert.execute(conn, rows)
                    check_keys(self.location.role, records)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return written

        with self._translated(lambda: journaled_bytes(records)):
            return self._retry(attempt)

    @contextmanager
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> Iterator[None]:
        assert self.path is not None
        try:
            yield
        except (DBAPIError, sqlite3.Error, OSError) as e:
            typed = translated(self.path, e)
            if isinstance(typed, StoreFullError) and needed_bytes is not None:
                typed = StoreFullError(self.path, free_bytes=typed.free_bytes, needed_bytes=needed_bytes())
            raise typed from e

    def _retry(self, attempt: Callable[[], T]) -> T:
        assert self.path is not None
        return retry_while_locked(attempt, self.path, self.settings)

    def _stable(self, attempt: Callable[[], T]) -> T:
        assert self.path is not None
        return stable_read(self.path, attempt) if self.readonly else attempt()

    def metadata(self) -> StoredMetadata:
        assert self.path is not None
        return read_metadata(self.path.parent)

    def size_bytes(self) -> int:
        assert self.path is not None
        return database_size(self.path)

    def close(self) -> None:
        with self._connection_lock:  # waits for a get_many or put_many under way
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        if self._engine is not None:
            self._engine.dispose()
