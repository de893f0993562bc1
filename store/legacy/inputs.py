"""The user's inputs file (``--inputs``, JSONL): the inputs that DataFrame caches and S1 completions never stored.

Contract:

* :meth:`InputsTable.load` reads the whole file up front and refuses a bad
  line with :class:`~store.errors.InvalidInputError` naming file and line, so
  an import never starts on a half-valid file.
* Each line is one object with exactly one key, ``instruction_index`` or
  ``row``, and exactly one input shape: ``{"instruction_index": 7,
  "messages": [...]}`` or ``{"instruction_index": 7, "text": "..."}``; for the
  MT-Bench cache ``{"instruction_index": 81, "turns": ["q1", "q2"], "system":
  "..."}`` (turn 2's input is turn 1, the cached turn-1 answer, then turn 2);
  for ELO judge caches ``{"row": 0, "messages": [...], "model": "ours"}``
  (0-based row position; ``model`` names the evaluated model, which the blob
  never names: without it the row is skipped). Optional ``benchmark`` and
  ``instruction_id`` fill those columns.
* Keys are compared after :func:`normalise_key`: ``7``, ``7.0`` and ``"7"``
  name the same instruction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from store.errors import InvalidInputError

_WRITTEN_AS_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.0+")


def normalise_key(value: Any) -> str:
    """``7``, ``7.0`` and ``"7"`` name the same instruction (CSV and pandas float columns write ``7.0``).

    Other text is an id as written: ``"0010"``, ``"1e1"`` and ``"10"`` are three instructions (was: all 10, so
    one id's answer was stored under another's prompt)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return str(int(value.partition(".")[0])) if _WRITTEN_AS_FLOAT.fullmatch(value) else value
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
    model: str | None = None  # ELO rows: the evaluated model, in the slot the opponent was not shown in

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
    unknown = set(value) - allowed - ({"model"} if "row" in value else set())
    if unknown:
        also = " (model names the evaluated model of an ELO row: a line with row)" if "model" in unknown else ""
        raise InvalidInputError(f"{where}: unknown keys {sorted(unknown)}{also}")
    messages, text, turns = value.get("messages"), value.get("text"), value.get("turns")
    if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
        raise InvalidInputError(f"{where}: messages must be a list of {{role, content}} objects")
    if text is not None and not isinstance(text, str):
        raise InvalidInputError(f"{where}: text must be a string")
    if turns is not None and not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
        raise InvalidInputError(f"{where}: turns must be a non-empty list of strings")
    optional = {k: value.get(k) for k in ("system", "benchmark", "instruction_id", "model")}
    for key, item in optional.items():
        if item is not None and not isinstance(item, str):
            raise InvalidInputError(f"{where}: {key} must be a string")
    if optional["model"] == "":
        raise InvalidInputError(f"{where}: model must name the evaluated model, not be empty")
    return InputEntry(
        messages=tuple(messages) if messages is not None else None,
        text=text,
        turns=tuple(turns) if turns is not None else None,
        **optional,
    )
