"""What a legacy cache is, told by its content: tables, columns, NOT NULL flags, metadata.json keys.

Contract:

* :func:`detect` walks the given files and folders (sorted, so every run sees
  the same order; folders reached through a symbolic link after the others,
  and a file met twice once, at its own place) and returns one
  :class:`Detection` per candidate file:
  every SQLite file (by its header, whatever its name), every zip, parquet or
  ``.csv`` file, and every legacy ``metadata.json`` that has no database
  beside it. A file named explicitly is always reported; inside folders,
  files that are none of those (logs, JSONL outputs), zips that hold no
  ``.csv`` file (a .docx, a .jar) and CSV files that cannot be read and name
  none of the cache columns, and empty files (a run that stopped before it
  created its tables) are counted, not listed, and SQLite sidecars
  (``-wal``, ``-shm``, ``-journal``) belong to their database.
* A name never decides anything: a ``judgements.db`` holding a ``completions``
  table is a completions cache; a ``.db`` that is not SQLite is ``corrupt``.
* States: ``ok`` (a known variant; importable or not is the importer's call),
  ``corrupt`` (not readable as what it claims to be: damaged SQLite, bad zip,
  parquet without pyarrow...), ``invalid`` (our table or DataFrame columns,
  but not the columns of any known variant, e.g. a CSV missing a column),
  ``missing`` (a path given that does not exist), ``not-ours`` (another
  tool's SQLite file, or a file with none of our columns) and
  ``judgestore`` (judgestore's own: a descriptor database, a backup of one,
  or the sharing bookkeeping ``.judgestore-sync/sync.db``, told by its
  tables). :data:`PROBLEM_STATES` are those a command fails on.
* The variants are exactly those of docs/legacy-formats.md (S0 ... S7, the
  DataFrame caches, LangChain's SQLiteCache), one :class:`LegacyVariant`
  each, whose value is the name reports print; ``usage_json`` added to any
  S3-onwards table (by ``ALTER TABLE`` on old files) is reported as a flag,
  and an S4c or S6j table with it is named S7c / S7j (any other one
  ``S3c+usage_json``, say).
* Opening is strictly read-only (:mod:`store.legacy.readonly`).
"""

from __future__ import annotations

import enum
import os
import sqlite3
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from store.legacy.metadata import (
    LEGACY_METADATA_FILE,
    LegacyMetadata,
    LegacyTree,
    MetadataForm,
    check_metadata_folder,
    legacy_tree,
    read_legacy_metadata,
)
from store.legacy.readonly import (
    WRITTEN_MEANWHILE,
    ColumnInfo,
    DataFrameError,
    as_text,
    file_kind,
    file_stamp,
    open_dataframe,
    open_sqlite_readonly,
    table_columns,
)
from store.roles import Role
from store.schema import VERSION_TABLE

_SIDECARS = ("-wal", "-shm", "-journal")
JUDGES_SHOWN = 5  # the judges of an S0 file a message names
# The tables of sharing's bookkeeping (store.sync.bookkeeping; named here so that detecting does not import sharing)
BOOKKEEPING_TABLES = frozenset({"remotes", "shards", "shard_keys"})


class LegacyVariant(enum.StrEnum):
    """One legacy cache variant of docs/legacy-formats.md; the value is its name in reports and ``--json``."""

    S0 = "S0"
    S1C = "S1c"
    S1J = "S1j"
    S2 = "S2"
    S3C = "S3c"
    S4C = "S4c"
    S7C = "S7c"  # S4c with usage_json
    S3J = "S3j"
    S4J = "S4j"
    S5J = "S5j"
    S6J = "S6j"
    S7J = "S7j"  # S6j with usage_json
    # usage_json added in place (ALTER TABLE) to a table whose shape has no S7 name
    S3C_USAGE = "S3c+usage_json"
    S3J_USAGE = "S3j+usage_json"
    S4J_USAGE = "S4j+usage_json"
    S5J_USAGE = "S5j+usage_json"
    DF_COMPLETIONS = "DF-completions"
    DF_MT_BENCH = "DF-mt-bench"
    DF_ELO_JUDGE = "DF-elo-judge"
    LANGCHAIN = "LangChain"


