"""What every ``judgestore`` command shares: the error edge and the rendering helpers.

Contract:

* :func:`command_errors` is the edge: a :class:`~store.errors.JudgestoreError`
  becomes one line on stderr, its notes after it (with ``--json``: a JSON
  object with ``error``, ``type`` and, when known, ``path``, ``notes`` and
  ``rows_kept``) and exit status 1. An SQLite, driver or filesystem error
  that a library path failed to translate is translated here by the
  backend it came from (:func:`store.backends.typed_error`: the server
  given, else the file the error names or the store root): no command
  prints a Python traceback for a bad file or a bad disk. Usage errors
  exit 2 (click): a value wrong whatever the machine holds (a name that is
  no field, a malformed repository id, a number out of range). A value
  that names what the machine lacks or cannot use (a folder, a file, a
  server) is the command's error: exit 1.
* stdout carries only the result (a table, JSON, JSONL or CSV; a file
  name whose bytes are not UTF-8 is printed as those bytes); progress
  bars, notes and errors go to stderr, and bars only on a terminal, never with
  ``--json``. A stdout that cannot be written (a full disk) is an
  :class:`~store.errors.OutputWriteError` naming stdout, never the store's
  error; a command started with stdout closed refuses before it does
  anything.
* Every table is a :class:`~store.cli.tables.FittedTable`: it fits the
  terminal, 80 columns included, without cutting a header or making two rows
  look alike (:func:`location_table` for tables of databases).
* The options every command shares are :mod:`store.cli.options`'.
"""

from __future__ import annotations

import codecs
import enum
import errno
import functools
import io
import json
import logging
import os
import sqlite3
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import date, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, cast

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from store import jsonvalues
from store.backends import typed_error
from store.claim_table import ClaimsSummary
from store.cli.tables import Column, Fit, FittedTable
from store.errors import DatabaseIOError, EmptyFilterError, InvalidInputError, JudgestoreError, OutputWriteError
from store.interrupts import held_signals_said_by
from store.layout import Location, Selector
from store.outputs import replacing, written_in_place
from store.reports import DatabaseInfo, Problem
from store.roles import ROLES
from store.rows import RowCount
from store.settings import Settings
from store.spelling import meant
from store.store import Store
from store.tables.filters import RowFilter, roles_for

if TYPE_CHECKING:  # store.sync is imported by the hub commands alone (see store.cli.app)
    from store.sync.workspace import ProgressCallback

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# ---------------------------------------------------------------- the edge


# Without rich's markup: what the CLI prints holds the user's text (prompts, stop strings, model paths, task
# names), and "[/INST]" in a prompt was a closing tag that crashed `explain` and `generate` (was); "[b]x" lost its
# "[b]". Styles are given as style=, never as markup.
def stdout() -> Console:
    return Console(highlight=False, soft_wrap=False, markup=False)


def stderr() -> Console:
    return Console(stderr=True, highlight=False, markup=False)


def _error_payload(error: JudgestoreError) -> dict[str, object]:
    payload: dict[str, object] = {"error": _message(error), "type": type(error).__name__}
    path = getattr(error, "path", None)
    if path is not None:
        payload["path"] = str(path)
    if getattr(error, "__notes__", None):
        payload["notes"] = list(error.__notes__)
    for done in ("rows_kept", "rows_deleted"):
        if getattr(error, done) is not None:
            payload[done] = getattr(error, done)
    return payload


def _error_line(error: JudgestoreError) -> str:
    line = _message(error)
    for note in getattr(error, "__notes__", ()):  # each a sentence of its own after the message
        line = f"{line}{'' if line.endswith(('.', '!', '?')) else '.'} {note}"
    return line


def _message(error: JudgestoreError) -> str:
    """The error's message in the command line's words."""
    if isinstance(error, EmptyFilterError):
        return (  # the command line's words for the RowFilter's fields
            f"{EmptyFilterError.REFUSAL}; give at least one row filter: --benchmark, --instruction-id, --model, "
            "--model-a, --model-b, --judge, --orientation, --pair, "
            "--pointwise/--pairwise, --run-id, --created-by, --since, --until, --input-hash, --finish-reason, "
            "--empty/--non-empty, --error/--no-error, --adopted-from, --adopted/--not-adopted (--role, --task, "
            "--provider, --model-id and --descriptor only choose databases)"
        )
    return str(error)


