"""What a judge said, read from its stored row: the verdict token's preference, the verdict, and a judge's figures.

Contract:

* :func:`preference` reads P(A) and P(B) from a row's stored ``top_logprobs``
  at the *verdict position*: the first stored position whose sampled token
  is more than whitespace and square brackets, if it then reads ``A`` or
  ``B`` (``"A"``, ``" A"``, ``"[[A"``; a tie's ``C``, or a judge that
  writes "The answer is [[A]]", has none: an ``A`` of its explanation is no
  verdict), read from its candidates: none when the sampled letter is
  not among them (ranked below them: under ``allowed_token_ids`` or guided
  decoding, whose logprobs are the unrestricted ones, or sampled at a
  temperature past the other letter kept: the text decides, no later
  position); where the sampled token is not stored
  (an imported legacy row), the first whose candidates include such a
  token. That is the first generated token for a judge told to answer with
  the letter (JudgeArena's ``weighted_token_preference`` reads the first
  token's ``"A"``/``"B"``); with ``--logprob-positions all``, a judge
  answering ``[[A]]`` is read at its letter, and with the first position
  only, such a judge has no verdict position (its ``[[`` was sampled: an
  unlikely ``B`` among that position's candidates says nothing of the
  verdict, which was read there, reversed) and is read from its text.
  Candidates that read the same letter add up (their
  probabilities are summed, as :func:`store.logprobs.text_logprobs` merges
  candidates of the same text). None when no stored position has either.
  The positions past the verdict position are not read (nor checked): a
  judge's row holding every position costs what its verdict position does.
* :func:`read_verdict` is the slot a row favours: the likelier letter of
  its preference; without one (no logprobs stored, or no letter among
  them), the last ``[[A]]`` or ``[[B]]`` in its text, or a text that is
  just the letter. None otherwise (and on a tie).
* A stored ``top_logprobs`` that :mod:`store.logprobs` cannot read (a
  value another tool stored: ``{"A": "x"}``, a candidate without a text),
  or whose verdict candidates hold no log-probability (above 0, NaN),
  is no bad request: :func:`read_verdict` reads such a row as one without
  logprobs (the verdict from its text) and says why its logprobs could
  not be read; :func:`preference` itself raises the store's
  :class:`~store.errors.InvalidInputError`.
* Slots are positions in the judge prompt (:class:`store.tables.models.Judgement`):
  :func:`favoured_model` maps a verdict back to the model in that slot, so
  the two orientations of a pair can be compared by model;
  :func:`source_pair` gives the pair in its source order.
* :func:`judge_figures` adds a judge's rows up: wins per model pair, how
  often slot A wins (position bias), how often the two orientations of the
  same question agree on the model, and the distribution of the verdict
  token's confidence (``max(P(A), P(B)) / (P(A) + P(B))``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from store.errors import InvalidInputError
from store.logprobs import iter_positions

Slot = Literal["A", "B"]
SLOTS: tuple[Slot, Slot] = ("A", "B")
CONFIDENCE_BINS = 10  # bins of the confidence histogram, from 0.5 to 1.0
_TEXT_VERDICT = re.compile(r"\[\[([AB])\]\]")


def _letter(text: str) -> Slot | None:
    stripped = text.strip().strip("[]").strip()
    return stripped if stripped in SLOTS else None  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Preference:
    """P(A) and P(B) at the verdict position (``position``: 0 is the first generated token)."""

    p_a: float
    p_b: float
    position: int

    @property
    def share_a(self) -> float:
        """P(A) / (P(A) + P(B)): where the bar between the two slots splits."""
        total = self.p_a + self.p_b
        return self.p_a / total if total > 0 else 0.5

    @property
    def confidence(self) -> float:
        """How sure the verdict token is of the likelier slot, between 0.5 and 1."""
        return max(self.share_a, 1 - self.share_a)

    @property
    def favoured(self) -> Slot | None:
        if self.p_a == self.p_b:
            return None
        return "A" if self.p_a > self.p_b else "B"


_ROUNDING = 1e-6  # an engine's logprob of a certain token may come out a hair above 0


def preference(top_logprobs: Mapping[str, Any] | None) -> Preference | None:
    """The verdict token's preference (see the module docstring); None when no stored position names a slot."""
    for index, position in enumerate(iter_positions(top_logprobs)):  # decoded up to the verdict position only
        if position.sampled is not None and _letter(position.sampled.text) is None:
            if not position.sampled.text.strip().strip("[]").strip():
                continue  # "[[" or a space before the letter: the verdict comes later
            return None  # the judge wrote something else first ("The", a tie's "C"): its text says what it chose
        mass = {"A": 0.0, "B": 0.0}
        found = False
        for candidate in position.candidates:
            letter = _letter(candidate.text)
            if letter is None:
                continue
            if not candidate.logprob <= _ROUNDING:  # NaN too: shown as a probability, it read 148.4 or 0 (was)
                raise InvalidInputError(
                    f"the verdict token's candidate {candidate.text!r} has the logprob {candidate.logprob!r}, "
                    "which is no log-probability (at most 0)"
                )
            mass[letter] += math.exp(candidate.logprob)
            found = True
        sampled = None if position.sampled is None else _letter(position.sampled.text)
        if sampled is not None and not any(_letter(c.text) == sampled for c in position.candidates):
            # The verdict position, its sampled letter ranked below the candidates kept (allowed_token_ids, guided
            # decoding: the logprobs are the unrestricted ones; or sampled past the other letter kept): no
            # preference here, and none later. Read, a later position's letter was the verdict, or the other
            # letter kept, the one sampled at P 0 (was); the text says it
            return None
        if found:
            return Preference(mass["A"], mass["B"], index)
    return None


