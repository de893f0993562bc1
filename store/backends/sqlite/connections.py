"""Connections to one SQLite file of a store: pragmas, engines, and opening it as a current database.

Contract:

* Every connection gets a busy timeout, ``foreign_keys=ON`` and Python's
  sqlite3 in autocommit mode, so SQLAlchemy's ``begin`` event decides how a
  transaction starts: ``BEGIN IMMEDIATE`` for connections marked
  ``write=True`` (writers queue on the lock up front instead of failing at
  commit), plain ``BEGIN`` otherwise.
* Read-write opens use the journal :func:`~.filesystems.journal_mode_for`
  chooses (WAL, or the rollback journal on a network filesystem). Switching
  the journal rewrites the file header, so it is not done on connect but by
  :func:`apply_journal_mode`, once the caller knows the file is ours (a
  foreign or newer file is refused untouched).
* Read-only opens write nothing at all: no ``-wal`` or ``-shm`` file is
  created (:func:`open_readonly`). A WAL database with no ``-wal`` (a
  ``-shm`` alone is a killed connection's leftover), or with no ``-shm`` and
  no commit in its ``-wal`` (no connection has it open, and the main file
  holds every commit: a ``mode=ro`` open would create the ``-wal`` and
  ``-shm``, and leave them, since only a writer removes them) is read as
  ``immutable``, without locks; one with a ``-shm`` beside its ``-wal`` (a
  connection may have it open, even with an empty ``-wal``) or with commits
  in its ``-wal`` is read with ``mode=ro``, under SQLite's locks, so each
  read transaction is one snapshot even while a writer commits and
  checkpoints. The exceptions:

  - ``mode=ro`` fails on a WAL whose ``-wal`` holds no commit (empty or
    missing) but whose ``-shm`` cannot be set up: a full disk (a refused
    write left an empty ``-wal`` and a ``-shm`` that cannot grow), a
    read-only mount or no write permission on leftover side files. The
    main file then holds every commit, and is read as ``immutable``.
  - a ``-wal`` without its ``-shm`` (a copy that left the ``-shm`` out) gets
    a new ``-shm`` from SQLite, which needs one to read the commits in the
    ``-wal`` (``immutable`` would not read them, and
    ``locking_mode=EXCLUSIVE`` fails on a read-only connection).

  An ``immutable`` connection takes no lock: a writer that opens the file
  after it may checkpoint into the main file under its reads (torn pages:
  rows lost or read twice, or "damaged"). Such a connection
  (:class:`ReadOnlyConnection`) records the main file's identity, size and
  mtime when it was opened, and :func:`read_checked` raises
  :class:`~store.errors.ChangedUnderReadError` when they changed under what
  was read (the result, or the failure, may be the writer's doing).
  :func:`stable_read` runs such a read again (a writer now present, it is
  read under SQLite's locks); a stream checks between batches and re-reads
  from the start only while it has given no row
  (:meth:`~store.backends.sqlite.database.SqliteDatabase._one_read`).
  The choice is made again for every read-only connection (they are not
  pooled): an immutable connection kept open would never see a writer's
  later commits.
* :func:`classify` tells, with one SELECT on the happy path, whether a
  database is ``empty``, ``current``, ``behind``, ``ahead`` or ``foreign``
  (tables, but no ``judgestore_alembic_version``); :func:`is_current` is that
  SELECT on a raw sqlite3 connection.
* :func:`open_file` connects with the store's pragmas and asks
  :func:`is_current`; a current file is opened with that connection kept and
  no SQLAlchemy engine, the journal switched (WAL) only now that the file is
  known to be ours. An empty file (read-write) is created at head on that
  connection, under the file's lock (two processes starting at once create
  it once), then opened the same way. Anything else is classified with an
  engine: behind, ahead, foreign and (read-only) empty files are refused
  with their typed errors, untouched (the storage upgrades a file that is
  behind when ``auto_upgrade`` is set); against other scripts (a test's
  own) an empty file is created by running them.
* What a failure on a file means (typed errors) and retrying a lock are
  :mod:`store.backends.sqlite.errors`'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

from filelock import FileLock
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import NullPool, QueuePool
from sqlalchemy.util import LRUCache

from store import jsonvalues, schema
from store.backends.sqlite.errors import is_locked, raise_translated
from store.backends.sqlite.filesystems import Filesystems, journal_mode_for
from store.errors import ChangedUnderReadError, DatabaseBusyError, DatabaseMissingError, ReadTransactionWriteError
from store.layout import lock_path, shm_path, wal_path
from store.schema import (
    VERSION_TABLE,
    DatabaseState,
    Revisions,
    SchemaStatus,
    create_at_head,
    head_statements,
    raise_for_status,
)
from store.settings import Settings

T = TypeVar("T")

_WAL_HEADER_BYTES = b"\x02\x02"  # bytes 18-19 of the file header: read/write version 2 = WAL


def _is_wal_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(20)[18:20] == _WAL_HEADER_BYTES
    except OSError:
        return False


class FileStamp(NamedTuple):
    """What a checkpoint or a rollback-journal commit changes in the main file: its identity, size and mtime.

    The mtime has the filesystem's granularity (a clock tick): a change goes unseen only if a writer opened the
    file, filled its WAL and checkpointed it within the tick of the previous write, leaving the size as it was.
    """

    inode: int
    size: int
    mtime_ns: int


def file_stamp(path: Path) -> FileStamp | None:
    """``path``'s :class:`FileStamp`, or None when it cannot be read (gone: as much a change as any)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return FileStamp(st.st_ino, st.st_size, st.st_mtime_ns)


