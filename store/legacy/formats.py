"""Row readers for every legacy variant: one :class:`LegacyRow` per cached output, nothing decided yet.

Contract:

* :func:`iter_rows` streams the rows of one detected source in a stable order
  (``rowid`` for SQLite, file order for DataFrames), read-only
  (:mod:`store.legacy.readonly`). It only *reads*: hashes are verified, inputs
  rendered and values normalised by :mod:`store.legacy.importer`.
* Each row says how its input was stored (:class:`InputForm`): ``rendered``
  (S3 onwards: judgestore's own canonical rendered input, whose SHA-256 is the
  stored ``input_hash``), ``s2`` (``{"kind": "chat"|"raw", ..}``, hashed
  JSON-quoted), ``raw`` (a plain prompt: S0 and S1j ``judge_input``) or
  ``given`` (taken from the user's inputs file: S1c and the DataFrame caches).
* A value that is not UTF-8 text, or a row whose input is missing from the
  inputs file, comes back with ``problem`` set, so it fails alone.
* Column names are mapped onto judgestore's: ``judge_input`` -> input,
  ``judge_completion``/``judge_output``/``output_text`` -> completion,
  ``model_A``/``model_B`` -> ``model_a``/``model_b``, ``instruction_index``
  -> ``instruction_id``.
* The inputs file (``--inputs``, JSONL) names the inputs that DataFrame caches
  and S1 completions never stored: ``{"instruction_index": 7, "messages":
  [...]}`` or ``{"instruction_index": 7, "text": "..."}``; for the MT-Bench
  cache ``{"instruction_index": 81, "turns": ["q1", "q2"], "system": "..."}``
  (turn 2's input is turn 1, the cached turn-1 answer, then turn 2); for ELO
  judge caches ``{"row": 0, "messages": [...]}`` (0-based row position).
  Optional ``benchmark`` and ``instruction_id`` fill those columns.
"""

from __future__ import annotations

import enum
import math
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from store.errors import InvalidInputError
from store.layout import Role
from store.legacy.detect import Detection, LegacyVariant
from store.legacy.readonly import open_dataframe, open_sqlite_readonly


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


# ---------------------------------------------------------------- inputs file


def normalise_key(value: Any) -> str:
    """``7``, ``7.0`` and ``"7"`` name the same instruction (CSV and pandas float columns write ``7.0``)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return str(int(number)) if math.isfinite(number) and number.is_integer() else value
    return str(value)


@dataclass(frozen=True, slots=True)
class InputEntry:
    """One line of the inputs file."""

    messages: tuple[dict[str, Any], ...] | None = None
    text: str | None = None
    turns: tuple[str, ...] | None = None
    system: str | None = None
    benchmark: str | None = None
    instruction_id: str | None = None

    def messages_for_turn(self, turn: int, previous_answer: str | None) -> list[dict[str, Any]]:
        """The chat input of MT-Bench turn ``turn`` (0-based); a single-turn entry only has turn 0."""
        if self.turns is None:
            if turn != 0 or self.messages is None:
                raise InvalidInputError("this input has no turns; MT-Bench rows need {'turns': [q1, q2]}")
            return list(self.messages)
        if turn >= len(self.turns):
            raise InvalidInputError(f"the input has {len(self.turns)} turns; turn {turn + 1} is missing")
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.turns[0]})
        if turn == 1:
            if previous_answer is None:
                raise InvalidInputError("turn 2's input needs the turn-1 answer, which this row does not hold")
            messages += [{"role": "assistant", "content": previous_answer}, {"role": "user", "content": self.turns[1]}]
        return messages


@dataclass(frozen=True, slots=True)
class InputsTable:
    """The user's inputs file, keyed by normalised ``instruction_index`` or ``row``."""

    path: Path
    by_index: Mapping[str, InputEntry]
    by_row: Mapping[str, InputEntry]

    @classmethod
    def load(cls, path: Path) -> InputsTable:
        """Parse the JSONL file; a bad line raises :class:`InvalidInputError` naming file and line."""
        by_index: dict[str, InputEntry] = {}
        by_row: dict[str, InputEntry] = {}
        try:
            lines = path.read_bytes().splitlines()
        except OSError as e:
            raise InvalidInputError(f"{path}: cannot read the inputs file ({e.strerror})") from e
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise InvalidInputError(f"{where}: not valid JSON ({e})") from e
            if not isinstance(value, dict) or ("instruction_index" in value) == ("row" in value):
                raise InvalidInputError(f"{where}: each line is an object with exactly one of instruction_index, row")
            entry = _entry(value, where)
            target = by_index if "instruction_index" in value else by_row
            key = normalise_key(value.get("instruction_index", value.get("row")))
            if key in target:
                raise InvalidInputError(f"{where}: {key!r} is given twice")
            target[key] = entry
        return cls(path, by_index, by_row)


