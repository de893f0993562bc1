"""The runs table: a run's accounting is appended, read back newest first, and added up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from store.descriptor import ModelDescriptor
from store.runs import recent_runs, record_run, run_totals
from store.settings import Settings
from store.store import Store
from store.tables.records import RunRecord, RunTotals
from tests.factories import completion_record

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def run(i: int, **overrides: object) -> RunRecord:
    values: dict[str, object] = {
        "role": "completions", "run_id": f"run-{i}", "created_by": "tester",
        "started_at": T0 + timedelta(hours=i), "finished_at": T0 + timedelta(hours=i, seconds=5), "mode": "use",
        "requested": 10, "distinct_inputs": 10, "hits": i, "misses": 10 - i, "duplicates": 0,
        "generated": 10 - i, "rows_written": 10 - i, "truncated": 1, "prompt_tokens": 100 * (10 - i),
        "completion_tokens": 20 * (10 - i), "engine_seconds": 0.5 * (10 - i), "saved_prompt_tokens": 100 * i,
        "saved_completion_tokens": 20 * i, "saved_engine_seconds": 0.5 * i, "hits_without_cost": 0,
        "wall_seconds": 5.0,
    }  # fmt: skip
    values.update(overrides)
    return RunRecord(**values)  # type: ignore[arg-type]


def test_runs_are_appended_and_read_back_newest_first(store: Store, descriptor: ModelDescriptor) -> None:
    database = store.database("completions", "mt-bench", descriptor)
    ids = [record_run(database, run(i)) for i in (0, 2, 1)]
    assert len(set(ids)) == 3
    recent = recent_runs(database, limit=2)
    assert [r.run_id for r in recent] == ["run-2", "run-1"]
    assert recent[0].started_at == T0 + timedelta(hours=2) and recent[0].started_at.tzinfo is not None
    assert recent[0] == run(2, id=ids[1])


def test_totals_add_up_every_run(store: Store, descriptor: ModelDescriptor) -> None:
    database = store.database("completions", "mt-bench", descriptor)
    assert run_totals(database) == RunTotals()
    for i in range(4):
        record_run(database, run(i))
    totals = run_totals(database)
    assert (totals.runs, totals.hits, totals.misses, totals.saved_prompt_tokens) == (4, 6, 34, 600)
    assert totals.saved_engine_seconds == pytest.approx(3.0) and isinstance(totals.engine_seconds, float)
    assert (totals.first_started_at, totals.last_finished_at) == (T0, T0 + timedelta(hours=3, seconds=5))
    assert (totals + RunTotals()) == totals
    assert (totals + totals).runs == 8


def test_seconds_no_run_takes_are_left_out_of_the_totals(store: Store, descriptor: ModelDescriptor) -> None:
    """Two runs that saved 1e308 s (hits of rows whose usage said so) summed to inf, which the stats catalog kept
    as null: stats crashed on adding it (was)."""
    database = store.database("completions", "mt-bench", descriptor)
    for i in range(2):
        record_run(database, run(i, saved_engine_seconds=1e308, engine_seconds=float("inf")))
    record_run(database, run(2))
    totals = run_totals(database)
    assert (totals.runs, totals.saved_engine_seconds, totals.engine_seconds) == (3, 1.0, 4.0)


def test_recording_a_run_leaves_the_rows_alone(store: Store, descriptor: ModelDescriptor) -> None:
    database = store.database("completions", "mt-bench", descriptor)
    database.put_many([completion_record(i) for i in range(3)])
    record_run(database, run(1))
    assert database.count() == 3
    with Store(Settings(), root=store.root, readonly=True) as readonly:
        assert [r.run_id for r in recent_runs(readonly.open(database.location))] == ["run-1"]


def test_a_hit_rate_reads_100_percent_only_when_every_input_hit() -> None:
    """999 hits of 1,000 read "100%" and 1 of 1,000 "0%"; 5 of 8 "62%", a half rounded to even (was)."""
    from store.runs import hit_rate

    assert [hit_rate(h, n) for h, n in [(999, 1000), (1, 1000), (5, 8), (3, 8), (0, 5), (5, 5), (1, 3)]] == [
        "99%", "1%", "63%", "38%", "0%", "100%", "33%"
    ]  # fmt: skip
