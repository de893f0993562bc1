"""The OpenAI-compatible wire format: the body a request sends, the generation a response body gives.

Contract:

* What is sent is a pure function of the descriptor and the request,
  :func:`request_body`: chat input goes to ``/chat/completions``, text input
  to ``/completions``; ``temperature`` always, ``max_tokens`` when set (as
  ``max_completion_tokens`` for OpenAI's chat API, which refuses the old
  name for newer models), the other sampling settings when they differ from
  their neutral value (top_p 1, penalties 0, top_k 0, min_p 0,
  repetition_penalty 1) and always to a ``vllm-server``, whose
  ``generation_config`` defaults would otherwise apply; ``seed + k`` for
  sample ``k`` when a seed is set; ``stop``; logprobs; every unknown
  sampling setting as it is; OpenRouter routing as ``provider``; chat
  template kwargs to a ``vllm-server``.
* Logprobs are stored in the lossless shape of :mod:`store.logprobs`: the
  K candidates asked for (``sampling.logprobs``), best first (rank 1, 2,
  ...; equal logprobs in the API's order), their text and ``bytes`` where
  given, ``token_id`` None (APIs do not give ids), and the sampled token
  with its rank when it is among them; the first position or all of them
  (``descriptor.logprob_positions``). A vLLM server lists the sampled token
  first and cuts its chat list at K, and adds it to its text API's K: a
  sampled token outside the top K took rank 1 and pushed out the K-th
  (was). So a ``vllm-server`` chat request asks for K + 1 (below vLLM's
  limit of :data:`VLLM_MAX_LOGPROBS`), and every answer's candidates are
  sorted and cut to K; at the limit, a sampled token that sorts K-th is
  left out (K - 1 candidates): it may be a token from outside the K.
* A 2xx body that reports an error instead of a completion raises
  :class:`ErrorInBody` (its code read as an HTTP status where it is one):
  a top-level ``error`` object (OpenRouter and proxies answer an upstream
  failure so), or a choice that ended in one (``finish_reason: "error"``
  and/or ``choices[0].error``, OpenRouter's mid-generation error), whatever
  text came before it. So does a choice the server aborted
  (``finish_reason: "abort"``, vLLM's for a request it stopped before its
  end: shutting down, out of room), as a transient one (code 503): what it
  holds is the start of an answer, not the answer.
* A chat message without content whose ``refusal`` is set (OpenAI's
  refusals) raises :class:`ModelRefusal`: a refusal is not the model's
  answer to the prompt, so it is never stored as an empty completion.
  Content null without a refusal (a reasoning model that spent its tokens
  thinking, a tool call) is the text ``""``, as it always was.
* Logprobs absent (``logprobs: null``, or chat ``logprobs.content: null`` /
  text ``logprobs.top_logprobs: null``, which the schemas allow) give a
  generation without logprobs, not an error.
* A response body that is not what the API documents raises ``ValueError``
  (the backend turns it into a typed error naming the endpoint);
  :func:`retry_after_seconds`, :func:`server_message`, :func:`error_code`
  and :func:`status_of_code` read what a server's refusal says.
"""

from __future__ import annotations

import dataclasses
import email.utils
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from inference.backends.base import EngineRequest, Generation
from store import logprobs
from store.descriptor import ModelDescriptor
from store.errors import (
    InvalidInputError,
)
from store.logprobs import PositionLogprobs, TokenLogprob

log = logging.getLogger("judgestore.hosted")

