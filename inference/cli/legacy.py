"""``judgestore import``: bring legacy caches into the store (and ``--detect`` to only look at them).

Contract:

* :func:`register` adds the ``import`` command to the app
  :func:`store.cli.app.build_app` assembles (:func:`inference.cli.main` passes it).
* Thin: detection is :func:`store.legacy.detect.detect`, the import
  :func:`store.legacy.importer.import_sources`, descriptors
  :class:`inference.legacy.mapper.LegacyDescriptorMapper`. This module parses options
  and renders: a rich table on stdout (or ``--json``), a progress bar on
  stderr (terminals only), and ``--report FILE`` with the full JSON report.
* Exit status 1 when anything failed: a source that is corrupt, invalid or
  whose metadata.json does not match its folder, any row that failed (its
  stored hash does not match its input, malformed values...), or rows left
  out because no descriptor could be named for them (no task, no
  descriptor, a LangChain cache): a script never mistakes "0 imported, 70
  skipped" for success (``--json``: ``"ok": false`` and
  ``totals.unattributed``). Rows skipped for what they are (empty outputs,
  inputs never stored) and conflicts are reported and do not fail it. ``--detect`` exits 1 when a
  source is corrupt, invalid or missing.
* ``--dry-run`` writes nothing anywhere (the store is opened read-only; the
  report file, if asked for, is the only file written).
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from inference.cli.options import key_values, task_name
from inference.spec import parse_key_values
from store import Settings, Store
from store.cli.common import (
    command_errors,
    emit_json,
    interrupted,
    outside_folder,
    progress_bars,
    quantity,
    stderr,
    stdout,
    to_json,
    writable_output,
)
from store.cli.options import JsonOutput, grouped, store_settings
from store.cli.tables import Column, Fit, FittedTable

if TYPE_CHECKING:  # the legacy readers are imported when `import` runs: other commands do not pay for them
    from store.legacy.detect import Detection, DetectionResult
    from store.legacy.importer import ImportProgress
    from store.legacy.report import ImportReport

_STATE_STYLE = {  # by store.legacy.detect.State, a StrEnum: its members are these strings
    "ok": "green",
    "judgestore": "dim",
    "not-ours": "dim",
    "corrupt": "bold red",
    "invalid": "bold red",
    "missing": "bold red",
}


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _interrupted(
    report: "ImportReport | None", sources: int, dry_run: bool, report_path: Path | None, json_output: bool
) -> NoReturn:
    """Ctrl-C in ``import``: the rows imported before it (each chunk is one transaction: they are kept), and that
    the same import run again imports the rest (rows already stored are found, not written twice). Exit 130."""
    # a dry run's totals are what it would import: none of it was
    imported = 0 if report is None or dry_run else report.totals()["imported"]
    started = 0 if report is None else len(report.sources)
    if dry_run:
        message = "interrupted; a dry run writes nothing, so nothing was imported"
    else:
        message = (
            f"interrupted; imported {quantity(imported, 'row')} from {started} of {quantity(sources, 'source')} "
            "before it, kept: run the same import again to import the rest (rows already stored are kept as they "
            "are)"
        )
    if report_path is not None:
        message += f"; {report_path} was not written"
    interrupted(message, json_output, rows_imported=imported, sources_started=started, sources=sources)


def _detect_table(result: "DetectionResult") -> FittedTable:
    from store.legacy.detect import LegacyVariant

    columns = [Column("Source", fit=Fit.PATH), Column("Variant"), Column("Role"), Column("Task", fit=Fit.MIDDLE)]
    columns += [Column("Rows", justify="right"), Column("State"), Column("Descriptor / problem", fit=Fit.WRAP)]
    table = FittedTable("Legacy caches found", columns)
    for d in result.detections:
        table.add_row(
            Text(_shown(d.path)),
            d.variant or "",
            d.role or ("per row" if d.variant is LegacyVariant.S2 else ""),
            Text(d.tree.task if d.tree else ""),
            "" if d.rows is None else f"{d.rows:,}",
            Text(d.state.value, style=_STATE_STYLE[d.state]),
            Text(_detail(d)),
        )
    table.caption = f"{len(result.detections)} sources" + (
        f"; {result.ignored_files} other files ignored" if result.ignored_files else ""
    )
    return table


def _detail(d: "Detection") -> str:
    """For a known variant, what its metadata.json says; otherwise what is wrong."""
    from store.legacy.detect import LegacyVariant, State

    if d.state is not State.OK or d.kind == "metadata":
        return d.detail
    if d.metadata is None:
        return "no metadata.json (needs --descriptor)" if d.variant is not LegacyVariant.LANGCHAIN else "never imported"
    model, provider = d.metadata.model, d.metadata.provider  # an S1 metadata.json names no provider
    named = f"{provider}/{model}" if provider else model
    return f"{d.metadata.form.value} metadata.json" + (f": {named}" if model else "")


def _import_table(report: "ImportReport") -> FittedTable:
    title = "Import" + (" (dry run: nothing written)" if report.dry_run else "") + f" into {report.store_root}"
    counts = ("Rows", "Imported", "Present", "Conflicts", "Skipped", "Failed")
    columns = [Column("Source", fit=Fit.PATH), Column("Variant")]
    table = FittedTable(title, [*columns, *(Column(name, justify="right") for name in counts), Column("Status")])
    for s in report.sources:
        style = {"failed": "bold red", "partial": "bold red", "conflicts": "yellow", "imported": "green"}.get(
            s.status, "dim"
        )
        table.add_row(
            Text(_shown(s.path)),
            s.variant or "",
            f"{s.rows:,}",
            f"{s.imported:,}",
            f"{s.already_present:,}",
            f"{s.conflicts:,}",
            f"{sum(s.skipped.values()):,}",
            f"{sum(s.failed.values()):,}",
            Text(s.status, style=style),
        )
    totals = report.totals()
    table.caption = (
        (
            f"{totals['rows']:,} rows: {totals['imported']:,} imported, {totals['already_present']:,} already present, "
            f"{totals['conflicts']:,} conflicts, {totals['skipped']:,} skipped, {totals['failed']:,} failed"
        )
        + (f"; {quantity(totals['failed_sources'], 'source')} failed" if totals["failed_sources"] else "")
        + (f"; {report.ignored_files:,} other files ignored" if report.ignored_files else "")
    )
    return table


def _print_reasons(report: "ImportReport", console: Console) -> None:
    """Why rows were skipped or failed, per source, with a few example rows; then notes and conflicts."""
    for s in report.sources:
        lines: list[Text] = []
        for label, counter, style in (("failed", s.failed, "bold red"), ("skipped", s.skipped, "yellow")):
            for reason, count in counter.items():
                examples = s.examples.get(reason)
                where = f" (e.g. {'; '.join(examples)})" if examples else ""
                what = f"  {label} {count:,}: " if count else f"  {label}: "  # 0: a file whose rows are unknown
                lines.append(Text.assemble((what, style), reason + where))
        if s.conflicts:
            lines.append(Text.assemble(("  conflicts ", "bold yellow"), f"{s.conflicts:,}: a different output is "
                                       "already stored under the same key; the stored one was kept"))  # fmt: skip
            for c in s.conflict_list[:3]:
                lines.append(Text(f"    {c['row']}: kept {c['kept']}, not imported {c['not_imported']}"))
        lines += [Text(f"  assumed: {a}", style="dim") for a in s.assumptions]
        lines += [Text(f"  note: {n}", style="dim") for n in s.notes]
        if lines:
            console.print(Text(_shown(s.path), style="bold"))
            for line in lines:
                console.print(line, soft_wrap=True)


def import_command(
    sources: Annotated[
        list[Path], typer.Argument(help="Legacy cache files or folders (searched recursively).", metavar="PATH")
    ],
    settings: Settings,
    json_output: JsonOutput = False,
    detect_only: Annotated[
        bool, typer.Option("--detect", help="Only say what each source is (variant, role, rows); import nothing.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be imported; write nothing.")] = False,
    report_path: Annotated[
        Path | None,
        typer.Option(
            "--report", metavar="FILE", help="Write the full JSON report to FILE (with --detect: what was found)."
        ),
    ] = None,
    descriptor_path: Annotated[
        Path | None,
        typer.Option(
            "--descriptor",
            metavar="FILE",
            help="Descriptor for sources that record none (S0, S1, DataFrame caches) or cannot be mapped: a "
            'judgestore descriptor or metadata.json, or {"vllm": {"model": .., "engine_kwargs": .., "sampling": ..}}.',
        ),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task", help="Task for sources outside a legacy tree (S0, S1, DataFrame caches).", callback=task_name
        ),
    ] = None,
    assume_current_model: Annotated[
        list[str] | None,
        typer.Option(
            "--assume-current-model",
            metavar="MODEL|LEGACY=CURRENT",
            help="Resolve the revision and chat template the legacy files never recorded from this model as it is "
            "now (recorded in metadata.json as an assumption). Repeatable.",
        ),
    ] = None,
    assume_setting: Annotated[
        list[str] | None,
        typer.Option(
            "--assume-setting",
            metavar="[ROLE:]KEY=VALUE",
            help="A setting the legacy run used but never recorded (e.g. logprobs=5); recorded as an assumption. "
            "judgements:logprobs=5 assumes it of the judge caches only.",
            callback=key_values,
        ),
    ] = None,
    inputs_path: Annotated[
        Path | None,
        typer.Option(
            "--inputs",
            metavar="FILE",
            help="JSONL naming the inputs that DataFrame caches and S1 completions never stored "
            '({"instruction_index": 7, "messages": [...]}, MT-Bench: "turns"; ELO judge caches: "row").',
        ),
    ] = None,
) -> None:
    """Import legacy caches (S0 ... S7, DataFrame caches) into the store; legacy files are only read.

    Every row is rehashed under judgestore's rule and verified against its
    stored hash; rows already in the store win; rows that cannot be attributed
    to a descriptor are skipped with the reason, never guessed. A second run
    imports nothing new. Ctrl-C exits 130 with one line on stderr saying how
    many rows were imported before it: they are kept, and the same import run
    again imports the rest.

    Examples:

        judgestore import ~/judgearena-data/cache --detect

        judgestore import old-cache/ --assume-current-model Qwen/Qwen3-8B \\
            --dry-run

        judgestore import cache/db/mt-bench/gpt4.db --descriptor judge.json \\
            --task mt-bench --report report.json
    """
    from inference.legacy.mapper import LegacyDescriptorMapper, parse_assumed_models
    from inference.legacy.user_descriptor import load_user_descriptor
    from store.legacy.detect import PROBLEM_STATES, detect
    from store.legacy.importer import ImportOptions, import_sources
    from store.legacy.inputs import InputsTable

    if report_path is not None:  # legacy files are only read: the report goes over none of them, nor among them
        writable_output(report_path, "--report", [*sources, *(p for p in (inputs_path, descriptor_path) if p)])
        for source in (s for s in sources if s.is_dir()):  # a later import would find the report there
            outside_folder(report_path, "--report", source, f"the legacy cache {source}, whose files are only read")
    result = detect(sources)
    if detect_only:
        found = {"sources": [d.as_dict() for d in result.detections], "ignored_files": result.ignored_files}
        if report_path is not None:  # what --json prints (it was silently not written, was)
            report_path.write_text(to_json(found) + "\n", encoding="utf-8")
        if json_output:
            emit_json(found)
        else:
            stdout().print(_detect_table(result))
        if any(d.state in PROBLEM_STATES for d in result.detections):
            raise typer.Exit(1)
        return
    mapper = LegacyDescriptorMapper(
        user_descriptor=load_user_descriptor(descriptor_path) if descriptor_path is not None else None,
        assume_current_model=parse_assumed_models(assume_current_model or []),
        assume_settings=parse_key_values(assume_setting, "--assume-setting"),
        detections=result.detections,
        task=task,
    )
    options = ImportOptions(
        task=task, dry_run=dry_run, inputs=InputsTable.load(inputs_path) if inputs_path is not None else None
    )
    err = stderr()
    report = None
    try:
        with Store(settings, readonly=dry_run) as store, progress_bars(json_output) as progress:

            def on_progress(event: "ImportProgress") -> None:
                progress(f"[{event.index + 1}/{event.sources}] {event.path.name}", event.rows_done, event.rows_total)

            report = import_sources(result.detections, store, mapper, options, on_progress=on_progress,
                                    ignored_files=result.ignored_files)  # fmt: skip
    except KeyboardInterrupt as e:  # the import's report so far; its whole one when it came as the store closed
        _interrupted(getattr(e, "import_report", report), len(result.detections), dry_run, report_path, json_output)
    payload: dict[str, Any] = report.as_dict()
    if report_path is not None:
        report_path.write_text(to_json(payload) + "\n", encoding="utf-8")  # as --json writes it: any path
    if json_output:
        emit_json(payload)
    else:
        stdout().print(_import_table(report))
        if not report.sources:  # folders holding no cache at all: say so, not just a table of nothing
            err.print(
                f"No legacy cache found in {', '.join(map(str, sources))} ({report.ignored_files:,} other files "
                "ignored); `judgestore import --detect` says what it recognises",
                style="yellow",
                soft_wrap=True,
            )
        _print_reasons(report, err)
        unattributed = report.totals()["unattributed"]
        if unattributed:
            err.print(
                f"{unattributed:,} {'row was' if unattributed == 1 else 'rows were'} not imported because their "
                "descriptor, task or inputs could not be named; see the reasons above (--assume-current-model, "
                "--descriptor, --task, --inputs)",
                style="bold red",
                soft_wrap=True,
            )
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("import")(command_errors(grouped(settings=store_settings)(import_command)))
