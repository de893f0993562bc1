"""Schema revisions on open and in upgrades: classify, refuse untouched, upgrade many, restore on failure."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, create_engine, event

import store.engine
import store.schema
from store.descriptor import ModelDescriptor
from store.errors import (
    CorruptDatabaseError,
    DatabaseMissingError,
    ForeignDatabaseError,
    NotADatabaseError,
    SchemaAheadError,
    SchemaBehindError,
    UpgradeFailedError,
)
from store.layout import Location, metadata_bytes, write_metadata
from store.schema import (
    SchemaState,
    UpgradeOutcome,
    UpgradeResult,
    classify,
    migrate,
    raise_for_status,
    read_script_directory,
    revisions_of,
    upgrade_database,
    upgrade_databases,
)
from store.settings import Settings
from store.store import Store
from tests.factories import (
    SHIPPED_HEAD,
    SYNTHETIC_HEAD,
    SYNTHETIC_REVISIONS,
    completion_record,
    current_database,
    file_digests,
    foreign_database,
    judgement_record,
    stamp,
)

UNKNOWN_REVISION = "9f3e2d1c0b"


@pytest.fixture(scope="module")
def synthetic() -> Any:
    """The script directory with a synthetic revision on top of the shipped head."""
    return read_script_directory(SYNTHETIC_REVISIONS)


def pretend_shipped_scripts_are(script: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the library believe its scripts are ``script`` (a database at the shipped head is then behind)."""
    known = revisions_of(script)
    monkeypatch.setattr(store.schema, "script_directory", lambda: script)
    monkeypatch.setattr(store.schema, "revisions", lambda: known)


def reader(db_path: Path) -> sqlite3.Connection:
    """A connection that writes nothing, not even -wal/-shm files (nobody writes while tests read)."""
    return sqlite3.connect(f"file:{quote(str(db_path))}?immutable=1", uri=True)


