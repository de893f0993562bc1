"""The `judgestore` data commands, run for real: in-process through typer's CliRunner, and as
`python -m store` (and the `judgestore` console script, once inference/cli/ provides it) in a subprocess.
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import importlib.util
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from store.cli.app import build_app
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError
from store.layout import Selector, walk
from store.repository import Repository
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from store.tables.records import CompletionRecord
from tests.factories import (
    JUDGE,
    LLAMA,
    QWEN,
    SHIPPED_HEAD,
    SYNTHETIC_REVISIONS,
    completion_record,
    file_digests,
    foreign_database,
    left_behind,
)
from tests.faults import damage_page
from tests.interrupts import NO_READ_LEFT_OPEN, ctrl_c_at_row, ctrl_c_on_call
from tests.store.conftest import know_synthetic_revision, location_of

REPO = Path(__file__).resolve().parents[2]  # subprocesses import this checkout's code, not an installed copy

REVISIONS = SYNTHETIC_REVISIONS


def db_path(root: Path, descriptor: ModelDescriptor) -> Path:
    location = next(loc for loc in walk(root) if loc.descriptor_hash16 == descriptor.hash16())
    return location.db_path(root)


def judgestore(*args: str, input: str | None = None) -> Any:
    """Run a command in-process; stdout and stderr are kept apart, tables are wide enough to read."""
    return CliRunner().invoke(build_app(), list(args), input=input, env={"COLUMNS": "200"})


def as_json(text: str) -> Any:
    return orjson.loads(text)


def count_rows(root: Path, flt: RowFilter | None = None, role: str | None = None) -> int:
    with Store(Settings(), root=root, readonly=True) as store:
        return sum(store.open(loc).count(flt) for loc in walk(root) if role in (None, loc.role))


# ---------------------------------------------------------------- ls


def test_ls_json_lists_every_database(filled: Path) -> None:
    result = judgestore("ls", "--json")
    assert result.exit_code == 0, result.output
    listed = {d["model"]: d for d in as_json(result.stdout)}
    assert {m: (d["role"], d["task"], d["rows"], d["state"]) for m, d in listed.items()} == {
        "Qwen/Qwen3-8B": ("completions", "mt-bench", 3, "current"),
        "meta-llama/Llama-3.1-8B": ("completions", "mt-bench", 2, "current"),
        "judge-1": ("judgements", "arena-hard", 5, "current"),
    }
    assert listed["judge-1"]["descriptor"] == JUDGE.hash16()
    assert listed["judge-1"]["size_bytes"] == db_path(filled, JUDGE).stat().st_size
    assert all(d["ok"] is True for d in listed.values())
    assert result.stderr == ""


DAMAGES = {
    "not SQLite": lambda path: path.write_bytes(b"this is not an SQLite file" * 200),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "foreign": lambda path: (path.unlink(), foreign_database(path))[1],
}


def test_the_drivers_warnings_are_shown_as_judgestores_and_its_error_ignored_lines_not_at_all(
    filled: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """psycopg's "error ignored terminating <Pipeline ...>", and the pool's traceback of a Ctrl-C in its close,
    reached stderr bare, beside --json's objects (was): they follow what the command reports. Other warnings are
    warnings like any."""
    import logging

    listed = Store.select

    def select_as_the_driver_warns(self: Store, selector: Any = None) -> Any:
        driver = logging.getLogger("psycopg.pipeline")
        driver.warning("error ignored terminating %r: %s", "<psycopg.Pipeline [INERROR]>", "pipeline aborted")
        driver.warning("unknown PostgreSQL timezone: %r; will use UTC", "Mars/Olympus")
        try:  # the pool's traceback of a Ctrl-C that landed as it closed a connection: the interrupt is reported
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            logging.getLogger("sqlalchemy.pool.impl.QueuePool").error("Exception closing connection", exc_info=True)
        try:  # any other: its exception named, which the traceback carried (the line said only the first part, was)
            raise OSError("server closed the connection unexpectedly")
        except OSError:
            logging.getLogger("sqlalchemy.pool.impl.QueuePool").error("Exception closing connection", exc_info=True)
        return listed(self, selector)

    monkeypatch.setattr(Store, "select", select_as_the_driver_warns)
    result = judgestore("ls", "--json", "--store-root", str(filled))
    assert result.exit_code == 0, result.output
    assert [as_json(line) for line in result.stderr.splitlines()] == [
        {"warning": "unknown PostgreSQL timezone: 'Mars/Olympus'; will use UTC", "type": "LogWarning"},
        {
            "warning": "Exception closing connection (OSError: server closed the connection unexpectedly)",
            "type": "LogWarning",
        },
    ]
    assert as_json(result.stdout)  # the listing itself
    assert not caplog.records  # nor passed on to the process's handlers (Python's last resort prints tracebacks)


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_ls_and_stats_list_a_damaged_database_with_the_good_ones_and_exit_1(filled: Path, kind: str) -> None:
    """A script running `ls --json && ...` learns that one database could not be read; the others are listed."""
    DAMAGES[kind](db_path(filled, QWEN))
    before = file_digests(filled)

    listed = judgestore("ls", "--json")
    assert listed.exit_code == 1 and listed.stderr == "", listed.output  # stderr carries only JSON errors
    found = {d["model"]: (d["rows"], d["ok"], d["error"] is None) for d in as_json(listed.stdout)}
    assert found == {"Qwen/Qwen3-8B": (None, False, False), "meta-llama/Llama-3.1-8B": (2, True, True),
                     "judge-1": (5, True, True)}  # fmt: skip
    table = judgestore("ls")
    assert table.exit_code == 1 and "Traceback" not in table.output
    assert all(h in table.stdout for h in (QWEN.hash16(), LLAMA.hash16(), JUDGE.hash16()))
    assert "3 databases, 7 rows" in table.stdout
    assert "1 of 3 databases could not be read" in table.stderr and "`judgestore db status`" in table.stderr
    assert len(table.stderr.strip().splitlines()) == 1

    stats = judgestore("stats", "--json")
    assert stats.exit_code == 1 and stats.stderr == "", stats.output
    report = as_json(stats.stdout)
    assert report["ok"] is False and report["totals"]["unreadable"] == 1 and report["totals"]["rows"]["rows"] == 7
    by_model = {d["model"]: d for d in report["databases"]}
    assert by_model["Qwen/Qwen3-8B"]["error"] and by_model["judge-1"]["rows"]["rows"] == 5
    stats_table = judgestore("stats")
    assert stats_table.exit_code == 1 and "Traceback" not in stats_table.output
    assert "unreadable" in stats_table.stdout and "3 databases, 7 rows" in stats_table.stdout
    said = " ".join(stats_table.stderr.split())  # was: "the totals leave them out", of a total size counting it
    assert "1 of 3 databases could not be read (their rows, tokens and runs are left out of the totals; their " in said
    assert "`judgestore db status`" in stats_table.stderr
    assert file_digests(filled) == before  # listing a damaged store changes no byte of it


def test_ls_leaves_the_rows_of_a_database_it_could_not_read_out_of_its_total(filled: Path) -> None:
    """A descriptor folder copied by hand under another task (its metadata says otherwise): its rows are listed,
    not counted, as the note says (was: counted, 13 rows)."""
    source = db_path(filled, QWEN).parent
    moved = filled / "completions" / "moved-task" / source.relative_to(filled / "completions" / "mt-bench")
    shutil.copytree(source, moved)
    table = judgestore("ls")
    assert table.exit_code == 1 and "4 databases, 10 rows" in table.stdout, table.output
    said = " ".join(table.stderr.split())
    assert "1 of 4 databases could not be read (see State; their rows are not counted)" in said


def test_stats_exits_1_on_a_damaged_page_that_ls_does_not_read(filled: Path) -> None:
    """ls reads a database's schema and row count (its key index), stats reads its rows: only stats meets a damaged
    table page, and says so (`judgestore verify` reads every page)."""
    damage_page(db_path(filled, QWEN), "completions")
    before = file_digests(filled)
    assert judgestore("ls").exit_code == 0
    stats = judgestore("stats", "--json")
    assert stats.exit_code == 1 and as_json(stats.stdout)["ok"] is False
    assert as_json(stats.stdout)["totals"]["rows"]["rows"] == 7
    assert file_digests(filled) == before


def test_ls_with_row_filters_lists_every_database_when_one_cannot_be_counted(filled: Path) -> None:
    """The filter's count reads the table's pages, which ls's own row count (the key index) never met: the damaged
    database is listed as corrupt, the others with what they match, and ls exits 1."""
    damage_page(db_path(filled, QWEN), "completions")
    before = file_digests(filled)
    listed = judgestore("ls", "--json", "--finish-reason", "length")
    assert listed.exit_code == 1 and listed.stderr == "", listed.output
    found = {d["model"]: (d["state"], d["ok"], d["rows"], d["matching"]) for d in as_json(listed.stdout)}
    assert found == {
        "Qwen/Qwen3-8B": ("corrupt", False, None, None),
        "meta-llama/Llama-3.1-8B": ("current", True, 2, 0),
        "judge-1": ("current", True, 5, 0),
    }
    assert "damaged" in next(d["error"] for d in as_json(listed.stdout) if not d["ok"])
    table = judgestore("ls", "--finish-reason", "length")
    assert table.exit_code == 1 and "Traceback" not in table.output
    assert all(h in table.stdout for h in (QWEN.hash16(), LLAMA.hash16(), JUDGE.hash16()))
    assert "corrupt" in table.stdout and "3 databases, 7 rows (0 matching)" in table.stdout
    assert "1 of 3 databases could not be read" in table.stderr and len(table.stderr.strip().splitlines()) == 1
    assert file_digests(filled) == before


def test_ls_and_stats_of_a_healthy_store_exit_0_and_say_ok(filled: Path) -> None:
    assert judgestore("ls").exit_code == 0
    stats = judgestore("stats", "--json")
    assert stats.exit_code == 0 and as_json(stats.stdout)["ok"] is True
    assert judgestore("stats").exit_code == 0


def test_a_store_whose_path_is_not_utf8_is_copied_listed_and_reported(filled: Path, tmp_path: Path) -> None:
    # Python names a file whose name's bytes are not UTF-8 with lone surrogates (b"\xff" is "\udcff"), which
    # neither a SQLite URI, nor orjson, nor a UTF-8 encoder takes as they are.
    odd_root = tmp_path / os.fsdecode(b"copy-\xff")
    copied = judgestore("copy", "--from-root", str(filled), "--to-root", str(odd_root))
    assert copied.exit_code == 0, copied.output
    for command in (["ls"], ["stats", "--json"], ["db", "status"], ["verify"], ["query", "--model", "judge-1"]):
        result = judgestore(*command, "--store-root", str(odd_root))
        assert result.exit_code == 0 and "Traceback" not in result.output, (command, result.output)
    # JSON holds such a name as \\u escapes of its surrogates (the standard library reads them back; orjson refuses)
    listed = json.loads(judgestore("ls", "--json", "--store-root", str(odd_root)).stdout)
    assert sorted(d["rows"] for d in listed) == [2, 3, 5]
    (filled / "completions" / os.fsdecode(b"t\xff")).mkdir()
    report = judgestore("verify", "--json")
    assert report.exit_code == 1 and "Traceback" not in report.output
    strays = [p["path"] for p in json.loads(report.stdout)["problems"] if p["kind"] == "stray"]
    assert [os.fsencode(path) for path in strays] == [os.fsencode(filled / "completions") + b"/t\xff"]


def test_ls_table_and_selectors(filled: Path) -> None:
    result = judgestore("ls")
    assert result.exit_code == 0
    assert QWEN.hash16() in result.stdout and "current" in result.stdout and "3 databases, 10 rows" in result.stdout
    only = as_json(judgestore("ls", "--json", "--role", "judgements").stdout)
    assert [d["model"] for d in only] == ["judge-1"]
    assert as_json(judgestore("ls", "--json", "--model-id", "Qwen/Qwen3-8B").stdout)[0]["rows"] == 3


def test_store_root_option_wins_over_the_environment(filled: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(filled, moved)
    shutil.rmtree(filled)
    assert as_json(judgestore("ls", "--json").stderr)["path"] == str(filled)  # the environment's: not there
    assert len(as_json(judgestore("ls", "--json", "--store-root", str(moved)).stdout)) == 3


@pytest.mark.parametrize("command", [["ls"], ["stats"], ["db", "status"], ["verify"], ["vacuum"], ["db", "upgrade"]])
def test_a_selector_that_picks_nothing_says_so_not_that_the_store_is_empty(filled: Path, command: list[str]) -> None:
    before = file_digests(filled)
    result = judgestore(*command, "--task", "nope", "--model-id", "Qwen/Qwen3-8B")
    # verify is a check: one that checked nothing (a mistyped --descriptor) passed a `verify --json &&` gate (was)
    assert result.exit_code == (1 if command == ["verify"] else 0), result.output
    assert "No database in" in result.stderr and "matches --task nope --model-id Qwen/Qwen3-8B" in result.stderr
    assert "3 databases in all" in result.stderr and "No databases in" not in result.stderr
    assert file_digests(filled) == before  # nothing was touched


@pytest.mark.parametrize(
    "command", [["query"], ["query", "--format", "jsonl"], ["export", "-f", "jsonl", "-o", "-"], ["delete"]]
)
def test_filters_of_judgements_on_databases_of_completions_only_say_so(filled: Path, command: list[str]) -> None:
    """--judge keeps judgements, --model-id picks a completions database: an empty table and no word (was)."""
    before = file_digests(filled)
    yes = ["--yes"] if command == ["delete"] else []
    result = judgestore(*command, "--model-id", "Qwen/Qwen3-8B", "--judge", "judge-1", *yes)
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "1 database picked, holding only completions; the row filters given match only judgements." in said
    assert file_digests(filled) == before
    matched = judgestore(*command, "--judge", "judge-1", *(["--dry-run"] if yes else []))
    assert matched.exit_code == 0 and "row filters given match" not in matched.stderr  # a judgements database


def test_ls_of_an_empty_root_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = judgestore("ls", "--store-root", str(tmp_path / "empty"))
    assert result.exit_code == 0
    assert f"No databases in {tmp_path / 'empty'}." in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "command",
    [["ls"], ["ls", "--json"], ["verify", "--json"], ["stats"], ["db", "status"], ["query", "--format", "jsonl"],
     ["delete", "--run-id", "r", "--yes"], ["export", "--format", "jsonl", "-o", "-"]],
)  # fmt: skip
def test_a_root_that_is_a_file_is_an_error_not_an_empty_store(tmp_path: Path, command: list[str]) -> None:
    """A mistyped --store-root must not pass a script's check as a healthy empty store (was: exit 0)."""
    (tmp_path / "a-file").write_text("not a store")
    result = judgestore(*command, "--store-root", str(tmp_path / "a-file"))
    assert result.exit_code == 1 and result.stdout == ""
    said = as_json(result.stderr)["error"] if "--json" in command else result.stderr
    assert "a-file: it is a file, not a folder" in " ".join(said.split())
    assert (tmp_path / "a-file").read_text() == "not a store"


