"""Row readers for every legacy variant: one :class:`LegacyRow` per cached output, nothing decided yet.

Contract:

* :func:`iter_rows` streams the rows of one detected source in a stable order
  (``rowid`` for SQLite, file order for DataFrames), read-only
  (:mod:`store.legacy.readonly`). It only *reads*: hashes are verified, inputs
  rendered and values normalised by :mod:`store.legacy.convert`.
* Each row says how its input was stored (:class:`InputForm`): ``rendered``
  (S3 onwards: judgestore's own canonical rendered input, whose SHA-256 is the
  stored ``input_hash``), ``s2`` (``{"kind": "chat"|"raw", ..}``, hashed
  JSON-quoted), ``raw`` (a plain prompt: S0 and S1j ``judge_input``) or
  ``given`` (taken from the user's inputs file: S1c and the DataFrame caches).
* A value that is not UTF-8 text comes back with ``problem`` set, so that
  row fails alone.
* Column names are mapped onto judgestore's: ``judge_input`` -> input,
  ``judge_completion``/``judge_output``/``output_text`` -> completion,
  ``model_A``/``model_B`` -> ``model_a``/``model_b``, ``instruction_index``
  -> ``instruction_id``.
* Rows whose input was never stored take it from the user's inputs file
  (:mod:`store.legacy.inputs`), by ``instruction_index`` (S1c, DataFrame
  completions, MT-Bench: one row per turn) or by row position (ELO judge
  caches); a row with no entry there is returned with ``skip`` set.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from store.errors import InvalidInputError
from store.legacy.detect import Detection, LegacyVariant
from store.legacy.inputs import InputEntry, InputsTable, normalise_key
from store.legacy.readonly import open_dataframe, open_sqlite_readonly
from store.roles import Role


class InputForm(enum.StrEnum):
    RENDERED = "rendered"
    S2 = "s2"
    RAW = "raw"
    GIVEN = "given"


@dataclass(slots=True)
class LegacyRow:
    """One cached output as the legacy file holds it."""

    locator: str  # for messages: "row 12 (input_hash 3f2a...)"
    role: Role
    input_form: InputForm
    completion: str | None = None
    input_text: str | None = None  # rendered / s2 / raw forms
    stored_hash: str | None = None
    given: InputEntry | None = None  # the given form
    given_turn: int = 0  # MT-Bench: which turn of ``given`` (0-based) this row answers
    previous_answer: str | None = None  # MT-Bench turn 2: the cached turn-1 answer
    benchmark: str | None = None
    instruction_id: str | None = None
    model: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    judge: str | None = None
    orientation: str | None = None
    top_logprobs: str | None = None
    usage_json: str | None = None
    usage: dict[str, Any] | None = None
    created_by: str | None = None
    created_at: str | None = None
    run_id: str | None = None
    problem: str | None = None  # the row cannot be read: it fails
    skip: str | None = None  # the row cannot be imported without something the user did not give: it is skipped
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- SQLite rows


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError: the caller fails this row
    return value


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _answer(value: Any, column: str) -> tuple[str | None, str | None]:
    """A DataFrame's answer cell as text, and the problem that fails its row: a binary column (pyarrow's
    ``binary``) holds UTF-8 bytes, stored as the text they are (was: ``"b'...'"``), or bytes that are no text."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, f"{column} holds bytes that are not UTF-8 text"
    return _text_or_none(value), None


