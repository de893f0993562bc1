"""Stored top logprobs in the shapes existing parsers read, and a verdict preference computed from them.

Contract:

* The store keeps every candidate the engine returned (``judgestore-logprobs/v1``,
  :mod:`store.logprobs`); these views are derived on demand and never stored.
  Each reads both stored shapes (rows in the older ``{text: logprob}`` shape
  too) and is empty (or None) when nothing was stored for the position.
* Two ``{token text: logprob}`` views of one position, which differ only
  where two candidates decode to the same text (byte-level pieces of one
  character both decode to ``""``; ``"A"`` and another id spelled ``"A"``):

  - :func:`token_logprobs_merged` adds their probabilities (log-sum-exp): the
    probability that the model emits that text as this token. It is
    :func:`store.logprobs.text_logprobs`, ``Response.text_logprobs()``.
  - :func:`token_logprobs_last_wins` keeps the last of them in rank order
    (the least likely), as ``{c.token: c.logprob for c in candidates}``
    does: what parsers that build the dict themselves from an engine's
    candidates saw. Use it to reproduce numbers computed that way. With
    ``sampled_first=True`` it reads the position as vLLM's own logprobs dict
    lists it: the sampled token first (outside the top k too, as vLLM
    returns it), then the candidates without it; an OpenAI-style
    ``top_logprobs`` list holds the candidates only (the default).

* :func:`openai_logprobs` is OpenAI's chat ``logprobs`` object,
  ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``
  (one entry per stored position, ``top_logprobs`` in rank order), which
  parsers reading ``response_metadata["logprobs"]["content"][0]["top_logprobs"]``
  expect. An entry's ``token`` is the sampled token; rows in the older shape
  do not know it, and give their most likely candidate instead. ``bytes``
  are what the API gave, None where they were not stored (vLLM's rows).
* :func:`preference` is the A/B verdict preference of a pairwise judge's
  first token (JudgeArena #118, AlpacaEval's logprob parser): the
  probability of the second verdict token renormalised over the two, a
  missing token counting as probability 0; None when neither is there.

For example, a judge that answers "A" or "B" first, its row's candidates
being "A" (-0.2), "B" (-1.9) and a second id that also decodes to "A" (-3.0)::

    token_logprobs_merged(row)     -> {"A": -0.141, "B": -1.9}  # P(A) = 0.819 + 0.050 = 0.869
    token_logprobs_last_wins(row)  -> {"A": -3.0, "B": -1.9}    # the second "A" replaced the first
    preference(token_logprobs_merged(row))    -> 0.147  # P(B) / (P(A) + P(B)): model_a clearly preferred
    preference(token_logprobs_last_wins(row)) -> 0.750  # the same row, read the other way round
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from store.errors import InvalidInputError
from store.logprobs import TokenLogprob, check_position, decode, same_token, text_logprobs


def token_logprobs_merged(top_logprobs: Mapping[str, Any] | None, position: int = 0) -> dict[str, float]:
    """``{text: logprob}`` at ``position``, candidates with the same text merged by log-sum-exp."""
    return text_logprobs(top_logprobs, position)


def token_logprobs_last_wins(
    top_logprobs: Mapping[str, Any] | None, position: int = 0, *, sampled_first: bool = False
) -> dict[str, float]:
    """``{text: logprob}`` at ``position``; of candidates with the same text, the last in rank order stays
    (``sampled_first``: in vLLM's order, the sampled token first; see the module docstring). ``position`` is
    checked as :func:`token_logprobs_merged` checks it: the two views of one row agree on what they refuse."""
    check_position(position)
    positions = decode(top_logprobs)
    if position >= len(positions):
        return {}
    at = positions[position]
    ordered = at.candidates
    if sampled_first and at.sampled is not None:
        ordered = (at.sampled, *(c for c in at.candidates if not same_token(c, at.sampled)))
    return {candidate.text: candidate.logprob for candidate in ordered}


def openai_logprobs(top_logprobs: Mapping[str, Any] | None) -> dict[str, list[dict[str, Any]]] | None:
    """OpenAI's chat ``logprobs`` object for the stored positions; None when nothing was stored."""
    if top_logprobs is None:
        return None
    content = []
    for position in decode(top_logprobs):
        chosen = position.sampled or (position.candidates[0] if position.candidates else None)
        if chosen is None:
            continue
        entry = _openai_token(chosen)
        entry["top_logprobs"] = [_openai_token(c) for c in position.candidates]
        content.append(entry)
    return {"content": content}


def preference(token_logprobs: Mapping[str, float], tokens: tuple[str, str] = ("A", "B")) -> float | None:
    """P(``tokens[1]``) / (P(``tokens[0]``) + P(``tokens[1]``)) from first-token logprobs; None if both are missing.

    0 means the first answer shown (``model_a``) is preferred, 1 the second,
    0.5 a tie; a missing token counts as probability 0.
    """
    if not isinstance(token_logprobs, Mapping):
        raise InvalidInputError(f"token_logprobs must map tokens to logprobs, got {type(token_logprobs).__name__}")
    if "positions" in token_logprobs and "format" in token_logprobs:  # a stored row's: no "A" in it, so None (was)
        raise InvalidInputError(
            "token_logprobs is a row's stored logprobs (all positions): give one position's {token: logprob}, "
            "e.g. preference(text_logprobs(row.top_logprobs))"
        )
    first, second = (token_logprobs.get(t) for t in tokens)
    for token, value in zip(tokens, (first, second), strict=True):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidInputError(f"the logprob of {token!r} must be a number, got {value!r:.40}")
    if first is None and second is None:
        return None
    a = -math.inf if first is None else first
    b = -math.inf if second is None else second
    top = max(a, b)
    if top == -math.inf:  # both present with probability 0: nothing to compare
        return None
    weight_a, weight_b = math.exp(a - top), math.exp(b - top)
    return weight_b / (weight_a + weight_b)


def _openai_token(token: TokenLogprob) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": None if token.bytes is None else list(token.bytes),  # unknown (vLLM's rows): None, as OpenAI allows
    }
