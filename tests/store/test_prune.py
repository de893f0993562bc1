"""Pruning: every criterion is a filter, the plan counts what the prune deletes, nothing else goes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from store.cli.app import build_app
from store.errors import DatabaseBusyError, InvalidInputError
from store.layout import Selector
from store.prune import PruneRule, parse_duration, parse_size, plan_prune, prune
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import JUDGE, QWEN, completion_record, judgement_record

NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
def aged(store_root: Path) -> Path:
    """Completions of three runs 40, 20 and 1 day old (4 rows each), judgements of the middle run, legacy rows."""
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        for k, days in enumerate((40, 20, 1)):
            when = NOW - timedelta(days=days)
            database.put_many([completion_record(10 * k + i, run_id=f"run-{k}", created_at=when) for i in range(4)])
        database.put_many([completion_record(99, run_id=None, created_at=NOW - timedelta(days=400))])
        store.database("judgements", "arena", JUDGE).put_many(
            [judgement_record(i, run_id="run-1", created_at=NOW - timedelta(days=20)) for i in range(3)]
        )
    return store_root


def planned(root: Path, rule: PruneRule, selector: Selector | None = None) -> tuple[dict[str, int], object]:
    with Store(Settings(), root=root, readonly=True) as store:
        plan = plan_prune(store, selector or Selector(), rule, now=NOW)
    return {entry.location.role: entry.rows for entry in plan.counts}, plan


def pruned(root: Path, rule: PruneRule, selector: Selector | None = None) -> dict[str, int]:
    counts, plan = planned(root, rule, selector)
    with Store(Settings(), root=root) as store:
        deleted = {entry.location.role: entry.rows for entry in prune(store, plan)}  # type: ignore[arg-type]
    assert deleted == counts  # the dry run's counts are what the prune deletes
    return deleted


def remaining(root: Path) -> dict[str, set[str | None]]:
    with Store(Settings(), root=root, readonly=True) as store:
        return {
            role: {r.run_id for r in store.database(role, task, d).query()}
            for role, task, d in (("completions", "mt-bench", QWEN), ("judgements", "arena", JUDGE))
        }


def test_older_than_prunes_rows_written_before_now_minus_the_duration(aged: Path) -> None:
    assert pruned(aged, PruneRule(older_than=timedelta(days=30))) == {"completions": 5}
    assert remaining(aged) == {"completions": {"run-1", "run-2"}, "judgements": {"run-1"}}


def test_keep_last_runs_prunes_the_other_runs_and_never_rows_without_a_run(aged: Path) -> None:
    counts, plan = planned(aged, PruneRule(keep_last_runs=1))
    assert plan.kept_runs == ("run-2",) and plan.pruned_runs == ("run-1", "run-0")  # type: ignore[attr-defined]
    assert counts == {"completions": 8, "judgements": 3}
    pruned(aged, PruneRule(keep_last_runs=1))
    assert remaining(aged) == {"completions": {"run-2", None}, "judgements": set()}


def test_rows_a_run_writes_after_the_plan_are_never_pruned_by_it(aged: Path) -> None:
    """Rows written while a prune asked to confirm were deleted with the planned ones, so --keep-last-runs could
    delete a run still at work (was)."""
    counts, plan = planned(aged, PruneRule(keep_last_runs=1))
    with Store(Settings(), root=aged) as store:  # run-1, planned for pruning, writes on meanwhile
        later = [completion_record(50 + i, run_id="run-1", created_at=NOW + timedelta(seconds=5)) for i in range(3)]
        store.database("completions", "mt-bench", QWEN).put_many(later)
        deleted = {entry.location.role: entry.rows for entry in prune(store, plan)}  # type: ignore[arg-type]
        kept = {r.input_hash for r in store.database("completions", "mt-bench", QWEN).query(RowFilter(run_id="run-1"))}
    assert deleted == counts == {"completions": 8, "judgements": 3}  # what was shown, and no more
    assert kept == {r.input_hash for r in later}


@pytest.mark.parametrize(
    ("rule", "later"),
    [
        (PruneRule(flt=RowFilter(run_id="run-1")), 1),
        (PruneRule(keep_last_runs=1), 1),  # run-3's row is the newest: run-3 kept, run-1's ahead row counted
        (PruneRule(max_bytes=0), 2),
        (PruneRule(flt=RowFilter(run_id="run-1", created_before=NOW + timedelta(days=1))), 0),
        (PruneRule(older_than=timedelta(days=1)), 0),  # rows dated ahead are not older than anything
    ],
    ids=["filter", "keep-last-runs", "max-size", "until-before-them", "older-than"],
)
def test_the_plan_counts_the_rows_its_time_bound_alone_leaves_out(aged: Path, rule: PruneRule, later: int) -> None:
    """Rows dated after the plan (a clock ahead, another tool's time) were left out without a word (was)."""
    with Store(Settings(), root=aged) as store:
        ahead = [
            completion_record(60, run_id="run-1", created_at=NOW + timedelta(days=2)),
            completion_record(61, run_id="run-3", created_at=NOW + timedelta(days=3)),
        ]
        store.database("completions", "mt-bench", QWEN).put_many(ahead)
    _, plan = planned(aged, rule)
    assert plan.later == later  # type: ignore[attr-defined]
    assert plan.as_dict()["later"] == later  # type: ignore[attr-defined]
    with Store(Settings(), root=aged) as store:
        prune(store, plan)  # type: ignore[arg-type]
        left = {r.input_hash for r in store.database("completions", "mt-bench", QWEN).query()}
    assert {r.input_hash for r in ahead} <= left  # counted, never deleted


def test_the_pruned_runs_are_those_that_lose_rows_once_every_criterion_applies(aged: Path) -> None:
    """run-1's rows are 20 days old: --older-than 30d spares them, yet it was named among the pruned runs (was)."""
    counts, plan = planned(aged, PruneRule(keep_last_runs=1, older_than=timedelta(days=30)))
    assert plan.pruned_runs == ("run-0",) and counts == {"completions": 4}  # type: ignore[attr-defined]


def test_criteria_combine_with_and(aged: Path) -> None:
    rule = PruneRule(flt=RowFilter(run_id="run-1"), older_than=timedelta(days=10))
    assert pruned(aged, rule, Selector(role="completions")) == {"completions": 4}
    assert remaining(aged)["judgements"] == {"run-1"}  # the selector kept them out
    assert pruned(aged, PruneRule(older_than=timedelta(days=30), keep_last_runs=3)) == {}  # three runs left
    assert pruned(aged, PruneRule(older_than=timedelta(days=30), keep_last_runs=2)) == {"completions": 4}  # run-0


def test_max_size_prunes_the_oldest_rows_until_the_data_fits(aged: Path) -> None:
    _, whole = planned(aged, PruneRule(max_bytes=10**9))
    assert whole.counts == () and whole.size_cutoff is None  # type: ignore[attr-defined]
    data = whole.data_bytes  # type: ignore[attr-defined]
    row = data // 16  # 16 rows of about the same size
    counts, plan = planned(aged, PruneRule(max_bytes=data - 2 * row))
    assert counts == {"completions": 5}  # the 400-day-old row, then the whole oldest chunk (run-0)
    assert plan.freed_bytes >= 2 * row and plan.size_cutoff == NOW - timedelta(days=40, microseconds=-1)  # type: ignore[attr-defined]
    pruned(aged, PruneRule(max_bytes=data - 2 * row))
    _, after = planned(aged, PruneRule(max_bytes=data - 2 * row))
    assert after.data_bytes <= data - 2 * row and after.counts == ()  # type: ignore[attr-defined]


def test_max_size_stops_at_the_chunk_that_makes_the_data_fit_exactly(aged: Path) -> None:
    _, whole = planned(aged, PruneRule(max_bytes=10**9))
    data = whole.data_bytes  # type: ignore[attr-defined]
    counts, fits = planned(aged, PruneRule(max_bytes=data))
    assert counts == {} and fits.size_cutoff is None  # type: ignore[attr-defined]  # the data fits as it is
    _, oldest = planned(aged, PruneRule(max_bytes=data - 1))
    chunk = oldest.freed_bytes  # type: ignore[attr-defined]  # the 400-day-old row alone
    counts, exact = planned(aged, PruneRule(max_bytes=data - chunk))
    assert counts == {"completions": 1} and exact.freed_bytes == chunk  # type: ignore[attr-defined]


def test_a_runs_age_is_its_newest_row_in_any_database(store_root: Path) -> None:
    """run-a wrote 10 days ago in one database and yesterday in another: it is newer than run-b (5 days)."""
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "mt-bench", QWEN).put_many(
            [
                completion_record(1, run_id="run-a", created_at=NOW - timedelta(days=10)),
                completion_record(2, run_id="run-b", created_at=NOW - timedelta(days=5)),
            ]
        )
        store.database("judgements", "arena", JUDGE).put_many(
            [judgement_record(1, run_id="run-a", created_at=NOW - timedelta(days=1))]
        )
    _, plan = planned(store_root, PruneRule(keep_last_runs=1))
    assert plan.kept_runs == ("run-a",) and plan.pruned_runs == ("run-b",)  # type: ignore[attr-defined]


