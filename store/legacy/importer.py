"""Import detected legacy caches into the current layout, every row accounted for.

Contract:

* Sources are read-only (:mod:`store.legacy.readonly`); they are never changed.
* Each source needs a descriptor, which this module never guesses: a
  :data:`Resolver` (``inference.legacy`` maps legacy descriptors with the live
  rules, or applies the user's ``--descriptor``) returns an
  :class:`Attribution`. Without one, every row of the source is skipped with
  the resolver's reason. The task comes from the legacy tree, else from
  ``ImportOptions.task``, else the source is skipped.
* Every row is converted to a record whose key is recomputed under
  judgestore's rule from the stored input, after the legacy hash is verified:
  S3 onwards hashed the same canonical bytes (``input_hash(input_text)`` must
  equal the stored hash); S2 hashed the JSON-quoted canonical string of
  ``{"kind": "chat"|"raw", ..}``. Every hash goes through
  :mod:`store.descriptor`. A row whose stored hash does not match its input
  fails; the rest go on.
* Values are normalised: ``pushed_by``/``pushed_at`` become
  ``created_by``/``created_at`` (ISO-8601; no offset means UTC; a format
  with no time at all gets the source file's modification time);
  orientation ``forward``/``swapped`` become ``direct``/``reversed``;
  ``single`` (and an empty ``model_b``) means pointwise: ``model_b`` and
  ``orientation`` NULL; ``top_logprobs`` (``{decoded token: logprob}``) is
  stored in the lossless shape of :mod:`store.logprobs` (candidates without
  token ids, no sampled token: what the old file knew) and ``usage_json`` as
  it is, both with NaN and infinities kept; ``sample_index`` is 0; a row without a model/judge label gets
  the descriptor's model. Empty outputs are skipped (judgestore never stores
  one; a live run regenerates it).
* Writes go in chunks, one ``BEGIN IMMEDIATE`` transaction each: the chunk's
  keys are looked up, new rows inserted (``INSERT .. ON CONFLICT DO
  NOTHING``), rows already there with the same output counted as already
  present, and rows already there with a different output reported as
  conflicts (the stored row is kept: local rows win). A killed import leaves
  whole chunks only, and a rerun imports exactly what is missing.
* ``dry_run`` opens the store read-only and writes nothing anywhere; it counts
  what a real run would (keys seen earlier in the same dry run included).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from store.descriptor import ModelDescriptor, input_hash, render_messages, render_text, sha256_hex
from store.errors import DataFrameError, InvalidInputError, JudgestoreError
from store.layout import Location, Role
from store.legacy.detect import Detection, LegacyVariant, State
from store.legacy.formats import InputForm, LegacyRow, count_rows, iter_rows
from store.legacy.inputs import InputsTable
from store.legacy.metadata import check_metadata_folder
from store.legacy.report import ImportReport, SourceReport
from store.logprobs import from_text_logprobs
from store.records import CompletionRecord, JudgementRecord, Record, parse_timestamp
from store.store import Database, Store

DEFAULT_CHUNK_SIZE = 1000
NEEDS_INPUTS = frozenset(
    {LegacyVariant.S1C, LegacyVariant.DF_COMPLETIONS, LegacyVariant.DF_MT_BENCH, LegacyVariant.DF_ELO_JUDGE}
)
RAW_PROMPT_VARIANTS = frozenset({LegacyVariant.S0, LegacyVariant.S1J})
LANGCHAIN_REASON = (
    "LangChain SQLiteCache: its `llm` string does not identify the vLLM model or its settings and its prompts "
    "are LangChain's serialisation, so it is never imported (rerun those prompts with `judgestore generate`)"
)
_ORIENTATIONS: dict[str | None, str | None] = {
    None: None,
    "": None,
    "direct": "direct",
    "reversed": "reversed",
    "forward": "direct",
    "swapped": "reversed",
    "single": None,
}
_EMPTY_OUTPUT = "empty or NULL output (judgestore never stores an empty output; a live run regenerates it)"


@dataclass(frozen=True, slots=True)
class Attribution:
    """The descriptor a source's rows are imported under, or why there is none."""

    descriptor: ModelDescriptor | None
    assumptions: tuple[str, ...] = ()  # recorded in metadata.json when the descriptor folder is created
    reason: str = ""  # why ``descriptor`` is None
    failed: bool = False  # None because the source is bad (a failure), not because something was not given (a skip)
    notes: tuple[str, ...] = ()


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


