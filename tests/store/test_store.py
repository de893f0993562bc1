"""The Store: opening descriptor databases, the bounded engine cache, read-only use, locks."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from store.backend import Database
from store.backends.sqlite import database as database_module
from store.descriptor import ModelDescriptor
from store.errors import (
    CorruptDatabaseError,
    DatabaseBusyError,
    DatabaseFileError,
    DatabaseMissingError,
    EmptyFilterError,
    InvalidInputError,
    JudgestoreError,
    SchemaAheadError,
    SchemaBehindError,
    SchemaError,
    StoreMissingError,
)
from store.layout import METADATA_FILE, Location, Selector, read_metadata
from store.repository import Repository
from store.roles import Role
from store.rows import DeletePlan, row_columns
from store.schema import read_script_directory
from store.settings import Settings
from store.store import Store
from store.tables.deferred import DeferredColumns
from store.tables.filters import RowFilter
from store.tables.records import Record
from tests.factories import (
    QWEN,
    SYNTHETIC_REVISIONS,
    completion_record,
    current_database,
    file_digests,
    judgement_record,
)
from tests.interrupts import ctrl_c_on_call
from tests.store.conftest import delete_rows, plan_delete, query_rows
from tests.store.schema_helpers import pretend_shipped_scripts_are


def open_db_files() -> set[str]:
    """Database files this process holds open (what the engine cache costs in file handles)."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".db"):
            names.add(target)
    return names


def journal_mode(db_path: Path) -> str:
    with closing(sqlite3.connect(db_path)) as conn:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]


def test_database_creates_folder_metadata_and_schema(
    store: Store, store_root: Path, descriptor: ModelDescriptor
) -> None:
    database = store.database("completions", "mt-bench", descriptor, assumptions=("chat template guessed",))
    location = Location.of("completions", "mt-bench", descriptor)
    assert database.location == location and database.path == location.db_path(store_root)
    metadata = read_metadata(database.path.parent)
    assert (metadata.task, metadata.descriptor, metadata.assumptions) == (
        "mt-bench",
        descriptor,
        ("chat template guessed",),
    )
    assert database.metadata() == metadata
    assert database.count() == 0
    assert journal_mode(database.path) == "wal"
    assert store.locations() == [location]


def test_the_same_database_is_returned_while_cached(store: Store, descriptor: ModelDescriptor) -> None:
    assert store.database("completions", "t", descriptor) is store.database("completions", "t", descriptor)
    assert store.open(Location.of("completions", "t", descriptor)) is store.database("completions", "t", descriptor)


@pytest.mark.parametrize("given", ["completions/t", None, ("completions", "t")])
def test_opening_what_is_no_location_is_a_typed_error_naming_what_to_pass(
    store: Store, descriptor: ModelDescriptor, given: object
) -> None:
    """It was a bare AttributeError ('str' object has no attribute 'segments') from deep inside the storage."""
    store.database("completions", "t", descriptor).put_many([completion_record(1)])
    for method in (store.open, store.open_existing, store.stored_metadata):
        with pytest.raises(InvalidInputError, match=rf"Store\.{method.__name__} takes a Location .*store\.find\("):
            method(given)  # type: ignore[arg-type]
    assert store.database("completions", "t", descriptor).count() == 1


def test_rows_persist_across_stores(store_root: Path, descriptor: ModelDescriptor) -> None:
    with Store(root=store_root) as s:
        s.database("judgements", "arena", descriptor).put_many([judgement_record(i) for i in range(5)])
    with Store(root=store_root) as s:
        assert s.database("judgements", "arena", descriptor).count() == 5


def test_completions_and_judgements_of_one_model_never_collide(store: Store, descriptor: ModelDescriptor) -> None:
    battle = store.database("completions", "arena", descriptor)
    judge = store.database("judgements", "arena", descriptor)
    assert battle.path != judge.path
    battle.put_many([completion_record(1)])
    assert judge.count() == 0


