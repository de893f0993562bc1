"""The data commands: ``ls``, ``query``, ``delete``.

Contract:

* Thin: parse, call :class:`~store.store.Store` and :mod:`store.schema`,
  render (see :mod:`store.cli.common` for the edge, the options and where
  output goes). ``ls`` and ``query`` never write a byte.
* ``query`` streams: jsonl, csv and json never hold all rows; ``--format
  table`` shows the first 100 rows (unless ``--limit``) in a few columns that
  fit a terminal (``--columns`` for others). JSON values keep NaN and
  infinities as ``{"$float": ...}`` (:mod:`store.jsonvalues`).
* ``delete`` needs a row filter, shows the count per database, asks (unless
  ``--yes``), and writes nothing before that.
* Ctrl-C exits 130 with one line on stderr saying what was done
  (:func:`~store.cli.common.interrupted`): the rows ``delete`` deleted, the
  rows ``query`` wrote (its output is then incomplete: a JSON array is left
  open, so that it never parses as a whole result).
"""

import dataclasses
import enum
import sys
from contextlib import closing
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer
from rich.filesize import decimal

from store.cli.common import (
    command_errors,
    confirmed,
    counted,
    deleting,
    emit_json,
    exit_if_unread,
    incomplete_output,
    interrupted,
    later_rows_note,
    location_cells,
    location_table,
    no_databases,
    no_rows,
    note,
    planning_store,
    print_claims,
    quantity,
    record_deleted,
    report_unlisted,
    rows_to_stdout,
    state_text,
    stdout,
)
from store.cli.options import MOST_ROWS, JsonOutput, grouped, row_filter, selection, store_settings
from store.cli.tables import Column, Fit, FittedTable
from store.errors import InvalidInputError, JudgestoreError
from store.layout import Selector
from store.reports import DatabaseInfo
from store.rows import row_columns
from store.schema import DatabaseState, failed_state
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter, roles_for

TABLE_ROWS = 100  # `query --format table` without --limit shows this many rows

# What `query --format table` shows by default: enough to recognise a row in 80 columns.
TABLE_COLUMNS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("completions",): ("input_hash", "instruction_id", "model", "completion"),
    ("judgements",): ("input_hash", "instruction_id", "model_a", "model_b", "orientation", "completion"),
    ("completions", "judgements"): (
        "role",
        "input_hash",
        "instruction_id",
        "model",
        "model_a",
        "model_b",
        "completion",
    ),
}
# How each field's cells give way in a narrow terminal (store.cli.tables); a field not named here is
# free text cut at 24 cells. A name is shortened in the middle, never so far that two rows look alike.
_QUERY_COLUMNS: dict[str, tuple[Fit, int | None]] = {
    "role": (Fit.WHOLE, None),
    "descriptor": (Fit.WHOLE, None),
    "created_at": (Fit.WHOLE, None),
    "sample_index": (Fit.WHOLE, None),
    "orientation": (Fit.WHOLE, None),
    "finish_reason": (Fit.WHOLE, None),
    "input_hash": (Fit.PREFIX, 12),
    "adopted_from": (Fit.PREFIX, 16),
    "completion": (Fit.CUT, 48),
    "input_text": (Fit.CUT, 48),
}
_QUERY_NAMES = ("task", "provider", "descriptor_model", "benchmark", "instruction_id", "model", "model_a", "model_b",
                "judge", "run_id", "created_by")  # fmt: skip
_QUERY_COLUMNS.update({name: (Fit.MIDDLE, 24) for name in _QUERY_NAMES})


class OutputFormat(enum.StrEnum):
    table = "table"
    jsonl = "jsonl"
    csv = "csv"
    json = "json"


def register(app: typer.Typer) -> None:
    app.command("ls")(command_errors(grouped(settings=store_settings, selector=selection, flt=row_filter)(ls_command)))
    app.command("query")(
        command_errors(grouped(settings=store_settings, selector=selection, flt=row_filter)(query_command))
    )
    app.command("delete")(
        command_errors(grouped(settings=store_settings, selector=selection, flt=row_filter)(delete_command))
    )


# ---------------------------------------------------------------- ls


