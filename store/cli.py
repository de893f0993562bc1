"""The data commands of ``judgestore``: ls, query, delete, verify, db status, db upgrade.

Contract:

* Thin: every command parses its options, calls :mod:`store.inspect` (and
  through it :mod:`store.schema`), and renders the result: a rich table, or
  with ``--json`` JSON on stdout. No behaviour lives only here.
* Every command takes ``--store-root`` (default ``Settings().store_root``:
  ``$JUDGESTORE_STORE_ROOT`` or ``./judgestore-data``) and ``--json``.
* stdout carries only the result (table, JSON, JSONL or CSV); progress bars,
  notes, confirmation prompts and errors go to stderr.
* Every :class:`~store.errors.JudgestoreError` is caught at this edge and
  printed as one line (with ``--json``: a JSON object with ``error``, ``type``
  and, when known, ``path``) with exit status 1. Usage errors exit 2 (click).
  ``db status``, ``db upgrade`` and ``verify`` exit 1 when they find a problem.
* ``app`` is importable and extensible: ``inference/cli.py`` adds its commands
  to it, reusing :data:`StoreRoot`, :data:`JsonOutput`, :func:`settings_and_root`
  and :func:`command_errors` (the same options and the same error edge).
  This module imports nothing from ``inference``.
"""

from __future__ import annotations

import csv
import enum
import functools
import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from store import schema
from store.errors import EmptyFilterError, InvalidInputError, JudgestoreError
from store.inspect import (
    DatabaseInfo,
    FoundRow,
    Selector,
    inspect_databases,
    parse_timestamp,
    plan_delete,
    query_rows,
    roles_for,
    row_columns,
    select,
    stray_paths,
    upgrade_store,
    verify_database,
)
from store.inspect import delete_rows as delete_matching_rows
from store.layout import Location
from store.records import RowFilter
from store.schema import UpgradeOutcome, UpgradeResult
from store.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

TABLE_ROWS = 100  # `query --format table` without --limit shows this many rows
CELL_WIDTH = 40

app = typer.Typer(
    name="judgestore",
    help="A content-addressed store of LLM completions and judgements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
db_app = typer.Typer(name="db", help="Schema revisions of the databases: status and upgrade.", no_args_is_help=True)
app.add_typer(db_app, name="db")


class RoleChoice(enum.StrEnum):
    completions = "completions"
    judgements = "judgements"


class OrientationChoice(enum.StrEnum):
    direct = "direct"
    reversed = "reversed"


class OutputFormat(enum.StrEnum):
    table = "table"
    jsonl = "jsonl"
    csv = "csv"
    json = "json"


def _timestamp(value: str) -> datetime:
    try:
        return parse_timestamp(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e


_SELECT = "Select databases"
_FILTER = "Filter rows"

StoreRoot = Annotated[
    Path | None,
    typer.Option(
        "--store-root",
        metavar="PATH",
        show_default=False,
        help="Store root folder (default: $JUDGESTORE_STORE_ROOT, else ./judgestore-data).",
    ),
]
JsonOutput = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout; errors as JSON on stderr.")]
RoleOption = Annotated[RoleChoice | None, typer.Option("--role", help="Only this role.", rich_help_panel=_SELECT)]
TaskOption = Annotated[str | None, typer.Option("--task", help="Only this task.", rich_help_panel=_SELECT)]
ProviderOption = Annotated[
    str | None, typer.Option("--provider", help="Only this provider (e.g. vllm).", rich_help_panel=_SELECT)
]
ModelIdOption = Annotated[
    str | None,
    typer.Option("--model-id", help="Only descriptors of this model (e.g. Qwen/Qwen3-8B).", rich_help_panel=_SELECT),
]
DescriptorOption = Annotated[
    str | None,
    typer.Option("--descriptor", metavar="HASH", help="Descriptor hash or a prefix of it.", rich_help_panel=_SELECT),
]
BenchmarkOption = Annotated[str | None, typer.Option("--benchmark", rich_help_panel=_FILTER)]
InstructionOption = Annotated[str | None, typer.Option("--instruction-id", rich_help_panel=_FILTER)]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", help="Completions of this model; judgements where it is model_a or model_b.", rich_help_panel=_FILTER
    ),
]
ModelAOption = Annotated[
    str | None,
    typer.Option(
        "--model-a", help="(judgements) The model whose answer the prompt shows first.", rich_help_panel=_FILTER
    ),
]
ModelBOption = Annotated[
    str | None,
    typer.Option("--model-b", help="(judgements) The model whose answer is shown second.", rich_help_panel=_FILTER),
]
JudgeOption = Annotated[str | None, typer.Option("--judge", help="(judgements)", rich_help_panel=_FILTER)]
OrientationOption = Annotated[
    OrientationChoice | None,
    typer.Option(
        "--orientation", help="(judgements) direct or reversed, relative to the source pair.", rich_help_panel=_FILTER
    ),
]
PairOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pair",
        metavar="MODEL",
        help="(judgements) Give twice: every judgement of the pair, both orientations (slots X,Y or Y,X).",
        rich_help_panel=_FILTER,
    ),
]
PointwiseOption = Annotated[
    bool | None,
    typer.Option(
        "--pointwise/--pairwise",
        show_default=False,
        help="Only pointwise (no model_b) or only pairwise judgements.",
        rich_help_panel=_FILTER,
    ),
]
RunIdOption = Annotated[str | None, typer.Option("--run-id", rich_help_panel=_FILTER)]
CreatedByOption = Annotated[str | None, typer.Option("--created-by", rich_help_panel=_FILTER)]
SinceOption = Annotated[
    datetime | None,
    typer.Option(
        "--since",
        parser=_timestamp,
        metavar="TIME",
        help="created_at >= TIME (ISO-8601 date or date-time; no offset means UTC).",
        rich_help_panel=_FILTER,
    ),
]
UntilOption = Annotated[
    datetime | None,
    typer.Option(
        "--until",
        parser=_timestamp,
        metavar="TIME",
        help="created_at < TIME (ISO-8601; no offset means UTC).",
        rich_help_panel=_FILTER,
    ),
]
InputHashOption = Annotated[
    list[str] | None,
    typer.Option("--input-hash", metavar="HASH", help="This row (repeatable).", rich_help_panel=_FILTER),
]


