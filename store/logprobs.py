"""Top logprobs as stored: every candidate the engine returned, and the one derived ``{text: logprob}`` view.

Contract:

* The ``top_logprobs`` column holds, for each position asked for (the first
  generated token by default, every position when the descriptor says
  ``logprob_positions="all"``)::

      {"format": "judgestore-logprobs/v1",
       "positions": [{"candidates": [{"id": 12, "logprob": -0.1, "rank": 1, "text": "A"}, ...],
                      "sampled": {"id": 12, "logprob": -0.1, "rank": 1, "text": "A"}}, ...]}

  ``candidates`` are the top ``k`` tokens in rank order, each with its token
  id (``null`` where an API does not give it), decoded text, logprob and rank
  (1 = most likely), plus ``bytes`` where an API gives them. ``sampled`` is
  the token actually generated at that position, kept even when it is not
  among the top ``k`` (vLLM then reports its true rank, above ``k``).
  Nothing is merged: two ids that decode to the same text (byte-level pieces
  of one character both decode to ``""``) are two candidates.
* Rows written before this format (judgestore 0.1 and legacy caches) hold
  ``{decoded text: logprob}`` of the first position; :func:`decode` reads
  both shapes (the old one as candidates without ids, ranked by logprob, and
  no sampled token). :func:`iter_positions` reads them one at a time, for
  a reader that needs only the first few.
* :func:`text_logprobs` is the one derived view, the shape JudgeArena's
  parsers read (``weighted_token_preference`` calls ``.get("A")``):
  ``{text: logprob}`` over the candidates of one position. Candidates that
  decode to the same text are merged by log-sum-exp, i.e. their
  probabilities add up: it is the probability that the model emits that text
  as this token. The view is derived on demand and never stored.
* Logprobs may be ``-inf`` (masked tokens) or NaN; :mod:`store.jsonvalues`
  stores them exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from store.errors import InvalidInputError

LOGPROBS_FORMAT = "judgestore-logprobs/v1"


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token at one position: its text, logprob, id and rank where known."""

    text: str
    logprob: float
    token_id: int | None = None
    rank: int | None = None
    bytes: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        # Keys in sorted order, as the stored (canonical) JSON reads back: a fresh answer's line is a hit's
        value: dict[str, Any] = {} if self.bytes is None else {"bytes": list(self.bytes)}
        return value | {"id": self.token_id, "logprob": self.logprob, "rank": self.rank, "text": self.text}

    @classmethod
    def from_json(cls, value: Any) -> TokenLogprob:
        if not isinstance(value, Mapping) or not isinstance(value.get("text"), str):
            raise InvalidInputError(f"not a stored token logprob: {value!r:.80}")
        raw_bytes = value.get("bytes")
        try:
            return cls(
                text=value["text"],
                logprob=float(value["logprob"]),
                token_id=value.get("id"),
                rank=value.get("rank"),
                bytes=None if raw_bytes is None else tuple(raw_bytes),
            )
        except (KeyError, TypeError, ValueError) as e:  # no logprob, a logprob that is not a number, bytes not a list
            raise InvalidInputError(f"not a stored token logprob ({e!r}): {value!r:.80}") from e


def same_token(a: TokenLogprob, b: TokenLogprob) -> bool:
    """One token: the same id, or (no id stored) the same text and logprob."""
    if a.token_id is not None and b.token_id is not None:
        return a.token_id == b.token_id
    return (a.text, a.logprob) == (b.text, b.logprob)


@dataclass(frozen=True, slots=True)
class PositionLogprobs:
    """The top candidates at one generated position, and the token that was sampled there."""

    candidates: tuple[TokenLogprob, ...]
    sampled: TokenLogprob | None = None

    def sampled_index(self) -> int | None:
        """Where the sampled token is among the candidates (:func:`same_token`); None when it was not kept (it
        ranked below them) or nothing was sampled."""
        if self.sampled is None:
            return None
        sampled = self.sampled
        return next((i for i, c in enumerate(self.candidates) if same_token(c, sampled)), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "candidates": [c.to_json() for c in self.candidates],
            "sampled": None if self.sampled is None else self.sampled.to_json(),
        }


