"""Looking at a whole store root: list, select, query, delete, upgrade and verify its databases.

Contract:

* A :class:`Selector` picks *databases* by their location (role, task,
  provider, descriptor model, descriptor hash prefix); a
  :class:`~store.records.RowFilter` picks *rows*. Selecting databases never
  selects rows: :func:`plan_delete` and :func:`delete_rows` refuse an empty row
  filter with :class:`~store.errors.EmptyFilterError` before opening anything.
* Everything here opens databases read-only and writes nothing (no ``-wal``,
  ``-shm`` or lock file), except :func:`delete_rows` (a write transaction per
  database) and :func:`upgrade_store` (which hands only databases classified
  ``behind`` to :func:`store.schema.upgrade_database`; every other state is
  reported without the file being opened for writing).
* :func:`inspect_database` and :func:`verify_database` never raise for a bad
  database: what is wrong becomes a state or a list of :class:`Problem`
  records, each naming its file. :func:`query_rows` and :func:`plan_delete`
  do raise the typed error of the first database they cannot read.
* Rows are streamed (:func:`query_rows` is a generator over each database's
  own streaming query), databases visited in :func:`store.layout.walk` order,
  rows of one database ordered by ``created_at``.
* Filters that exist only on judgements (``model_a``, ``model_b``,
  ``judge``, ``orientation``, ``pointwise``) restrict a query to judgement
  databases; combined with ``role="completions"`` they are an error.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DatabaseError

from store import schema
from store.descriptor import input_hash
from store.engine import create_sqlite_engine
from store.errors import (
    CorruptDatabaseError,
    DatabaseMissingError,
    EmptyFilterError,
    InvalidInputError,
    JudgestoreError,
    MetadataMismatchError,
    MetadataMissingError,
    NotADatabaseError,
)
from store.layout import (
    METADATA_FILE,
    ROLES,
    SYNC_FOLDER,
    Location,
    Role,
    check_role,
    decode_segment,
    read_location_metadata,
    walk,
)
from store.records import RECORD_OF_ROLE, Record, RowFilter, record_fields
from store.repository import Repository
from store.schema import (
    Revisions,
    SchemaState,
    SchemaStatus,
    UpgradeOutcome,
    UpgradeResult,
    classify,
    raise_for_status,
    revisions_of,
    translated,
    upgrade_database,
)
from store.settings import Settings
from store.store import Store

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

JUDGEMENT_ONLY_FILTERS = ("model_a", "model_b", "judge", "orientation", "pair", "pointwise")
LOCATION_COLUMNS = ("role", "task", "provider", "descriptor_model", "descriptor")
MAX_LISTED_BAD_ROWS = 10


# ---------------------------------------------------------------- selecting databases


@dataclass(frozen=True, slots=True, kw_only=True)
class Selector:
    """Databases whose location equals every field that is set.

    ``descriptor`` is a prefix of the folder name (the descriptor hash's first
    16 hex characters); a full 64-character hash selects its folder too.
    """

    role: Role | None = None
    task: str | None = None
    provider: str | None = None
    model: str | None = None
    descriptor: str | None = None

    def __post_init__(self) -> None:
        if self.role is not None:
            check_role(self.role)
        if self.descriptor is not None and not (
            self.descriptor and all(c in "0123456789abcdef" for c in self.descriptor)
        ):
            raise InvalidInputError(f"descriptor must be lowercase hex (a hash prefix), got {self.descriptor!r}")

    def matches(self, location: Location) -> bool:
        return (
            (self.role is None or location.role == self.role)
            and (self.task is None or location.task == self.task)
            and (self.provider is None or location.provider == self.provider)
            and (self.model is None or location.model == self.model)
            and (self.descriptor is None or location.descriptor_hash16.startswith(self.descriptor[:16]))
        )

    def is_empty(self) -> bool:
        return all(value is None for value in self.as_dict().values())

    def as_dict(self) -> dict[str, str | None]:
        return {
            "role": self.role,
            "task": self.task,
            "provider": self.provider,
            "model": self.model,
            "descriptor": self.descriptor,
        }


def select(root: Path, selector: Selector | None = None) -> list[Location]:
    """Every descriptor database under ``root`` that ``selector`` picks, in walk order."""
    selector = selector or Selector()
    return [location for location in walk(root) if selector.matches(location)]


def roles_for(flt: RowFilter, role: Role | None = None) -> tuple[Role, ...]:
    """The roles whose tables have every column ``flt`` names (see the module docstring)."""
    judgement_only = [name for name in JUDGEMENT_ONLY_FILTERS if getattr(flt, name) is not None]
    if not judgement_only:
        return (role,) if role is not None else ROLES
    if role == "completions":
        raise InvalidInputError(f"filters on {', '.join(judgement_only)} apply to judgements only, not completions")
    return ("judgements",)


def parse_timestamp(value: str) -> datetime:
    """An ISO-8601 date or date-time; a value without a UTC offset is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as e:
        raise InvalidInputError(
            f"{value!r} is not an ISO-8601 date or date-time (e.g. 2026-01-31 or 2026-01-31T12:00:00+02:00)"
        ) from e
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


