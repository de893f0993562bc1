"""``judgestore copy``: move a store between a folder and a PostgreSQL server (or folder to folder).

Contract:

* Thin: parse, call :func:`store.copy.copy_store`, render (see
  :mod:`store.cli.common` for the edge and where output goes,
  :mod:`store.cli.options` for the shared options).
* Exactly one of ``--from-root`` / ``--from-url`` and one of ``--to-root`` /
  ``--to-url``; anything else is a usage error (exit 2, a JSON error with
  ``--json``) before any store is opened. The source is opened read-only.
* Exits 1 when any database did not verify (a conflict, a row that did not
  read back the same, a database that could not be copied); a second run of
  a finished copy writes nothing and exits 0.
* Ctrl-C exits 130 with one line on stderr (:func:`~store.cli.common.interrupted`):
  the rows copied before it, which are kept, and that running the copy again
  finishes it.
"""

from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.text import Text

from store.cli.common import (
    command_errors,
    emit_json,
    interrupted,
    location_cells,
    location_table,
    note,
    progress_bars,
    quantity,
    stderr,
    stdout,
    unmatched,
)
from store.cli.options import JsonOutput, grouped, named_store_settings, selection, store_folder, store_server
from store.layout import Selector
from store.settings import Settings
from store.store import Store

if TYPE_CHECKING:
    from store.copy import CopiedDatabase, CopyReport

STORES_PANEL = "Stores"


def register(app: typer.Typer) -> None:
    app.command("copy")(command_errors(grouped(selector=selection)(copy_command)))


def _one_of(root: str | None, url: str | None, side: str) -> None:
    if (root is None) == (url is None):
        given = "both" if root is not None else "neither"
        raise typer.BadParameter(f"give exactly one of --{side}-root PATH and --{side}-url URL (got {given})")


def _side(settings: Settings, root: str | None, url: str | None, side: str, *, readonly: bool) -> Store:
    """The store ``--{side}-root`` or ``--{side}-url`` names (an empty one refused by its option's name)."""
    return Store(
        settings,
        root=store_folder(root, f"--{side}-root"),
        url=store_server(url, f"--{side}-url"),
        readonly=readonly,
    )


def copy_command(
    selector: Selector,
    from_root: Annotated[
        str | None,
        typer.Option("--from-root", metavar="PATH", help="Copy from this store folder.", rich_help_panel=STORES_PANEL),
    ] = None,
    from_url: Annotated[
        str | None,
        typer.Option(
            "--from-url",
            metavar="URL",
            help="Copy from this PostgreSQL store (postgresql+psycopg://user@host/db).",
            rich_help_panel=STORES_PANEL,
        ),
    ] = None,
    to_root: Annotated[
        str | None,
        typer.Option("--to-root", metavar="PATH", help="Copy into this store folder.", rich_help_panel=STORES_PANEL),
    ] = None,
    to_url: Annotated[
        str | None,
        typer.Option("--to-url", metavar="URL", help="Copy into this PostgreSQL store.", rich_help_panel=STORES_PANEL),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option("--chunk-size", min=1, show_default=False, help="Rows per write transaction (default 2,000)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only show what would be copied and what conflicts; write nothing.")
    ] = False,
    json_output: JsonOutput = False,
) -> None:
    """Copy every selected descriptor database from one store to another, verifying every row.

    Rows keep every column (adopted rows stay adopted); the runs and adoptions
    tables travel too. Rows the target already holds are kept, never
    overwritten: a key it holds with a different row is reported as a
    conflict. Idempotent: run it again after a kill to finish, or to check a
    finished copy (it then writes nothing). Exits 1 if any database did not
    verify. Ctrl-C exits 130 with one line on stderr saying how many rows
    were copied: they are kept, and running the copy again finishes it.
    --dry-run reads both stores and writes to neither: the rows each database
    would get, what the target already holds, and the conflicts.

    Examples:

        judgestore copy --from-root ./judgestore-data \\
            --to-url postgresql+psycopg://me@db-host/evals

        judgestore copy --from-url postgresql+psycopg://me@db-host/evals \\
            --to-root ./mirror --task mt-bench --json
    """
    from store.copy import DEFAULT_CHUNK_SIZE, copy_store  # imported by this command only (see store.cli.app)

    _one_of(from_root, from_url, "from")
    _one_of(to_root, to_url, "to")
    settings = named_store_settings()  # its options name both stores
    report = None
    try:
        with (
            _side(settings, from_root, from_url, "from", readonly=True) as source,
            _side(settings, to_root, to_url, "to", readonly=dry_run) as target,
            progress_bars(json_output) as progress,
        ):
            chunks = chunk_size or DEFAULT_CHUNK_SIZE
            report = copy_store(source, target, selector, chunk_size=chunks, on_progress=progress, dry_run=dry_run)
            # A mistyped --task: which filters picked none of how many (was: "no databases match", as of no store)
            unpicked = None if report.databases else unmatched(source, selector)
    except KeyboardInterrupt as e:  # the copy's report so far; its whole one when it came as the stores closed
        _interrupted(getattr(e, "copy_report", report), json_output)
    if json_output:
        emit_json(report.as_dict())
    elif not report.databases:
        said = f"{unpicked}: nothing to copy" if unpicked else f"Nothing to copy: no databases in {report.source}"
        note(f"{said}.", json_output=json_output)
    else:
        _render(report)
    if not report.ok:
        raise typer.Exit(1)


