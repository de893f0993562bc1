"""The maintenance commands: ``db status``, ``db upgrade`` and ``verify``.

Contract:

* Thin: parse, call :mod:`store.schema`, :mod:`store.backends.sqlite.upgrade` and
  :mod:`store.backends.sqlite.verify`, render (see :mod:`store.cli.common`).
* ``db status`` and ``verify`` never write; ``db upgrade`` writes only the
  databases that are behind (with a backup each), and with ``--dry-run``
  none (each checked as an upgrade checks it first).
* Each exits 1 when it finds a problem: a database that is not usable, an
  upgrade refused or failed, a verification problem.
* Ctrl-C in ``verify`` or ``db upgrade`` exits 130 with one line on stderr
  (:func:`~store.cli.common.interrupted`): how many databases were checked
  or upgraded, and that the others were not.
"""

from typing import Annotated, Any, NoReturn

import typer
from rich.text import Text

from store import schema
from store.backends.postgres.connections import is_store_url
from store.cli.common import (
    command_errors,
    counted,
    emit_json,
    interrupted,
    no_databases,
    note,
    print_claims,
    quantity,
    report_unlisted,
    state_text,
    stderr,
    stdout,
    unmatched,
    unprefixed,
)
from store.cli.options import JsonOutput, grouped, selection, store_settings
from store.cli.tables import Column, Fit, FittedTable
from store.errors import InvalidInputError
from store.interrupts import MIGRATING
from store.layout import Selector
from store.reports import DatabaseVerification, UpgradeOutcome, UpgradeResult
from store.roles import ROLES
from store.schema import DatabaseState
from store.settings import Settings
from store.store import Store


def register(app: typer.Typer) -> None:
    db_app = typer.Typer(name="db", help="Schema revisions of the databases: status and upgrade.", no_args_is_help=True)
    db_app.command("status")(command_errors(grouped(settings=store_settings, selector=selection)(db_status_command)))
    db_app.command("upgrade")(command_errors(grouped(settings=store_settings, selector=selection)(db_upgrade_command)))
    app.add_typer(db_app, name="db")
    app.command("verify")(command_errors(grouped(settings=store_settings, selector=selection)(verify_command)))


def db_status_command(settings: Settings, selector: Selector, json_output: JsonOutput = False) -> None:
    """Schema state of every database against this library's head revision.

    Read-only. Exits 1 if any database is behind, ahead, foreign, damaged
    beyond opening, or has a metadata.json that does not match its folder.
    It reads each file's schema, not every page: `judgestore verify` does.

    Examples:

        judgestore db status

        judgestore db status --json
    """
    with Store(settings, readonly=True) as store:
        store.require_present("to check")
        locations = store.select(selector)
        infos = list(counted(store.infos(locations, count_rows=False), len(locations), "Checking"))
        unlisted = store.unlisted(selector)
    head = schema.revisions().head
    bad = [info for info in infos if not info.ok]
    if json_output:
        databases = [info.as_dict() for info in infos]
        emit_json({"head": head, "ok": not bad and not unlisted, "databases": databases,
                   "unlisted": [problem.as_dict() for problem in unlisted]})  # fmt: skip
    elif not infos and not unlisted:
        no_databases(store, json_output, selector)
    else:
        columns = [Column("Database", fit=Fit.PATH), Column("State"), Column("Revision")]
        table = FittedTable(f"Schema revisions (library head: {head})", [*columns, Column("Problem", fit=Fit.WRAP)])
        for info in infos:
            problem = unprefixed(info.error or "", info.where)
            table.add_row(
                Text(str(info.location.relative_folder())), state_text(info), info.revision or "", Text(problem)
            )
        stdout().print(table)
        print_claims((info.location, info.claims) for info in infos)
        if bad:
            behind = sum(info.state == "behind" for info in bad)
            hint = f"; run `judgestore db upgrade` for the {behind} behind" if behind else ""
            stderr().print(Text(f"{len(bad)} of {len(infos)} databases need attention{hint}.", style="bold red"))
        elif not unlisted:
            usable = (
                "The database is usable; it does not need"
                if len(infos) == 1
                else f"All {len(infos)} databases are usable; none needs"
            )
            note(f"{usable} `judgestore db upgrade`.", json_output=json_output)
        report_unlisted(unlisted, json_output=False)
    if bad or unlisted:
        raise typer.Exit(1)


