"""What starting and ending ``judgestore`` cost around a command (store.cli.app's contract).

A full hit is nothing but its start and its end, so two regressions would slow every
cached run: a command module whose annotations are strings again (typer would
compile and evaluate each of them at every start), and a module-level import
of a package only some commands need. At the end, the program leaves without
Python's teardown, and must lose nothing by it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer

from inference.cli.app import app
from tests.inference.conftest import REPO_ROOT, run_fresh_python

# Never imported by starting the command line: each is imported by the commands that use it.
# bench/inference_bench.py checks the same list on a whole full-hit run.
HEAVY = (
    "vllm",
    "torch",
    "transformers",
    "pandas",
    "pyarrow",
    "huggingface_hub",
    "alembic",
    "psycopg",
    "openai",
    "langchain_core",
    "tqdm",
    "starlette",
    "jinja2",
    "uvicorn",
    "markdown_it",
)


def _callbacks(app: typer.Typer) -> Iterator[Callable[..., Any]]:
    for command in app.registered_commands:
        assert command.callback is not None
        yield command.callback
    for group in app.registered_groups:
        assert group.typer_instance is not None
        yield from _callbacks(group.typer_instance)


def test_no_command_leaves_string_annotations_for_typer_to_evaluate() -> None:
    callbacks = list(_callbacks(app()))
    assert len(callbacks) >= 20  # every command of the whole app, the db and hub groups' included
    for callback in callbacks:
        # The command itself and every wrapper around it (store.cli.options.grouped evaluates what it wraps).
        function: Any = callback
        while function is not None:
            strings = sorted(name for name, value in function.__annotations__.items() if isinstance(value, str))
            assert not strings, f"{function.__module__}.{function.__qualname__}: string annotations {strings}"
            function = getattr(function, "__wrapped__", None)


def test_starting_the_command_line_imports_no_heavy_package() -> None:
    code = (
        "import sys, typer\n"
        "from inference.cli.app import app\n"
        "typer.main.get_command(app())\n"  # what every start does: every command converted for click
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert run_fresh_python(code).stdout.strip() == "[]"


# A program of one command, run as the console script runs judgestore: the command leaves a worker thread, an atexit
# handler and an object with a finalizer behind, then exits with the status given on its command line.
PROGRAM = """
import atexit, sys, threading, time, types
import typer
from store.cli.app import run_program

if {fake_vllm}:
    sys.modules["vllm"] = types.ModuleType("vllm")  # as a run that loaded a model leaves it


class Finalized:
    def __del__(self) -> None:
        print("finalized", flush=True)


app = typer.Typer(add_completion=False)


@app.command()
def main(code: str) -> None:
    def late() -> None:
        time.sleep(0.3)
        print("thread done")

    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran"))
    sys.modules["__main__"].kept = Finalized()
    print("written")  # stdout is a pipe: its buffer still holds this when the command returns
    sys.exit(int(code) if code.isdigit() else code)


run_program(app)
"""


def _program(code: str, *, fake_vllm: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM.format(fake_vllm=fake_vllm), code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("3", 3), ("bad input", 1)])
def test_the_program_ends_with_the_commands_status_and_nothing_unwritten(code: str, status: int) -> None:
    result = _program(code)
    assert result.returncode == status
    # Threads joined, atexit handlers run, stdout flushed; the teardown (the finalizer) skipped.
    assert result.stdout.splitlines() == ["written", "thread done", "atexit ran"]
    assert result.stderr == ("bad input\n" if code == "bad input" else "")


def test_a_run_that_loaded_vllm_ends_through_pythons_teardown() -> None:
    result = _program("2", fake_vllm=True)
    assert result.returncode == 2
    assert result.stdout.splitlines() == ["written", "thread done", "atexit ran", "finalized"]


# Where a signal lands in the program's first second: the commands' import, typer building the commands, typer
# reading the command line; as Ctrl-C (KeyboardInterrupt) or SIGTERM (the program's own handler, once it is set).
_EARLY = {
    "import": (
        "class Interrupting:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'inference.cli.app':\n"
        "            {signal}\n"
        "sys.meta_path.insert(0, Interrupting())\n"
    ),
    "building": (
        "import typer.main\ndef building(*args, **kwargs):\n    {signal}\ntyper.main.get_command = building\n"
    ),
    "reading": (
        "import typer.core\ndef reading(*args, **kwargs):\n    {signal}\ntyper.core.TyperGroup.make_context = reading\n"
    ),
}
_SIGNALS = {"ctrl-c": ("raise KeyboardInterrupt", 130), "sigterm": ("os.kill(os.getpid(), signal.SIGTERM)", 143)}


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("how", list(_SIGNALS))
@pytest.mark.parametrize("where", list(_EARLY))
def test_a_signal_in_the_programs_first_second_is_one_line_not_a_traceback_nor_silence(
    where: str, how: str, json_output: bool
) -> None:
    """The first second of every command imports its modules and builds its command line (was: Python's traceback,
    killed by SIGINT whatever the signal, or exit 130 with nothing said; with --json, no JSON object)."""
    statement, status = _SIGNALS[how]
    code = (
        "import os, signal, sys\n" + _EARLY[where].format(signal=statement) + "from inference.cli import main\nmain()\n"
    )
    args = ["ls", "--json"] if json_output else ["ls"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    words = "interrupted as the command started: nothing was done"  # was the bare "interrupted"
    said = f'{{"error":"{words}","type":"Interrupted"}}\n' if json_output else f"{words}\n"
    assert (done.returncode, done.stdout, done.stderr) == (status, "", said)