class State(enum.StrEnum):
    OK = "ok"
    CORRUPT = "corrupt"
    INVALID = "invalid"
    MISSING = "missing"
    NOT_OURS = "not-ours"
    JUDGESTORE = "judgestore"


PROBLEM_STATES = frozenset({State.CORRUPT, State.INVALID, State.MISSING})  # a source the user must look at


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One legacy table shape: the exact column set (``usage_json`` aside)."""

    variant: LegacyVariant
    table: str
    role: Role
    columns: frozenset[str]
    optional: frozenset[str] = frozenset()


_S1C = frozenset({"instruction_index", "completion", "pushed_by", "pushed_at", "run_id"})
_S1J = frozenset(
    {"id", "instruction_index", "model_A", "model_B", "judge_input", "judge_output", "pushed_by", "pushed_at",
     "run_id"}
)  # fmt: skip
_S3C = frozenset({"input_hash", "input_text", "completion", "benchmark", "instruction_id", "model", "pushed_at"})
_S4C = _S3C | {"pushed_by", "run_id"}
_S3J = frozenset(
    {"input_hash", "judge_input", "judge_completion", "benchmark", "instruction_id", "model_a", "model_b", "judge",
     "orientation", "pushed_at"}
)  # fmt: skip
_S4J = _S3J | {"pushed_by", "run_id"}
_S5J = _S4J | {"top_logprobs"}

# S5j and S6j share their columns; the NOT NULL flag of model_b tells them apart (see _sqlite_variant).
TABLE_SPECS: tuple[TableSpec, ...] = (
    TableSpec(
        LegacyVariant.S0,
        "annotations",
        "judgements",
        frozenset({"benchmark", "instruction_id", "model_a", "model_b", "judge", "judge_input", "judge_completion"}),
        frozenset({"reasoning_content", "input_tokens", "output_tokens", "reasoning_tokens", "date"}),
    ),
    TableSpec(LegacyVariant.S1C, "completions", "completions", _S1C),
    TableSpec(LegacyVariant.S1J, "judgements", "judgements", _S1J),
    TableSpec(LegacyVariant.S3C, "completions", "completions", _S3C),
    TableSpec(LegacyVariant.S4C, "completions", "completions", _S4C),
    TableSpec(LegacyVariant.S3J, "judgements", "judgements", _S3J),
    TableSpec(LegacyVariant.S4J, "judgements", "judgements", _S4J),
    TableSpec(LegacyVariant.S5J, "judgements", "judgements", _S5J),
)
S2_TABLES = {
    "inference": frozenset(
        {"input_hash", "input_text", "output_text", "producer_metadata_json", "pushed_by", "pushed_at", "run_id"}
    ),
    "inference_metadata": frozenset({"input_hash", "metadata_hash", "metadata_json", "observed_at", "run_id"}),
}
LANGCHAIN_COLUMNS = frozenset({"prompt", "llm", "idx", "response"})
# Variants from S3 on carry a content hash; usage_json may have been added to any of them in place.
_WITH_USAGE = {
    LegacyVariant.S3C: LegacyVariant.S3C_USAGE,
    LegacyVariant.S4C: LegacyVariant.S7C,
    LegacyVariant.S3J: LegacyVariant.S3J_USAGE,
    LegacyVariant.S4J: LegacyVariant.S4J_USAGE,
    LegacyVariant.S5J: LegacyVariant.S5J_USAGE,
    LegacyVariant.S6J: LegacyVariant.S7J,
}

_ELO = frozenset(
    {"judge_completion", "instruction", "completion_A", "completion_B", "pref", "use_model_a_as_opponent",
     "our_model_is_position_a", "opponent_model"}
)  # fmt: skip
DATAFRAME_SPECS: dict[LegacyVariant, tuple[Role, frozenset[str]]] = {
    LegacyVariant.DF_MT_BENCH: (
        "completions",
        frozenset({"instruction_index", "completion_turn_1", "completion_turn_2"}),
    ),
    LegacyVariant.DF_ELO_JUDGE: ("judgements", _ELO),
    LegacyVariant.DF_COMPLETIONS: ("completions", frozenset({"completion", "instruction_index"})),
}
_DATAFRAME_COLUMNS = frozenset().union(*(cols for _, cols in DATAFRAME_SPECS.values()))


@dataclass(frozen=True, slots=True)
class Detection:
    """What one source file is; see the module docstring for the states."""

    path: Path
    state: State
    detail: str  # what was found, or why it cannot be used
    variant: LegacyVariant | None = None
    role: Role | None = None  # None: S2 (role per row), LangChain, or not a variant
    kind: str = "sqlite"  # sqlite | dataframe | metadata | other
    table: str | None = None
    columns: tuple[str, ...] = ()
    has_usage: bool = False  # usage_json present (S3 onwards)
    rows: int | None = None
    metadata: LegacyMetadata | None = None
    tree: LegacyTree | None = None
    notes: tuple[str, ...] = field(default=())
    judges: tuple[str, ...] = ()  # S0: the judges its rows name (at most JUDGES_SHOWN + 1 of them)

    @property
    def ok(self) -> bool:
        return self.state is State.OK

    def as_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "state": self.state.value,
            "variant": self.variant,
            "role": self.role,
            "kind": self.kind,
            "rows": self.rows,
            "detail": self.detail,
            "metadata_form": None if self.metadata is None else self.metadata.form.value,
            "task": None if self.tree is None else self.tree.task,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class DetectionResult:
    detections: tuple[Detection, ...]
    ignored_files: int  # files inside the given folders that are not candidates at all


# ---------------------------------------------------------------- SQLite


def _sqlite_variant(
    tables: dict[str, tuple[ColumnInfo, ...]],
) -> tuple[State, str, TableSpec | None, LegacyVariant | None]:
    """(state, detail, spec, variant) for a file's user tables."""
    names = set(tables)
    if VERSION_TABLE in names:
        return State.JUDGESTORE, "already a judgestore database (nothing to import)", None, None
    if names >= BOOKKEEPING_TABLES:
        detail = "judgestore's sharing bookkeeping (which shards were pushed and fetched; nothing to import)"
        return State.JUDGESTORE, detail, None, None
    if set(S2_TABLES) <= names:
        for table, expected in S2_TABLES.items():
            found = {c.name for c in tables[table]}
            if found != expected:
                return State.INVALID, _column_mismatch(table, found, expected), None, None
        return State.OK, "S2 inference cache (inference + inference_metadata)", None, LegacyVariant.S2
    if "full_llm_cache" in names and {c.name for c in tables["full_llm_cache"]} >= LANGCHAIN_COLUMNS:
        return State.OK, "LangChain SQLiteCache (full_llm_cache)", None, LegacyVariant.LANGCHAIN
    ours = [t for t in ("annotations", "completions", "judgements") if t in names]
    if not ours:
        shown = ", ".join(sorted(names)[:6]) or "no tables"
        return State.NOT_OURS, f"SQLite file of another tool ({shown})", None, None
    if len(ours) > 1:
        return State.INVALID, f"holds several legacy tables ({', '.join(ours)}); no legacy variant does", None, None
    table = ours[0]
    columns = {c.name for c in tables[table]}
    has_usage = "usage_json" in columns
    base = columns - {"usage_json"}
    for spec in TABLE_SPECS:
        if spec.table != table or not (spec.columns <= base <= spec.columns | spec.optional):
            continue
        variant = spec.variant
        if variant is LegacyVariant.S5J:
            model_b = next(c for c in tables[table] if c.name == "model_b")
            variant = LegacyVariant.S5J if model_b.notnull else LegacyVariant.S6J
        if has_usage:
            if variant not in _WITH_USAGE:
                return State.INVALID, f"{variant} table with a usage_json column, which no variant has", None, None
            variant = _WITH_USAGE[variant]
        return State.OK, f"{variant} ({table}, {len(columns)} columns)", spec, variant
    closest = max((s for s in TABLE_SPECS if s.table == table), key=lambda s: len(s.columns & base))
    return State.INVALID, _column_mismatch(table, base, closest.columns, closest.variant), None, None