# Settings :func:`request_body` sets itself: an unknown sampling setting may not take these names.
RESERVED_BODY_KEYS = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "stream",
        "stream_options",
        "n",
        "logprobs",
        "top_logprobs",
        "max_completion_tokens",
        "provider",
        "chat_template_kwargs",
    }
)
# Sampling settings sent only when they differ from these values (except to a vllm-server: always).
_NEUTRAL: tuple[tuple[str, float], ...] = (
    ("top_p", 1.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("top_k", 0),
    ("min_p", 0.0),
    ("repetition_penalty", 1.0),
)
MODEL_MISSING_HINTS = ("does not exist", "not found", "not a valid model", "invalid model", "unknown model", "no such")


def messages_of(request: EngineRequest, input_mode: str) -> Any:
    expected = "messages" if input_mode == "chat" else "text"
    if request.rendered.get("type") != expected:
        raise InvalidInputError(
            f"a {request.rendered.get('type')!r} input cannot go to a model whose input mode is {input_mode!r}"
        )
    return request.rendered[expected]


VLLM_MAX_LOGPROBS = 20  # the most logprobs a vLLM server gives by default (its --max-logprobs)


def request_body(descriptor: ModelDescriptor, request: EngineRequest) -> dict[str, Any]:
    """The JSON body sent for ``request`` under ``descriptor`` (see the module docstring)."""
    chat = descriptor.input_mode == "chat"
    body: dict[str, Any] = {"model": descriptor.model}
    body["messages" if chat else "prompt"] = messages_of(request, descriptor.input_mode)
    sampling = descriptor.sampling
    always = descriptor.provider == "vllm-server"
    body["temperature"] = sampling.temperature
    if sampling.max_tokens is not None:
        body["max_completion_tokens" if chat and descriptor.provider == "openai" else "max_tokens"] = (
            sampling.max_tokens
        )
    for name, neutral in _NEUTRAL:
        value = getattr(sampling, name)
        if always or value != neutral:
            body[name] = value
    if sampling.seed is not None:
        body["seed"] = sampling.seed + request.sample_index
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.logprobs is not None:
        if chat:
            more = descriptor.provider == "vllm-server" and sampling.logprobs < VLLM_MAX_LOGPROBS  # the docstring
            body["logprobs"], body["top_logprobs"] = True, sampling.logprobs + (1 if more else 0)
        else:
            body["logprobs"] = sampling.logprobs
    body.update(sampling.model_extra or {})
    if descriptor.routing:
        body["provider"] = descriptor.routing
    if chat and (descriptor.chat_template_kwargs or descriptor.enable_thinking is not None):
        kwargs = dict(descriptor.chat_template_kwargs)
        if descriptor.enable_thinking is not None:
            kwargs["enable_thinking"] = descriptor.enable_thinking
        body["chat_template_kwargs"] = kwargs
    return body


# ------------------------------------------------------------------ responses


class ErrorInBody(Exception):
    """A 2xx body that reports an error where a completion should be (see the module docstring).

    ``where`` is ``"response"`` (a top-level ``error``) or ``"choices[0]"``;
    ``error`` the error as the server wrote it, ``code`` its code (or type),
    ``status`` that code as an HTTP status (None when it is not one),
    ``message`` its text.
    """

    def __init__(self, where: str, error: Any) -> None:
        self.where, self.error = where, error
        self.code = error_code(error)
        self.status = status_of_code(self.code)
        self.message = server_message(error, "no message")
        super().__init__(f"{where}.error (code {self.code!r}): {self.message}")


class ModelRefusal(Exception):
    """A chat message without content whose ``refusal`` holds the model's refusal (``text``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


def _get(value: Any, key: str, kind: type | tuple[type, ...], where: str, *, optional: bool = False) -> Any:
    item = value.get(key) if isinstance(value, dict) else None
    if item is None and optional:
        return None
    if not isinstance(item, kind) or (isinstance(item, bool) and kind is not bool):
        raise ValueError(f"{where}.{key} is {type(item).__name__}, not {getattr(kind, '__name__', kind)}")
    return item


def _rank_of(token: TokenLogprob, candidates: Sequence[TokenLogprob]) -> int | None:
    for candidate in candidates:
        if (candidate.text, candidate.bytes, candidate.logprob) == (token.text, token.bytes, token.logprob):
            return candidate.rank
    return None


def _bytes_of(entry: dict[str, Any], where: str) -> tuple[int, ...] | None:
    raw = entry.get("bytes")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in raw):
        raise ValueError(f"{where}.bytes is not a list of integers")
    return tuple(raw)


def _chat_token(entry: Any, rank: int | None, where: str) -> TokenLogprob:
    return TokenLogprob(
        _get(entry, "token", str, where),
        float(_get(entry, "logprob", (int, float), where)),
        None,
        rank,
        _bytes_of(entry, where),
    )


def _best(listed: Sequence[TokenLogprob], keep: int) -> tuple[TokenLogprob, ...]:
    """The ``keep`` best of ``listed`` ranked 1, 2, ... (stable: equal logprobs keep the server's order)."""
    ordered = sorted(listed, key=lambda token: -token.logprob)[:keep]
    return tuple(dataclasses.replace(token, rank=rank) for rank, token in enumerate(ordered, 1))


def chat_position(
    entry: Any, keep: int, where: str = "logprobs.content[0]", *, sampled_first: bool = False
) -> PositionLogprobs:
    """One position of chat ``logprobs.content``: the ``keep`` best of its ``top_logprobs``, and the sampled
    token. ``sampled_first``: a vLLM server's list cut at ``keep`` (asked for no more, at its limit), its first
    entry the sampled token, which sorted last may be the K-th candidate or a token outside the K that pushed the
    K-th out: it is left out (K - 1 candidates, each sure), not stored as rank K."""
    top = _get(entry, "top_logprobs", list, where, optional=True) or []
    listed = [_chat_token(t, None, f"{where}.top_logprobs[{i}]") for i, t in enumerate(top)]
    sampled = _chat_token(entry, None, where)
    candidates = _best(listed, keep)
    if sampled_first and len(listed) >= keep > 1 and _rank_of(sampled, candidates) == keep == len(candidates):
        candidates = candidates[:-1]
    return PositionLogprobs(candidates, dataclasses.replace(sampled, rank=_rank_of(sampled, candidates)))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any, where: str) -> float:
    """``value`` as a logprob; anything but a number (null, a string) is a malformed body, not a TypeError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {type(value).__name__}, not a number")
    return float(value)


def text_position(tokens: list[Any], token_logprobs: list[Any], top: list[Any], i: int, keep: int) -> PositionLogprobs:
    """Position ``i`` of a text completion's ``logprobs``: the ``keep`` best of ``top_logprobs[i]`` ({text:
    logprob})."""
    where = f"logprobs.top_logprobs[{i}]"
    alternatives = top[i] if i < len(top) and top[i] is not None else {}
    if not isinstance(alternatives, dict):
        raise ValueError(f"{where} is not an object")
    listed = [TokenLogprob(str(text), _number(lp, f"{where}[{text!r}]")) for text, lp in alternatives.items()]
    candidates = _best(listed, keep)
    sampled = None
    if i < len(tokens) and i < len(token_logprobs) and token_logprobs[i] is not None:
        token = TokenLogprob(str(tokens[i]), _number(token_logprobs[i], f"logprobs.token_logprobs[{i}]"))
        sampled = dataclasses.replace(token, rank=_rank_of(token, candidates))
    return PositionLogprobs(candidates, sampled)


def generation_from_body(descriptor: ModelDescriptor, data: Any) -> Generation:
    """A :class:`Generation` from a decoded response body.

    A body reporting an error raises :class:`ErrorInBody`, a refusal
    :class:`ModelRefusal`; anything else
    that is not a completion raises ``ValueError``, which the backend
    reports as a :class:`~store.errors.HostedResponseError` naming the
    endpoint.
    """
    chat = descriptor.input_mode == "chat"
    if isinstance(data, dict) and data.get("error"):
        raise ErrorInBody("response", data["error"])
    choices = _get(data, "choices", list, "response")
    if not choices:
        raise ValueError("response.choices is empty")
    choice = choices[0]
    if isinstance(choice, dict) and (choice.get("finish_reason") == "error" or choice.get("error")):
        # OpenRouter's mid-generation error: the text before it (often '') is not an answer to store.
        raise ErrorInBody("choices[0]", choice.get("error") or {})
    if isinstance(choice, dict) and choice.get("finish_reason") == "abort":
        raise ErrorInBody("choices[0]", {"code": 503, "message": "the server aborted the generation before its end"})
    if chat:
        message = _get(choice, "message", dict, "choices[0]")
        text = _get(message, "content", str, "choices[0].message", optional=True) or ""
        refusal = message.get("refusal")
        if not text and isinstance(refusal, str) and refusal:
            raise ModelRefusal(refusal)
    else:
        text = _get(choice, "text", str, "choices[0]")
    finish_reason = _get(choice, "finish_reason", str, "choices[0]", optional=True)
    usage: dict[str, int | float] = {}
    raw_usage = data.get("usage")
    if isinstance(raw_usage, dict):
        usage = {k: raw_usage[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(raw_usage.get(k), int)}
    top: dict[str, Any] | None = None
    if descriptor.sampling.logprobs is not None:
        raw = choice.get("logprobs")
        first = descriptor.logprob_positions == "first"
        positions: list[PositionLogprobs] | None = None
        listed = "content" if chat else "top_logprobs"
        if isinstance(raw, dict) and listed in raw and raw[listed] is None:
            pass  # the schemas allow null here: no logprobs, as for logprobs null (the backend warns once)
        elif chat and isinstance(raw, dict) and isinstance(raw.get("content"), list):
            content = raw["content"][:1] if first else raw["content"]
            keep = descriptor.sampling.logprobs
            at_limit = descriptor.provider == "vllm-server" and keep >= VLLM_MAX_LOGPROBS  # asked no more than K
            positions = [
                chat_position(e, keep, f"logprobs.content[{i}]", sampled_first=at_limit) for i, e in enumerate(content)
            ]
        elif not chat and isinstance(raw, dict) and isinstance(raw.get("top_logprobs"), list):
            tokens, lps, alternatives = _list(raw.get("tokens")), _list(raw.get("token_logprobs")), raw["top_logprobs"]
            count = min(1, len(alternatives)) if first else len(alternatives)
            keep = descriptor.sampling.logprobs
            positions = [text_position(tokens, lps, alternatives, i, keep) for i in range(count)]
        elif raw is not None:
            raise ValueError("choices[0].logprobs is not the shape the API documents")
        if positions is not None:
            top = logprobs.encode(positions)
    return Generation(text=text, finish_reason=finish_reason, usage=usage, top_logprobs=top)


# ------------------------------------------------------------------ errors


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The wait a server asks for: ``retry-after-ms``, else ``Retry-After`` in seconds or as an HTTP date."""
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None
    return None