def _flag(value: Any) -> bool | None:
    """A boolean column as pandas read it (a bool, 0/1, or its text); None when missing or unreadable."""
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if isinstance(value, bool | int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


def _select(conn: sqlite3.Connection, table: str, columns: list[str], present: set[str]) -> Iterator[dict[str, Any]]:
    """Rows as dicts of the wanted columns (absent ones are None), in rowid order; bad UTF-8 flagged."""
    chosen = [c for c in columns if c in present]
    sql = f'SELECT rowid, {", ".join(f"{_quoted(c)}" for c in chosen)} FROM "{table}" ORDER BY rowid'
    for raw in conn.execute(sql):
        row: dict[str, Any] = dict.fromkeys(columns)
        row["rowid"] = raw[0]
        for name, value in zip(chosen, raw[1:], strict=True):
            try:
                row[name] = _decode(value)
            except UnicodeDecodeError:
                row["__problem__"] = f"column {name} is not valid UTF-8 text"
                row[name] = None
        yield row


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def _provenance(r: dict[str, Any]) -> dict[str, Any]:
    """The row's ``pushed_by``/``pushed_at``/``run_id`` under judgestore's names, and its read problem."""
    return {
        "created_by": _text_or_none(r["pushed_by"]),
        "created_at": _text_or_none(r["pushed_at"]),
        "run_id": _text_or_none(r["run_id"]),
        "problem": r.get("__problem__"),
    }


def _given(
    inputs: InputsTable | None, kind: Literal["instruction_index", "row"], key: str
) -> tuple[InputEntry | None, str | None]:
    """The inputs-file entry for ``key``, and why the row is skipped when there is none."""
    if inputs is None:
        return None, "no input stored and no inputs file given (--inputs)"
    entry = (inputs.by_index if kind == "instruction_index" else inputs.by_row).get(key)
    # one reason for every such row (the report lists example rows under it), not one per key
    return entry, None if entry else f"no input for its {kind} in {inputs.path.name}"


def _hash_locator(rowid: int, stored_hash: Any) -> str:
    shown = f" (input_hash {str(stored_hash)[:16]})" if stored_hash else ""
    return f"row {rowid}{shown}"


_S3_COMPLETION_COLUMNS = ["input_hash", "input_text", "completion", "benchmark", "instruction_id", "model",
                          "pushed_by", "pushed_at", "run_id", "usage_json"]  # fmt: skip
_S3_JUDGEMENT_COLUMNS = ["input_hash", "judge_input", "judge_completion", "benchmark", "instruction_id", "model_a",
                         "model_b", "judge", "top_logprobs", "orientation", "pushed_by", "pushed_at", "run_id",
                         "usage_json"]  # fmt: skip


def _content_hashed_rows(conn: sqlite3.Connection, detection: Detection) -> Iterator[LegacyRow]:
    """S3c ... S7j: the rendered input and its SHA-256, as judgestore hashes it."""
    present = set(detection.columns)
    judgements = detection.role == "judgements"
    columns = _S3_JUDGEMENT_COLUMNS if judgements else _S3_COMPLETION_COLUMNS
    assert detection.table is not None and detection.role is not None
    for r in _select(conn, detection.table, columns, present):
        yield LegacyRow(
            locator=_hash_locator(r["rowid"], r["input_hash"]),
            role=detection.role,
            input_form=InputForm.RENDERED,
            input_text=r["judge_input"] if judgements else r["input_text"],
            stored_hash=_text_or_none(r["input_hash"]),
            completion=r["judge_completion"] if judgements else r["completion"],
            benchmark=_text_or_none(r["benchmark"]),
            instruction_id=_text_or_none(r["instruction_id"]),
            model=None if judgements else _text_or_none(r["model"]),
            model_a=_text_or_none(r.get("model_a")),
            model_b=_text_or_none(r.get("model_b")),
            judge=_text_or_none(r.get("judge")),
            orientation=_text_or_none(r.get("orientation")),
            top_logprobs=r.get("top_logprobs"),
            usage_json=r["usage_json"],
            **_provenance(r),
        )


_S0_COLUMNS = ["benchmark", "instruction_id", "model_a", "model_b", "judge", "judge_input", "judge_completion",
               "reasoning_content", "input_tokens", "output_tokens", "reasoning_tokens", "date"]  # fmt: skip


def _s0_rows(conn: sqlite3.Connection, detection: Detection) -> Iterator[LegacyRow]:
    """S0 annotations: a plain judge prompt, token counts and reasoning text, no hash."""
    for r in _select(conn, "annotations", _S0_COLUMNS, set(detection.columns)):
        usage: dict[str, Any] = {}
        problem = r.get("__problem__")
        for legacy, ours in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens"),
                             ("reasoning_tokens", "reasoning_tokens")):  # fmt: skip
            count = r[legacy]
            if not count:  # 0 is the column default: "not recorded"
                continue
            if type(count) is not int or count < 0:  # stats would add it up (a text dropped, a negative subtracted)
                problem = problem or f"column {legacy} is not a count of tokens: {count!r:.40}"
            usage[ours] = count
        if r["reasoning_content"]:
            # judgestore has no reasoning column; the text travels in the usage JSON so that nothing is lost.
            usage["reasoning_content"] = r["reasoning_content"]
        where = f"{r['benchmark']}/{r['instruction_id']}, {r['model_a']} vs {r['model_b']}"
        yield LegacyRow(
            locator=f"row {r['rowid']} ({where})",
            role="judgements",
            input_form=InputForm.RAW,
            input_text=r["judge_input"],
            completion=r["judge_completion"],
            benchmark=_text_or_none(r["benchmark"]),
            instruction_id=_text_or_none(r["instruction_id"]),
            model_a=_text_or_none(r["model_a"]),
            model_b=_text_or_none(r["model_b"]),
            judge=_text_or_none(r["judge"]),
            usage=usage or None,
            created_at=_text_or_none(r["date"]),
            problem=problem,
        )


