"""What every ``judgestore`` command shares: the error edge, the options, and the rendering helpers.

Contract:

* :func:`command_errors` is the edge: a :class:`~store.errors.JudgestoreError`
  becomes one line on stderr, its notes after it (with ``--json``: a JSON
  object with ``error``, ``type`` and, when known, ``path``, ``notes`` and
  ``rows_kept``) and exit status 1. An SQLite, driver or filesystem error
  that a library path failed to translate is translated here
  (:func:`store.engine.translated`, naming the file the error names, else
  the store root): no command prints a Python traceback for a bad file or
  a bad disk. Usage errors exit 2 (click).
* stdout carries only the result (a table, JSON, JSONL or CSV); progress
  bars, notes and errors go to stderr, and bars only on a terminal, never with
  ``--json``.
* One name per option meaning, across all commands: ``--store-root`` or
  ``--store-url`` (:func:`store_settings`) and ``--json`` everywhere; databases are chosen with ``--role --task
  --provider --model-id --descriptor`` (:func:`selection`); rows are filtered
  with ``--benchmark --instruction-id --model --model-a --model-b --judge
  --orientation --pair --pointwise/--pairwise --run-id --created-by --since
  --until --input-hash --finish-reason --empty/--non-empty --error/--no-error
  --adopted-from --adopted/--not-adopted`` (:func:`row_filter`); ``--model`` names the model of
  the rows (a row filter) in the data commands and the model to run in
  ``generate``/``judge``.
* :func:`grouped` lets a command take a whole group of options as one value
  (a :class:`~store.layout.Selector`, a :class:`~store.records.RowFilter`):
  the group is declared once, by the function that builds the value.
* Tables fit the terminal: cells end in an ellipsis instead of wrapping one
  character per line (:func:`location_table`, :func:`fit`).
"""

from __future__ import annotations

import enum
import functools
import inspect
import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy.exc import DBAPIError

from store import jsonvalues, postgres
from store.engine import translated
from store.errors import EmptyFilterError, InvalidInputError, JudgestoreError, ServerError
from store.layout import Location, Selector
from store.postgres import display_url
from store.records import ERROR_FINISH_REASONS, RowCount, RowFilter, parse_timestamp
from store.schema import DatabaseInfo
from store.settings import Settings
from store.store import Store

if TYPE_CHECKING:  # store.sync is imported by the hub commands alone (see store.cli.app)
    from store.sync.workspace import ProgressCallback

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

STORE_PANEL = "Store"
SELECT_PANEL = "Select databases"
LONG_NAME_CELL = 48  # the widest a task, provider or model cell of a table gets (--json has the whole name)
FILTER_PANEL = "Filter rows"


class RoleChoice(enum.StrEnum):
    completions = "completions"
    judgements = "judgements"


class OrientationChoice(enum.StrEnum):
    direct = "direct"
    reversed = "reversed"


# ---------------------------------------------------------------- the edge


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=False)


def stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _error_payload(error: JudgestoreError) -> dict[str, object]:
    payload: dict[str, object] = {"error": str(error), "type": type(error).__name__}
    path = getattr(error, "path", None)
    if path is not None:
        payload["path"] = str(path)
    if getattr(error, "__notes__", None):
        payload["notes"] = list(error.__notes__)
    if error.rows_kept is not None:
        payload["rows_kept"] = error.rows_kept
    return payload


def _error_line(error: JudgestoreError) -> str:
    if isinstance(error, EmptyFilterError):
        return (
            f"{error} (row filters: --benchmark, --instruction-id, --model, --model-a, --model-b, --judge, "
            "--orientation, --pair, --pointwise/--pairwise, --run-id, --created-by, --since, --until, --input-hash, "
            "--finish-reason, --empty/--non-empty, --error/--no-error, --adopted-from, --adopted/--not-adopted; "
            "--role, --task, --provider, --model-id and --descriptor only choose databases)"
        )
    return " ".join([str(error), *getattr(error, "__notes__", ())])