# ---------------------------------------------------------------- listing


class DatabaseState(enum.StrEnum):
    """What a database file is, from the store's point of view."""

    EMPTY = "empty"
    CURRENT = "current"
    BEHIND = "behind"
    AHEAD = "ahead"
    FOREIGN = "foreign"
    NOT_A_DATABASE = "not-a-database"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    METADATA_MISSING = "metadata-missing"
    METADATA_MISMATCH = "metadata-mismatch"


USABLE_STATES = frozenset({DatabaseState.CURRENT, DatabaseState.EMPTY})


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    """One database as :func:`inspect_database` found it.

    ``state`` is the most serious thing found: a file that cannot be read
    first, then a metadata.json that does not match, then the schema state.
    ``rows`` is counted for current databases only; ``error`` explains every
    state but current and empty.
    """

    location: Location
    path: Path
    state: DatabaseState
    revision: str | None
    head: str
    rows: int | None
    size_bytes: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the store opens this database as it is (empty ones are created at head)."""
        return self.state in USABLE_STATES

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.location.role,
            "task": self.location.task,
            "provider": self.location.provider,
            "model": self.location.model,
            "descriptor": self.location.descriptor_hash16,
            "path": str(self.path),
            "state": self.state.value,
            "revision": self.revision,
            "head": self.head,
            "rows": self.rows,
            "size_bytes": self.size_bytes,
            "error": self.error,
        }


def database_size(path: Path) -> int:
    """Bytes on disk of a database and its write-ahead log."""
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _file_state(error: BaseException) -> DatabaseState:
    if isinstance(error, NotADatabaseError):
        return DatabaseState.NOT_A_DATABASE
    if isinstance(error, CorruptDatabaseError):
        return DatabaseState.CORRUPT
    return DatabaseState.UNREADABLE


def _status_error(status: SchemaStatus, path: Path) -> str | None:
    try:
        raise_for_status(status, path)
    except JudgestoreError as e:
        return str(e)
    return None


def inspect_database(
    root: Path, location: Location, settings: Settings, *, known: Revisions | None = None, count_rows: bool = True
) -> DatabaseInfo:
    """Classify one database read-only (and count its rows when it is current); never raises for a bad file."""
    known = known or schema.revisions()
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
                state, revision, error = DatabaseState(status.state.value), status.revision, _status_error(status, path)
                if status.state is SchemaState.CURRENT and count_rows:
                    rows = Repository(conn, location.role).count()
        finally:
            engine.dispose()
    except DatabaseError as e:
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
            state, error = DatabaseState.UNREADABLE, f"{location.folder(root) / METADATA_FILE}: {e}"
    return DatabaseInfo(location, path, state, revision, known.head, rows, size, error)


def inspect_databases(
    root: Path, locations: Iterable[Location], settings: Settings, *, count_rows: bool = True
) -> Iterator[DatabaseInfo]:
    for location in locations:
        yield inspect_database(root, location, settings, count_rows=count_rows)


# ---------------------------------------------------------------- rows


def row_columns(roles: Iterable[Role] = ROLES) -> tuple[str, ...]:
    """Column names of :meth:`FoundRow.as_dict` for rows of ``roles``: location first, then the record's fields."""
    chosen = set(roles)
    columns: list[str] = list(LOCATION_COLUMNS)
    for role in ROLES:
        if role in chosen:
            columns += [name for name in record_fields(RECORD_OF_ROLE[role]) if name not in columns]
    return tuple(columns)


@dataclass(frozen=True, slots=True)
class FoundRow:
    """A row and the database it came from."""

    location: Location
    record: Record

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "role": self.location.role,
            "task": self.location.task,
            "provider": self.location.provider,
            "descriptor_model": self.location.model,
            "descriptor": self.location.descriptor_hash16,
        }
        for name in record_fields(type(self.record)):
            values[name] = getattr(self.record, name)
        return values


def query_rows(
    root: Path, settings: Settings, selector: Selector, flt: RowFilter, *, limit: int | None = None
) -> Iterator[FoundRow]:
    """Stream the rows matching ``flt`` from every selected database (read-only).

    Databases without tables are skipped; any other database the store refuses
    to open (behind, ahead, foreign, damaged) raises its typed error.
    """
    if limit is not None and limit < 0:
        raise InvalidInputError(f"limit must be >= 0, got {limit}")
    roles = roles_for(flt, selector.role)
    remaining = limit
    with Store(settings, root=root, readonly=True) as store:
        for location in select(root, selector):
            if location.role not in roles:
                continue
            if remaining == 0:
                return
            try:
                database = store.open(location)
            except DatabaseMissingError:
                continue
            for record in database.query(flt, limit=remaining):
                yield FoundRow(location, record)
                if remaining is not None:
                    remaining -= 1


@dataclass(frozen=True, slots=True)
class RowCount:
    """How many rows of one database a filter matched (or deleted)."""

    location: Location
    path: Path
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.location.role,
            "task": self.location.task,
            "provider": self.location.provider,
            "model": self.location.model,
            "descriptor": self.location.descriptor_hash16,
            "path": str(self.path),
            "rows": self.rows,
        }


