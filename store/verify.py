"""Verifying a store: integrity, metadata, schema, every row's input hash, and stray files.

Contract:

* :func:`verify_database` checks one database read-only (nothing written,
  not even a ``-wal`` file): SQLite's ``integrity_check``, its metadata.json
  against its folder, its schema state, and that every row's ``input_text``
  hashes to its ``input_hash``. It never raises for a bad database: what is
  wrong becomes :class:`Problem` records, each naming its file and the next
  step. It also counts the rows adopted from older descriptors
  (``judgestore adopt``), which are checked like every other row.
* :func:`stray_paths` lists files and folders under a root that are not part
  of the layout (:mod:`store.layout`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, text
from sqlalchemy.exc import DatabaseError

from store import schema
from store.descriptor import input_hash
from store.engine import create_sqlite_engine, translated
from store.errors import InvalidInputError, JudgestoreError, MetadataMismatchError, MetadataMissingError
from store.layout import (
    LEVELS,
    METADATA_FILE,
    METADATA_TEMP_PREFIX,
    ROLES,
    SYNC_FOLDER,
    Location,
    database_name,
    decode_segment,
    descriptor_folder_names,
    is_backup_of,
    read_location_metadata,
)
from store.records import RowFilter
from store.repository import Repository
from store.schema import USABLE_STATES, DatabaseState, Revisions, classify, status_error
from store.settings import Settings

MAX_LISTED_BAD_ROWS = 10


class ProblemKind(enum.StrEnum):
    FILE = "file"  # not SQLite, damaged, unreadable
    INTEGRITY = "integrity"  # PRAGMA integrity_check found something
    METADATA = "metadata"  # metadata.json missing or not matching its folder
    SCHEMA = "schema"  # behind, ahead or foreign
    INPUT_HASH = "input-hash"  # a row's input_text does not hash to its input_hash
    STRAY = "stray"  # a file or folder that is not part of the layout


@dataclass(frozen=True, slots=True)
class Problem:
    path: Path
    kind: ProblemKind
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "kind": self.kind.value, "message": self.message}


@dataclass(frozen=True, slots=True)
class DatabaseVerification:
    location: Location
    path: Path
    rows_checked: int
    problems: tuple[Problem, ...]
    rows_adopted: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def _integrity_problems(conn: Connection, path: Path) -> list[Problem]:
    findings = [str(row[0]) for row in conn.execute(text("PRAGMA integrity_check")).all()]
    if findings == ["ok"]:
        return []
    shown = "; ".join(findings[:5]) + (f"; and {len(findings) - 5} more" if len(findings) > 5 else "")
    return [Problem(path, ProblemKind.INTEGRITY, f"SQLite integrity_check failed: {shown}")]


def _row_hash_problems(conn: Connection, location: Location, path: Path) -> tuple[int, list[Problem]]:
    checked, bad = 0, 0
    problems: list[Problem] = []
    for record in Repository(conn, location.role).query():
        checked += 1
        try:
            actual = input_hash(record.input_text, record.sample_index)
        except (JudgestoreError, ValueError) as e:
            actual = f"<unhashable: {e}>"
        if actual == record.input_hash:
            continue
        bad += 1
        if bad <= MAX_LISTED_BAD_ROWS:
            problems.append(
                Problem(
                    path,
                    ProblemKind.INPUT_HASH,
                    f"row {record.input_hash} (sample {record.sample_index}): its input_text hashes to "
                    f"{actual[:16]}..., not to its input_hash; the row was edited. Delete it with "
                    f"`judgestore delete --input-hash {record.input_hash}` so that it is recomputed",
                )
            )
    if bad > MAX_LISTED_BAD_ROWS:
        problems.append(Problem(path, ProblemKind.INPUT_HASH, f"{bad} rows in all do not hash to their input_hash"))
    return checked, problems


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
        problems.append(Problem(e.path, ProblemKind.METADATA, str(e)))
    except OSError as e:
        problems.append(Problem(location.metadata_path(root), ProblemKind.METADATA, str(e)))
    checked = adopted = 0
    try:
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            with engine.connect() as conn, conn.begin():
                problems += _integrity_problems(conn, path)
                status = classify(conn, path, known)
                if status.state not in USABLE_STATES:
                    problems.append(Problem(path, ProblemKind.SCHEMA, str(status_error(status, path))))
                elif status.state is DatabaseState.CURRENT:
                    checked, bad_rows = _row_hash_problems(conn, location, path)
                    problems += bad_rows
                    adopted = Repository(conn, location.role).count(RowFilter(adopted=True))
        finally:
            engine.dispose()
    except DatabaseError as e:
        problems.append(Problem(path, ProblemKind.FILE, str(translated(path, e))))
    except (JudgestoreError, OSError, ValueError) as e:  # ValueError: a JSON column that does not decode
        problems.append(Problem(path, ProblemKind.FILE, f"{type(e).__name__}: {e}"))
    return DatabaseVerification(location, path, checked, tuple(problems), adopted)


def _is_canonical_segment(name: str) -> bool:
    try:
        decode_segment(name)
    except InvalidInputError:
        return False
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
        why = (
            "leftover of an interrupted metadata.json write; safe to delete"
            if entry.name.startswith(METADATA_TEMP_PREFIX)
            else f"not part of a descriptor folder (expected {METADATA_FILE}, {db_name} and its backups)"
        )
        problems.append(Problem(entry, ProblemKind.STRAY, why))
    if db_name not in names:
        problems.append(Problem(folder, ProblemKind.STRAY, f"descriptor folder without {db_name}"))
    return problems


_FOLDER_LEVELS = LEVELS[1:]  # below the role folder


def _tree_problems(folder: Path, depth: int, role: str) -> Iterator[Problem]:
    level = _FOLDER_LEVELS[depth]
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            yield Problem(entry, ProblemKind.STRAY, f"a file where a {level} folder belongs")
        elif not _is_canonical_segment(entry.name):
            yield Problem(entry, ProblemKind.STRAY, f"{level} folder name is not a canonical percent-encoded segment")
        elif depth < len(_FOLDER_LEVELS) - 1:
            yield from _tree_problems(entry, depth + 1, role)
        else:
            yield from _descriptor_folder_problems(entry, role)


def stray_paths(root: Path) -> list[Problem]:
    """Files and folders under ``root`` that are not part of the layout (see :mod:`store.layout`).

    Backups (``*.db.bak-*``), WAL files, lock files and sharing's bookkeeping
    folder are part of the layout.
    """
    if not root.is_dir():
        return []
    problems: list[Problem] = []
    for entry in sorted(root.iterdir()):
        if entry.name in ROLES and entry.is_dir():
            problems += _tree_problems(entry, 0, entry.name)
        elif entry.name != SYNC_FOLDER:
            problems.append(Problem(entry, ProblemKind.STRAY, f"not a role folder ({' or '.join(ROLES)})"))
    return problems
