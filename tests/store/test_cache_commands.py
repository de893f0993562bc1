"""`judgestore stats / prune / vacuum` (and `export`) as a user runs them, in-process through typer's CliRunner."""

from __future__ import annotations

import gc
import json
import os
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from store.cli.app import build_app
from store.runs import record_run
from store.settings import Settings
from store.store import Store
from tests.factories import QWEN, completion_record, file_digests, fill_small_store
from tests.interrupts import NO_READ_LEFT_OPEN, ctrl_c_at_row, ctrl_c_on_call
from tests.store.test_runs import run


def judgestore(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(build_app(), list(args), input=input, env={"COLUMNS": "200"})


@pytest.fixture
def filled(store_root: Path) -> Path:
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        recent = datetime.now(UTC) - timedelta(hours=1)
        database.put_many([completion_record(i, finish_reason="length", created_at=recent, run_id="run-3")
                           for i in range(20, 23)])  # fmt: skip
        record_run(database, run(2, requested=14, duplicates=4))  # two lines asked twice, n=3 on one: 14 slots
    return store_root


def test_stats_shows_rows_tokens_truncation_and_savings(filled: Path) -> None:
    before = file_digests(filled)
    result = judgestore("stats")
    assert result.exit_code == 0, result.output
    assert "Cache in" in result.stdout and QWEN.hash16() in result.stdout
    assert (
        "stored: 13 rows" in result.stdout
        and "3 stopped at a length limit (max_tokens, or the context" in result.stdout
    )
    assert "runs: 1 recorded, 2 hits of 10 distinct inputs asked (20%); saved 200 tokens in and 40 out" in result.stdout
    report = orjson.loads(judgestore("stats", "--json", "--runs", "3").stdout)
    qwen = next(d for d in report["databases"] if d["model"] == "Qwen/Qwen3-8B")
    assert qwen["rows"]["rows"] == 6 and qwen["finish_reasons"] == {"length": 3, "stop": 3}
    assert [r["run_id"] for r in qwen["recent_runs"]] == ["run-2"]
    assert report["totals"]["runs"]["saved_engine_seconds"] == 1.0
    listed = judgestore("stats", "--runs", "3", "--model-id", "Qwen/Qwen3-8B")
    assert "Recent runs" in listed.stdout and "Qwen/Qwen3-8B" in listed.stdout
    assert QWEN.hash16() in listed.stdout.split("Recent runs")[1]  # which descriptor ran: one model has several
    (line,) = [line for line in listed.stdout.splitlines() if " use " in line]
    assert [cell.strip() for cell in line.split("│")[4:8]] == ["use", "10", "2", "8"]  # hits + misses (was: 14)
    none = judgestore("stats", "--runs", "3", "--model-id", "meta-llama/Llama-3.1-8B")  # no run recorded there
    assert "runs: none recorded yet" in none.stdout and "Recent runs" not in none.stdout  # no empty table
    assert file_digests(filled) == before  # read-only


def test_json_reports_hold_totals_past_64_bits_beside_their_dates(store_root: Path) -> None:
    """orjson stops at 2^64: such a report is written by the standard library, dates and all, not a traceback."""
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many([completion_record(i, usage={"prompt_tokens": 2**63 - 1}) for i in range(3)])
        record_run(database, run(1))
    stats = judgestore("stats", "--json")
    assert stats.exit_code == 0, stats.output
    report = json.loads(stats.stdout)  # orjson's own reader stops at 2^64 too
    (database_report,) = report["databases"]
    assert report["totals"]["rows"]["prompt_tokens"] == 3 * (2**63 - 1)
    assert datetime.fromisoformat(database_report["recent_runs"][0]["started_at"]).tzinfo is not None
    pruned = judgestore("prune", "--max-size", "99999999999999999999999999TB", "--dry-run", "--json")
    assert pruned.exit_code == 0, pruned.output
    assert json.loads(pruned.stdout)["rows"] == 0


def test_prune_dry_run_counts_what_the_prune_deletes(filled: Path) -> None:
    before = file_digests(filled)
    dry = judgestore("prune", "--older-than", "30d", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    planned = orjson.loads(dry.stdout)
    assert (planned["rows"], planned["deleted"], planned["dry_run"]) == (10, 0, True)
    assert "Rows to prune (dry run)" in judgestore("prune", "--older-than", "30d", "--dry-run").stdout
    assert file_digests(filled) == before
    refused = judgestore("prune", "--older-than", "30d", input="n\n")
    assert refused.exit_code == 1 and "Prune 10 rows from 3 databases?" in refused.stderr
    assert file_digests(filled) == before
    done = orjson.loads(judgestore("prune", "--older-than", "30d", "--yes", "--json").stdout)
    assert done["deleted"] == planned["rows"]
    assert {d["path"]: d["rows"] for d in done["databases"]} == {d["path"]: d["rows"] for d in planned["databases"]}
    assert orjson.loads(judgestore("stats", "--json").stdout)["totals"]["rows"]["rows"] == 3


def test_prune_keep_last_runs_and_max_size(filled: Path) -> None:
    kept = orjson.loads(judgestore("prune", "--keep-last-runs", "2", "--dry-run", "--json").stdout)
    # run-1 and run-2 both wrote their newest rows on 2026-01-02: the tie goes to the greater run id
    assert kept["kept_runs"] == ["run-3", "run-2"] and kept["pruned_runs"] == ["run-1"] and kept["rows"] == 7
    sized = orjson.loads(judgestore("prune", "--max-size", "1MB", "--dry-run", "--json").stdout)
    assert sized["rows"] == 0 and sized["size_cutoff"] is None and sized["rule"]["max_bytes"] == 1_000_000
    text = judgestore("prune", "--max-size", "1MB", "--dry-run")
    assert "nothing to prune for size" in text.stderr and "nothing to prune" in text.stdout
    assert "still over the cap" not in text.stderr
    # Every option must hold: with a filter that picks few rows, the cap is not reached, and that is said
    capped = judgestore("prune", "--max-size", "10B", "--run-id", "run-3", "--dry-run")
    said = " ".join(capped.stderr.split())
    assert capped.exit_code == 0 and "pruning rows written before" in said and "still over the cap" in said
    cutoff = orjson.loads(judgestore("prune", "--max-size", "10B", "--run-id", "run-3", "--dry-run", "--json").stdout)
    moment = datetime.fromisoformat(cutoff["size_cutoff"])  # the same instant, to the microsecond, in UTC
    assert f"pruning rows written before {moment:%Y-%m-%d %H:%M:%S.%f} UTC" in said, said
    assert "3 rows" in " ".join(capped.stdout.split())


def test_prune_needs_a_criterion_and_valid_values(filled: Path) -> None:
    refused = judgestore("prune", "--role", "completions", "--yes")
    assert refused.exit_code == 1 and "nothing is pruned that a filter did not select" in refused.stderr
    assert judgestore("prune", "--older-than", "soon").exit_code == 2
    assert "e.g. 500MB" in judgestore("prune", "--max-size", "big").stderr


def test_vacuum_reports_each_database(filled: Path) -> None:
    judgestore("prune", "--run-id", "run-3", "--yes")
    result = judgestore("vacuum", "--json")
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert {r["outcome"] for r in report["results"]} == {"vacuumed"} and len(report["results"]) == 3
    assert report["ok"] is True  # as every --json report of a command over databases says (was: no "ok")
    assert "Vacuumed in" in judgestore("vacuum").stdout
    assert orjson.loads(judgestore("stats", "--json").stdout)["totals"]["rows"]["rows"] == 10


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_vacuum_names_the_databases_vacuumed_and_leaves_the_others_as_they_were(
    filled: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Ctrl-C as the second database is about to be vacuumed. (Was: exit 130 and nothing said.)"""
    from store.backends.sqlite import vacuum

    before = file_digests(filled)
    ctrl_c_on_call(monkeypatch, vacuum, "vacuum_database", 2)
    result = judgestore("vacuum", *(["--json"] if json_output else []))
    assert result.exit_code == 130 and result.stdout == ""
    after = file_digests(filled)
    (first,) = [Path(p) for p in after if p.endswith(".db") and before.get(p) != after[p]]  # VACUUM rewrote it
    shown = str(first.relative_to(filled))
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and error["vacuumed"] == [str(first)] and error["databases"] == 3
        assert [(r["outcome"], r["freed"]) for r in error["results"]] == [("vacuumed", error["freed"])]
        said = error["error"]
    else:
        said = " ".join(result.stderr.split())
    assert said.startswith("interrupted; vacuumed 1 of 3 databases (") and f"freed: {shown});" in said
    assert "the other 2 are as they were" in said and "run `judgestore vacuum` again" in said
    assert {p: d for p, d in after.items() if not p.startswith(str(first.parent))} == {
        p: d for p, d in before.items() if not p.startswith(str(first.parent))
    }  # the other databases: not a byte changed
    assert orjson.loads(judgestore("stats", "--json").stdout)["totals"]["rows"]["rows"] == 13  # no row changed


def test_ctrl_c_in_vacuum_before_the_last_database_says_the_other_one_in_the_singular(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: 'the other 1 are as they were'."""
    from store.backends.sqlite import vacuum

    ctrl_c_on_call(monkeypatch, vacuum, "vacuum_database", 3)
    result = judgestore("vacuum")
    assert result.exit_code == 130
    said = " ".join(result.stderr.split())
    assert said.startswith("interrupted; vacuumed 2 of 3 databases (") and "; the other one is as it was (" in said


def test_vacuum_dry_run_checks_each_database_changes_nothing_and_estimates_what_vacuum_gives_back(
    filled: Path,
) -> None:
    with Store(Settings(), root=filled) as store:  # pages' worth of rows, then deleted: free pages to give back
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many([completion_record(i, completion="x" * 3000, run_id="bulky") for i in range(100, 160)])
    assert judgestore("delete", "--run-id", "bulky", "--yes").exit_code == 0
    before = file_digests(filled)
    dry = judgestore("vacuum", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    planned = orjson.loads(dry.stdout)
    assert file_digests(filled) == before  # not a byte changed, WAL included
    assert planned["dry_run"] is True and planned["ok"] is True
    assert {r["outcome"] for r in planned["results"]} == {"would_vacuum"} and len(planned["results"]) == 3
    bulky = max(planned["results"], key=lambda r: r["freed"])
    assert bulky["freed"] > 60 * 3000 / 2  # most of the deleted rows' pages (the rest were in the WAL's frames)
    shown = judgestore("vacuum", "--dry-run")
    assert "Would vacuum in" in shown.stdout and "would vacuum" in shown.stdout and "to free" in shown.stdout
    done = orjson.loads(judgestore("vacuum", "--json").stdout)
    assert done["dry_run"] is False and {r["outcome"] for r in done["results"]} == {"vacuumed"}
    after = {r["path"]: r["bytes_after"] for r in done["results"]}
    for estimate in planned["results"]:  # VACUUM keeps at most the pages in use: the estimate is what it gave back
        assert after[estimate["path"]] <= estimate["bytes_after"]
        assert after[estimate["path"]] >= estimate["bytes_after"] - 4 * 4096


def test_vacuum_dry_run_reports_a_database_vacuum_would_refuse(filled: Path) -> None:
    from tests.factories import hide_a_row_in_a_page

    (damaged,) = [p for p in filled.rglob("*.db") if "judgements" in str(p)][:1]
    hide_a_row_in_a_page(damaged, "judgements")
    before = file_digests(filled)
    dry = judgestore("vacuum", "--dry-run", "--json")
    assert dry.exit_code == 1 and file_digests(filled) == before
    refused = [r for r in orjson.loads(dry.stdout)["results"] if r["outcome"] == "refused"]
    assert [r["path"] for r in refused] == [str(damaged)] and "Not vacuumed" in refused[0]["error"]


def test_ctrl_c_in_vacuum_dry_run_says_nothing_was_changed(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from store.backends.sqlite import vacuum

    before = file_digests(filled)
    ctrl_c_on_call(monkeypatch, vacuum, "vacuum_database", 2)
    result = judgestore("vacuum", "--dry-run", "--json")
    assert result.exit_code == 130 and file_digests(filled) == before
    error = orjson.loads(result.stderr)
    assert error["error"] == "interrupted; checked 1 of 3 databases (dry run: nothing was changed)"
    assert error["dry_run"] is True and [r["outcome"] for r in error["results"]] == ["would_vacuum"]


def test_export_parquet_csv_and_stdout(filled: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    before = file_digests(filled)
    target = tmp_path / "rows.parquet"
    done = judgestore("export", "--format", "parquet", "-o", str(target), "--finish-reason", "length", "--json")
    assert done.exit_code == 0, done.output
    assert orjson.loads(done.stdout) == {"rows": 3, "format": "parquet", "output": str(target)}
    assert pq.read_table(target).column("finish_reason").to_pylist() == ["length"] * 3
    text = judgestore("export", "-f", "jsonl", "--role", "judgements")
    query = judgestore("query", "--format", "jsonl", "--role", "judgements")
    assert text.stdout == query.stdout and len(text.stdout.splitlines()) == 5
    csv_file = tmp_path / "rows.csv"
    judgestore("export", "-f", "csv", "-o", str(csv_file), "--columns", "input_hash,completion")
    assert (
        csv_file.read_text().splitlines()[0] == "input_hash,completion" and len(csv_file.read_text().splitlines()) == 14
    )
    assert judgestore("export", "-f", "parquet").exit_code == 2  # binary: needs a file
    unknown = judgestore("export", "-f", "csv", "--columns", "input_hash,nope")  # a usage error, as query's (was 1)
    assert unknown.exit_code == 2 and "Invalid value for --columns: unknown column(s) ['nope']" in unknown.stderr
    for blank in ("", ", ,"):  # was: "unknown column(s) []"
        none = judgestore("export", "-f", "csv", "--columns", blank)
        assert none.exit_code == 2 and "Invalid value for --columns: no column named" in none.stderr, none.stderr
    twice = tmp_path / "twice.parquet"  # four rows of two asked for, a file pyarrow could not read (was)
    repeated = judgestore("export", "-f", "parquet", "-o", str(twice), "-n", "2", "--columns", "input_hash,input_hash")
    assert repeated.exit_code == 2 and "input_hash named more than once" in repeated.stderr and not twice.exists()
    queried = judgestore("query", "-f", "csv", "-n", "1", "--columns", "completion,input_hash,completion")
    assert queried.exit_code == 2 and "completion named more than once" in queried.stderr  # its header said it twice
    assert file_digests(filled) == before


@pytest.mark.parametrize("existed", [True, False], ids=["replacing", "new"])
def test_an_export_that_fails_midway_says_the_file_was_left_as_it_was_not_that_it_is_incomplete(
    filled: Path, tmp_path: Path, existed: bool
) -> None:
    """The error said the output stopped after N rows and was incomplete, though no file was left (was)."""
    listed = orjson.loads(judgestore("ls", "--json").stdout)
    last = Path(listed[-1]["path"])  # read last: rows of the others were written before it failed
    last.write_bytes(b"this is not a database" * 500)
    target = tmp_path / "rows.jsonl"
    if existed:
        target.write_text("the previous export\n")
    result = judgestore("export", "-f", "jsonl", "-o", str(target))
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert "is not an SQLite database" in said and "incomplete" not in said, said
    assert f"Nothing was written to {target}: " + ("it is as it was." if existed else "not created.") in said
    assert (target.read_text() == "the previous export\n") if existed else not target.exists()


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_an_export_from_a_store_root_that_is_not_there_is_refused_and_the_file_kept(
    tmp_path: Path, json_output: bool
) -> None:
    """A mistyped --store-root exported 0 rows over the previous export, exit 0 (was)."""
    kept = tmp_path / "rows.csv"
    kept.write_text("input_hash,completion\nabc,the previous export\n")
    missing = tmp_path / "judgestore-dta"
    result = judgestore(
        "export", "--store-root", str(missing), "-f", "csv", "-o", str(kept), *(["--json"] if json_output else [])
    )
    assert result.exit_code == 1
    said = orjson.loads(result.stderr)["error"] if json_output else " ".join(result.stderr.split())
    assert f"{missing}: the folder does not exist: there is no store to export" in said
    assert kept.read_text() == "input_hash,completion\nabc,the previous export\n" and not missing.exists()


@NO_READ_LEFT_OPEN
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("existed", [True, False], ids=["replacing", "new"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_ctrl_c_in_an_export_to_a_file_leaves_it_as_it_was_and_says_so(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, existed: bool, json_output: bool
) -> None:
    """The file is written beside its destination and renamed when complete: Ctrl-C leaves no half file that looks
    complete, and says what is there. (Was: exit 130 and nothing said.)"""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    target = tmp_path / "out" / f"rows.{fmt}"
    target.parent.mkdir()
    if existed:
        target.write_bytes(b"the previous export")
    before = file_digests(filled)
    ctrl_c_at_row(monkeypatch, 3)
    result = judgestore("export", "-f", fmt, "-o", str(target), *(["--json"] if json_output else []))
    gc.collect()
    assert result.exit_code == 130 and result.stdout == ""
    assert [p.name for p in target.parent.iterdir()] == ([target.name] if existed else [])  # no temporary file
    if existed:
        assert target.read_bytes() == b"the previous export"
    said = f"interrupted; {target} {'was left as it was' if existed else 'was not created'}: the partial export"
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert error["output"] == str(target) and error["rows_written"] == 0
        assert error["output_state"] == ("unchanged" if existed else "not created")
    else:
        assert said in " ".join(result.stderr.split()) and len(result.stderr.strip().splitlines()) == 1
    assert file_digests(filled) == before


@NO_READ_LEFT_OPEN
@pytest.mark.parametrize(("where", "json_output"), [("stdout", False), ("fifo", False), ("fifo", True)])
def test_ctrl_c_in_an_export_to_stdout_or_a_pipe_says_how_many_rows_it_holds(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, json_output: bool
) -> None:
    """Stdout or a pipe is written in place: it keeps the rows written before Ctrl-C, a JSON array left open.
    (--json needs --output: its summary goes to stdout.)"""
    fifo = tmp_path / "fifo"
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    if where == "fifo":
        os.mkfifo(fifo)
        reader.start()
    ctrl_c_at_row(monkeypatch, 3)
    output = "-" if where == "stdout" else str(fifo)
    result = judgestore("export", "-f", "json", "-o", output, *(["--json"] if json_output else []))
    gc.collect()
    assert result.exit_code == 130
    if where == "fifo":
        reader.join(timeout=60)
        assert result.stdout == "" and stat.S_ISFIFO(fifo.lstat().st_mode)
    written = result.stdout if where == "stdout" else received[0].decode()
    with pytest.raises(orjson.JSONDecodeError):  # never a document that looks complete
        orjson.loads(written)
    assert len(orjson.loads(written + "\n]")) == 2  # the rows before the interrupt are whole
    said = (
        f"interrupted after 2 rows written to {where if where == 'stdout' else fifo} (and perhaps the one being "
        "written as Ctrl-C came): the json output is incomplete"
    )
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert error["rows_written"] == 2 and error["output_state"] == "incomplete" and error["output"] == output
    else:
        assert said in " ".join(result.stderr.split()) and "JSON array is left open" in result.stderr


def test_stats_json_lists_as_many_runs_as_asked(store_root: Path) -> None:
    """--runs N bounds the JSON too; without it the JSON lists the 5 most recent runs."""
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many([completion_record(0)])
        for i in range(7):
            record_run(database, run(i))
    listed = {
        args: [
            r["run_id"]
            for r in orjson.loads(judgestore("stats", "--json", *args).stdout)["databases"][0]["recent_runs"]
        ]
        for args in ((), ("--runs", "2"), ("--runs", "7"), ("--runs", "0"))
    }
    assert len(listed[()]) == 5 and listed[("--runs", "2")] == listed[()][:2]
    assert listed[("--runs", "0")] == []  # 0 asks for none (was: 5, as if not given)
    assert len(listed[("--runs", "7")]) == 7 and listed[("--runs", "7")][:5] == listed[()]
