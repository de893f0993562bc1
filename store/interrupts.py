"""What a long operation had done when Ctrl-C stopped it, carried on the ``KeyboardInterrupt`` to the command line.

Contract:

* :func:`carrying` wraps the work of an operation that fills a report as it
  goes (a copy, a push, a fetch, an import): a ``KeyboardInterrupt`` that
  passes through it gets that report as an attribute of the given name, and
  is raised again. The command reads it back (``getattr(error, name, None)``)
  and says what was done (:func:`store.cli.common.interrupted`).
* ``db upgrade``: a ``KeyboardInterrupt`` raised while a database is being
  migrated carries its ``where`` as :data:`MIGRATING`; the command then
  reads whether the migration's commit had finished. One raised anywhere
  else (a database that was already current) carries nothing.
* What a report counts must be committed: an operation counts a write once it
  stands, including when Ctrl-C came during its commit (SQLite finishes the
  commit, and Python raises the interrupt just after it).
* :func:`deferred_interrupts` holds back Ctrl-C and SIGTERM during work that an
  interrupt would leave broken (vLLM's engine start: a ``KeyboardInterrupt``
  in its handshake with the engine process was lost, and the run went on to
  the end, or hung for minutes while the engine waited for an answer). The
  first signal is said on stderr and acted on as the work ends; a second one
  ends the process at once (the child processes started meanwhile, and
  theirs, killed first: an engine's would outlive it), exit status 130 or 143. Nothing is written meanwhile.
  Those two lines are plain text on stderr, or what a command gives
  :func:`held_signals_said_by` (with ``--json``, JSON objects: stderr
  carries only JSON there).
* :func:`say_interrupted`: the line of a Ctrl-C (or SIGTERM) that no command
  reported, one that came while the program started (its imports, typer
  reading the command line): "interrupted as the command started: nothing
  was done", or with ``--json`` that as the JSON object every interrupted
  command gives, never a traceback or nothing.
* :func:`interrupts_reach_the_command` (the command line installs it): Python
  drops, with an "Exception ignored" line, a ``KeyboardInterrupt`` raised in
  a finalizer or weakref callback (Ctrl-C landing while the garbage collector
  runs one); the command went on to the end and exited 0. It is raised again
  in the main thread instead.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

MIGRATING = "migrating"


def _say_plain(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


_say_held: Callable[[str], None] = _say_plain  # what says a held signal's lines: see held_signals_said_by


@contextmanager
def held_signals_said_by(say: Callable[[str], None]) -> Iterator[None]:
    """Within: :func:`deferred_interrupts` says its lines (a held signal, the process ended at once) through
    ``say``, a command's own way of saying a line on stderr; plain text again after."""
    global _say_held
    before, _say_held = _say_held, say
    try:
        yield
    finally:
        _say_held = before


def say_interrupted(json_output: bool) -> None:
    """Say on stderr that the program was interrupted, where no command said what its interrupt left (see the
    module docstring); stdlib only, so the program may say it before it has imported anything else."""
    said = "interrupted as the command started: nothing was done"  # no command ran to say what it left
    sys.stderr.write(f'{{"error":"{said}","type":"Interrupted"}}\n' if json_output else f"{said}\n")
    sys.stderr.flush()


def interrupts_reach_the_command() -> None:
    """Raise again, in the main thread, a ``KeyboardInterrupt`` that Python would drop (see the module docstring)."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, KeyboardInterrupt):
            # As a signal arriving, through the handler in place (which a held section defers). From another
            # thread, a moment later: one raised before this hook returns would be dropped again, as its own.
            again = threading.Timer(0.01, _signal_main_thread)
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook


def _signal_main_thread() -> None:
    """SIGINT to the main thread itself, so that a wait it is blocked in (an event, a queue, a sleep) ends at once,
    as at Ctrl-C; through :func:`_thread.interrupt_main` (which waits for the wait to end) where no Python handler
    would take it."""
    if callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    else:
        _thread.interrupt_main(signal.SIGINT)


@contextmanager
def carrying(name: str, report: object) -> Iterator[None]:
    """Attach ``report`` to a ``KeyboardInterrupt`` raised inside, as attribute ``name``; raise it again."""
    try:
        yield
    except KeyboardInterrupt as e:
        setattr(e, name, report)
        raise


_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@contextmanager
def deferred_interrupts(until: str) -> Iterator[None]:
    """Hold back the first SIGINT or SIGTERM until the body ends (``until`` says when, on stderr), then act on it as
    the handler in place before would have (a ``KeyboardInterrupt``; judgestore's SIGTERM handler, exit 143); a
    second signal ends the process at once (see the module docstring). A held signal is acted on when the body
    fails too (the failure as its cause): an interrupt the whole process group got may have ended the body's child
    process first. A signal the process ignores stays ignored. Outside the main thread (where no handler can be
    set), the body runs as it is. The body must write nothing a sudden end would leave half done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before: dict[int, _Handler] = {
        signum: handler
        for signum in (signal.SIGINT, signal.SIGTERM)
        if (handler := signal.getsignal(signum)) not in (signal.SIG_IGN, None)  # None: not set from Python
    }
    held: list[int] = []
    import psutil  # here, not at the command's start: vLLM, whose start this holds, has imported it

    there_before = {child.pid for child in psutil.Process().children(recursive=True)}  # not the body's to end

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:  # asked twice: now. Not by an exception: that is what the body cannot take
            _end_now(128 + signum, there_before)
        held.append(signum)
        _say_held(f"stopping {until} (press Ctrl-C again to stop at once)")

    for signum in before:
        signal.signal(signum, hold)
    try:
        yield
    except BaseException as failure:
        _restore(before)
        if held:
            try:
                _act(before[held[0]], held[0], None)
            except BaseException as interrupt:
                raise interrupt from failure
        raise
    _restore(before)
    if held:
        _act(before[held[0]], held[0], None)


def _restore(handlers: dict[int, _Handler]) -> None:
    for signum, handler in handlers.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]  # what getsignal gave back


def _end_now(status: int, spared: set[int]) -> NoReturn:
    """End this process now, the child processes the held work started first (killed: they may be mid-start and
    deaf to a request); those in ``spared`` (there before it, a host program's own) and theirs are left."""
    with contextlib.suppress(Exception):  # a line that cannot be said must not keep the process alive
        _say_held("stopped at once")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    import psutil

    # Found by their parent pid, not through multiprocessing's list: a child joins that once its start returns,
    # and a signal sent as the engine starts lands between the fork and then. Their own children too.
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.pid not in spared and not any(parent.pid in spared for parent in child.parents()):
                child.kill()
    os._exit(status)


def _act(handler: _Handler, signum: int, frame: FrameType | None) -> None:
    """What ``handler`` (as ``signal.getsignal`` gives it) does on ``signum``: call it, or the default's action."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL and signum == signal.SIGINT:
        raise KeyboardInterrupt
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
