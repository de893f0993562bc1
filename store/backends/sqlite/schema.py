"""Schema on open for SQLite files: what a file is, opening it, and the state of one file of a store.

Contract:

* :func:`classify` tells, with one SELECT on the happy path, whether a
  database is ``empty``, ``current``, ``behind``, ``ahead`` or ``foreign``
  (tables, but no ``judgestore_alembic_version``); :func:`is_current` is that
  SELECT on a raw sqlite3 connection.
* :func:`open_file` connects with the store's pragmas
  (:func:`~.connections.sqlite_connector`) and asks :func:`is_current`; a
  current file is opened with that connection kept and no SQLAlchemy engine,
  the journal switched (WAL) only now that the file is known to be ours.
  Anything else is classified with an engine: an empty file is created at
  head under the file's lock (two processes starting at once create it
  once); behind, ahead, foreign and (read-only) empty files are refused with
  their typed errors, untouched (the storage upgrades a file that is behind
  when ``auto_upgrade`` is set).
* A read-only open writes nothing: its reads are re-run if a writer changed
  the file meanwhile (:func:`stable_read`), and it keeps no connection
  (read-only connections are made afresh for every read).
* :func:`database_info` classifies one database of a store read-only, file
  and metadata.json included, into one :class:`~store.schema.DatabaseState`;
  it never raises for a bad file: what is wrong becomes a state and a message
  naming the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from filelock import FileLock
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError

from store import schema
from store.backends.sqlite.claims import SqliteClaimTable
from store.backends.sqlite.connections import (
    Filesystems,
    apply_journal_mode,
    create_sqlite_engine,
    file_stamp,
    set_journal_mode,
    sqlite_connector,
    sqlite_engine,
)
from store.backends.sqlite.errors import raise_translated, translated
from store.backends.sqlite.rows import SqliteRepository
from store.errors import (
    CorruptDatabaseError,
    DatabaseBusyError,
    DatabaseMissingError,
    JudgestoreError,
    MetadataMismatchError,
    MetadataMissingError,
    NotADatabaseError,
)
from store.layout import Location, database_size, lock_path, read_location_metadata
from store.reports import DatabaseInfo
from store.schema import (
    VERSION_TABLE,
    DatabaseState,
    Revisions,
    SchemaStatus,
    create_at_head,
    raise_for_status,
    status_error,
)
from store.settings import Settings

if TYPE_CHECKING:
    from store.claim_table import ClaimsSummary

T = TypeVar("T")


def classify(conn: Connection, path: Path, known: Revisions | None = None) -> SchemaStatus:
    """Where the database behind ``conn`` stands; one SELECT when it has our version table."""
    known = known or schema.revisions()  # the module's attribute: tests stand in another line of scripts
    try:
        rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        if rows and len(rows) == 1:
            revision = rows[0][0]
            if revision == known.head:
                return SchemaStatus(DatabaseState.CURRENT, revision, known.head)
            state = DatabaseState.BEHIND if revision in known.known else DatabaseState.AHEAD
            return SchemaStatus(state, revision, known.head)
    except OperationalError as e:
        if "no such table" not in str(e.orig):
            raise_translated(path, e)
    except DBAPIError as e:
        raise_translated(path, e)
    # No version table, or a version table without exactly one row: is anything else here?
    try:
        tables = tuple(sorted(inspect(conn).get_table_names()))
    except DBAPIError as e:
        raise_translated(path, e)
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


def _file_state(error: BaseException) -> DatabaseState:
    if isinstance(error, NotADatabaseError):
        return DatabaseState.NOT_A_DATABASE
    if isinstance(error, CorruptDatabaseError):
        return DatabaseState.CORRUPT
    return DatabaseState.UNREADABLE


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
    try:
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            with engine.connect() as conn, conn.begin():
                status = classify(conn, path, known)
                state, revision, error = status.state, status.revision, status_error(status, path)
                if status.state is DatabaseState.CURRENT:
                    claims = SqliteClaimTable(conn, location.role).summary()  # an empty table but while jobs run
                if status.state is DatabaseState.CURRENT and count_rows:
                    rows = SqliteRepository(conn, location.role).count()
                elif status.state is DatabaseState.EMPTY and count_rows:
                    rows = 0  # no tables yet: empty, nothing to read (store.store's one meaning of it)
        finally:
            engine.dispose()
    except DBAPIError as e:
        failure = translated(path, e)
        state, error = _file_state(failure), str(failure)
    except (JudgestoreError, OSError) as e:
        state, error = _file_state(e), str(e)
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


READONLY_READ_ATTEMPTS = 5


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
        connection = _opened_current(connect, path, journal, readonly)
        if connection is None:  # anything but current: classified, created or upgraded with an engine
            engine = sqlite_engine(connect, journal, pooled=not readonly)
            _check_schema(engine, path, readonly)
            if not readonly:
                # Now current: end as the usual open does, with the kept driver connection and no engine,
                # rather than an idle engine connection while the first write opens another one.
                engine.dispose()
                engine = None
                connection = _opened_current(connect, path, journal, readonly)
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


def _opened_current(
    connect: Callable[[], sqlite3.Connection], path: Path, journal: str | None, readonly: bool
) -> sqlite3.Connection | None:
    """The usual open: a sqlite3 connection on which one SELECT found the file current (journal then set).

    None for anything else, with nothing left open: :func:`_check_schema` classifies it with an engine.
    """

    def attempt() -> sqlite3.Connection | None:
        try:
            conn = connect()
        except sqlite3.Error as e:  # connecting can fail too (a file that is not a database)
            raise_translated(path, e)
        try:
            if not is_current(conn, path):
                conn.close()
                return None
            if journal is not None:
                set_journal_mode(conn, journal)  # the file is ours: switching is safe now
        except BaseException:
            conn.close()
            raise
        return conn

    return stable_read(path, attempt) if readonly else attempt()


def _status(engine: Engine, path: Path, readonly: bool) -> SchemaStatus:
    def attempt() -> SchemaStatus:
        try:
            with engine.connect() as conn:
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
    """Create the schema at head, once, even when many processes try at the same moment."""
    with FileLock(lock_path(path)):
        conn: Connection
        with engine.connect().execution_options(write=True) as conn, conn.begin():
            status = classify(conn, path)  # another process may have won the race
            if status.state is DatabaseState.EMPTY:
                create_at_head(conn)
            else:
                raise_for_status(status, path)
