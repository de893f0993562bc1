"""`judgestore generate / judge --provider ...`: a server's model behind the cache boundary, from the command line."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select
from typer.testing import CliRunner, Result

from inference.cli.app import app
from inference.cli.generate import register
from store import Run, Settings, Store
from store.cli.app import build_app
from tests.conftest import OPENAI_KEY
from tests.factories import file_digests
from tests.fake_openai import FakeOpenAI, Fault
from tests.faults import immutable

pytest.importorskip("openai", reason="the hosted backend needs the openai client (pip install 'openai>=1.50')")


def judgestore(*args: str) -> Result:
    return CliRunner().invoke(build_app(register), list(args), env={"COLUMNS": "200"})


def generate(openai_server: FakeOpenAI, chat_prompts: Path, out: Path, *extra: str) -> Result:
    return judgestore(
        "generate", "--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
        "--api-key-env", "JUDGE_KEY", "--task", "t", "-i", str(chat_prompts), "-o", str(out), *extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--sampling", "temperature=hot"), "invalid sampling settings: temperature: Input should be a valid number, "
         "unable to parse string as a number (got 'hot')"),
        (("--model", "caf\udce9"), "invalid descriptor for hosted model 'caf\\udce9': model: Input should be a valid "
         "string, unable to parse raw data as a unicode string (got 'caf\\udce9')"),
        # one would silently win over the other, whatever the order (was: --sampling's)
        (("--temperature", "0.2", "--sampling", "temperature=0.7", "--seed", "5", "--sampling", "seed=4"),
         "--temperature and --sampling temperature= both given; --seed and --sampling seed= both given: pass each "
         "setting once"),
    ],
    ids=["sampling", "model", "flag-and-sampling"],
)  # fmt: skip
def test_a_value_pydantic_refuses_is_one_line_and_nothing_is_sent(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path, extra: tuple[str, str], said: str
) -> None:
    result = generate(openai_server, chat_prompts, tmp_path / "out.jsonl", *extra)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.stderr == f"Error: {said}\n"  # was: pydantic's several lines and its link
    assert openai_server.completions() == [] and not store_root.exists() and not (tmp_path / "out.jsonl").exists()


def test_a_rerun_sends_nothing_and_the_summary_counts_what_was_sent(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    first = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--json", "--top-logprobs", "2")
    assert first.exit_code == 0, first.output
    summary: dict[str, Any] = orjson.loads(first.stdout)
    assert (summary["misses"], summary["rows_written"], summary["requests_sent"]) == (5, 5, 5)
    assert summary["completion_tokens"] > 0 and len(openai_server.completions()) == 5

    again = generate(openai_server, chat_prompts, tmp_path / "b.jsonl", "--json", "--top-logprobs", "2")
    assert again.exit_code == 0, again.output
    assert (
        orjson.loads(again.stdout)["requests_sent"] == 0 and len(openai_server.completions()) == 5
    )  # zero HTTP requests
    first_rows = [orjson.loads(line) for line in (tmp_path / "a.jsonl").read_bytes().splitlines()]
    second_rows = [orjson.loads(line) for line in (tmp_path / "b.jsonl").read_bytes().splitlines()]
    assert [r["completion"] for r in first_rows] == [r["completion"] for r in second_rows]
    assert all(r["top_logprobs"]["positions"][0]["candidates"] for r in second_rows)

    human = generate(openai_server, chat_prompts, tmp_path / "c.jsonl", "--top-logprobs", "2")
    assert "5 hits (100%)" in human.stderr and "client opened: no; sent 0 requests (0 retries)" in human.stderr
    for output in (first.output, again.output, human.output):
        assert OPENAI_KEY not in output
    assert not any(OPENAI_KEY.encode() in (store_root / name).read_bytes() for name in file_digests(store_root))


def test_an_output_inside_the_store_is_refused_and_its_database_kept(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """`generate -o` naming the store's own database wrote the results over it: its rows lost, ls said
    not-a-database (was)."""
    assert generate(openai_server, chat_prompts, tmp_path / "out.jsonl").exit_code == 0
    (database,) = store_root.rglob("completions.db")
    before, sent = file_digests(store_root), len(openai_server.completions())
    for output in (database, store_root / "results.jsonl"):
        refused = generate(openai_server, chat_prompts, output)
        assert refused.exit_code == 1 and "inside the store's folder" in " ".join(refused.stderr.split())
    assert file_digests(store_root) == before and len(openai_server.completions()) == sent


def test_engine_options_and_server_options_do_not_mix(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path
) -> None:
    mixed = generate(openai_server, chat_prompts, tmp_path / "o.jsonl", "--engine-arg", "dtype=float32")
    assert mixed.exit_code == 1 and "--engine-arg applies to the in-process engine" in mixed.stderr
    orphan = judgestore(
        "generate", "--model", "m", "--base-url", openai_server.base_url, "--task", "t", "-i", str(chat_prompts)
    )
    assert orphan.exit_code == 1 and "--base-url needs --provider" in orphan.stderr
    both = judgestore(
        "generate", "--model", "m", "--base-url", openai_server.base_url, "--api-key-env", "K", "--task", "t",
        "-i", str(chat_prompts),
    )  # fmt: skip
    assert both.exit_code == 1 and "--base-url, --api-key-env need --provider" in both.stderr
    negative = judgestore("generate", "--model", "m", "--temperature", "-1", "--task", "t", "-i", str(chat_prompts))
    assert negative.exit_code == 2 and "--temperature" in negative.stderr  # refused before vLLM was loaded (was)
    assert openai_server.completions() == []


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # a usage error (exit 2), as -1 is: was exit 1, from the descriptor's check
        (["--temperature", "nan"], "must be a finite number, 0 or more"),
        (["--sampling", "top_p=inf"], "top_p"),
        (["--temperature", "inf"], "must be a finite number, 0 or more"),
        (["--max-tokens", "-5"], "--max-tokens"),
        (["--top-logprobs", "-1"], "--top-logprobs"),
    ],
)
def test_a_sampling_value_no_server_takes_is_refused_before_anything_is_sent_or_written(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path, options: list[str], said: str
) -> None:
    # NaN and infinities would be written into the descriptor as null: two runs at different temperatures would
    # share one key (and the descriptor file would not read back).
    refused = generate(openai_server, chat_prompts, tmp_path / "o.jsonl", *options)
    assert refused.exit_code in (1, 2) and said in refused.stderr and "Traceback" not in refused.output
    assert refused.exit_code == 2 or options[0] != "--temperature"
    assert openai_server.completions() == [] and not store_root.exists()


def test_an_output_file_that_cannot_be_written_is_refused_before_anything_is_sent(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    nowhere = generate(openai_server, chat_prompts, tmp_path / "no-such-folder" / "o.jsonl")
    assert nowhere.exit_code == 1 and "there is no folder" in nowhere.stderr
    a_folder = generate(openai_server, chat_prompts, tmp_path)
    assert a_folder.exit_code == 1 and "is a folder, not a file" in a_folder.stderr
    assert openai_server.completions() == [] and not store_root.exists()


def test_an_output_that_is_the_input_is_refused_before_anything_is_sent(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """Writing the results over the prompts would lose them."""
    prompts = chat_prompts.read_bytes()
    link = tmp_path / "same.jsonl"
    link.symlink_to(chat_prompts)
    for out in (chat_prompts, link):
        refused = generate(openai_server, chat_prompts, out)
        assert refused.exit_code == 1 and "is the input file" in refused.stderr, refused.output
    paired = judgestore("pairs", "--prompts", str(chat_prompts), "--answers", str(chat_prompts), "-o", str(link))
    assert paired.exit_code == 1 and "is the input file" in paired.stderr
    assert chat_prompts.read_bytes() == prompts and openai_server.completions() == [] and not store_root.exists()


def test_an_audit_of_a_database_left_without_rows_fails_rather_than_passes(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path
) -> None:
    """0 of 0 rows regenerated exactly is no 100 %: a CI gate must not pass on it."""
    assert generate(openai_server, chat_prompts, tmp_path / "a.jsonl").exit_code == 0
    assert judgestore("delete", "--non-empty", "--yes").exit_code == 0
    model = ("--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
             "--api-key-env", "JUDGE_KEY", "--task", "t")  # fmt: skip
    audited = CliRunner().invoke(app(), ["audit", *model, "--fail-under", "1.0"], env={"COLUMNS": "200"})
    said = " ".join(audited.stderr.split())
    assert audited.exit_code == 1 and "nothing is stored for fake-judge" in said
    assert said.endswith("with the same options says what is stored instead"), said  # was cut off: "says what is"
    helped = CliRunner().invoke(app(), ["audit", "--help"], env={"COLUMNS": "200"})
    assert "What to audit" in helped.stdout and "What to explain" not in helped.stdout  # was explain's heading


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", ["audit", "adopt"])
def test_ctrl_c_in_audit_or_adopt_says_nothing_was_changed(
    openai_server: FakeOpenAI,
    chat_prompts: Path,
    tmp_path: Path,
    store_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    json_output: bool,
) -> None:
    """Ctrl-C while the stored rows are regenerated (was: exit 130 and nothing said)."""
    from inference.drift import audit

    assert generate(openai_server, chat_prompts, tmp_path / "a.jsonl").exit_code == 0
    before = file_digests(store_root)
    regenerated = []

    def regenerate_then_ctrl_c(*args: Any, **kwargs: Any) -> Any:
        regenerated.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(audit, "regenerate", regenerate_then_ctrl_c)
    model = ("--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
             "--api-key-env", "JUDGE_KEY")  # fmt: skip
    extra = ["--task", "u", "--across", "task"] if command == "adopt" else ["--task", "t"]  # adopt from task t
    result = CliRunner().invoke(app(), [command, *model, *extra, *(["--json"] if json_output else [])],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 130 and result.stdout == "", result.output
    said = {"audit": "interrupted before a verdict; an audit only reads, so nothing was changed",
            "adopt": "interrupted; nothing was adopted: run the same adopt again"}[command]  # fmt: skip
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and error["error"] == said
    else:
        assert " ".join(result.stderr.split()) == said
    assert regenerated and file_digests(store_root) == before


def test_a_results_file_that_fails_to_write_is_one_line_naming_it_not_the_store(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    full = generate(openai_server, chat_prompts, Path("/dev/full"))
    assert full.exit_code == 1
    assert full.exception is None or isinstance(full.exception, SystemExit)  # no traceback
    assert "Traceback" not in full.output
    line = " ".join(full.stderr.split())
    assert "Error: /dev/full: could not write the results: No space left on device;" in line
    assert "running the same command again writes them from the store" in line
    assert str(store_root) not in line and "--store-root" not in line

    sent = len(openai_server.completions())
    again = generate(openai_server, chat_prompts, tmp_path / "o.jsonl", "--json")  # as the message says: all hits
    assert again.exit_code == 0, again.output
    assert len(openai_server.completions()) == sent and (tmp_path / "o.jsonl").read_bytes().count(b"\n") > 0


def test_a_results_file_that_fails_midway_is_left_as_it_was_and_the_note_fits_the_mode(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was written in place: a write that failed midway (a full disk, a file size limit) left it cut
    off and the earlier results gone (was); and "the rows are stored" was said whatever the mode."""
    out = tmp_path / "o.jsonl"
    assert generate(openai_server, chat_prompts, out).exit_code == 0
    before = out.read_bytes()
    import inference.cli.generate as command

    real = command.write_responses

    def fails_midway(handle: Any, *args: Any) -> None:
        real(handle, *args)  # the results, then the disk refuses more
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(command, "write_responses", fails_midway)
    notes = [
        ("use", "running the same command again writes them from the store"),
        ("refresh", "running the same command again with --mode use writes them from the store"),
        ("off", "--mode off stored nothing, so running the command again generates every answer"),
    ]
    for mode, note in notes:
        failed = generate(openai_server, chat_prompts, out, "--mode", mode)
        said = " ".join(failed.stderr.split())
        assert failed.exit_code == 1 and "could not write the results: File too large" in said, said
        assert "the file it would replace is unchanged" in said and note in said
        assert out.read_bytes() == before and not list(tmp_path.glob(".o.jsonl.*"))  # no temporary file left


