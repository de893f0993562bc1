"""Knowing the cache: ``stats``, ``prune``, ``vacuum`` and ``export``.

Contract:

* Thin: parse, call :mod:`store.stats`, :mod:`store.prune`,
  :mod:`store.backends.sqlite.vacuum` and :mod:`store.export`, render (see
  :mod:`store.cli.common` for the edge, the options and where output goes).
* ``stats`` and ``export`` never write. ``prune`` plans read-only, shows the
  rows per database, asks (unless ``--yes``), and writes nothing before that;
  ``--dry-run`` only shows. ``vacuum`` rewrites files without changing a row.
* Ctrl-C exits 130 with one line on stderr saying what was done and what it
  left (:func:`~store.cli.common.interrupted`): the rows ``prune`` deleted;
  the file ``export`` left as it was (it writes beside it and renames), or
  the rows it wrote to stdout or a pipe (incomplete).
"""

import dataclasses
import enum
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.filesize import decimal
from rich.text import Text

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
    outside_store,
    planning_store,
    print_claims,
    quantity,
    record_deleted,
    rows_to_stdout,
    stdout,
    writable_output,
    writes_stdout,
)
from store.cli.options import MOST_ROWS, JsonOutput, grouped, row_filter, selection, store_settings
from store.cli.tables import Column, Fit, FittedTable
from store.errors import InvalidInputError
from store.layout import Selector
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter

if TYPE_CHECKING:  # each command imports its module when it runs (see store.cli.app)
    from store.reports import VacuumResult
    from store.stats import DatabaseStats, StoreTotals


def register(app: typer.Typer) -> None:
    app.command("stats")(command_errors(grouped(settings=store_settings, selector=selection)(stats_command)))
    app.command("prune")(
        command_errors(grouped(settings=store_settings, selector=selection, flt=row_filter)(prune_command))
    )
    app.command("vacuum")(command_errors(grouped(settings=store_settings, selector=selection)(vacuum_command)))
    app.command("export")(
        command_errors(grouped(settings=store_settings, selector=selection, flt=row_filter)(export_command))
    )


