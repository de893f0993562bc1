"""Judge conversations built from answers, for callers without a prompt of their own.

Contract: :func:`pairwise_requests` turns one question and the answers of a
pair (X, Y) into one :class:`JudgementRequest` per orientation. As in
JudgeArena (#128), ``model_a``/``model_b`` are the *positional slots* of the
rendered prompt: ``model_a`` is the model whose answer is shown first (as
"Assistant A"), and ``orientation`` says how that order relates to the pair's:
the ``direct`` row shows X first (``model_a=X, model_b=Y``), the ``reversed``
row shows Y first (``model_a=Y, model_b=X``). A verdict "[[A]]" therefore
always favours ``model_a``, and a position bias shows up as the two rows of a
pair disagreeing about the same model. :func:`pointwise_request` rates one
answer (``model_b`` None, ``orientation`` None). Research codebases that render
their own judge prompt pass ``messages`` directly instead, with the same
meaning of the slots.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from inference.requests import JudgementRequest
from store.errors import InvalidInputError
from store.tables.models import Orientation

PAIRWISE_SYSTEM = (
    "You are an impartial judge. Compare the two answers to the user's question. "
    "Reply with [[A]] if Assistant A's answer is better, [[B]] if Assistant B's answer is better."
)
POINTWISE_SYSTEM = "You are an impartial judge. Rate the answer to the user's question from 1 to 10, as [[rating]]."


def _texts(**values: object) -> None:
    """Refuse a question or answer that is not text: it was written into the prompt as its ``repr``, so a missing
    answer (None) or a list was judged and its verdict cached (was)."""
    for name, value in values.items():
        if not isinstance(value, str):
            raise InvalidInputError(
                f"{name} must be text, got {type(value).__name__} {value!r:.40}"
                + ("; a failed or missing answer is not judged: leave its pair out" if value is None else "")
            )


def _pairwise_messages(question: str, first: str, second: str) -> list[dict[str, str]]:
    user = f"[Question]\n{question}\n\n[Assistant A]\n{first}\n\n[Assistant B]\n{second}\n\n[Verdict]"
    return [{"role": "system", "content": PAIRWISE_SYSTEM}, {"role": "user", "content": user}]


def pairwise_requests(
    *,
    question: str,
    model_a: str,
    answer_a: str,
    model_b: str,
    answer_b: str,
    orientations: Iterable[Orientation] = ("direct", "reversed"),
    benchmark: str | None = None,
    instruction_id: str | None = None,
    judge: str | None = None,
) -> list[JudgementRequest]:
    """One judgement request per orientation for the pair (``model_a``, ``model_b``), slots positional; a question
    or answer that is not text, or orientations given as one string, are refused."""
    _texts(question=question, answer_a=answer_a, answer_b=answer_b)
    if isinstance(orientations, str):  # "direct" iterated as 'd', 'i', ... (was: "got 'd'")
        raise InvalidInputError(f"orientations is a list of them, e.g. ({orientations!r},), got the string")
    requests = []
    for orientation in orientations:
        shown = [(model_a, answer_a), (model_b, answer_b)]
        if orientation == "reversed":
            shown.reverse()
        (first_model, first), (second_model, second) = shown
        requests.append(
            JudgementRequest(
                messages=_pairwise_messages(question, first, second),
                model_a=first_model,
                model_b=second_model,
                judge=judge,
                orientation=orientation,
                benchmark=benchmark,
                instruction_id=instruction_id,
            )
        )
    return requests


def pointwise_request(
    *,
    question: str,
    model: str,
    answer: str,
    benchmark: str | None = None,
    instruction_id: str | None = None,
    judge: str | None = None,
) -> JudgementRequest:
    """A pointwise judgement of one answer: ``model_b`` and ``orientation`` are None; a question or answer that
    is not text is refused."""
    _texts(question=question, answer=answer)
    user = f"[Question]\n{question}\n\n[Answer]\n{answer}\n\n[Rating]"
    return JudgementRequest(
        messages=[{"role": "system", "content": POINTWISE_SYSTEM}, {"role": "user", "content": user}],
        model_a=model,
        judge=judge,
        benchmark=benchmark,
        instruction_id=instruction_id,
    )


class OrientationsChoice(enum.StrEnum):
    """The command line's ``--orientation``: one orientation of each pair, or both."""

    both = "both"
    direct = "direct"
    reversed = "reversed"

    def orientations(self) -> tuple[Orientation, ...]:
        if self is OrientationsChoice.direct:
            return ("direct",)
        if self is OrientationsChoice.reversed:
            return ("reversed",)
        return ("direct", "reversed")