def _column_mismatch(
    table: str, found: set[str], expected: frozenset[str], variant: LegacyVariant | None = None
) -> str:
    missing, extra = sorted(expected - found), sorted(found - expected)
    against = f" (closest: {variant})" if variant else ""
    return f"table {table} matches no known variant{against}: missing columns {missing}, unexpected {extra}"


def _detect_sqlite(path: Path) -> Detection:
    stamp = file_stamp(path)
    try:
        with open_sqlite_readonly(path) as conn:
            tables = table_columns(conn)
            state, detail, spec, variant = _sqlite_variant(tables)
            table = spec.table if spec else ("inference" if variant is LegacyVariant.S2 else None)
            if variant is LegacyVariant.LANGCHAIN:
                table = "full_llm_cache"
            rows = None
            judges: tuple[str, ...] = ()
            if state is State.OK and table is not None:
                rows = int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
                if variant is LegacyVariant.S0:  # which judges wrote it: one --descriptor names one of them
                    found = conn.execute(f'SELECT DISTINCT judge FROM "{table}" LIMIT {JUDGES_SHOWN + 1}')
                    judges = tuple(sorted(as_text(judge) for (judge,) in found if judge is not None))
    except (sqlite3.DatabaseError, OSError) as e:
        if file_stamp(path) != stamp:  # not damaged: read while a commit rewrote its pages
            return Detection(path, State.CORRUPT, f"{WRITTEN_MEANWHILE} ({e})")
        return Detection(path, State.CORRUPT, f"damaged or unreadable SQLite file ({e})")
    if state is not State.OK:
        return Detection(path, state, detail)
    assert variant is not None
    columns = tuple(c.name for c in tables[table]) if table else ()
    role = spec.role if spec else None
    return Detection(
        path, state, detail, variant, role, "sqlite", table, columns, "usage_json" in columns, rows,
        *_metadata_beside(path), judges=judges,
    )  # fmt: skip