def encode(positions: Iterable[PositionLogprobs]) -> dict[str, Any]:
    """The stored (JSON) form of ``positions``."""
    return {"format": LOGPROBS_FORMAT, "positions": [p.to_json() for p in positions]}


def is_current_shape(value: Mapping[str, Any]) -> bool:
    return value.get("format") == LOGPROBS_FORMAT and isinstance(value.get("positions"), list)


def iter_positions(value: Mapping[str, Any] | None) -> Iterator[PositionLogprobs]:
    """:func:`decode`'s positions, each decoded when the iteration reaches it.

    A reader that stops at the position it needs (the browser stops at the
    verdict token) pays for, and is checked on, the positions up to it only:
    a position past it is neither built nor read. Errors are :func:`decode`'s,
    raised where the iteration meets them (a value in neither shape: at the
    first ``next``).
    """
    if value is None:
        return
    if not isinstance(value, Mapping):  # a list, say: AttributeError further on
        raise InvalidInputError(f"top_logprobs is neither {LOGPROBS_FORMAT} nor {{text: logprob}}: {value!r:.80}")
    if is_current_shape(value):
        for position in value["positions"]:
            yield _position(position)
        return
    yield from _old_shape(value)


def _position(position: Any) -> PositionLogprobs:
    candidates = position.get("candidates", ()) if isinstance(position, Mapping) else None
    if not isinstance(candidates, list | tuple):
        raise InvalidInputError(f"not a stored position of {LOGPROBS_FORMAT}: {position!r:.80}")
    sampled = position.get("sampled")
    return PositionLogprobs(
        tuple(TokenLogprob.from_json(c) for c in candidates),
        None if sampled is None else TokenLogprob.from_json(sampled),
    )


def _old_shape(value: Mapping[str, Any]) -> list[PositionLogprobs]:
    """The one position of a ``{text: logprob}`` value."""
    try:
        # Best first; ties (and NaN, last) ordered by text, so the ranks never depend on the dict's order.
        ranked = sorted(
            ((str(text), float(lp)) for text, lp in value.items()),
            key=lambda item: (math.isnan(item[1]), 0.0 if math.isnan(item[1]) else -item[1], item[0]),
        )
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"top_logprobs is neither {LOGPROBS_FORMAT} nor {{text: logprob}}: {e}") from e
    return [PositionLogprobs(tuple(TokenLogprob(text, lp, rank=i) for i, (text, lp) in enumerate(ranked, 1)))]


def decode(value: Mapping[str, Any] | None) -> list[PositionLogprobs]:
    """The positions a stored ``top_logprobs`` value holds, in either shape (see the module docstring)."""
    return list(iter_positions(value))


def from_text_logprobs(value: Mapping[str, float]) -> dict[str, Any]:
    """An old-shape ``{text: logprob}`` value in the current shape (what legacy imports store)."""
    return encode(decode(value))


def logsumexp(values: Sequence[float]) -> float:
    """``log(sum(exp(v)))`` without overflow; ``-inf`` for no values or only ``-inf``; NaN stays NaN."""
    if not values:
        return -math.inf
    if any(math.isnan(v) for v in values):
        return math.nan
    top = max(values)
    if top == -math.inf or top == math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def check_position(position: object) -> None:
    """Refuse a ``position`` that is no generated token's index: a negative one (it would count from the end), a
    non-integer (a bare TypeError further on)."""
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise InvalidInputError(f"position must be an integer from 0 (the first generated token), not {position!r}")


def text_logprobs(value: Mapping[str, Any] | None, position: int = 0) -> dict[str, float]:
    """JudgeArena's ``{text: logprob}`` view of one position (see the module docstring).

    Empty when nothing was stored for that position; ``position`` counts from 0 (a negative or non-integer one is an
    :class:`InvalidInputError`, as is a stored value in neither shape).
    """
    check_position(position)
    positions = decode(value)
    if position >= len(positions):
        return {}
    grouped: dict[str, list[float]] = {}
    for candidate in positions[position].candidates:
        grouped.setdefault(candidate.text, []).append(candidate.logprob)
    return {text: logsumexp(lps) for text, lps in grouped.items()}
