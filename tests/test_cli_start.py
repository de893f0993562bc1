"""What starting ``judgestore`` costs before any command runs (store.cli.app's contract).

A full hit is nothing but its start, so two regressions would slow every
cached run: a command module whose annotations are strings again (typer would
compile and evaluate each of them at every start), and a module-level import
of a package only some commands need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import typer

from inference.cli.app import app
from tests.inference.conftest import run_fresh_python

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