class _RowOutcome(Exception):
    """A row that is not imported: ``kind`` is skip or fail."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _fail(reason: str) -> _RowOutcome:
    return _RowOutcome("fail", reason)


def _skip(reason: str) -> _RowOutcome:
    return _RowOutcome("skip", reason)


# ---------------------------------------------------------------- row conversion


def s2_input_hash(canonical: str) -> str:
    """The S2 content address: SHA-256 of the canonical string written as a JSON string."""
    return sha256_hex(json.dumps(canonical, ensure_ascii=False).encode())


def _render_rendered(payload: Any, mode: str) -> str:
    """An S3-onwards rendered input, re-rendered under judgestore's rule."""
    if not isinstance(payload, dict):
        raise _fail("input_text is not a JSON object")
    kind = payload.get("type")
    expected = {"messages": {"type", "messages"}, "text": {"type", "text"}}.get(str(kind))
    if expected is None:
        raise _fail(f"unknown rendered input type {kind!r} (expected 'messages' or 'text')")
    if set(payload) != expected:
        raise _fail(f"rendered input has unexpected keys {sorted(set(payload) - expected)}")
    if kind == "messages":
        return _render_chat(payload["messages"], mode)
    return _render_plain(payload["text"], mode)


def _render_s2(payload: Any, mode: str) -> str:
    if not isinstance(payload, dict) or payload.get("kind") not in ("chat", "raw"):
        raise _fail("S2 input is not {'kind': 'chat'|'raw', ...}")
    if payload["kind"] == "chat":
        return _render_chat(payload.get("messages"), mode)
    return _render_plain(payload.get("text"), mode)


def _render_chat(messages: Any, mode: str) -> str:
    if mode != "chat":
        raise _skip("a chat input under a text-mode descriptor (a live run could never ask for it)")
    try:
        return render_messages(messages)
    except InvalidInputError as e:
        raise _fail(f"input messages cannot be rendered: {e}") from e


def _render_plain(text: Any, mode: str) -> str:
    if mode != "text":
        raise _skip("a text input under a chat-mode descriptor (a live run could never ask for it)")
    try:
        return render_text(text)
    except InvalidInputError as e:
        raise _fail(f"input text cannot be rendered: {e}") from e


def _render_raw(text: str, mode: str) -> str:
    """A plain legacy prompt: a rendered input if it already is one, else one user message (or the text)."""
    if text.startswith("{"):
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            payload = None
        if isinstance(payload, dict) and payload.get("type") in ("messages", "text"):
            return _render_rendered(payload, mode)
    if mode == "chat":
        return _render_chat([{"role": "user", "content": text}], mode)
    return _render_plain(text, mode)


def _rendered_input(row: LegacyRow, mode: str) -> str:
    if row.input_form is InputForm.GIVEN:
        entry = row.given
        if entry is None:
            raise _skip(row.skip or "no input")
        if entry.text is not None and row.given_turn == 0:
            return _render_plain(entry.text, mode)
        try:
            messages = entry.messages_for_turn(row.given_turn, row.previous_answer)
        except InvalidInputError as e:
            raise _skip(str(e)) from e
        return _render_chat(messages, mode)
    if row.input_text is None:
        raise _skip("no input stored (NULL)") if row.input_form is InputForm.RAW else _fail("input is NULL")
    if row.input_form is InputForm.RAW:
        return _render_raw(row.input_text, mode)
    if row.stored_hash is None:
        raise _fail("input_hash is NULL")
    if row.input_form is InputForm.RENDERED:
        if input_hash(row.input_text) != row.stored_hash:  # S3 onwards hashed exactly as judgestore does
            raise _fail("stored input_hash does not match its input (the row was edited or damaged)")
        parse = _render_rendered
    else:
        if s2_input_hash(row.input_text) != row.stored_hash:
            raise _fail("stored input_hash does not match its input under the S2 rule (edited or damaged)")
        parse = _render_s2
    try:
        payload = orjson.loads(row.input_text)
    except orjson.JSONDecodeError as e:
        raise _fail(f"stored input is not JSON ({e})") from e
    return parse(payload, mode)