def plan_delete(root: Path, settings: Settings, selector: Selector, flt: RowFilter) -> list[RowCount]:
    """Count, read-only, the rows ``flt`` matches in each selected database; databases with none are left out."""
    if flt.is_empty():
        raise EmptyFilterError()
    roles = roles_for(flt, selector.role)
    plan: list[RowCount] = []
    with Store(settings, root=root, readonly=True) as store:
        for location in select(root, selector):
            if location.role not in roles:
                continue
            try:
                database = store.open(location)
            except DatabaseMissingError:
                continue
            rows = database.count(flt)
            if rows:
                plan.append(RowCount(location, database.path, rows))
    return plan


def delete_rows(root: Path, settings: Settings, plan: Iterable[RowCount], flt: RowFilter) -> list[RowCount]:
    """Delete the rows matching ``flt`` from the databases of ``plan``; returns the rows actually deleted.

    Each database is one write transaction; rows written after the plan was
    made that match ``flt`` are deleted too (the counts say so).
    """
    if flt.is_empty():
        raise EmptyFilterError()
    deleted: list[RowCount] = []
    with Store(settings, root=root) as store:
        for entry in plan:
            database = store.open(entry.location)
            deleted.append(RowCount(entry.location, database.path, database.delete(flt)))
    return deleted


# ---------------------------------------------------------------- upgrades


def upgrade_store(
    root: Path,
    locations: Iterable[Location],
    settings: Settings,
    *,
    keep_backup: bool = True,
    script: ScriptDirectory | None = None,
) -> Iterator[UpgradeResult]:
    """Upgrade every ``behind`` database among ``locations``; report the others without writing to them.

    Current and empty databases are ``up-to-date`` (an empty one is created at
    head when it is first written); every other state is ``refused`` with its
    reason, and its file is not opened for writing.
    """
    known = schema.revisions() if script is None else revisions_of(script)
    for location in locations:
        info = inspect_database(root, location, settings, known=known, count_rows=False)
        if info.state is DatabaseState.BEHIND:
            yield upgrade_database(info.path, settings, script=script, keep_backup=keep_backup)
        elif info.ok:
            yield UpgradeResult(info.path, UpgradeOutcome.UP_TO_DATE, info.revision, info.revision)
        else:
            yield UpgradeResult(info.path, UpgradeOutcome.REFUSED, info.revision, None, error=info.error)


# ---------------------------------------------------------------- verification


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
        problems.append(Problem(location.folder(root) / METADATA_FILE, ProblemKind.METADATA, str(e)))
    checked = 0
    try:
        engine = create_sqlite_engine(path, settings, readonly=True, pooled=False)
        try:
            with engine.connect() as conn, conn.begin():
                problems += _integrity_problems(conn, path)
                status = classify(conn, path, known)
                if status.state not in (SchemaState.CURRENT, SchemaState.EMPTY):
                    problems.append(Problem(path, ProblemKind.SCHEMA, str(_status_error(status, path))))
                elif status.state is SchemaState.CURRENT:
                    checked, bad_rows = _row_hash_problems(conn, location, path)
                    problems += bad_rows
        finally:
            engine.dispose()
    except DatabaseError as e:
        problems.append(Problem(path, ProblemKind.FILE, str(translated(path, e))))
    except (JudgestoreError, OSError, ValueError) as e:  # ValueError: a JSON column that does not decode
        problems.append(Problem(path, ProblemKind.FILE, f"{type(e).__name__}: {e}"))
    return DatabaseVerification(location, path, checked, tuple(problems))


def _is_canonical_segment(name: str) -> bool:
    try:
        decode_segment(name)
    except InvalidInputError:
        return False
    return True


_LEVELS = ("task", "provider", "model", "descriptor")


def _descriptor_folder_problems(folder: Path, role: str) -> list[Problem]:
    db_name = f"{role}.db"
    expected = {METADATA_FILE, db_name, f"{db_name}-wal", f"{db_name}-shm", f"{db_name}.lock"}
    problems = []
    names = set()
    for entry in sorted(folder.iterdir()):
        names.add(entry.name)
        if entry.is_file() and (entry.name in expected or entry.name.startswith(f"{db_name}.bak-")):
            continue
        why = (
            "leftover of an interrupted metadata.json write; safe to delete"
            if entry.name.startswith(".metadata.")
            else f"not part of a descriptor folder (expected {METADATA_FILE}, {db_name} and its backups)"
        )
        problems.append(Problem(entry, ProblemKind.STRAY, why))
    if db_name not in names:
        problems.append(Problem(folder, ProblemKind.STRAY, f"descriptor folder without {db_name}"))
    return problems


def _tree_problems(folder: Path, depth: int, role: str) -> Iterator[Problem]:
    level = _LEVELS[depth]
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            yield Problem(entry, ProblemKind.STRAY, f"a file where a {level} folder belongs")
        elif not _is_canonical_segment(entry.name):
            yield Problem(entry, ProblemKind.STRAY, f"{level} folder name is not a canonical percent-encoded segment")
        elif depth < len(_LEVELS) - 1:
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