def compact(value: float) -> str:
    """``1234567`` as ``1.2M``: a count that fits a narrow column."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.1f} h"


# ---------------------------------------------------------------- stats


def stats_command(
    settings: Settings,
    selector: Selector,
    json_output: JsonOutput = False,
    runs: Annotated[
        int | None,
        typer.Option(
            "--runs",
            min=0,
            max=MOST_ROWS,
            help="Also list the N most recent runs: of the store in the table, of each database with --json "
            "(there 5 unless given; 0: none).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """What each database holds and what its runs saved: rows, size, tokens, truncated rows, hits, savings.

    Read-only. Per role, task, model and descriptor: rows, size on disk,
    tokens stored (in and out), rows that stopped at a length limit, recorded
    runs, their hits and the engine time those hits saved (what the hit rows
    had cost when they were generated). --runs N lists the N most recent
    runs of each database (hit counts over time); --json gives everything,
    with the 5 most recent runs of each database unless --runs says (0:
    none). A database that cannot be read (damaged, foreign, behind...) is
    listed as unreadable and left out of the totals; the command then exits
    1 (--json: "ok" is false) after printing the others.

    Examples:

        judgestore stats

        judgestore stats --model-id Qwen/Qwen3-8B --runs 5

        judgestore stats --json > stats.json
    """
    from store.stats import StoreTotals, store_stats

    with Store(settings, readonly=True) as store:
        store.require_present("to read")
        locations = store.select(selector)
        # At least 5 are read, so that plain `stats` and `stats --runs 3` share what the catalog remembers.
        found = list(counted(store_stats(store, locations, recent=max(runs or 0, 5)), len(locations), "Reading"))
    if runs is not None:  # --json lists 5 unless told (0: none)
        found = [dataclasses.replace(entry, recent_runs=entry.recent_runs[:runs]) for entry in found]
    totals = StoreTotals.of(found)
    if json_output:
        emit_json({"databases": [entry.as_dict() for entry in found], "totals": totals.as_dict(),
                   "ok": not totals.unreadable})  # fmt: skip
        exit_if_unread(totals.unreadable, totals.databases, json_output=True)
        return
    if not found:
        no_databases(store, json_output, selector)
        return
    table = location_table(f"Cache in {store.where}", ("Rows", "right"), ("Size", "right"), ("Hits", "right"),
                           ("Saved", "right"))  # fmt: skip
    for entry in found:
        if entry.error is not None:
            table.add_row(
                *location_cells(entry.location), Text("unreadable", style="bold red"), decimal(entry.size_bytes)
            )
            continue
        table.add_row(*location_cells(entry.location), f"{entry.rows.rows:,}", decimal(entry.size_bytes),
                      f"{entry.runs.hits:,}", _seconds(entry.runs.saved_engine_seconds))  # fmt: skip
    table.caption = (
        f"{quantity(totals.databases, 'database')}, {quantity(totals.rows.rows, 'row')}, {decimal(totals.size_bytes)}; "
        "Hits: of recorded runs; Saved: engine time they saved"
    )
    stdout().print(table)
    _print_totals(totals)
    print_claims((entry.location, entry.claims) for entry in found)
    _print_adoptions(found)
    if runs:
        _print_runs(found, runs)
    for entry in found:
        if entry.error is not None:
            note(entry.error, json_output=False)
    exit_if_unread(
        totals.unreadable,
        totals.databases,
        json_output=False,
        left_out="their rows, tokens and runs are left out of the totals; their files count in the size",
    )


def _print_totals(totals: "StoreTotals") -> None:
    from store.runs import hit_rate

    rows, run = totals.rows, totals.runs
    lines = [
        f"stored: {rows.rows:,} rows, {rows.prompt_tokens:,} tokens in and {rows.completion_tokens:,} out, "
        f"{decimal(rows.data_bytes)} of data; {totals.truncated:,} stopped at a length limit (max_tokens, or the "
        "context: `judgestore query --finish-reason length`)",
    ]
    if run.runs:
        asked = run.hits + run.misses  # each run's distinct inputs, summed over the runs (an input asked twice: 2)
        rate = hit_rate(run.hits, asked) if asked else "100%"
        lines.append(
            f"runs: {run.runs:,} recorded, {run.hits:,} hits of {asked:,} distinct inputs asked ({rate}); "
            f"saved {run.saved_prompt_tokens:,} tokens in and {run.saved_completion_tokens:,} out, "
            f"~{_seconds(run.saved_engine_seconds)} of engine time"
            + (f" ({run.hits_without_cost:,} hits without recorded cost)" if run.hits_without_cost else "")
        )
    else:
        lines.append(
            "runs: none recorded yet (each generate or judge call records one as it ends, interrupted or not; "
            "imported rows, and rows written before schema revision 0003, have none)"
        )
    if totals.adopted_rows:
        lines.append(
            f"adopted: {totals.adopted_rows:,} of the rows were copied from older descriptors after an audit "
            "(`judgestore query --adopted`; `judgestore delete --adopted-from HASH` takes them out)"
        )
    for line in lines:
        stdout().print(line)  # wrapped at the terminal's width, as a table is


def _print_adoptions(found: "list[DatabaseStats]") -> None:
    """One line per recorded adoption: into which database, from where, across what, on what evidence."""
    for entry in found:
        for adoption in entry.adoptions:
            when = adoption.adopted_at.strftime("%Y-%m-%d %H:%M") if adoption.adopted_at else "?"
            across = ", ".join(adoption.details.get("across", ())) or "-"
            stdout().print(
                f"adoption {when}: {adoption.rows_adopted:,} rows into {entry.location.model} "
                f"({entry.location.descriptor_hash16}) from {adoption.source_descriptor[:16]} "
                f"(task {adoption.source_task}) across {across}; audit {adoption.exact}/{adoption.sampled} exact",
                highlight=False,
            )


def _print_runs(found: "list[DatabaseStats]", limit: int) -> None:
    recent = sorted(
        ((run, entry.location) for entry in found for run in entry.recent_runs),
        key=lambda item: item[0].started_at,
        reverse=True,
    )
    if not recent:  # "runs: none recorded yet" said it
        return
    columns = [Column("Started (UTC)"), Column("Model", fit=Fit.MIDDLE, max_width=48), Column("Descriptor")]
    columns += [Column("Mode")] + [Column(name, justify="right") for name in ("Asked", "Hits", "Misses", "Saved")]
    table = FittedTable("Recent runs (newest first)", columns)
    for run, location in recent[:limit]:
        table.add_row(
            run.started_at.strftime("%Y-%m-%d %H:%M"),
            Text(location.model),
            location.descriptor_hash16,
            run.mode,
            f"{run.hits + run.misses:,}",  # as the runs line counts: a shared batch's job asked its own share only
            f"{run.hits:,}",
            f"{run.misses:,}",
            _seconds(run.saved_engine_seconds),
        )
    stdout().print(table)


# ---------------------------------------------------------------- prune


def _duration(value: str) -> timedelta:
    from store.prune import parse_duration

    try:
        return parse_duration(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e


def _size(value: str) -> int:
    from store.prune import parse_size

    try:
        return parse_size(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e


PRUNE_PANEL = "What to prune"  # its rules: each given once (store.cli.options.OnceCommand)


def prune_command(
    settings: Settings,
    selector: Selector,
    flt: RowFilter,
    json_output: JsonOutput = False,
    older_than: Annotated[
        timedelta | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            rich_help_panel=PRUNE_PANEL,
            parser=_duration,
            help="Rows written before now - DURATION (30d, 12h, 2w, 90m).",
        ),
    ] = None,
    keep_last_runs: Annotated[
        int | None,
        typer.Option(
            "--keep-last-runs",
            min=0,
            rich_help_panel=PRUNE_PANEL,
            metavar="N",
            help="Rows of every run but the N newest (a run is as new as its newest row's created_at).",
        ),
    ] = None,
    max_size: Annotated[
        int | None,
        typer.Option(
            "--max-size",
            metavar="SIZE",
            rich_help_panel=PRUNE_PANEL,
            parser=_size,
            help="The oldest rows until the data fits in SIZE (500MB, 2GB, 1.5GiB, 0B: a unit is required; what "
            "`stats` shows as data).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be pruned.")] = False,
) -> None:
    """Delete old rows: older than a duration, of all but the last runs, or the oldest beyond a size.

    Every option given must hold for a row to go (row filters included), and
    at least one is required: nothing is pruned that a filter did not select.
    Shows the rows per database, asks (unless --yes), then deletes; --dry-run
    only shows. Files keep their size until `judgestore vacuum`. With
    JUDGESTORE_AUTO_UPGRADE=1 a database that is behind is upgraded before
    its rows are counted (never on --dry-run).

    Examples:

        judgestore prune --older-than 90d --dry-run

        judgestore prune --keep-last-runs 3 --role completions --yes

        judgestore prune --max-size 20GB && judgestore vacuum
    """
    from store.prune import PruneRule, plan_prune, prune

    rule = PruneRule(flt=flt, older_than=older_than, keep_last_runs=keep_last_runs, max_bytes=max_size)
    with planning_store(settings, dry_run=dry_run) as store:
        store.require_present("to prune")
        try:
            plan = plan_prune(store, selector, rule)
        except KeyboardInterrupt:
            interrupted("interrupted while counting; nothing was deleted", json_output, rows_deleted=0)
        if not plan.counts:  # a mistyped --task or --model: said, as delete says it (was: "No rows match" alone)
            no_rows(store, json_output, selector, flt)
    report: dict[str, Any] = {**plan.as_dict(), "dry_run": dry_run, "deleted": 0}
    if not json_output:
        if plan.pruned_runs:
            kept = f"keeping runs {', '.join(plan.kept_runs)}; " if plan.kept_runs else ""
            note(f"{kept}pruning rows of runs {', '.join(plan.pruned_runs)}", json_output=False)
        if plan.rule.max_bytes is not None:
            note(
                f"data {decimal(plan.data_bytes)}, cap {decimal(plan.rule.max_bytes)}: "
                + (
                    # to the microsecond and in UTC: rows a second apart fell either side of "00:00:00" (was)
                    f"pruning rows written before {plan.size_cutoff:%Y-%m-%d %H:%M:%S.%f} UTC"
                    if plan.size_cutoff
                    else "nothing to prune for size"
                )
                + (
                    f"; the other options leave {decimal(left)} of data, still over the cap"
                    if (left := plan.data_bytes - plan.freed_bytes) > plan.rule.max_bytes
                    else ""
                ),
                json_output=False,
            )
        later_rows_note(plan.later, "prune", json_output=False)
        if not plan.counts:
            dated = " dated before this command began" if plan.later else ""
            stdout().print(f"No rows{dated} match; nothing to prune.")
            return
        table = location_table("Rows to prune" + (" (dry run)" if dry_run else ""), ("Rows", "right"))
        for entry in plan.counts:
            table.add_row(*location_cells(entry.location), f"{entry.rows:,}")
        rows, databases = quantity(plan.rows, "row"), quantity(len(plan.counts), "database")
        table.caption = f"{rows} ({decimal(plan.freed_bytes)} of data) in {databases}"
        stdout().print(table)
    if dry_run or not plan.counts:
        if json_output:
            emit_json(report)
        return
    where = quantity(len(plan.counts), "database")
    confirmed(f"Prune {quantity(plan.rows, 'row')} from {where}?", yes=yes, json_output=json_output)
    deleted = deleting(settings, lambda store: prune(store, plan), json_output)
    record_deleted(report, deleted)
    if json_output:
        emit_json(report)
    else:
        # A server reuses the space itself (vacuum, for SQLite files, refuses a server store)
        freed = (
            "; the server's autovacuum reuses their space"
            if settings.store_url
            else "; `judgestore vacuum` gives the space back"
        )
        stdout().print(f"Pruned {quantity(report['deleted'], 'row')} from {quantity(len(deleted), 'database')}{freed}.")


# ---------------------------------------------------------------- vacuum


def vacuum_command(
    settings: Settings,
    selector: Selector,
    json_output: JsonOutput = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check each database and show the space it would give back.")
    ] = False,
) -> None:
    """Give the space of deleted rows back to the disk (SQLite VACUUM and a truncating WAL checkpoint).

    Rows are never changed. Each database is compacted under its lock, after
    its other users' transactions finish (up to the busy timeout); one that
    stays busy, or is not a usable judgestore database, is reported and left
    as it was. Exits 1 if any database was not vacuumed. Ctrl-C exits 130
    with one line on stderr naming the databases vacuumed; the others are as
    they were (VACUUM is one transaction). A folder store only:
    on a PostgreSQL server, autovacuum reuses the space (VACUUM FULL, run by
    the owner of the tables or of the database, gives it back to the disk).

    --dry-run reads each database, makes the same checks and changes
    nothing: "After" is then the pages in use, what VACUUM keeps at most (it
    may also pack half-empty pages), and exit 1 says one would be refused.

    Examples:

        judgestore vacuum --dry-run

        judgestore vacuum

        judgestore vacuum --role judgements --json
    """
    from store.reports import VacuumOutcome

    with Store(settings, readonly=dry_run) as store:
        locations = store.select(selector)
        results: list[VacuumResult] = []
        try:
            results.extend(counted(store.vacuum(locations, dry_run=dry_run), len(locations), "Vacuuming"))
        except KeyboardInterrupt:
            _vacuum_interrupted(store, results, len(locations), json_output, dry_run=dry_run)
    done = (VacuumOutcome.WOULD_VACUUM if dry_run else VacuumOutcome.VACUUMED, VacuumOutcome.EMPTY)
    failed = [r for r in results if r.outcome not in done]
    freed = sum(r.freed for r in results)
    if json_output:
        emit_json({"ok": not failed, "dry_run": dry_run, "results": [r.as_dict() for r in results], "freed": freed})
    elif not results:
        no_databases(store, json_output, selector)
    else:
        # "Vacuumed in" headed a table of databases all refused or busy (was)
        title = f"Would vacuum in {store.where} (dry run: nothing changed)" if dry_run else f"Vacuum of {store.where}"
        table = location_table(title, ("Before", "right"), ("After", "right"), ("Result", "left"))
        for r in results:
            style = "bold red" if r in failed else "green"
            table.add_row(*location_cells(r.location), decimal(r.bytes_before), decimal(r.bytes_after),
                          Text(r.outcome.value.replace("_", " "), style=style))  # fmt: skip
        table.caption = f"{quantity(len(results), 'database')}, {decimal(freed)} {'to free' if dry_run else 'freed'}"
        stdout().print(table)
        for r in failed:
            note(r.error or r.outcome.value, json_output=False)
    if failed:
        raise typer.Exit(1)


def _vacuum_interrupted(
    store: Store, results: "list[VacuumResult]", selected: int, json_output: bool, *, dry_run: bool
) -> NoReturn:
    """Ctrl-C in ``vacuum``: which databases were vacuumed, and that the others are as they were or vacuumed
    whole: SQLite's VACUUM is one transaction, so the database it stopped in is one or the other (exit 130).
    In a dry run: how many were checked, and that nothing was changed."""
    from store.reports import VacuumOutcome

    if dry_run:
        interrupted(
            f"interrupted; checked {len(results)} of {quantity(selected, 'database')} (dry run: nothing was "
            "changed)", json_output, dry_run=True, databases=selected, results=[r.as_dict() for r in results],
        )  # fmt: skip
    vacuumed = [r for r in results if r.outcome is VacuumOutcome.VACUUMED]
    freed = sum(r.freed for r in results)
    names = ", ".join(store.shown(str(r.path)) for r in vacuumed[:3]) + (", ..." if len(vacuumed) > 3 else "")
    others = selected - len(vacuumed)
    as_they_were = "the other one is as it was" if others == 1 else f"the other {others} are as they were"
    message = (
        f"interrupted; vacuumed {len(vacuumed)} of {quantity(selected, 'database')} "
        f"({decimal(freed)} freed{': ' + names if names else ''}); {as_they_were} (the one it stopped in may be "
        "vacuumed whole: VACUUM is one transaction), and no row was changed: run `judgestore vacuum` again to finish"
    )
    interrupted(message, json_output, vacuumed=[str(r.path) for r in vacuumed], databases=selected, freed=freed,
                results=[r.as_dict() for r in results])  # fmt: skip


# ---------------------------------------------------------------- export


class ExportFormatChoice(enum.StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"
    csv = "csv"
    json = "json"


def export_command(
    settings: Settings,
    selector: Selector,
    flt: RowFilter,
    output_format: Annotated[
        ExportFormatChoice, typer.Option("--format", "-f", help="parquet (typed columns), jsonl, csv or json.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="File to write ('-': stdout, text formats only).")
    ] = Path("-"),
    json_output: JsonOutput = False,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=0, max=MOST_ROWS, help="At most N rows in all.")
    ] = None,
    columns: Annotated[
        str | None, typer.Option("--columns", metavar="A,B,..", help="Only these columns, in this order.")
    ] = None,
) -> None:
    """Export the rows that match the filters for analysis: Parquet with typed columns, or JSONL, CSV, JSON.

    Read-only and streamed (constant memory for millions of rows). Columns:
    the database's location (role, task, provider, descriptor_model,
    descriptor), then every field of the rows; in Parquet, created_at is a
    UTC timestamp and usage/top_logprobs are JSON. A file is written beside
    its destination and renamed into place (a link's target is replaced; a
    pipe or device is written in place). --json prints a summary (rows,
    file) instead of a note. Ctrl-C exits 130 with one line on stderr saying
    what was left: a file as it was (or not created: no partial file stays);
    stdout or a pipe with the rows written so far, incomplete (a JSON array
    is left open). From Python: store.export.to_pandas / to_dataset.

    Examples:

        judgestore export --format parquet -o judgements.parquet --role judgements

        judgestore export --format jsonl --model my-model --since 2026-01-01 \\
            > rows.jsonl

        judgestore export -f csv -o truncated.csv --finish-reason length \\
            --columns input_hash,model,completion
    """
    from store.export import export_columns, export_rows
    from store.tables.filters import roles_for

    to_stdout = str(output) == "-"
    if to_stdout and output_format is ExportFormatChoice.parquet:
        raise typer.BadParameter("Parquet is binary: give a file with --output", param_hint="--output")
    if json_output and writes_stdout(output):  # `-`, or stdout by another name (/dev/stdout)
        raise typer.BadParameter("--json prints a summary on stdout: give a file with --output", param_hint="--json")
    chosen = None if columns is None else [name.strip() for name in columns.split(",") if name.strip()]
    roles_for(flt, selector.role)  # a filter of the other role (--model-a on completions): exit 1, as query's
    try:  # a column that is none: a usage error (exit 2), as query's --columns
        export_columns(selector, flt, chosen)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e), param_hint="--columns") from e
    writable_output(output, "--output")  # before any work, as every command with an output file
    existed = not to_stdout and output.exists()
    with Store(settings, readonly=True) as store, rows_to_stdout():
        store.require_present("to export")  # a mistyped root must not replace a file with an empty export
        if not settings.store_url:  # a folder store, named as given (as generate and judge name it)
            outside_store(output, "--output", settings.store_root)
        try:
            rows = export_rows(
                store,
                sys.stdout if to_stdout else output,
                output_format.value,  # type: ignore[arg-type]
                selector,
                flt,
                columns=chosen,
                limit=limit,
            )
        except KeyboardInterrupt as e:
            _export_interrupted(getattr(e, "rows_written", 0), output_format.value, output, existed, json_output)
        if not rows:
            no_rows(store, json_output, selector, flt)
    if json_output:
        emit_json({"rows": rows, "format": output_format.value, "output": str(output)})
    elif not to_stdout:
        note(f"exported {quantity(rows, 'row')} to {output} ({output_format.value})", json_output=False)


def _export_interrupted(written: int, fmt: str, output: Path, existed: bool, json_output: bool) -> NoReturn:
    """Ctrl-C in ``export``: what it left at ``output`` (exit 130). A file is written beside it and renamed into
    place only when complete (:mod:`store.export`): the partial one is removed, and ``output`` is as it was.
    Stdout, a pipe or a device holds the rows written before the interrupt: incomplete, and said so."""
    from store.outputs import written_in_place

    if str(output) == "-" or written_in_place(output):
        where = "stdout" if str(output) == "-" else str(output)
        message, state = incomplete_output(written, fmt, where), "incomplete"
    else:
        written, state = 0, "unchanged" if existed else "not created"
        done = "was left as it was" if existed else "was not created"
        message = f"interrupted; {output} {done}: the partial export beside it was removed"
    interrupted(message, json_output, rows_written=written, output=str(output), output_state=state)