def _last_defence(kwargs: dict[str, Any], error: sqlite3.Error | DBAPIError | OSError) -> JudgestoreError:
    """The typed error for a failure no library path translated, naming the store the command was given."""
    url = kwargs.get("store_url") or (None if kwargs.get("store_root") else os.environ.get("JUDGESTORE_STORE_URL"))
    url = url or kwargs.get("to_url") or kwargs.get("from_url")  # copy names its servers this way
    given = kwargs.get("store_root")
    root = Path(given) if given is not None else Path(os.environ.get("JUDGESTORE_STORE_ROOT", "judgestore-data"))
    return typed_error(error, root=root, url=url)


def command_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a command's :class:`JudgestoreError` into one line on stderr and exit status 1.

    Put it under ``app.command()``. A command whose ``json_output`` parameter
    (the ``--json`` option) is true gets the error as a JSON object instead.
    A Ctrl-C the command did not report itself (:func:`interrupted`) is the
    line "interrupted" (``{"error": "interrupted", "type": "Interrupted"}``),
    exit status 130.
    """

    def report(error: JudgestoreError, json_output: object) -> NoReturn:
        if json_output:
            # to_json: a path that is not UTF-8 (a file name of other bytes) is a \u escape, as in results
            sys.stderr.write(to_json(_error_payload(error), indent=False) + "\n")
        else:
            stderr().print(Text.assemble(("Error: ", "bold red"), _error_line(error)), soft_wrap=True)
        raise typer.Exit(1) from None

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        json_output = bool(kwargs.get("json_output"))
        # All as they were when the command returns.
        with warnings.catch_warnings(), _logged_warnings(json_output), held_signals_said_by(_held_line(json_output)):
            warnings.showwarning = functools.partial(_show_warning, json_output=json_output)
            return run(*args, **kwargs)

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                # A file name is bytes, which Python gives as lone surrogates where they are not UTF-8; printed, they
                # are those bytes again (a UTF-8 locale's stdout would refuse them: UnicodeEncodeError). A character
                # the stream's encoding lacks (a table's "…" to a latin-1 terminal) is its escape, not a traceback.
                stream.reconfigure(errors=_SHOWN_ANYWAY)
        given = sys.stdout
        _deleted.clear()
        try:
            if given is None:  # started with stdout closed (`>&-`): refuse before doing anything
                raise OutputWriteError("stdout", "the output", OSError(errno.EBADF, STDOUT_CLOSED))
            sys.stdout = _MarkedStdout(given)
            result = func(*args, **kwargs)
            sys.stdout.flush()  # output still buffered fails here, inside the edge, not at the exit
            return result
        except JudgestoreError as e:
            report(e, kwargs.get("json_output"))
        except (sqlite3.Error, DBAPIError, OSError) as e:  # the last line of defence: see the module docstring
            report(_stdout_error(e) or _last_defence(kwargs, e), kwargs.get("json_output"))
        except KeyboardInterrupt:  # a command that writes says what it left itself (interrupted); this one read
            interrupted("interrupted", bool(kwargs.get("json_output")))
        finally:
            sys.stdout = given

    return wrapper


STDOUT_CLOSED = "it is closed; give the command a stdout (`> out.txt`, or `> /dev/null` to discard it)"


def _shown_anyway(error: UnicodeError) -> tuple[str | bytes, int]:
    """The encoding error handler of the command line's streams: a file name's undecodable bytes (lone surrogates,
    as ``surrogateescape`` gives them) are those bytes again; any other character the encoding lacks is its
    ``\\uXXXX`` escape."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    chunk = error.object[error.start : error.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in chunk):
        return bytes(ord(c) - 0xDC00 for c in chunk), error.end
    return "".join(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in chunk), error.end


_SHOWN_ANYWAY = "judgestore-shown-anyway"
codecs.register_error(_SHOWN_ANYWAY, _shown_anyway)


