"""Schema revisions on open: classify, refuse untouched, read the scripts once; the state of a database in a store."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, event

import store.backends.sqlite.connections
import store.schema
from store.backends.sqlite.connections import classify, create_sqlite_engine
from store.backends.sqlite.info import database_info
from store.descriptor import ModelDescriptor
from store.errors import (
    CorruptDatabaseError,
    DatabaseMissingError,
    ForeignDatabaseError,
    NotADatabaseError,
    SchemaAheadError,
    SchemaBehindError,
    StoreFullError,
)
from store.layout import Location, metadata_bytes, read_location_metadata, select, write_metadata
from store.schema import DatabaseState, raise_for_status, revisions_of
from store.settings import Settings
from store.store import Store
from tests.factories import (
    JUDGE,
    LLAMA,
    QWEN,
    SHIPPED_HEAD,
    SYNTHETIC_HEAD,
    completion_record,
    current_database,
    file_digests,
    foreign_database,
    judgement_record,
    stamp,
)
from tests.store.conftest import location_of
from tests.store.schema_helpers import UNKNOWN_REVISION, at_synthetic_head, pretend_shipped_scripts_are, version_of

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
    elif state == "revision-emptied":
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM judgestore_alembic_version")
    elif state == "revision-nulled":
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE judgestore_alembic_version SET version_num = ''")
    elif state == "version-table-dropped":
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DROP TABLE judgestore_alembic_version")


@pytest.mark.parametrize(
    ("state", "expected", "revision"),
    [
        ("empty", DatabaseState.EMPTY, None),
        ("current", DatabaseState.CURRENT, SYNTHETIC_HEAD),
        ("behind", DatabaseState.BEHIND, SHIPPED_HEAD),
        ("ahead", DatabaseState.AHEAD, UNKNOWN_REVISION),
        ("foreign-optuna", DatabaseState.FOREIGN, None),
        ("foreign-random", DatabaseState.FOREIGN, None),
    ],
)
def test_classify_tells_the_five_states_apart(
    state: str,
    expected: DatabaseState,
    revision: str | None,
    tmp_path: Path,
    descriptor: ModelDescriptor,
    synthetic: Any,
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


def test_a_database_created_while_it_is_classified_is_current_not_foreign(
    tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two jobs open one new database: the second asks for the version table (none yet), the first creates the
    # database and commits, then the second lists the tables. It must not call that database foreign.
    path = tmp_path / "x.db"
    sqlite3.connect(path).close()  # an empty file, as the first open leaves it
    real_inspect = store.backends.sqlite.connections.inspect

    def created_meanwhile(conn: Any) -> Any:
        monkeypatch.setattr(store.backends.sqlite.connections, "inspect", real_inspect)
        creator = create_sqlite_engine(path, Settings())
        with creator.connect().execution_options(write=True) as writer, writer.begin():
            store.schema.create_at_head(writer)
        creator.dispose()
        return real_inspect(conn)

    monkeypatch.setattr(store.backends.sqlite.connections, "inspect", created_meanwhile)
    engine = create_sqlite_engine(path, Settings())
    with engine.connect() as conn:
        status = classify(conn, path)
    engine.dispose()
    assert (status.state, status.revision) == (DatabaseState.CURRENT, SHIPPED_HEAD)


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
        ("ahead", SchemaAheadError, [UNKNOWN_REVISION, SHIPPED_HEAD, "`git pull && pip install -e .`", "not touched"]),
        # it may come from a newer judgestore or from one with migrations of its own (was: "a newer judgestore")
        ("ahead", SchemaAheadError, ["a newer judgestore wrote the file, or one with migrations of its own"]),
        # was: "it has tables ... judgestore_alembic_version ... and no judgestore_alembic_version table"
        ("revision-emptied", ForeignDatabaseError, ["does not hold exactly one revision", "Restore it from a backup"]),
        # an empty revision read as one from a newer judgestore: "Upgrade the library" (was)
        ("revision-nulled", ForeignDatabaseError, ["does not hold exactly one revision", "Restore it from a backup"]),
        # was: "not a judgestore database ... Old judgestore-era caches are imported with `judgestore import`"
        ("version-table-dropped", ForeignDatabaseError, ["judgestore's tables", "dropped by hand", "from a backup"]),
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


def test_a_new_database_is_created_on_the_one_connection_its_open_keeps(
    store_root: Path, traced_connections: list[list[str]]
) -> None:
    descriptors = [ModelDescriptor(provider="vllm", model=f"org/new-{i}") for i in range(3)]
    with Store(Settings(), root=store_root) as s:
        for d in descriptors:
            s.database("completions", "t", d).put_many([completion_record(1)])
        assert all(database._engine is None for database in s.storage._open.values())  # no engine was built
    # One connection per new database (an engine's would be two more: its classification and a reopen)...
    assert len(traced_connections) == 3
    for log, d in zip(traced_connections, descriptors, strict=True):
        statements = [q.split("(")[0].split()[:3] for q in log if not q.startswith("PRAGMA")]
        # ...on which the schema is created in one transaction, under the file's lock, before the row is written.
        begin, commit = statements.index(["BEGIN", "IMMEDIATE"]), statements.index(["COMMIT"])
        assert statements[:begin] == [["SELECT", "1", "FROM"]]  # no tables (the version SELECT failed to prepare)
        created = {" ".join(q[:2]) for q in statements[begin + 2 : commit]}
        assert created == {"CREATE TABLE", "CREATE INDEX", "INSERT INTO"}
        db_path = Location.of("completions", "t", d).db_path(store_root)
        assert version_of(db_path) == SHIPPED_HEAD
        assert db_path.read_bytes()[18:20] == b"\x02\x02"


def test_a_new_database_the_disk_cannot_hold_is_a_typed_error_and_stays_empty(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = _placed(store_root, descriptor)
    real = store.backends.sqlite.connections.sqlite_connector

    def full_disk(*args: Any, **kwargs: Any) -> tuple[Callable[[], sqlite3.Connection], str | None]:
        connect, journal = real(*args, **kwargs)

        def connect_full() -> sqlite3.Connection:
            conn = connect()
            conn.execute("PRAGMA max_page_count = 4")  # the schema needs more pages: "database or disk is full"
            return conn

        return connect_full, journal

    monkeypatch.setattr(store.backends.sqlite.connections, "sqlite_connector", full_disk)
    with Store(Settings(), root=store_root) as s, pytest.raises(StoreFullError):
        s.database("completions", "t", descriptor)
    assert db_path.stat().st_size == 0  # the creation was rolled back whole
    monkeypatch.setattr(store.backends.sqlite.connections, "sqlite_connector", real)
    with Store(Settings(), root=store_root) as s:  # and the next open creates it
        s.database("completions", "t", descriptor).put_many([completion_record(1)])
    assert version_of(db_path) == SHIPPED_HEAD


def test_a_database_another_process_creates_while_this_one_waits_for_its_lock_is_opened_as_it_is(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = _placed(store_root, descriptor)
    real_lock = store.backends.sqlite.connections.FileLock

    class CreatedWhileWaiting(real_lock):  # type: ignore[misc,valid-type]
        def __enter__(self) -> Any:  # the other process wins the lock first, creates the database, writes a row
            monkeypatch.setattr(store.backends.sqlite.connections, "FileLock", real_lock)
            with Store(Settings(), root=store_root) as other:
                other.database("completions", "t", descriptor).put_many([completion_record(1)])
            return super().__enter__()

    monkeypatch.setattr(store.backends.sqlite.connections, "FileLock", CreatedWhileWaiting)
    with Store(Settings(), root=store_root) as s:
        database = s.database("completions", "t", descriptor)  # found empty, then not under the lock
        assert store.backends.sqlite.connections.FileLock is real_lock  # the race did happen
        database.put_many([completion_record(2)])
        written = [completion_record(i) for i in (1, 2)]
        assert database.count() == 2
        assert database.get_many([r.input_hash for r in written]).keys() == {r.input_hash for r in written}
    assert version_of(db_path) == SHIPPED_HEAD


# ---------------------------------------------------------------- the script directory is read once


@pytest.fixture
def traced_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every statement SQLite runs after connecting, one list per connection the store opens."""
    per_connection: list[list[str]] = []
    real = store.backends.sqlite.connections.sqlite_connector

    def traced(*args: Any, **kwargs: Any) -> tuple[Callable[[], sqlite3.Connection], str | None]:
        connect, journal = real(*args, **kwargs)

        def connect_traced() -> sqlite3.Connection:
            conn = connect()
            log: list[str] = []
            per_connection.append(log)
            conn.set_trace_callback(log.append)
            return conn

        return connect_traced, journal

    monkeypatch.setattr(
        store.backends.sqlite.connections, "sqlite_connector", traced
    )  # what Store opens databases with
    yield per_connection


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
    traced_connections: list[list[str]],
) -> None:
    root, descriptors = two_hundred_current
    store.schema.script_directory.cache_clear()
    store.schema.revisions.cache_clear()
    reads: list[object] = []
    alembic_reads: list[object] = []
    real_dir, real_read = store.schema.migrations_dir, store.schema.read_script_directory
    monkeypatch.setattr(store.schema, "migrations_dir", lambda: reads.append(1) or real_dir())
    monkeypatch.setattr(store.schema, "read_script_directory", lambda *a: alembic_reads.append(a) or real_read(*a))
    with Store(Settings(), root=root, readonly=readonly) as s:
        for d in descriptors:
            s.database("completions", "t", d)
        assert all(database._engine is None for database in s.storage._open.values())  # no engine was built
    assert len(reads) == 1, "the revision scripts must be read once per process, not per file"
    assert alembic_reads == [], "opening a current database needs no Alembic"
    assert len(traced_connections) == 200
    for log in traced_connections:  # PRAGMAs aside (journal mode), one SELECT per open
        assert [q for q in log if not q.startswith("PRAGMA")] == ["SELECT version_num FROM judgestore_alembic_version"]


