"""Schema revisions of SQLite files: classify on open, and the state of one file of a store.

Contract:

* :func:`classify` tells, with one SELECT on the happy path, whether a
  database is ``empty``, ``current``, ``behind``, ``ahead`` or ``foreign``
  (tables, but no ``judgestore_alembic_version``); :func:`is_current` is that
  SELECT on a raw sqlite3 connection, for opening without building an engine.
* :func:`database_info` classifies one database of a store read-only, file
  and metadata.json included, into one :class:`~store.schema.DatabaseState`;
  it never raises for a bad file: what is wrong becomes a state and a message
  naming the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError

from store import schema
from store.backends.sqlite.connections import create_sqlite_engine
from store.backends.sqlite.errors import raise_translated, translated
from store.backends.sqlite.rows import SqliteRepository
from store.errors import (
    CorruptDatabaseError,
    JudgestoreError,
    MetadataMismatchError,
    MetadataMissingError,
    NotADatabaseError,
)
from store.layout import Location, database_size, read_location_metadata
from store.reports import DatabaseInfo
from store.schema import VERSION_TABLE, DatabaseState, Revisions, SchemaStatus, status_error
from store.settings import Settings


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
    try:
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            with engine.connect() as conn, conn.begin():
                status = classify(conn, path, known)
                state, revision, error = status.state, status.revision, status_error(status, path)
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
    return DatabaseInfo(location, str(path), state, revision, known.head, rows, size, error)


def database_infos(
    root: Path, locations: Iterable[Location], settings: Settings, *, count_rows: bool = True
) -> Iterator[DatabaseInfo]:
    for location in locations:
        yield database_info(root, location, settings, count_rows=count_rows)