def text_verdict(completion: str) -> Slot | None:
    """The slot a judge's text names: its last ``[[A]]``/``[[B]]``, or the text being just the letter."""
    found = _TEXT_VERDICT.findall(completion)
    if found:
        return found[-1]  # type: ignore[no-any-return]
    return _letter(completion) if len(completion) <= 8 else None


@dataclass(frozen=True, slots=True)
class Reading:
    """A row's verdict: its slot, the preference it was read from (None: from the text), why logprobs were not read."""

    slot: Slot | None
    preference: Preference | None
    logprobs_error: str | None = None  # set when the stored top_logprobs could not be read


def read_preference(top_logprobs: Mapping[str, Any] | None) -> tuple[Preference | None, str | None]:
    """:func:`preference`, or (None, why) for a stored value it cannot read (see the module docstring)."""
    try:
        return preference(top_logprobs), None
    except InvalidInputError as e:
        return None, str(e)


def read_verdict(completion: str, top_logprobs: Mapping[str, Any] | None) -> Reading:
    """The slot a row favours, read at its verdict token, else from its text (also when its logprobs are unreadable)."""
    pref, error = read_preference(top_logprobs)
    if pref is not None:
        return Reading(pref.favoured, pref)
    return Reading(text_verdict(completion), None, error)


def source_pair(model_a: str | None, model_b: str | None, orientation: str | None) -> tuple[str, str] | None:
    """The pair (X, Y) a pairwise judgement compares, in the source's order: the direct orientation shows X first."""
    if model_a is None or model_b is None:
        return None
    return (model_b, model_a) if orientation == "reversed" else (model_a, model_b)


def favoured_model(slot: Slot | None, model_a: str | None, model_b: str | None) -> str | None:
    """The model in the favoured slot."""
    if slot is None:
        return None
    return model_a if slot == "A" else model_b


# ---------------------------------------------------------------- a judge's figures


@dataclass(frozen=True, slots=True)
class JudgedRow:
    """What the figures need of one pairwise judgement."""

    question: tuple[str, ...]  # where it belongs: database, benchmark, instruction id, sample
    model_a: str
    model_b: str
    orientation: str | None
    slot: Slot | None
    confidence: float | None  # None: the verdict came from the text
    unreadable: bool = False  # its stored logprobs could not be read


@dataclass(slots=True)
class PairFigures:
    """One model pair (``first`` < ``second`` by name): who won how often."""

    first: str
    second: str
    first_wins: int = 0
    second_wins: int = 0
    no_verdict: int = 0

    @property
    def judged(self) -> int:
        return self.first_wins + self.second_wins + self.no_verdict


@dataclass(slots=True)
class JudgeFigures:
    """A judge's rows added up (see the module docstring)."""

    rows: int = 0
    pointwise: int = 0
    slot_a_wins: int = 0
    slot_b_wins: int = 0
    no_verdict: int = 0
    from_logprobs: int = 0
    unreadable: int = 0  # rows whose stored logprobs could not be read (their verdict read from the text)
    both_orientations: int = 0  # questions judged in both orientations, each with a verdict
    agreeing: int = 0  # of those, the ones where both favour the same model
    pairs: dict[tuple[str, str], PairFigures] = field(default_factory=dict)
    confidence_bins: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)

    @property
    def from_text(self) -> int:
        """Verdicts read from the judge's text (a verdict found, but not at a stored logprob)."""
        return self.slot_a_wins + self.slot_b_wins - self.from_logprobs

    @property
    def slot_a_rate(self) -> float | None:
        decided = self.slot_a_wins + self.slot_b_wins
        return self.slot_a_wins / decided if decided else None

    @property
    def agreement_rate(self) -> float | None:
        return self.agreeing / self.both_orientations if self.both_orientations else None


def confidence_bin(confidence: float) -> int:
    """The histogram bin of a confidence between 0.5 and 1 (1.0 falls in the last bin)."""
    scaled = (confidence - 0.5) * 2 * CONFIDENCE_BINS
    return min(CONFIDENCE_BINS - 1, max(0, int(scaled)))


def judge_figures(rows: Iterable[JudgedRow], pointwise: int = 0) -> JudgeFigures:
    """Add up a judge's pairwise rows (``pointwise``: how many pointwise rows were left out)."""
    figures = JudgeFigures(pointwise=pointwise)
    by_question: dict[tuple[Any, ...], dict[str, str | None]] = {}
    for row in rows:
        figures.rows += 1
        first, second = sorted((row.model_a, row.model_b))
        pair = figures.pairs.setdefault((first, second), PairFigures(first, second))
        winner = favoured_model(row.slot, row.model_a, row.model_b)
        if row.slot == "A":
            figures.slot_a_wins += 1
        elif row.slot == "B":
            figures.slot_b_wins += 1
        else:
            figures.no_verdict += 1
        if winner is None:
            pair.no_verdict += 1
        elif winner == first:
            pair.first_wins += 1
        else:
            pair.second_wins += 1
        figures.unreadable += row.unreadable
        if row.confidence is not None:
            figures.from_logprobs += 1
            figures.confidence_bins[confidence_bin(row.confidence)] += 1
        if row.orientation in ("direct", "reversed"):
            by_question.setdefault((*row.question, first, second), {})[row.orientation] = winner
    for winners in by_question.values():
        direct, reversed_ = winners.get("direct"), winners.get("reversed")
        if direct is not None and reversed_ is not None:
            figures.both_orientations += 1
            figures.agreeing += direct == reversed_
    return figures