class _MarkedStdout:
    """``sys.stdout`` while a command runs: an ``OSError`` writing or flushing it is marked as stdout's.

    A full or failing disk under stdout (``> /dev/full``) and under the store fail with the same errno; the mark
    lets the edge name stdout (:class:`OutputWriteError`), never the store. The error itself is unchanged (a
    ``BrokenPipeError`` still ends rich's output and :func:`rows_to_stdout` quietly); the rest is the stream's.
    """

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream

    def write(self, text: Any) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            e.judgestore_stdout = True  # type: ignore[attr-defined]
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            e.judgestore_stdout = True  # type: ignore[attr-defined]
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_error(error: BaseException) -> OutputWriteError | None:
    """The error to report for a failed write to stdout, or None when ``error`` is not one. A reader that
    stopped reading (``| head``) ends the command quietly with exit status 1, as rich does for a table."""
    if not (isinstance(error, OSError) and getattr(error, "judgestore_stdout", False)):
        return None
    with suppress(OSError, ValueError, io.UnsupportedOperation):  # the exit flushes stdout again: let it succeed
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())  # type: ignore[union-attr]
    if isinstance(error, BrokenPipeError):
        raise typer.Exit(1) from None
    typed = OutputWriteError("stdout", "the output", error)
    if _deleted:  # the report of a delete that was done: a script reading only the error would think nothing was
        rows = sum(count.rows for count in _deleted)
        typed.rows_deleted = rows
        typed.add_note(
            f"Before it, {quantity(rows, 'row')} {'was' if rows == 1 else 'were'} deleted from "
            f"{quantity(len(_deleted), 'database')}: every planned delete was done, only its report was lost."
        )
    return typed


_python_show_warning = warnings.showwarning
_OUR_LOGGERS = ("judgestore", "store", "inference")  # the loggers judgestore's modules log to, by their roots
# Libraries' whose warnings reach the user: shown as judgestore's are (the pool's, a connection it could not close)
_LIBRARY_LOGGERS = ("psycopg", "sqlalchemy.pool")


def _worth_showing(record: logging.LogRecord) -> bool:
    """psycopg's "error ignored terminating <Pipeline ...>" (or "exiting", "in rollback") follows an error that
    ended its pipeline, copy or transaction: that error is what the command reports (the line was bare on stderr,
    beside --json's objects). So does the pool's "Exception closing connection" of a Ctrl-C that landed in the close
    (it was a traceback on stderr): the interrupt is what the command reports."""
    if record.name.startswith("psycopg") and str(record.msg).startswith("error ignored"):
        return False
    interrupted = record.exc_info is not None and isinstance(record.exc_info[1], KeyboardInterrupt | SystemExit)
    return not (record.name.startswith("sqlalchemy.pool") and interrupted)


class _WarningLines(logging.Handler):
    """judgestore's own log records of WARNING and above (a hosted API's retries, a store that did not answer), and
    its driver's, as :func:`_show_warning` shows its warnings (Python's last-resort handler showed them as bare
    lines)."""

    def __init__(self, json_output: bool) -> None:
        super().__init__(logging.WARNING)
        self.json_output = json_output
        self.addFilter(_worth_showing)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info is not None and record.exc_info[1] is not None:  # a traceback's gist: what failed
                error = record.exc_info[1]
                message += f" ({type(error).__name__}: {error})" if str(error) else f" ({type(error).__name__})"
            _warning_line(message, "LogWarning", self.json_output)
        except Exception:  # a log line never ends a command
            self.handleError(record)


@contextmanager
def _logged_warnings(json_output: bool) -> Iterator[None]:
    """Show judgestore's log warnings while a command runs, as its warnings, and only so: they do not reach the
    process's own handlers meanwhile (a handler on the root logger printed each a second time)."""
    handler = _WarningLines(json_output)
    loggers = [logging.getLogger(name) for name in (*_OUR_LOGGERS, *_LIBRARY_LOGGERS)]
    propagated = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in zip(loggers, propagated, strict=True):
            logger.removeHandler(handler)
            logger.propagate = propagate


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: Any = None,
    *,
    json_output: bool = False,
) -> None:
    """judgestore's own warnings (a key that may mix models, a network filesystem) as one ``warning:`` line on
    stderr, as errors are shown (with --json, a JSON object: stderr carries only JSON there); anyone else's (a
    library's) as Python shows them."""
    if category.__module__.partition(".")[0] in ("store", "inference"):
        _warning_line(str(message), category.__name__, json_output)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


def _warning_line(message: str, kind: str, json_output: bool) -> None:
    if json_output:
        sys.stderr.write(to_json({"warning": message, "type": kind}, indent=False) + "\n")
        sys.stderr.flush()
    else:
        stderr().print(Text.assemble(("warning: ", "bold yellow"), message), soft_wrap=True)


def _held_line(json_output: bool) -> Callable[[str], None]:
    """How a command says a signal held back while its engine starts (:func:`store.interrupts.deferred_interrupts`):
    the plain line, or with --json a JSON object as a warning's (stderr carries only JSON there)."""

    def say(line: str) -> None:
        said = to_json({"warning": line, "type": "HeldInterrupt"}, indent=False) if json_output else line
        sys.stderr.write(said + "\n")
        sys.stderr.flush()

    return say