def test_engine_cache_is_bounded(store_root: Path) -> None:
    descriptors = [ModelDescriptor(provider="vllm", model=f"m{i}") for i in range(5)]
    before = open_db_files()
    with Store(Settings(max_open_databases=2), root=store_root) as s:
        databases = []
        for d in descriptors:
            databases.append(s.database("completions", "t", d))
            databases[-1].put_many([completion_record(1)])
        assert open_db_files() - before == {str(databases[3].path), str(databases[4].path)}
        s.database("completions", "t", descriptors[3])  # touch: 3 becomes the most recent
        s.database("completions", "t", descriptors[0]).count()  # reopening 0 evicts 4, the least recent
        assert open_db_files() - before == {str(databases[3].path), str(databases[0].path)}
        assert len(s.storage._open) == 2  # engines kept
    assert open_db_files() == before, "closing the store releases every file"


def test_evicted_databases_still_work(store_root: Path) -> None:
    with Store(Settings(max_open_databases=1), root=store_root) as s:
        first = s.database("completions", "t", ModelDescriptor(provider="p", model="a"))
        s.database("completions", "t", ModelDescriptor(provider="p", model="b"))
        first.put_many([completion_record(1)])
        assert first.count() == 1


# ---------------------------------------------------------------- read-only


def test_read_only_queries_write_nothing(store_root: Path, descriptor: ModelDescriptor) -> None:
    rows = [completion_record(i) for i in range(30)]
    db_path = current_database(store_root, "completions", "t", descriptor, rows)
    assert db_path.read_bytes()[18:20] == b"\x02\x02"  # a WAL database
    before = file_digests(store_root)
    with Store(root=store_root, readonly=True) as s:
        database = s.database("completions", "t", descriptor)
        assert database.count() == 30
        assert len(database.get_many(r.input_hash for r in rows)) == 30
        assert len(list(database.query(RowFilter(model="model-a")))) == 30
        assert not Path(f"{db_path}-wal").exists() and not Path(f"{db_path}-shm").exists()
    assert file_digests(store_root) == before


def test_read_only_store_sees_a_live_writers_commits_without_creating_files(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    current_database(store_root, "completions", "t", descriptor, [completion_record(0)])
    with Store(root=store_root) as writer, Store(root=store_root, readonly=True) as reader:
        written = writer.database("completions", "t", descriptor)
        read = reader.database("completions", "t", descriptor)
        assert read.count() == 1
        files = sorted(p.name for p in written.path.parent.iterdir())
        written.put_many([completion_record(i) for i in range(1, 20)])
        assert read.count() == 20
        assert sorted(p.name for p in written.path.parent.iterdir()) == files


def test_read_only_store_sees_commits_made_after_it_opened(store_root: Path, descriptor: ModelDescriptor) -> None:
    """Regression: an immutable connection kept in a pool saw stale rows, then reported corruption."""
    current_database(store_root, "completions", "t", descriptor, [completion_record(0, completion="x" * 2000)])
    with Store(root=store_root, readonly=True) as reader:
        read = reader.database("completions", "t", descriptor)
        assert read.count() == 1
        with Store(root=store_root) as writer:
            written = writer.database("completions", "t", descriptor)
            written.put_many([completion_record(i, completion="y" * 2000) for i in range(1, 500)])
            written.delete(RowFilter(instruction_id="0"))
        assert read.count() == 499
        assert len(list(read.query())) == 499


def test_read_only_open_of_a_missing_database_creates_nothing(store_root: Path, descriptor: ModelDescriptor) -> None:
    with Store(root=store_root, readonly=True) as s:
        with pytest.raises(DatabaseMissingError, match="read-only") as caught:
            s.database("completions", "t", descriptor)
        assert str(Location.of("completions", "t", descriptor).db_path(store_root)) in str(caught.value)
        assert s.find("completions", "t", descriptor) is None
    assert not store_root.exists()


def test_read_only_open_of_a_folder_without_database_creates_nothing(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor)
    db_path.unlink()
    before = file_digests(store_root)
    with Store(root=store_root, readonly=True) as s, pytest.raises(DatabaseMissingError):
        s.database("completions", "t", descriptor)
    assert file_digests(store_root) == before


def test_read_only_store_cannot_write(store_root: Path, descriptor: ModelDescriptor) -> None:
    current_database(store_root, "completions", "t", descriptor, [completion_record(0)])
    before = file_digests(store_root)
    with Store(root=store_root, readonly=True) as s:
        database = s.database("completions", "t", descriptor)
        with pytest.raises(DatabaseFileError, match="read-only"):
            database.put_many([completion_record(1)])
        with pytest.raises(DatabaseFileError, match="read-only"):
            database.delete(RowFilter(run_id="run-1"))
    assert file_digests(store_root) == before


def test_find_never_creates(store: Store, store_root: Path, descriptor: ModelDescriptor) -> None:
    assert store.find("completions", "t", descriptor) is None
    assert not store_root.exists()
    store.database("completions", "t", descriptor)
    assert store.find("completions", "t", descriptor) is not None


def test_metadata_of_an_existing_folder_is_not_rewritten(store_root: Path, descriptor: ModelDescriptor) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor)
    metadata = db_path.parent / METADATA_FILE
    stat = metadata.stat()
    with Store(root=store_root) as s:
        s.database("completions", "t", descriptor, assumptions=("something new",))
    assert metadata.stat().st_mtime_ns == stat.st_mtime_ns and metadata.stat().st_ino == stat.st_ino


