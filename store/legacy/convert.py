"""One legacy row becomes one judgestore record: its input re-rendered and rehashed, its values normalised.

Contract:

* :func:`to_record` returns the :class:`~store.tables.records.Record` of a
  :class:`~store.legacy.formats.LegacyRow` under a descriptor, or raises
  :class:`RowNotImported` (``skip`` or ``fail``, with the reason) for a row
  that is not imported; it never touches a database.
* The key is recomputed under judgestore's rule from the stored input, after
  the legacy hash is verified: S3 onwards hashed the same canonical bytes
  (``input_hash(input_text)`` must equal the stored hash); S2 hashed the
  JSON-quoted canonical string of ``{"kind": "chat"|"raw", ..}``
  (:func:`s2_input_hash`). Every hash goes through :mod:`store.descriptor`.
  A row whose stored hash does not match its input fails. An input whose
  shape the descriptor's input mode could never ask for (a chat under a
  text-mode descriptor, say) is skipped.
* Values are normalised: ``pushed_by``/``pushed_at`` become
  ``created_by``/``created_at`` (ISO-8601, parsed by
  :func:`store.tables.filters.parse_timestamp`; no offset means UTC; a format with
  no time at all gets the fallback, the source file's modification time);
  orientation ``forward``/``swapped`` become ``direct``/``reversed``;
  ``single`` (and an empty ``model_b``) means pointwise: ``model_b`` and
  ``orientation`` NULL (``single`` beside a ``model_b`` fails the row: one of
  the two is wrong, and neither is dropped silently); ``top_logprobs`` (``{decoded token: logprob}``) is
  stored in the lossless shape of :mod:`store.logprobs` (candidates without
  token ids, no sampled token: what the old file knew) and ``usage_json`` as
  it is, both with NaN and infinities kept; ``sample_index`` is 0; a row
  without a model/judge label gets the descriptor's model. Empty outputs are
  skipped: legacy caches wrote one for a failed call too, so it may not be
  an answer (a live run stores a genuine empty answer, and regenerates this one).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from store import jsonvalues
from store.descriptor import InputMode, ModelDescriptor, input_hash, render_messages, render_text, sha256_hex
from store.errors import InvalidInputError, RowValueError
from store.legacy.formats import InputForm, LegacyRow
from store.logprobs import from_text_logprobs
from store.tables.filters import parse_timestamp
from store.tables.models import Orientation
from store.tables.records import CompletionRecord, JudgementRecord, Record
from store.tables.row_checks import check_values

_ORIENTATIONS: dict[str | None, Orientation | None] = {
    None: None,
    "": None,
    "direct": "direct",
    "reversed": "reversed",
    "forward": "direct",
    "swapped": "reversed",
    "single": None,
}
# Legacy caches wrote "" (or NULL) for a failed call as well as for an empty answer and cannot tell which:
# such a row is not imported, and a live run, which does store a genuine empty answer, generates it again.
_EMPTY_OUTPUT = "empty or NULL output (legacy caches wrote one for a failed call too; a live run regenerates it)"


class RowNotImported(Exception):
    """A row that is not imported, and why: ``kind`` ``skip`` (something was not given) or ``fail`` (it is bad)."""

    def __init__(self, kind: Literal["skip", "fail"], reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _fail(reason: str) -> RowNotImported:
    return RowNotImported("fail", reason)


def _skip(reason: str) -> RowNotImported:
    return RowNotImported("skip", reason)


def s2_input_hash(canonical: str) -> str:
    """The S2 content address: SHA-256 of the canonical string written as a JSON string."""
    return sha256_hex(json.dumps(canonical, ensure_ascii=False).encode())


def _render_rendered(payload: Any, mode: InputMode) -> str:
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
        return _render("chat", payload["messages"], mode)
    return _render("text", payload["text"], mode)


def _render_s2(payload: Any, mode: InputMode) -> str:
    if not isinstance(payload, dict) or payload.get("kind") not in ("chat", "raw"):
        raise _fail("S2 input is not {'kind': 'chat'|'raw', ...}")
    if payload["kind"] == "chat":
        return _render("chat", payload.get("messages"), mode)
    return _render("text", payload.get("text"), mode)


def _render(kind: InputMode, value: Any, mode: InputMode) -> str:
    """``value`` (chat messages or a text prompt) rendered; an input the mode never asks for is skipped."""
    if mode != kind:
        raise _skip(f"a {kind} input under a {mode}-mode descriptor (a live run could never ask for it)")
    try:
        return render_messages(value) if kind == "chat" else render_text(value)
    except InvalidInputError as e:
        raise _fail(f"input {'messages' if kind == 'chat' else 'text'} cannot be rendered: {e}") from e


def _render_raw(text: str, mode: InputMode) -> str:
    """A plain legacy prompt: a rendered input if it already is one, else one user message (or the text)."""
    if text.startswith("{"):
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            payload = None
        if isinstance(payload, dict) and payload.get("type") in ("messages", "text"):
            return _render_rendered(payload, mode)
    if mode == "chat":
        return _render("chat", [{"role": "user", "content": text}], mode)
    return _render("text", text, mode)


def _rendered_input(row: LegacyRow, mode: InputMode) -> str:
    if row.input_form is InputForm.GIVEN:
        entry = row.given
        if entry is None:
            raise _skip(row.skip or "no input")
        if entry.text is not None and row.given_turn == 0:
            return _render("text", entry.text, mode)
        try:
            messages = entry.messages_for_turn(row.given_turn, row.previous_answer)
        except InvalidInputError as e:
            raise _skip(str(e)) from e
        return _render("chat", messages, mode)
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


def parse_created_at(value: str | None, fallback: datetime) -> datetime:
    """A row's ``pushed_at``/``date`` as an aware UTC datetime (no offset means UTC); None or empty: ``fallback``.

    A value that is not ISO-8601, or lies beyond the years 1 to 9999 once in UTC, fails the row, not the import.
    """
    if value is None or not value.strip():
        return fallback
    try:
        parsed = parse_timestamp(value)
    except InvalidInputError as e:
        # An OverflowError: valid ISO-8601 whose offset takes the calendar's last (first) day beyond it in UTC.
        beyond = isinstance(e.__cause__, OverflowError)
        raise _fail(f"time {value!r} {'is outside the years 1 to 9999 in UTC' if beyond else 'is not ISO-8601'}") from e
    return parsed.astimezone(UTC)


def _json_object(value: str | None, column: str) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    # The standard library's reader: Python's json.dumps wrote NaN and infinities as NaN / -Infinity, which
    # strict JSON (orjson) refuses, and orjson reads an integer past 64 bits as a float; this one keeps it
    # exact, for the row checks to refuse (to_record).
    try:
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
    """The record of ``row`` under ``descriptor``; raises :class:`RowNotImported` for a row that is not imported."""
    if row.problem is not None:
        raise _fail(row.problem)
    if not row.completion:
        raise _skip(_EMPTY_OUTPUT)
    if row.skip is not None:  # something the user did not give: the input, or an ELO row's evaluated model
        raise _skip(row.skip)
    rendered = _rendered_input(row, descriptor.input_mode)
    top_logprobs = _top_logprobs(row.top_logprobs)
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
        "top_logprobs": top_logprobs,
        "run_id": row.run_id,
        "created_by": row.created_by,
        "created_at": parse_created_at(row.created_at, fallback_time),
    }
    record: Record
    if row.role == "completions":
        record = CompletionRecord(model=row.model or descriptor.model, **common)
    else:
        if row.orientation not in _ORIENTATIONS:
            raise _fail(f"unknown orientation {row.orientation!r} (known: direct, reversed, forward, swapped, single)")
        blank_b = not (row.model_b or "").strip()  # none, as a live request reads it (was: a model named "  ")
        if row.orientation == "single" and not blank_b:  # which is wrong, the orientation or the second model?
            raise _fail(f"orientation 'single' (pointwise) but model_b {row.model_b!r}: one of them is wrong")
        if row.model_a is not None and not row.model_a.strip():  # no live run writes one; None stays allowed
            raise _fail(f"model_a is blank ({row.model_a!r}): name the model whose answer was shown first")
        pointwise = row.orientation == "single" or blank_b
        record = JudgementRecord(
            model_a=row.model_a,
            model_b=None if pointwise else row.model_b,
            judge=row.judge or descriptor.model,
            orientation=None if pointwise else _ORIENTATIONS[row.orientation],
            **common,
        )
    # What the store would refuse fails this row alone (a dry run says so too), not its whole write chunk.
    try:
        check_values(row.role, record)
    except RowValueError as e:  # in the same words for every such row (the report counts reasons), its row aside
        raise _fail(f"{e.column} {e.rule}") from e
    for name in ("usage", "top_logprobs"):  # what the JSON columns' serializer refuses
        try:
            jsonvalues.dumps(getattr(record, name))
        except (TypeError, ValueError) as e:
            raise _fail(f"{name} cannot be stored ({e})") from e
    if top_logprobs is None and (asked := descriptor.sampling.logprobs) is not None:
        # A hit is served as stored: a run asking for logprobs was served this row without any (was), a row that
        # adopt refuses for the same reason. Last: a row that fails for what it holds says so, not that it was skipped
        raise _skip(f"no top_logprobs, where the descriptor asks for {asked} per position: a run would be served "
                    "it without them (a live run generates it)")  # fmt: skip
    return record
