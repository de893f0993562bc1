"""What `judgestore stats` reads: rows, data, tokens, finish reasons and recorded runs, per database."""

from __future__ import annotations

from pathlib import Path

from store.layout import Selector, database_size
from store.settings import Settings
from store.stats import StoreTotals, store_stats
from store.store import Store
from tests.factories import JUDGE, QWEN, completion_record, fill_small_store, stamp
from tests.store.test_runs import run


def test_stats_add_up_rows_tokens_and_runs_per_database(store_root: Path) -> None:
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many([completion_record(5, finish_reason="length", usage={"prompt_tokens": 7,
                           "completion_tokens": 64, "engine_seconds": 1.5})])  # fmt: skip
        from store.runs import record_run

        record_run(database, run(1))
        record_run(database, run(3))
    with Store(Settings(), root=store_root, readonly=True) as store:
        found = {entry.location.model: entry for entry in store_stats(store)}
    qwen = found["Qwen/Qwen3-8B"]
    assert (qwen.rows.rows, qwen.rows.prompt_tokens, qwen.rows.completion_tokens) == (4, 10 + 11 + 12 + 7, 3 * 3 + 64)
    assert (qwen.rows.engine_seconds, qwen.rows.rows_with_cost) == (1.5, 1)
    assert qwen.finish_reasons == {"stop": 3, "length": 1} and qwen.truncated == 1
    assert qwen.rows.data_bytes > sum(len(completion_record(i).input_text) for i in range(3))
    assert (qwen.runs.runs, qwen.runs.hits, qwen.runs.saved_prompt_tokens) == (2, 4, 400)
    assert [r.run_id for r in qwen.recent_runs] == ["run-3", "run-1"]
    assert qwen.size_bytes == database_size(Path(qwen.where)) >= Path(qwen.where).stat().st_size
    judge = found["judge-1"]
    assert (judge.rows.rows, judge.runs.runs, judge.error) == (5, 0, None)
    totals = StoreTotals.of(list(found.values()))
    assert (totals.databases, totals.rows.rows, totals.runs.hits, totals.truncated) == (3, 4 + 2 + 5, 4, 1)
    assert totals.as_dict()["rows"]["rows"] == 11


def test_a_database_that_cannot_be_opened_is_reported_and_the_others_are_read(store_root: Path) -> None:
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:
        path = store.database("judgements", "arena-hard", JUDGE).path
    stamp(path, "0001")
    with Store(Settings(), root=store_root, readonly=True) as store:
        found = list(store_stats(store))
        only = list(store_stats(store, store.select(Selector(role="completions"))))
    (bad,) = [entry for entry in found if entry.error is not None]
    assert bad.location.model == "judge-1" and "judgestore db upgrade" in bad.error
    assert bad.as_dict()["error"] == bad.error and StoreTotals.of(found).unreadable == 1
    assert [entry.location.role for entry in only] == ["completions", "completions"]