def _metadata_beside(path: Path) -> tuple[LegacyMetadata | None, LegacyTree | None]:
    beside = path.parent / LEGACY_METADATA_FILE
    metadata = read_legacy_metadata(beside) if beside.is_file() else None
    return metadata, legacy_tree(path)


# ---------------------------------------------------------------- DataFrames


def _detect_dataframe(path: Path, named: bool, kind: str) -> Detection | None:
    try:
        source = open_dataframe(path)
    except DataFrameError as e:
        if _may_be_a_cache(path, kind):
            return Detection(path, State.CORRUPT, f"{e}", kind="dataframe")
        if not named:  # another tool's file in a data folder: not listed
            return None
        return Detection(path, State.NOT_OURS, f"not a DataFrame cache: {e}", kind="dataframe")
    columns = set(source.columns)
    for variant, (role, expected) in DATAFRAME_SPECS.items():
        if expected <= columns:
            detail = f"pass-level DataFrame cache ({source.fmt}, {variant})"
            return Detection(path, State.OK, detail, variant, role, "dataframe", None, source.columns,
                             rows=source.rows, tree=legacy_tree(path))  # fmt: skip
    if columns & _DATAFRAME_COLUMNS:
        # closest: most shared columns, then fewest missing
        variant, (role, expected) = max(
            DATAFRAME_SPECS.items(), key=lambda kv: (len(kv[1][1] & columns), -len(kv[1][1] - columns))
        )
        missing = sorted(expected - columns)
        detail = f"{source.fmt} cache with missing columns {missing} (closest: {variant}; has {sorted(columns)})"
        return Detection(path, State.INVALID, detail, None, role, "dataframe", None, source.columns)
    if not named:
        return None
    return Detection(path, State.NOT_OURS, f"{source.fmt} file with none of the cache columns", kind="dataframe")