# ---------------------------------------------------------------- the state of a database in a store


def test_inspect_counts_rows_and_reads_state_without_writing(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    infos = {info.location.model: info for info in (database_info(filled, loc, settings) for loc in select(filled))}
    assert {m: (i.state, i.rows) for m, i in infos.items()} == {
        "Qwen/Qwen3-8B": (DatabaseState.CURRENT, 3),
        "meta-llama/Llama-3.1-8B": (DatabaseState.CURRENT, 2),
        "judge-1": (DatabaseState.CURRENT, 5),
    }
    info = infos["judge-1"]
    assert info.ok and info.revision == info.head and info.error is None
    assert info.size_bytes == Path(info.where).stat().st_size > 0
    assert info.as_dict()["descriptor"] == JUDGE.hash16()
    assert file_digests(filled) == before


def test_inspect_names_each_kind_of_bad_file(filled: Path, settings: Settings) -> None:
    qwen, llama, judge = (location_of(filled, d) for d in (QWEN, LLAMA, JUDGE))
    qwen.db_path(filled).write_bytes(b"this is not an SQLite file at all" * 100)
    with sqlite3.connect(llama.db_path(filled)) as conn:
        conn.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
    conn.close()
    meta = judge.folder(filled) / "metadata.json"
    doc = orjson.loads(meta.read_bytes())
    doc["descriptor"]["sampling"]["temperature"] = 0.7
    meta.write_bytes(orjson.dumps(doc))
    before = file_digests(filled)

    states = {loc.model: database_info(filled, loc, settings) for loc in select(filled)}
    assert states["Qwen/Qwen3-8B"].state is DatabaseState.NOT_A_DATABASE
    assert str(qwen.db_path(filled)) in str(states["Qwen/Qwen3-8B"].error)
    assert states["meta-llama/Llama-3.1-8B"].state is DatabaseState.AHEAD
    assert "Upgrade the library" in str(states["meta-llama/Llama-3.1-8B"].error)
    assert states["judge-1"].state is DatabaseState.METADATA_MISMATCH
    assert states["judge-1"].rows == 5  # the file itself is fine
    assert not any(info.ok for info in states.values())
    assert file_digests(filled) == before


def test_inspect_reports_a_foreign_and_a_truncated_database(filled: Path, settings: Settings) -> None:
    qwen, judge = location_of(filled, QWEN), location_of(filled, JUDGE)
    qwen.db_path(filled).unlink()
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("CREATE TABLE studies (id INTEGER)")
    conn.close()
    with Store(settings, root=filled) as store:
        store.database("judgements", "arena-hard", JUDGE).put_many(
            [judgement_record(100 + i, completion="x" * 4000) for i in range(200)]
        )
    data = judge.db_path(filled).read_bytes()
    judge.db_path(filled).write_bytes(data[: len(data) // 2])

    assert database_info(filled, qwen, settings).state is DatabaseState.FOREIGN
    truncated = database_info(filled, judge, settings)
    assert truncated.state is DatabaseState.CORRUPT and "damaged" in str(truncated.error)


def test_a_moved_folder_does_not_match_its_metadata(filled: Path, settings: Settings) -> None:
    qwen = location_of(filled, QWEN)
    moved = Location("completions", "other-task", qwen.provider, qwen.model, qwen.descriptor_hash16)
    moved.folder(filled).parent.mkdir(parents=True)
    qwen.folder(filled).rename(moved.folder(filled))
    with pytest.raises(Exception, match="the folder was moved"):
        read_location_metadata(filled, moved)
    assert database_info(filled, moved, settings).state is DatabaseState.METADATA_MISMATCH