def ls_command(settings: Settings, selector: Selector, flt: RowFilter, json_output: JsonOutput = False) -> None:
    """List every database: role, task, provider, model, descriptor, rows, size, schema state.

    Read-only: never writes anything. States: current, empty, behind, ahead,
    foreign, not-a-database, corrupt, unreadable, metadata-missing, metadata-mismatch.
    Every database is listed; exits 1 if any is neither current nor empty
    (--json: its "ok" is false), after listing the others.
    With row filters, a Matching column counts the rows they select in each
    current database (--json: "matching"); one whose rows cannot be counted
    is listed as corrupt or unreadable, and ls exits 1.

    Examples:

        judgestore ls

        judgestore ls --role judgements --json

        judgestore ls --finish-reason length        # truncated rows per database
    """
    with Store(settings, readonly=True) as store:
        store.require_present("to list")
        locations = store.select(selector)
        infos = list(counted(store.infos(locations), len(locations), "Reading"))
        matching = None
        if not flt.is_empty():
            infos, matching = _matching(store, infos, flt, selector)
        unlisted = store.unlisted(selector)
    unread = sum(not info.ok for info in infos)
    if json_output:  # each database's "ok" says whether it could be read ("error": why not)
        emit_json(
            [info.as_dict() | ({} if matching is None else {"matching": matching[i]}) for i, info in enumerate(infos)]
        )
        if report_unlisted(unlisted, json_output=True):  # the list has no room for them: a JSON object on stderr
            raise typer.Exit(1)
        exit_if_unread(unread, len(infos), json_output=True)
        return
    if not infos and not unlisted:
        no_databases(store, json_output, selector)
        return
    extra = [("Rows", "right")] + ([] if matching is None else [("Matching", "right")])
    table = location_table(f"Databases in {store.where}", *extra, ("Size", "right"), ("State", "left"))
    for i, info in enumerate(infos):
        count = "" if info.rows is None else f"{info.rows:,}"
        cells = [count] + ([] if matching is None else ["" if matching[i] is None else f"{matching[i]:,}"])
        table.add_row(*location_cells(info.location), *cells, decimal(info.size_bytes), state_text(info))
    rows = sum(info.rows or 0 for info in infos if info.ok)  # what the note after the table says
    size = sum(info.size_bytes for info in infos)
    selected = "" if matching is None else f" ({sum(n or 0 for n in matching):,} matching)"
    table.caption = f"{quantity(len(infos), 'database')}, {quantity(rows, 'row')}{selected}, {decimal(size)}"
    stdout().print(table)
    print_claims((info.location, info.claims) for info in infos)
    if report_unlisted(unlisted, json_output=False) and not unread:
        raise typer.Exit(1)
    exit_if_unread(unread, len(infos), json_output=False, left_out="see State; their rows are not counted")


def _matching(
    store: Store, infos: list[DatabaseInfo], flt: RowFilter, selector: Selector
) -> tuple[list[DatabaseInfo], list[int | None]]:
    """Rows ``flt`` selects in each current database of ``infos`` (None: not current, or the other role).

    A database whose rows cannot be read (a damaged page that counting its rows through the key index never met)
    comes back in the state its error says (corrupt, unreadable), its error and no rows, as its listing would
    have it: the others are still counted and listed, and ``ls`` exits 1.
    """
    roles = roles_for(flt, selector.role)
    usable = [info.state is DatabaseState.CURRENT and info.location.role in roles for info in infos]
    can_match = set(store.storage.narrowed([i.location for i, ok in zip(infos, usable, strict=True) if ok], flt))
    listed: list[DatabaseInfo] = []
    counts: list[int | None] = []
    for info, ok in zip(infos, usable, strict=True):
        count: int | None = None
        if ok and info.location in can_match:
            try:
                count = store.open(info.location).count(flt)
            except JudgestoreError as e:
                info = dataclasses.replace(info, state=failed_state(e), rows=None, error=str(e))
        elif ok:
            count = 0
        listed.append(info)
        counts.append(count)
    return listed, counts


# ---------------------------------------------------------------- query


def _query_column(name: str) -> Column:
    fit, width = _QUERY_COLUMNS.get(name, (Fit.CUT, 24))
    return Column(name, fit=fit, max_width=width)


def _table_cell(value: Any) -> str:
    # created_at is always UTC; the table folds whitespace, so that a row stays a row whatever the completion holds,
    # and shows control characters as escapes. A str, not a Text: rich's Text drops some of them before the table
    # can show them.
    from store.export import text_cell

    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else text_cell(value)


def _columns(given: str | None, available: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
    if given is None:
        return default
    from store.export import checked_columns

    try:  # a usage error (exit 2), as export's
        return checked_columns((name.strip() for name in given.split(",") if name.strip()), available)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e), param_hint="--columns") from e