def _wal_in_use(path: Path) -> bool:
    """Whether ``path`` has a WAL with something in it: an empty one holds no commit."""
    try:
        return wal_path(path).stat().st_size > 0
    except FileNotFoundError:
        return False


def _opened_by_nobody(path: Path) -> bool:
    """Whether no connection has ``path`` open in WAL mode and its main file holds every commit: no ``-wal`` at
    all (a connection in WAL mode keeps one from its open to its close: a ``-shm`` without it is a killed
    connection's leftover, which ``mode=ro`` would give a new ``-wal``), or no ``-shm`` (the first connection
    creates it, the last one to close removes it; one killed leaves it: then ``mode=ro`` reads through it) and
    no commit in the ``-wal`` (an empty one left without its ``-shm`` is read as it is, rather than given a new
    ``-shm``)."""
    wal = wal_path(path)
    return not wal.exists() or (not shm_path(path).exists() and not _wal_in_use(path))


def readonly_uri(path: Path) -> str:
    """SQLite URI that reads ``path`` without creating or changing any file (see the module docstring)."""
    base = f"file:{quote(os.fsencode(path.resolve()))}?mode=ro"
    return base + "&immutable=1" if _is_wal_file(path) and _opened_by_nobody(path) else base


# The primary codes of a mode=ro open that could not set up the -shm beside a WAL holding no commit (full disk,
# read-only mount, no write permission on leftover side files): the main file alone is then the whole database.
_SHM_SETUP_FAILURES = frozenset({3, 8, 10, 13, 14})  # SQLITE_PERM, READONLY, IOERR, FULL, CANTOPEN


class ReadOnlyConnection(sqlite3.Connection):
    """A read-only connection of :func:`open_readonly`; ``unlocked_since`` is the main file's stamp when it was
    opened ``immutable`` (no locks), None when it reads under SQLite's locks."""

    db_path: Path
    unlocked_since: FileStamp | None = None

    def changed_under(self) -> bool:
        """Whether a writer may have changed pages under this connection's reads: only an immutable connection
        can be, and only once the main file changed (a writer's commits in its -wal are not read, and leave the
        main file as it was: the reads are an older snapshot, whole)."""
        return self.unlocked_since is not None and file_stamp(self.db_path) != self.unlocked_since


