"""Every table of every command, printed in an 80-column terminal (``COLUMNS=80``), as a newcomer sees it.

No line is wider than 80 cells, no column header is cut, and the values that
tell rows apart stay apart: ``tiny-a`` and ``tiny-b`` whole, and two long
model names that differ only in their middle (``...-8B-...`` and
``...-70B-...``) shown as two different strings. A table that cannot fit
this way becomes a list (``Header: value``), which cuts nothing.
"""

from __future__ import annotations

import inspect
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from inference.cli.app import app
from store.descriptor import ModelDescriptor
from store.runs import record_run
from store.settings import Settings
from store.store import Store
from tests.factories import completion_record, judgement_record
from tests.legacy import builders
from tests.store.test_runs import run

SHORT = ("tiny-a", "tiny-b")
LONG = ("meta-llama/Llama-3.1-8B-Instruct-with-a-long-suffix", "meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix")


def descriptor(model: str, max_tokens: int = 24) -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model=model, sampling={"temperature": 0.0, "max_tokens": max_tokens})


@pytest.fixture
def demo(store_root: Path) -> Path:
    """The demo's databases (tiny-a, tiny-b, tiny-judge) and two long names that differ in the middle."""
    recent = datetime.now(UTC) - timedelta(hours=1)
    with Store(Settings(), root=store_root) as store:
        for model in (*SHORT, *LONG):
            rows = [completion_record(i, model=model, finish_reason="length" if model == "tiny-a" else "stop",
                                      created_at=recent) for i in range(4)]  # fmt: skip
            database = store.database("completions", "demo", descriptor(model))
            database.put_many(rows)
            record_run(database, run(2))
        pairs = [judgement_record(i, orientation=o, model_a="tiny-a", model_b="tiny-b") for i in range(2)
                 for o in ("direct", "reversed")]  # fmt: skip
        store.database("judgements", "demo", descriptor("tiny-judge", 8)).put_many(pairs)
    return store_root


def judgestore(*args: str) -> Any:
    return CliRunner().invoke(app(), list(args), env={"COLUMNS": "80"})


def shown_as(output: str, name: str) -> set[str]:
    """The words of ``output`` that show ``name``: whole, or its start and end around an ellipsis."""
    found = set()
    for word in output.split():
        head, ellipsis, tail = word.partition("…")
        if word == name or (ellipsis and len(head) + len(tail) >= 4 and name.startswith(head) and name.endswith(tail)):
            found.add(word)
    return found


def check(result: Any, headers: tuple[str, ...], *, names: tuple[str, ...] = SHORT, exit_code: int = 0) -> str:
    output: str = result.stdout
    assert result.exit_code == exit_code, result.output
    wide = [line for line in output.splitlines() if cell_len(line) > 80]
    assert not wide, output
    for header in headers:
        assert header in output, f"header {header!r} is missing or cut:\n{output}"
    for name in SHORT:
        if name in names:
            assert name in output.split() or f"{name}," in output, f"{name} is not shown whole:\n{output}"
    if set(LONG) <= set(names):
        first, second = (shown_as(output, name) for name in LONG)
        assert first and second and not first & second, f"the two long names look alike:\n{output}"
    return output


LOCATION = ("Role", "Task", "Provider", "Model", "Descriptor")
ALL = (*SHORT, *LONG)


def test_data_commands(demo: Path) -> None:
    check(judgestore("ls"), (*LOCATION, "Rows", "Size", "State"), names=ALL)
    out = check(judgestore("ls", "--finish-reason", "length"), (*LOCATION, "Rows", "Matching", "Size", "State"),
                names=ALL)  # fmt: skip
    assert "current" in out
    check(judgestore("query"), ("role", "input_hash", "instruction_id", "model", "model_a", "model_b", "completion"))
    check(judgestore("query", "--role", "judgements"), ("input_hash", "model_a", "model_b", "orientation"))
    check(judgestore("query", "--role", "completions", "--limit", "40"), ("model",), names=ALL)
    check(judgestore("delete", "--run-id", "run-1", "--dry-run"), (*LOCATION, "Rows"), names=ALL)


def test_maintenance_commands(demo: Path) -> None:
    out = check(judgestore("db", "status"), ("Database", "State", "Revision", "Problem"), names=())
    assert out.count("current") == 5
    check(judgestore("db", "upgrade"), ("Database", "Result", "From", "To"), names=())  # no backup: no such line
    (demo / "notes.txt").write_text("not part of the store")
    out = check(judgestore("verify"), ("Path", "Kind", "Problem"), names=(), exit_code=1)
    assert "notes.txt" in out


def test_cache_commands(demo: Path) -> None:
    out = check(judgestore("stats", "--runs", "3"), (*LOCATION, "Rows", "Size", "Hits", "Saved"), names=ALL)
    assert "Started (UTC)" in out and "Misses" in out and "1.0 s" in out  # the recent runs and what they saved
    check(judgestore("prune", "--older-than", "30m", "--dry-run"), (*LOCATION, "Rows"), names=ALL)
    out = check(judgestore("vacuum"), (*LOCATION, "Before", "After", "Result"), names=ALL)
    assert out.count("vacuumed") == 5


