"""One SQLite file of a store root: ``BEGIN IMMEDIATE`` writers, read-only reads re-checked, fast rows.

Contract:

* :class:`SqliteDatabase` is the SQLite side of :class:`store.backend.Database`:
  writers take the lock up front (``BEGIN IMMEDIATE``) and retry a lock held
  past the busy timeout; every failure is typed
  (:mod:`store.backends.sqlite.errors`).
* A read-only read on a connection that takes no locks (``immutable``: see
  :mod:`store.backends.sqlite.connections`) is checked once it is done: if a
  writer changed the file under it, a read that returns one result
  (``count``, ``get_many``, :meth:`~SqliteDatabase.damage`...) is run again
  (:func:`stable_read`), and a :meth:`~store.backend.Database.reading` block
  raises :class:`~store.errors.ChangedUnderReadError` rather than let what it
  read pass. A stream (``query``, ``stream``) is checked before each batch it
  gives: it is read again from the start while it has given nothing, and
  raises that error, saying how many (whole) rows it gave, once it has. A
  batch is :data:`CHECKED_BATCH_ROWS` rows, or fewer once its records take
  about :data:`~store.repository.PARTITION_BYTES` (measured as it is read:
  wide rows may follow narrow ones).
* :meth:`~SqliteDatabase.get_many` and :meth:`~SqliteDatabase.put_many` run on
  a sqlite3 connection (:mod:`store.backends.sqlite.rows`); everything else
  goes through an SQLAlchemy engine created on first use.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from store.backend import RECHECK_SECONDS, Database, values_read
from store.backends.sqlite.connections import (
    READONLY_READ_ATTEMPTS,
    ReadOnlyConnection,
    checked_transaction,
    is_current,
    read_checked,
    sqlite_engine,
    stable_read,
)
from store.backends.sqlite.errors import retry_while_locked, translated
from store.backends.sqlite.rows import SqliteClaimTable, SqliteRepository, sqlite_get_many, sqlite_insert
from store.backends.sqlite.verify import integrity_damage
from store.errors import ChangedUnderReadError, DatabaseBusyError, JudgestoreError, StoreFullError
from store.layout import Location, StoredMetadata, database_size, read_metadata, wal_path
from store.repository import PARTITION_BYTES, STREAM_SLICE, Repository, records_bytes
from store.schema import VERSION_TABLE
from store.settings import Settings
from store.tables.records import Record
from store.tables.row_checks import OnConflict, check_keys, gc_paused, journaled_bytes, listed_records, lookup_keys

T = TypeVar("T")


def _identity(path: Path) -> tuple[int, int]:
    """The file ``path`` names now (device and inode): another file once one was renamed over it."""
    found = path.stat()
    return found.st_dev, found.st_ino


CHECKED_BATCH_ROWS = 1_000  # rows a stream without locks reads before it checks the file and gives them, at most


def _next_batch(read: Iterator[T]) -> list[T]:
    """The next items of ``read``: :data:`CHECKED_BATCH_ROWS`, or fewer once the records among them take about
    :data:`~store.repository.PARTITION_BYTES` (weighed a slice at a time, as they come)."""
    batch: list[T] = []
    held = 0
    while len(batch) < CHECKED_BATCH_ROWS and held < PARTITION_BYTES:
        piece = list(itertools.islice(read, min(STREAM_SLICE, CHECKED_BATCH_ROWS - len(batch))))
        if not piece:
            break
        batch += piece
        held += records_bytes(piece)
    return batch


class SqliteDatabase(Database):
    """One SQLite file of a store root: ``BEGIN IMMEDIATE`` writers, read-only reads without locks re-checked.

    :meth:`get_many` and :meth:`put_many` run on a sqlite3 connection with the
    store's pragmas (:mod:`store.repository`'s SQLite paths): the one that
    found the file current when it was opened, kept for them while idle (a
    second thread meanwhile, and every read-only read, gets one of its own). Everything
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
        """``connect`` opens a connection with the store's pragmas (:func:`~.connections.sqlite_connector`);
        ``connection`` is one already open (read-write only), ``engine`` one the opener built."""
        self.location = location
        self.path = path
        self.where = str(path)
        self.settings = settings
        self.readonly = readonly
        self._connect_fn = connect
        self._idle: list[sqlite3.Connection] = [] if connection is None else [connection]
        self._opened = 0  # raised by close(): connections taken before it are closed as their calls end
        self._engine = engine
        self._engine_lock = threading.Lock()
        self._current_at = self.stamp()  # the file as it was when it was found current (see still_current)
        self._checked_at = time.monotonic()
        self._identity = _identity(path)  # the file opened; one renamed over it is another, its revision unknown

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine over this file (created on first use; the ORM's way in)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = sqlite_engine(self._connect_fn, None, pooled=not self.readonly)
        return self._engine

    def _repository(self, conn: Connection) -> SqliteRepository:
        return SqliteRepository(conn, self.location.role)

    def _claim_table(self, conn: Connection) -> SqliteClaimTable:
        return SqliteClaimTable(conn, self.location.role)

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[Connection]:
        if not write:
            with checked_transaction(self.engine, self.path) as conn:
                yield conn
            return
        conn = self.engine.connect().execution_options(write=True)
        try:
            self._retry(conn.begin)  # BEGIN IMMEDIATE: waits for the write lock up front
            self._refuse_another_revision(conn.connection.driver_connection)  # type: ignore[arg-type]
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    @contextmanager
    def _driver(self) -> Iterator[sqlite3.Connection]:
        """A sqlite3 connection in autocommit mode: the kept one when it is idle, else one of its own (kept after
        the call when none is).

        No lock is held across the caller's block: a Ctrl-C raised anywhere in
        it (even before this generator's cleanup runs) leaves nothing that
        :meth:`close` waits for. Taking the idle connection is one atomic
        ``list.pop``, so two threads never share one.
        """
        if self.readonly:  # read-only connections are made afresh (see store.backends.sqlite.connections)
            conn = self._connect_fn()
            try:
                with read_checked(conn, self.path):
                    yield conn
            finally:
                conn.close()
            return
        opened = self._opened  # a close() meanwhile: this connection is closed when the call ends, not kept
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect_fn()
        try:
            yield conn
        finally:
            # Never hand on one a failure left in a transaction; keep one idle connection at most
            if conn.in_transaction or self._idle or opened != self._opened:
                conn.close()
            else:
                self._idle.append(conn)

    def _one_read(self, rows: Callable[[Connection], Iterator[T]]) -> Iterator[T]:
        """:meth:`Database._one_read`; on a connection without locks, each batch is given once the file is known
        unchanged under it (see the module docstring)."""
        given = 0
        for _ in range(READONLY_READ_ATTEMPTS):
            with self._translated(), values_read(self.where), self.engine.connect() as conn, conn.begin():
                driver = conn.connection.driver_connection
                if not isinstance(driver, ReadOnlyConnection) or driver.unlocked_since is None:
                    yield from rows(conn)  # under SQLite's locks: the transaction is one snapshot
                    return
                read = rows(conn)
                while True:
                    try:
                        batch = _next_batch(read)
                    except Exception as e:  # pages torn by a checkpoint fail as "damaged": whose doing is it?
                        if not driver.changed_under():
                            raise
                        if given:
                            raise ChangedUnderReadError(self.path, rows_given=given) from e
                        break
                    if driver.changed_under():
                        if given:
                            raise ChangedUnderReadError(self.path, rows_given=given)
                        break  # nothing given yet: read it all again (a writer now present, under its locks)
                    if not batch:
                        return
                    given += len(batch)
                    yield from batch
        raise DatabaseBusyError(
            self.path, f"changed under {READONLY_READ_ATTEMPTS} read-only reads in a row (writers are busy); try again"
        )

    def get_many(self, hashes: Iterable[str], *, deferred: bool = True) -> dict[str, Record]:
        keys = lookup_keys(hashes)
        if not keys:
            return {}

        def attempt() -> dict[str, Record]:
            lean = self._deferred_columns() if deferred else None  # afresh: a retry records its own keys
            with self._translated(), self._driver() as conn:
                return sqlite_get_many(conn, self.location.role, keys, lean)

        with values_read(self.where):
            return self._stable(attempt)

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        """Insert in a write transaction of its own; keys are checked after binding, before the commit.

        What :meth:`Repository.put_many` checks first is checked here too, and
        nothing of a batch holding a malformed row is committed; the row
        processing is done before the write lock is taken.
        """
        self._check_writable()
        insert = sqlite_insert(self.location.role, on_conflict)
        records = listed_records(records)
        with gc_paused():  # a batch of tuples that outlive the loop: the GC would rescan them
            rows = insert.rows(records)
        if not rows:
            return 0

        def attempt() -> int:
            with self._driver() as conn:
                conn.execute("BEGIN IMMEDIATE")  # waits for the write lock up front
                try:
                    self._refuse_another_revision(conn)
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

    def damage(self) -> str | None:
        """SQLite's ``quick_check`` (every page, not indexes against their table: ``integrity_check`` does that
        too, 20x slower), then every index against its table by count (a b-tree count each: milliseconds)."""

        def check(repo: Repository) -> str | None:
            conn, table = repo.conn, repo.table.name
            found = integrity_damage(conn.exec_driver_sql("PRAGMA quick_check").all())
            if found is not None:
                return found
            rows = conn.exec_driver_sql(f'SELECT count(*) FROM "{table}" NOT INDEXED').scalar_one()
            for _, index, _, _, partial in conn.exec_driver_sql(f'PRAGMA index_list("{table}")').all():
                if partial:  # it holds the rows its WHERE picks
                    continue
                held = conn.exec_driver_sql(f'SELECT count(*) FROM "{table}" INDEXED BY "{index}"').scalar_one()
                if held != rows:
                    return f"the index {index} holds {held:,} entries for the {rows:,} rows of {table}: it is damaged"
            return None

        return self.read(check)

    def stamp(self) -> object | None:
        """The file's and its WAL's sizes and modification times: every commit changes one of them."""
        files = (self.path, wal_path(self.path))
        return tuple((f.stat().st_size, f.stat().st_mtime_ns) if f.exists() else None for f in files)

    def _refuse_another_revision(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction, which holds the write lock: refuse a file another process moved to another
        revision, even while this one waited for its lock (an upgrade holds it): one indexed read, some us."""
        self._refuse_revision([row[0] for row in conn.execute(f"SELECT version_num FROM {VERSION_TABLE}")])

    def _left_behind(self) -> str | None:
        # A clock read, a file stamp each RECHECK_SECONDS: nothing a write would notice. A file a writer locks
        # (a rollback journal's readers wait) cannot tell: the write itself waits for it (was: refused as moved).
        if self._revision_kept() is not False:
            return None
        return "another process upgraded it (a newer judgestore's `db upgrade`) or put another file in its place"

    def still_current(self) -> bool:
        """Whether the file is at this library's revision still, so that a store kept open (a browser, a notebook)
        never reads a file its schema no longer describes (another process's upgrade, a backup copied over it).

        Asked at most every :data:`RECHECK_SECONDS` (a loop that opens the database for each row pays nothing),
        and read again (one SELECT) only once the file changed since it was last found so. False also when it
        cannot be read (or is locked): opening it again says what is wrong.
        """
        return self._revision_kept() is True

    def _revision_kept(self) -> bool | None:
        """:meth:`still_current`'s answer; None where it cannot tell: the file is locked by a writer (a rollback
        journal's readers wait for it), asked again at the next call."""
        now = time.monotonic()
        if now - self._checked_at < RECHECK_SECONDS:
            return True
        self._checked_at = now
        try:
            if _identity(self.path) != self._identity:  # replaced (mv, os.replace): a kept connection reads the old
                return False
            stamp = self.stamp()
            if stamp == self._current_at:
                return True
            with self._translated(), self._driver() as conn:
                current = is_current(conn, self.path)
        except DatabaseBusyError:
            self._checked_at = 0.0
            return None
        except (JudgestoreError, OSError):  # gone, unreadable
            return False
        if current:
            self._current_at = stamp
        return current

    def size_bytes(self) -> int:
        assert self.path is not None
        return database_size(self.path)

    def close(self) -> None:
        """Close the idle kept connection and the engine; a call under way closes its own connection when done."""
        self._opened += 1
        while True:
            try:
                self._idle.pop().close()
            except IndexError:  # none left (another thread may have taken the last one meanwhile)
                break
        if self._engine is not None:
            self._engine.dispose()