def to_json(value: object, *, indent: bool = True) -> str:
    """JSON text for results: paths as strings, NaN and infinities kept (:mod:`store.jsonvalues`); text that is
    not valid Unicode (a file name of bytes that are not UTF-8) as JSON's ``\\u`` escapes."""

    def default(v: object) -> object:
        # what orjson writes itself is written alike by the standard library's fallback below
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, datetime | date):
            return v.isoformat()
        if isinstance(v, enum.Enum):
            return v.value
        raise TypeError(f"not JSON serializable: {type(v).__name__}")

    option = orjson.OPT_INDENT_2 if indent else 0
    plain = jsonvalues.to_plain(value)
    try:
        return orjson.dumps(plain, default=default, option=option).decode()
    except orjson.JSONEncodeError:  # lone surrogates, integers past 64 bits: the standard library writes them
        return json.dumps(
            plain, default=default, indent=2 if indent else None, separators=(",", ": " if indent else ":")
        )


def record_deleted(report: dict[str, Any], deleted: Sequence[RowCount]) -> None:
    """Put what a delete or prune removed into its ``--json`` report: the total, and each database's rows by path."""
    report["deleted"] = sum(entry.rows for entry in deleted)
    by_path = {entry.where: entry.rows for entry in deleted}
    for entry in report["databases"]:
        entry["deleted"] = by_path.get(entry["path"], 0)


@contextmanager
def output_file(path: Path, what: str, *, after: str = "") -> Iterator[IO[bytes]]:
    """The output file opened for writing (stdout for '-' and for another name of stdout, ``/dev/stdout`` to a
    file opened with ``>>``, which reopening would truncate); a file is written whole or left as it was
    (:func:`store.outputs.replacing`). An ``OSError`` opening, writing or closing it is an
    :class:`OutputWriteError` naming it (``after``: what the user should know then), never blamed on the store."""
    if writes_stdout(path):
        # Marked as stdout's too (its text stream's wrapper leaves the buffer under it unmarked): a failed write
        # there was reported as the store's disk being full.
        yield cast(IO[bytes], _MarkedStdout(sys.stdout.buffer))
        sys.stdout.flush()
        return
    with replacing(path, "wb", what, after) as handle:
        yield handle


@contextmanager
def rows_to_stdout() -> Iterator[None]:
    """Around a command writing its rows to stdout: a reader that stopped reading (``| head``) has all it wanted,
    and ends the command quietly; a stdout that cannot be written (a full disk) is an :class:`OutputWriteError`,
    never the store's."""
    try:
        yield
        sys.stdout.flush()
    except OSError as e:
        with suppress(OSError, ValueError, io.UnsupportedOperation):  # to /dev/null: flushing at exit fails again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if not isinstance(e, BrokenPipeError):
            raise OutputWriteError("stdout", "the rows", e) from e


def planning_store(settings: Settings, *, dry_run: bool) -> Store:
    """The store a delete or a prune counts its rows in, before it asks: read-only, so nothing is written before
    the user confirms; read-write under ``auto_upgrade`` (not for a dry run), because a database that is behind
    must be upgraded before its rows can be counted, and that setting asked for it."""
    return Store(settings, readonly=dry_run or not settings.auto_upgrade)


def confirmed(question: str, *, yes: bool, json_output: bool) -> None:
    """Ask before a command deletes (unless ``--yes``); exits if the answer is not yes (status 1; Ctrl-C: 130, one
    line saying nothing was changed). ``--json`` never asks (stdout carries only its document, and a script has no
    one to answer), nor does a closed stdin: they need ``--yes``."""
    if yes:
        return
    if json_output:
        raise InvalidInputError("--json does not ask for confirmation: pass --yes to go ahead, or --dry-run")
    if sys.stdin is None or sys.stdin.closed:  # started with stdin closed (`<&-`): no one can answer
        raise InvalidInputError("cannot ask for confirmation: stdin is closed; pass --yes to go ahead, or --dry-run")
    try:  # read here, not by click's confirm: it makes Ctrl-C an "Aborted!" with exit status 1
        sys.stderr.write(f"{question} [y/N]: ")  # inside: a Ctrl-C the moment it is shown is at the question too
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        interrupted("interrupted at the question; nothing was changed", json_output)
    if answer.strip().lower() not in ("y", "yes"):  # no, or stdin at its end: nothing done, exit status 1
        sys.stderr.write("\n" if not answer else "")
        raise typer.Abort()