def created_at(value: str | None, fallback: datetime) -> datetime:
    """A row's ``pushed_at``/``date`` as an aware UTC datetime (no offset means UTC); None or empty: ``fallback``.

    A value that is not ISO-8601 fails the row, not the import.
    """
    if value is None or not value.strip():
        return fallback
    try:
        parsed = parse_timestamp(value)
    except InvalidInputError as e:
        raise _fail(f"time {value!r} is not ISO-8601") from e
    return parsed.astimezone(UTC)


def _json_object(value: str | None, column: str) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError:
        try:  # Python's json.dumps wrote NaN and infinities as NaN / -Infinity, which strict JSON (orjson) refuses
            decoded = json.loads(value)
        except ValueError as e:
            raise _fail(f"{column} is not valid JSON ({e})") from e
    if decoded is None:
        return None
    if not isinstance(decoded, dict):
        raise _fail(f"{column} is not a JSON object")
    return decoded


def _top_logprobs(value: str | None) -> dict[str, Any] | None:
    """Legacy ``{decoded token: logprob}`` in the lossless shape (candidates without ids; no sampled token)."""
    decoded = _json_object(value, "top_logprobs")
    if decoded is None:
        return None
    try:
        return from_text_logprobs(decoded)
    except InvalidInputError as e:
        raise _fail(str(e)) from e


def to_record(row: LegacyRow, descriptor: ModelDescriptor, fallback_time: datetime) -> Record:
    """The record of ``row`` under ``descriptor``; raises :class:`_RowOutcome` for a row that is not imported."""
    if row.problem is not None:
        raise _fail(row.problem)
    if not row.completion:
        raise _skip(_EMPTY_OUTPUT)
    rendered = _rendered_input(row, descriptor.input_mode)
    usage = row.usage
    if row.usage_json is not None:
        usage = _json_object(row.usage_json, "usage_json")
    common: dict[str, Any] = {
        "input_hash": input_hash(rendered),
        "sample_index": 0,
        "input_text": rendered,
        "completion": row.completion,
        "benchmark": row.benchmark,
        "instruction_id": row.instruction_id,
        "usage": usage,
        "top_logprobs": _top_logprobs(row.top_logprobs),
        "run_id": row.run_id,
        "created_by": row.created_by,
        "created_at": created_at(row.created_at, fallback_time),
    }
    if row.role == "completions":
        return CompletionRecord(model=row.model or descriptor.model, **common)
    if row.orientation not in _ORIENTATIONS:
        raise _fail(f"unknown orientation {row.orientation!r} (known: direct, reversed, forward, swapped, single)")
    pointwise = row.orientation == "single" or not row.model_b
    return JudgementRecord(
        model_a=row.model_a,
        model_b=None if pointwise else row.model_b,
        judge=row.judge or descriptor.model,
        orientation=None if pointwise else _ORIENTATIONS[row.orientation],  # type: ignore[arg-type]
        **common,
    )


# ---------------------------------------------------------------- writing


def _preview(text: str) -> str:
    digest = sha256_hex(text.encode())[:12]
    shown = text if len(text) <= 40 else text[:39] + "…"
    return f"{shown!r} (sha256 {digest})"


@dataclass
class _Target:
    """One destination database and, in a dry run, the keys this run would already have written."""

    location: Location
    database: Database | None
    dry_run: bool
    seen: dict[str, str] = field(default_factory=dict)  # dry run: key -> completion
    pending: list[tuple[Record, str]] = field(default_factory=list)