def open_readonly(path: Path, *, timeout_s: float = 5.0) -> ReadOnlyConnection:
    """A connection reading ``path`` as the module docstring says (immutable only where that is safe, or where
    nothing else can read the file and the main file holds every commit)."""
    stamp = file_stamp(path)  # before the choice: a checkpoint after it is a change under the reads
    uri = readonly_uri(path) if stamp is not None else f"file:{quote(os.fsencode(path.resolve()))}?mode=ro"

    def connect(uri: str) -> ReadOnlyConnection:
        conn = sqlite3.connect(
            uri, uri=True, timeout=timeout_s, isolation_level=None, check_same_thread=False, factory=ReadOnlyConnection
        )
        conn.db_path = path
        return conn

    conn = connect(uri)
    if uri.endswith("&immutable=1"):
        conn.unlocked_since = stamp
        return conn
    if stamp is None or _wal_in_use(path) or not _is_wal_file(path):
        return conn  # SQLite's own error (if any) at the first read: the -wal's commits need the -shm
    try:
        conn.execute("PRAGMA schema_version").fetchone()  # sets up the -wal and -shm
    except sqlite3.Error as e:
        conn.close()
        code = getattr(e, "sqlite_errorcode", None)
        if code is None or code & 0xFF not in _SHM_SETUP_FAILURES or _wal_in_use(path):
            raise
        conn = connect(uri + "&immutable=1")
        conn.unlocked_since = stamp
    return conn


@contextmanager
def read_checked(conn: sqlite3.Connection, path: Path) -> Iterator[None]:
    """Raise :class:`~store.errors.ChangedUnderReadError` if what was read on ``conn`` inside the block (or how it
    failed) may be a writer's doing: an immutable connection whose file changed under it (see the module
    docstring). A connection under SQLite's locks passes as it is."""
    try:
        yield
    except Exception as e:
        if isinstance(conn, ReadOnlyConnection) and conn.changed_under():
            raise ChangedUnderReadError(path) from e
        raise
    if isinstance(conn, ReadOnlyConnection) and conn.changed_under():
        raise ChangedUnderReadError(path)


# What every SQLite engine of a store is given, and what the raw fast paths use (store.repository):
# one dialect configured the same way, so both bind and read columns through the same processors.
JSON_OPTIONS: dict[str, Any] = {
    "json_serializer": jsonvalues.dumps,  # canonical JSON; NaN and infinities kept exactly
    "json_deserializer": jsonvalues.loads,
}


@functools.cache
def sqlite_dialect() -> Dialect:
    """The one SQLite dialect of the process (its JSON options), initialised from the SQLite library: every
    file's engine compiles with it, and the fast readers and writers compile their statements with it once.

    SQLAlchemy keeps a statement's compiled form per engine, keyed by the engine's dialect object: a store opens
    an engine per file, so each file compiled every statement again (a cold ``stats`` over thousands of
    databases spent 40 % of its time in the compiler). The engines' dialects are configured alike (the same
    driver, :data:`JSON_OPTIONS`, the same SQLite library), so one dialect and one cache
    (:func:`_compiled_statements`) serve them all; each pool keeps its own dialect for its connections' events.
    """
    engine = create_engine("sqlite://", **JSON_OPTIONS)
    with engine.connect():  # initialises the dialect from the SQLite library (the features it has)
        pass
    engine.dispose()
    return engine.dialect


@functools.cache
def _compiled_statements() -> LRUCache[Any, Any]:
    """The compiled statements every file's engine shares (see :func:`sqlite_dialect`)."""
    return LRUCache(1000)


