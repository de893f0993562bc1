"""Verifying a store: integrity, metadata, schema, every row's input hash, and stray files.

Contract:

* :func:`verify_database` checks one database read-only (nothing written,
  not even a ``-wal`` file), in one read transaction (a writer's commits
  meanwhile are not seen; a read without locks that a writer changed is
  made again: :mod:`~store.backends.sqlite.connections`, so a verdict of
  damage is never a concurrent write's): SQLite's ``integrity_check``, its metadata.json
  against its folder, its schema state (every table and column its revision
  has; a file with pages but no table lost its rows), and that every row's
  ``input_text`` hashes to its ``input_hash`` (a row whose text is not valid
  UTF-8, a damaged page, or with a value its column's type cannot read is
  named by its key, and the other rows are still checked). It never raises for a bad database: what is
  wrong becomes :class:`Problem` records, each naming its file and the next
  step. It also counts the rows adopted from older descriptors
  (``judgestore adopt``), which are checked like every other row.
* :func:`stray_paths` lists files and folders under a root that are not part
  of the layout (:mod:`store.layout`), or those in the descriptor folders a
  selector picks (a folder whose database is missing among them). What a
  process creating a database leaves for a moment (a metadata.json being
  written, a folder whose database is not there yet) is a stray only once
  it is :data:`CREATION_GRACE_SECONDS` old: a ``verify`` beside running jobs
  failed now and then, and called a live writer's file safe to delete.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from store import schema
from store.backend import unreadable_value
from store.backends.sqlite.connections import (
    checked_transaction,
    classify,
    create_sqlite_engine,
    sqlite_dialect,
    stable_read,
)
from store.backends.sqlite.errors import translated
from store.backends.sqlite.rows import SqliteRepository
from store.errors import (
    DamagedTextError,
    InvalidInputError,
    JudgestoreError,
    MetadataMismatchError,
    MetadataMissingError,
)
from store.layout import (
    BACKUP_TEMP_PREFIX,
    LEVELS,
    METADATA_FILE,
    METADATA_TEMP_PREFIX,
    SYNC_FOLDER,
    Location,
    Selector,
    database_name,
    descriptor_folder_names,
    is_backup_of,
    read_location_metadata,
)
from store.reports import DatabaseVerification, Problem, ProblemKind, RowChecks
from store.roles import ROLES
from store.schema import USABLE_STATES, DatabaseState, Revisions, missing_parts, status_error
from store.segments import decode_segment
from store.settings import Settings
from store.tables.filters import RowFilter
from store.tables.models import SCHEMA_REVISION

# What a command that refuses a damaged file (an upgrade, a vacuum) tells the user to do next
DAMAGE_ADVICE = "Run `judgestore verify`; restore the file from a backup, or delete it to compute its rows again"


def integrity_damage(rows: Sequence[Sequence[Any]]) -> str | None:
    """What ``PRAGMA integrity_check`` (or ``quick_check``) answered, as one line; None when it said "ok"."""
    findings = [str(row[0]) for row in rows]
    if findings == ["ok"]:
        return None
    shown = "; ".join(findings[:5]) + (f"; and {len(findings) - 5} more" if len(findings) > 5 else "")
    return f"SQLite found damage: {shown}"


def _integrity_problems(conn: Connection, path: Path) -> list[Problem]:
    damage = integrity_damage(conn.execute(text("PRAGMA integrity_check")).all())
    return [] if damage is None else [Problem(str(path), ProblemKind.INTEGRITY, damage)]


# A file with pages but no table: made by this library with its tables in one transaction, so they were dropped
NO_TABLES = "holds no tables, though it is not empty: they were dropped (by another tool?), and its rows with them"


def _missing_parts(conn: Connection) -> str | None:
    """:func:`~store.schema.missing_parts` of the file behind ``conn``: one query over its tables' columns."""
    held: dict[str, set[str]] = {}
    listed = "SELECT m.name, c.name FROM sqlite_master AS m JOIN pragma_table_info(m.name) AS c WHERE m.type = 'table'"
    for table, column in conn.execute(text(listed)):
        held.setdefault(table, set()).add(column)
    return missing_parts(held)


def _row_hash_problems(conn: Connection, location: Location, path: Path) -> tuple[int, list[Problem]]:
    checks = RowChecks(path, location)
    for record in SqliteRepository(conn, location.role).query():
        checks.hashed(record.input_hash, record.sample_index, record.input_text)
    _odd_times(conn, location, checks)
    return checks.result()


def _utf8(value: bytes) -> str | None:
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


@contextmanager
def _text_as_bytes(conn: Connection) -> Iterator[sqlite3.Connection]:
    """The driver's connection, reading text as bytes inside (text that is not UTF-8 reads, to be named)."""
    driver: sqlite3.Connection = conn.connection.driver_connection  # type: ignore[assignment]
    saved, driver.text_factory = driver.text_factory, bytes
    try:
        yield driver
    finally:
        driver.text_factory = saved