def error_code(body: Any) -> Any:
    """The ``code`` of a server's error object, whether given as ``{"error": {...}}`` or as the inner object.

    The ``openai`` client hands over the inner one (``APIStatusError.body``);
    an error object without a code gives its ``type`` (OpenAI writes
    ``insufficient_quota`` in both).
    """
    if not isinstance(body, dict):
        return None
    inner = body["error"] if isinstance(body.get("error"), dict) else body
    code = inner.get("code")
    return code if code is not None else inner.get("type")


def status_of_code(code: Any) -> int | None:
    """An error code that is an HTTP status (OpenRouter and vLLM write one, a number or a string), else None."""
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        return code
    return None


def server_message(body: Any, fallback: str) -> str:
    """What an error body says, :func:`printable`."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return printable(inner["message"])
        if isinstance(inner, str):
            return printable(inner)
    return printable(body) if isinstance(body, str) and body else fallback


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # a terminal acts on them (tab and newline are kept)


def printable(text: str) -> str:
    """A server's text as a message may quote it: a terminal's control characters (an escape that clears the
    screen) shown as ``?``."""
    return _CONTROL.sub("?", text)


def request_body_keys(descriptor: ModelDescriptor) -> set[str]:
    """The names of the settings :func:`request_body` sends under ``descriptor`` (for messages)."""
    sample = {"type": "messages", "messages": []} if descriptor.input_mode == "chat" else {"type": "text", "text": ""}
    return set(request_body(descriptor, EngineRequest(sample))) - {"model", "messages", "prompt"}