def sqlite_connector(
    path: Path, settings: Settings, *, readonly: bool = False, filesystems: Filesystems | None = None
) -> tuple[Callable[[], sqlite3.Connection], str | None]:
    """A function opening a connection to ``path`` with the store's pragmas, and the journal mode chosen.

    The journal mode is None for read-only connections; for read-write ones
    it is to be applied once the file is known to be ours
    (:func:`set_journal_mode`). Read-only connections choose ``immutable``
    afresh each time (see the module docstring). ``filesystems``: the mount
    table as the caller read it (:class:`Filesystems`), else it is read now.
    """
    resolved = path.resolve()
    journal = None if readonly else journal_mode_for(path, settings, resolved=resolved, filesystems=filesystems)
    read_write_uri = f"file:{quote(os.fsencode(resolved))}?mode=rwc"
    timeout_s = settings.busy_timeout_ms / 1000
    pragmas = [f"PRAGMA busy_timeout = {int(settings.busy_timeout_ms)}", "PRAGMA foreign_keys = ON"]
    if journal is not None:
        # NORMAL is durable in WAL mode except for the last commits on power loss.
        pragmas.append(f"PRAGMA synchronous = {'NORMAL' if journal == 'wal' else 'FULL'}")

    def connect() -> sqlite3.Connection:
        if readonly:
            conn: sqlite3.Connection = open_readonly(path, timeout_s=timeout_s)
        else:
            conn = sqlite3.connect(read_write_uri, uri=True, timeout=timeout_s, isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
        try:
            for pragma in pragmas:
                conn.execute(pragma)
        except BaseException:
            conn.close()
            raise
        return conn

    return connect, journal


def create_sqlite_engine(path: Path, settings: Settings, *, readonly: bool = False, pooled: bool = True) -> Engine:
    """An engine over one SQLite file; see the module docstring for what it guarantees.

    ``pooled=False`` gives a NullPool engine for one-off work (upgrades) whose
    connections close, and release the file, as soon as they are returned.
    Read-only engines are never pooled (see the module docstring).
    """
    connect, journal = sqlite_connector(path, settings, readonly=readonly)
    return sqlite_engine(connect, journal, pooled=pooled and not readonly)


def sqlite_engine(connect: Callable[[], sqlite3.Connection], journal: str | None, *, pooled: bool = True) -> Engine:
    """The engine of :func:`create_sqlite_engine` over connections that ``connect`` (:func:`sqlite_connector`) opens."""
    engine = create_engine(
        "sqlite://",
        creator=connect,
        poolclass=QueuePool if pooled else NullPool,
        # journal_mode: applied by apply_journal_mode. compiled_cache: see sqlite_dialect.
        execution_options={"journal_mode": journal, "compiled_cache": _compiled_statements()},
        **JSON_OPTIONS,
    )
    engine.dialect = sqlite_dialect()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get("write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def apply_journal_mode(engine: Engine) -> None:
    """Put the file in the journal mode chosen for ``engine`` (no-op for read-only engines).

    Call it only once the file is known to be ours (current, or just created):
    the switch is persistent and rewrites the file header.
    """
    journal = engine.get_execution_options().get("journal_mode")
    if journal is None:
        return
    raw = engine.raw_connection()
    try:
        set_journal_mode(raw.driver_connection, journal)  # type: ignore[arg-type]
    finally:
        raw.close()


def set_journal_mode(conn: sqlite3.Connection, journal: str) -> None:
    """:func:`apply_journal_mode` on one raw connection (same conditions: the file is known to be ours).

    Processes that open a new file at once switch it at once, and SQLite answers all but one of them
    "database is locked" at once: each holds the shared lock the others wait on, so its busy handler
    would deadlock them. The switch is tried again, for up to the connection's busy timeout.
    """
    started, pause = time.monotonic(), 0.005
    while True:
        try:
            conn.execute(f"PRAGMA journal_mode = {journal}").fetchall()
            return
        except sqlite3.OperationalError as e:
            (busy_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()  # read only here: opening stays as it was
            if not is_locked(e) or time.monotonic() + pause > started + busy_ms / 1000:
                raise
        time.sleep(pause * (0.5 + random.random()))  # jittered: the switches that collided spread out
        pause = min(pause * 2, 0.25)


# ---------------------------------------------------------------- opening a file


def classify(conn: Connection, path: Path, known: Revisions | None = None) -> SchemaStatus:
    """Where the database behind ``conn`` stands; one SELECT when it has our version table."""
    known = known or schema.revisions()  # the module's attribute: tests stand in another line of scripts
    for _ in range(2):
        unversioned = False
        try:
            rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
            if len(rows) == 1 and isinstance(rows[0][0], str) and rows[0][0]:  # an empty or NULL one names none
                revision = rows[0][0]
                if revision == known.head:
                    return SchemaStatus(DatabaseState.CURRENT, revision, known.head)
                state = DatabaseState.BEHIND if revision in known.known else DatabaseState.AHEAD
                return SchemaStatus(state, revision, known.head)
        except OperationalError as e:
            if "no such table" not in str(e.orig):
                raise_translated(path, e)
            unversioned = True
        except DBAPIError as e:
            raise_translated(path, e)
        # No version table, or a version table without exactly one row: is anything else here?
        try:
            tables = tuple(sorted(inspect(conn).get_table_names()))
        except DBAPIError as e:
            raise_translated(path, e)
        # A statement that fails to prepare starts no snapshot: another connection may have created the database
        # (the version table with the rest, in one transaction) between the two reads. Then it is asked again.
        if not (unversioned and VERSION_TABLE in tables):
            break
    state = DatabaseState.FOREIGN if tables else DatabaseState.EMPTY
    return SchemaStatus(state, None, known.head, tables)


def is_current(conn: sqlite3.Connection, path: Path, known: Revisions | None = None) -> bool:
    """Whether the database behind a raw sqlite3 connection is at head: the one SELECT of :func:`classify`.

    False means anything else (no version table, another revision, not one
    row); :func:`classify` then says what it is. A file SQLite cannot read
    raises its typed error.
    """
    known = known or schema.revisions()  # the module's attribute: tests stand in another line of scripts
    try:
        rows = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return False
        raise_translated(path, e)
    except sqlite3.Error as e:
        raise_translated(path, e)
    return len(rows) == 1 and rows[0][0] == known.head


READONLY_READ_ATTEMPTS = 5


def stable_read(path: Path, read: Callable[[], T]) -> T:
    """Run a read-only ``read`` of a file; run it again if a writer changed the file under it (``read`` raised
    :class:`~store.errors.ChangedUnderReadError`: see :func:`read_checked`)."""
    for _ in range(READONLY_READ_ATTEMPTS):
        try:
            return read()
        except ChangedUnderReadError:
            continue
    raise DatabaseBusyError(
        path, f"changed under {READONLY_READ_ATTEMPTS} read-only reads in a row (writers are busy); try again"
    )


@contextmanager
def checked_transaction(engine: Engine, path: Path) -> Iterator[Connection]:
    """A connection of ``engine`` in one read transaction, :func:`read_checked` (for :func:`stable_read`).

    The transaction reads only: a write in it (an ORM session's flush, an ``UPDATE`` executed by hand) raises
    :class:`~store.errors.ReadTransactionWriteError` and nothing of it is kept, as PostgreSQL refuses a write in
    a read-only transaction (SQLite's ``query_only``; the pooled connection is given back writable).
    """
    with engine.connect() as conn:
        driver: sqlite3.Connection = conn.connection.driver_connection  # type: ignore[assignment]
        driver.execute("PRAGMA query_only = ON")
        try:
            with read_checked(driver, path), conn.begin():
                yield conn
        except (DBAPIError, sqlite3.OperationalError) as e:
            orig = e.orig if isinstance(e, DBAPIError) else e
            if getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY:  # query_only's refusal
                raise ReadTransactionWriteError(str(path)) from e
            raise
        finally:
            try:
                driver.execute("PRAGMA query_only = OFF")
            except sqlite3.Error:  # a connection that cannot say it is writable again is not pooled again
                conn.invalidate()


@dataclass(frozen=True, slots=True)
class OpenedFile:
    """A file found current: how to connect to it, the connection kept for its rows, the engine if one was built."""

    connect: Callable[[], sqlite3.Connection]
    connection: sqlite3.Connection | None
    engine: Engine | None


def open_file(path: Path, settings: Settings, *, readonly: bool, filesystems: Filesystems) -> OpenedFile:
    """Open ``path`` as a current database of this library (see the module docstring), or raise why not."""
    connect, journal = sqlite_connector(path, settings, readonly=readonly, filesystems=filesystems)
    engine = None
    try:
        connection = _opened(connect, path, journal, readonly)
        if connection is None:  # anything else: classified with an engine (refused, or created by other scripts)
            engine = sqlite_engine(connect, journal, pooled=not readonly)
            _check_schema(engine, path, readonly)
            if not readonly:
                # Now current: end as the usual open does, with the kept driver connection and no engine,
                # rather than an idle engine connection while the first write opens another one.
                engine.dispose()
                engine = None
                connection = _opened(connect, path, journal, readonly)
    except (DBAPIError, sqlite3.Error, OSError) as e:  # creating, switching the journal: full, read-only...
        if engine is not None:
            engine.dispose()
        raise_translated(path, e)
    except BaseException:
        if engine is not None:
            engine.dispose()
        raise
    if readonly and connection is not None:
        connection.close()  # read-only connections are made afresh for every read (see .connections)
        connection = None
    return OpenedFile(connect, connection, engine)


def _opened(
    connect: Callable[[], sqlite3.Connection], path: Path, journal: str | None, readonly: bool
) -> sqlite3.Connection | None:
    """The usual open, without an engine: a sqlite3 connection to a file one SELECT found current or (read-write)
    to an empty file just created at head on it (:func:`_created_at_head`); the journal then set.

    None for anything else, with nothing left open: :func:`_check_schema` classifies it with an engine.
    """

    def attempt() -> sqlite3.Connection | None:
        try:
            conn = connect()
        except sqlite3.Error as e:  # connecting can fail too (a file that is not a database)
            raise_translated(path, e)
        try:
            with read_checked(conn, path):
                current = is_current(conn, path)
            if not current and (readonly or not _created_at_head(conn, path)):
                conn.close()
                return None
            if journal is not None:
                set_journal_mode(conn, journal)  # the file is ours: switching is safe now
        except BaseException:
            conn.close()
            raise
        return conn

    return stable_read(path, attempt) if readonly else attempt()


def _created_at_head(conn: sqlite3.Connection, path: Path) -> bool:
    """Create the schema of an empty file at head on a raw connection, once, even when many processes try at once.

    The statements of :func:`~store.schema.head_statements`, in one ``BEGIN
    IMMEDIATE`` under the file's lock, on the connection the open keeps: no
    engine is built, nothing is classified twice (a new database cost 4.8 ms
    here through an engine, 2.8 ms so). False, with nothing written, for a
    file with any schema object (another process created it first; a foreign
    or older file) and against other scripts (a test's own): the engine path
    classifies, refuses or migrates those (:func:`_check_schema`).
    """
    statements = head_statements(sqlite_dialect())
    if statements is None or not _empty(conn):
        return False
    with FileLock(lock_path(path)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not _empty(conn):  # another process created it while this one waited for the lock
                return False
            for statement in statements:
                conn.execute(statement)
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                # The error that stopped the creation is the one to report; SQLite rolls a leftover journal back
                # on the next open.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
    return True


def _empty(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None


def _status(engine: Engine, path: Path, readonly: bool) -> SchemaStatus:
    def attempt() -> SchemaStatus:
        try:
            with checked_transaction(engine, path) if readonly else engine.connect() as conn:
                return classify(conn, path)
        except DBAPIError as e:  # connecting can fail too (a file that is not a database)
            raise_translated(path, e)

    return stable_read(path, attempt) if readonly else attempt()


def _check_schema(engine: Engine, path: Path, readonly: bool) -> None:
    """Refuse anything but a current database; the journal is switched only once the file is ours."""
    status = _status(engine, path, readonly)
    if status.state is DatabaseState.CURRENT:
        apply_journal_mode(engine)
        return
    if status.state is DatabaseState.EMPTY and not readonly:
        _create(engine, path)
        apply_journal_mode(engine)
        return
    if status.state is DatabaseState.EMPTY:
        raise DatabaseMissingError(path, "has no tables yet (read-only open creates nothing)")
    raise_for_status(status, path)


def _create(engine: Engine, path: Path) -> None:
    """Create the schema at head, once, even when many processes try at the same moment (what
    :func:`_created_at_head` leaves to an engine: other scripts' migrations)."""
    with FileLock(lock_path(path)):
        conn: Connection
        with engine.connect().execution_options(write=True) as conn, conn.begin():
            status = classify(conn, path)  # another process may have won the race
            if status.state is DatabaseState.EMPTY:
                create_at_head(conn)
            else:
                raise_for_status(status, path)
