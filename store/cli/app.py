"""The ``judgestore`` command line, assembled in one place.

Contract:

* :func:`build_app` builds the one typer app: the store's commands (``ls``,
  ``query``, ``delete``, ``db status``, ``db upgrade``, ``verify``, ``stats``,
  ``prune``, ``vacuum``, ``export``, ``hub push``, ``hub fetch``, ``copy``, ``browse``), then the
  commands of each registrar it is given.
  Each CLI module exposes ``register(app)``; nothing mutates a global app at
  import time and no CLI module imports another.
* ``python -m store`` (:func:`main`) runs the store's commands alone, without
  the inference layer's imports; the ``judgestore`` console script
  (:func:`inference.cli.main`) runs the same app with the inference layer's
  commands added (``generate``, ``judge``, ``pairs``, ``import``). Both go
  through :func:`run_program`, which leaves the process without Python's
  teardown once the command is done.
* The edge (errors, output) is :mod:`store.cli.common`; the shared option groups are :mod:`store.cli.options`;
  tables are :mod:`store.cli.tables` and ``--help`` is :mod:`store.cli.help`, both made to fit 80 columns.
* A command module imports what only its commands use (sharing, the legacy
  readers, stats, prune, vacuum, export, explain, audit) inside them: starting
  a command imports its own path, and a run that is all hits is nothing but
  its start (see the README's Performance section).
* The modules that declare commands or option groups do not use
  ``from __future__ import annotations``: typer reads every command's
  annotations when the app starts, and string annotations would be compiled
  and evaluated there, about 500 of them at every start (tests/test_cli_start.py
  checks this). A type only imported under ``TYPE_CHECKING`` is quoted instead.
"""

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import typer

from store.cli import browse, cache, data, db, hub, transfer
from store.cli.common import interrupt_said, to_json
from store.cli.help import plain_help
from store.interrupts import interrupts_reach_the_command, say_interrupted

Registrar = Callable[[typer.Typer], None]
STORE_COMMANDS: tuple[Registrar, ...] = (
    data.register,
    db.register,
    cache.register,
    hub.register,
    transfer.register,
    browse.register,
)


def build_app(*registrars: Registrar) -> typer.Typer:
    """The ``judgestore`` app: the store's commands, then each registrar's."""
    app = typer.Typer(
        name="judgestore",
        help="A content-addressed store of LLM completions and judgements.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    for register in (*STORE_COMMANDS, *registrars):
        register(app)
    plain_help(app)  # help that reads whole at 80 columns (store.cli.help)
    return app


def main() -> None:
    """``python -m store``: the store's commands."""
    run_program(build_app())


_PYDANTIC_PREFIX = "Value error, "  # "Invalid value for '--role': Value error, 'x' is not one of ..." (was)


def _show_usage_error(error: typer.TyperException) -> int:
    """A command line click refused (an unknown option, a bad value): click's lines, or after ``--json`` one JSON
    object on stderr as :func:`store.cli.common.command_errors` gives every other error; its exit status (2)."""
    message = getattr(error, "message", None)
    if isinstance(message, str) and message.startswith(_PYDANTIC_PREFIX):  # typer checks a choice with pydantic
        error.message = message.removeprefix(_PYDANTIC_PREFIX)  # type: ignore[attr-defined]
    if "--json" in sys.argv[1:]:
        sys.stderr.write(to_json({"error": error.format_message(), "type": type(error).__name__}, indent=False) + "\n")
    elif (show := getattr(error, "show", None)) is not None:  # click's: usage line, hint, error
        show()
    else:
        sys.stderr.write(f"Error: {error.format_message()}\n")
    return error.exit_code


def run_program(app: typer.Typer) -> NoReturn:
    """Run ``app`` as the ``judgestore`` program, then end the process at once with the command's exit status.

    Python's own teardown frees every object of every imported module one at a
    time: 0.3-0.7 s of CPU on this project's machines (the openai client's
    types, SQLAlchemy's), a quarter of a short command and more with several
    jobs on a few cores. Once the command has returned there is nothing left to
    free: every command closes its store (``with Store(...)``) and its files
    before it returns. So the exit does what the teardown would still have to:
    ends the thread pools and waits for threads that are not daemons, runs the ``atexit`` handlers
    (logging's flush among them), flushes stdout and stderr, and then calls
    :func:`os._exit`.

    SIGTERM is handled as Ctrl-C is (every command's interrupt handling runs), and the exit status is then 143.

    A run that imported vLLM takes the usual way out: its engine's processes
    are ended by vLLM's own finalizers, and a run that loads a model is not
    one whose last half second matters. So does an exception that is not a
    :class:`SystemExit` (its traceback is Python's to print).
    """
    code: str | int | None
    terminated = False

    def stop_as_ctrl_c(signum: int, frame: object) -> None:
        # SIGTERM (a scheduler's cancel, a time limit, preemption) ends the command as Ctrl-C does: what it wrote
        # is committed and said, a shared batch's leases go back, its run is recorded; then exit 143, not 130.
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    interrupts_reach_the_command()
    try:
        # Not standalone: a usage error reaches this edge, which gives it as JSON after --json as every other error
        returned = app(prog_name="judgestore", standalone_mode=False)
        code = returned if isinstance(returned, int) else 0  # typer.Exit(n) returns n here
    except typer.TyperException as e:  # click's errors (typer vendors click): a command line it refused
        code = _show_usage_error(e)
    except typer.Abort:  # end of input at a prompt
        sys.stderr.write("Aborted!\n")
        code = 1
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # before a command could handle it: while typer built the commands (said below)
        code = 130
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the command is over: a SIGTERM now ends the exit at once
    if code == 130 and not interrupt_said():  # typer's own Exit(130), of one that came as it read the options
        say_interrupted("--json" in sys.argv[1:])
    if terminated:
        code = 128 + signal.SIGTERM
    if "vllm" in sys.modules:
        sys.exit(code)
    # What Python's exit does first: the thread pools' exit hooks, then a join of every thread that is not a daemon.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    if isinstance(code, str):
        sys.stderr.write(f"{code}\n")  # what sys.exit("message") prints
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: the command was started with it closed (`>&-`)
                stream.flush()
    except BrokenPipeError:  # `judgestore ls | head`: the reader has what it wanted
        pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