def interrupted(message: str, json_output: bool, **done: object) -> NoReturn:
    """Ctrl-C in a long command: one line on stderr, ``message``, saying what was done before the interrupt and
    the state it left, in the command's words; with ``--json`` a JSON object ``{"error": message, "type":
    "Interrupted", **done}`` (``done``: the counts the message gives). Exit status 130.

    The rows a command wrote to stdout before it are flushed first, so the line comes after them.
    """
    with suppress(OSError, ValueError):  # a reader gone (`| head`) or a stdout that fails: the line still goes
        sys.stdout.flush()
    if json_output:
        sys.stderr.write(to_json({"error": message, "type": "Interrupted", **done}, indent=False) + "\n")
    else:
        stderr().print(message, style="bold yellow", soft_wrap=True)
    _said.append(message)
    raise typer.Exit(130)


_said: list[str] = []  # what interrupted() said in this process: run_program says it where nothing did


def interrupt_said() -> bool:
    """Whether a command said what its interrupt left (:func:`interrupted`)."""
    return bool(_said)


def deleting(settings: Settings, delete: Callable[[Store], list[RowCount]], json_output: bool) -> list[RowCount]:
    """``delete`` on the store of ``settings``, what it deleted; Ctrl-C says what was deleted before it
    (:func:`deletion_interrupted`), also when it comes as the store closes, every delete done (it said "nothing was
    deleted" then, the rows gone)."""
    deleted: list[RowCount] | None = None
    try:
        with Store(settings) as store:
            deleted = delete(store)
        _deleted.extend(deleted)
    except KeyboardInterrupt as e:
        if deleted is not None and not hasattr(e, "rows_deleted"):
            rows = sum(count.rows for count in deleted)
            e.rows_deleted = rows  # type: ignore[attr-defined]  # as Store.delete_rows gives it
            e.add_note(
                f"Before it, {quantity(rows, 'row')} {'was' if rows == 1 else 'were'} deleted from "
                f"{quantity(len(deleted), 'database')}: every planned delete was done."
            )
        deletion_interrupted(e, json_output)
    return deleted


# What the running command deleted (:func:`deleting`), for a failure to write its report afterwards to say.
_deleted: list[RowCount] = []


def deletion_interrupted(error: KeyboardInterrupt, json_output: bool) -> NoReturn:
    """Ctrl-C in a command that deletes: what was deleted before it (the notes and ``rows_deleted``
    :meth:`Store.delete_rows` gave the interrupt), as :func:`interrupted` says it."""
    rows = getattr(error, "rows_deleted", None)
    message = (
        " ".join(["interrupted.", *getattr(error, "__notes__", ())]) if rows else "interrupted; nothing was deleted"
    )
    interrupted(message, json_output, rows_deleted=rows or 0)


def incomplete_output(written: int, fmt: str, where: str) -> str:
    """What :func:`interrupted` says of rows streamed to ``where`` (stdout, a pipe) when Ctrl-C stopped them: how
    many were written and that the output is incomplete (a JSON array left open never parses as complete)."""
    left = " and its JSON array is left open, so that it does not parse as complete" if fmt == "json" else ""
    # A row whose write Ctrl-C cut short may be out whole too: the stream may have taken it into its buffer before
    # the signal came, and what is in that buffer is written as the command ends (nothing tells which it was).
    return (
        f"interrupted after {quantity(written, 'row')} written to {where} (and perhaps the one being written as "
        f"Ctrl-C came): the {fmt} output is incomplete{left}"
    )