# ---------------------------------------------------------------- the edge


def _stdout() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _error_payload(error: JudgestoreError) -> dict[str, str]:
    payload = {"error": str(error), "type": type(error).__name__}
    path = getattr(error, "path", None)
    if path is not None:
        payload["path"] = str(path)
    return payload


def _error_line(error: JudgestoreError) -> str:
    if isinstance(error, EmptyFilterError):
        return (
            f"{error} (row filters: --benchmark, --instruction-id, --model, --model-a, --model-b, --judge, "
            "--orientation, --pair, --pointwise/--pairwise, --run-id, --created-by, --since, --until, --input-hash; "
            "--role, --task, --provider, --model-id and --descriptor only choose databases)"
        )
    return str(error)


def command_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a command's :class:`JudgestoreError` into one line on stderr and exit status 1.

    Put it under ``@app.command()``. A command whose ``json_output`` parameter
    (the ``--json`` option) is true gets the error as a JSON object instead.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except JudgestoreError as e:
            if kwargs.get("json_output"):
                sys.stderr.write(orjson.dumps(_error_payload(e)).decode() + "\n")
            else:
                _stderr().print(Text.assemble(("Error: ", "bold red"), _error_line(e)), soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def settings_and_root(store_root: Path | None) -> tuple[Settings, Path]:
    """Settings from the environment, and the store root: ``--store-root`` if given, else the settings' one."""
    try:
        settings = Settings()
    except ValidationError as e:
        wrong = "; ".join(f"JUDGESTORE_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors())
        raise InvalidInputError(f"invalid setting in the environment: {wrong}") from e
    return settings, store_root if store_root is not None else settings.store_root


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _json(value: object, *, indent: bool = True) -> str:
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, default=_json_default, option=option).decode()


def _emit_json(value: object) -> None:
    sys.stdout.write(_json(value) + "\n")


def _note(message: str, *, json_output: bool) -> None:
    """Notes go to stderr, and never in --json mode (stderr carries only JSON errors there)."""
    if not json_output:
        _stderr().print(Text(message, style="dim"))


def _progress(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    """Yield ``items`` while a transient progress bar on stderr (a terminal only) counts them."""
    console = _stderr()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        yield from progress.track(items, total=total, description=description)


def _selector(
    role: RoleChoice | None, task: str | None, provider: str | None, model_id: str | None, descriptor: str | None
) -> Selector:
    return Selector(
        role=None if role is None else role.value,  # type: ignore[arg-type]
        task=task,
        provider=provider,
        model=model_id,
        descriptor=descriptor,
    )


def _where(location: Location) -> str:
    return str(location.relative_folder())


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _unprefixed(message: str, path: Path) -> str:
    """A message without its leading ``{path}: `` (for tables whose first column already names the file)."""
    return message.removeprefix(f"{path}: ")


def _no_databases(root: Path, json_output: bool) -> None:
    where = "" if root.is_dir() else " (the folder does not exist)"
    _note(f"No databases under {root}{where}.", json_output=json_output)


# ---------------------------------------------------------------- ls


@app.command("ls")
@command_errors
def ls_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """List every database: role, task, provider, model, descriptor, rows, size, schema state.

    Read-only: never writes anything. States: current, empty, behind, ahead,
    foreign, not-a-database, corrupt, unreadable, metadata-missing, metadata-mismatch.

    Examples:

        judgestore ls

        judgestore ls --role judgements --json
    """
    settings, root = settings_and_root(store_root)
    locations = select(root, _selector(role, task, provider, model_id, descriptor))
    infos = list(_progress(inspect_databases(root, locations, settings), len(locations), "Reading"))
    if json_output:
        _emit_json([info.as_dict() for info in infos])
        return
    if not infos:
        _no_databases(root, json_output)
        return
    table = _location_table(f"Databases under {root}", ("Rows", "right"), ("Size", "right"), ("State", "left"))
    for info in infos:
        count = "" if info.rows is None else f"{info.rows:,}"
        table.add_row(*_location_cells(info.location), count, decimal(info.size_bytes), _state_text(info))
    rows = sum(info.rows or 0 for info in infos)
    size = sum(info.size_bytes for info in infos)
    table.caption = f"{len(infos)} databases, {rows:,} rows, {decimal(size)}"
    _stdout().print(table)


def _location_table(title: str, *extra: tuple[str, str]) -> Table:
    """A table whose first columns say where a database is: role, task, provider, model, descriptor."""
    table = Table(title=title, title_justify="left")
    table.add_column("Role", no_wrap=True)
    table.add_column("Task")
    table.add_column("Provider")
    table.add_column("Model", overflow="fold")
    table.add_column("Descriptor", no_wrap=True, min_width=16)
    for name, justify in extra:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return table


def _location_cells(location: Location) -> tuple[str | Text, ...]:
    return (location.role, Text(location.task), Text(location.provider), Text(location.model),
            location.descriptor_hash16)  # fmt: skip


def _state_text(info: DatabaseInfo) -> Text:
    return Text(info.state.value, style="green" if info.ok else "bold red")


# ---------------------------------------------------------------- query


def _row_filter(
    benchmark: str | None,
    instruction_id: str | None,
    model: str | None,
    model_a: str | None,
    model_b: str | None,
    judge: str | None,
    orientation: OrientationChoice | None,
    pair: list[str] | None,
    pointwise: bool | None,
    run_id: str | None,
    created_by: str | None,
    since: datetime | None,
    until: datetime | None,
    input_hash: list[str] | None,
) -> RowFilter:
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
    )


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return _json(value, indent=False)
    return str(value)


def _table_cell(name: str, value: Any) -> Text:
    # created_at is always UTC; whitespace is folded so that a row stays a row, whatever the completion holds
    cell = value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else " ".join(_csv_cell(value).split())
    width = 12 if name == "input_hash" else CELL_WIDTH
    return Text(cell if len(cell) <= width else cell[: width - 1] + "…")


_TABLE_COLUMNS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("completions",): ("descriptor", "input_hash", "benchmark", "instruction_id", "model", "run_id", "created_at",
                       "completion"),
    ("judgements",): ("descriptor", "input_hash", "benchmark", "instruction_id", "model_a", "model_b", "judge",
                      "orientation", "completion"),
    ("completions", "judgements"): ("role", "input_hash", "benchmark", "instruction_id", "model", "model_a",
                                    "model_b", "judge", "completion"),
}  # fmt: skip


