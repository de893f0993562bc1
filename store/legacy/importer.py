"""Import detected legacy caches into the current layout, every row accounted for.

Contract:

* Sources are read-only (:mod:`store.legacy.readonly`); they are never changed.
* Each source needs a descriptor, which this module never guesses: a
  :data:`Resolver` (``inference.legacy`` maps legacy descriptors with the live
  rules, or applies the user's ``--descriptor``) returns an
  :class:`Attribution`. Without one, every row of the source is skipped with
  the resolver's reason. The task comes from the legacy tree, else from
  ``ImportOptions.task``, else the source is skipped.
* Each row becomes a record by :func:`store.legacy.convert.to_record` (legacy
  hash verified, key recomputed under judgestore's rule, values normalised);
  a row it refuses is skipped or failed alone, with its reason and locator,
  and the rest go on.
* Records are written by :class:`store.legacy.writer.ChunkedWriter`: chunks
  of one transaction each, rows already stored kept (equal outputs counted
  as already present, different ones as conflicts); a rerun imports exactly
  what is missing.
* ``dry_run`` needs a read-only store and writes nothing anywhere; it counts
  what a real run would.
* Every row of every source ends in the :class:`~store.legacy.report.ImportReport`
  (imported, already present, conflict, skipped or failed, with reasons);
  a source that cannot be read, or stops half way, fails its remaining rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from store.descriptor import ModelDescriptor
from store.errors import STORE_UNUSABLE, DataFrameError, InvalidInputError, JudgestoreError
from store.interrupts import carrying
from store.legacy.convert import RowNotImported, to_record
from store.legacy.detect import PROBLEM_STATES, Detection, LegacyVariant, State
from store.legacy.formats import count_rows, iter_rows
from store.legacy.inputs import InputsTable
from store.legacy.readonly import WRITTEN_MEANWHILE, file_stamp, pending_journal
from store.legacy.report import ImportReport, SourceReport
from store.legacy.writer import ChunkedWriter
from store.roles import Role
from store.store import Store

DEFAULT_CHUNK_SIZE = 1000
NEEDS_INPUTS = frozenset(
    {LegacyVariant.S1C, LegacyVariant.DF_COMPLETIONS, LegacyVariant.DF_MT_BENCH, LegacyVariant.DF_ELO_JUDGE}
)
RAW_PROMPT_VARIANTS = frozenset({LegacyVariant.S0, LegacyVariant.S1J})
LANGCHAIN_REASON = (
    "LangChain SQLiteCache: its `llm` string does not identify the vLLM model or its settings and its prompts "
    "are LangChain's serialisation, so it is never imported (rerun those prompts with `judgestore generate`)"
)


@dataclass(frozen=True, slots=True)
class Attribution:
    """The descriptor a source's rows are imported under, or why there is none."""

    descriptor: ModelDescriptor | None
    assumptions: tuple[str, ...] = ()  # recorded in metadata.json when the descriptor folder is created
    reason: str = ""  # why ``descriptor`` is None
    failed: bool = False  # None because the source is bad (a failure), not because something was not given (a skip)
    notes: tuple[str, ...] = ()
    # Notes for one role only (the command that adopts that role's rows): kept only if the source has rows of it.
    role_notes: tuple[tuple[Role, str], ...] = ()
    advice: str = ""  # what to give so that it has one (said with the reason; not once it was given)

    @property
    def why(self) -> str:
        """The reason there is no descriptor, and what to give."""
        return f"{self.reason}; {self.advice}" if self.advice else self.reason


Resolver = Callable[[Detection], Attribution]


def no_descriptor(detection: Detection) -> Attribution:
    """The resolver of a store without the live rules: every source is skipped."""
    return Attribution(None, reason="no descriptor: import with `judgestore import` (it maps legacy descriptors)")


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """Where an import is: source ``index`` of ``sources``, ``rows_done`` of ``rows_total`` in it."""

    path: Path
    index: int
    sources: int
    rows_done: int
    rows_total: int