# ---------------------------------------------------------------- locks


def test_a_lock_held_too_long_gives_a_typed_error_naming_the_file(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    current_database(store_root, "completions", "t", descriptor)
    impatient = Settings(busy_timeout_ms=50, lock_retries=1)
    with Store(root=store_root) as holder, Store(impatient, root=store_root) as waiter:
        held = holder.database("completions", "t", descriptor)
        waiting = waiter.database("completions", "t", descriptor)
        with held.transaction() as repo:
            repo.put_many([completion_record(1)])
            with pytest.raises(DatabaseBusyError) as caught:
                waiting.put_many([completion_record(2)])
            assert str(waiting.path) in str(caught.value) and "JUDGESTORE_BUSY_TIMEOUT_MS" in str(caught.value)
            assert "still locked after 2 tries of 50 ms" in str(caught.value)
            once = Settings(busy_timeout_ms=50, lock_retries=0)
            with Store(once, root=store_root) as single, pytest.raises(DatabaseBusyError, match="after 1 try of 50"):
                single.database("completions", "t", descriptor).put_many([completion_record(2)])  # was: 1 tries
            assert waiting.count() == 0  # readers are not blocked by a writer (WAL)
        assert waiting.put_many([completion_record(2)]) == 1  # once the lock is free, the write goes through
    assert isinstance(caught.value, JudgestoreError)


def test_a_write_waits_for_a_short_lock_instead_of_failing(store_root: Path, descriptor: ModelDescriptor) -> None:
    import threading

    current_database(store_root, "completions", "t", descriptor)
    with (
        Store(root=store_root) as holder,
        Store(Settings(busy_timeout_ms=10, lock_retries=8), root=store_root) as waiter,
    ):
        held = holder.database("completions", "t", descriptor)
        waiting = waiter.database("completions", "t", descriptor)
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with held.transaction() as repo:
                repo.put_many([completion_record(1)])
                holding.set()
                release.wait(5)

        thread = threading.Thread(target=hold)
        thread.start()
        assert holding.wait(5)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        assert waiting.put_many([completion_record(2)]) == 1  # retried with backoff past the busy timeout
        assert time.monotonic() - started >= 0.25, "the write cannot have gone through while the lock was held"
        thread.join()
        assert waiting.count() == 2


# ---------------------------------------------------------------- read-only reads racing a writer


def _change_file_under_the_read(db_path: Path) -> None:
    """What a writer's checkpoint does to the main file while an immutable reader reads it."""
    stat = db_path.stat()
    os.utime(db_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_a_read_only_read_the_file_changed_under_is_run_again(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(i) for i in range(3)])
    calls: list[int] = []
    real = Repository.count

    def racing(self: Repository, flt: RowFilter | None = None) -> int:
        calls.append(1)
        if len(calls) == 1:
            _change_file_under_the_read(db_path)
            return -1  # what a torn read might return
        return real(self, flt)

    with Store(root=store_root, readonly=True) as s:
        database = s.database("completions", "t", descriptor)
        monkeypatch.setattr(Repository, "count", racing)
        assert database.count() == 3
    assert len(calls) == 2


def test_a_read_only_read_that_fails_as_damaged_while_the_file_changes_is_run_again(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [completion_record(i) for i in range(3)]
    db_path = current_database(store_root, "completions", "t", descriptor, rows)
    calls: list[int] = []
    real = database_module.sqlite_get_many  # what Database.get_many reads with on SQLite

    def racing(
        conn: sqlite3.Connection, role: Role, hashes: Sequence[str], deferred: DeferredColumns | None = None
    ) -> dict[str, Record]:
        calls.append(1)
        if len(calls) == 1:
            _change_file_under_the_read(db_path)
            raise CorruptDatabaseError(db_path, "is damaged")  # pages read half-way through a checkpoint
        return real(conn, role, hashes, deferred)

    with Store(root=store_root, readonly=True) as s:
        database = s.database("completions", "t", descriptor)
        monkeypatch.setattr(database_module, "sqlite_get_many", racing)
        assert set(database.get_many(r.input_hash for r in rows)) == {r.input_hash for r in rows}
    assert len(calls) == 2


def test_a_read_only_reader_gives_up_with_a_typed_error_if_the_file_never_settles(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(1)])

    def always_racing(self: Repository, flt: RowFilter | None = None) -> int:
        _change_file_under_the_read(db_path)
        return 0

    with Store(root=store_root, readonly=True) as s:
        database = s.database("completions", "t", descriptor)
        monkeypatch.setattr(Repository, "count", always_racing)
        with pytest.raises(DatabaseBusyError, match="changed under"):
            database.count()


# ---------------------------------------------------------------- rows across databases


def test_row_columns_put_the_location_first() -> None:
    assert row_columns(("completions",))[:6] == (
        "role",
        "task",
        "provider",
        "descriptor_model",
        "descriptor",
        "input_hash",
    )
    assert "judge" not in row_columns(("completions",))
    both = row_columns()
    assert {"model", "model_a", "model_b", "judge", "orientation"} <= set(both)
    assert len(both) == len(set(both))


def test_query_streams_matching_rows_with_their_location(filled: Path, settings: Settings) -> None:
    rows = query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))
    assert not isinstance(rows, list)  # a generator: rows are streamed
    found = list(rows)
    assert sorted((r.location.role, r.record.instruction_id) for r in found) == [
        ("completions", "10"),
        ("completions", "11"),
        ("judgements", "7"),
    ]
    as_dict = found[0].as_dict()
    assert as_dict["descriptor"] == found[0].location.descriptor_hash16
    assert as_dict["input_hash"] == found[0].record.input_hash