def _write_rows(rows: Iterator[FoundRow], fmt: OutputFormat, columns: tuple[str, ...]) -> int:
    """Write rows to stdout as they come (jsonl, csv, json array); returns how many were written."""
    out = sys.stdout
    written = 0
    if fmt is OutputFormat.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            values = row.as_dict()
            writer.writerow([_csv_cell(values.get(name)) for name in columns])
            written += 1
        return written
    for row in rows:
        values = row.as_dict()
        line = _json({name: values[name] for name in columns if name in values}, indent=False)
        if fmt is OutputFormat.json:  # "[" only with the first row: an error before it leaves stdout empty
            out.write(("[\n" if written == 0 else ",\n") + line)
        else:
            out.write(line + "\n")
        written += 1
    if fmt is OutputFormat.json:
        out.write("\n]\n" if written else "[]\n")
    return written


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing at exit does not fail again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


@app.command("query")
@command_errors
def query_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    output_format: Annotated[
        OutputFormat,
        typer.Option("--format", "-f", help="table (the first 100 rows unless --limit), jsonl, csv or json."),
    ] = OutputFormat.table,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=0, help="At most N rows in all.")] = None,
    columns: Annotated[
        str | None, typer.Option("--columns", metavar="A,B,..", help="Only these columns, in this order.")
    ] = None,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
    benchmark: BenchmarkOption = None,
    instruction_id: InstructionOption = None,
    model: ModelOption = None,
    model_a: ModelAOption = None,
    model_b: ModelBOption = None,
    judge: JudgeOption = None,
    orientation: OrientationOption = None,
    pair: PairOption = None,
    pointwise: PointwiseOption = None,
    run_id: RunIdOption = None,
    created_by: CreatedByOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    input_hash: InputHashOption = None,
) -> None:
    """Print the rows that match the filters, streamed (jsonl, csv and json never hold all rows).

    Read-only. Both roles unless --role; judgement-only filters (--judge,
    --model-a, --model-b, --orientation, --pair, --pointwise/--pairwise) select
    judgements. model_a/model_b are the positional slots of the judge prompt
    (model_a's answer is shown first). --json means --format json (a JSON array) unless --format is given.

    Examples:

        judgestore query --role judgements --judge gpt-4o --benchmark mt-bench

        judgestore query --pair model-x --pair model-y --format jsonl

        judgestore query --model my-model --since 2026-01-01 --format jsonl > rows.jsonl

        judgestore query --run-id slurm-4242 --format csv --columns input_hash,model,completion
    """
    settings, root = settings_and_root(store_root)
    selector = _selector(role, task, provider, model_id, descriptor)
    flt = _row_filter(benchmark, instruction_id, model, model_a, model_b, judge, orientation, pair, pointwise,
                      run_id, created_by, since, until, input_hash)  # fmt: skip
    fmt = OutputFormat.json if json_output and output_format is OutputFormat.table else output_format
    roles = roles_for(flt, selector.role)
    available = row_columns(roles)
    if columns is not None:
        chosen = tuple(name.strip() for name in columns.split(",") if name.strip())
        unknown = [name for name in chosen if name not in available]
        if unknown or not chosen:
            raise typer.BadParameter(
                f"unknown column(s) {unknown}; choose from {', '.join(available)}", param_hint="--columns"
            )
    else:
        chosen = _TABLE_COLUMNS[tuple(roles)] if fmt is OutputFormat.table else available
    if fmt is not OutputFormat.table:
        try:
            _write_rows(query_rows(root, settings, selector, flt, limit=limit), fmt, chosen)
            sys.stdout.flush()
        except BrokenPipeError:  # `judgestore query ... | head`: the reader has all it wanted
            _silence_stdout()
        return
    shown = TABLE_ROWS if limit is None else limit
    found = list(query_rows(root, settings, selector, flt, limit=shown + 1 if limit is None else limit))
    table = Table(title=f"Rows under {root}", title_justify="left")
    for name in chosen:
        table.add_column(name, no_wrap=name in ("input_hash", "descriptor", "created_at"))
    for row in found[:shown]:
        values = row.as_dict()
        table.add_row(*(_table_cell(name, values.get(name)) for name in chosen))
    table.caption = f"{min(len(found), shown)} rows"
    _stdout().print(table)
    if limit is None and len(found) > shown:
        _note(f"Showing the first {shown} rows; pass --limit N, or --format jsonl/csv for all.", json_output=False)