def rows_of(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both tables, in the columns the shipped head has (a new column does not hide a lost value)."""
    columns = {
        "completions": "input_hash, sample_index, benchmark, instruction_id, model, finish_reason, run_id, "
        "created_by, created_at, usage, top_logprobs, input_text, completion",
        "judgements": "input_hash, sample_index, benchmark, instruction_id, model_a, model_b, judge, orientation, "
        "finish_reason, run_id, created_by, created_at, usage, top_logprobs, input_text, completion",
    }
    with closing(reader(db_path)) as conn:
        return {t: conn.execute(f"SELECT {c} FROM {t} ORDER BY input_hash").fetchall() for t, c in columns.items()}


def version_of(db_path: Path) -> str:
    with closing(reader(db_path)) as conn:
        return conn.execute("SELECT version_num FROM judgestore_alembic_version").fetchone()[0]


def judgement_columns(db_path: Path) -> list[str]:
    with closing(reader(db_path)) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(judgements)")]


def sample_rows(tag: str, n: int = 6) -> list[Any]:
    return [completion_record(i, completion=f"{tag} answer {i}") for i in range(n)] + [
        judgement_record(i, completion=f"{tag} verdict {i}", pointwise=i % 2 == 0) for i in range(n // 2)
    ]


def at_synthetic_head(db_path: Path, synthetic: Any) -> None:
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.begin() as conn:
        migrate(conn, script=synthetic)
    engine.dispose()


# ---------------------------------------------------------------- classification


def _make_state(state: str, path: Path, root: Path, descriptor: ModelDescriptor, synthetic: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if state == "empty":
        path.write_bytes(b"")
        return
    if state.startswith("foreign"):
        foreign_database(path, state.removeprefix("foreign-"))
        return
    made = current_database(root, "completions", "t", descriptor, [completion_record(1)])
    shutil.move(made, path)
    if state == "current":
        at_synthetic_head(path, synthetic)
    elif state == "ahead":
        stamp(path, UNKNOWN_REVISION)


@pytest.mark.parametrize(
    ("state", "expected", "revision"),
    [
        ("empty", SchemaState.EMPTY, None),
        ("current", SchemaState.CURRENT, SYNTHETIC_HEAD),
        ("behind", SchemaState.BEHIND, SHIPPED_HEAD),
        ("ahead", SchemaState.AHEAD, UNKNOWN_REVISION),
        ("foreign-optuna", SchemaState.FOREIGN, None),
        ("foreign-random", SchemaState.FOREIGN, None),
    ],
)
def test_classify_tells_the_five_states_apart(
    state: str, expected: SchemaState, revision: str | None, tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    path = tmp_path / "db" / "x.db"
    _make_state(state, path, tmp_path / "root", descriptor, synthetic)
    engine = create_engine(f"sqlite:///{path}")
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with engine.connect() as conn:
        status = classify(conn, path, revisions_of(synthetic))
    engine.dispose()
    assert (status.state, status.revision, status.head) == (expected, revision, SYNTHETIC_HEAD)
    if state == "foreign-optuna":
        assert status.tables == ("alembic_version", "studies", "trials")
    if state in ("current", "behind", "ahead"):
        assert statements == ["SELECT version_num FROM judgestore_alembic_version"]  # one cheap query


def test_a_current_or_empty_status_raises_nothing(tmp_path: Path, synthetic: Any) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"")
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        raise_for_status(classify(conn, path, revisions_of(synthetic)), path)
    engine.dispose()


# ---------------------------------------------------------------- opening refuses, untouched


def _placed(store_root: Path, descriptor: ModelDescriptor) -> Path:
    """An empty descriptor folder (metadata.json only) whose database the test then supplies."""
    location = Location.of("completions", "t", descriptor)
    write_metadata(location.folder(store_root), metadata_bytes("completions", "t", descriptor))
    return location.db_path(store_root)


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
@pytest.mark.parametrize(
    ("state", "error", "must_say"),
    [
        ("behind", SchemaBehindError, [SHIPPED_HEAD, SYNTHETIC_HEAD, "`judgestore db upgrade`"]),
        ("ahead", SchemaAheadError, [UNKNOWN_REVISION, SHIPPED_HEAD, "`pip install -U judgestore`", "not touched"]),
        ("foreign-optuna", ForeignDatabaseError, ["alembic_version", "studies", "judgestore_alembic_version"]),
        ("foreign-random", ForeignDatabaseError, ["notes", "tags", "refusing to touch it"]),
    ],
)
def test_opening_a_database_that_is_not_current_is_refused_untouched(
    state: str,
    error: type[Exception],
    must_say: list[str],
    readonly: bool,
    store_root: Path,
    descriptor: ModelDescriptor,
    synthetic: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db_path = _placed(store_root, descriptor)
    if state == "behind":
        db_path.unlink(missing_ok=True)
        current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
        pretend_shipped_scripts_are(synthetic, monkeypatch)
    else:
        _make_state(state, db_path, store_root.parent / "scratch", descriptor, synthetic)
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=readonly) as s, pytest.raises(error) as caught:
        s.database("completions", "t", descriptor)
    message = str(caught.value)
    assert str(db_path) in message
    for words in must_say:
        assert words in message
    assert file_digests(store_root) == before, "refusing a file must leave every byte (and the folder) as it was"


def test_foreign_database_in_rollback_mode_is_not_switched_to_wal(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    """Regression: the journal mode used to be set on connect, which rewrote a foreign file's header."""
    db_path = _placed(store_root, descriptor)
    foreign_database(db_path, "random")
    assert db_path.read_bytes()[18:20] == b"\x01\x01"  # rollback journal
    with Store(Settings(), root=store_root) as s, pytest.raises(ForeignDatabaseError):
        s.database("completions", "t", descriptor)
    assert db_path.read_bytes()[18:20] == b"\x01\x01"


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
@pytest.mark.parametrize(
    "content",
    [b"this is a CSV file,not a database\n" * 200, b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20],
    ids=["text", "binary"],
)
def test_a_file_that_is_not_sqlite_is_refused_untouched(
    content: bytes, readonly: bool, store_root: Path, descriptor: ModelDescriptor
) -> None:
    db_path = _placed(store_root, descriptor)
    db_path.write_bytes(content)
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=readonly) as s, pytest.raises(NotADatabaseError) as caught:
        s.database("completions", "t", descriptor)
    assert str(db_path) in str(caught.value) and "not an SQLite database" in str(caught.value)
    assert file_digests(store_root) == before


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
@pytest.mark.parametrize("keep", [50, 100, 4096, 0.5, -4096], ids=["50B", "header", "1page", "half", "last-page-cut"])
def test_a_truncated_database_is_refused_untouched(
    keep: float, readonly: bool, store_root: Path, descriptor: ModelDescriptor
) -> None:
    rows = [completion_record(i, completion="x" * 3000) for i in range(200)]
    db_path = current_database(store_root, "completions", "t", descriptor, rows)
    data = db_path.read_bytes()
    size = int(len(data) * keep) if isinstance(keep, float) else (keep if keep > 0 else len(data) + keep)
    db_path.write_bytes(data[:size])
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=readonly) as s, pytest.raises(CorruptDatabaseError) as caught:
        s.database("completions", "t", descriptor)
    assert str(db_path) in str(caught.value) and "damaged" in str(caught.value)
    assert file_digests(store_root) == before


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
def test_a_page_damaged_inside_the_file_raises_a_typed_error_when_read(
    readonly: bool, store_root: Path, descriptor: ModelDescriptor
) -> None:
    """The cheap check on open reads one page; damage elsewhere surfaces, typed, on first use."""
    rows = [completion_record(i, completion="x" * 3000) for i in range(50)]
    db_path = current_database(store_root, "completions", "t", descriptor, rows)
    with closing(sqlite3.connect(db_path)) as conn:
        (root_page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'completions'").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    data = bytearray(db_path.read_bytes())
    data[(root_page - 1) * page_size : root_page * page_size] = b"\xff" * page_size
    db_path.write_bytes(bytes(data))
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=readonly) as s:
        database = s.database("completions", "t", descriptor)
        with pytest.raises(CorruptDatabaseError, match="damaged"):
            list(database.query())
        with pytest.raises(CorruptDatabaseError):
            database.get_many([r.input_hash for r in rows])
        if not readonly:
            with pytest.raises(CorruptDatabaseError):
                database.put_many([completion_record(999)])
    assert {k: v for k, v in file_digests(store_root).items() if not k.endswith(".lock")} == {
        k: v for k, v in before.items() if not k.endswith(".lock")
    }