def test_query_filters_and_limits_across_databases(filled: Path, settings: Settings) -> None:
    def count(selector: Selector | None = None, limit: int | None = None, **flt: object) -> int:
        rows = query_rows(filled, settings, selector or Selector(), RowFilter(**flt), limit=limit)  # type: ignore[arg-type]
        return sum(1 for _ in rows)

    assert count() == 10
    assert count(limit=4) == 4
    assert count(limit=0) == 0
    assert count(Selector(role="completions")) == 5
    assert count(model="qwen") == 3
    assert count(model="model-b") == 4  # judgements where it is model_a or model_b
    assert count(pointwise=True) == 1
    assert count(orientation="reversed") == 2
    assert count(judge="judge-1") == 5
    assert count(created_after=datetime(2026, 1, 2, tzinfo=UTC)) == 5
    assert count(created_before=datetime(2026, 1, 2, tzinfo=UTC)) == 5
    assert count(created_after=datetime(2026, 1, 1, 23, tzinfo=timezone(timedelta(hours=-2)))) == 0


def test_query_refuses_a_database_that_is_behind(
    filled: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_shipped_scripts_are(read_script_directory(SYNTHETIC_REVISIONS), monkeypatch)
    with pytest.raises(SchemaBehindError, match="judgestore db upgrade"):
        list(query_rows(filled, settings, Selector(), RowFilter()))


def test_delete_refuses_an_empty_row_filter_before_opening_anything(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    with pytest.raises(EmptyFilterError):
        plan_delete(filled, settings, Selector(role="completions", task="mt-bench"), RowFilter())
    with pytest.raises(EmptyFilterError):
        delete_rows(filled, settings, DeletePlan((RowFilter(),), ()))
    assert file_digests(filled) == before


def test_delete_removes_exactly_the_planned_rows(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    plan = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2"))
    assert sorted((e.location.role, e.rows) for e in plan.counts) == [("completions", 2), ("judgements", 1)]
    assert file_digests(filled) == before  # planning is read-only

    deleted = delete_rows(filled, settings, plan)
    assert sum(e.rows for e in deleted) == 3
    remaining = list(query_rows(filled, settings, Selector(), RowFilter()))
    assert len(remaining) == 7 and all(r.record.run_id == "run-1" for r in remaining)
    assert plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2")).counts == ()


def test_a_delete_plan_deletes_what_it_counted_not_rows_written_since(filled: Path, settings: Settings) -> None:
    """A library caller that asks between plan and delete: the run's later rows were deleted with the counted ones
    (was; only the CLI bounded the filter)."""
    plan = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2"))
    (flt,) = plan.filters
    assert flt.run_id == "run-2" and flt.created_before is not None
    later = [completion_record(i, run_id="run-2", created_at=datetime.now(UTC)) for i in (20, 21)]
    with Store(settings, root=filled) as writer:
        writer.database("completions", "mt-bench", QWEN).put_many(later)
    assert sum(d.rows for d in delete_rows(filled, settings, plan)) == plan.rows == 3
    left = {found.record.input_hash for found in query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))}
    assert left == {r.input_hash for r in later}


def test_a_delete_plan_counts_the_rows_dated_after_it_and_keys_are_not_bounded(
    filled: Path, settings: Settings
) -> None:
    """A row dated ahead (another machine's clock, a time another tool wrote) was silently left out of a delete, and
    could not be deleted even by its key, the step verify advises: 'No rows match the filter' (was)."""
    ahead = completion_record(30, run_id="run-2", created_at=datetime.now(UTC) + timedelta(hours=1))
    with Store(settings, root=filled) as writer:
        writer.database("completions", "mt-bench", QWEN).put_many([ahead])
    plan = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2"))
    assert (plan.rows, plan.later) == (3, 1)
    assert sum(d.rows for d in delete_rows(filled, settings, plan)) == 3
    keyed = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2", input_hashes=(ahead.input_hash,)))
    assert (keyed.rows, keyed.later) == (1, 0) and keyed.filters[0].created_before is None
    assert sum(d.rows for d in delete_rows(filled, settings, keyed)) == 1
    assert list(query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))) == []