def test_max_size_only_prunes_rows_the_other_criteria_select(aged: Path) -> None:
    counts, _ = planned(aged, PruneRule(max_bytes=0, flt=RowFilter(run_id="run-2")))
    assert counts == {"completions": 4}


def test_max_size_caps_the_selected_databases_whatever_rows_the_filter_picks(aged: Path) -> None:
    """The judgements hold only run-1: a filter on another run must not leave them out of the data capped."""
    _, whole = planned(aged, PruneRule(max_bytes=10**9))
    data = whole.data_bytes  # type: ignore[attr-defined]
    counts, plan = planned(aged, PruneRule(max_bytes=data - 1, flt=RowFilter(run_id="run-2")))
    assert plan.data_bytes == data and counts == {"completions": 4}  # type: ignore[attr-defined]
    _, judged = planned(aged, PruneRule(max_bytes=10**9, flt=RowFilter(judge="judge-1")))
    assert judged.data_bytes == data  # type: ignore[attr-defined]


def test_a_rule_without_a_criterion_is_refused(aged: Path) -> None:
    with pytest.raises(InvalidInputError, match="nothing is pruned that a filter did not select"):
        planned(aged, PruneRule())
    with pytest.raises(InvalidInputError):
        PruneRule(keep_last_runs=-1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("2w", timedelta(weeks=2)),
        ("90m", timedelta(minutes=90)),
        ("1.5d", timedelta(hours=36)),
        (" 45s ", timedelta(seconds=45)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500MB", 500_000_000),
        ("2gb", 2 * 10**9),
        ("1.5GiB", int(1.5 * 2**30)),
        ("200k", 200_000),
        ("1000B", 1000),
        ("10 KiB", 10 * 1024),
        ("7B", 7),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bare", ["20", " 1000 ", "0", "1.5"])
def test_a_size_without_a_unit_is_refused_naming_bytes_and_a_unit(bare: str) -> None:
    """``--max-size 20`` was 20 bytes: the whole store, to a user who meant 20GB."""
    number = bare.strip()
    with pytest.raises(InvalidInputError, match=rf"^'{number}' has no unit: give bytes as {number}B, or a unit"):
        parse_size(bare)


@pytest.mark.parametrize("bad", ["", "30", "3 days", "d", "-1d"])
def test_bad_durations_say_what_to_write(bad: str) -> None:
    with pytest.raises(InvalidInputError, match=r"e\.g\. 30d"):
        parse_duration(bad)


@pytest.mark.parametrize("months", ["6M", " 1M "])
def test_a_capital_m_is_refused_as_months_or_minutes(months: str) -> None:
    """6M, months to pandas and ISO 8601, pruned everything older than 6 minutes (was)."""
    with pytest.raises(InvalidInputError, match=r"ambiguous.*\(90m\).*\(180d\)"):
        parse_duration(months)
    assert parse_duration("6m") == timedelta(minutes=6) and parse_duration("6H") == timedelta(hours=6)


@pytest.mark.parametrize("beyond", ["999999999999d", "999999d", "2000000d"])
def test_a_duration_beyond_the_calendar_is_refused_in_its_own_words(beyond: str) -> None:
    """999999d (2,738 years) is a valid timedelta but no cut-off date: ``--older-than 2000000d`` was refused
    naming PruneRule's field ``older_than``, and 999999999999d with another message."""
    with pytest.raises(
        InvalidInputError, match=rf"^'{beyond}' reaches before the year 1: give at most 7\d\d,\d{{3}} days"
    ):
        parse_duration(beyond)
    with pytest.raises(InvalidInputError, match="before the year 1"):  # the API's own rule holds without parsing
        PruneRule(older_than=timedelta(days=999_999))
    assert PruneRule(older_than=parse_duration("700000d")).older_than == timedelta(days=700_000)


def test_the_command_line_names_the_option_of_a_duration_beyond_the_calendar(aged: Path) -> None:
    before = remaining(aged)
    result = CliRunner().invoke(
        build_app(), ["prune", "--older-than", "2000000d", "--yes"], env={"JUDGESTORE_STORE_ROOT": str(aged)}
    )
    assert result.exit_code == 2 and "--older-than" in result.output and "older_than" not in result.output
    assert remaining(aged) == before  # nothing pruned


@pytest.mark.parametrize("bad", ["", "MB", "5 XB", "1iB", "-3MB", "9" * 400 + "TB"])
def test_bad_sizes_say_what_to_write(bad: str) -> None:
    with pytest.raises(InvalidInputError, match=r"e\.g\. 500MB"):
        parse_size(bad)


def test_a_prune_that_fails_on_a_database_counts_every_run_it_deleted_before(aged: Path) -> None:
    """Two old runs are two filters: the error names every row already deleted, whichever run it was of, and
    each database is one transaction (was: one per run, and only the failing run's deletions were counted)."""
    counts, plan = planned(aged, PruneRule(keep_last_runs=1))
    assert list(counts) == ["completions", "judgements"] and len(plan.filters) == 2  # type: ignore[attr-defined]
    with Store(root=aged) as holder, Store(Settings(busy_timeout_ms=50, lock_retries=1), root=aged) as pruner:
        judgements = holder.database("judgements", "arena", JUDGE)
        with judgements.transaction(), pytest.raises(DatabaseBusyError) as caught:  # a writer holds the last one
            prune(pruner, plan)  # type: ignore[arg-type]
    assert caught.value.rows_deleted == counts["completions"] == 8  # type: ignore[attr-defined]
    (note,) = caught.value.__notes__
    assert "8 rows were deleted from 1 database (" in note and "run the same command again" in note
    assert remaining(aged) == {"completions": {"run-2", None}, "judgements": {"run-1"}}
    assert pruned(aged, PruneRule(keep_last_runs=1)) == {"judgements": 3}  # a rerun finishes