# ---------------------------------------------------------------- delete


@app.command("delete")
@command_errors
def delete_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be deleted.")] = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
    benchmark: BenchmarkOption = None,
    instruction_id: InstructionOption = None,
    model: ModelOption = None,
    model_a: ModelAOption = None,
    model_b: ModelBOption = None,
    judge: JudgeOption = None,
    orientation: OrientationOption = None,
    pair: PairOption = None,
    pointwise: PointwiseOption = None,
    run_id: RunIdOption = None,
    created_by: CreatedByOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    input_hash: InputHashOption = None,
) -> None:
    """Delete the rows that match the filters: shows the count per database, asks, then deletes.

    At least one row filter is required: --role, --task, --provider,
    --model-id and --descriptor only choose databases and never delete on
    their own. Nothing is written before you confirm (or pass --yes).

    Examples:

        judgestore delete --run-id slurm-4242 --dry-run

        judgestore delete --model my-model --benchmark mt-bench --yes
    """
    settings, root = settings_and_root(store_root)
    selector = _selector(role, task, provider, model_id, descriptor)
    flt = _row_filter(benchmark, instruction_id, model, model_a, model_b, judge, orientation, pair, pointwise,
                      run_id, created_by, since, until, input_hash)  # fmt: skip
    plan = plan_delete(root, settings, selector, flt)
    matched = sum(entry.rows for entry in plan)
    report: dict[str, Any] = {
        "selector": {k: v for k, v in selector.as_dict().items() if v is not None},
        "filter": flt.as_dict(),
        "dry_run": dry_run,
        "matched": matched,
        "deleted": 0,
        "databases": [entry.as_dict() for entry in plan],
    }
    if not json_output:
        if not plan:
            _stdout().print("No rows match the filter; nothing to delete.")
            return
        title = "Rows to delete" + (" (dry run)" if dry_run else "")
        table = _location_table(title, ("Rows", "right"))
        for entry in plan:
            table.add_row(*_location_cells(entry.location), f"{entry.rows:,}")
        table.caption = f"{matched:,} rows in {len(plan)} databases"
        _stdout().print(table)
    if dry_run or not plan:
        if json_output:
            _emit_json(report)
        return
    if not yes:
        typer.confirm(f"Delete {matched:,} rows from {len(plan)} databases?", abort=True, err=True)
    deleted = delete_matching_rows(root, settings, plan, flt)
    report["deleted"] = sum(entry.rows for entry in deleted)
    deleted_by_path = {entry.path: entry.rows for entry in deleted}
    for entry in report["databases"]:
        entry["deleted"] = deleted_by_path.get(Path(entry["path"]), 0)
    if json_output:
        _emit_json(report)
    else:
        _stdout().print(f"Deleted {report['deleted']:,} rows from {len(deleted)} databases.")