class _Importer:
    def __init__(
        self,
        store: Store,
        resolver: Resolver,
        options: ImportOptions,
        on_progress: Callable[[ImportProgress], None] | None,
    ) -> None:
        self.store = store
        self.resolver = resolver
        self.options = options
        self.on_progress = on_progress
        self.targets: dict[tuple[str, str, str], _Target] = {}

    # ------------------------------------------------------------ one source

    def source(self, detection: Detection, index: int, total_sources: int) -> SourceReport:
        report = SourceReport(detection.path, detection.variant, detection.state.value)
        if not self._importable(detection, report):
            return report
        task = detection.tree.task if detection.tree is not None else self.options.task
        try:
            rows_total = count_rows(detection)
        except (OSError, DataFrameError, sqlite3.DatabaseError) as e:
            report.source_failed = True
            report.error = f"cannot be read: {e}"
            report.fail(report.error, count=report.rows)
            return report
        report.rows = rows_total
        if task is None:
            return self._skip_all(report, "no task: this file lies outside a legacy tree; pass --task NAME")
        if detection.variant in NEEDS_INPUTS and self.options.inputs is None:
            why = "holds no inputs (only outputs keyed by position): pass --inputs FILE naming each input"
            return self._skip_all(report, f"{detection.variant} {why}")
        attribution = self.resolver(detection)
        report.notes.extend(attribution.notes)
        if attribution.descriptor is None:
            if attribution.failed:
                report.source_failed = True
                report.error = attribution.reason
                report.fail(attribution.reason, count=rows_total)
                return report
            return self._skip_all(report, attribution.reason)
        descriptor = attribution.descriptor
        assumptions = list(attribution.assumptions)
        if detection.variant in RAW_PROMPT_VARIANTS:
            shape = "one user message" if descriptor.input_mode == "chat" else "a text prompt"
            assumptions.append(f"{detection.variant} rows stored their judge prompt as plain text; imported as {shape}")
        report.assumptions = assumptions
        self._rows(detection, report, task, descriptor, tuple(assumptions), index, total_sources)
        return report

    def _importable(self, detection: Detection, report: SourceReport) -> bool:
        report.rows = detection.rows or 0
        if detection.state in (State.CORRUPT, State.INVALID):
            report.source_failed = True
            report.error = detection.detail
            report.fail(detection.detail, count=report.rows)
            return False
        if detection.state is not State.OK or detection.kind == "metadata":
            report.error = detection.detail
            report.skip(detection.detail, count=report.rows)
            return False
        if detection.variant is LegacyVariant.LANGCHAIN:
            report.error = LANGCHAIN_REASON
            report.skip(LANGCHAIN_REASON, count=report.rows)
            report.unattributed = report.rows
            return False
        if detection.metadata is not None:
            problem = check_metadata_folder(detection.metadata, detection.tree)
            if problem is not None:
                report.source_failed = True
                report.error = problem
                report.fail(problem, count=report.rows)
                return False
        return True

    def _skip_all(self, report: SourceReport, reason: str) -> SourceReport:
        """Skip a whole source that no descriptor could be named for (the import does not succeed)."""
        report.error = reason
        report.skip(reason, count=report.rows)
        report.unattributed = report.rows
        return report

    def _rows(
        self,
        detection: Detection,
        report: SourceReport,
        task: str,
        descriptor: ModelDescriptor,
        assumptions: tuple[str, ...],
        index: int,
        total_sources: int,
    ) -> None:
        fallback = datetime.fromtimestamp(detection.path.stat().st_mtime, UTC)
        done = 0
        try:
            for row in iter_rows(detection, self.options.inputs, fallback_time=fallback.isoformat()):
                done += 1
                for message in row.notes:
                    report.note(message)
                try:
                    record = to_record(row, descriptor, fallback)
                except _RowOutcome as outcome:
                    (report.fail if outcome.kind == "fail" else report.skip)(outcome.reason, row.locator)
                else:
                    if row.stored_hash is not None and record.input_hash != row.stored_hash:
                        report.rekeyed += 1
                    target = self._target(row.role, task, descriptor, assumptions, report)
                    target.pending.append((record, row.locator))
                    if len(target.pending) >= self.options.chunk_size:
                        self._flush(target, report)
                if done % self.options.chunk_size == 0:
                    self._progress(detection.path, index, total_sources, done, report.rows)
        except (OSError, DataFrameError, JudgestoreError, sqlite3.DatabaseError) as e:
            self._flush_all(report)
            report.source_failed = True
            report.error = f"stopped after {done} rows: {e}"
            # Every row without an outcome yet (the one being handled, and those never read) failed.
            report.fail(f"not imported: {e}", count=max(report.rows - report.accounted(), 0))
            return
        self._flush_all(report)
        if done != report.rows:  # a file that changed while it was read
            report.note(f"expected {report.rows} rows and read {done}")
            report.rows = done
        self._progress(detection.path, index, total_sources, done, report.rows)

    def _progress(self, path: Path, index: int, sources: int, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(ImportProgress(path, index, sources, done, total))

    # ------------------------------------------------------------ targets and chunks

    def _target(
        self, role: Role, task: str, descriptor: ModelDescriptor, assumptions: tuple[str, ...], report: SourceReport
    ) -> _Target:
        key = (role, task, descriptor.sha256())
        target = self.targets.get(key)
        if target is None:
            location = Location.of(role, task, descriptor)
            if self.options.dry_run:
                database = self.store.find(role, task, descriptor)
            else:
                database = self.store.database(role, task, descriptor, assumptions=assumptions)
            target = _Target(location, database, self.options.dry_run)
            self.targets[key] = target
        where = str(target.location.relative_folder())
        if where not in report.targets:
            report.targets.append(where)
        return target

    def _flush_all(self, report: SourceReport) -> None:
        for target in self.targets.values():
            self._flush(target, report)

    def _flush(self, target: _Target, report: SourceReport) -> None:
        batch, target.pending = target.pending, []
        if not batch:
            return
        keys = [record.input_hash for record, _ in batch]
        try:
            if target.dry_run:
                outcomes = self._outcomes_dry(target, batch, keys)
            else:
                outcomes = self._outcomes_written(target, batch, keys)
        except JudgestoreError as e:
            report.source_failed = True
            report.error = f"{target.location.relative_folder()}: {e}"
            report.fail(f"not written: {e}", count=len(batch))
            return
        for (record, locator), (outcome, kept) in zip(batch, outcomes, strict=True):
            if outcome == "imported":
                report.imported += 1
            elif outcome == "present":
                report.already_present += 1
            else:
                assert kept is not None
                report.conflict(record.input_hash, locator, _preview(kept), _preview(record.completion))

    def _outcomes_written(
        self, target: _Target, batch: list[tuple[Record, str]], keys: list[str]
    ) -> list[tuple[str, str | None]]:
        assert target.database is not None
        with target.database.transaction() as repo:
            existing = {key: record.completion for key, record in repo.get_many(keys).items()}
            outcomes, new = _classify(batch, existing)
            written = repo.put_many(new, "ignore")
        if written != len(new):  # cannot happen under the write lock; say so rather than miscount
            raise JudgestoreError(f"expected to insert {len(new)} rows, inserted {written}")
        return outcomes

    def _outcomes_dry(
        self, target: _Target, batch: list[tuple[Record, str]], keys: list[str]
    ) -> list[tuple[str, str | None]]:
        stored: dict[str, str] = {}
        if target.database is not None:
            stored = {key: record.completion for key, record in target.database.get_many(keys).items()}
        existing = {**stored, **{k: target.seen[k] for k in keys if k in target.seen}}
        outcomes, new = _classify(batch, existing)
        target.seen.update((record.input_hash, record.completion) for record in new)
        return outcomes


def _classify(
    batch: list[tuple[Record, str]], existing: dict[str, str]
) -> tuple[list[tuple[str, str | None]], list[Record]]:
    """Per row: imported (new), present (same output stored) or conflict (another output stored, kept)."""
    outcomes: list[tuple[str, str | None]] = []
    new: list[Record] = []
    for record, _ in batch:
        kept = existing.get(record.input_hash)
        if kept is None:
            existing[record.input_hash] = record.completion
            new.append(record)
            outcomes.append(("imported", None))
        elif kept == record.completion:
            outcomes.append(("present", None))
        else:
            outcomes.append(("conflict", kept))
    return outcomes, new


def import_sources(
    detections: Sequence[Detection] | Iterable[Detection],
    store: Store,
    resolver: Resolver,
    options: ImportOptions | None = None,
    *,
    on_progress: Callable[[ImportProgress], None] | None = None,
    ignored_files: int = 0,
) -> ImportReport:
    """Import every detection into ``store`` (read-only for a dry run); see the module docstring."""
    options = options or ImportOptions()
    if options.chunk_size < 1:
        raise InvalidInputError(f"chunk_size must be >= 1, got {options.chunk_size}")
    if options.dry_run and not store.readonly:
        raise InvalidInputError("a dry run needs a read-only store: Store(..., readonly=True)")
    detections = list(detections)
    importer = _Importer(store, resolver, options, on_progress)
    report = ImportReport(store.root, options.dry_run, ignored_files=ignored_files)
    for index, detection in enumerate(detections):
        report.sources.append(importer.source(detection, index, len(detections)))
    return report