def _raw_row_problems(conn: Connection, location: Location, path: Path) -> tuple[int, list[Problem]]:
    """The row scan again, value by value: names the rows whose text is not UTF-8 (damaged pages) or whose values
    their columns' types cannot read (JSON that does not decode, a time that is none), and hashes the others."""
    checks = RowChecks(path, location)
    table = SqliteRepository(conn, location.role).table
    dialect = sqlite_dialect()  # the record readers' own: JSON through store.jsonvalues
    readers = {c.name: c.type.dialect_impl(dialect).result_processor(dialect, None) for c in table.c}
    with _text_as_bytes(conn) as driver:
        cursor = driver.execute(f'SELECT rowid, * FROM "{table.name}"')
        names = [column[0] for column in cursor.description]
        for rowid, *values in cursor:
            row: dict[str, Any] = {}
            undecodable, unreadable = [], []
            for name, raw in zip(names[1:], values, strict=True):
                if name not in readers:  # a column the user added: its values are theirs, not the store's to judge
                    continue
                row[name] = value = _utf8(raw) if isinstance(raw, bytes) else raw
                if isinstance(raw, bytes) and value is None:
                    undecodable.append(name)
                elif value is not None and (read := readers[name]) is not None and not _readable(read, value):
                    unreadable.append(name)
            key = row["input_hash"] if isinstance(row["input_hash"], str) else None
            if undecodable or unreadable or key is None:
                checks.damaged(key, f"rowid {rowid}", undecodable or ([] if unreadable else ["input_hash"]), unreadable)
            else:
                checks.hashed(key, int(row["sample_index"]), row["input_text"])
    _odd_times(conn, location, checks)
    return checks.result()


# The text SQLAlchemy's SQLite DateTime writes (UTC, every digit of the microseconds): what the time filters compare
_STORED_TIME = (
    "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9][0-9][0-9][0-9]"
)


def _odd_times(conn: Connection, location: Location, checks: RowChecks) -> None:
    """Name the rows whose ``created_at`` is text in another form ('2026-01-01T02:00:00+02:00', SQLite's own
    '2026-01-01 00:00:00'): they read, so verify said OK, while --since, --until and prune, which compare the stored
    text, put them on the wrong side (was). Values that are no text are the raw scan's (:func:`_raw_row_problems`)."""
    table = SqliteRepository(conn, location.role).table.name
    with _text_as_bytes(conn) as driver:  # text that is not UTF-8 is the raw scan's: skipped below
        odd = driver.execute(
            f"SELECT input_hash, rowid, created_at FROM \"{table}\" WHERE typeof(created_at) = 'text' "
            "AND NOT (length(created_at) = 26 AND created_at GLOB ?)",
            (_STORED_TIME,),
        ).fetchall()
    for key, rowid, stored in odd:
        if isinstance(key, bytes) and (named := _utf8(key)) is not None and (time := _utf8(stored)) is not None:
            checks.odd_time(named, f"rowid {rowid}", time)


