"""store.inspect: listing, selecting, querying, deleting, upgrading and verifying a whole store root."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from store.descriptor import ModelDescriptor
from store.errors import EmptyFilterError, InvalidInputError, SchemaBehindError
from store.inspect import (
    DatabaseState,
    ProblemKind,
    Selector,
    delete_rows,
    inspect_database,
    parse_timestamp,
    plan_delete,
    query_rows,
    roles_for,
    row_columns,
    select,
    stray_paths,
    upgrade_store,
    verify_database,
)
from store.layout import Location, read_location_metadata
from store.records import RowFilter
from store.schema import UpgradeOutcome, read_script_directory
from store.settings import Settings
from store.store import Store
from tests.factories import (
    JUDGE,
    LLAMA,
    QWEN,
    SHIPPED_HEAD,
    SYNTHETIC_HEAD,
    SYNTHETIC_REVISIONS,
    completion_record,
    file_digests,
    judgement_record,
)

REVISIONS = SYNTHETIC_REVISIONS


@pytest.fixture
def settings() -> Settings:
    return Settings()


def location_of(root: Path, descriptor: ModelDescriptor) -> Location:
    return next(loc for loc in select(root) if loc.descriptor_hash16 == descriptor.hash16())


# ---------------------------------------------------------------- selecting


def test_selector_picks_databases_by_location(filled: Path) -> None:
    assert len(select(filled)) == 3
    assert {loc.model for loc in select(filled, Selector(role="completions"))} == {
        "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.1-8B",
    }
    assert [loc.model for loc in select(filled, Selector(model="judge-1"))] == ["judge-1"]
    assert [loc.task for loc in select(filled, Selector(task="arena-hard"))] == ["arena-hard"]
    assert select(filled, Selector(provider="openai")) == []
    prefix = QWEN.hash16()[:6]
    assert [loc.descriptor_hash16 for loc in select(filled, Selector(descriptor=prefix))] == [QWEN.hash16()]
    assert [loc.descriptor_hash16 for loc in select(filled, Selector(descriptor=QWEN.sha256()))] == [QWEN.hash16()]


def test_selector_rejects_a_bad_role_or_hash() -> None:
    with pytest.raises(InvalidInputError):
        Selector(role="completion")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Selector(descriptor="not-hex")


def test_judgement_only_filters_select_judgements() -> None:
    assert roles_for(RowFilter()) == ("completions", "judgements")
    assert roles_for(RowFilter(model="m"), "completions") == ("completions",)
    assert roles_for(RowFilter(judge="j")) == ("judgements",)
    assert roles_for(RowFilter(pointwise=False)) == ("judgements",)
    with pytest.raises(InvalidInputError, match="judgements only"):
        roles_for(RowFilter(orientation="direct"), "completions")


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


def test_timestamps_without_an_offset_are_utc() -> None:
    assert parse_timestamp("2026-01-02") == datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:04:05") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:00:00+02:00") == datetime(2026, 1, 2, 1, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:00:00Z").tzinfo is not None
    with pytest.raises(InvalidInputError, match="ISO-8601"):
        parse_timestamp("yesterday")


# ---------------------------------------------------------------- listing


def test_inspect_counts_rows_and_reads_state_without_writing(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    infos = {info.location.model: info for info in (inspect_database(filled, loc, settings) for loc in select(filled))}
    assert {m: (i.state, i.rows) for m, i in infos.items()} == {
        "Qwen/Qwen3-8B": (DatabaseState.CURRENT, 3),
        "meta-llama/Llama-3.1-8B": (DatabaseState.CURRENT, 2),
        "judge-1": (DatabaseState.CURRENT, 5),
    }
    info = infos["judge-1"]
    assert info.ok and info.revision == info.head and info.error is None
    assert info.size_bytes == info.path.stat().st_size > 0
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

    states = {loc.model: inspect_database(filled, loc, settings) for loc in select(filled)}
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

    assert inspect_database(filled, qwen, settings).state is DatabaseState.FOREIGN
    truncated = inspect_database(filled, judge, settings)
    assert truncated.state is DatabaseState.CORRUPT and "damaged" in str(truncated.error)


def test_a_moved_folder_does_not_match_its_metadata(filled: Path, settings: Settings) -> None:
    qwen = location_of(filled, QWEN)
    moved = Location("completions", "other-task", qwen.provider, qwen.model, qwen.descriptor_hash16)
    moved.folder(filled).parent.mkdir(parents=True)
    qwen.folder(filled).rename(moved.folder(filled))
    with pytest.raises(Exception, match="the folder was moved"):
        read_location_metadata(filled, moved)
    assert inspect_database(filled, moved, settings).state is DatabaseState.METADATA_MISMATCH


# ---------------------------------------------------------------- rows


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
    script = read_script_directory(REVISIONS)
    from store import schema
    from store.schema import revisions_of

    monkeypatch.setattr(schema, "revisions", lambda: revisions_of(script))
    with pytest.raises(SchemaBehindError, match="judgestore db upgrade"):
        list(query_rows(filled, settings, Selector(), RowFilter()))


def test_delete_refuses_an_empty_row_filter_before_opening_anything(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    with pytest.raises(EmptyFilterError):
        plan_delete(filled, settings, Selector(role="completions", task="mt-bench"), RowFilter())
    with pytest.raises(EmptyFilterError):
        delete_rows(filled, settings, [], RowFilter())
    assert file_digests(filled) == before


def test_delete_removes_exactly_the_planned_rows(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    plan = plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2"))
    assert sorted((e.location.role, e.rows) for e in plan) == [("completions", 2), ("judgements", 1)]
    assert file_digests(filled) == before  # planning is read-only

    deleted = delete_rows(filled, settings, plan, RowFilter(run_id="run-2"))
    assert sum(e.rows for e in deleted) == 3
    remaining = list(query_rows(filled, settings, Selector(), RowFilter()))
    assert len(remaining) == 7 and all(r.record.run_id == "run-1" for r in remaining)
    assert plan_delete(filled, settings, Selector(), RowFilter(run_id="run-2")) == []


def test_delete_within_selected_databases_only(filled: Path, settings: Settings) -> None:
    plan = plan_delete(filled, settings, Selector(role="judgements"), RowFilter(run_id="run-2"))
    assert [(e.location.role, e.rows) for e in plan] == [("judgements", 1)]
    delete_rows(filled, settings, plan, RowFilter(run_id="run-2"))
    assert sum(1 for _ in query_rows(filled, settings, Selector(), RowFilter(run_id="run-2"))) == 2


# ---------------------------------------------------------------- upgrades


def test_upgrade_store_upgrades_behind_databases_once(filled: Path, settings: Settings) -> None:
    script = read_script_directory(REVISIONS)
    results = list(upgrade_store(filled, select(filled), settings, script=script))
    assert [(r.outcome, r.from_revision, r.to_revision) for r in results] == [
        (UpgradeOutcome.UPGRADED, SHIPPED_HEAD, SYNTHETIC_HEAD)
    ] * 3
    assert all(r.backup is not None and r.backup.exists() for r in results)
    again = list(upgrade_store(filled, select(filled), settings, script=script))
    assert [r.outcome for r in again] == [UpgradeOutcome.UP_TO_DATE] * 3


def test_upgrade_store_never_writes_to_files_it_refuses(filled: Path, settings: Settings) -> None:
    qwen, llama = location_of(filled, QWEN), location_of(filled, LLAMA)
    qwen.db_path(filled).write_bytes(b"garbage" * 1000)
    llama.db_path(filled).unlink()
    with sqlite3.connect(llama.db_path(filled)) as conn:  # rollback journal: a WAL switch would show
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
    conn.close()
    before = file_digests(filled)
    results = {r.path: r for r in upgrade_store(filled, select(filled), settings)}
    assert results[qwen.db_path(filled)].outcome is UpgradeOutcome.REFUSED
    assert "not an SQLite database" in str(results[qwen.db_path(filled)].error)
    assert results[llama.db_path(filled)].outcome is UpgradeOutcome.REFUSED
    assert "not a judgestore database" in str(results[llama.db_path(filled)].error)
    assert results[location_of(filled, JUDGE).db_path(filled)].outcome is UpgradeOutcome.UP_TO_DATE
    assert file_digests(filled) == before  # not a byte changed, no lock file created


# ---------------------------------------------------------------- verification


def test_verify_passes_a_clean_store(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    results = [verify_database(filled, loc, settings) for loc in select(filled)]
    assert all(r.ok for r in results), [r.problems for r in results]
    assert sum(r.rows_checked for r in results) == 10
    assert stray_paths(filled) == []
    assert file_digests(filled) == before


def test_verify_finds_a_row_whose_input_was_edited(filled: Path, settings: Settings) -> None:
    qwen = location_of(filled, QWEN)
    victim = completion_record(1, model="qwen").input_hash
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute(
            "UPDATE completions SET input_text = ? WHERE input_hash = ?", ('{"type":"text","text":"x"}', victim)
        )
    conn.close()
    result = verify_database(filled, qwen, settings)
    assert [p.kind for p in result.problems] == [ProblemKind.INPUT_HASH]
    assert victim in result.problems[0].message and result.problems[0].path == qwen.db_path(filled)
    assert f"judgestore delete --input-hash {victim}" in result.problems[0].message


def test_verify_finds_metadata_schema_and_file_problems(filled: Path, settings: Settings) -> None:
    qwen, llama, judge = (location_of(filled, d) for d in (QWEN, LLAMA, JUDGE))
    (qwen.folder(filled) / "metadata.json").write_text("{}")
    with sqlite3.connect(llama.db_path(filled)) as conn:
        conn.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
    conn.close()
    judge.db_path(filled).write_bytes(b"\0" * 4096)

    kinds = {loc.model: [p.kind for p in verify_database(filled, loc, settings).problems] for loc in select(filled)}
    assert kinds == {
        "Qwen/Qwen3-8B": [ProblemKind.METADATA],
        "meta-llama/Llama-3.1-8B": [ProblemKind.SCHEMA],
        "judge-1": [ProblemKind.FILE],
    }


def test_stray_paths_lists_what_is_not_part_of_the_layout(filled: Path) -> None:
    qwen = location_of(filled, QWEN)
    (filled / "notes.txt").write_text("hi")
    (filled / "completions" / "mt-bench" / "stray.db").write_text("x")
    (filled / "judgements" / "bad%zzsegment").mkdir()
    (qwen.folder(filled) / "copy.db").write_text("x")
    (qwen.folder(filled) / f"completions.db.bak-0001-{'2' * 8}").write_text("a backup is expected")
    empty = Location("completions", "mt-bench", "vllm", "x", "0" * 16).folder(filled)
    empty.mkdir(parents=True)

    found = {str(p.path.relative_to(filled)): p.kind for p in stray_paths(filled)}
    assert set(found) == {
        "notes.txt",
        "completions/mt-bench/stray.db",
        "judgements/bad%zzsegment",
        str(qwen.relative_folder() / "copy.db"),
        str(empty.relative_to(filled)),
    }
    assert set(found.values()) == {ProblemKind.STRAY}