def test_a_results_file_or_folder_that_cannot_be_written_is_refused_before_any_request(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path
) -> None:
    """Found only after every request was answered (was): the model's work was done for nothing."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "old.jsonl").write_text("earlier results\n")
    with immutable(folder / "old.jsonl"):  # nobody may write it, root included
        refused = generate(openai_server, chat_prompts, folder / "old.jsonl")
    assert refused.exit_code == 1 and "old.jsonl: this user may not write it" in refused.stderr
    with immutable(folder):  # nothing may be made in it
        refused = generate(openai_server, chat_prompts, folder / "new.jsonl")
    assert refused.exit_code == 1 and f"this user may not write in {folder}" in " ".join(refused.stderr.split())
    assert openai_server.completions() == [] and [p.name for p in folder.iterdir()] == ["old.jsonl"]


def test_a_refused_key_is_one_line_naming_the_variable_and_never_the_key(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-wrong-key-9999999999999999")
    refused = generate(openai_server, chat_prompts, tmp_path / "o.jsonl")
    assert refused.exit_code == 1 and "JUDGE_KEY" in refused.stderr
    assert "sk-wrong-key" not in refused.output and "Traceback" not in refused.output


def test_a_request_the_server_refuses_has_an_error_line_the_others_are_written_and_the_exit_status_is_1(
    openai_server: FakeOpenAI, tmp_path: Path, store_root: Path
) -> None:
    openai_server.context_length = 20
    prompts = tmp_path / "prompts.jsonl"
    contents = ["question 0", "word " * 30, "question 2"]  # the second is over the server's context
    rows = [{"instruction_id": str(i), "messages": [{"role": "user", "content": c}]} for i, c in enumerate(contents)]
    prompts.write_bytes(b"\n" + b"".join(orjson.dumps(r) + b"\n" for r in rows))  # a blank first line: skipped

    result = generate(openai_server, prompts, tmp_path / "a.jsonl", "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output
    summary = orjson.loads(result.stdout)
    assert (summary["failed"], summary["rows_written"], summary["misses"]) == (1, 2, 3)
    (failure,) = summary["failures"]
    assert (failure["request_index"], failure["request"], failure["type"]) == (1, "?/1", "HostedRequestError")
    assert failure["source"] == f"{prompts}:3"  # its line, not its index (named by index alone, was)
    assert "maximum context length is 20 tokens" in failure["error"] and "\n" not in failure["error"]
    lines = [orjson.loads(line) for line in (tmp_path / "a.jsonl").read_bytes().splitlines()]
    assert [line["error"] for line in lines][::2] == [None, None]
    assert lines[1]["completion"] is None and lines[1]["error"]["type"] == "HostedRequestError"
    assert lines[1]["error"]["message"] == failure["error"]

    human = generate(openai_server, prompts, tmp_path / "b.jsonl")  # two hits; the refused one is sent again
    assert human.exit_code == 1 and "Traceback" not in human.output
    assert "2 hits (67%), 1 misses, 1 failed, 0 rows written" in human.stderr
    # of the inputs to generate, not of the run's (was: "1 of 1 inputs", with 3 inputs)
    assert "failed: 1 of the 1 inputs to generate were not answered or not stored" in human.stderr
    assert f"{prompts}:3 (?/1): HostedRequestError: " in human.stderr and len(openai_server.completions()) == 4
    assert "only they are asked for (the others are stored)" in " ".join(human.stderr.split())
    refreshed = generate(openai_server, prompts, tmp_path / "c.jsonl", "--mode", "refresh")
    said = " ".join(refreshed.stderr.split())
    # was: "only they are asked for", of a rerun that refreshes every input again
    assert refreshed.exit_code == 1 and "refresh them alone (--mode refresh on a file of only them)" in said


@pytest.mark.parametrize(
    ("mode", "again", "json_output", "stop"),
    [
        ("use", "running the same command again generates only the rest", False, "SIGINT"),
        # was: "run it with --mode use", which answers the inputs the refresh did not reach with their old rows
        (
            "refresh",
            "still hold their old rows, if they had any (mode use would return those): run it again with --mode "
            "refresh",
            False,
            "SIGINT",
        ),
        ("use", "running the same command again generates only the rest", True, "SIGINT"),
        ("use", "running the same command again generates only the rest", False, "SIGTERM"),
    ],
    ids=["use", "refresh", "use-json", "sigterm"],
)
def test_ctrl_c_says_how_many_rows_were_kept_and_the_rerun_generates_only_the_rest(
    openai_server: FakeOpenAI, tmp_path: Path, store_root: Path, mode: str, again: str, json_output: bool, stop: str
) -> None:
    """SIGINT (Ctrl-C) half-way: exit 130, no traceback, one line with the rows kept; a rerun sends only the rest.
    SIGTERM (a scheduler's cancel) the same, exit 143 (was: killed silently, no run recorded)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.store.test_cli import REPO

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"".join(orjson.dumps({"messages": [{"role": "user", "content": f"q {i}"}]}) + b"\n"
                                 for i in range(40)))  # fmt: skip
    openai_server.delay = 0.1
    argv = ["generate", "--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
            "--api-key-env", "JUDGE_KEY", "--task", "t", "-i", str(prompts), "-o", str(tmp_path / "out.jsonl"),
            "--max-concurrency", "1", "--chunk-size", "1"]  # fmt: skip
    code = "from inference.cli import main; main()"
    interrupted = [*argv, "--mode", mode, *(["--json"] if json_output else [])]
    if mode == "refresh":  # one output path reused from run to run: the interrupt says it holds the earlier run's
        (tmp_path / "out.jsonl").write_text("an earlier run's results\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", code, *interrupted], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    # The server counts a request when it arrives: at the 5th, the first 3 answers have had a whole request's
    # delay to be written (at the 4th, the 3rd could still be on its way to the store, and a loaded host lost it)
    while len(openai_server.completions()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(getattr(signal, stop))
    _, err = child.communicate(timeout=60)
    openai_server.delay = 0.0
    assert child.returncode == (130 if stop == "SIGINT" else 143), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if json_output:  # one JSON object on stderr, the count beside the line
        error = orjson.loads(err.splitlines()[-1])
        assert error["type"] == "Interrupted"
        line = error["error"]
    else:
        line = " ".join(err.split())
    assert "interrupted; this run stored" in line and again in line
    if mode == "refresh":
        assert f"{tmp_path / 'out.jsonl'} was not written: it holds what an earlier run wrote there" in line
        assert (tmp_path / "out.jsonl").read_text() == "an earlier run's results\n"
    else:
        assert "was not written" not in line  # no file was there: nothing stale to warn of
    kept = int(line.split("this run stored ")[1].split(" rows")[0])
    assert not json_output or error["rows_kept"] == kept
    sent = len(openai_server.completions())
    assert 3 <= kept < 40 and sent < 40
    with Store(Settings(), root=store_root, readonly=True) as store:  # the interrupted run's accounting is kept
        (recorded,) = [found.row for found in store.scalars(select(Run))]
    assert (recorded.mode, recorded.rows_written, recorded.hits) == (mode, kept, 0)

    rerun = judgestore(*argv, "--json")  # mode use: what the line said to run
    assert rerun.exit_code == 0, rerun.output
    summary = orjson.loads(rerun.stdout)
    assert (summary["hits"], summary["misses"]) == (kept, 40 - kept)  # the rows it said it kept are the hits


def test_ctrl_c_counts_the_rows_this_call_wrote_not_those_of_other_jobs_with_the_same_run_id(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs sharing a run id (one SLURM job's processes) write rows of that id at once: the count is the call's own
    (was: every row of the run id written since the run started)."""
    from datetime import UTC, datetime

    from inference.cache.generate import Writer
    from tests.factories import completion_record

    real_write = Writer.write
    writes = []

    def write_then_another_job_writes_then_ctrl_c(self: Writer, *args: Any, **kwargs: Any) -> None:
        real_write(self, *args, **kwargs)
        writes.append(args)
        if len(writes) == 2:
            assert self.database is not None
            now = datetime.now(UTC)
            others = [completion_record(100 + i, model="fake-judge", run_id="job-7", created_at=now) for i in range(3)]
            assert self.database.put_many(others) == 3  # another job's rows, same run id, same database
            raise KeyboardInterrupt

    monkeypatch.setattr(Writer, "write", write_then_another_job_writes_then_ctrl_c)
    monkeypatch.setenv("JUDGESTORE_RUN_ID", "job-7")
    result = generate(openai_server, chat_prompts, tmp_path / "out.jsonl", "--chunk-size", "1",
                      "--max-concurrency", "1", "--json")  # fmt: skip
    assert result.exit_code == 130, result.output
    error = orjson.loads(result.stderr.splitlines()[-1])
    # The call's own rows: the two chunks written, and the answers that had arrived meanwhile (written on the way
    # out); never the other job's three.
    with Store(Settings(), root=store_root, readonly=True) as store:
        (location,) = store.locations()
        rows = store.open(location).count()
    kept = rows - 3
    assert kept >= 2 and error["type"] == "Interrupted" and error["rows_kept"] == kept, (error, rows)
    assert f"this run stored {kept} rows before it stopped" in error["error"]


def test_ctrl_c_before_any_row_was_written_says_nothing_is_kept(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the tokenizer loaded said "this run stored 0 rows before it stopped: they are kept" (was)."""
    import inference.cli.generate as generate_module

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_module, "_run_with_progress", ctrl_c)
    result = generate(openai_server, chat_prompts, tmp_path / "out.jsonl", "--json")
    assert result.exit_code == 130, result.output
    error = orjson.loads(result.stderr.splitlines()[-1])
    assert error["rows_kept"] == 0 and "stored 0 rows before it stopped: nothing of it is kept" in error["error"]
    assert "they are kept" not in error["error"]


def test_json_with_results_on_stdout_puts_the_summary_on_stderr(
    openai_server: FakeOpenAI, chat_prompts: Path, store_root: Path
) -> None:
    result = generate(openai_server, chat_prompts, Path("-"), "--json")
    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in result.stdout.splitlines()]  # every stdout line is one result
    assert len(rows) == 5 and all("completion" in row for row in rows)
    assert orjson.loads(result.stderr)["misses"] == 5


def test_a_warning_about_the_key_is_one_line_not_pythons_warning_format(
    chat_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    result = judgestore(
        "generate", "--provider", "openai", "--model", "gpt-x", "--api-key-env", "NO_SUCH_KEY", "--task", "t",
        "-i", str(chat_prompts), "-o", str(tmp_path / "o.jsonl"), "--store-root", str(tmp_path / "store"),
    )  # fmt: skip
    assert result.exit_code == 1 and "NO_SUCH_KEY" in result.stderr
    assert "warning: 'gpt-x' is an alias OpenAI may move" in result.stderr
    assert "HostedKeyWarning" not in result.stderr and ".py:" not in result.stderr  # not Python's file:line format


def test_a_retry_is_one_warning_line_as_judgestores_warnings_are(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """Was: a bare line from Python's last-resort log handler."""
    openai_server.add_fault(Fault(status=503, body=b'{"error": {"message": "busy"}}'))
    result = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--max-concurrency", "1")
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stderr.splitlines() if "retry" in line]
    assert line.startswith(f"warning: {openai_server.base_url}: HTTP 503 (busy); retry 1 of 6 in ")


def test_with_json_a_retry_warning_is_a_json_object_and_a_root_handler_does_not_print_it_again(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """With --json stderr carries only JSON (a bare warning line broke it); a handler the process has on the root
    logger got each warning a second time (a review)."""
    import logging

    got: list[str] = []

    class Collecting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    root = logging.getLogger()
    collecting = Collecting(logging.WARNING)
    root.addHandler(collecting)
    try:
        openai_server.add_fault(Fault(status=503, body=b'{"error": {"message": "busy"}}'))
        result = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--max-concurrency", "1", "--json")
    finally:
        root.removeHandler(collecting)
    assert result.exit_code == 0, result.output
    (warning, summary) = [orjson.loads(line) for line in result.stderr.splitlines()[:1]] + [orjson.loads(result.stdout)]
    assert warning["type"] == "LogWarning" and warning["warning"].startswith(f"{openai_server.base_url}: HTTP 503")
    assert summary["misses"] == 5 and not [m for m in got if "retry" in m]


def test_an_empty_input_file_reports_no_hit_rate(openai_server: FakeOpenAI, tmp_path: Path, store_root: Path) -> None:
    """Nothing was looked up: "0 hits (100%)" claimed a rate (was)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = generate(openai_server, empty, tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert "done: 0 hits, 0 misses, 0 rows written" in result.stderr and "%" not in result.stderr
    assert openai_server.completions() == [] and (tmp_path / "out.jsonl").read_bytes() == b""


def test_a_second_ctrl_c_while_the_first_is_recorded_still_counts_the_rows_kept(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as the third row is written, then again while the run is recorded: 'stored 0 rows' (was)."""
    from inference.cache import generate as writing
    from inference.cache.model import CachedModel
    from tests.interrupts import ctrl_c_on_call

    ctrl_c_on_call(monkeypatch, writing.Writer, "_put", 3)  # as the third row is about to be written
    recorded = ctrl_c_on_call(monkeypatch, CachedModel, "_record_run", 1)
    result = generate(
        openai_server, chat_prompts, tmp_path / "out.jsonl", "--chunk-size", "1", "--max-concurrency", "1", "--json"
    )
    assert result.exit_code == 130 and len(recorded) == 1, result.output
    error = orjson.loads(result.stderr.splitlines()[-1])
    with Store(Settings(), root=store_root, readonly=True) as store:
        stored = sum(store.open(location).count() for location in store.locations())
    assert error["rows_kept"] == stored >= 2 and f"this run stored {stored} rows" in error["error"], error


def test_the_timeout_of_a_servers_requests_is_an_option_and_changes_no_key(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path
) -> None:
    """A slow model's long answers need more than 120 s, and only HostedSpec(timeout_s=) could say so (was)."""
    openai_server.add_fault(Fault(status=200, delay=1.5))  # the first answer comes after the timeout: retried
    timed = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--timeout", "0.5", "--json")
    assert timed.exit_code == 0, timed.stderr
    summary = orjson.loads(timed.stdout)
    assert summary["retries"] == 1 and summary["rows_written"] == summary["misses"]
    again = orjson.loads(generate(openai_server, chat_prompts, tmp_path / "b.jsonl", "--json").stdout)
    assert again["hits"] == summary["misses"]  # the timeout is no part of the key: the rows are hit without it
    for bad in ("0", "-1", "nan"):
        refused = generate(openai_server, chat_prompts, tmp_path / "c.jsonl", "--timeout", bad)
        assert refused.exit_code == 2 and "--timeout" in refused.stderr, bad
    orphan = judgestore("generate", "--model", "m", "--timeout", "5", "--task", "t", "-i", str(chat_prompts))
    assert orphan.exit_code == 1 and "--timeout needs --provider" in orphan.stderr


def test_a_run_a_spent_quota_stops_says_how_many_requests_it_sent_and_rows_it_kept(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path
) -> None:
    """A stopped run said what it kept, never what it had sent (what the account was charged for): only a summary
    said `requests_sent`, and a stopped run prints none (was)."""
    quota = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    openai_server.add_fault(Fault(status=429, times=100, after=2, body=orjson.dumps(quota)))
    human = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--max-concurrency", "1")
    assert human.exit_code == 1 and "the quota of the account is spent" in human.stderr, human.output
    assert "This call stored 2 rows before the failure" in human.stderr
    assert "It sent 3 requests to the server before it stopped (0 retries)" in human.stderr
    assert len(openai_server.completions()) == 3
    again = generate(openai_server, chat_prompts, tmp_path / "b.jsonl", "--max-concurrency", "1", "--json")
    error = orjson.loads(again.stderr.splitlines()[-1])
    assert error["rows_kept"] == 0 and "It sent 1 request to the server before it stopped (0 retries)" in error["notes"]


def test_a_model_the_server_does_not_serve_leaves_no_database_and_no_run(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """A typo in a hosted model's name left an empty database, and its failed run, in the store for good (was)."""
    wrong = judgestore(
        "generate", "--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "no-such-judge",
        "--api-key-env", "JUDGE_KEY", "--task", "t", "-i", str(chat_prompts), "-o", str(tmp_path / "o.jsonl"),
    )  # fmt: skip
    assert wrong.exit_code == 1 and "no-such-judge" in wrong.stderr and "Traceback" not in wrong.output
    assert not store_root.exists() or list(store_root.rglob("*.db")) == []
    right = generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--json")  # the same store, answered
    assert right.exit_code == 0 and orjson.loads(right.stdout)["rows_written"] == 5
    (database,) = orjson.loads(judgestore("ls", "--json", "--store-root", str(store_root)).stdout)
    assert database["model"] == "fake-judge" and database["rows"] == 5


def test_a_run_whose_every_request_is_refused_leaves_no_database_and_no_run(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, store_root: Path
) -> None:
    """Refusals are outcomes too: a stream of refusals only opened (created) the database at the first (was)."""
    openai_server.context_length = 1  # every prompt is over the server's context: each refused alone
    refused = generate(openai_server, chat_prompts, tmp_path / "o.jsonl", "--json")
    assert refused.exit_code == 1 and orjson.loads(refused.stdout)["failed"] == 5, refused.output
    assert not store_root.exists() or list(store_root.rglob("*.db")) == []