def test_copy_and_sharing(demo: Path, tmp_path: Path) -> None:
    copied = check(judgestore("copy", "--from-root", str(demo), "--to-root", str(tmp_path / "copy")),
                   (*LOCATION, "Read", "Written", "Conflicts", "Verified"), names=ALL)  # fmt: skip
    assert copied.count("yes") == 5
    shared = str(tmp_path / "shared")
    pushed = judgestore("hub", "push", "--dir", shared, "--all", "--create-repo")
    out = check(pushed, (*LOCATION, "Shards", "Rows", "Bytes"), names=ALL)
    assert "commits" not in out  # a folder has none to count (the Hub's pushes say theirs)
    fetched = judgestore("hub", "fetch", "--dir", shared, "--all", "--store-root", str(tmp_path / "other"))
    check(fetched, (*LOCATION, "Shards", "Rows new", "Rows read", "Bytes"), names=ALL)


def test_import_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for model in SHORT:
        metadata = builders.s3_metadata(f"org/{model}", {"max_tokens": 8, "temperature": 0})
        folder = builders.legacy_folder(tmp_path / "legacy", "completions", "demo", "VLLM", f"org/{model}", metadata)
        text = builders.rendered_messages([{"role": "user", "content": "hi"}])
        row = {"input_hash": builders.sha(text), "input_text": text, "completion": "hello", "benchmark": "demo",
               "instruction_id": "1", "model": model, "pushed_by": "u", "pushed_at": "2026-01-01T00:00:00",
               "run_id": "r"}  # fmt: skip
        builders.create_db(folder / "completions.db", builders.S4C_DDL, [row])
    headers = ("Source", "Variant", "Role", "Task", "Rows", "State", "Descriptor / problem")
    detected = check(judgestore("import", "legacy", "--detect"), headers, names=())
    assert detected.count("S4c") == 2
    imported = judgestore("import", "legacy", "--dry-run")
    headers = ("Source", "Variant", "Rows", "Imported", "Present", "Conflicts", "Skipped", "Failed", "Status")
    check(imported, headers, names=(), exit_code=imported.exit_code)


def every_command(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found += every_command(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


def test_every_help_reads_whole_at_80_columns() -> None:
    """Option names are never cut (typer's boxed help cut --chat-template-kwarg), flags show no ``<bool>``."""
    import typer.main

    commands = every_command(typer.main.get_command(app()))
    assert len(commands) >= 20
    for path, command in [((), None), *commands]:
        result = judgestore(*path, "--help")
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert all(cell_len(line) <= 80 for line in lines), result.stdout
        assert "…" not in result.stdout and "<bool>" not in result.stdout, result.stdout
        assert "<list[" not in result.stdout, result.stdout  # pairs --answers <list[Path]> (was)
        for param in command.params if command is not None else ():
            for name in (*param.opts, *param.secondary_opts):
                assert name in result.stdout.split() or f"{name}," in result.stdout, (path, name, result.stdout)
    generate = judgestore("generate", "--help").stdout
    assert "--chat-template-kwarg KEY=VALUE" in generate and "--enable-thinking / --disable-thinking" in generate
    for panel in ("Model:", "Run:", "Sampling:", "Hosted model (an OpenAI-compatible server):", "Store:"):
        assert f"\n{panel}\n" in generate
    assert "./judgestore-data" in judgestore("ls", "--help").stdout  # never broken at its hyphen


def test_every_option_says_what_it_does() -> None:
    """--benchmark, --instruction-id, --run-id, --created-by and --seed had no help text (was)."""
    import typer.main

    bare = [
        (" ".join(path), param.opts[0])
        for path, command in every_command(typer.main.get_command(app()))
        for param in command.params
        if param.param_type_name == "option" and param.opts[0] != "--help" and not (param.help or "").strip()
    ]
    assert bare == []


@pytest.mark.postgres
def test_a_server_store_at_80_columns(demo: Path, pg_url: str) -> None:
    """On a server: tiny-a and tiny-b apart in ls and copy, db upgrade names folders (never the URL, 5 lines deep)."""
    check(judgestore("copy", "--from-root", str(demo), "--to-url", pg_url),
          (*LOCATION, "Read", "Written", "Conflicts", "Verified"), names=ALL)  # fmt: skip
    check(judgestore("ls", "--store-url", pg_url), (*LOCATION, "Rows", "Size", "State"), names=ALL)
    upgraded = check(judgestore("db", "upgrade", "--store-url", pg_url), ("Database", "Result", "From", "To"), names=())
    assert "completions/demo/vllm/tiny-a/5b9daa177734311a" in upgraded  # a folder, whole, not the schema's URL
    assert upgraded.count("up-to-date") == 6  # 5 databases and the caption
    assert upgraded.count("postgresql") == 1  # the title, never a column


def test_help_prints_each_example_command_as_written() -> None:
    """An example rewrapped broke mid-way, and adopt's backslash continuation landed inside a line (was)."""
    import typer.main

    examples = 0
    for path, command in every_command(typer.main.get_command(app())):
        shown = judgestore(*path, "--help").stdout
        for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
            if paragraph.startswith("    judgestore "):
                examples += 1
                assert textwrap.indent(paragraph, "  ") in shown, (path, paragraph, shown)
    assert examples >= 30