def query_command(
    settings: Settings,
    selector: Selector,
    flt: RowFilter,
    json_output: JsonOutput = False,
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="table (the first 100 rows unless --limit; the default), jsonl, csv or json.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=0, max=MOST_ROWS, help="At most N rows in all.")
    ] = None,
    columns: Annotated[
        str | None, typer.Option("--columns", metavar="A,B,..", help="Only these columns, in this order.")
    ] = None,
) -> None:
    """Print the rows that match the filters, streamed (jsonl, csv and json never hold all rows).

    Read-only. Both roles unless --role; judgement-only filters (--judge,
    --model-a, --model-b, --orientation, --pair, --pointwise/--pairwise) select
    judgements. model_a/model_b are the positional slots of the judge prompt
    (model_a's answer is shown first). --json means --format json (a JSON
    array) unless --format is given. The table shows a few columns; --columns
    picks others (every field of the rows, and role, task, provider,
    descriptor_model, descriptor). Ctrl-C exits 130 with one line on stderr
    saying how many rows were written: the output is then incomplete, and a
    JSON array is left unclosed, so that it never parses as a whole result.

    Examples:

        judgestore query --role judgements --judge gpt-4o --benchmark mt-bench

        judgestore query --pair model-x --pair model-y --format jsonl

        judgestore query --model my-model --since 2026-01-01 --format jsonl \\
            > rows.jsonl

        judgestore query --run-id slurm-4242 --format csv \\
            --columns input_hash,model,completion
    """
    from store.export import write_text

    fmt = output_format or (OutputFormat.json if json_output else OutputFormat.table)
    roles = roles_for(flt, selector.role)
    available = row_columns(roles)
    chosen = _columns(columns, available, TABLE_COLUMNS[tuple(roles)] if fmt is OutputFormat.table else available)
    with Store(settings, readonly=True) as store:
        store.require_present("to query")
        if fmt is not OutputFormat.table:
            with rows_to_stdout():
                try:
                    with closing(store.query_rows(selector, flt, limit=limit)) as found_rows:
                        written = write_text(found_rows, sys.stdout, fmt.value, chosen)  # type: ignore[arg-type]
                except KeyboardInterrupt as e:
                    _query_interrupted(getattr(e, "rows_written", 0), fmt, json_output)
                if not written:
                    no_rows(store, json_output, selector, flt)
            return
        shown = TABLE_ROWS if limit is None else limit
        try:
            with closing(store.query_rows(selector, flt, limit=shown + 1 if limit is None else limit)) as found_rows:
                found = list(found_rows)
            if not found:
                no_rows(store, json_output, selector, flt)
            table = FittedTable(f"Rows in {store.where}", [_query_column(name) for name in chosen])
            for row in found[:shown]:
                values = row.as_dict()
                table.add_row(*(_table_cell(values.get(name)) for name in chosen))
        except KeyboardInterrupt:  # the table is printed at once, after every row was read
            _query_interrupted(0, fmt, json_output)
    table.caption = quantity(min(len(found), shown), "row")
    stdout().print(table)
    if limit is None and len(found) > shown:
        note(f"Showing the first {shown} rows; pass --limit N, or --format jsonl/csv for all.", json_output=False)


def _query_interrupted(written: int, fmt: OutputFormat, json_output: bool) -> NoReturn:
    """Ctrl-C in ``query``: how many rows reached stdout, and that the output is incomplete (exit 130)."""
    if fmt is OutputFormat.table:
        message = "interrupted before the table was shown; no row was printed"
    else:
        message = incomplete_output(written, fmt.value, "stdout")
    interrupted(message, json_output, rows_written=written, complete=False)


# ---------------------------------------------------------------- delete


def delete_command(
    settings: Settings,
    selector: Selector,
    flt: RowFilter,
    json_output: JsonOutput = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be deleted.")] = False,
) -> None:
    """Delete the rows that match the filters: shows the count per database, asks, then deletes.

    At least one row filter is required: --role, --task, --provider,
    --model-id and --descriptor only choose databases and never delete on
    their own. Nothing is written before you confirm (or pass --yes), but
    with JUDGESTORE_AUTO_UPGRADE=1 a database that is behind is upgraded
    before its rows are counted (never on --dry-run).

    Examples:

        judgestore delete --run-id slurm-4242 --dry-run

        judgestore delete --model my-model --benchmark mt-bench --yes
    """
    with planning_store(settings, dry_run=dry_run) as store:
        store.require_present("to delete from")
        try:
            plan = store.plan_delete(selector, flt)
        except KeyboardInterrupt:
            interrupted("interrupted while counting; nothing was deleted", json_output, rows_deleted=0)
        later_rows_note(plan.later, "run it", json_output=json_output)
        if not plan.counts:
            no_rows(store, json_output, selector, flt)
    matched = plan.rows
    report: dict[str, Any] = {
        "selector": {k: v for k, v in selector.as_dict().items() if v is not None},
        "filter": flt.as_dict(),
        "dry_run": dry_run,
        "matched": matched,
        "later": plan.later,
        "deleted": 0,
        "databases": [entry.as_dict() for entry in plan.counts],
    }
    if not json_output:
        if not plan.counts:
            dated = " dated before this command began" if plan.later else ""
            stdout().print(f"No rows{dated} match the filter; nothing to delete.")
            return
        table = location_table("Rows to delete" + (" (dry run)" if dry_run else ""), ("Rows", "right"))
        for entry in plan.counts:
            table.add_row(*location_cells(entry.location), f"{entry.rows:,}")
        table.caption = f"{quantity(matched, 'row')} in {quantity(len(plan.counts), 'database')}"
        stdout().print(table)
    if dry_run or not plan.counts:
        if json_output:
            emit_json(report)
        return
    where = quantity(len(plan.counts), "database")
    confirmed(f"Delete {quantity(matched, 'row')} from {where}?", yes=yes, json_output=json_output)
    deleted = deleting(settings, lambda store: store.delete_rows(plan), json_output)
    record_deleted(report, deleted)
    if json_output:
        emit_json(report)
    else:
        stdout().print(f"Deleted {quantity(report['deleted'], 'row')} from {quantity(len(deleted), 'database')}.")