def test_a_bad_setting_in_the_environment_is_one_clear_error(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGESTORE_BUSY_TIMEOUT_MS", "soon")
    result = judgestore("ls")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: invalid setting in the environment: JUDGESTORE_BUSY_TIMEOUT_MS")


def test_read_only_commands_write_nothing(filled: Path) -> None:
    before = file_digests(filled)
    for args in (["ls"], ["query", "--format", "jsonl"], ["db", "status"], ["verify"], ["delete", "--judge", "judge-1",
                 "--dry-run"]):  # fmt: skip
        assert judgestore(*args).exit_code == 0, args
    assert file_digests(filled) == before


# ---------------------------------------------------------------- query


def test_query_jsonl_streams_filtered_rows(filled: Path) -> None:
    result = judgestore("query", "--role", "completions", "--model", "qwen", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    rows = [as_json(line) for line in result.stdout.splitlines()]
    assert sorted(r["instruction_id"] for r in rows) == ["0", "1", "2"]
    first = rows[0]
    assert first["role"] == "completions" and first["descriptor"] == QWEN.hash16()
    assert first["descriptor_model"] == "Qwen/Qwen3-8B" and first["model"] == "qwen"
    assert first["input_hash"] == completion_record(int(first["instruction_id"])).input_hash
    assert first["created_at"] == "2026-01-01T00:00:00+00:00"
    assert first["usage"] == {"completion_tokens": 3, "prompt_tokens": 10 + int(first["instruction_id"])}


def test_query_csv_has_a_header_and_one_line_per_row(filled: Path) -> None:
    result = judgestore("query", "--run-id", "run-2", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 3
    assert {"role", "descriptor", "input_hash", "model", "model_a", "judge", "completion"} <= set(rows[0])
    pointwise = next(r for r in rows if r["role"] == "judgements")
    assert pointwise["model_b"] == "" and pointwise["judge"] == "judge-1"
    assert orjson.loads(pointwise["top_logprobs"]) == {"A": -0.1, "B": -2.3}

    narrow = judgestore("query", "--role", "completions", "--format", "csv", "--columns", "input_hash,completion")
    assert narrow.stdout.splitlines()[0] == "input_hash,completion"
    assert len(narrow.stdout.splitlines()) == 6


def test_query_json_is_one_array_and_judgement_filters_pick_judgements(filled: Path) -> None:
    result = judgestore("query", "--json", "--judge", "judge-1", "--pairwise", "--orientation", "reversed")
    assert result.exit_code == 0, result.output
    rows = as_json(result.stdout)
    assert len(rows) == 2
    assert {(r["role"], r["orientation"], r["model_b"]) for r in rows} == {("judgements", "reversed", "model-b")}
    assert as_json(judgestore("query", "--json", "--pointwise").stdout)[0]["instruction_id"] == "7"
    assert as_json(judgestore("query", "--json", "--benchmark", "none-such").stdout) == []


@pytest.mark.parametrize("how", [["--json"], ["--format", "jsonl"]])
def test_query_stopped_by_a_damaged_database_leaves_the_rows_before_it_readable(filled: Path, how: list[str]) -> None:
    damaged = filled / "completions" / "mt-bench" / "vllm" / "zz" / "abcdef0123456789"  # after both completions
    damaged.mkdir(parents=True)
    (damaged / "completions.db").write_bytes(b"")  # and no metadata.json
    result = judgestore("query", *how)
    assert result.exit_code == 1 and "abcdef0123456789" in result.stderr and "Traceback" not in result.output
    assert "stopped after 5 rows and is incomplete" in result.stderr
    text = result.stdout
    if how == ["--json"]:  # the array is left open: an incomplete output never parses as a whole result
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(text)
        text += "\n]"
    rows = as_json(text) if how == ["--json"] else [as_json(line) for line in text.splitlines()]
    assert sorted(r["model"] for r in rows) == ["llama"] * 2 + ["qwen"] * 3  # both completion databases


def test_query_table_shows_control_characters_as_escapes(store_root: Path) -> None:
    """Stored text never drives the terminal: ESC, BEL, CR and the bidirectional controls reach it as visible
    escapes; --json keeps them."""
    hostile = "a\x1b[2J\x1b]0;TITLE\x07b\rc\x9bd"
    reversing = "gpt\u202e4-mini\u2066"  # shown as "gpt" and then "inim-4" (was)
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "mt-bench", QWEN).put_many(
            [completion_record(1, completion=hostile, model=reversing)]
        )
    result = judgestore("query", "--columns", "model,completion")
    assert result.exit_code == 0, result.output
    assert not any(char in result.stdout for char in "\x1b\x07\r\x9b\u202e\u2066")
    assert "a\\x1b[2J\\x1b]0;TITLE\\x07b\\x0dc\\x9bd" in result.stdout
    assert "gpt\\u202e4-mini\\u2066" in result.stdout
    assert as_json(judgestore("query", "--json", "--columns", "completion").stdout) == [{"completion": hostile}]


def test_input_hash_takes_a_whole_hash_in_any_case_and_refuses_a_prefix(filled: Path) -> None:
    """A prefix (tables print 16 digits) matched nothing, silently, and delete said there was nothing to delete."""
    key = as_json(judgestore("query", "--json", "--columns", "input_hash", "--limit", "1").stdout)[0]["input_hash"]
    found = judgestore("query", "--json", "--columns", "input_hash", "--input-hash", key.upper())
    assert found.exit_code == 0 and as_json(found.stdout) == [{"input_hash": key}]
    before = file_digests(filled)
    for command in (["query"], ["delete", "--dry-run"], ["delete", "--yes"]):
        refused = judgestore(*command, "--input-hash", key[:16])
        assert refused.exit_code == 2, refused.output  # a usage error naming its option, as every bad value's
        assert "whole hash (64 hex digits)" in refused.stderr and "--input-hash" in refused.stderr
    assert file_digests(filled) == before


def test_query_time_range_and_limit(filled: Path) -> None:
    def n(*args: str) -> int:
        result = judgestore("query", "--format", "jsonl", *args)
        assert result.exit_code == 0, result.output
        return len(result.stdout.splitlines())

    assert n() == 10
    assert n("--since", "2026-01-02") == 5  # naive means UTC: judgements were written 2026-01-02T00:00Z
    assert n("--until", "2026-01-02") == 5
    assert n("--since", "2026-01-01T23:00:00-02:00") == 0
    assert n("--limit", "4") == 4
    assert n("--model", "model-a", "--limit", "100") == 5


def test_a_limit_met_before_a_damaged_database_is_a_whole_result(filled: Path, tmp_path: Path) -> None:
    """The next database was opened after the limit was met: its damage ended a complete output with exit 1."""
    with Store(Settings(), root=filled) as store:
        first, second, _ = store.locations()
        assert store.open(first).count() >= 3
    DAMAGES["not SQLite"](second.db_path(filled))
    rows = judgestore("query", "--format", "jsonl", "--limit", "3")
    assert rows.exit_code == 0, rows.output
    assert len(rows.stdout.splitlines()) == 3
    exported = judgestore("export", "--format", "jsonl", "--limit", "3", "--output", str(tmp_path / "rows.jsonl"))
    assert exported.exit_code == 0, exported.output
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 3
    assert judgestore("query", "--format", "jsonl").exit_code == 1  # without the limit, the damage is met


@pytest.mark.parametrize("inside", ["database", "beside"])
def test_export_into_the_store_is_refused_and_its_database_kept(filled: Path, inside: str) -> None:
    """`export -o` named one of the store's own databases: it was written over with JSONL, its rows lost; a file
    beside them was left as a stray that verify reported (was)."""
    with Store(Settings(), root=filled, readonly=True) as store:
        location = store.locations()[0]
        rows = store.open(location).count()
    output = location.db_path(filled) if inside == "database" else filled / "rows.jsonl"
    before = file_digests(filled)
    result = judgestore("export", "--format", "jsonl", "--output", str(output))
    assert result.exit_code == 1
    assert "is inside the store's folder" in " ".join(result.output.split())
    assert file_digests(filled) == before and not (filled / "rows.jsonl").exists()
    with Store(Settings(), root=filled, readonly=True) as store:
        assert store.open(location).count() == rows


def test_export_to_a_folder_that_is_not_there_is_refused_before_any_work(filled: Path, tmp_path: Path) -> None:
    """export made the missing folders (and left them when it failed), where every other command refuses."""
    result = judgestore("export", "--format", "jsonl", "--output", str(tmp_path / "new" / "rows.jsonl"))
    assert result.exit_code == 1
    assert f"--output {tmp_path / 'new' / 'rows.jsonl'}: there is no folder" in " ".join(result.output.split())
    assert not (tmp_path / "new").exists()
    (tmp_path / "afile").write_text("kept")
    blocked = judgestore("export", "--format", "jsonl", "--output", str(tmp_path / "afile" / "rows.jsonl"))
    assert blocked.exit_code == 1
    assert f"{tmp_path / 'afile'} is a file, not a folder" in " ".join(blocked.output.split())
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone" / "rows.jsonl")
    dangling = judgestore("export", "--format", "jsonl", "--output", str(tmp_path / "dangling.jsonl"))
    assert dangling.exit_code == 1  # was: "this user may not write in .../gone", of a folder that is not there
    assert f"there is no folder {tmp_path / 'gone'}" in " ".join(dangling.output.split())
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    loop = judgestore("export", "--format", "jsonl", "--output", str(tmp_path / "loop.jsonl"))
    assert loop.exit_code == 1 and "leads back to itself" in loop.output  # was: a RuntimeError traceback


@pytest.mark.parametrize("option", ["--task", "--provider", "--model-id", "--descriptor"])
def test_an_empty_selector_value_is_a_usage_error_naming_its_option(filled: Path, option: str) -> None:
    """`ls --model-id ''` said 'No databases in STORE' of a store holding three; `query --task '' --json` printed []
    and exit 0 (was)."""
    for command in (("ls",), ("query", "--json"), ("delete", "--run-id", "run-1", "--yes")):
        result = judgestore(*command, option, "")
        assert result.exit_code == 2, (command, result.output)
        assert f"{option} is empty" in " ".join(result.output.split())
    assert count_rows(filled) == 10


def test_query_table_shows_rows(filled: Path) -> None:
    result = judgestore("query", "--role", "judgements", "--limit", "2")
    assert result.exit_code == 0
    assert "model_a" in result.stdout and "orientation" in result.stdout and "2 rows" in result.stdout
    assert "[[A]]" in result.stdout  # completions are shown as text, never as rich markup
    assert "judge-1" in judgestore("query", "--role", "judgements", "--columns", "judge,completion").stdout
    asked = judgestore("query", "--role", "judgements", "--limit", "2", "--format", "table", "--json")
    assert asked.exit_code == 0 and "2 rows" in asked.stdout  # --format given wins over --json (was: JSON)
    assert len(as_json(judgestore("query", "--role", "judgements", "--limit", "2", "--json").stdout)) == 2


@NO_READ_LEFT_OPEN
@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_ctrl_c_in_a_query_says_how_many_rows_were_written_and_that_the_output_is_incomplete(
    filled: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, json_output: bool
) -> None:
    """Was: exit 130 and nothing said, a JSON array left open on stdout with no word about it."""
    ctrl_c_at_row(monkeypatch, 3)
    result = judgestore("query", "--format", fmt, *(["--json"] if json_output else []))
    gc.collect()
    assert result.exit_code == 130
    out = result.stdout
    if fmt == "json":
        assert out.startswith("[\n") and not out.rstrip().endswith("]")
        with pytest.raises(orjson.JSONDecodeError):  # never a document that looks complete
            orjson.loads(out)
        written = orjson.loads(out + "\n]")  # the rows before the interrupt are whole
    elif fmt == "jsonl":
        written = [as_json(line) for line in out.splitlines()]
    else:
        written = list(csv.DictReader(io.StringIO(out)))
    assert len(written) == 2 and all(row["input_hash"] for row in written)
    if json_output:
        error = as_json(result.stderr)
        assert error["type"] == "Interrupted" and error["rows_written"] == 2 and error["complete"] is False
        said = error["error"]
    else:
        said = " ".join(result.stderr.split())
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "interrupted after 2 rows written to stdout (and perhaps the one being written as Ctrl-C came)" in said
    assert f"the {fmt} output is incomplete" in said
    assert ("JSON array is left open" in said) == (fmt == "json")


@NO_READ_LEFT_OPEN
def test_ctrl_c_in_a_query_table_says_no_row_was_printed(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl_c_at_row(monkeypatch, 1)
    result = judgestore("query")
    assert result.exit_code == 130 and result.stdout == ""
    assert "interrupted before the table was shown; no row was printed" in result.stderr


def test_tables_fit_an_80_column_terminal(filled: Path, store_root: Path) -> None:
    """(Every command's tables at 80 columns: tests/test_narrow_terminal.py.)"""
    long_model = ModelDescriptor(provider="vllm", model="x" * 120, sampling={"temperature": 0.0})
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "mt-bench", long_model).put_many([completion_record(99, completion="w " * 500)])
    for args in (("ls",), ("query",), ("query", "--role", "judgements")):
        result = CliRunner().invoke(build_app(), list(args), env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        assert all(len(line) <= 80 for line in result.stdout.splitlines()), result.stdout
        long_lines = [line for line in result.stdout.splitlines() if "xxx" in line or "w w w" in line]
        assert all("…" in line for line in long_lines), result.stdout  # shortened, never wrapped
    query = CliRunner().invoke(build_app(), ["query"], env={"COLUMNS": "80"}).stdout
    assert sum("w w w" in line for line in query.splitlines()) == 1  # a completion stays on its row's line


def test_query_usage_errors_exit_2(filled: Path) -> None:
    assert judgestore("query", "--columns", "input_hash,nope").exit_code == 2
    assert judgestore("query", "--since", "last tuesday").exit_code == 2
    assert judgestore("query", "--format", "xml").exit_code == 2
    assert judgestore("query", "--role", "bananas").exit_code == 2
    # Beyond what a SQL LIMIT or the calendar holds: a usage error, not an OverflowError's traceback
    for args in (
        ["--limit", str(2**63)],
        ["--since", "9999-12-31T23:59:59-12:00"],
        ["--until", "0001-01-01T00:00+14:00"],
    ):
        too_far = judgestore("query", *args)
        assert too_far.exit_code == 2 and "Traceback" not in too_far.output and too_far.stdout == "", too_far.output
    not_utf8 = judgestore("query", "--instruction-id", "caf\udce9")  # what Python makes of the bytes caf\xe9
    assert not_utf8.exit_code == 2 and "instruction_id is not valid Unicode text" in not_utf8.stderr
    assert "--instruction-id" in not_utf8.stderr  # a usage error naming its option (was: exit 1)
    adopted = judgestore("query", "--adopted-from", "XYZ")
    assert adopted.exit_code == 2 and "Invalid value for --adopted-from" in " ".join(adopted.stderr.split())


def test_query_contradictory_filters_are_one_clear_error(filled: Path) -> None:
    result = judgestore("query", "--role", "completions", "--judge", "judge-1")
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: filters on judge apply to judgements only, not completions"
    assert result.stdout == ""
    as_error = judgestore("query", "--json", "--role", "completions", "--judge", "judge-1")
    assert as_json(as_error.stderr) == {
        "error": "filters on judge apply to judgements only, not completions",
        "type": "InvalidInputError",
    }
    pairwise = judgestore("delete", "--role", "completions", "--pairwise")  # named as typed (it said "pointwise")
    assert "filters on pointwise/pairwise apply to judgements only" in pairwise.stderr
    exported = judgestore("export", "-f", "csv", "-o", str(filled.parent / "x.csv"), "--role", "completions",
                          "--model-a", "a")  # fmt: skip
    # was: exit 2, "Invalid value for --columns", though no --columns was given
    assert exported.exit_code == 1 and "--columns" not in exported.stderr
    assert exported.stderr.strip() == "Error: filters on model_a apply to judgements only, not completions"
    assert not (filled.parent / "x.csv").exists()


# ---------------------------------------------------------------- delete


def test_delete_dry_run_prints_counts_and_changes_nothing(filled: Path) -> None:
    before = file_digests(filled)
    result = judgestore("delete", "--run-id", "run-2", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result.stdout)
    assert report["dry_run"] is True and report["matched"] == 3 and report["deleted"] == 0
    assert sorted((d["role"], d["rows"]) for d in report["databases"]) == [("completions", 2), ("judgements", 1)]
    assert report["filter"] == {"run_id": "run-2"}
    text = judgestore("delete", "--run-id", "run-2", "--dry-run")
    assert "Rows to delete (dry run)" in text.stdout and "3 rows in 2 databases" in text.stdout
    one = judgestore("delete", "--run-id", "run-2", "--role", "judgements", "--dry-run")
    assert "1 row in 1 database" in one.stdout  # was: "1 rows in 1 databases"
    assert file_digests(filled) == before


def dated_ahead(root: Path) -> CompletionRecord:
    """A row of run-2 written with a time an hour ahead (a clock ahead of this one's), stored in ``root``."""
    ahead = completion_record(30, run_id="run-2", created_at=datetime.now(UTC) + timedelta(hours=1))
    with Store(Settings(), root=root) as writer:
        writer.database("completions", "mt-bench", QWEN).put_many([ahead])
    return ahead


def test_delete_says_how_many_matching_rows_are_dated_after_it_and_a_key_deletes_them(filled: Path) -> None:
    ahead = dated_ahead(filled)
    result = judgestore("delete", "--run-id", "run-2", "--yes")
    assert result.exit_code == 0, result.output
    assert "1 row the filters match is dated after this command began" in " ".join(result.stderr.split())
    assert "Deleted 3 rows" in result.stdout
    report = as_json(judgestore("delete", "--run-id", "run-2", "--yes", "--json").stdout)
    assert (report["matched"], report["later"], report["deleted"]) == (0, 1, 0)
    said = " ".join(judgestore("delete", "--run-id", "run-2", "--yes").stdout.split())
    assert said == "No rows dated before this command began match the filter; nothing to delete."
    report = as_json(judgestore("delete", "--input-hash", ahead.input_hash, "--yes", "--json").stdout)
    assert (report["matched"], report["later"], report["deleted"]) == (1, 0, 1)
    assert count_rows(filled, RowFilter(run_id="run-2")) == 0


def test_prune_says_how_many_matching_rows_are_dated_after_it(filled: Path) -> None:
    """prune left such rows out without a word (was), as delete did."""
    dated_ahead(filled)
    result = judgestore("prune", "--run-id", "run-2", "--yes")
    assert result.exit_code == 0, result.output
    assert "1 row the filters match is dated after this command began" in " ".join(result.stderr.split())
    report = as_json(judgestore("prune", "--run-id", "run-2", "--yes", "--json").stdout)
    assert (report["rows"], report["later"], report["deleted"]) == (0, 1, 0)
    said = " ".join(judgestore("prune", "--run-id", "run-2", "--yes").stdout.split())
    assert said == "No rows dated before this command began match; nothing to prune."
    assert count_rows(filled, RowFilter(run_id="run-2")) == 1


def test_delete_yes_deletes_exactly_the_filtered_rows(filled: Path) -> None:
    result = judgestore("delete", "--model", "model-b", "--orientation", "direct", "--yes", "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result.stdout)
    assert report["matched"] == report["deleted"] == 2
    assert report["databases"][0]["deleted"] == 2
    assert count_rows(filled) == 8
    assert count_rows(filled, RowFilter(orientation="direct"), "judgements") == 0
    assert count_rows(filled, RowFilter(orientation="reversed"), "judgements") == 2


def test_delete_asks_first(filled: Path) -> None:
    before = file_digests(filled)
    refused = judgestore("delete", "--run-id", "run-2", input="n\n")
    assert refused.exit_code == 1
    assert "Delete 3 rows from 2 databases?" in refused.stderr
    assert file_digests(filled) == before
    accepted = judgestore("delete", "--run-id", "run-2", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "Deleted 3 rows from 2 databases." in accepted.stdout
    assert count_rows(filled) == 7 and count_rows(filled, RowFilter(run_id="run-2")) == 0


def test_delete_deletes_what_it_counted_not_rows_a_run_writes_while_it_asks(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of the run written while the prompt waited were deleted with the counted ones (was)."""
    import store.cli.data as data_commands

    asked = data_commands.confirmed
    later: list[Any] = []

    def confirm_while_the_run_writes(*args: Any, **kwargs: Any) -> None:
        later.extend(
            completion_record(i, model="llama", run_id="run-2", created_at=datetime.now(UTC)) for i in (20, 21)
        )
        with Store(Settings(), root=filled) as writer:
            writer.database("completions", "mt-bench", LLAMA).put_many(later)
        asked(*args, **kwargs)

    monkeypatch.setattr(data_commands, "confirmed", confirm_while_the_run_writes)
    result = judgestore("delete", "--run-id", "run-2", "--yes", "--json")
    assert result.exit_code == 0, result.output
    report = as_json(result.stdout)
    assert report["matched"] == report["deleted"] == 3 and report["filter"] == {"run_id": "run-2"}
    with Store(Settings(), root=filled, readonly=True) as reader:
        (location,) = reader.select(Selector(model=LLAMA.model))
        left = {r.input_hash for r in reader.open(location).query()}
    assert left == {r.input_hash for r in later}  # the run's new rows, written after the count, are kept


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_rows_dated_before_the_count_and_committed_after_it_stop_the_delete_of_their_database(
    filled: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """A run's chunk, dated as it began (or by a clock behind this one), committed while the prompt waited: the
    delete took it too, more rows than it had counted and asked about (was)."""
    import store.cli.cache as cache_commands
    import store.cli.data as data_commands

    commands = data_commands if command == "delete" else cache_commands
    asked = commands.confirmed
    earlier = datetime.now(UTC) - timedelta(seconds=30)
    written = [completion_record(i, model="llama", run_id="run-2", created_at=earlier) for i in (20, 21)]

    def confirm_while_a_run_commits(*args: Any, **kwargs: Any) -> None:
        with Store(Settings(), root=filled) as writer:
            writer.database("completions", "mt-bench", LLAMA).put_many(written)
        asked(*args, **kwargs)

    monkeypatch.setattr(commands, "confirmed", confirm_while_a_run_commits)
    options = ["--run-id", "run-2"] if command == "delete" else ["--keep-last-runs", "0"]
    result = judgestore(command, *options, "--yes", "--json")
    assert result.exit_code == 1, result.output
    error = as_json(result.stderr)
    assert error["type"] == "MatchedMeanwhileError" and "nothing was deleted from it" in error["error"], error
    with Store(Settings(), root=filled, readonly=True) as reader:
        (location,) = reader.select(Selector(model=LLAMA.model))
        assert reader.open(location).count(RowFilter(run_id="run-2")) == 4  # its own 2 and the 2 committed


def test_rows_another_process_deleted_meanwhile_do_not_hide_as_many_committed_after_the_count(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows deleted by another process while the prompt waited, one dated before the count committed: fewer
    rows matched than were counted, and the delete took the one it had never counted or shown (was). (Exactly as
    many committed as were deleted still pass: the check compares numbers.)"""
    import store.cli.data as data_commands

    asked = data_commands.confirmed
    earlier = datetime.now(UTC) - timedelta(seconds=30)
    written = [completion_record(20, model="llama", run_id="run-2", created_at=earlier)]

    def confirm_while_others_delete_and_commit(*args: Any, **kwargs: Any) -> None:
        with Store(Settings(), root=filled) as other:
            (location,) = other.select(Selector(model=LLAMA.model))
            database = other.open(location)
            gone = [r.input_hash for r in database.query(RowFilter(run_id="run-2"))][:2]
            assert database.delete(RowFilter(input_hashes=tuple(gone))) == 2
            database.put_many(written)
        asked(*args, **kwargs)

    monkeypatch.setattr(data_commands, "confirmed", confirm_while_others_delete_and_commit)
    result = judgestore("delete", "--run-id", "run-2", "--yes", "--json")
    assert result.exit_code == 1, result.output
    error = as_json(result.stderr)
    assert error["type"] == "MatchedMeanwhileError" and "deleted some of them" in error["error"], error
    with Store(Settings(), root=filled, readonly=True) as reader:
        (location,) = reader.select(Selector(model=LLAMA.model))
        kept = {r.input_hash for r in reader.open(location).query(RowFilter(run_id="run-2"))}
    assert {r.input_hash for r in written} <= kept  # never counted, never shown: kept


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", ["delete", "prune", "stats"])
def test_ctrl_c_while_a_command_reads_says_so_and_changes_nothing(
    filled: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool, command: str
) -> None:
    """Ctrl-C while delete and prune count the rows (a big store takes seconds), or in a command that only reads:
    one line (a JSON object), exit status 130, no row gone. (Was: exit 130 and nothing said.)"""
    ctrl_c_on_call(monkeypatch, Store, "select", 1)
    options = ["--run-id", "run-2", "--yes"] if command != "stats" else []
    result = judgestore(command, *options, *(["--json"] if json_output else []))
    assert result.exit_code == 130 and result.stdout == ""
    said = as_json(result.stderr) if json_output else {"error": result.stderr.strip()}
    assert said["error"] == {"stats": "interrupted"}.get(command, "interrupted while counting; nothing was deleted")
    if json_output:
        assert said["type"] == "Interrupted"
    monkeypatch.undo()
    assert count_rows(filled) == 10


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_ctrl_c_during_a_deletes_commit_counts_the_database_where_it_stands(filled: Path, command: str) -> None:
    """SIGINT while SQLite commits is raised once the commit returned: the second database's row is gone, and
    counted. (Was: 'Before it, 2 rows were deleted', with 3 gone, and the second said to be rolled back.)"""
    from store.backends.sqlite.database import SqliteDatabase

    with pytest.MonkeyPatch.context() as interrupting:
        ctrl_c_on_call(interrupting, SqliteDatabase, "delete", 2, after=True)
        result = judgestore(command, "--run-id", "run-2", "--yes", "--json")
    assert result.exit_code == 130
    assert count_rows(filled, RowFilter(run_id="run-2")) == 0
    error = as_json(result.stderr)
    assert error["rows_deleted"] == 3 and "3 rows were deleted from 2 databases" in error["error"]


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", ["delete", "prune"])
def test_ctrl_c_in_a_delete_says_what_was_deleted_before_it(
    filled: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool, command: str
) -> None:
    """run-2 has 2 rows in a completions database, then 1 in the judgements one: Ctrl-C lands in the second,
    after its DELETE ran and before it committed. (prune: the same rows, chosen by a row filter.)"""
    real_delete = Repository.delete
    calls = []

    def delete_then_ctrl_c(self: Repository, flt: RowFilter) -> int:
        calls.append(self.role)
        deleted = real_delete(self, flt)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return deleted

    monkeypatch.setattr(Repository, "delete", delete_then_ctrl_c)
    result = judgestore(command, "--run-id", "run-2", "--yes", *(["--json"] if json_output else []))
    assert result.exit_code == 130 and calls == ["completions", "judgements"]
    said = "Before it, 2 rows were deleted from 1 database "  # was: nothing at all, exit 130
    if json_output:
        error = as_json(result.stderr)
        assert error["type"] == "Interrupted" and error["rows_deleted"] == 2 and said in error["error"]
        assert result.stdout == ""
    else:
        assert said in " ".join(result.stderr.split()) and "run the same command again" in result.stderr
    assert count_rows(filled, RowFilter(run_id="run-2"), "completions") == 0
    assert count_rows(filled, RowFilter(run_id="run-2"), "judgements") == 1  # rolled back


@pytest.mark.parametrize("command", ["delete", "prune"])
def test_ctrl_c_as_the_store_closes_after_every_delete_says_they_were_done(
    filled: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The signal landed in the store's close, the deletes committed: "interrupted", with no rows_deleted, and
    "nothing was deleted" said of 3 rows gone (was)."""
    real_close = Store.close

    def close_then_ctrl_c(self: Store) -> None:
        real_close(self)
        if not self.readonly:  # the store that deleted (the plan's count reads a read-only one)
            raise KeyboardInterrupt

    monkeypatch.setattr(Store, "close", close_then_ctrl_c)
    result = judgestore(command, "--run-id", "run-2", "--yes", "--json")
    assert result.exit_code == 130 and result.stdout == ""
    error = as_json(result.stderr)
    assert error["type"] == "Interrupted" and error["rows_deleted"] == 3, error
    assert "Before it, 3 rows were deleted from 2 databases: every planned delete was done" in error["error"]
    monkeypatch.undo()
    assert count_rows(filled, RowFilter(run_id="run-2")) == 0


@pytest.mark.parametrize(
    "command", [("delete", "--run-id", "run-2"), ("prune", "--older-than", "30d")], ids=["delete", "prune"]
)
def test_json_never_asks_it_needs_yes(filled: Path, command: tuple[str, ...]) -> None:
    """A prompt would put its text on stdout, which carries only the JSON document, and no script answers it."""
    before = file_digests(filled)
    refused = judgestore(*command, "--json", input="y\n")
    assert refused.exit_code == 1 and refused.stdout == ""
    error = as_json(refused.stderr)
    assert error["type"] == "InvalidInputError" and "pass --yes" in error["error"]
    assert file_digests(filled) == before
    done = judgestore(*command, "--json", "--yes")
    assert done.exit_code == 0 and as_json(done.stdout)["deleted"] > 0


@pytest.mark.parametrize(
    "command",
    [
        ("ls",), ("stats",), ("db", "status"), ("query",),
        ("query", "--format", "jsonl"), ("export", "--format", "csv", "-o", "rows.csv"),
        ("delete", "--run-id", "r", "--yes"), ("prune", "--run-id", "r", "--yes"),
    ],
    ids=lambda command: "-".join(command[:2]),
)  # fmt: skip
def test_a_store_that_is_not_there_is_an_error_not_an_empty_result(tmp_path: Path, command: tuple[str, ...]) -> None:
    """A mistyped --store-root is not 'nothing matched': `query --json` printed [] and exit 0, so a script went on
    with no rows (was, for every command that reads a store but verify, export to a file, copy and browse)."""
    missing = tmp_path / "no-such-store"
    for json_output in ((), ("--json",)):
        result = judgestore(*command, *json_output, "--store-root", str(missing))
        assert result.exit_code == 1, result.output
        said = as_json(result.stderr)["error"] if json_output else " ".join(result.stderr.split())
        assert f"{missing}: the folder does not exist: there is no store to" in said and "--store-root" in said
        assert result.stdout == ""
    assert not missing.exists()


@pytest.mark.parametrize("command", [("db", "upgrade"), ("vacuum",)])
def test_maintenance_of_a_store_that_is_not_there_has_nothing_to_do(tmp_path: Path, command: tuple[str, ...]) -> None:
    """Run on every node before a job (a fresh one included), they stay idempotent: exit 0, nothing made."""
    missing = tmp_path / "no-such-store"
    result = judgestore(*command, "--store-root", str(missing))
    assert result.exit_code == 0, result.output
    assert f"No databases in {missing} (the folder does not exist)." in " ".join(result.stderr.split())
    assert not missing.exists()


def test_verify_of_a_store_that_is_not_there_fails(tmp_path: Path) -> None:
    """A mistyped --store-root passed verify ("No databases", exit 0): a check that scripts gate on must fail."""
    missing = tmp_path / "no-such-store"
    result = judgestore("verify", "--store-root", str(missing), "--json")
    assert result.exit_code == 1 and result.stdout == ""
    error = as_json(result.stderr)
    assert error["type"] == "StoreMissingError" and "there is no store to verify" in error["error"]
    assert not missing.exists()
    missing.mkdir()  # a store with nothing in it yet has nothing wrong
    empty = judgestore("verify", "--store-root", str(missing), "--json")
    assert empty.exit_code == 0 and as_json(empty.stdout)["ok"] is True, empty.output


def test_no_rows_because_the_filters_together_matched_none_says_nothing_more(filled: Path) -> None:
    result = judgestore("query", "--format", "jsonl", "--run-id", "run-2", "--model", "qwen")  # each value is held
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_delete_refuses_an_empty_row_filter(filled: Path) -> None:
    before = file_digests(filled)
    for args in ([], ["--role", "completions", "--task", "mt-bench"], ["--model-id", "judge-1", "--provider", "vllm"]):
        result = judgestore("delete", "--yes", *args)
        assert result.exit_code == 1
        assert "refusing to delete with an empty filter" in result.stderr
        assert "only choose databases" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    said = " ".join(result.stderr.split())
    assert "RowFilter" not in said and "created_after" not in said  # the command line's words, not Python's
    options = {
        name
        for param in typer.main.get_command(build_app()).commands["delete"].params  # type: ignore[attr-defined]
        for name in param.opts
        if param.name in {f.name for f in dataclasses.fields(RowFilter)} | {"since", "until", "input_hash",
                                                                           "finish_reason", "created_by"}
    }  # fmt: skip
    assert options and all(option in said for option in options), options
    as_error = as_json(judgestore("delete", "--yes", "--json", "--role", "judgements").stderr)
    assert as_error["type"] == "EmptyFilterError"
    assert "--run-id" in as_error["error"] and "RowFilter" not in as_error["error"]  # the API's words (was)
    assert file_digests(filled) == before


def test_truncated_rows_are_counted_by_ls_and_deleted_by_finish_reason(filled: Path) -> None:
    with Store(Settings(), root=filled) as store:
        store.database("completions", "mt-bench", QWEN).put_many(
            [completion_record(i, model="qwen", finish_reason="length") for i in range(20, 24)]
        )
    listed = {d["model"]: d for d in as_json(judgestore("ls", "--json", "--finish-reason", "length").stdout)}
    assert {m: (d["rows"], d["matching"]) for m, d in listed.items()} == {
        "Qwen/Qwen3-8B": (7, 4),
        "meta-llama/Llama-3.1-8B": (2, 0),
        "judge-1": (5, 0),
    }
    assert "Matching" in judgestore("ls", "--finish-reason", "length").stdout
    assert "matching" not in as_json(judgestore("ls", "--json").stdout)[0]
    deleted = as_json(judgestore("delete", "--finish-reason", "length", "--yes", "--json").stdout)
    assert deleted["deleted"] == 4 and deleted["filter"] == {"finish_reasons": ["length"]}
    assert count_rows(filled) == 10
    assert as_json(judgestore("query", "--empty", "--json").stdout) == []
    assert len(as_json(judgestore("query", "--no-error", "--non-empty", "--json").stdout)) == 10


def test_delete_with_nothing_matching(filled: Path) -> None:
    result = judgestore("delete", "--benchmark", "none-such", "--yes")
    assert result.exit_code == 0 and "nothing to delete" in result.stdout
    assert as_json(judgestore("delete", "--benchmark", "none-such", "--json").stdout)["matched"] == 0


@pytest.mark.parametrize(
    ("command", "options", "said"),
    [
        ("delete", ["--model", "/models/llama", "--yes"], "--model '/models/llama'; did you mean 'llama'?"),
        ("query", ["--model", "lama"], "--model 'lama'; did you mean 'llama'?"),
        ("query", ["--benchmark", "MT-bench"], "--benchmark 'MT-bench'; did you mean 'mt-bench'?"),
        ("query", ["--run-id", "RUN-2"], "--run-id 'RUN-2'; did you mean 'run-2'?"),  # short: case and - aside
        ("delete", ["--judge", "zzz", "--yes"], "--judge 'zzz' (they hold 'judge-1')."),
        ("query", ["--model", "llama", "--run-id", "nope"], "--run-id 'nope' (they hold 'run-1', 'run-2')."),
    ],
)
def test_a_filter_value_no_row_holds_is_named_with_the_one_meant(
    filled: Path, command: str, options: list[str], said: str
) -> None:
    """A mistyped value, or the model's path where rows record its name: "nothing to delete", exit 0, and the
    rows meant to go stayed to be served as hits (was)."""
    result = judgestore(command, *options)
    assert result.exit_code == 0 and count_rows(filled) == 10
    assert f"No row here has {said}" in " ".join(result.stderr.split()), result.stderr
    both = judgestore("query", "--model", "llama", "--benchmark", "nope").stderr
    assert "--benchmark 'nope'" in both and "--model" not in both  # only the value no row holds is named


# ---------------------------------------------------------------- db status / upgrade


def test_db_status_of_a_current_store(filled: Path) -> None:
    result = judgestore("db", "status", "--json")
    assert result.exit_code == 0
    status = as_json(result.stdout)
    assert status["ok"] is True and status["head"] == SHIPPED_HEAD
    assert {d["state"] for d in status["databases"]} == {"current"}
    text = judgestore("db", "status")
    assert text.exit_code == 0
    assert text.stderr.strip() == "All 3 databases are usable; none needs `judgestore db upgrade`."


def _break(filled: Path) -> tuple[Path, Path]:
    """Put a not-SQLite file and another tool's database at two descriptor database paths."""
    garbage, foreign = db_path(filled, QWEN), db_path(filled, LLAMA)
    garbage.write_bytes(b"this is not an SQLite file" * 200)
    foreign.unlink()
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("INSERT INTO alembic_version VALUES ('abc123')")
    conn.close()
    return garbage, foreign


def test_db_status_and_upgrade_refuse_bad_files_untouched(filled: Path) -> None:
    garbage, foreign = _break(filled)
    before = file_digests(filled)

    status = judgestore("db", "status")
    assert status.exit_code == 1
    assert "not-a-database" in status.stdout and "foreign" in status.stdout
    assert "2 of 3 databases need attention" in status.stderr
    states = {d["path"]: d for d in as_json(judgestore("db", "status", "--json").stdout)["databases"]}
    assert states[str(garbage)]["state"] == "not-a-database"
    assert str(garbage) in states[str(garbage)]["error"]
    assert states[str(foreign)]["state"] == "foreign" and "alembic_version" in states[str(foreign)]["error"]

    upgrade = judgestore("db", "upgrade", "--json")
    assert upgrade.exit_code == 1
    results = {r["path"]: r for r in as_json(upgrade.stdout)["results"]}
    assert results[str(garbage)]["outcome"] == "refused"
    assert "not an SQLite database" in results[str(garbage)]["error"]
    assert results[str(foreign)]["outcome"] == "refused"
    assert results[str(db_path(filled, JUDGE))]["outcome"] == "up-to-date"
    assert judgestore("db", "upgrade").exit_code == 1
    assert file_digests(filled) == before


def test_db_status_names_a_newer_database(filled: Path) -> None:
    with sqlite3.connect(db_path(filled, JUDGE)) as conn:
        conn.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
    conn.close()
    result = judgestore("db", "status", "--json")
    assert result.exit_code == 1
    ahead = next(d for d in as_json(result.stdout)["databases"] if d["state"] == "ahead")
    assert ahead["revision"] == "9999" and "Upgrade the library (in its clone" in ahead["error"]
    refused = as_json(judgestore("db", "upgrade", "--json").stdout)["results"]
    assert [r["outcome"] for r in refused].count("refused") == 1


def test_db_upgrade_brings_behind_databases_to_head_once(filled: Path, synthetic_head: str) -> None:
    status = judgestore("db", "status")
    assert status.exit_code == 1
    assert "behind" in status.stdout and "judgestore db upgrade" in status.stderr

    first = judgestore("db", "upgrade", "--json")
    assert first.exit_code == 0, first.output
    results = as_json(first.stdout)["results"]
    assert [(r["outcome"], r["from_revision"], r["to_revision"]) for r in results] == [
        ("upgraded", SHIPPED_HEAD, synthetic_head)
    ] * 3
    assert all(Path(r["backup"]).exists() for r in results)

    second = judgestore("db", "upgrade")
    assert second.exit_code == 0 and "3 up-to-date" in second.stdout
    assert judgestore("db", "status").exit_code == 0
    assert count_rows(filled) == 10


def test_db_upgrade_dry_run_checks_each_database_as_an_upgrade_does_and_changes_nothing(
    filled: Path, synthetic_head: str
) -> None:
    before = file_digests(filled)
    dry = judgestore("db", "upgrade", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    report = as_json(dry.stdout)
    assert report["dry_run"] is True and report["ok"] is True
    assert [(r["outcome"], r["from_revision"], r["to_revision"], r["backup"]) for r in report["results"]] == [
        ("would_upgrade", SHIPPED_HEAD, synthetic_head, None)
    ] * 3
    assert sum(sum(r["rows"].values()) for r in report["results"]) == 10  # every table's rows: the store's 10
    text = judgestore("db", "upgrade", "--dry-run")
    assert text.exit_code == 0 and "dry run: nothing changed" in text.stdout and "3 would upgrade" in text.stdout
    damage_page(db_path(filled, QWEN), "completions")  # a real upgrade refuses it: so does its dry run
    damaged = file_digests(filled)
    refused = judgestore("db", "upgrade", "--dry-run", "--json")
    assert refused.exit_code == 1
    by_path = {r["path"]: r for r in as_json(refused.stdout)["results"]}
    assert by_path[str(db_path(filled, QWEN))]["outcome"] == "refused"
    assert "damaged" in by_path[str(db_path(filled, QWEN))]["error"]
    assert file_digests(filled) == damaged and damaged != before
    assert not list(filled.rglob("*.bak-*"))  # no backup made
    assert [r["outcome"] for r in as_json(judgestore("db", "upgrade", "--json").stdout)["results"]].count(
        "upgraded"
    ) == 2  # the real run does what the dry run said


def test_db_upgrade_counts_rows_as_ls_does_and_a_recorded_run_beside_them(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of 5 answers and 1 recorded run said "6 rows kept" (was); a real upgrade said nothing of rows."""
    from store.runs import record_run
    from tests.store.test_runs import run

    with Store(Settings(), root=filled) as store:
        record_run(store.open(location_of(filled, QWEN)), run(1))
        rows = store.open(location_of(filled, QWEN)).count()
    know_synthetic_revision(monkeypatch)

    for args in (("--dry-run",), ()):
        text = judgestore("db", "upgrade", *args)
        assert text.exit_code == 0, text.output
        said = " ".join(text.stdout.split())
        assert f"{rows:,} rows kept (1 in runs)" in said
        assert "restored" not in said  # a success said its file was restored from its backup (was)
    assert f"{rows:,} rows kept (1 in runs); backup: completions/" in said, said


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_db_upgrade_says_how_many_were_upgraded_and_rolls_back_the_one_it_stopped_in(
    filled: Path, synthetic_head: str, json_output: bool
) -> None:
    """Ctrl-C just after the second database's migration ran, before it committed. (Was: exit 130, silent.)"""
    from store.backends.sqlite import upgrade

    with pytest.MonkeyPatch.context() as interrupting:
        migrated = ctrl_c_on_call(interrupting, upgrade, "migrate", 2, after=True)
        result = judgestore("db", "upgrade", *(["--json"] if json_output else []))
    assert result.exit_code == 130 and len(migrated) == 2 and result.stdout == ""
    said = "interrupted; upgraded 1 of 3 databases: the one it stopped in is still at its revision"
    if json_output:
        error = as_json(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert (error["upgraded"], error["databases"]) == (1, 3)
        assert [r["outcome"] for r in error["results"]] == ["upgraded"]
    else:
        assert said in " ".join(result.stderr.split()) and "run `judgestore db upgrade` again" in result.stderr
        # and where the upgraded one's backup is (nothing said it: a rerun then made another of the one stopped in)
        assert "Each upgraded file's backup is beside it (1 backup" in " ".join(result.stderr.split())
    states = [d["state"] for d in as_json(judgestore("db", "status", "--json").stdout)["databases"]]
    assert sorted(states) == ["behind", "behind", "current"]  # the second one's migration did not stay
    again = as_json(judgestore("db", "upgrade", "--json").stdout)["results"]
    assert sorted(r["outcome"] for r in again) == ["up-to-date", "upgraded", "upgraded"]
    assert count_rows(filled) == 10


def test_ctrl_c_while_db_upgrade_copies_a_backup_leaves_no_temporary_file(filled: Path, synthetic_head: str) -> None:
    """Ctrl-C lands as the first backup's copy ends, before it is renamed: the temporary copy goes with it (was:
    left beside the database, a stray that made `judgestore verify` exit 1), and the database is as it was."""
    from store.backends.sqlite import upgrade
    from store.layout import BACKUP_TEMP_PREFIX

    before = file_digests(filled)
    with pytest.MonkeyPatch.context() as interrupting:
        copied = ctrl_c_on_call(interrupting, upgrade.shutil, "copy2", 1, after=True)
        result = judgestore("db", "upgrade")
    assert result.exit_code == 130 and len(copied) == 1
    assert "interrupted; upgraded 0 of 3 databases" in " ".join(result.stderr.split())
    assert [p for p in filled.rglob("*") if p.name.startswith(BACKUP_TEMP_PREFIX)] == []
    assert file_digests(filled) == before
    problems = as_json(judgestore("verify", "--json").stdout)["problems"]
    assert {p["kind"] for p in problems} == {"schema"}, problems  # behind, as before; no stray


def test_ctrl_c_during_a_migrations_commit_counts_the_database_it_upgraded(filled: Path, synthetic_head: str) -> None:
    """SIGINT while SQLite commits is raised once the commit returned (here: just after): that database is at
    head, and counted. (Was: 'upgraded 1 ... rolled back', with 2 at head.)"""
    from store.backends.sqlite import upgrade

    with pytest.MonkeyPatch.context() as interrupting:
        ctrl_c_on_call(interrupting, upgrade, "_upgrade_locked", 2, after=True)  # the second one, committed
        result = judgestore("db", "upgrade", "--json")
    assert result.exit_code == 130
    states = sorted(d["state"] for d in as_json(judgestore("db", "status", "--json").stdout)["databases"])
    error = as_json(result.stderr)
    assert (states, error["upgraded"]) == (["behind", "current", "current"], 2), error
    assert "upgraded 2 of 3 databases: the one it stopped in is at head" in error["error"]


def test_ctrl_c_while_db_upgrade_looks_at_a_current_database_counts_no_upgrade(filled: Path) -> None:
    """Every database already current; Ctrl-C as the second is looked at. (Was: 'upgraded 1 of 3 ... its commit
    had finished', since the one it stopped in is current, as it was before.)"""
    from store.backends.sqlite import upgrade

    with pytest.MonkeyPatch.context() as interrupting:
        looked = ctrl_c_on_call(interrupting, upgrade, "database_info", 2)
        result = judgestore("db", "upgrade", "--json")
    assert result.exit_code == 130 and len(looked) == 2
    error = as_json(result.stderr)
    assert error["upgraded"] == 0 and "upgraded 0 of 3 databases" in error["error"], error
    assert [r["outcome"] for r in error["results"]] == ["up-to-date"]


def test_db_upgrade_no_backup(filled: Path, synthetic_head: str) -> None:
    result = judgestore("db", "upgrade", "--no-backup", "--role", "judgements", "--json")
    assert result.exit_code == 0, result.output
    [only] = as_json(result.stdout)["results"]
    assert only["outcome"] == "upgraded" and only["backup"] is None
    assert not list(db_path(filled, JUDGE).parent.glob("*.bak-*"))


def test_a_command_on_a_behind_database_says_what_to_run(filled: Path, synthetic_head: str) -> None:
    result = judgestore("query", "--role", "completions")
    assert result.exit_code == 1
    assert "judgestore db upgrade" in result.stderr and "Traceback" not in result.output
    as_json_error = judgestore("query", "--json")
    error = as_json(as_json_error.stderr)
    assert error["type"] == "SchemaBehindError" and error["path"].endswith(".db")
    assert as_json_error.stdout == ""  # no half-written JSON array


def test_behind_databases_under_auto_upgrade_read_only_commands_say_they_never_upgrade(
    filled: Path, synthetic_head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With JUDGESTORE_AUTO_UPGRADE set, ls, stats and query (read-only) still find the databases behind: their
    messages must not send the user to set what is already set."""
    monkeypatch.setenv("JUDGESTORE_AUTO_UPGRADE", "1")
    before = file_digests(filled)
    listed = judgestore("ls")
    assert listed.exit_code == 1 and "3 of 3 databases could not be read" in listed.stderr
    assert "`db upgrade` if behind" in listed.stderr
    stats = judgestore("stats")
    assert stats.exit_code == 1 and "3 of 3 databases could not be read" in stats.stderr
    query = judgestore("query", "--role", "completions")
    for said in (stats.stderr, query.stderr):
        assert "judgestore db upgrade" in said and "which never upgrades, though JUDGESTORE_AUTO_UPGRADE is set" in said
    assert file_digests(filled) == before


@pytest.mark.parametrize("command", [["delete", "--run-id", "run-2"], ["prune", "--run-id", "run-2"]])
def test_delete_and_prune_under_auto_upgrade_upgrade_the_behind_databases_first(
    filled: Path, synthetic_head: str, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Their error sends the user to JUDGESTORE_AUTO_UPGRADE=1, so with it they upgrade and delete (was: they
    planned on a read-only store, which never upgrades, and said the same again). A dry run writes nothing."""
    monkeypatch.setenv("JUDGESTORE_AUTO_UPGRADE", "1")
    before = file_digests(filled)
    dry = judgestore(*command, "--dry-run")
    said = " ".join(dry.stderr.split())
    assert dry.exit_code == 1 and "judgestore db upgrade" in said and "a dry run that only reads" in said
    assert file_digests(filled) == before
    result = judgestore(*command, "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert as_json(result.stdout)["deleted"] == 3
    # Each file upgraded, and its backup, is named (nothing was said: a store doubled in size silently)
    said = [orjson.loads(line) for line in result.stderr.splitlines()]
    upgraded = [line["warning"] for line in said if line.get("type") == "AutoUpgradeWarning"]
    assert len(upgraded) == 3 and all("as it was opened" in w and ".bak-" in w for w in upgraded), said
    states = {d["state"] for d in as_json(judgestore("db", "status", "--json").stdout)["databases"]}
    assert states == {"current"}
    assert count_rows(filled) == 7 and count_rows(filled, RowFilter(run_id="run-2")) == 0


def test_a_newer_library_reports_behind_databases_whatever_an_older_one_catalogued(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The older library catalogues the store: distinct values that rule every database out, and statistics.
    nobody = judgestore("query", "--model", "nobody", "--format", "jsonl")
    assert nobody.exit_code == 0 and nobody.stdout == "", nobody.output
    assert judgestore("stats", "--json").exit_code == 0
    know_synthetic_revision(monkeypatch)  # the library is upgraded; the files and the catalog are unchanged
    narrowed = judgestore("query", "--model", "nobody", "--format", "jsonl")
    assert narrowed.exit_code == 1 and "judgestore db upgrade" in narrowed.stderr, narrowed.output
    stats = judgestore("stats", "--json")
    assert "older than this library" in stats.output, stats.output


def test_a_lock_that_is_gone_is_not_reported_from_the_catalog(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database locked past the busy timeout is unreadable then, and readable once the lock is released: that
    changes nothing of the file, so the catalog kept "unreadable" against its stamp (was: ls and db status said so
    until the file changed)."""
    path = next(filled.rglob("completions.db"))
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("PRAGMA journal_mode=delete")  # in WAL an exclusive lock still lets readers in
        holder.execute("BEGIN EXCLUSIVE")
        monkeypatch.setenv("JUDGESTORE_BUSY_TIMEOUT_MS", "50")
        locked = judgestore("ls", "--json")
        assert locked.exit_code == 1 and "unreadable" in {d["state"] for d in json.loads(locked.stdout)}
        holder.execute("ROLLBACK")
    for command in (("ls", "--json"), ("db", "status", "--json")):
        released = judgestore(*command)
        assert released.exit_code == 0, released.output
        listed = json.loads(released.stdout)
        states = {d["state"] for d in (listed if isinstance(listed, list) else listed["databases"])}
        assert states <= {"current", "empty"}, (command, states)


# ---------------------------------------------------------------- verify


def test_verify_of_a_selector_that_picks_nothing_fails_as_a_check_that_checked_nothing(filled: Path) -> None:
    refused = judgestore("verify", "--descriptor", "ffff", "--json")
    assert refused.exit_code == 1 and refused.stdout == ""
    error = as_json(refused.stderr)
    assert error["type"] == "InvalidInputError" and "matches --descriptor ffff" in error["error"]
    assert "nothing was checked" in error["error"]


def test_verify_a_clean_store(filled: Path) -> None:
    result = judgestore("verify")
    assert result.exit_code == 0
    assert "3 databases, 10 rows, no problems" in result.stdout
    report = as_json(judgestore("verify", "--json").stdout)
    assert report == {"ok": True, "databases": 3, "rows_checked": 10, "rows_adopted": 0, "problems": []}


def test_verify_detects_a_tampered_row(filled: Path) -> None:
    path = db_path(filled, QWEN)
    victim = completion_record(2).input_hash
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE completions SET input_text = replace(input_text, '2', '3') WHERE input_hash = ?", (victim,)
        )
    conn.close()
    result = judgestore("verify", "--json")
    assert result.exit_code == 1
    [problem] = as_json(result.stdout)["problems"]
    assert problem["kind"] == "input-hash" and problem["path"] == str(path) and victim in problem["message"]
    text = judgestore("verify")
    assert text.exit_code == 1 and "input-hash" in text.stdout and "1 problem;" in text.stdout


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_verify_says_how_many_databases_were_checked(
    filled: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Ctrl-C while the second database is verified: the first was checked, with what it showed; the other two
    were not. (Was: exit 130 and nothing said.)"""
    path = db_path(filled, QWEN)  # listed first: its problem was found before the interrupt
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE completions SET input_text = 'tampered' WHERE input_hash = ?",
                     (completion_record(2).input_hash,))  # fmt: skip
    before = file_digests(filled)
    checked = ctrl_c_on_call(monkeypatch, Store, "verify", 2)
    result = judgestore("verify", *(["--json"] if json_output else []))
    assert result.exit_code == 130 and len(checked) == 2 and result.stdout == ""
    assert checked[0] is not None
    said = "interrupted; checked 1 of 3 databases (3 rows, 1 problem) and left 2 unchecked"
    if json_output:
        error = as_json(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert (error["databases_checked"], error["databases"], error["rows_checked"]) == (1, 3, 3)
        assert [problem["kind"] for problem in error["problems"]] == ["input-hash"]
    else:
        assert said in " ".join(result.stderr.split()) and "run `judgestore verify` again" in result.stderr
    assert file_digests(filled) == before  # read-only


def test_verify_detects_metadata_that_does_not_match_its_folder(filled: Path) -> None:
    meta = db_path(filled, JUDGE).parent / "metadata.json"
    meta.write_bytes(meta.read_bytes().replace(b'"judge-1"', b'"judge-2"'))
    result = judgestore("verify", "--json")
    assert result.exit_code == 1
    [problem] = as_json(result.stdout)["problems"]
    assert problem["kind"] == "metadata" and problem["path"] == str(meta)
    assert "folder is named" in problem["message"]


def test_verify_lists_bad_files_and_strays(filled: Path) -> None:
    garbage, foreign = _break(filled)
    (filled / "judgements" / "arena-hard" / "notes.txt").write_text("mine")
    before = file_digests(filled)
    result = judgestore("verify", "--json")
    assert result.exit_code == 1
    problems = {(p["path"], p["kind"]) for p in as_json(result.stdout)["problems"]}
    assert problems == {
        (str(garbage), "file"),
        (str(foreign), "schema"),
        (str(filled / "judgements" / "arena-hard" / "notes.txt"), "stray"),
    }
    assert judgestore("verify", "--role", "judgements").exit_code == 0  # a selector leaves strays out
    assert file_digests(filled) == before


def test_verify_with_a_selector_names_a_picked_folder_whose_database_is_missing(filled: Path) -> None:
    judge = location_of(filled, JUDGE)
    judge.db_path(filled).unlink()
    left_behind(judge.folder(filled))
    before = file_digests(filled)
    result = judgestore("verify", "--model-id", judge.model, "--json")
    assert result.exit_code == 1
    [problem] = as_json(result.stdout)["problems"]
    assert problem["path"] == str(judge.folder(filled)) and problem["kind"] == "stray"
    assert "descriptor folder without judgements.db" in problem["message"]
    assert judgestore("verify", "--model-id", "Qwen/Qwen3-8B").exit_code == 0  # another folder's gap is not its
    assert file_digests(filled) == before


# ---------------------------------------------------------------- the real process


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store", *args], capture_output=True, text=True, cwd=cwd, env=os.environ, timeout=120
    )


def test_a_choice_misspelled_is_said_in_plain_words(filled: Path, tmp_path: Path) -> None:
    """typer checks a choice with pydantic, whose "Value error, " came first: "Invalid value for '--role': Value
    error, 'bogus' is not one of ..." (was)."""
    before = file_digests(filled)
    for extra in ([], ["--json"]):
        refused = run("delete", "--role", "bogus", "--run-id", "run-2", "--yes", *extra, cwd=tmp_path)
        assert refused.returncode == 2 and "Value error" not in refused.stderr, refused.stderr
        assert "Invalid value for '--role': 'bogus' is not one of 'completions', 'judgements'." in refused.stderr
    assert file_digests(filled) == before


def test_python_m_store_lists_and_queries(filled: Path, tmp_path: Path) -> None:
    listed = run("ls", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert sum(d["rows"] for d in as_json(listed.stdout)) == 10
    rows = run("query", "--format", "jsonl", "--judge", "judge-1", cwd=tmp_path)
    assert rows.returncode == 0, rows.stderr
    assert len(rows.stdout.splitlines()) == 5
    helped = run("--help", cwd=tmp_path)
    assert helped.returncode == 0
    for command in ("ls", "query", "delete", "verify", "db"):
        assert command in helped.stdout


def test_python_m_store_on_bad_input_exits_1_without_a_traceback(filled: Path, tmp_path: Path) -> None:
    garbage, _ = _break(filled)
    before = file_digests(filled)
    status = run("db", "status", cwd=tmp_path)
    assert status.returncode == 1
    assert "need attention" in status.stderr and "Traceback" not in status.stderr
    query = run("query", "--role", "completions", "--json", cwd=tmp_path)
    assert query.returncode == 1 and "Traceback" not in query.stderr and query.stdout == ""
    error = as_json(query.stderr)
    assert error["path"] in (str(garbage), str(db_path(filled, LLAMA)))
    deleted = run("delete", "--yes", "--role", "completions", cwd=tmp_path)
    assert deleted.returncode == 1 and "empty filter" in deleted.stderr
    assert file_digests(filled) == before


def test_python_m_store_delete_and_verify(filled: Path, tmp_path: Path) -> None:
    deleted = run("delete", "--run-id", "run-2", "--yes", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert count_rows(filled) == 7
    assert run("verify", cwd=tmp_path).returncode == 0


def test_an_empty_store_folder_is_refused_not_taken_for_the_working_directory(filled: Path, tmp_path: Path) -> None:
    """`--store-root "$UNSET"` made the working directory the store: generate scattered databases there (was)."""
    work = tmp_path / "work"
    work.mkdir()
    for args in (["ls", "--store-root", ""], ["copy", "--from-root", str(filled), "--to-root", " "]):
        refused = run(*args, "--json", cwd=work)
        assert refused.returncode == 2, refused.stderr  # a usage error, as every value wrong wherever it runs
        error = orjson.loads(refused.stderr)
        assert error["type"] == "BadParameter" and "is empty: give the store's folder" in error["error"]
    assert list(work.iterdir()) == []
    assert run("ls", "--store-root", ".", cwd=filled).returncode == 0  # '.' is still this folder


def test_an_empty_store_url_or_shared_folder_is_refused_not_taken_for_the_folder_store(
    filled: Path, tmp_path: Path
) -> None:
    """`--store-url ""` silently meant the folder store (a copy wrote into ./judgestore-data), and `hub --dir ""`
    the working directory as the remote (was)."""
    work = tmp_path / "work"
    work.mkdir()
    for args, said in [
        (["ls", "--store-url", ""], "'--store-url': is empty"),
        (["copy", "--from-root", str(filled), "--to-url", ""], "'--to-url': is empty"),
        (["copy", "--from-url", " ", "--to-root", "x"], "'--from-url': is empty"),
        (["hub", "push", "--all", "--store-root", str(filled), "--dir", ""], "'--dir': is empty"),
    ]:
        refused = run(*args, "--json", cwd=work)
        assert refused.returncode == 2, refused.stderr
        error = orjson.loads(refused.stderr)
        assert error["type"] == "BadParameter" and said in error["error"], error
    assert list(work.iterdir()) == []
    with pytest.raises(InvalidInputError, match="URL is empty"):
        Store(Settings(), url="")
    with pytest.raises(InvalidInputError, match="folder is empty"):
        Store(Settings(), root="")


def test_a_tilde_after_an_equals_sign_is_the_home_folder(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell expands ~ in `--store-root ~/x` but not in `--store-root=~/x`: a folder named "~" was made."""
    home = tmp_path / "home"
    shutil.copytree(filled, home / "evals")
    monkeypatch.setenv("HOME", str(home))
    listed = run("ls", "--store-root=~/evals", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert len(orjson.loads(listed.stdout)) == 3 and not (tmp_path / "~").exists()


def test_export_to_dev_stdout_on_a_pipe_writes_the_rows_and_json_there_is_refused(filled: Path, tmp_path: Path) -> None:
    """/dev/stdout on a pipe resolves to no path: the export failed, "No such file or directory" (was); with --json
    its summary would land among the rows, as `-o -` with --json is refused for."""
    args = ("export", "--format", "jsonl", "-o", "/dev/stdout", "--store-root", str(filled))
    piped = run(*args, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert len([orjson.loads(line) for line in piped.stdout.splitlines()]) == 10
    refused = run(*args, "--json", cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert "--json prints a summary on stdout" in orjson.loads(refused.stderr)["error"]


def test_a_command_line_click_refuses_is_one_json_object_after_json(tmp_path: Path) -> None:
    """A script passing --json reads errors as JSON on stderr; an unknown option or a bad value was click's text."""
    for args, said in ((["ls", "--bogus"], "No such option: --bogus"), (["query", "--limit", "abc"], "'--limit'")):
        as_json_error = run(*args, "--json", cwd=tmp_path)
        assert (as_json_error.returncode, as_json_error.stdout) == (2, "")
        error = orjson.loads(as_json_error.stderr)
        assert said in error["error"] and error["type"] in ("NoSuchOption", "BadParameter"), error
        text = run(*args, cwd=tmp_path)  # without --json: click's usage line, hint and error, as before
        assert text.returncode == 2 and text.stderr.startswith(f"Usage: judgestore {args[0]} [OPTIONS]")
        assert f"Error: {error['error']}" in text.stderr
    assert run("ls", "--help", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("command", ["query", "export"])
def test_a_reader_that_stops_early_is_no_error(store_root: Path, tmp_path: Path, command: str) -> None:
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "big", QWEN).put_many([completion_record(i) for i in range(5000)])
    piped = subprocess.run(  # pipefail: the exit status is judgestore's
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m store {command} --format jsonl | head -n 1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=os.environ,
        timeout=120,
    )
    assert len(piped.stdout.splitlines()) == 1
    assert piped.returncode == 0 and piped.stderr == ""


@pytest.mark.parametrize("command", ["query", "export"])
def test_a_stdout_that_cannot_be_written_is_said_to_be_stdout_not_the_store(
    filled: Path, tmp_path: Path, command: str
) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "store", command, "--format", "jsonl"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=os.environ,
            timeout=120,
        )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == "Error: stdout: could not write the rows: No space left on device\n"


def this_checkout(*args: str, stdout: Any = subprocess.PIPE, closing: int | None = None) -> Any:
    """``python -m store`` of this checkout (never an installed copy), stderr captured; ``closing``: a file
    descriptor (0 stdin, 1 stdout) the command starts with closed, as `<&-` or `>&-` leave it."""
    return subprocess.run(
        [sys.executable, "-m", "store", *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=None if closing is None else lambda: os.close(closing),
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["ls", "--json"],
        ["stats"],
        ["verify", "--json"],
        ["db", "status"],
        ["query"],
        ["stats", "--json"],
        ["delete", "--run-id", "run-2", "--dry-run"],
    ],
)
def test_every_command_says_a_full_stdout_is_stdout_not_the_store(filled: Path, args: list[str]) -> None:
    before = file_digests(filled)
    with open("/dev/full", "w") as full:
        result = this_checkout(*args, stdout=full)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    said = "stdout: could not write the output: No space left on device"  # was: "the disk is full" of the store
    if "--json" in args:
        assert as_json(result.stderr) == {"error": said, "type": "OutputWriteError"}
    else:
        assert result.stderr == f"Error: {said}\n"
    assert file_digests(filled) == before


@pytest.mark.parametrize(
    ("args", "deleted", "databases"),
    [
        (["delete", "--run-id", "run-2", "--yes", "--json"], 3, 2),
        (["prune", "--older-than", "30d", "--yes", "--json"], 10, 3),
    ],
)
def test_a_delete_whose_report_stdout_refuses_says_what_it_deleted(
    filled: Path, args: list[str], deleted: int, databases: int
) -> None:
    """The rows were deleted, then the report could not be written: the error said only that (a script reading it
    would think nothing was deleted)."""
    with Store(Settings(), root=filled, readonly=True) as store:
        before = sum(store.open(location).count() for location in store.locations())
    with open("/dev/full", "w") as full:
        result = this_checkout(*args, stdout=full)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    error = as_json(result.stderr)
    assert error["type"] == "OutputWriteError" and error["rows_deleted"] == deleted
    assert error["notes"] == [
        f"Before it, {deleted} rows were deleted from {databases} databases: every planned delete was done, only "
        "its report was lost."
    ]
    with Store(Settings(), root=filled, readonly=True) as store:
        assert sum(store.open(location).count() for location in store.locations()) == before - deleted


@pytest.mark.parametrize("args", [["ls"], ["query", "--json"], ["delete", "--run-id", "run-2", "--yes"]])
def test_a_closed_stdout_is_refused_before_the_command_does_anything(filled: Path, args: list[str]) -> None:
    before = file_digests(filled)
    result = this_checkout(*args, stdout=None, closing=1)  # Python starts with sys.stdout None
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    said = "stdout: could not write the output: it is closed; give the command a stdout"
    assert len(result.stderr.splitlines()) == 1 and said in result.stderr
    if "--json" in args:
        assert as_json(result.stderr)["type"] == "OutputWriteError"
    assert file_digests(filled) == before and count_rows(filled) == 10


@pytest.mark.parametrize("args", [["delete", "--run-id", "run-2"], ["prune", "--keep-last-runs", "1"]])
def test_a_closed_stdin_cannot_confirm_and_nothing_is_deleted(filled: Path, args: list[str]) -> None:
    before = file_digests(filled)
    result = this_checkout(*args, closing=0)  # `<&-`: Python starts with sys.stdin None
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "Error: cannot ask for confirmation: stdin is closed; pass --yes to go ahead, or --dry-run"
    )
    assert file_digests(filled) == before and count_rows(filled) == 10


def test_a_copy_whose_filters_pick_nothing_names_them_and_what_the_store_holds(filled: Path, tmp_path: Path) -> None:
    """A mistyped --task said "no databases in STORE match", as of an empty store (was)."""
    result = judgestore("copy", "--from-root", str(filled), "--to-root", str(tmp_path / "to"), "--task", "Mt-Bench")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "matches --task Mt-Bench (3 databases in all; `judgestore ls` lists them): nothing to copy." in said
    assert not (tmp_path / "to").exists() or not list((tmp_path / "to").rglob("*.sqlite"))


def test_a_json_error_naming_a_path_that_is_not_utf8_is_still_json(filled: Path, tmp_path: Path) -> None:
    missing = tmp_path / os.fsdecode(b"caf\xe9")  # a Latin-1 name: Python holds the byte as a lone surrogate
    before = file_digests(filled)
    result = judgestore("copy", "--from-root", str(missing), "--to-root", str(tmp_path / "to"), "--json")
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    error = json.loads(result.stderr)  # was: TypeError (orjson refuses lone surrogates) and a traceback
    assert error["type"] == "StoreMissingError" and error["path"] == str(missing)
    assert not (tmp_path / "to").exists() and file_digests(filled) == before


@pytest.mark.skipif(importlib.util.find_spec("inference.cli") is None, reason="inference/cli/ does not exist yet")
def test_the_judgestore_console_script(filled: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("judgestore")
    result = subprocess.run([str(script), "ls", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(as_json(result.stdout)) == 3


def test_python_m_store_and_judgestore_offer_the_same_store_commands(tmp_path: Path) -> None:
    def commands(*argv: str) -> set[str]:
        result = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                                env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)})  # fmt: skip
        assert result.returncode == 0, result.stderr
        listed = result.stdout.split("Commands:")[1].splitlines()  # the section after Options
        return {line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("   ")}

    store_only = commands(sys.executable, "-m", "store")
    everything = commands(str(Path(sys.executable).with_name("judgestore")))
    assert store_only == {"ls", "query", "delete", "db", "verify", "stats", "prune", "vacuum", "export", "hub", "copy",
                          "browse"}  # fmt: skip
    assert everything == store_only | {"generate", "judge", "pairs", "import", "explain", "audit", "adopt"}


@pytest.mark.parametrize("command", [["delete", "--run-id", "run-2"], ["prune", "--keep-last-runs", "0"]])
def test_ctrl_c_at_the_confirmation_is_an_interrupt_that_changed_nothing(
    filled: Path, tmp_path: Path, command: list[str]
) -> None:
    """It was click's "Aborted!", exit status 1, as a "no" is (was)."""
    before = file_digests(filled)
    asking = subprocess.Popen(
        [sys.executable, "-m", "store", *command], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert asking.stderr is not None
    said = b""
    while not said.rstrip().endswith(b"[y/N]:"):  # the question, then nothing: it waits for the answer
        said += asking.stderr.read(1) or pytest.fail(f"it never asked: {said!r}")
    asking.send_signal(signal.SIGINT)
    _, rest = asking.communicate(timeout=60)
    assert asking.returncode == 130, said + rest
    assert b"interrupted at the question; nothing was changed" in rest and b"Aborted" not in rest
    assert file_digests(filled) == before
    no = judgestore(*command, input="n\n")
    assert no.exit_code == 1 and "Aborted!" in no.stderr and file_digests(filled) == before


def test_a_store_of_one_database_is_counted_in_the_singular(store_root: Path) -> None:
    """Was: "1 databases", "All 1 databases are usable; none needs"."""
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(0)])
    vacuumed = judgestore("vacuum")
    assert vacuumed.exit_code == 0, vacuumed.output
    assert "1 database," in vacuumed.stdout and "1 databases" not in vacuumed.stdout
    status = judgestore("db", "status")
    assert status.stderr.strip() == "The database is usable; it does not need `judgestore db upgrade`."
    verified = judgestore("verify")
    assert "OK: 1 database, 1 row, no problems." in verified.stdout
    stats = judgestore("stats")
    assert "1 database, 1 row," in " ".join(stats.stdout.split())
    listed = judgestore("ls")
    assert "1 database, 1 row," in " ".join(listed.stdout.split())


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_stdout_whose_encoding_lacks_a_character_shows_its_escape_not_a_traceback(
    store_root: Path, tmp_path: Path, encoding: str
) -> None:
    """`PYTHONIOENCODING=latin-1 judgestore ls` ended in UnicodeEncodeError's traceback (was)."""
    model = ModelDescriptor(provider="vllm", model="mod\u00e8le\u2013x")
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", model).put_many([completion_record(0)])
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    listed = subprocess.run([sys.executable, "-m", "store", "ls"], capture_output=True, cwd=tmp_path, env=env,
                            timeout=120, check=False)  # fmt: skip
    assert listed.returncode == 0 and b"Traceback" not in listed.stderr, listed.stderr
    assert b"\\u2013x" in listed.stdout  # the dash the encoding lacks, as its escape
    assert ("mod\u00e8le".encode(encoding) if encoding == "latin-1" else b"mod\\u00e8le") in listed.stdout


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["delete", "--instruction-id", "0", "--instruction-id", "1", "--yes"], "--instruction-id"),
        (["delete", "--model", "qwen", "--model=llama", "--yes"], "--model"),
        (["delete", "--empty", "--non-empty", "--task", "mt-bench", "--yes"], "--empty' / '--non-empty"),
        (["prune", "--older-than", "90d", "--older-than", "1d", "--yes"], "--older-than"),  # prune's rules too
        (["delete", "--task", "mt-bench", "--task", "arena-hard", "--benchmark", "mt-bench", "--yes"], "--task"),
        (["query", "--instruction-id", "0", "--instruction-id", "1"], "--instruction-id"),
    ],
)
def test_a_filter_given_twice_is_a_usage_error_and_nothing_is_deleted(
    filled: Path, args: list[str], option: str
) -> None:
    """click kept the last value: `delete --instruction-id 0 --instruction-id 1` deleted the rows of 1 alone, exit
    0 (was)."""
    before = file_digests(filled)
    refused = judgestore(*args)
    assert refused.exit_code == 2, refused.output
    said = "give one of them, not both" if "' / '" in option else "given 2 times; it takes one value"
    assert f"Invalid value for '{option}': {said}" in refused.stderr
    assert file_digests(filled) == before and refused.stdout == ""


def test_a_repeatable_filter_and_a_plain_flag_may_repeat(filled: Path) -> None:
    with Store(Settings(), root=filled, readonly=True) as store:
        key = next(iter(store.open(store.locations()[0]).query())).input_hash
    twice = judgestore("query", "--input-hash", key, "--input-hash", key, "--json", "--json", "--non-empty",
                       "--non-empty")  # fmt: skip
    assert twice.exit_code == 0, twice.output
    assert [row["input_hash"] for row in orjson.loads(twice.stdout)] == [key]
    helped = judgestore("query", "--task", "a", "--task", "b", "--help")  # was: the refusal, not the help
    assert helped.exit_code == 0 and "Usage: judgestore query" in helped.stdout


def test_the_given_once_check_reads_the_options_as_click_parses_them(filled: Path) -> None:
    """`--help` given as an option's value turned the check off, and a flag's name given as another option's value
    counted as that flag (`--model --non-empty --empty --empty` was refused as both flags) (was)."""
    before = file_digests(filled)
    refused = judgestore("delete", "--model", "--help", "--model", "qwen", "--yes")
    assert refused.exit_code == 2 and "Invalid value for '--model': given 2 times" in refused.stderr, refused.output
    assert file_digests(filled) == before
    for value in (["--model", "--non-empty"], ["--model=--non-empty"]):
        named = judgestore("query", *value, "--empty", "--empty", "--json")
        assert named.exit_code == 0, named.output
        assert orjson.loads(named.stdout) == []  # no row's model is "--non-empty"
    both = judgestore("query", "--model", "qwen", "--empty", "--non-empty")
    assert both.exit_code == 2 and "give one of them, not both" in both.stderr
