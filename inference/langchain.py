"""A LangChain chat model in front of judgestore: evaluation code that calls ``.batch`` keeps its call sites.

Contract:

* :class:`CachedChatModel` is a real ``langchain_core`` ``BaseChatModel``
  over a :class:`~inference.spec.ModelSpec` or
  :class:`~inference.spec.HostedSpec` and a store (or over a
  :class:`~inference.cache.model.CachedModel` already built). Its ``role``
  (``completions``, or ``judgements`` for a judge) picks the store's role
  root. ``langchain-core`` is the optional extra ``langchain``; this is the
  only module that imports it.
* ``batch`` / ``abatch`` send the whole batch through one plan of the cache
  boundary: hits answered from the store, the misses in one engine call (a
  hosted model's concurrently, ``max_concurrency`` at once), never one call
  per input in threads. ``invoke``, ``ainvoke`` and ``generate`` go the same
  way; ``abatch`` and ``ainvoke`` run it off the event loop
  (:meth:`~inference.cache.model.CachedModel.acomplete`). ``stream`` yields the
  whole answer as one chunk (a hit streams its stored text; the engine does
  not stream). A config's ``max_concurrency`` does not split the batch: a
  hosted model's own ``max_concurrency`` bounds its requests in flight.
* Messages map to roles as :mod:`inference.messages` says (``human`` ->
  ``user``, ``ai`` -> ``assistant``, ``system``; tool messages and anything
  judgestore cannot key are refused with
  :class:`~store.errors.UnsupportedMessageError`), so a conversation keys
  exactly as the same :class:`~inference.requests.CompletionRequest` does.
  A model with ``input_mode="text"`` takes a string (or one human message).
* A row's metadata comes from the call's ``config["metadata"]``, one config
  per input in ``batch``: ``benchmark``, ``instruction_id`` and ``model``
  for completions; ``benchmark``, ``instruction_id``, ``model_a``,
  ``model_b``, ``judge`` and ``orientation`` for judgements. Other keys are
  LangChain's and are ignored. As everywhere, metadata is never part of the
  key.
* Sampling is the spec's (it is part of the key): a call-time ``stop`` that
  differs from the spec's, or any other call-time setting
  (``temperature=...``), is refused with
  :class:`~store.errors.InvalidInputError` rather than ignored.
* Each answer is an ``AIMessage``: ``content`` the text, ``usage_metadata``
  the token counts when known, and ``response_metadata`` holding
  ``finish_reason``, ``model_name``, ``usage`` (the stored usage, engine
  seconds included), ``judgestore`` (``cached``: hit or miss,
  ``input_hash``, ``descriptor_hash``, ``task``, ``role``) and, when the
  descriptor asks for logprobs, ``logprobs`` in OpenAI's
  ``{"content": [...]}`` shape (:func:`inference.logprob_views.openai_logprobs`).
* A request that fails (refused by the engine or server, or its row by the
  store) fails alone: ``batch(..., return_exceptions=True)`` puts its typed
  error in its place; otherwise the first such error is raised after the
  whole batch was answered and stored. ``generate`` (hence ``invoke``)
  raises it. Callbacks see one LLM run per input, started before the plan
  and ended (or errored) after it. LangChain's own ``cache`` is not
  consulted: the store is the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from inference.cache.accounting import CallStats
from inference.cache.model import CachedModel, Responses
from inference.cache.plan import Mode
from inference.logprob_views import openai_logprobs
from inference.messages import chat_messages, text_prompt
from inference.requests import CompletionRequest, JudgementRequest, Request, Response
from inference.spec import Spec
from store.errors import InvalidInputError, MissingDependencyError, RequestsFailedError, install_hint
from store.layout import Role
from store.store import Store

try:
    from langchain_core.callbacks import (
        AsyncCallbackManager,
        AsyncCallbackManagerForLLMRun,
        CallbackManager,
        CallbackManagerForLLMRun,
    )
    from langchain_core.language_models import BaseChatModel, LanguageModelInput
    from langchain_core.load import dumpd
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult, RunInfo
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import get_config_list
    from pydantic import ConfigDict, model_validator
except ImportError as e:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError(
        "inference.langchain needs langchain-core: " + install_hint("langchain", "'langchain-core>=1.0'")
    ) from e

# The row metadata a call's config may carry, per role (everything else in it is LangChain's).
ROW_FIELDS: Mapping[Role, tuple[str, ...]] = {
    "completions": ("benchmark", "instruction_id", "model"),
    "judgements": ("benchmark", "instruction_id", "model_a", "model_b", "judge", "orientation"),
}

Outcome = AIMessage | Exception


class CachedChatModel(BaseChatModel):
    """A chat model whose answers come from judgestore's store when it holds them; see the module docstring.

    Build it from a spec and a store (``CachedChatModel(spec=..., store=...,
    task="arena", role="judgements")``), or around a
    :class:`~inference.cache.model.CachedModel` (``CachedChatModel(cached=...)``).
    The engine is prepared only when a batch has misses; :meth:`close` (or
    ``with``) releases it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: Spec | None = None
    store: Store | None = None
    task: str | None = None
    role: Literal["completions", "judgements"] = "completions"
    mode: Mode = "use"
    cached: CachedModel | None = None

    @model_validator(mode="after")
    def _build_cached(self) -> CachedChatModel:
        if (self.spec is None) == (self.cached is None):
            raise InvalidInputError(
                "CachedChatModel takes a spec (with a store and a task) or a cached model, not both"
            )
        if self.cached is None:
            assert self.spec is not None
            if not self.task:
                raise InvalidInputError("CachedChatModel(spec=...) needs task=, the task its rows are stored under")
            self.cached = self.spec.cached(self.store, task=self.task, mode=self.mode)
        return self

    # ------------------------------------------------------------ LangChain's hooks

    @property
    def _llm_type(self) -> str:
        return "judgestore"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        model = self._model
        return {
            "model_name": model.label,
            "descriptor_hash": model.descriptor.hash16(),
            "task": model.task,
            "role": self.role,
            "mode": model.mode,
        }

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = self._one(messages, stop, run_manager, kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = self._one(messages, stop, run_manager, kwargs)
        chunk = AIMessageChunk(
            content=message.content,
            response_metadata=message.response_metadata,
            usage_metadata=message.usage_metadata,
            chunk_position="last",
        )
        if run_manager is not None:
            run_manager.on_llm_new_token(message.text, chunk=ChatGenerationChunk(message=chunk))
        yield ChatGenerationChunk(message=chunk)

    # ------------------------------------------------------------ one plan per call

    def generate(
        self,
        messages: list[list[BaseMessage]],
        stop: list[str] | None = None,
        callbacks: Any = None,
        *,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        run_name: str | None = None,
        run_id: Any = None,
        **kwargs: Any,
    ) -> LLMResult:
        """Every conversation through one plan (``invoke`` comes here too); raises the first failure."""
        configs = _configs(len(messages), callbacks, tags, metadata, run_name, run_id)
        outcomes, managers, run = self._with_callbacks(messages, configs, stop, kwargs)
        return _result(_raise_first(outcomes), managers, run)

    async def agenerate(
        self,
        messages: list[list[BaseMessage]],
        stop: list[str] | None = None,
        callbacks: Any = None,
        *,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        run_name: str | None = None,
        run_id: Any = None,
        **kwargs: Any,
    ) -> LLMResult:
        """:meth:`generate` off the event loop (``ainvoke`` comes here)."""
        configs = _configs(len(messages), callbacks, tags, metadata, run_name, run_id)
        outcomes, managers, run = await self._awith_callbacks(messages, configs, stop, kwargs)
        return _result(_raise_first(outcomes), managers, run)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """One plan for the whole batch; with ``return_exceptions``, a failed input's error in its place."""
        if not inputs:
            return []
        conversations = [self._convert_input(i).to_messages() for i in inputs]
        stop = kwargs.pop("stop", None)
        outcomes, _, _ = self._with_callbacks(conversations, get_config_list(config, len(inputs)), stop, kwargs)
        return cast(list[AIMessage], outcomes if return_exceptions else _raise_first(outcomes))

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """:meth:`batch` with the plan, the store and the engine off the event loop."""
        if not inputs:
            return []
        conversations = [self._convert_input(i).to_messages() for i in inputs]
        stop = kwargs.pop("stop", None)
        configs = get_config_list(config, len(inputs))
        outcomes, _, _ = await self._awith_callbacks(conversations, configs, stop, kwargs)
        return cast(list[AIMessage], outcomes if return_exceptions else _raise_first(outcomes))

    # ------------------------------------------------------------ lifecycle

    @property
    def _model(self) -> CachedModel:
        assert self.cached is not None  # set by the validator
        return self.cached

    @property
    def last_run(self) -> CallStats:
        """What the latest call did (the cache boundary's ``last``; concurrent calls share it)."""
        return self._model.last

    def close(self) -> None:
        """Release the engine, if a batch prepared one."""
        self._model.close()

    def __enter__(self) -> CachedChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CachedChatModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------ the work

    def _one(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | None,
        kwargs: Mapping[str, Any],
    ) -> AIMessage:
        """One conversation, for LangChain's own single-input paths (``stream``); its run manager is LangChain's."""
        self._check_call(stop, kwargs)
        metadata = dict(run_manager.metadata) if run_manager is not None else {}
        requests, outcomes = self._requests([messages], [metadata])
        if requests:
            self._answer(requests, outcomes, self._call(requests))
        (outcome,) = outcomes
        if isinstance(outcome, Exception):
            raise outcome
        assert outcome is not None
        return outcome

    def _with_callbacks(
        self,
        conversations: Sequence[Sequence[BaseMessage]],
        configs: Sequence[RunnableConfig],
        stop: list[str] | None,
        kwargs: Mapping[str, Any],
    ) -> tuple[list[Outcome], list[CallbackManagerForLLMRun], CallStats | None]:
        self._check_call(stop, kwargs)
        serialized, params = dumpd(self), self._invocation_params(stop)
        managers = []
        for conversation, config in zip(conversations, configs, strict=True):
            manager = CallbackManager.configure(
                config.get("callbacks"),
                self.callbacks,
                self.verbose,
                config.get("tags"),
                self.tags,
                config.get("metadata"),
                self.metadata,
            )
            (run,) = manager.on_chat_model_start(
                serialized,
                [list(conversation)],
                invocation_params=params,
                options={"stop": stop},
                name=config.get("run_name"),
                run_id=config.get("run_id"),
                batch_size=len(conversations),
            )
            managers.append(run)
        try:
            requests, outcomes = self._requests(conversations, [c.get("metadata") for c in configs])
            responses = self._call(requests) if requests else None
            if responses is not None:
                self._answer(requests, outcomes, responses)
        except BaseException as e:
            for run in managers:
                run.on_llm_error(e)
            raise
        for run, outcome in zip(managers, outcomes, strict=True):
            if isinstance(outcome, Exception):
                run.on_llm_error(outcome)
            else:
                run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=outcome)]]))
        return cast(list[Outcome], outcomes), managers, None if responses is None else responses.run

    async def _awith_callbacks(
        self,
        conversations: Sequence[Sequence[BaseMessage]],
        configs: Sequence[RunnableConfig],
        stop: list[str] | None,
        kwargs: Mapping[str, Any],
    ) -> tuple[list[Outcome], list[AsyncCallbackManagerForLLMRun], CallStats | None]:
        self._check_call(stop, kwargs)
        serialized, params = dumpd(self), self._invocation_params(stop)
        managers = []
        for conversation, config in zip(conversations, configs, strict=True):
            manager = AsyncCallbackManager.configure(
                config.get("callbacks"),
                self.callbacks,
                self.verbose,
                config.get("tags"),
                self.tags,
                config.get("metadata"),
                self.metadata,
            )
            (run,) = await manager.on_chat_model_start(
                serialized,
                [list(conversation)],
                invocation_params=params,
                options={"stop": stop},
                name=config.get("run_name"),
                run_id=config.get("run_id"),
                batch_size=len(conversations),
            )
            managers.append(run)
        try:
            requests, outcomes = self._requests(conversations, [c.get("metadata") for c in configs])
            responses = await self._acall(requests) if requests else None
            if responses is not None:
                self._answer(requests, outcomes, responses)
        except BaseException as e:
            for run in managers:
                await run.on_llm_error(e)
            raise
        for run, outcome in zip(managers, outcomes, strict=True):
            if isinstance(outcome, Exception):
                await run.on_llm_error(outcome)
            else:
                await run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=outcome)]]))
        return cast(list[Outcome], outcomes), managers, None if responses is None else responses.run

    def _check_call(self, stop: list[str] | None, kwargs: Mapping[str, Any]) -> None:
        """Refuse call-time sampling: it would change the output without changing the key."""
        descriptor = self._model.descriptor
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

    def _invocation_params(self, stop: list[str] | None) -> dict[str, Any]:
        return {**self._identifying_params, "_type": self._llm_type, "stop": stop}

    def _requests(
        self, conversations: Sequence[Sequence[BaseMessage]], metadatas: Sequence[Mapping[str, Any] | None]
    ) -> tuple[list[tuple[int, Request]], list[Outcome | None]]:
        """The requests of the conversations that convert (with their index), and a slot per conversation.

        A conversation that cannot be keyed gets its typed error in its slot; the others go on.
        """
        outcomes: list[Outcome | None] = [None] * len(conversations)
        requests: list[tuple[int, Request]] = []
        chat = self._model.descriptor.input_mode == "chat"
        for i, (conversation, metadata) in enumerate(zip(conversations, metadatas, strict=True)):
            fields = {k: v for k, v in (metadata or {}).items() if k in ROW_FIELDS[self.role]}
            try:
                prompt: dict[str, Any] = (
                    {"messages": chat_messages(conversation)} if chat else {"text": text_prompt(conversation)}
                )
                request: Request = (
                    CompletionRequest(**prompt, **fields)
                    if self.role == "completions"
                    else JudgementRequest(**prompt, **fields)
                )
            except InvalidInputError as e:
                outcomes[i] = e
                continue
            requests.append((i, request))
        return requests, outcomes

    def _call(self, requests: Sequence[tuple[int, Request]]) -> Responses:
        model, batch = self._model, [r for _, r in requests]
        try:
            if self.role == "completions":
                return model.complete(cast(list[CompletionRequest], batch))
            return model.judge(cast(list[JudgementRequest], batch))
        except RequestsFailedError as e:  # every answer is in it, the failed ones with their error
            return _responses(e)

    async def _acall(self, requests: Sequence[tuple[int, Request]]) -> Responses:
        model, batch = self._model, [r for _, r in requests]
        try:
            if self.role == "completions":
                return await model.acomplete(cast(list[CompletionRequest], batch))
            return await model.ajudge(cast(list[JudgementRequest], batch))
        except RequestsFailedError as e:
            return _responses(e)

    def _answer(
        self, requests: Sequence[tuple[int, Request]], outcomes: list[Outcome | None], responses: Sequence[Response]
    ) -> None:
        for (i, _), response in zip(requests, responses, strict=True):
            error = response.error
            outcomes[i] = error if error is not None else self._message(response)

    def _message(self, response: Response) -> AIMessage:
        sample, model = response.samples[0], self._model
        usage = dict(sample.usage or {})
        metadata: dict[str, Any] = {
            "finish_reason": sample.finish_reason,
            "model_name": model.label,
            "usage": usage,
            "judgestore": {
                "cached": sample.cached,
                "input_hash": sample.input_hash,
                "descriptor_hash": model.descriptor.sha256(),
                "task": model.task,
                "role": self.role,
            },
        }
        if sample.top_logprobs is not None:
            metadata["logprobs"] = openai_logprobs(sample.top_logprobs)
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        tokens = None
        if isinstance(prompt, int) and isinstance(completion, int):
            tokens = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
        return AIMessage(content=sample.text, response_metadata=metadata, usage_metadata=tokens)


def _configs(count: int, callbacks: Any, tags: Any, metadata: Any, run_name: Any, run_id: Any) -> list[RunnableConfig]:
    """One config per conversation of a ``generate`` call; a given run id names the first run, as LangChain does."""
    config = RunnableConfig(callbacks=callbacks, tags=tags or [], metadata=metadata or {}, run_name=run_name)
    return [RunnableConfig(**config, run_id=run_id) if i == 0 and run_id else config for i in range(count)]


def _responses(error: RequestsFailedError) -> Responses:
    """The responses a failed call carries (every one answered or marked failed), with that call's summary."""
    responses = error.responses
    return responses if isinstance(responses, Responses) else Responses(responses)


def _raise_first(outcomes: Sequence[Outcome]) -> list[AIMessage]:
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    return cast(list[AIMessage], list(outcomes))


def _result(messages: Sequence[AIMessage], managers: Sequence[Any], run: CallStats | None) -> LLMResult:
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