# ---------------------------------------------------------------- db status / upgrade


@db_app.command("status")
@command_errors
def db_status_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """Schema state of every database against this library's head revision.

    Read-only. Exits 1 if any database is behind, ahead, foreign, damaged or
    has a metadata.json that does not match its folder.

    Examples:

        judgestore db status

        judgestore db status --json
    """
    settings, root = settings_and_root(store_root)
    locations = select(root, _selector(role, task, provider, model_id, descriptor))
    infos = list(_progress(inspect_databases(root, locations, settings, count_rows=False), len(locations), "Checking"))
    head = schema.revisions().head
    bad = [info for info in infos if not info.ok]
    if json_output:
        _emit_json({"head": head, "ok": not bad, "databases": [info.as_dict() for info in infos]})
    elif not infos:
        _no_databases(root, json_output)
    else:
        table = Table(title=f"Schema revisions (library head: {head})", title_justify="left")
        table.add_column("Database", overflow="fold")
        for name in ("State", "Revision", "Problem"):
            table.add_column(name, overflow="fold")
        for info in infos:
            problem = _unprefixed(info.error or "", info.path)
            table.add_row(Text(_where(info.location)), _state_text(info), info.revision or "", Text(problem))
        _stdout().print(table)
        if bad:
            behind = sum(info.state == "behind" for info in bad)
            hint = f"; run `judgestore db upgrade` for the {behind} behind" if behind else ""
            _stderr().print(Text(f"{len(bad)} of {len(infos)} databases need attention{hint}.", style="bold red"))
        else:
            _note(f"All {len(infos)} databases can be opened.", json_output=json_output)
    if bad:
        raise typer.Exit(1)


_OUTCOME_STYLE = {
    UpgradeOutcome.UPGRADED: "green",
    UpgradeOutcome.UP_TO_DATE: "dim",
    UpgradeOutcome.REFUSED: "bold red",
    UpgradeOutcome.FAILED: "bold red",
}