def test_ctrl_c_just_after_a_databases_delete_committed_counts_that_delete(
    filled: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands after the second database's delete committed: its rows are gone, so they are counted."""
    plan = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2"))
    assert [entry.rows for entry in plan.counts] == [2, 1]
    ctrl_c_on_call(monkeypatch, Database, "delete", 2, after=True)
    with pytest.raises(KeyboardInterrupt) as caught:
        delete_rows(filled, settings, plan)
    assert caught.value.rows_deleted == 3  # type: ignore[attr-defined]
    assert list(query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))) == []


def test_a_delete_that_fails_on_one_database_says_what_it_deleted_before(filled: Path) -> None:
    """Each database is one transaction: the error says which are already done, and a rerun finishes."""
    flt = RowFilter(run_id="run-2")
    plan = plan_delete(filled, Settings(), Selector(), flt)
    first, last = plan.counts
    with Store(root=filled) as holder, Store(Settings(busy_timeout_ms=50, lock_retries=1), root=filled) as deleter:
        # a writer holds the last database
        with holder.open(last.location).transaction(), pytest.raises(DatabaseBusyError) as caught:
            deleter.delete_rows(plan)
        assert caught.value.rows_deleted == first.rows == 2
        (note,) = caught.value.__notes__
        assert f"2 rows were deleted from 1 database ({deleter.open(first.location).where})" in note
        assert "run the same command again" in note
        assert deleter.open(first.location).count(flt) == 0 and deleter.open(last.location).count(flt) == last.rows
        assert [(d.location, d.rows) for d in deleter.delete_rows(plan)] == [
            (first.location, 0),
            (last.location, 1),
        ]