def test_an_empty_file_is_created_at_head_but_read_only_refuses_it(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    db_path = _placed(store_root, descriptor)
    db_path.write_bytes(b"")
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=True) as s, pytest.raises(DatabaseMissingError, match="no tables"):
        s.database("completions", "t", descriptor)
    assert file_digests(store_root) == before
    with Store(Settings(), root=store_root) as s:
        s.database("completions", "t", descriptor).put_many([completion_record(1)])
    assert version_of(db_path) == SHIPPED_HEAD
    assert db_path.read_bytes()[18:20] == b"\x02\x02"  # WAL, switched only once the file was known to be ours


# ---------------------------------------------------------------- upgrades


def test_upgrade_keeps_every_row_and_a_byte_exact_backup(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    original, rows = db_path.read_bytes(), rows_of(db_path)
    result = upgrade_database(db_path, Settings(), script=synthetic)
    assert (result.outcome, result.from_revision, result.to_revision) == (
        UpgradeOutcome.UPGRADED,
        SHIPPED_HEAD,
        SYNTHETIC_HEAD,
    )
    assert result.rows == {"completions": 6, "judgements": 3}
    assert result.backup is not None and result.backup.read_bytes() == original
    assert rows_of(db_path) == rows
    assert version_of(db_path) == SYNTHETIC_HEAD and "verdict" in judgement_columns(db_path)


def test_upgrade_without_keeping_the_backup_leaves_none(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    result = upgrade_database(db_path, Settings(), script=synthetic, keep_backup=False)
    assert result.outcome is UpgradeOutcome.UPGRADED and result.backup is None
    assert not [p for p in db_path.parent.iterdir() if ".bak-" in p.name]


_FAILING_REVISION = '''"""Synthetic failing revision: {how}.

What changes: a nullable column, then an injected failure on databases marked 'explode'.
Why: tests of the runner's restore. Data impact: none once restored. Expected cost: milliseconds.

Revision ID: 9001
Revises: {shipped}
"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{shipped}"
branch_labels = None
depends_on = None


def upgrade():
    bind = op.get_bind()
    marked = bind.execute(sa.text("SELECT count(*) FROM completions WHERE benchmark = 'explode'")).scalar()
    with op.batch_alter_table("judgements") as batch_op:
        batch_op.add_column(sa.Column("verdict", sa.String(), nullable=True))
    if not marked:
        return
{body}


def downgrade():
    raise NotImplementedError
'''

FAILURES = {
    "raises": (
        "the migration raises after changing the schema",
        '    raise RuntimeError("injected failure")',
        "RuntimeError: injected failure",
    ),
    "commits-then-raises": (
        "the migration commits part of its work, writes more, then raises (rollback cannot undo it)",
        '    op.execute("COMMIT")\n'
        "    op.execute(\"UPDATE completions SET completion = 'clobbered'\")\n"
        '    op.execute("DELETE FROM judgements")\n'
        '    raise RuntimeError("injected failure after a partial commit")',
        "after a partial commit",
    ),
    "loses-rows": (
        "the migration silently drops rows (the row-count check must catch it)",
        "    op.execute(\"DELETE FROM completions WHERE instruction_id = '1'\")",
        "row counts changed",
    ),
}


def failing_script(tmp_path: Path, kind: str) -> Any:
    folder = tmp_path / f"failing-{kind}"
    folder.mkdir()
    how, body, _ = FAILURES[kind]
    (folder / "9001_fails.py").write_text(_FAILING_REVISION.format(how=how, body=body, shipped=SHIPPED_HEAD))
    return read_script_directory(folder)


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_failed_upgrade_restores_the_file_byte_for_byte_and_the_others_go_on(
    kind: str, tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = failing_script(tmp_path, kind)
    paths = []
    for name in ("good-1", "bad", "good-2"):
        rows = sample_rows(name)
        if name == "bad":
            rows[0] = completion_record(0, benchmark="explode")
        paths.append(current_database(tmp_path / name, "judgements", "t", descriptor, rows))
    bad = paths[1]
    original, rows, files = bad.read_bytes(), rows_of(bad), sorted(p.name for p in bad.parent.iterdir())
    restored: list[Path] = []  # copies back onto the live file: only a partial commit should need one
    real_copy = shutil.copy2
    monkeypatch.setattr(
        store.schema.shutil, "copy2", lambda src, dst: restored.append(Path(dst)) or real_copy(src, dst)
    )
    seen: list[UpgradeResult] = []
    results = list(upgrade_databases(paths, Settings(), script=script, on_result=seen.append))
    assert results == seen
    assert [r.outcome for r in results] == [UpgradeOutcome.UPGRADED, UpgradeOutcome.FAILED, UpgradeOutcome.UPGRADED]
    failed = results[1]
    assert failed.path == bad and failed.from_revision == SHIPPED_HEAD and failed.to_revision is None
    assert FAILURES[kind][2] in str(failed.error)
    assert bad.read_bytes() == original, "the database must be restored byte for byte"
    assert rows_of(bad) == rows and version_of(bad) == SHIPPED_HEAD
    left = sorted(p.name for p in bad.parent.iterdir() if ".bak-" not in p.name)
    assert left == files, "the restore must not leave new files beside the database"
    assert failed.backup is not None and failed.backup.read_bytes() == original
    assert (bad in restored) == (kind == "commits-then-raises"), "a rolled-back migration needs no copy"
    for good in (paths[0], paths[2]):
        assert version_of(good) == SYNTHETIC_HEAD


def test_a_failed_automatic_upgrade_on_open_restores_the_file(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = failing_script(tmp_path, "commits-then-raises")
    rows = [completion_record(0, benchmark="explode"), *sample_rows("x")[1:]]
    db_path = current_database(store_root, "judgements", "t", descriptor, rows)
    original = db_path.read_bytes()
    pretend_shipped_scripts_are(script, monkeypatch)
    with Store(Settings(auto_upgrade=True), root=store_root) as s, pytest.raises(UpgradeFailedError) as caught:
        s.database("judgements", "t", descriptor)
    assert str(db_path) in str(caught.value) and "restored" in str(caught.value)
    assert db_path.read_bytes() == original


def test_auto_upgrade_opens_a_database_that_is_behind(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = sample_rows("auto")
    db_path = current_database(store_root, "judgements", "t", descriptor, rows)
    before = rows_of(db_path)
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with Store(Settings(), root=store_root) as s, pytest.raises(SchemaBehindError):
        s.database("judgements", "t", descriptor)
    with Store(Settings(auto_upgrade=True), root=store_root) as s:
        database = s.database("judgements", "t", descriptor)
        assert database.count() == 3
        assert database.get_many([r.input_hash for r in rows if r.completion.startswith("auto verdict")])
    assert version_of(db_path) == SYNTHETIC_HEAD and rows_of(db_path) == before
    assert db_path.read_bytes()[18:20] == b"\x02\x02"


def test_upgrading_200_databases_at_mixed_revisions(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    template = current_database(tmp_path / "template", "judgements", "t", descriptor, sample_rows("template", 20))
    template_synthetic = tmp_path / "template-synthetic.db"
    shutil.copyfile(template, template_synthetic)
    at_synthetic_head(template_synthetic, synthetic)
    folder = tmp_path / "many"
    folder.mkdir()
    paths, kinds = [], []
    for i in range(200):
        path = folder / f"db-{i:03d}.db"
        kind = (
            "foreign"
            if i == 17
            else "ahead"
            if i == 42
            else "not-sqlite"
            if i == 99
            else SYNTHETIC_HEAD
            if i % 4 == 0
            else SHIPPED_HEAD
        )
        if kind == "foreign":
            foreign_database(path)
        elif kind == "not-sqlite":
            path.write_text("id,answer\n1,yes\n")
        else:
            shutil.copyfile(template_synthetic if kind == SYNTHETIC_HEAD else template, path)
            with closing(sqlite3.connect(path)) as conn, conn:  # distinct content in every file
                conn.execute("UPDATE completions SET completion = completion || ?", (f" (file {i})",))
                conn.execute("DELETE FROM judgements WHERE rowid % 5 = ?", (i % 5,))
            if kind == "ahead":
                stamp(path, UNKNOWN_REVISION)
        paths.append(path)
        kinds.append(kind)
    rows = {p: rows_of(p) for p, k in zip(paths, kinds, strict=True) if k in (SHIPPED_HEAD, SYNTHETIC_HEAD)}
    untouched = {p: p.read_bytes() for p, k in zip(paths, kinds, strict=True) if k != SHIPPED_HEAD}

    results = list(upgrade_databases(paths, Settings(), script=synthetic, keep_backup=False))

    assert [r.path for r in results] == paths  # one report per file, in order
    expected = {
        SHIPPED_HEAD: UpgradeOutcome.UPGRADED,
        SYNTHETIC_HEAD: UpgradeOutcome.UP_TO_DATE,
        "foreign": UpgradeOutcome.REFUSED,
        "ahead": UpgradeOutcome.REFUSED,
        "not-sqlite": UpgradeOutcome.REFUSED,
    }
    assert [r.outcome for r in results] == [expected[k] for k in kinds]
    by_path = {r.path: r for r in results}
    assert "not a judgestore database" in str(by_path[paths[17]].error)
    assert UNKNOWN_REVISION in str(by_path[paths[42]].error)
    assert "not an SQLite database" in str(by_path[paths[99]].error)
    assert sum(r.outcome is UpgradeOutcome.UPGRADED for r in results) == kinds.count(SHIPPED_HEAD) == 147
    for path, before in rows.items():
        assert rows_of(path) == before, f"{path.name}: rows changed"
        assert version_of(path) == SYNTHETIC_HEAD and "verdict" in judgement_columns(path)
    for path, data in untouched.items():
        assert path.read_bytes() == data, f"{path.name} was written although it needed no upgrade"

    snapshot = file_digests(folder)
    again = list(upgrade_databases(paths, Settings(), script=synthetic))
    assert not [r for r in again if r.outcome is UpgradeOutcome.UPGRADED]
    assert file_digests(folder) == snapshot, "a second run must do nothing"


# ---------------------------------------------------------------- the script directory is read once


@pytest.fixture
def traced_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every statement SQLite runs, one list per engine the store creates (PRAGMAs on connect included)."""
    per_engine: list[list[str]] = []
    real: Callable[..., Engine] = store.engine.create_sqlite_engine

    def traced(*args: Any, **kwargs: Any) -> Engine:
        engine = real(*args, **kwargs)
        log: list[str] = []
        per_engine.append(log)
        event.listen(engine, "connect", lambda dbapi, _rec: dbapi.set_trace_callback(log.append), insert=True)
        return engine

    monkeypatch.setattr(store.engine, "create_sqlite_engine", traced)
    yield per_engine


@pytest.fixture(scope="module")
def two_hundred_current(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ModelDescriptor]]:
    """A store root with 200 current descriptor databases (copies of one made by the store)."""
    root = tmp_path_factory.mktemp("two-hundred") / "store"
    template = current_database(root.parent / "template", "completions", "t", ModelDescriptor(provider="p", model="m"))
    descriptors = [ModelDescriptor(provider="vllm", model=f"org/model-{i}") for i in range(200)]
    for d in descriptors:
        location = Location.of("completions", "t", d)
        write_metadata(location.folder(root), metadata_bytes("completions", "t", d))
        shutil.copyfile(template, location.db_path(root))
    return root, descriptors


@pytest.mark.parametrize("readonly", [False, True], ids=["read-write", "read-only"])
def test_opening_200_current_databases_reads_the_scripts_once_and_runs_one_select_each(
    readonly: bool,
    two_hundred_current: tuple[Path, list[ModelDescriptor]],
    monkeypatch: pytest.MonkeyPatch,
    traced_engines: list[list[str]],
) -> None:
    root, descriptors = two_hundred_current
    store.schema.script_directory.cache_clear()
    store.schema.revisions.cache_clear()
    reads: list[object] = []
    real_read = store.schema.read_script_directory
    monkeypatch.setattr(store.schema, "read_script_directory", lambda *a: reads.append(a) or real_read(*a))
    with Store(Settings(), root=root, readonly=readonly) as s:
        for d in descriptors:
            s.database("completions", "t", d)
    assert len(reads) == 1, "the Alembic script directory must be read once per process, not per file"
    assert len(traced_engines) == 200
    for log in traced_engines:  # PRAGMAs aside (connection setup, journal mode), one SELECT per open
        assert [q for q in log if not q.startswith("PRAGMA")] == [
            "BEGIN",
            "SELECT version_num FROM judgestore_alembic_version",
            "ROLLBACK",
        ]