def _last_defence(kwargs: dict[str, Any], error: sqlite3.Error | DBAPIError | OSError) -> JudgestoreError:
    """The typed error for a failure no library path translated, naming the store the command was given."""
    url = kwargs.get("store_url") or (None if kwargs.get("store_root") else os.environ.get("JUDGESTORE_STORE_URL"))
    if url and isinstance(error, DBAPIError):
        typed = postgres.translated(url, error)
        return typed if isinstance(typed, JudgestoreError) else ServerError(display_url(url), str(error.orig or error))
    given = kwargs.get("store_root")
    root = Path(given) if given is not None else Path(os.environ.get("JUDGESTORE_STORE_ROOT", "judgestore-data"))
    return translated(root, error)


def command_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a command's :class:`JudgestoreError` into one line on stderr and exit status 1.

    Put it under ``app.command()``. A command whose ``json_output`` parameter
    (the ``--json`` option) is true gets the error as a JSON object instead.
    """

    def report(error: JudgestoreError, json_output: object) -> NoReturn:
        if json_output:
            sys.stderr.write(orjson.dumps(_error_payload(error)).decode() + "\n")
        else:
            stderr().print(Text.assemble(("Error: ", "bold red"), _error_line(error)), soft_wrap=True)
        raise typer.Exit(1) from None

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except JudgestoreError as e:
            report(e, kwargs.get("json_output"))
        except (sqlite3.Error, DBAPIError, OSError) as e:  # the last line of defence: see the module docstring
            report(_last_defence(kwargs, e), kwargs.get("json_output"))

    return wrapper


def environment_settings() -> Settings:
    """Settings from the environment; a bad ``JUDGESTORE_*`` value is an :class:`InvalidInputError`."""
    try:
        return Settings()
    except ValidationError as e:
        wrong = "; ".join(f"JUDGESTORE_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors())
        raise InvalidInputError(f"invalid setting in the environment: {wrong}") from e


def store_settings(
    store_root: Annotated[
        Path | None,
        typer.Option(
            "--store-root",
            metavar="PATH",
            show_default=False,
            help="Store root folder (default: $JUDGESTORE_STORE_ROOT, else ./judgestore-data).",
            rich_help_panel=STORE_PANEL,
        ),
    ] = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store-url",
            metavar="URL",
            show_default=False,
            help="A PostgreSQL store, e.g. postgresql+psycopg://user@host/db (default: $JUDGESTORE_STORE_URL).",
            rich_help_panel=STORE_PANEL,
        ),
    ] = None,
) -> Settings:
    """The ``--store-root`` / ``--store-url`` group: the settings, naming the store a command works on.

    An explicit option wins over the environment: ``--store-root`` means that
    folder even when ``JUDGESTORE_STORE_URL`` is set. Without either, the
    settings decide (``JUDGESTORE_STORE_URL``, else ``JUDGESTORE_STORE_ROOT``,
    else ``./judgestore-data``). ``Store(settings)`` opens it.
    """
    if store_root is not None and store_url is not None:
        raise InvalidInputError("--store-root and --store-url name two stores; give one")
    settings = environment_settings()
    if store_root is not None:
        return settings.model_copy(update={"store_root": store_root, "store_url": None})
    if store_url is not None:
        return settings.model_copy(update={"store_url": store_url})
    return settings


def to_json(value: object, *, indent: bool = True) -> str:
    """JSON text for results: paths as strings, NaN and infinities kept (:mod:`store.jsonvalues`)."""

    def default(v: object) -> object:
        if isinstance(v, Path):
            return str(v)
        raise TypeError(f"not JSON serializable: {type(v).__name__}")

    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(jsonvalues.to_plain(value), default=default, option=option).decode()


def record_deleted(report: dict[str, Any], deleted: Sequence[RowCount]) -> None:
    """Put what a delete or prune removed into its ``--json`` report: the total, and each database's rows by path."""
    report["deleted"] = sum(entry.rows for entry in deleted)
    by_path = {entry.where: entry.rows for entry in deleted}
    for entry in report["databases"]:
        entry["deleted"] = by_path.get(entry["path"], 0)


def emit_json(value: object) -> None:
    sys.stdout.write(to_json(value) + "\n")


def note(message: str, *, json_output: bool) -> None:
    """Notes go to stderr, and never in --json mode (stderr carries only JSON errors there)."""
    if not json_output:
        stderr().print(Text(message, style="dim"), soft_wrap=True)