def test_the_note_of_a_failed_delete_says_one_row_in_the_singular(filled: Path) -> None:
    """The judgements database first (1 row of run-2), then the held completions one. Was: '1 rows were deleted
    from 1 databases'."""
    flt = RowFilter(run_id="run-2")
    plan = plan_delete(filled, Settings(), Selector(), flt)
    completions, judgements = plan.counts
    with Store(root=filled) as holder, Store(Settings(busy_timeout_ms=50, lock_retries=1), root=filled) as deleter:
        with holder.open(completions.location).transaction(), pytest.raises(DatabaseBusyError) as caught:
            deleter.delete_rows(DeletePlan(plan.filters, (judgements, completions)))
        (note,) = caught.value.__notes__
        assert note.startswith(
            f"Before it, 1 row was deleted from 1 database ({deleter.open(judgements.location).where});"
        )


def test_a_descriptor_prefix_longer_than_a_folder_name_is_compared_whole(filled: Path) -> None:
    with Store(root=filled, readonly=True) as store:
        full = QWEN.sha256()
        wrong = full[:16] + ("0" if full[16] != "0" else "1") + full[17:20]
        assert [loc.descriptor_hash16 for loc in store.select(Selector(descriptor=full))] == [QWEN.hash16()]
        assert [loc.descriptor_hash16 for loc in store.select(Selector(descriptor=full[:20]))] == [QWEN.hash16()]
        assert store.select(Selector(descriptor=wrong)) == []
        assert list(store.query_rows(Selector(descriptor=wrong), RowFilter())) == []
        assert len(store.select(Selector(descriptor=full[:8]))) == 1


def test_delete_within_selected_databases_only(filled: Path, settings: Settings) -> None:
    plan = plan_delete(filled, settings, Selector(role="judgements"), RowFilter(run_id="run-2"))
    assert [(e.location.role, e.rows) for e in plan.counts] == [("judgements", 1)]
    delete_rows(filled, settings, plan)
    assert sum(1 for _ in query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))) == 2


@pytest.mark.parametrize("where", ["some/folder", Path("some/folder")])
def test_a_path_given_as_the_settings_is_a_type_error_naming_root(
    where: str | Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"Store\(root=\.\.\.\)"):
        Store(where)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing created, neither the folder nor the default store


