"""What vLLM returned, as judgestore keeps it: a finished request's :class:`Generation`, its logprobs lossless.

Contract: :func:`generation` turns one finished ``RequestOutput`` into a
:class:`~inference.backends.base.Generation`: the text, finish reason, token
counts and, when ``sampling.logprobs`` is set, every candidate vLLM returned
(token id, decoded text, logprob, rank) and the sampled token, for the first
generated position or all of them (``descriptor.logprob_positions``), in the
lossless shape of :mod:`store.logprobs` (:func:`position_logprobs`). It reads
vLLM's objects by their attributes and imports nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference.backends.base import Generation
from store import logprobs
from store.descriptor import ModelDescriptor
from store.logprobs import PositionLogprobs, TokenLogprob


def _token(token_id: int, entry: Any) -> TokenLogprob:
    text = entry.decoded_token if entry.decoded_token is not None else ""
    return TokenLogprob(text, float(entry.logprob), token_id, entry.rank)


def position_logprobs(candidates: Mapping[int, Any], sampled_id: int | None, count: int) -> PositionLogprobs:
    """Every candidate vLLM returned for one position, and the sampled token (see :mod:`store.logprobs`).

    vLLM returns the ``count`` best tokens plus the sampled one when it is not
    among them (with its true rank, above ``count``): the former are the
    candidates, in rank order; the latter is kept as ``sampled`` only.
    """
    top = sorted(
        (
            _token(token_id, entry)
            for token_id, entry in candidates.items()
            if entry.rank is None or entry.rank <= count
        ),
        key=lambda t: (t.rank if t.rank is not None else count + 1, -t.logprob),
    )
    sampled = None
    if sampled_id is not None and sampled_id in candidates:
        sampled = _token(sampled_id, candidates[sampled_id])
    return PositionLogprobs(tuple(top), sampled)


def generation(output: Any, descriptor: ModelDescriptor) -> Generation:
    """The :class:`Generation` of one finished request (see the module docstring)."""
    completion = output.outputs[0]
    count = descriptor.sampling.logprobs
    top: dict[str, Any] | None = None
    if count is not None:
        per_position = list(completion.logprobs or ())
        if descriptor.logprob_positions == "first":
            per_position = per_position[:1]
        token_ids = list(completion.token_ids)
        top = logprobs.encode(
            position_logprobs(candidates or {}, token_ids[i] if i < len(token_ids) else None, count)
            for i, candidates in enumerate(per_position)
        )
    return Generation(
        text=completion.text,
        finish_reason=completion.finish_reason,
        usage={
            "prompt_tokens": len(output.prompt_token_ids or ()),
            "completion_tokens": len(completion.token_ids),
        },
        top_logprobs=top,
    )