def _interrupted(report: "CopyReport | None", json_output: bool) -> NoReturn:
    """Ctrl-C in ``copy``: the rows copied before it (committed, kept: each chunk is one transaction), and that the
    same copy run again finishes it, skipping them (exit 130)."""
    if report is None:  # before the first database: the stores were being checked
        interrupted("interrupted before any row was copied; nothing was written", json_output, rows_written=0)
    if report.dry_run:  # its counts are what a copy would write
        interrupted("interrupted; a dry run: nothing was written", json_output, rows_written=0)
    written = [d for d in report.databases if d.written]
    message = (
        f"interrupted; {quantity(report.rows_written, 'row')} had been copied into {report.target} "
        f"({quantity(len(written), 'database')}), committed and kept: run the same copy "
        "again to finish it (it skips the rows already there, and verifies every row)"
    )
    interrupted(message, json_output, rows_written=report.rows_written, databases=len(written),
                source=report.source, target=report.target)  # fmt: skip


def _render(report: "CopyReport") -> None:
    written, verified = ("To write", "Would verify") if report.dry_run else ("Written", "Verified")
    extra = [("Read", "right"), (written, "right"), ("Conflicts", "right"), (verified, "left")]
    title = f"Copy {report.source} -> {report.target}" + (" (dry run: nothing written)" if report.dry_run else "")
    table = location_table(title, *extra)
    for d in report.databases:
        table.add_row(
            *location_cells(d.location),
            f"{d.source_rows:,}",
            f"{d.written:,}",
            Text(f"{d.conflicts:,}", style="bold red" if d.conflicts else ""),
            Text("yes", style="green") if d.verified else Text("NO", style="bold red"),
        )
    runs = sum(d.bookkeeping.get("runs", 0) for d in report.databases)
    adopted = sum(d.bookkeeping.get("adoptions", 0) for d in report.databases)
    records = f"{quantity(runs, 'run')} and {quantity(adopted, 'adoption')}"
    if report.dry_run:
        done = f"{quantity(report.rows_written, 'row')} to write, {records} to copy"
    else:
        done = f"{quantity(report.rows_written, 'row')} written, {records} copied"
    table.caption = f"{quantity(len(report.databases), 'database')}, {done}"
    stdout().print(table)
    for d in report.databases:
        for problem in _problems(d):
            stderr().print(Text(f"{d.location.relative_folder()}: {problem}", style="red"), soft_wrap=True)
    if not report.ok:
        bad = sum(not d.verified for d in report.databases)
        verify = "would not verify" if report.dry_run else "did not verify"
        stderr().print(Text(f"{bad} of {len(report.databases)} databases {verify}.", style="bold red"))


def _problems(d: "CopiedDatabase") -> list[str]:
    listed = list(d.problems)
    if d.conflicts > len(d.conflicting_keys):
        listed.append(f"{d.conflicts} conflicting rows in all (the target's rows were kept)")
    if not d.problems and not d.verified and d.target is not None:
        listed.append("the database digests differ: the target does not hold every source row unchanged")
    return listed
