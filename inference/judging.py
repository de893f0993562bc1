"""Judge conversations built from answers, for callers without a prompt of their own.

Contract: :func:`pairwise_requests` turns one question and two answers into
one :class:`JudgementRequest` per orientation: ``direct`` shows model A's
answer first, ``reversed`` shows model B's answer first; both rows keep
``model_a``/``model_b`` as the pair's identity, so a position bias shows up as
disagreement between the two rows. :func:`pointwise_request` rates one answer
(``model_b`` None). Research codebases that render their own judge prompt
pass ``messages`` directly instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from inference.requests import JudgementRequest, Orientation

PAIRWISE_SYSTEM = (
    "You are an impartial judge. Compare the two answers to the user's question. "
    "Reply with [[A]] if Assistant A's answer is better, [[B]] if Assistant B's answer is better."
)
POINTWISE_SYSTEM = "You are an impartial judge. Rate the answer to the user's question from 1 to 10, as [[rating]]."


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
    """One judgement request per orientation for the pair (A, B)."""
    requests = []
    for orientation in orientations:
        first, second = (answer_a, answer_b) if orientation == "direct" else (answer_b, answer_a)
        requests.append(
            JudgementRequest(
                messages=_pairwise_messages(question, first, second),
                model_a=model_a,
                model_b=model_b,
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
    """A pointwise judgement of one answer: ``model_b`` and ``orientation`` are None."""
    user = f"[Question]\n{question}\n\n[Answer]\n{answer}\n\n[Rating]"
    return JudgementRequest(
        messages=[{"role": "system", "content": POINTWISE_SYSTEM}, {"role": "user", "content": user}],
        model_a=model,
        judge=judge,
        benchmark=benchmark,
        instruction_id=instruction_id,
    )