_OUTCOME_STYLE = {
    UpgradeOutcome.UPGRADED: "green",
    UpgradeOutcome.UP_TO_DATE: "dim",
    UpgradeOutcome.REFUSED: "bold red",
    UpgradeOutcome.FAILED: "bold red",
    UpgradeOutcome.WOULD_UPGRADE: "yellow",
}


def db_upgrade_command(
    settings: Settings,
    selector: Selector,
    json_output: JsonOutput = False,
    no_backup: Annotated[
        bool,
        typer.Option("--no-backup", help="Delete each backup once its upgrade succeeded (a folder store's)."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only make the checks an upgrade makes first, and say what it would do.")
    ] = False,
) -> None:
    """Upgrade every database that is behind to this library's head revision.

    Per file: lock, re-check, back up beside it (*.bak-REVISION-TIME), migrate,
    verify row counts; a failure restores the backup. Ahead, foreign and
    damaged files are refused and not touched. A second run does nothing.
    On a PostgreSQL server each schema is migrated in one transaction (a
    failure leaves it as it was) and no backup is made: take one with pg_dump.
    Exits 1 if anything was refused or failed. Ctrl-C exits 130 with one line
    on stderr saying how many were upgraded: the one it stopped in is left at
    its revision (its migration is one transaction), and so are the rest.

    --dry-run reads each database and changes nothing: the checks an upgrade
    makes before it writes (its revision; on a folder store SQLite's
    quick_check, room for the backup and a writable file) and the rows each
    table holds; "would_upgrade" where they all pass. The migration itself
    is not run. Exits 1 if one would be refused.

    Examples:

        judgestore db upgrade --dry-run

        judgestore db upgrade

        judgestore db upgrade --task mt-bench --json
    """
    if no_backup and settings.store_url and not dry_run:
        note(
            "--no-backup: a server's upgrade makes no backup to delete (take one with pg_dump)",
            json_output=json_output,
        )
    with Store(settings, readonly=dry_run) as store:
        locations = store.select(selector)
        results: list[UpgradeResult] = []
        upgrades = store.upgrade(locations, keep_backup=not no_backup, dry_run=dry_run)
        try:
            results.extend(counted(upgrades, len(locations), "Checking" if dry_run else "Upgrading"))
        except KeyboardInterrupt as e:
            if dry_run:
                interrupted(f"interrupted; checked {len(results)} of {quantity(len(locations), 'database')} (dry "
                            "run: nothing was changed)", json_output, dry_run=True, databases=len(locations),
                            results=[_result_dict(r) for r in results])  # fmt: skip
            # The database it was migrating, if it was (not one already current): did its commit finish?
            stopped = locations[len(results) :][:1] if getattr(e, MIGRATING, None) else []
            at_head = any(info.state is DatabaseState.CURRENT for info in store.infos(stopped, count_rows=False))
            _upgrade_interrupted(results, len(locations), at_head, json_output, files=not is_store_url(store.where))
        folders = [str(location.relative_folder()) for location in locations]  # one result per location, in order
        unlisted = store.unlisted(selector)  # never upgraded: no location names them
    bad = [r for r in results if r.outcome in (UpgradeOutcome.REFUSED, UpgradeOutcome.FAILED)]
    if json_output:
        results_json = [_result_dict(r) for r in results]
        emit_json({"head": schema.revisions().head, "ok": not bad and not unlisted, "dry_run": dry_run,
                   "results": results_json, "unlisted": [problem.as_dict() for problem in unlisted]})  # fmt: skip
    elif not results and not unlisted:
        no_databases(store, json_output, selector)
    else:
        columns = [Column("Database", fit=Fit.PATH), Column("Result"), Column("From"), Column("To")]
        title = f"Upgrade of {store.where}" + (" (dry run: nothing changed)" if dry_run else "")
        table = FittedTable(title, [*columns, Column("Backup / problem", fit=Fit.WRAP)])
        for folder, r in zip(folders, results, strict=True):
            detail = unprefixed(r.error, r.where) if r.error else ""
            if r.outcome in (UpgradeOutcome.WOULD_UPGRADE, UpgradeOutcome.UPGRADED) and r.rows is not None:
                detail = "; ".join(part for part in (detail, _rows_kept(r.rows)) if part)
            if r.backup is not None:
                backup = store.shown(str(r.backup))
                if r.outcome is UpgradeOutcome.FAILED:  # it keeps the backup it restored the file from
                    if r.backup.name not in detail:  # a full disk's error names it, and what to do with it
                        detail = f"{detail}; the file was restored from its backup, kept at {backup}"
                else:  # an upgraded file's copy from before (a failure's words on every success: was)
                    detail = "; ".join(part for part in (detail, f"backup: {backup}") if part)
            table.add_row(
                Text(folder),
                Text(r.outcome.value.replace("_", " "), style=_OUTCOME_STYLE[r.outcome]),
                r.from_revision or "",
                r.to_revision or "",
                Text(detail),
            )
        counts = {outcome: sum(r.outcome is outcome for r in results) for outcome in UpgradeOutcome}
        table.caption = ", ".join(f"{n} {outcome.value.replace('_', ' ')}" for outcome, n in counts.items() if n)
        stdout().print(table)
        report_unlisted(unlisted, json_output=False)
    if bad or unlisted:
        raise typer.Exit(1)


def _rows_kept(rows: dict[str, int]) -> str:
    """An upgrade's row counts as ``ls`` counts rows (its role's table), the bookkeeping tables beside them: their
    sum read as rows ("6 rows kept" of 5 answers and 1 recorded run: was)."""
    kept = sum(n for table, n in rows.items() if table in ROLES)
    others = ", ".join(f"{n:,} in {table}" for table, n in sorted(rows.items()) if table not in ROLES and n)
    return f"{kept:,} rows kept" + (f" ({others})" if others else "")


def _upgrade_interrupted(
    results: list[UpgradeResult], selected: int, at_head: bool, json_output: bool, *, files: bool
) -> NoReturn:
    """Ctrl-C in ``db upgrade``: how many databases were upgraded (exit 130). The migration of the one it stopped
    in is one transaction: rolled back, unless the interrupt came during its commit (then it is ``at_head``, and
    counted); a backup made of it may stay beside it (a folder store's ``files``; a server's upgrade makes none).
    The databases not reached are as they were."""
    upgraded = sum(result.outcome is UpgradeOutcome.UPGRADED for result in results) + at_head
    stopped = "is at head (its commit had finished)" if at_head else "is still at its revision"
    backups = sum(result.backup is not None for result in results)
    kept = (
        f" Each upgraded file's backup is beside it ({quantity(backups, 'backup')}: `*.bak-<revision>-<time>`); "
        "the one it stopped in may have one too."
        if backups
        else " The one it stopped in may have a backup beside it (`*.bak-<revision>-<time>`), a whole copy of "
        "the file as it is."
        if files
        else ""
    )
    message = (
        f"interrupted; upgraded {upgraded} of {quantity(selected, 'database')}: the one it stopped in {stopped}, "
        f"and the databases not reached are as they were: run `judgestore db upgrade` again to finish.{kept}"
    )
    interrupted(message, json_output, upgraded=upgraded, databases=selected,
                results=[_result_dict(result) for result in results])  # fmt: skip


def _result_dict(result: UpgradeResult) -> dict[str, Any]:
    return {
        "path": result.where,
        "outcome": result.outcome.value,
        "from_revision": result.from_revision,
        "to_revision": result.to_revision,
        "backup": None if result.backup is None else str(result.backup),
        "rows": result.rows,
        "error": result.error,
    }


def verify_command(settings: Settings, selector: Selector, json_output: JsonOutput = False) -> None:
    """Check every database: integrity, metadata, schema, and every row's input hash.

    SQLite's integrity_check, metadata.json against its folder, the schema
    state, and that every row's input_text hashes to its input_hash. It also
    lists stray files and folders under the root; with a database selector,
    those in the descriptor folders it picks (one whose database is missing).
    Read-only. Exits 1 on any problem, listing each with its file, and when
    there is no store there at all (a mistyped --store-root) or no database
    its selectors pick (a mistyped --descriptor: nothing checked). Ctrl-C
    exits 130 with one line on stderr saying how many databases were checked
    (and the problems found in them): the others were not.

    Examples:

        judgestore verify

        judgestore verify --role judgements --json
    """
    with Store(settings, readonly=True) as store:
        store.require_present("to verify")  # a mistyped root must not pass as a store with no problems
        locations = store.select(selector)
        results: list[DatabaseVerification] = []
        try:
            results.extend(counted((store.verify(location) for location in locations), len(locations), "Verifying"))
        except KeyboardInterrupt:
            _verify_interrupted(results, len(locations), json_output)
        problems = [problem for result in results for problem in result.problems]
        problems += store.strays(selector)
        if not results and not problems and (said := unmatched(store, selector)) is not None:
            raise InvalidInputError(f"{said}: nothing was checked")  # nor may a mistyped --descriptor (was: OK)
    rows = sum(result.rows_checked for result in results)
    adopted = sum(result.rows_adopted for result in results)
    if json_output:
        emit_json(
            {
                "ok": not problems,
                "databases": len(results),
                "rows_checked": rows,
                "rows_adopted": adopted,
                "problems": [problem.as_dict() for problem in problems],
            }
        )
    elif problems:
        columns = [Column("Path", fit=Fit.PATH), Column("Kind")]
        # problems wrap: the hashes and commands in them stay whole, to be copied
        table = FittedTable(f"Problems in {store.where}", [*columns, Column("Problem", fit=Fit.WRAP)])
        for problem in problems:
            message = unprefixed(problem.message, problem.where)
            table.add_row(Text(store.shown(problem.where)), problem.kind.value, Text(message))
        said = quantity(len(problems), "problem")
        table.caption = f"{said}; checked {quantity(len(results), 'database')}, {quantity(rows, 'row')}"
        stdout().print(table)
    elif not results:
        no_databases(store, json_output, selector)
    else:
        of_which = f" ({adopted:,} adopted from older descriptors)" if adopted else ""
        stdout().print(f"OK: {quantity(len(results), 'database')}, {quantity(rows, 'row')}{of_which}, no problems.")
    if problems:
        raise typer.Exit(1)


def _verify_interrupted(results: list[DatabaseVerification], selected: int, json_output: bool) -> NoReturn:
    """Ctrl-C in ``verify``: how many databases were checked, what they showed, and that the rest were not
    checked (exit 130). Verifying only reads: nothing was changed."""
    problems = sum(len(result.problems) for result in results)
    rows = sum(result.rows_checked for result in results)
    found = quantity(problems, "problem") if problems else "no problems"
    message = (
        f"interrupted; checked {len(results)} of {quantity(selected, 'database')} "
        f"({quantity(rows, 'row')}, {found}) and left {selected - len(results)} unchecked: "
        "run `judgestore verify` again to check them all"
    )
    interrupted(message, json_output, databases_checked=len(results), databases=selected, rows_checked=rows,
                problems=[problem.as_dict() for result in results for problem in result.problems])  # fmt: skip