def test_a_relative_root_is_fixed_when_the_store_opens_not_at_each_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that changed its working directory (Hydra's job.chdir) wrote its next databases under another folder,
    and the store no longer listed those it had written (was)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    llama = ModelDescriptor(provider="vllm", model="meta-llama/Llama-3.1-8B")
    with Store(root="rel") as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
        monkeypatch.chdir(tmp_path / "b")
        store.database("completions", "t", llama).put_many([completion_record(2)])
        assert sorted(location.model for location in store.locations()) == sorted([QWEN.model, llama.model])
        assert store.where == "rel"  # shown as given
    assert not (tmp_path / "b" / "rel").exists()
    with Store(root=tmp_path / "a" / "rel") as store:
        assert sum(store.open(location).count() for location in store.locations()) == 2
    (tmp_path / "b" / "link").symlink_to(tmp_path / "a" / "deeper", target_is_directory=True)
    (tmp_path / "a" / "deeper").mkdir()
    with Store(root="link/../rel", readonly=True) as store:  # ".." of a link: its target's parent, as ls reads it
        assert sum(store.open(location).count() for location in store.locations()) == 2


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("readonly", [True, False], ids=["read-only", "read-write"])
def test_a_folder_inside_a_store_is_refused_as_a_root_and_names_the_store(
    tmp_path: Path, depth: int, readonly: bool
) -> None:
    """--store-root st/completions read as "No databases" (exit 0), and a write made a store inside the store that
    its own listing never showed (was); the descriptor folder itself, and a link to a role folder, were missed by
    the first mend."""
    root = tmp_path / "st"
    with Store(root=root) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
        location = store.locations()[0]
    inside = root.joinpath(*location.relative_folder().parts[:depth])
    link = tmp_path / "link"
    link.symlink_to(inside)
    before = file_digests(root)
    for given in (inside, link, inside / ".." / inside.name):
        with pytest.raises(StoreMissingError, match=f"a folder inside the store {root}, not a store"):
            Store(root=given, readonly=readonly)
    assert file_digests(root) == before


def test_a_store_named_after_a_role_is_a_store(tmp_path: Path) -> None:
    """A store whose own folder is called completions, or lies in one, is no folder inside another store."""
    for root in (tmp_path / "completions", tmp_path / "completions" / "mine"):
        with Store(root=root) as store:
            store.database("completions", "t", QWEN).put_many([completion_record(1)])
        with Store(root=root, readonly=True) as store:
            assert [location.model for location in store.locations()] == [QWEN.model]


def test_a_role_folder_holding_a_task_named_after_a_role_is_still_inside_its_store(tmp_path: Path) -> None:
    """The second mend took a folder holding a folder named like a role for a store's root: the completions folder
    of a store with a task named completions opened as an empty store, and a write hid a store inside it (was)."""
    root = tmp_path / "st"
    with Store(root=root) as store:
        store.database("completions", "completions", QWEN).put_many([completion_record(1)])
        store.database("judgements", "judgements", QWEN).put_many([judgement_record(1)])
    for role in ("completions", "judgements"):
        with pytest.raises(StoreMissingError, match=f"a folder inside the store {root}"):
            Store(root=root / role)


def test_a_handle_a_run_keeps_refuses_to_write_a_database_another_process_moved_to_another_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run opens its database once and writes through that handle to the end: after another process's upgrade
    by a newer judgestore it went on writing rows of its own revision into the new one, 80,100 rows (was)."""
    monkeypatch.setattr(database_module, "RECHECK_SECONDS", 0.0)
    root, location = tmp_path / "store", Location.of("completions", "t", QWEN)
    with Store(root=root) as store:
        handle = store.database("completions", "t", QWEN)
        assert handle.put_many([completion_record(1)]) == 1
        with closing(sqlite3.connect(location.db_path(root))) as db, db:  # as the newer judgestore's upgrade leaves it
            (head,) = db.execute("SELECT version_num FROM judgestore_alembic_version").fetchone()
            db.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
        for write in (lambda: handle.put_many([completion_record(2)]), lambda: handle.delete(RowFilter(run_id="x"))):
            with pytest.raises(SchemaError, match="changed under this process since it was opened"):
                write()
        with closing(sqlite3.connect(location.db_path(root))) as db, db:
            assert db.execute("SELECT count(*) FROM completions").fetchone() == (1,)  # nothing was written
            db.execute("UPDATE judgestore_alembic_version SET version_num = ?", (head,))
        assert handle.put_many([completion_record(2)]) == 1  # back at this library's revision: it writes again


def test_a_kept_handle_waits_for_a_writer_of_a_rollback_journal_file_rather_than_call_it_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The revision check's read waited for another writer's lock (a rollback journal's readers do), timed out,
    and the write was refused as "changed under this process", where it waited and wrote before (was)."""
    import threading

    monkeypatch.setattr(database_module, "RECHECK_SECONDS", 0.0)
    root, location = tmp_path / "store", Location.of("completions", "t", QWEN)
    patient = Settings(journal_policy="rollback", busy_timeout_ms=200, lock_retries=8)
    with Store(patient, root=root) as store:
        handle = store.database("completions", "t", QWEN)
        assert handle.put_many([completion_record(1)]) == 1
        holder = sqlite3.connect(location.db_path(root), isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")  # another job's long write
        threading.Timer(0.6, holder.execute, ("COMMIT",)).start()
        try:
            assert handle.put_many([completion_record(2)]) == 1  # waited for it, as a write does
        finally:
            time.sleep(0.7)
            holder.close()
        assert handle.count() == 2


@pytest.mark.parametrize("journal", ["wal", "rollback"])
def test_a_write_that_waited_for_an_upgrade_to_finish_is_refused_under_the_lock(tmp_path: Path, journal: str) -> None:
    """The revision was checked before the write waited for its lock: an upgrade holding the lock meanwhile moved
    the file to another revision, and the write went in after it, a row of the old schema in the new file (was)."""
    import threading

    root, location = tmp_path / "store", Location.of("completions", "t", QWEN)
    patient = Settings(journal_policy=journal, busy_timeout_ms=200, lock_retries=8)  # type: ignore[arg-type]
    with Store(patient, root=root) as store:
        handle = store.database("completions", "t", QWEN)
        assert handle.put_many([completion_record(1)]) == 1
        upgrader = sqlite3.connect(location.db_path(root), isolation_level=None, check_same_thread=False)
        upgrader.execute("BEGIN EXCLUSIVE")  # as a newer judgestore's `db upgrade` holds it
        upgrader.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
        threading.Timer(0.6, upgrader.execute, ("COMMIT",)).start()
        try:
            with pytest.raises(SchemaError, match=r"changed under this process.*its revision is now 9999"):
                handle.put_many([completion_record(2)])
            with pytest.raises(SchemaError, match="its revision is now 9999"):
                handle.delete(RowFilter(run_id="run-1"))  # every write, not only put_many
        finally:
            time.sleep(0.7)
            upgrader.close()
    with closing(sqlite3.connect(location.db_path(root))) as db:
        assert db.execute("SELECT count(*) FROM completions").fetchone() == (1,)


@pytest.mark.parametrize("readonly", [True, False], ids=["read-only", "read-write"])
def test_a_store_kept_open_sees_its_database_moved_to_another_revision_by_another_process(
    tmp_path: Path, readonly: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder store checked a file's revision once, when it first opened it: a browser kept showing the rows of
    a database a newer judgestore had upgraded, or one a backup had been copied over (was). A server store checks
    at every open; a folder store at most every second (here at every open)."""
    monkeypatch.setattr(database_module, "RECHECK_SECONDS", 0.0)
    root, location = tmp_path / "store", Location.of("completions", "t", QWEN)
    with Store(root=root) as writer:
        writer.database("completions", "t", QWEN).put_many([completion_record(1)])
    with closing(sqlite3.connect(location.db_path(root))) as db:
        (head,) = db.execute("SELECT version_num FROM judgestore_alembic_version")

    def set_revision(revision: str) -> None:  # as another process's upgrade, or a restored backup, leaves it
        with closing(sqlite3.connect(location.db_path(root))) as db, db:
            db.execute("UPDATE judgestore_alembic_version SET version_num = ?", (revision,))

    with Store(root=root, readonly=readonly) as kept:
        assert kept.open(location).count() == 1
        set_revision("9999")
        with pytest.raises(SchemaAheadError, match="9999"):
            kept.open(location)
        set_revision(head[0])
        assert kept.open(location).count() == 1
        set_revision("0005")
        with pytest.raises(SchemaBehindError, match="0005"):
            kept.open_existing(location)
        set_revision(head[0])
        assert kept.open(location).count() == 1
        if not readonly:
            return  # a file renamed over one this process writes meets its -wal: SQLite warns against it
        # a file renamed over it (mv, rsync) while a browser has it open: it was read as the old one (was)
        newer = tmp_path / "newer.db"
        with closing(sqlite3.connect(location.db_path(root))) as db, closing(sqlite3.connect(newer)) as copy:
            db.backup(copy)
            copy.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
            copy.commit()
        os.replace(newer, location.db_path(root))
        with pytest.raises(SchemaAheadError, match="9999"):
            kept.open(location)
