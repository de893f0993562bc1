"""Between LangChain's shapes and judgestore's: conversations and configs in as requests, answers out as messages.

Contract:

* Messages map to roles as :mod:`inference.messages` says (``human`` ->
  ``user``, ``ai`` -> ``assistant``, ``system``; tool messages and anything
  judgestore cannot key are refused with
  :class:`~store.errors.UnsupportedMessageError`), so a conversation keys
  exactly as the same :class:`~inference.requests.CompletionRequest` does.
  A model with ``input_mode="text"`` takes a string (or one human message).
  :func:`requests_of` puts a conversation's typed error in its slot; the
  others go on.
* A row's metadata comes from the call's ``config["metadata"]``, one config
  per input in ``batch``: ``benchmark``, ``instruction_id`` and ``model``
  for completions; ``benchmark``, ``instruction_id``, ``model_a``,
  ``model_b``, ``judge`` and ``orientation`` for judgements
  (:data:`ROW_FIELDS`). Other keys are LangChain's and are ignored (one
  spelt almost like a row field, ``instruction_idd``, or a row field of the
  other role, ``model_a`` to a completions model, is warned of:
  :class:`MetadataKeyWarning`). As
  everywhere, metadata is never part of the key.
* Sampling is the spec's (it is part of the key): a call-time ``stop`` that
  differs from the spec's, or any other call-time setting
  (``temperature=...``), is refused with
  :class:`~store.errors.InvalidInputError` rather than ignored
  (:func:`check_call`).
* Each answer is an ``AIMessage`` (:func:`message_of`): ``content`` the
  text, ``usage_metadata`` the token counts when known (on a hit with
  ``"total_cost": 0``, as LangChain's own cache marks one), and
  ``response_metadata`` holding ``finish_reason``, ``model_name``, ``usage``
  (the stored usage, engine seconds included), ``judgestore`` (``cached``:
  hit or miss, ``input_hash``, ``descriptor_hash``, ``task``, ``role``) and,
  when the descriptor asks for logprobs, ``logprobs`` in OpenAI's
  ``{"content": [...]}`` shape (:func:`inference.logprob_views.openai_logprobs`).
  :func:`send` sends a batch's requests through the cache boundary
  (:func:`call`, under the call's ``max_concurrency`` when it sets one) and
  puts each answer, or its typed error, in its slot (:func:`answer`); an
  input repeated in one batch at a random sampling gets a sample of its own
  each time, as a model without a cache answers (``sample_repeats``). In
  mode ``replay`` an input the store does not hold is such a failure, its
  :class:`~store.errors.CacheMissError` in its slot, saying how many inputs
  of the call were missing; the others are answered from the same lookup
  (the error carries them).
  A ``generate`` call's ``LLMResult`` carries what the call did in its
  ``llm_output["judgestore"]`` (:func:`result_of`).
* Only :mod:`inference.langchain` imports this module, after it checked that
  ``langchain-core`` is installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult, RunInfo
from langchain_core.runnables import RunnableConfig

from inference.cache.accounting import CallStats
from inference.cache.model import CachedModel, Responses
from inference.logprob_views import openai_logprobs
from inference.messages import chat_messages, text_prompt
from inference.requests import CompletionRequest, JudgementRequest, Request, Response
from inference.sampling import random_sampling
from store.caller import warn_the_caller
from store.descriptor import ModelDescriptor
from store.errors import CacheMissError, InvalidInputError, RequestsFailedError
from store.roles import Role
from store.spelling import meant

# The row metadata a call's config may carry, per role (everything else in it is LangChain's).
ROW_FIELDS: Mapping[Role, tuple[str, ...]] = {
    "completions": ("benchmark", "instruction_id", "model"),
    "judgements": ("benchmark", "instruction_id", "model_a", "model_b", "judge", "orientation"),
}

Outcome = AIMessage | Exception


def check_call(descriptor: ModelDescriptor, stop: list[str] | None, kwargs: Mapping[str, Any]) -> None:
    """Refuse call-time sampling: it would change the output without changing the key."""
    if stop is not None and list(stop) != list(descriptor.sampling.stop or []):
        raise InvalidInputError(
            f"stop={stop!r} at call time, but this model's descriptor has stop={descriptor.sampling.stop!r}: "
            "sampling is part of the cache key, so set it on the spec (sampling={'stop': [...]})"
        )
    if kwargs:
        raise InvalidInputError(
            f"call-time settings {sorted(kwargs)} are not supported: sampling is part of the cache key, so set it "
            "on the spec (ModelSpec(sampling={...}) / HostedSpec(sampling={...}))"
        )


def requests_of(
    conversations: Sequence[Sequence[BaseMessage]],
    metadatas: Sequence[Mapping[str, Any] | None],
    role: Role,
    *,
    chat: bool,
) -> tuple[list[tuple[int, Request]], list[Outcome | None]]:
    """The requests of the conversations that convert (with their index), and a slot per conversation.

    A conversation that cannot be keyed gets its typed error in its slot; the others go on.
    """
    outcomes: list[Outcome | None] = [None] * len(conversations)
    requests: list[tuple[int, Request]] = []
    for i, (conversation, metadata) in enumerate(zip(conversations, metadatas, strict=True)):
        fields = {k: v for k, v in (metadata or {}).items() if k in ROW_FIELDS[role]}
        _warn_of_near_misses(metadata or {}, role)
        try:
            prompt: dict[str, Any] = (
                {"messages": chat_messages(conversation)} if chat else {"text": text_prompt(conversation)}
            )
            request: Request = (
                CompletionRequest(**prompt, **fields) if role == "completions" else JudgementRequest(**prompt, **fields)
            )
        except InvalidInputError as e:
            outcomes[i] = e
            continue
        requests.append((i, request))
    return requests, outcomes


class MetadataKeyWarning(UserWarning):
    """A config metadata key that is not a row field of the model's role but spelt almost like one, or one of the
    other role's (not stored: LangChain's)."""


def _warn_of_near_misses(metadata: Mapping[str, Any], role: Role) -> None:
    """Warn of a key spelt almost like a row field (``instruction_idd``), or that is a row field of the other
    role (``model_a`` to a completions model): LangChain's keys are left alone, so such a key would otherwise be
    lost silently."""
    other: Role = "judgements" if role == "completions" else "completions"
    for key in metadata:
        if key in ROW_FIELDS[role] or not isinstance(key, str):
            continue
        if key in ROW_FIELDS[other]:  # a judge's model_a sent to a completions model: its verdict would lose them
            advice = (
                "a judge's model is built with role='judgements'"
                if role == "completions"
                else "a judgement names the models it judged as model_a (and model_b)"
            )
            warn_the_caller(
                f"config metadata key {key!r} is a {other} row field, not a {role} one, so it is not stored; {advice}",
                MetadataKeyWarning,
            )
            continue
        close = meant(key, ROW_FIELDS[role])
        if close is not None:
            warn_the_caller(
                f"config metadata key {key!r} is not a {role} row field, so it is not stored; did you mean {close!r}?",
                MetadataKeyWarning,
            )


def send(
    model: CachedModel,
    role: Role,
    requests: Sequence[tuple[int, Request]],
    outcomes: list[Outcome | None],
    max_concurrency: int | None = None,
) -> CallStats | None:
    """Answer the requests into their slots of ``outcomes`` (:func:`answer`) through one call; that call's stats.

    In mode ``replay``, a request the store does not hold gets its :class:`~store.errors.CacheMissError` in its
    slot and the others are answered from the same lookup (:func:`replay_misses`).
    """
    try:
        responses = call(model, role, requests, max_concurrency)
    except CacheMissError as e:
        replay_misses(e, requests, outcomes, model, role)
        return None
    answer(requests, outcomes, responses, model, role)
    return responses.run


async def asend(
    model: CachedModel,
    role: Role,
    requests: Sequence[tuple[int, Request]],
    outcomes: list[Outcome | None],
    max_concurrency: int | None = None,
) -> CallStats | None:
    """:func:`send` off the event loop (the answers' messages too: 10,000 of them held it for seconds)."""
    try:
        responses = await acall(model, role, requests, max_concurrency)
    except CacheMissError as e:
        await asyncio.to_thread(replay_misses, e, requests, outcomes, model, role)
        return None
    await asyncio.to_thread(answer, requests, outcomes, responses, model, role)
    return responses.run


def replay_misses(
    error: CacheMissError,
    requests: Sequence[tuple[int, Request]],
    outcomes: list[Outcome | None],
    model: CachedModel,
    role: Role,
) -> None:
    """A replay call's misses, each with an error saying how many of the call's inputs were missing (so the first
    one raised says it too), and its hits, which the error carries from the same lookup, in their slots."""
    absent = set(error.missing_requests)
    if not absent or len(error.responses) != len(requests):  # it names no request: the call's failure
        raise error
    found = []
    for j, (i, request) in enumerate(requests):
        if j not in absent:
            found.append(((i, request), error.responses[j]))
            continue
        miss = CacheMissError(
            f"replay mode: {len(absent)} of the {len(requests)} inputs of this call are not in the store, "
            f"this one ({request.describe()}) among them. Run once in mode 'use' to fill the store"
        )
        miss.__cause__ = error
        outcomes[i] = miss
    answer([r for r, _ in found], outcomes, [response for _, response in found], model, role)


def call(
    model: CachedModel, role: Role, requests: Sequence[tuple[int, Request]], max_concurrency: int | None = None
) -> Responses:
    """The requests through the cache boundary as one batch, each repeat its own sample at a random sampling (as
    LangChain's own batch, one call per input, answers them); a call some of whose requests failed still returns
    every response (the failed ones with their error)."""
    batch = [r for _, r in requests]
    repeats = random_sampling(model.descriptor.sampling)
    try:
        if role == "completions":
            return model.complete(
                cast(list[CompletionRequest], batch), max_concurrency=max_concurrency, sample_repeats=repeats
            )
        return model.judge(cast(list[JudgementRequest], batch), max_concurrency=max_concurrency, sample_repeats=repeats)
    except RequestsFailedError as e:  # every answer is in it, the failed ones with their error
        return _responses(e)


async def acall(
    model: CachedModel, role: Role, requests: Sequence[tuple[int, Request]], max_concurrency: int | None = None
) -> Responses:
    """:func:`call` off the event loop."""
    batch = [r for _, r in requests]
    repeats = random_sampling(model.descriptor.sampling)
    try:
        if role == "completions":
            return await model.acomplete(
                cast(list[CompletionRequest], batch), max_concurrency=max_concurrency, sample_repeats=repeats
            )
        return await model.ajudge(
            cast(list[JudgementRequest], batch), max_concurrency=max_concurrency, sample_repeats=repeats
        )
    except RequestsFailedError as e:
        return _responses(e)


def _responses(error: RequestsFailedError) -> Responses:
    """The responses a failed call carries (every one answered or marked failed), with that call's summary."""
    responses = error.responses
    return responses if isinstance(responses, Responses) else Responses(responses)


def answer(
    requests: Sequence[tuple[int, Request]],
    outcomes: list[Outcome | None],
    responses: Sequence[Response],
    model: CachedModel,
    role: Role,
) -> None:
    """Put each request's answer in its slot: its ``AIMessage``, or its typed error."""
    for (i, _), response in zip(requests, responses, strict=True):
        error = response.error
        outcomes[i] = error if error is not None else message_of(response, model, role)


def message_of(response: Response, model: CachedModel, role: Role) -> AIMessage:
    """The ``AIMessage`` of one answered request (see the module docstring)."""
    sample = response.samples[0]
    usage = dict(sample.usage or {})
    metadata: dict[str, Any] = {
        "finish_reason": sample.finish_reason,
        "model_name": model.label,
        "usage": usage,
        "judgestore": {
            "cached": sample.cached,
            "input_hash": sample.input_hash,
            "descriptor_hash": model.descriptor_sha256,
            "task": model.task,
            "role": role,
        },
    }
    if sample.top_logprobs is not None:
        metadata["logprobs"] = openai_logprobs(sample.top_logprobs)
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    tokens = None
    if isinstance(prompt, int) and isinstance(completion, int):
        tokens = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
        if sample.cached:  # as LangChain's own cache marks a hit: the tokens it had cost, and nothing spent now
            tokens["total_cost"] = 0
    return AIMessage(content=sample.text, response_metadata=metadata, usage_metadata=tokens)


def call_configs(
    count: int, callbacks: Any, tags: Any, metadata: Any, run_name: Any, run_id: Any
) -> list[RunnableConfig]:
    """One config per conversation of a ``generate`` call; a given run id names the first run, as LangChain does."""
    config = RunnableConfig(callbacks=callbacks, tags=tags or [], metadata=metadata or {}, run_name=run_name)
    return [RunnableConfig(**config, run_id=run_id) if i == 0 and run_id else config for i in range(count)]


def raise_first(outcomes: Sequence[Outcome]) -> list[AIMessage]:
    """The answers, or the first failure among them raised."""
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    return cast(list[AIMessage], list(outcomes))


def result_of(messages: Sequence[AIMessage], managers: Sequence[Any], run: CallStats | None) -> LLMResult:
    """A ``generate`` call's ``LLMResult``: a generation per conversation, what the call did in ``llm_output``."""
    llm_output: dict[str, Any] = {}
    if run is not None and run.plan is not None:
        llm_output["judgestore"] = {
            "plan": run.plan.summary(),
            "hits": run.plan.hits,
            "misses": run.plan.misses,
            "generated": run.generated,
            "written": run.written,
            "engine_loaded": run.engine_loaded,
            "seconds": round(run.seconds, 6),
        }
    return LLMResult(
        generations=[[ChatGeneration(message=m)] for m in messages],
        llm_output=llm_output or None,
        run=[RunInfo(run_id=m.run_id) for m in managers],
    )