@db_app.command("upgrade")
@command_errors
def db_upgrade_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    no_backup: Annotated[
        bool, typer.Option("--no-backup", help="Delete each backup once its upgrade succeeded.")
    ] = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """Upgrade every database that is behind to this library's head revision.

    Per file: lock, re-check, back up beside it (*.bak-REVISION-TIME), migrate,
    verify row counts; a failure restores the backup. Ahead, foreign and
    damaged files are refused and not touched. A second run does nothing.
    Exits 1 if anything was refused or failed.

    Examples:

        judgestore db upgrade

        judgestore db upgrade --task mt-bench --json
    """
    settings, root = settings_and_root(store_root)
    locations = select(root, _selector(role, task, provider, model_id, descriptor))
    upgrades = upgrade_store(root, locations, settings, keep_backup=not no_backup)
    results = list(_progress(upgrades, len(locations), "Upgrading"))
    bad = [r for r in results if r.outcome in (UpgradeOutcome.REFUSED, UpgradeOutcome.FAILED)]
    if json_output:
        _emit_json({"head": schema.revisions().head, "ok": not bad, "results": [_result_dict(r) for r in results]})
    elif not results:
        _no_databases(root, json_output)
    else:
        table = Table(title="Upgrade", title_justify="left")
        table.add_column("Database", overflow="fold")
        for name in ("Result", "From", "To", "Backup / problem"):
            table.add_column(name, overflow="fold")
        for r in results:
            detail = _unprefixed(r.error, r.path) if r.error else (_relative(r.backup, root) if r.backup else "")
            table.add_row(
                Text(_relative(r.path.parent, root)),
                Text(r.outcome.value, style=_OUTCOME_STYLE[r.outcome]),
                r.from_revision or "",
                r.to_revision or "",
                Text(detail),
            )
        counts = {outcome: sum(r.outcome is outcome for r in results) for outcome in UpgradeOutcome}
        table.caption = ", ".join(f"{n} {outcome.value}" for outcome, n in counts.items() if n)
        _stdout().print(table)
    if bad:
        raise typer.Exit(1)


def _result_dict(result: UpgradeResult) -> dict[str, Any]:
    return {
        "path": str(result.path),
        "outcome": result.outcome.value,
        "from_revision": result.from_revision,
        "to_revision": result.to_revision,
        "backup": None if result.backup is None else str(result.backup),
        "rows": result.rows,
        "error": result.error,
    }


# ---------------------------------------------------------------- verify


@app.command("verify")
@command_errors
def verify_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model_id: ModelIdOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """Check every database: integrity, metadata, schema, and every row's input hash.

    SQLite's integrity_check, metadata.json against its folder, the schema
    state, and that every row's input_text hashes to its input_hash. Without
    a database selector it also lists stray files and folders under the root.
    Read-only. Exits 1 on any problem, listing each with its file.

    Examples:

        judgestore verify

        judgestore verify --role judgements --json
    """
    settings, root = settings_and_root(store_root)
    selector = _selector(role, task, provider, model_id, descriptor)
    locations = select(root, selector)
    checks = (verify_database(root, location, settings) for location in locations)
    results = list(_progress(checks, len(locations), "Verifying"))
    problems = [problem for result in results for problem in result.problems]
    if selector.is_empty():
        problems += stray_paths(root)
    rows = sum(result.rows_checked for result in results)
    if json_output:
        _emit_json(
            {
                "ok": not problems,
                "databases": len(results),
                "rows_checked": rows,
                "problems": [problem.as_dict() for problem in problems],
            }
        )
    elif problems:
        table = Table(title=f"Problems under {root}", title_justify="left")
        table.add_column("Path", overflow="fold")
        table.add_column("Kind", no_wrap=True)
        table.add_column("Problem", overflow="fold")  # hashes and commands stay whole, to be copied
        for problem in problems:
            message = _unprefixed(problem.message, problem.path)
            table.add_row(Text(_relative(problem.path, root)), problem.kind.value, Text(message))
        table.caption = f"{len(problems)} problems; checked {len(results)} databases, {rows:,} rows"
        _stdout().print(table)
    elif not results:
        _no_databases(root, json_output)
    else:
        _stdout().print(f"OK: {len(results)} databases, {rows:,} rows, no problems.")
    if problems:
        raise typer.Exit(1)


# Sharing through the Hub or a shared folder; store.sync.cli imports this module, so it is mounted last.
from store.sync.cli import hub_app  # noqa: E402

app.add_typer(hub_app, name="hub")


def main() -> None:
    """Entry point of ``python -m store`` (and, through inference.cli, of ``judgestore``)."""
    app(prog_name="judgestore")