def _entry(value: dict[str, Any], where: str) -> InputEntry:
    shapes = [k for k in ("messages", "text", "turns") if k in value]
    if len(shapes) != 1:
        raise InvalidInputError(f"{where}: give exactly one of messages, text, turns")
    allowed = {"instruction_index", "row", "messages", "text", "turns", "system", "benchmark", "instruction_id"}
    unknown = set(value) - allowed
    if unknown:
        raise InvalidInputError(f"{where}: unknown keys {sorted(unknown)}")
    messages, text, turns = value.get("messages"), value.get("text"), value.get("turns")
    if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
        raise InvalidInputError(f"{where}: messages must be a list of {{role, content}} objects")
    if text is not None and not isinstance(text, str):
        raise InvalidInputError(f"{where}: text must be a string")
    if turns is not None and not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
        raise InvalidInputError(f"{where}: turns must be a non-empty list of strings")
    optional = {k: value.get(k) for k in ("system", "benchmark", "instruction_id")}
    for key, item in optional.items():
        if item is not None and not isinstance(item, str):
            raise InvalidInputError(f"{where}: {key} must be a string")
    return InputEntry(
        messages=tuple(messages) if messages is not None else None,
        text=text,
        turns=tuple(turns) if turns is not None else None,
        **optional,
    )


# ---------------------------------------------------------------- SQLite rows


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError: the caller fails this row
    return value


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


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
            created_by=_text_or_none(r["pushed_by"]),
            created_at=_text_or_none(r["pushed_at"]),
            run_id=_text_or_none(r["run_id"]),
            problem=r.get("__problem__"),
        )


_S0_COLUMNS = ["benchmark", "instruction_id", "model_a", "model_b", "judge", "judge_input", "judge_completion",
               "reasoning_content", "input_tokens", "output_tokens", "reasoning_tokens", "date"]  # fmt: skip


def _s0_rows(conn: sqlite3.Connection, detection: Detection) -> Iterator[LegacyRow]:
    """S0 annotations: a plain judge prompt, token counts and reasoning text, no hash."""
    for r in _select(conn, "annotations", _S0_COLUMNS, set(detection.columns)):
        usage: dict[str, Any] = {}
        for legacy, ours in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens"),
                             ("reasoning_tokens", "reasoning_tokens")):  # fmt: skip
            if r[legacy]:  # 0 is the column default: "not recorded"
                usage[ours] = r[legacy]
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
            problem=r.get("__problem__"),
        )


def _s1_rows(conn: sqlite3.Connection, detection: Detection, inputs: InputsTable | None) -> Iterator[LegacyRow]:
    """S1: rows keyed by instruction_index; completions carry no input at all."""
    present = set(detection.columns)
    if detection.role == "completions":
        for r in _select(conn, "completions", ["instruction_index", "completion", "pushed_by", "pushed_at",
                                               "run_id"], present):  # fmt: skip
            key = normalise_key(r["instruction_index"])
            entry = inputs.by_index.get(key) if inputs is not None else None
            yield LegacyRow(
                locator=f"row {r['rowid']} (instruction_index {key})",
                role="completions",
                input_form=InputForm.GIVEN,
                given=entry,
                completion=r["completion"],
                instruction_id=(entry.instruction_id if entry and entry.instruction_id else key),
                benchmark=entry.benchmark if entry else None,
                created_by=_text_or_none(r["pushed_by"]),
                created_at=_text_or_none(r["pushed_at"]),
                run_id=_text_or_none(r["run_id"]),
                problem=r.get("__problem__"),
                skip=None if entry else _missing_input("instruction_index", key, inputs),
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
            created_by=_text_or_none(r["pushed_by"]),
            created_at=_text_or_none(r["pushed_at"]),
            run_id=_text_or_none(r["run_id"]),
            problem=r.get("__problem__"),
        )


def _missing_input(kind: str, key: str, inputs: InputsTable | None) -> str:
    if inputs is None:
        return "no input stored and no inputs file given (--inputs)"
    return f"no input for {kind} {key} in {inputs.path.name}"


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
            key = str(position)
            entry = inputs.by_row.get(key) if inputs is not None else None
            yield LegacyRow(
                locator=f"row {position}",
                role="judgements",
                input_form=InputForm.GIVEN,
                given=entry,
                completion=_text_or_none(r.get("judge_completion")),
                benchmark=entry.benchmark if entry else None,
                instruction_id=entry.instruction_id if entry else None,
                model_b=_text_or_none(r.get("opponent_model")),
                created_at=created_at,
                skip=None if entry else _missing_input("row", key, inputs),
            )
            continue
        key = normalise_key(r.get("instruction_index"))
        entry = inputs.by_index.get(key) if inputs is not None else None
        common = {
            "role": "completions",
            "input_form": InputForm.GIVEN,
            "given": entry,
            "benchmark": entry.benchmark if entry else None,
            "created_at": created_at,
            "skip": None if entry else _missing_input("instruction_index", key, inputs),
        }
        base_id = entry.instruction_id if entry and entry.instruction_id else key
        if variant is LegacyVariant.DF_MT_BENCH:
            first = _text_or_none(r.get("completion_turn_1"))
            for turn, column in enumerate(("completion_turn_1", "completion_turn_2")):
                yield LegacyRow(
                    locator=f"row {position} (instruction_index {key}, turn {turn + 1})",
                    completion=_text_or_none(r.get(column)),
                    instruction_id=f"{base_id}-turn-{turn + 1}",
                    given_turn=turn,
                    previous_answer=first if turn == 1 else None,
                    **common,  # type: ignore[arg-type]
                )
            continue
        yield LegacyRow(
            locator=f"row {position} (instruction_index {key})",
            completion=_text_or_none(r.get("completion")),
            instruction_id=base_id,
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