def quantity(count: int, noun: str) -> str:
    """A count and its noun as a message says them: ``1 row``, ``2,000 rows``, ``0 databases``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def writable_output(path: Path, option: str, inputs: Sequence[Path] = ()) -> None:
    """Refuse, before a command does its work, an output file it could not write at the end ('-' is stdout), or
    one that is one of its ``inputs`` (writing it would replace what the command read)."""
    if str(path) == "-":  # stdout, which a shell may have sent to an input (`-i prompts.jsonl >> prompts.jsonl`)
        for given in inputs:
            if str(given) != "-" and writes_stdout(given):
                raise InvalidInputError(
                    f"{option} - writes stdout, which is the input file {given}: send it to another file"
                )
        return
    if path.is_dir():
        raise InvalidInputError(f"{option} {path} is a folder, not a file")
    if not path.parent.is_dir():
        nearest = next((f for f in path.parents if f.exists()), None)  # the folder the path leaves, or a file
        if nearest is not None and not nearest.is_dir():
            raise InvalidInputError(f"{option} {path}: {nearest} is a file, not a folder")
        raise InvalidInputError(f"{option} {path}: there is no folder {path.parent}")
    for given in inputs:
        if path.exists() and given.exists() and path.samefile(given):
            raise InvalidInputError(f"{option} {path} is the input file {given}: write the results to another file")
    if writes_stdout(path) or written_in_place(path):  # a device or a pipe: only writing it tells
        return
    if path.exists() and not os.access(path, os.W_OK):  # as `>` would refuse it; a rename would not
        raise InvalidInputError(f"{option} {path}: this user may not write it (permission denied)")
    try:
        target = path.resolve()
    except (RuntimeError, OSError) as e:  # a link that leads back to itself (RuntimeError: Symlink loop)
        raise InvalidInputError(f"{option} {path}: a symbolic link that leads back to itself ({e})") from e
    folder = target.parent
    if not folder.is_dir():  # a link into a folder that is not there
        raise InvalidInputError(f"{option} {path}: it is a link to {target}, and there is no folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInputError(
            f"{option} {path}: this user may not write in {folder} (the file is written beside its destination, "
            "then renamed into place)"
        )


def outside_store(path: Path, option: str, root: Path) -> None:
    """Refuse an output file inside the store's folder ``root``: it would replace one of its databases (the rows in
    it lost) or lie among them, a stray file ``verify`` reports."""
    outside_folder(path, option, root, f"the store's folder {root}: its files are the store's (a database written "
                   "over loses its rows)")  # fmt: skip


def outside_folder(path: Path, option: str, folder: Path, whose: str) -> None:
    """Refuse an output file inside ``folder`` (``whose``: the folder as the refusal names it, and why it is not
    to be written in); stdout and what is written in place (a pipe, a device) are no file there."""
    if str(path) == "-" or writes_stdout(path) or written_in_place(path):
        return
    if Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder)):
        raise InvalidInputError(f"{option} {path} is inside {whose}; write it elsewhere")


def writes_stdout(path: Path) -> bool:
    """Whether writing ``path`` writes stdout: ``-``, or another name of the file stdout is (``/dev/stdout``, the
    file a shell redirected it to), where a JSON summary would land among the results."""
    if str(path) == "-":
        return True
    try:
        target, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file yet; a stdout that is no file (in-process runs)
        return False
    return (target.st_dev, target.st_ino) == (out.st_dev, out.st_ino)


def emit_json(value: object, *, beside_stdout_results: bool = False) -> None:
    """The command's JSON document on stdout; on stderr when stdout carries the command's JSONL results."""
    (sys.stderr if beside_stdout_results else sys.stdout).write(to_json(value) + "\n")


def later_rows_note(later: int, verb: str, *, json_output: bool) -> None:
    """The note of a delete or prune whose plan's time bound left out ``later`` rows its filters match
    (:attr:`store.rows.DeletePlan.later`); nothing when there are none."""
    if later:
        note(
            f"{quantity(later, 'row')} the filters match {'is' if later == 1 else 'are'} dated after this command "
            "began (written meanwhile, by a machine whose clock is ahead, or with a time another tool wrote) and "
            f"left out: {verb} again once that time has passed, or delete by --input-hash (`judgestore query` with "
            "the same filters lists them).",
            json_output=json_output,
        )


def note(message: str, *, json_output: bool) -> None:
    """Notes go to stderr, and never in --json mode (stderr carries only JSON errors there)."""
    if not json_output:
        stderr().print(Text(message, style="dim"), soft_wrap=True)


@contextmanager
def progress_bars(json_output: bool = False) -> Iterator[ProgressCallback]:
    """A progress callback drawing one transient bar per phase on stderr (a terminal only, never with --json).

    A phase's bar appears at its first call and goes once ``done`` reaches ``total``; a later call of that phase
    (the last count told twice, a phase run again) draws it anew.
    """
    console = stderr()
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=json_output or not console.is_terminal) as bars:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done, total=total)
            if total and done >= total:
                bars.remove_task(tasks.pop(phase))

        yield update


def counted(items: Iterable[T], total: int, phase: str) -> Iterator[T]:
    """Yield ``items`` while a bar (see :func:`progress_bars`) counts them."""
    with progress_bars() as progress:
        for done, item in enumerate(items, 1):
            yield item
            progress(phase, done, total)


# ---------------------------------------------------------------- tables

LONG_NAME_CELL = 48  # the widest a task, provider or model cell gets even with room (--json has the whole name)


def location_table(title: str, *extra: tuple[str, str]) -> FittedTable:
    """A table whose first columns say where a database is: role, task, provider, model, descriptor.

    ``extra`` columns (header, justification) hold counts, sizes and states:
    they are never shortened. Task, provider and model are shortened in the
    middle when the terminal is narrow, never so far that two different
    names look alike; the descriptor hash is always whole
    (:mod:`store.cli.tables`).
    """
    columns = [Column("Role")]
    columns += [Column(name, fit=Fit.MIDDLE, max_width=LONG_NAME_CELL) for name in ("Task", "Provider", "Model")]
    columns.append(Column("Descriptor"))
    columns += [Column(name, justify="right" if justify == "right" else "left") for name, justify in extra]
    return FittedTable(title, columns)


def location_cells(location: Location) -> tuple[str | Text, ...]:
    return (location.role, Text(location.task), Text(location.provider), Text(location.model),
            location.descriptor_hash16)  # fmt: skip


def state_text(info: DatabaseInfo) -> Text:
    return Text(info.state.value, style="green" if info.ok else "bold red")


def exit_if_unread(unread: int, total: int, *, json_output: bool, left_out: str = "") -> None:
    """End ``ls`` or ``stats``, after they listed every database they could, with exit status 1 when ``unread`` of
    the ``total`` listed could not be read (damaged, foreign, unreadable, behind...): one line on stderr that says
    how many and the next step, as ``verify`` and ``db status`` exit (with ``--json``, the document says so and
    stderr stays clear). ``left_out``: what of them the listing lacks."""
    if not unread:
        return
    if not json_output:
        said = f"{unread} of {quantity(total, 'database')} could not be read"
        said += f" ({left_out})" if left_out else ""
        next_step = "`judgestore db status` says what each needs (`db upgrade` if behind, else `verify`)"
        stderr().print(Text(f"{said}; {next_step}.", style="bold red"), soft_wrap=True)
    raise typer.Exit(1)


def report_unlisted(problems: Sequence[Problem], *, json_output: bool) -> bool:
    """Say on stderr which databases the listing left out (:meth:`~store.store.Store.unlisted`: a server's schema
    without its registry row...), one line each, or one JSON object (``"unlisted"``: each problem) with
    ``--json``; whether there were any (the command then exits 1)."""
    if not problems:
        return False
    said = f"{quantity(len(problems), 'database')} of the store left out of this listing"
    if json_output:
        payload = {"error": said, "type": "UnlistedDatabases", "unlisted": [p.as_dict() for p in problems]}
        sys.stderr.write(to_json(payload, indent=False) + "\n")
    else:
        stderr().print(Text(f"{said} (`judgestore verify` lists them too):", style="bold red"), soft_wrap=True)
        for problem in problems:
            stderr().print(Text(f"  {problem.message}"), soft_wrap=True)
    return True


def print_claims(entries: Iterable[tuple[Location, ClaimsSummary | None]]) -> None:
    """One line per database with shared-batch work in progress or stale leases (``ls``, ``stats``, ``db status``)."""
    for location, claims in entries:
        if claims is None or not (claims.in_progress or claims.left_over or claims.stale):
            continue
        name = f"{location.model} ({location.descriptor_hash16}, {location.role}/{location.task})"
        if claims.in_progress:
            stdout().print(f"in progress: {name}: {claims.short()}", highlight=False)  # wrapped, as a table is
        elif claims.left_over:  # it said "in progress" for an hour after the batch's last job stopped
            stdout().print(
                f"left over: {name}: {claims.short()}; no job holds a lease (a shared batch that stopped: run it "
                "again to finish it, or one that is starting)",
                highlight=False,
            )
        if claims.stale:
            who = (  # with no live lease, there may be no job to take them over (it said the others would)
                "the batch's other jobs take them over, and a job started on it again does"
                if claims.in_progress
                else "no job holds a live lease: if none is still running, run the batch again to take them over"
            )
            stderr().print(
                Text(
                    f"stale leases: {name}: {claims.stale} past their deadline (a job of a shared batch died or "
                    f"stalled); {who}",
                    style="yellow",
                )
            )


def unprefixed(message: str, where: Path | str) -> str:
    """A message without its leading ``{where}: `` (for tables whose first column already names the place)."""
    return message.removeprefix(f"{where}: ")


_SELECTOR_OPTIONS = {"role": "--role", "task": "--task", "provider": "--provider", "model": "--model-id",
                     "descriptor": "--descriptor"}  # fmt: skip


def no_rows(store: Store, json_output: bool, selector: Selector, flt: RowFilter | None = None) -> None:
    """After a command found no rows: say so when it is because there is no database to read (a mistyped
    ``--store-root``, a selector that picks none, or only databases of a role ``flt``'s filters never match),
    not because the filters matched nothing."""
    picked = store.select(selector)
    if not picked:
        no_databases(store, json_output, selector)
        return
    roles = roles_for(flt, selector.role) if flt is not None else ROLES
    if not any(location.role in roles for location in picked):
        held = " and ".join(sorted({location.role for location in picked}))
        note(
            f"{quantity(len(picked), 'database')} picked, holding only {held}; the row filters given match only "
            f"{' and '.join(roles)}.",
            json_output=json_output,
        )
    elif flt is not None:
        for hint in _values_no_row_holds(store, [location for location in picked if location.role in roles], flt):
            note(hint, json_output=json_output)


# The row filters whose values the catalog knows: the option, and the columns holding its values in each role
_VALUE_FILTERS: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "benchmark": ("--benchmark", {"completions": ("benchmark",), "judgements": ("benchmark",)}),
    "model": ("--model", {"completions": ("model",), "judgements": ("model_a", "model_b")}),
    "model_a": ("--model-a", {"judgements": ("model_a",)}),
    "model_b": ("--model-b", {"judgements": ("model_b",)}),
    "judge": ("--judge", {"judgements": ("judge",)}),
    "run_id": ("--run-id", {"completions": ("run_id",), "judgements": ("run_id",)}),
}
_VALUES_SHOWN = 5


def _values_no_row_holds(store: Store, locations: list[Location], flt: RowFilter) -> list[str]:
    """What to say of each filter value no row of ``locations`` holds (a misspelling, a model's path where rows
    record its name), by the values the catalog knows; nothing where it does not know them all."""
    values = store.storage.column_values(locations)
    said = []
    for name, (option, columns) in _VALUE_FILTERS.items():
        given = getattr(flt, name)
        if given is None:
            continue
        held: set[str] = set()
        for location in locations:
            known = values[location]
            found = [None if known is None else known.get(column) for column in columns.get(location.role, ())]
            if any(column is None for column in found):
                break  # not known: no word on it
            # text only: a BLOB another tool stored there is no value a filter names (sorting it with text crashed)
            held.update(value for column in found for value in column or () if isinstance(value, str))
        else:
            if given in held:
                continue
            base = given.rstrip("/").rsplit("/", 1)[-1]  # generate --model /models/qwen records the rows as "qwen"
            guess = base if base != given and base in held else meant(given, held)
            shown = ", ".join(map(repr, sorted(held)[:_VALUES_SHOWN])) + (", ..." if len(held) > _VALUES_SHOWN else "")
            said.append(
                f"No row here has {option} {given!r}"
                + (f"; did you mean {guess!r}?" if guess else f" (they hold {shown})." if held else ".")
            )
    return said


def unmatched(store: Store, selector: Selector) -> str | None:
    """The sentence saying that ``selector`` (a mistyped ``--descriptor``, say) picks none of the store's databases;
    None when it picks some, or the store holds none."""
    chosen = " ".join(f"{_SELECTOR_OPTIONS[name]} {value}" for name, value in selector.as_dict().items() if value)
    if not chosen or store.select(selector):
        return None
    try:
        held = len(store.locations())
    except DatabaseIOError:  # a folder elsewhere closed to this user: the selection never looked there
        return f"No database in {store.where} matches {chosen} (`judgestore ls` lists them)"
    if held:
        held_said = quantity(held, "database")
        return f"No database in {store.where} matches {chosen} ({held_said} in all; `judgestore ls` lists them)"
    return None


def no_databases(store: Store, json_output: bool, selector: Selector) -> None:
    """Say that a command found no database: the store has none (and why), or none that ``selector`` picks."""
    if (said := unmatched(store, selector)) is not None:
        note(f"{said}.", json_output=json_output)
        return
    why = store.storage.absence()
    note(f"No databases in {store.where}{f' ({why})' if why else ''}.", json_output=json_output)