def _s1_rows(conn: sqlite3.Connection, detection: Detection, inputs: InputsTable | None) -> Iterator[LegacyRow]:
    """S1: rows keyed by instruction_index; completions carry no input at all."""
    present = set(detection.columns)
    if detection.role == "completions":
        for r in _select(conn, "completions", ["instruction_index", "completion", "pushed_by", "pushed_at",
                                               "run_id"], present):  # fmt: skip
            key = normalise_key(r["instruction_index"])
            entry, skip = _given(inputs, "instruction_index", key)
            yield LegacyRow(
                locator=f"row {r['rowid']} (instruction_index {key})",
                role="completions",
                input_form=InputForm.GIVEN,
                given=entry,
                completion=r["completion"],
                instruction_id=(entry.instruction_id if entry and entry.instruction_id else key),
                benchmark=entry.benchmark if entry else None,
                skip=skip,
                **_provenance(r),
            )
        return
    columns = ["instruction_index", "model_A", "model_B", "judge_input", "judge_output", "pushed_by", "pushed_at",
               "run_id"]  # fmt: skip
    for r in _select(conn, "judgements", columns, present):
        key = normalise_key(r["instruction_index"])
        yield LegacyRow(
            locator=f"row {r['rowid']} (instruction_index {key}, {r['model_A']} vs {r['model_B']})",
            role="judgements",
            input_form=InputForm.RAW,
            input_text=r["judge_input"],
            completion=r["judge_output"],
            instruction_id=key,
            model_a=_text_or_none(r["model_A"]),
            model_b=_text_or_none(r["model_B"]),
            **_provenance(r),
        )


_S2_SQL = """
SELECT i.rowid, i.input_hash, i.input_text, i.output_text, i.producer_metadata_json, i.pushed_by, i.pushed_at,
       i.run_id,
       (SELECT m.metadata_json FROM inference_metadata AS m WHERE m.input_hash = i.input_hash
        ORDER BY m.observed_at, m.metadata_hash LIMIT 1),
       (SELECT count(*) FROM inference_metadata AS m WHERE m.input_hash = i.input_hash)
FROM inference AS i ORDER BY i.rowid
"""
_JUDGEMENT_KEYS = ("model_a", "model_b", "judge", "orientation")


def _s2_rows(conn: sqlite3.Connection) -> Iterator[LegacyRow]:
    """S2: one output, its earliest metadata row names benchmark, instruction and models (and so the role)."""
    for raw in conn.execute(_S2_SQL):
        rowid, *values = raw
        try:
            stored_hash, text, output, _producer, pushed_by, pushed_at, run_id, meta_json, meta_count = map(
                _decode, values
            )
        except UnicodeDecodeError:
            yield LegacyRow(f"row {rowid}", "completions", InputForm.S2, problem="a column is not valid UTF-8 text")
            continue
        meta: dict[str, Any] = {}
        problem = None
        if meta_json:
            try:
                decoded = orjson.loads(meta_json)
                meta = decoded if isinstance(decoded, dict) else {}
            except orjson.JSONDecodeError:
                problem = "its inference_metadata.metadata_json is not valid JSON"
        role: Role = "judgements" if any(k in meta for k in _JUDGEMENT_KEYS) else "completions"
        row = LegacyRow(
            locator=_hash_locator(rowid, stored_hash),
            role=role,
            input_form=InputForm.S2,
            input_text=text,
            stored_hash=_text_or_none(stored_hash),
            completion=output,
            benchmark=_text_or_none(meta.get("benchmark", meta.get("task"))),
            instruction_id=_text_or_none(meta.get("instruction_id")),
            model=_text_or_none(meta.get("model")) if role == "completions" else None,
            model_a=_text_or_none(meta.get("model_a")),
            model_b=_text_or_none(meta.get("model_b")),
            judge=_text_or_none(meta.get("judge")),
            orientation=_text_or_none(meta.get("orientation")),
            created_by=_text_or_none(pushed_by),
            created_at=_text_or_none(pushed_at),
            run_id=_text_or_none(run_id),
            problem=problem,
        )
        if meta_count and meta_count > 1:
            row.notes.append("extra S2 metadata rows (judgestore keeps one row per input: the earliest one's)")
        yield row