@contextmanager
def progress_bars(json_output: bool = False) -> Iterator[ProgressCallback]:
    """A progress callback drawing one transient bar per phase on stderr (a terminal only, never with --json).

    A phase's bar appears at its first call and goes once ``done`` reaches ``total``.
    """
    console = stderr()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=json_output or not console.is_terminal) as bars:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done, total=total)
            if total and done >= total:
                bars.remove_task(tasks[phase])

        yield update


def counted(items: Iterable[T], total: int, phase: str) -> Iterator[T]:
    """Yield ``items`` while a bar (see :func:`progress_bars`) counts them."""
    with progress_bars() as progress:
        for done, item in enumerate(items, 1):
            yield item
            progress(phase, done, total)


# ---------------------------------------------------------------- option groups


def grouped(**builders: Callable[..., Any]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Replace each named parameter of a command by the options of its builder, and pass the built value.

    ``@grouped(selector=selection)`` gives the command every option
    :func:`selection` declares; the command receives ``selector=selection(...)``.
    """

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        group_params = {
            name: list(inspect.signature(b, eval_str=True).parameters.values()) for name, b in builders.items()
        }
        params = [p for p in signature.parameters.values() if p.name not in builders]
        params += [p for group in group_params.values() for p in group]
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first, order kept

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            for name, builder in builders.items():
                kwargs[name] = builder(**{p.name: kwargs.pop(p.name) for p in group_params[name]})
            return command(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


JsonOutput = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout; errors as JSON on stderr.")]


def selection(
    role: Annotated[
        RoleChoice | None, typer.Option("--role", help="Only this role.", rich_help_panel=SELECT_PANEL)
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="Only this task.", rich_help_panel=SELECT_PANEL)] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Only this provider (e.g. vllm).", rich_help_panel=SELECT_PANEL)
    ] = None,
    model_id: Annotated[
        str | None,
        typer.Option(
            "--model-id",
            help="Only descriptors of this model (a Hub id, or a local folder's name).",
            rich_help_panel=SELECT_PANEL,
        ),
    ] = None,
    descriptor: Annotated[
        str | None,
        typer.Option(
            "--descriptor", metavar="HASH", help="Descriptor hash or a prefix of it.", rich_help_panel=SELECT_PANEL
        ),
    ] = None,
) -> Selector:
    """The databases chosen by ``--role --task --provider --model-id --descriptor``."""
    return Selector(
        role=None if role is None else role.value,  # type: ignore[arg-type]
        task=task,
        provider=provider,
        model=model_id,
        descriptor=descriptor,
    )


def _timestamp(value: str) -> datetime:
    try:
        return parse_timestamp(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e


def _filter(name: str, help_text: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(name, help=help_text, rich_help_panel=FILTER_PANEL, **kwargs)


def row_filter(
    benchmark: Annotated[str | None, _filter("--benchmark")] = None,
    instruction_id: Annotated[str | None, _filter("--instruction-id")] = None,
    model: Annotated[
        str | None, _filter("--model", "Completions of this model; judgements where it is model_a or model_b.")
    ] = None,
    model_a: Annotated[str | None, _filter("--model-a", "(judgements) The model whose answer is shown first.")] = None,
    model_b: Annotated[str | None, _filter("--model-b", "(judgements) The model whose answer is shown second.")] = None,
    judge: Annotated[str | None, _filter("--judge", "(judgements)")] = None,
    orientation: Annotated[
        OrientationChoice | None,
        _filter("--orientation", "(judgements) direct or reversed, relative to the source pair."),
    ] = None,
    pair: Annotated[
        list[str] | None,
        _filter("--pair", "(judgements) Give twice: every judgement of the pair, both orientations.", metavar="MODEL"),
    ] = None,
    pointwise: Annotated[
        bool | None,
        _filter(
            "--pointwise/--pairwise", "Only pointwise (no model_b) or only pairwise judgements.", show_default=False
        ),
    ] = None,
    run_id: Annotated[str | None, _filter("--run-id")] = None,
    created_by: Annotated[str | None, _filter("--created-by")] = None,
    since: Annotated[
        datetime | None,
        _filter("--since", "created_at >= TIME (ISO-8601; no offset means UTC).", parser=_timestamp, metavar="TIME"),
    ] = None,
    until: Annotated[
        datetime | None,
        _filter("--until", "created_at < TIME (ISO-8601; no offset means UTC).", parser=_timestamp, metavar="TIME"),
    ] = None,
    input_hash: Annotated[list[str] | None, _filter("--input-hash", "This row (repeatable).", metavar="HASH")] = None,
    finish_reason: Annotated[
        list[str] | None,
        _filter(
            "--finish-reason",
            "Rows that finished for this reason (repeatable): length (truncated at max_tokens), stop, ...",
            metavar="REASON",
        ),
    ] = None,
    empty: Annotated[
        bool | None,
        _filter(
            "--empty/--non-empty", "Only empty (or whitespace) completions, or only the others.", show_default=False
        ),
    ] = None,
    error: Annotated[
        bool | None,
        _filter(
            "--error/--no-error",
            f"Only error rows (finish reason {', '.join(ERROR_FINISH_REASONS)}), or only the others.",
            show_default=False,
        ),
    ] = None,
    adopted_from: Annotated[
        str | None,
        _filter(
            "--adopted-from",
            "Rows `judgestore adopt` copied from this descriptor (its hash or a prefix).",
            metavar="HASH",
        ),
    ] = None,
    adopted: Annotated[
        bool | None,
        _filter(
            "--adopted/--not-adopted",
            "Only rows adopted from older descriptors, or only the others.",
            show_default=False,
        ),
    ] = None,
) -> RowFilter:
    """The rows chosen by the row filter options (see the module docstring)."""
    if pair is not None and len(pair) != 2:
        raise typer.BadParameter(f"give --pair exactly twice (the two models), got {len(pair)}", param_hint="--pair")
    return RowFilter(
        benchmark=benchmark,
        instruction_id=instruction_id,
        model=model,
        model_a=model_a,
        model_b=model_b,
        judge=judge,
        orientation=None if orientation is None else orientation.value,  # type: ignore[arg-type]
        pair=None if pair is None else (pair[0], pair[1]),
        pointwise=pointwise,
        run_id=run_id,
        created_by=created_by,
        created_after=since,
        created_before=until,
        input_hashes=tuple(input_hash) if input_hash else None,
        finish_reasons=tuple(finish_reason) if finish_reason else None,
        empty=empty,
        error=error,
        adopted_from=adopted_from,
        adopted=adopted,
    )


# ---------------------------------------------------------------- tables


def fit(value: str, width: int) -> str:
    """``value`` on one line, cut to ``width`` characters with an ellipsis."""
    line = " ".join(value.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def location_table(title: str, *extra: tuple[str, str]) -> Table:
    """A table whose first columns say where a database is: role, task, provider, model, descriptor.

    Long names end in an ellipsis (the descriptor hash is always whole), so a
    row stays one line in an 80-column terminal.
    """
    table = Table(title=title, title_justify="left")
    table.add_column("Role", no_wrap=True, max_width=11)
    for name in ("Task", "Provider", "Model"):  # a name of hundreds of characters must not push the rest out
        table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=4, max_width=LONG_NAME_CELL)
    table.add_column("Descriptor", no_wrap=True, min_width=16)
    for name, justify in extra:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return table


def location_cells(location: Location) -> tuple[str | Text, ...]:
    return (location.role, Text(location.task), Text(location.provider), Text(location.model),
            location.descriptor_hash16)  # fmt: skip


def state_text(info: DatabaseInfo) -> Text:
    return Text(info.state.value, style="green" if info.ok else "bold red")


def relative(where: Path | str, root: Path | None) -> str:
    """A file under the store root relative to it; anything else (a server's schema) as it is."""
    if root is None or (isinstance(where, str) and "://" in where):
        return str(where)
    try:
        return str(Path(where).relative_to(root))
    except ValueError:
        return str(where)


def unprefixed(message: str, where: Path | str) -> str:
    """A message without its leading ``{where}: `` (for tables whose first column already names the place)."""
    return message.removeprefix(f"{where}: ")


def no_databases(store: Store, json_output: bool) -> None:
    missing = store.storage.root is not None and not store.storage.root.is_dir()
    note(f"No databases in {store.where}{' (the folder does not exist)' if missing else ''}.", json_output=json_output)