def _readable(read: Callable[[Any], Any], value: Any) -> bool:
    try:
        read(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def verify_database(
    root: Path, location: Location, settings: Settings, *, known: Revisions | None = None
) -> DatabaseVerification:
    """Check one database read-only: metadata, integrity, schema, and the input hash of every row."""
    known = known or schema.revisions()
    path = location.db_path(root)
    problems: list[Problem] = []
    try:
        read_location_metadata(root, location)
    except (MetadataMissingError, MetadataMismatchError) as e:
        problems.append(Problem(e.where, ProblemKind.METADATA, str(e)))
    except OSError as e:
        problems.append(Problem(str(location.metadata_path(root)), ProblemKind.METADATA, str(e)))
    checked = adopted = 0

    def attempt() -> tuple[int, int, list[Problem]]:
        found: list[Problem] = []
        checked = adopted = 0
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            # One read transaction, checked: a verdict read without locks while a writer changed the file is
            # made again (stable_read), never reported as damage.
            with checked_transaction(engine, path) as conn:
                found += _integrity_problems(conn, path)
                status = classify(conn, path, known)
                lacking = _missing_parts(conn) if status.revision == SCHEMA_REVISION else None
                if status.state not in USABLE_STATES:
                    found.append(Problem(str(path), ProblemKind.SCHEMA, str(status_error(status, path))))
                elif status.state is DatabaseState.EMPTY and path.stat().st_size:
                    # Zero bytes: a database another process is creating. Pages without a table: they were dropped.
                    found.append(Problem(str(path), ProblemKind.SCHEMA, f"{path} {NO_TABLES}"))
                elif lacking is not None:
                    found.append(Problem(str(path), ProblemKind.SCHEMA, f"{path} {lacking}"))
                elif status.state is DatabaseState.CURRENT:
                    try:
                        checked, bad_rows = _row_hash_problems(conn, location, path)
                    except DBAPIError as e:
                        if not isinstance(translated(path, e), DamagedTextError):
                            raise
                        checked, bad_rows = _raw_row_problems(conn, location, path)
                    except (ValueError, TypeError) as e:  # a value its column cannot read: the raw scan names its row
                        if isinstance(e, TypeError) and not unreadable_value(e):  # a number as a time, not a bug
                            raise
                        checked, bad_rows = _raw_row_problems(conn, location, path)
                    found += bad_rows
                    adopted = SqliteRepository(conn, location.role).count(RowFilter(adopted=True))
        finally:
            engine.dispose()
        return checked, adopted, found

    try:
        checked, adopted, found = stable_read(path, attempt)
        problems += found
    except DBAPIError as e:
        problems.append(Problem(str(path), ProblemKind.FILE, str(translated(path, e))))
    except (JudgestoreError, OSError, ValueError) as e:  # ValueError: a JSON column that does not decode
        problems.append(Problem(str(path), ProblemKind.FILE, f"{type(e).__name__}: {e}"))
    return DatabaseVerification(location, str(path), checked, tuple(problems), adopted)


def _is_canonical_segment(name: str) -> bool:
    try:
        decode_segment(name)
    except InvalidInputError:
        return False
    return True


CREATION_GRACE_SECONDS = 60.0


def _being_created(path: Path) -> bool:
    """Whether ``path`` changed within :data:`CREATION_GRACE_SECONDS` (gone meanwhile: its writer renamed it)."""
    try:
        return time.time() - path.stat().st_mtime < CREATION_GRACE_SECONDS
    except OSError:
        return True


def _descriptor_folder_problems(folder: Path, role: str) -> list[Problem]:
    db_name = database_name(role)
    expected = descriptor_folder_names(role)
    problems = []
    names = set()
    for entry in sorted(folder.iterdir()):
        names.add(entry.name)
        if entry.is_file() and (entry.name in expected or is_backup_of(entry.name, db_name)):
            continue
        if entry.name in expected:  # not a file: reading it (its own problem) names the entry
            what = "a folder" if entry.is_dir() else "a link to nothing" if entry.is_symlink() else "not a file"
            why = f"{what} where the file {entry.name} belongs"
        elif entry.name.startswith(METADATA_TEMP_PREFIX):
            if _being_created(entry):
                continue
            why = "leftover of an interrupted metadata.json write; safe to delete"
        elif entry.name.startswith(BACKUP_TEMP_PREFIX):  # the upgrade left the database as it was
            why = "leftover of an upgrade interrupted while copying its backup (not a backup); safe to delete"
        else:
            why = f"not part of a descriptor folder (expected {METADATA_FILE}, {db_name} and its backups)"
        problems.append(Problem(str(entry), ProblemKind.STRAY, why))
    if db_name not in names and not _being_created(folder):  # its metadata.json is written first, then the file
        problems.append(Problem(str(folder), ProblemKind.STRAY, f"descriptor folder without {db_name}"))
    return problems


_FOLDER_LEVELS = LEVELS[1:]  # below the role folder


def _tree_problems(folder: Path, depth: int, role: str, selector: Selector) -> Iterator[Problem]:
    level = _FOLDER_LEVELS[depth]
    picked = selector.is_empty()
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            if picked:
                yield Problem(str(entry), ProblemKind.STRAY, f"a file where a {level} folder belongs")
        elif not _is_canonical_segment(entry.name):
            if picked:
                yield Problem(
                    str(entry), ProblemKind.STRAY, f"{level} folder name is not a canonical percent-encoded segment"
                )
        elif depth < len(_FOLDER_LEVELS) - 1:
            yield from _tree_problems(entry, depth + 1, role, selector)
        elif picked or _selected(entry, role, selector):
            yield from _descriptor_folder_problems(entry, role)


def _selected(folder: Path, role: str, selector: Selector) -> bool:
    """Whether ``selector`` picks the descriptor folder ``folder`` (canonical names, whole names read from its
    metadata.json where they are shortened), whether or not its database is there."""
    return selector.matches(Location.from_db_path(folder.parents[4], folder / database_name(role)))


def stray_paths(root: Path, selector: Selector | None = None) -> list[Problem]:
    """Files and folders under ``root`` that are not part of the layout (see :mod:`store.layout`).

    Backups (``*.db.bak-*``), SQLite's side files (``-wal``, ``-shm`` and the
    rollback ``-journal``, which holds an interrupted write's undo pages:
    deleting it would damage the database), lock files and sharing's
    bookkeeping folder are part of the layout. With a non-empty ``selector``,
    only what lies in the descriptor folders it picks: a folder whose
    database is missing (a crash while creating it, a damaged file deleted)
    is a database the selector asked about, though no listing holds it.
    """
    selector = selector or Selector()
    if not root.is_dir():
        return []
    problems: list[Problem] = []
    for entry in sorted(root.iterdir()):
        if entry.name in ROLES and entry.is_dir():
            if selector.role in (None, entry.name):
                problems += _tree_problems(entry, 0, entry.name, selector)
        elif entry.name != SYNC_FOLDER and selector.is_empty():
            problems.append(Problem(str(entry), ProblemKind.STRAY, f"not a role folder ({' or '.join(ROLES)})"))
    return problems