def _may_be_a_cache(path: Path, kind: str) -> bool:
    """Whether a file that cannot be read as a DataFrame cache may still be a damaged one, told by what can be read
    of it: a zip that holds no ``.csv`` file (a .docx, a .jar, an archive of logs) and a CSV whose first line names
    none of the cache columns (notes in another encoding) are not; a zip that cannot be opened may be. ``kind``
    is :func:`file_kind`'s."""
    if kind == "zip":
        try:
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith(".csv") for name in archive.namelist())
        except (zipfile.BadZipFile, OSError):
            return True
    if kind == "csv":
        try:
            with path.open("rb") as handle:
                first_line = handle.readline(1 << 16).decode("latin-1")
        except OSError:
            return True
        return bool({cell.strip(' "\r\n') for cell in first_line.split(",")} & _DATAFRAME_COLUMNS)
    return True


# ---------------------------------------------------------------- walking


def _candidates(sources: Sequence[Path], problems: list[Detection]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) for every file named or under a named folder, sidecars left out; each folder's
    files sorted.

    Folders reached through a symbolic link are walked too (a cache tree linked into a data folder is part of
    it), but only after every folder reachable without one: a folder met both ways is walked at its own place,
    where the legacy tree it lies in says which task and model wrote it (a ``latest`` link to a run folder would
    otherwise stand for it). Each real folder is walked once (a link to a folder above it is no loop). A folder
    that cannot be listed, a link to nothing (a problem where its name is a cache file's, else only listed) and a
    link loop are added to ``problems``: their rows would be missing without a word.
    """
    found: list[tuple[Path, bool]] = []
    walked: set[Path] = set()
    links: list[Path] = []

    def unreadable(error: OSError) -> None:
        where = Path(error.filename) if error.filename else Path(".")
        problems.append(Detection(where, State.CORRUPT, f"a folder that cannot be listed ({error.strerror})",
                                  kind="other"))  # fmt: skip

    def walk(top: Path) -> None:
        files = []
        for folder, subfolders, names in os.walk(top, onerror=unreadable):  # links to folders are not entered
            real = Path(folder).resolve()
            if real in walked:
                subfolders.clear()
                continue
            walked.add(real)
            subfolders.sort()
            links.extend(Path(folder, name) for name in subfolders if Path(folder, name).is_symlink())
            for name in names:
                path = Path(folder, name)
                if name.endswith(_SIDECARS):
                    continue
                if path.is_file():
                    files.append(path)
                elif path.is_symlink() and not path.exists():
                    problems.append(_broken_link(path))
        found.extend((path, False) for path in sorted(files))

    for source in sources:
        if _resolved(source) is None:
            problems.append(Detection(source, State.CORRUPT, _LOOP, kind="other"))
        elif source.is_dir() and source.is_symlink():
            links.append(source)  # named, but a link: walked after the real folders (a shell's `legacy/*`)
        elif source.is_dir():
            walk(source)
        else:
            found.append((source, True))
    while links:  # breadth first: the links nearest the sources first
        link = links.pop(0)
        if _resolved(link) is not None:
            walk(link)
    return found


_CACHE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".csv", ".zip", ".parquet")
_LOOP = "a symbolic link that leads back to itself (a loop)"


def _resolved(path: Path) -> Path | None:
    """``path`` with every link followed; None for a link loop."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError on a loop
        return None


def _broken_link(path: Path) -> Detection:
    """A link that leads nowhere: a problem where its name says it stood for a cache file, else listed (what it
    led to, a cache tree on a disk not mounted, say, was not read) without failing the import."""
    if _resolved(path) is None:
        return Detection(path, State.CORRUPT, _LOOP, kind="other")
    target = os.readlink(path)
    if path.name.endswith(_CACHE_SUFFIXES):
        return Detection(path, State.MISSING, f"a symbolic link to {target}, which does not exist", kind="other")
    return Detection(path, State.NOT_OURS, f"a symbolic link to {target}, which does not exist: nothing there was "
                     "read", kind="other")  # fmt: skip


def detect_file(path: Path, *, named: bool = True) -> Detection | None:
    """The detection of one file; None for an unnamed file that is not a candidate at all."""
    if not path.exists():
        return Detection(path, State.MISSING, "does not exist (check the path)", kind="other")
    if path.stat().st_size == 0:  # what a legacy run that stopped before creating its tables leaves: no rows
        return Detection(path, State.NOT_OURS, "an empty file: nothing to import", kind="other") if named else None
    try:
        with path.open("rb"):
            pass
    except OSError as e:  # whatever it holds, it cannot be told: the user must look (its rows would be missing)
        return Detection(path, State.CORRUPT, f"cannot be read ({e.strerror}); nothing of it was imported",
                         kind="other")  # fmt: skip
    kind = file_kind(path)
    if kind == "sqlite":
        return _detect_sqlite(path)
    if kind in ("zip", "parquet", "csv"):
        return _detect_dataframe(path, named, kind)
    if path.suffix in (".db", ".sqlite", ".sqlite3") or named:
        what = "not an SQLite database (wrong header)" if path.suffix in (".db", ".sqlite", ".sqlite3") else None
        if what is not None:
            return Detection(path, State.CORRUPT, what, kind="other")
        return Detection(path, State.NOT_OURS, "not a legacy cache (not SQLite, CSV, zip or parquet)", kind="other")
    return None


def detect(sources: Sequence[Path] | Iterable[Path]) -> DetectionResult:
    """Detect every candidate under ``sources``; see the module docstring."""
    detections: list[Detection] = []
    ignored = 0
    folders_with_data: set[Path] = set()
    lone_metadata: list[Path] = []
    candidates = _candidates([Path(source) for source in sources], detections)
    # A file met twice (a link to it, a source named twice) is detected once, at its own place rather than a
    # link's: the metadata.json beside it and the tree it lies in are what say which run wrote it.
    kept: dict[Path, int] = {}  # each file's candidate: the first that is no link, else the first
    for index, (path, _) in enumerate(candidates):
        known = kept.setdefault(path.resolve(), index)
        if candidates[known][0].is_symlink() and not path.is_symlink():
            kept[path.resolve()] = index
    for index, (path, named) in enumerate(candidates):
        resolved = path.resolve()
        if kept[resolved] != index:
            continue
        if path.is_symlink() and not (path.parent / LEGACY_METADATA_FILE).is_file():
            path = resolved  # a linked file with nothing beside the link: its own folder says what it is
        if path.name == LEGACY_METADATA_FILE:
            lone_metadata.append(path)
            continue
        detection = detect_file(path, named=named)
        if detection is None:
            ignored += 1
            continue
        if detection.ok and detection.metadata is not None:  # so `--detect` says what the import would refuse
            problem = check_metadata_folder(detection.metadata, detection.tree)
            if problem is not None:
                detection = replace(detection, state=State.INVALID, detail=problem)
        if detection.kind != "metadata":  # a database there, readable or not: the metadata.json is not alone
            folders_with_data.add(path.parent.resolve())
        detections.append(detection)
    for path in lone_metadata:
        if path.parent.resolve() in folders_with_data:
            continue
        metadata = read_legacy_metadata(path)
        if metadata.form is MetadataForm.UNKNOWN:
            ignored += 1
            continue
        if metadata.form is MetadataForm.JUDGESTORE:
            detail = "a judgestore metadata.json (its database is missing; nothing to import)"
            detections.append(Detection(path, State.JUDGESTORE, detail, kind="metadata", metadata=metadata))
            continue
        empty = sorted(p.name for p in path.parent.glob("*.db") if p.is_file() and p.stat().st_size == 0)
        if empty:  # a legacy run that stopped before writing leaves one; so does a copy cut short
            detail = (
                f"{metadata.form.value} metadata.json whose database {', '.join(empty)} is empty (0 bytes: a run "
                "that stopped before writing, or a copy cut short?): nothing to import"
            )
        else:
            detail = f"{metadata.form.value} metadata.json with no database beside it (nothing to import)"
        detections.append(Detection(path, State.OK, detail, kind="metadata", metadata=metadata, tree=legacy_tree(path)))
    return DetectionResult(tuple(detections), ignored)