# ---------------------------------------------------------------- DataFrame rows


def _dataframe_rows(detection: Detection, inputs: InputsTable | None, created_at: str) -> Iterator[LegacyRow]:
    source = open_dataframe(detection.path)
    variant = detection.variant
    for position, r in enumerate(source.iter_rows()):
        if variant is LegacyVariant.DF_ELO_JUDGE:
            entry, skip = _given(inputs, "row", str(position))
            if skip is None and entry is not None and entry.model is None:
                skip = "the blob does not name the evaluated model: give model in its inputs line"
            opponent = _text_or_none(r.get("opponent_model"))
            ours = entry.model if entry else None
            # [[A]] favours the answer shown first (model_a): each model goes in the slot it was shown in. Where the
            # blob does not say which, the row fails: a guess would credit the verdict to the wrong model.
            ours_first = _flag(r.get("our_model_is_position_a"))
            verdict, problem = _answer(r.get("judge_completion"), "judge_completion")
            if ours_first is None:
                problem = f"our_model_is_position_a is {r.get('our_model_is_position_a')!r}, not true or false"
            elif not opponent:
                problem = "opponent_model is empty"
            row = LegacyRow(
                locator=f"row {position}",
                role="judgements",
                input_form=InputForm.GIVEN,
                given=entry,
                completion=verdict,
                benchmark=entry.benchmark if entry else None,
                instruction_id=entry.instruction_id if entry else None,
                model_a=ours if ours_first else opponent,
                model_b=opponent if ours_first else ours,
                orientation="direct" if ours_first else "reversed",
                created_at=created_at,
                problem=problem,
                skip=skip,
            )
            row.notes.append(
                "ELO judge rows: the pair is (the evaluated model, its opponent), each in the slot it was shown in; "
                "orientation direct where the evaluated model came first, reversed where the opponent did"
            )
            yield row
            continue
        key = normalise_key(r.get("instruction_index"))
        entry, skip = _given(inputs, "instruction_index", key)
        common = {
            "role": "completions",
            "input_form": InputForm.GIVEN,
            "given": entry,
            "benchmark": entry.benchmark if entry else None,
            "created_at": created_at,
            "skip": skip,
        }
        base_id = entry.instruction_id if entry and entry.instruction_id else key
        if variant is LegacyVariant.DF_MT_BENCH:
            first, _ = _answer(r.get("completion_turn_1"), "completion_turn_1")
            for turn, column in enumerate(("completion_turn_1", "completion_turn_2")):
                completion, problem = _answer(r.get(column), column)
                yield LegacyRow(
                    locator=f"row {position} (instruction_index {key}, turn {turn + 1})",
                    completion=completion,
                    instruction_id=f"{base_id}-turn-{turn + 1}",
                    given_turn=turn,
                    previous_answer=first if turn == 1 else None,
                    problem=problem,
                    **common,  # type: ignore[arg-type]
                )
            continue
        completion, problem = _answer(r.get("completion"), "completion")
        yield LegacyRow(
            locator=f"row {position} (instruction_index {key})",
            completion=completion,
            instruction_id=base_id,
            problem=problem,
            **common,  # type: ignore[arg-type]
        )


# ---------------------------------------------------------------- entry point


def iter_rows(detection: Detection, inputs: InputsTable | None = None, *, fallback_time: str) -> Iterator[LegacyRow]:
    """The rows of one ``ok`` detection; ``fallback_time`` is used where a format records no time at all."""
    variant = detection.variant
    if detection.kind == "dataframe":
        yield from _dataframe_rows(detection, inputs, fallback_time)
        return
    with open_sqlite_readonly(detection.path) as conn:
        if variant is LegacyVariant.S0:
            yield from _s0_rows(conn, detection)
        elif variant in (LegacyVariant.S1C, LegacyVariant.S1J):
            yield from _s1_rows(conn, detection, inputs)
        elif variant is LegacyVariant.S2:
            yield from _s2_rows(conn)
        elif detection.table in ("completions", "judgements"):
            yield from _content_hashed_rows(conn, detection)
        else:
            raise InvalidInputError(f"{detection.path}: variant {str(variant or '')!r} has no row reader")


def count_rows(detection: Detection) -> int:
    """How many outputs a source holds (DataFrames are read through; MT-Bench rows hold two)."""
    if detection.kind == "dataframe":
        per_row = 2 if detection.variant is LegacyVariant.DF_MT_BENCH else 1
        return per_row * sum(1 for _ in open_dataframe(detection.path).iter_rows())
    return detection.rows or 0