@dataclass(frozen=True, slots=True)
class ImportOptions:
    task: str | None = None  # for sources outside a legacy tree
    dry_run: bool = False
    inputs: InputsTable | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE


class SourceImporter:
    """Imports sources one at a time into one store: attribution, row conversion, writing, progress."""

    def __init__(
        self,
        store: Store,
        resolver: Resolver,
        options: ImportOptions,
        on_progress: Callable[[ImportProgress], None] | None,
    ) -> None:
        self.resolver = resolver
        self.options = options
        self.on_progress = on_progress
        self.writer = ChunkedWriter(store, dry_run=options.dry_run, chunk_size=options.chunk_size)

    def source(self, detection: Detection, report: SourceReport, index: int, total_sources: int) -> None:
        """Import one source (``index`` of ``total_sources``, for progress) and account for each of its rows in
        ``report``, each chunk as it is written (so that an interrupt leaves it saying what was imported)."""
        if not self._importable(detection, report):
            return
        task = detection.tree.task if detection.tree is not None else self.options.task
        try:
            rows_total = count_rows(detection)
        except (OSError, DataFrameError, sqlite3.DatabaseError) as e:
            report.fail_source(f"cannot be read: {e}")
            return
        report.rows = rows_total
        if task is None:
            report.skip_source("no task: this file lies outside a legacy tree; pass --task NAME", unattributed=True)
            return
        if detection.variant in NEEDS_INPUTS and self.options.inputs is None:
            why = "holds no inputs (only outputs keyed by position): pass --inputs FILE naming each input"
            report.skip_source(f"{detection.variant} {why}", unattributed=True)
            return
        attribution = self.resolver(detection)
        report.notes.extend(attribution.notes)
        if attribution.descriptor is None:
            if attribution.failed:
                report.fail_source(attribution.why)
            else:
                report.skip_source(attribution.why, unattributed=True)
            return
        descriptor = attribution.descriptor
        assumptions = list(attribution.assumptions)
        if detection.variant in RAW_PROMPT_VARIANTS:
            shape = "one user message" if descriptor.input_mode == "chat" else "a text prompt"
            assumptions.append(f"{detection.variant} rows stored their judge prompt as plain text; imported as {shape}")
        report.assumptions = assumptions
        roles = self._rows(detection, report, task, descriptor, tuple(assumptions), index, total_sources)
        report.notes.extend(note for role, note in attribution.role_notes if role in roles)

    def _importable(self, detection: Detection, report: SourceReport) -> bool:
        """Whether the detection is a source to read rows from; if not, all its rows are accounted for here."""
        report.rows = detection.rows or 0
        if detection.state in PROBLEM_STATES:
            report.fail_source(detection.detail)
            return False
        if detection.state is not State.OK or detection.kind == "metadata":
            report.skip_source(detection.detail, unattributed=False)
            return False
        if detection.variant is LegacyVariant.LANGCHAIN:
            report.skip_source(LANGCHAIN_REASON, unattributed=True)
            return False
        return True  # a metadata.json that does not match its folder is INVALID already (detect)

    def _rows(
        self,
        detection: Detection,
        report: SourceReport,
        task: str,
        descriptor: ModelDescriptor,
        assumptions: tuple[str, ...],
        index: int,
        total_sources: int,
    ) -> set[Role]:
        """Import the source's rows (each accounted for in ``report``); the roles of the rows it turned into records."""
        fallback = datetime.fromtimestamp(detection.path.stat().st_mtime, UTC)
        done = 0
        roles: set[Role] = set()
        # Read in place, without a lock (a file with a journal is read from a copy, itself the snapshot)
        in_place = detection.kind == "sqlite" and not pending_journal(detection.path)
        stamp = file_stamp(detection.path) if in_place else None
        try:
            for row in iter_rows(detection, self.options.inputs, fallback_time=fallback.isoformat()):
                done += 1
                for message in row.notes:
                    report.note(message)
                try:
                    record = to_record(row, descriptor, fallback)
                except RowNotImported as outcome:
                    (report.fail if outcome.kind == "fail" else report.skip)(outcome.reason, row.locator)
                else:
                    if row.stored_hash is not None and record.input_hash != row.stored_hash:
                        report.rekeyed += 1
                    self.writer.add(
                        record,
                        row.locator,
                        role=row.role,
                        task=task,
                        descriptor=descriptor,
                        assumptions=assumptions,
                        report=report,
                    )
                    roles.add(row.role)
                if done % self.options.chunk_size == 0:
                    self._progress(detection.path, index, total_sources, done, report.rows)
        except STORE_UNUSABLE:
            raise
        except (OSError, DataFrameError, JudgestoreError, sqlite3.DatabaseError) as e:
            self.writer.flush(report)
            # Every row without an outcome yet (the one being handled, and those never read) failed.
            unaccounted = max(report.rows - report.accounted(), 0)
            said = f"{WRITTEN_MEANWHILE} ({e})" if self._written_meanwhile(detection, stamp) else str(e)
            report.fail_source(f"stopped after {done} rows: {said}", reason=f"not imported: {said}", count=unaccounted)
            return roles
        self.writer.flush(report)
        if self._written_meanwhile(detection, stamp):
            # Each row read was checked as any is; the rows may still be of two states, and more may have come.
            report.fail_source(f"read {done} rows, and it {WRITTEN_MEANWHILE}", count=0)
            report.rows = done
        elif done != report.rows:  # a file that changed between its detection and this read
            report.note(f"expected {report.rows} rows and read {done}")
            report.rows = done
        self._progress(detection.path, index, total_sources, done, report.rows)
        return roles

    @staticmethod
    def _written_meanwhile(detection: Detection, stamp: tuple[object, ...] | None) -> bool:
        return stamp is not None and file_stamp(detection.path) != stamp

    def _progress(self, path: Path, index: int, sources: int, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(ImportProgress(path, index, sources, done, total))


def import_sources(
    detections: Sequence[Detection] | Iterable[Detection],
    store: Store,
    resolver: Resolver,
    options: ImportOptions | None = None,
    *,
    on_progress: Callable[[ImportProgress], None] | None = None,
    ignored_files: int = 0,
) -> ImportReport:
    """Import every detection into ``store`` (read-only for a dry run); see the module docstring.

    A ``KeyboardInterrupt`` (Ctrl-C) gets ``import_report``, the report so far: its ``imported`` counts are the
    rows of the chunks written before it (the chunk it stopped in is rolled back). A rerun imports the rest. A
    server that cannot be used (:data:`~store.errors.STORE_UNUSABLE`) stops the import too, with a note
    saying how many rows were imported before it.
    """
    options = options or ImportOptions()
    if options.chunk_size < 1:
        raise InvalidInputError(f"chunk_size must be >= 1, got {options.chunk_size}")
    if options.dry_run and not store.readonly:
        raise InvalidInputError("a dry run needs a read-only store: Store(..., readonly=True)")
    detections = list(detections)
    importer = SourceImporter(store, resolver, options, on_progress)
    report = ImportReport(store.where, options.dry_run, ignored_files=ignored_files)
    with carrying("import_report", report), closing(importer.writer):  # the report: the chunks before a Ctrl-C
        try:
            for index, detection in enumerate(detections):
                source = SourceReport(detection.path, detection.variant, detection.state.value)
                report.sources.append(source)
                importer.source(detection, source, index, len(detections))
        except STORE_UNUSABLE as e:  # the import stops there: say what it wrote before (it is kept)
            imported = report.totals()["imported"]
            if imported and not options.dry_run:
                e.add_note(
                    f"Before it, {imported:,} {'row was' if imported == 1 else 'rows were'} imported (kept): run "
                    "the same import again once the server answers, which imports the rest"
                )
            raise
    return report
