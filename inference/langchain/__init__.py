"""A LangChain chat model in front of judgestore: evaluation code that calls ``.batch`` keeps its call sites.

Contract:

* :class:`CachedChatModel` is a real ``langchain_core`` ``BaseChatModel``
  over a :class:`~inference.spec.ModelSpec` or
  :class:`~inference.spec.HostedSpec` and a store (or over a
  :class:`~inference.cache.model.CachedModel` already built). Its ``role``
  (``completions``, or ``judgements`` for a judge) picks the store's role
  root. ``langchain-core`` is the optional extra ``langchain``; this package
  is the only one that imports it, and checks it is installed before any of
  its modules does.
* ``batch`` / ``abatch`` send the whole batch through one plan of the cache
  boundary: hits answered from the store, the misses in one engine call (a
  hosted model's concurrently, ``max_concurrency`` at once), never one call
  per input in threads. ``invoke``, ``ainvoke`` and ``generate`` go the same
  way; ``abatch`` and ``ainvoke`` run it off the event loop
  (:meth:`~inference.cache.model.CachedModel.acomplete`). ``stream`` and
  ``astream`` yield the whole answer as one chunk (a hit streams its stored
  text; the engine does not stream), their row metadata from their config
  too. A hosted model's own ``max_concurrency`` bounds its requests in
  flight; a ``batch`` / ``abatch`` config's ``max_concurrency`` (the first
  config's, as LangChain reads it) bounds that call's lower still without
  splitting its plan (:func:`~inference.backends.base.check_bound`: an
  engine that cannot stream under it gets that many misses at a time); a
  bad one is an ``InvalidInputError`` before anything is sent.
* Messages, row metadata from each input's ``config["metadata"]``, the
  refusal of call-time sampling (it is part of the key) and the
  ``AIMessage`` of each answer are :mod:`inference.langchain.shapes`'s.
* A request that fails (refused by the engine or server, or its row by the
  store) fails alone: ``batch(..., return_exceptions=True)`` puts its typed
  error in its place; otherwise the first such error is raised after the
  whole batch was answered and stored. In mode ``replay`` an input the
  store does not hold is such a failure: its ``CacheMissError`` (saying how
  many inputs of the call were missing) in its slot, the hits answered from
  the store, no model called. As in LangChain's own ``batch``, an
  input that is no model input (``UnsupportedMessageError``) and a
  call-time setting (each input's failure) are in their slots too with
  ``return_exceptions``, else raised before anything is sent. ``generate``
  (hence ``invoke``) raises it. Every input is read as judgestore keys it
  (:func:`inference.messages.chat_messages`) before LangChain's own coercion,
  which would drop a dict's unknown keys: one it cannot key is refused
  before anything is sent, on every path. ``bind_tools`` and
  ``with_structured_output`` are refused (no tool call is text to key),
  and so is ``configurable_fields`` (fields are fixed once the model is
  built; ``configurable_alternatives`` picks between models built
  beforehand).
  Callbacks see one LLM run per input, started before the plan and ended
  (or errored) after it, each answer named after its run as LangChain's own
  ``generate`` names it (its ``id``); an input judgestore cannot key has its run too,
  started and ended in its error (showing LangChain's own reading of the
  input, if it has one), as LangChain ends a run whose generation raised.
  A call-time setting fails before any run. LangChain's own ``cache`` is
  not consulted: the store is the cache.
* The constructor takes its own fields and ``BaseChatModel``'s; anything
  else (``temperature=0.7``, a misspelt ``rol=``) and a wrong-typed value
  are an ``InvalidInputError`` (pydantic would drop the one silently and
  raise its own error for the other). ``output_version="v1"`` gives every
  path content blocks, as LangChain's own ``generate`` and ``stream`` do.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from inference.backends.base import check_bound
from inference.cache.accounting import CallStats
from inference.cache.model import CachedModel
from inference.cache.plan import Mode
from inference.messages import chat_messages
from inference.requests import Request
from inference.spec import Spec
from store import Store
from store.errors import (
    InvalidInputError,
    MissingDependencyError,
    UnsupportedMessageError,
    install_hint,
    invalid_values,
)

try:
    from langchain_core.callbacks import (
        AsyncCallbackManager,
        AsyncCallbackManagerForLLMRun,
        CallbackManager,
        CallbackManagerForLLMRun,
    )
    from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
    from langchain_core.load import dumpd
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
    from langchain_core.prompt_values import ChatPromptValue, PromptValue
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import ensure_config, get_config_list
    from langchain_core.utils.utils import LC_ID_PREFIX
    from pydantic import ConfigDict, ValidationError
except ImportError as e:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError(
        "inference.langchain needs langchain-core: " + install_hint("langchain", "'langchain-core>=1.0'")
    ) from e

# After the check above: the shapes module imports langchain-core as it loads.
from inference.langchain.shapes import (
    Outcome,
    asend,
    call_configs,
    check_call,
    raise_first,
    requests_of,
    result_of,
    send,
)

_NO_TOOLS = (
    "CachedChatModel keys text conversations: tools and structured output (bind_tools, with_structured_output) "
    "are not supported. Ask for the structure in the prompt and parse the text answer (a PydanticOutputParser in "
    "the chain)"
)

# The config metadata of the stream() / astream() call running in this context (LangChain's stream gives _stream no
# run manager to read it from).
_STREAM_METADATA: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "stream_metadata", default=None
)


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

    def __init__(self, **data: Any) -> None:
        known = {name for name, field in type(self).model_fields.items()} | {
            field.alias for field in type(self).model_fields.values() if field.alias
        }
        unknown = sorted(set(data) - known)
        if unknown:  # pydantic would drop them silently: temperature=0.7 would answer greedily
            raise InvalidInputError(
                f"CachedChatModel does not take {unknown}: sampling (temperature, max_tokens, stop, ...) is part of "
                "the cache key, so set it on the spec (ModelSpec(sampling={...}) / HostedSpec(sampling={...}))"
            )
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise InvalidInputError(f"CachedChatModel: {invalid_values(e)}") from None
        self._build_cached()  # here, not in a validator: pydantic would wrap its typed error in a ValidationError

    def _build_cached(self) -> None:
        if (self.spec is None) == (self.cached is None):
            raise InvalidInputError(
                "CachedChatModel takes a spec (with a store and a task) or a cached model, not both"
            )
        given = sorted({"store", "task", "mode"} & self.model_fields_set) if self.spec is None else []
        if given:  # the cached model has its own: these would be ignored
            raise InvalidInputError(
                f"CachedChatModel(cached=...) takes the cached model's store, task and mode; {given} would be ignored"
            )
        if self.cached is None:
            assert self.spec is not None
            if not self.task:
                raise InvalidInputError("CachedChatModel(spec=...) needs task=, the task its rows are stored under")
            self.cached = self.spec.cached(self.store, task=self.task, mode=self.mode)

    # ------------------------------------------------------------ LangChain's hooks

    @property
    def _llm_type(self) -> str:
        return "judgestore"

    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        """The input as judgestore keys it (:func:`inference.messages.chat_messages`), before LangChain's own
        coercion could drop what a dict carries (it moves unknown keys out of sight); what cannot be keyed is an
        :class:`UnsupportedMessageError` on every path (``invoke`` and ``stream`` too)."""
        kinds = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
        return ChatPromptValue(messages=[kinds[m["role"]](content=m["content"]) for m in chat_messages(model_input)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """Refused: a tool call is no text judgestore can key."""
        raise InvalidInputError(_NO_TOOLS)

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        """Refused: it works through tools or a provider's response format, which are not part of the key."""
        raise InvalidInputError(_NO_TOOLS)

    def configurable_fields(self, **kwargs: Any) -> Any:
        """Refused when it is asked, not at the first call: LangChain's configured copy would be built from this
        one's fields, its spec and its built cached model together (and its engine prepared anew per call)."""
        raise InvalidInputError(
            f"CachedChatModel's fields are fixed once it is built ({', '.join(sorted(kwargs)) or 'none given'} asked"
            " for): its spec is part of the cache key and its engine is prepared once. Build one CachedChatModel"
            " per setting and choose between them at run time with configurable_alternatives(ConfigurableField("
            "id=...), default_key=..., other=other_model)"
        )

    @property
    def _identifying_params(self) -> dict[str, Any]:
        model = self._model
        return {
            "model_name": model.label,
            "descriptor_hash": model.descriptor_sha256[:16],
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

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """LangChain's ``invoke``; an input judgestore cannot key has its run started and ended in its error."""
        self._keyable(input, ensure_config(config), stop)
        return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """LangChain's ``ainvoke``; an input judgestore cannot key has its run started and ended in its error."""
        await self._akeyable(input, ensure_config(config), stop)
        return await super().ainvoke(input, config, stop=stop, **kwargs)

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
        configs = call_configs(len(messages), callbacks, tags, metadata, run_name, run_id)
        outcomes, managers, run = self._with_callbacks(messages, configs, stop, kwargs)
        return result_of(raise_first(outcomes), managers, run)

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
        configs = call_configs(len(messages), callbacks, tags, metadata, run_name, run_id)
        outcomes, managers, run = await self._awith_callbacks(messages, configs, stop, kwargs)
        return result_of(raise_first(outcomes), managers, run)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """One plan for the whole batch; with ``return_exceptions``, a failed input's error in its place."""
        stop = kwargs.pop("stop", None)
        todo = self._batch_inputs(inputs, config, stop, kwargs, return_exceptions)
        for i in todo.refused:
            self._refused_run(inputs[i], todo.configs[i], stop, todo.slots[i], len(inputs))
        todo.raise_refused(return_exceptions)
        if todo.picked:
            outcomes, _, _ = self._with_callbacks(
                todo.conversations, [todo.configs[i] for i in todo.picked], stop, kwargs, todo.bound
            )
            for i, outcome in zip(todo.picked, outcomes, strict=True):
                todo.slots[i] = outcome
        slots = todo.slots
        return cast(list[AIMessage], slots if return_exceptions else raise_first(cast(list[Outcome], slots)))

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """:meth:`batch` with the plan, the store and the engine off the event loop."""
        stop = kwargs.pop("stop", None)
        todo = self._batch_inputs(inputs, config, stop, kwargs, return_exceptions)
        for i in todo.refused:
            await self._arefused_run(inputs[i], todo.configs[i], stop, todo.slots[i], len(inputs))
        todo.raise_refused(return_exceptions)
        if todo.picked:
            outcomes, _, _ = await self._awith_callbacks(
                todo.conversations, [todo.configs[i] for i in todo.picked], stop, kwargs, todo.bound
            )
            for i, outcome in zip(todo.picked, outcomes, strict=True):
                todo.slots[i] = outcome
        slots = todo.slots
        return cast(list[AIMessage], slots if return_exceptions else raise_first(cast(list[Outcome], slots)))

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """LangChain's ``stream``, its config's metadata labelling the row (see :meth:`_one`)."""
        self._keyable(input, ensure_config(config), stop)
        chunks, metadata = super().stream(input, config, stop=stop, **kwargs), ensure_config(config).get("metadata")
        while True:  # the metadata is set around each step only: never across a yield
            token = _STREAM_METADATA.set(metadata)
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            finally:
                _STREAM_METADATA.reset(token)
            yield chunk

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """LangChain's ``astream`` (``_stream`` in a worker thread), its config's metadata labelling the row."""
        await self._akeyable(input, ensure_config(config), stop)
        chunks, metadata = super().astream(input, config, stop=stop, **kwargs), ensure_config(config).get("metadata")
        while True:  # as in stream: the worker thread runs in a copy of this context
            token = _STREAM_METADATA.set(metadata)
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            finally:
                _STREAM_METADATA.reset(token)
            yield chunk

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
        """One conversation, for LangChain's own single-input paths (``stream``); its run manager is LangChain's.

        The row metadata is the call's config's, as on every other path: a run manager's inheritable metadata
        (``generate``, ``stream_events(version="v3")``), never its whole ``metadata``, where the model's own
        ``metadata=`` (tracing tags) wins over the call's. LangChain's ``stream`` gives ``_stream`` no run
        manager: :meth:`stream` and :meth:`astream` hold the config's in :data:`_STREAM_METADATA` around each step.
        """
        check_call(self._model.descriptor, stop, kwargs)
        if run_manager is not None:
            metadata = dict(run_manager.inheritable_metadata)
        else:
            metadata = dict(_STREAM_METADATA.get() or {})
        requests, outcomes = self._requests([messages], [metadata])
        send(self._model, self.role, requests, outcomes)
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
        max_concurrency: int | None = None,
    ) -> tuple[list[Outcome], list[CallbackManagerForLLMRun], CallStats | None]:
        check_call(self._model.descriptor, stop, kwargs)
        serialized = dumpd(self)
        managers = []
        for conversation, config in zip(conversations, configs, strict=True):
            (run,) = self._manager(config, stop).on_chat_model_start(
                serialized, [list(conversation)], **self._run_options(config, stop, len(conversations))
            )
            managers.append(run)
        try:
            requests, outcomes = self._requests(conversations, [c.get("metadata") for c in configs])
            stats = send(self._model, self.role, requests, outcomes, max_concurrency)
            outcomes = self._in_output_version(outcomes)
        except BaseException as e:
            for run in managers:
                run.on_llm_error(e)
            raise
        for run, outcome in zip(managers, cast(list[Outcome], outcomes), strict=True):
            if isinstance(outcome, Exception):
                run.on_llm_error(outcome)
            else:
                run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=_with_run_id(outcome, run))]]))
        return cast(list[Outcome], outcomes), managers, stats

    async def _awith_callbacks(
        self,
        conversations: Sequence[Sequence[BaseMessage]],
        configs: Sequence[RunnableConfig],
        stop: list[str] | None,
        kwargs: Mapping[str, Any],
        max_concurrency: int | None = None,
    ) -> tuple[list[Outcome], list[AsyncCallbackManagerForLLMRun], CallStats | None]:
        check_call(self._model.descriptor, stop, kwargs)
        serialized = dumpd(self)
        managers = []
        for conversation, config in zip(conversations, configs, strict=True):
            (run,) = await self._amanager(config, stop).on_chat_model_start(
                serialized, [list(conversation)], **self._run_options(config, stop, len(conversations))
            )
            managers.append(run)
        try:
            metadata = [c.get("metadata") for c in configs]
            requests, outcomes = await asyncio.to_thread(self._requests, conversations, metadata)  # off the loop
            stats = await asend(self._model, self.role, requests, outcomes, max_concurrency)
            outcomes = self._in_output_version(outcomes)
        except BaseException as e:
            for run in managers:
                await run.on_llm_error(e)
            raise
        for run, outcome in zip(managers, cast(list[Outcome], outcomes), strict=True):
            if isinstance(outcome, Exception):
                await run.on_llm_error(outcome)
            else:
                await run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=_with_run_id(outcome, run))]]))
        return cast(list[Outcome], outcomes), managers, stats

    def _in_output_version(self, outcomes: Sequence[Outcome | None]) -> list[Outcome | None]:
        """The answers with their content as ``output_version`` asks (``"v1"``: standard content blocks), as
        LangChain's own ``generate`` leaves them; its ``stream`` does so itself."""
        if self.output_version != "v1":
            return list(outcomes)
        return [
            outcome.model_copy(
                update={
                    "content": outcome.content_blocks,
                    "response_metadata": {**outcome.response_metadata, "output_version": "v1"},
                }
            )
            if isinstance(outcome, AIMessage)
            else outcome
            for outcome in outcomes
        ]

    def _batch_inputs(
        self,
        inputs: Sequence[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None,
        stop: list[str] | None,
        kwargs: Mapping[str, Any],
        return_exceptions: bool,
    ) -> _Batch:
        """What a batch sends, and each input it cannot key with its error in its slot (see :class:`_Batch`).

        As in LangChain's own ``batch``, an input that is no model input, or a call-time setting (which every input
        would get), is that input's failure: in its slot with ``return_exceptions``, else raised before anything is
        sent. A bad ``max_concurrency`` (the first config's, as LangChain reads it) is raised at once.
        """
        configs = get_config_list(config, len(inputs))
        bound = check_bound(configs[0].get("max_concurrency")) if configs else None
        todo = _Batch(slots=[None] * len(inputs), configs=configs, bound=bound)
        try:
            check_call(self._model.descriptor, stop, kwargs)
        except InvalidInputError as e:
            if not return_exceptions:
                raise
            todo.slots = [e] * len(inputs)
            return todo
        for i, value in enumerate(inputs):
            try:
                conversation = self._convert_input(value).to_messages()
            except ValueError as e:  # _convert_input's UnsupportedMessageError: named by its input here
                error = UnsupportedMessageError(f"input {i}: {e}")
                error.__cause__ = e
                todo.slots[i] = error
                todo.refused.append(i)
                continue
            todo.picked.append(i)
            todo.conversations.append(conversation)
        return todo

    def _manager(self, config: RunnableConfig, stop: list[str] | None) -> CallbackManager:
        return CallbackManager.configure(*self._callback_settings(config, stop))

    def _amanager(self, config: RunnableConfig, stop: list[str] | None) -> AsyncCallbackManager:
        return AsyncCallbackManager.configure(*self._callback_settings(config, stop))

    def _callback_settings(self, config: RunnableConfig, stop: list[str] | None) -> tuple[Any, ...]:
        """The call's and the model's callbacks, verbosity, tags and metadata (the tracing fields added, as
        LangChain's own ``generate`` adds them), as ``configure`` takes them."""
        return (
            config.get("callbacks"),
            self.callbacks,
            self.verbose,
            config.get("tags"),
            self.tags,
            {**(config.get("metadata") or {}), **self._get_ls_params(stop=stop)},
            self.metadata,
        )

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """LangChain's standard tracing fields of a run (LangSmith shows them): the provider, the model and its
        sampling, the descriptor's."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        descriptor = self._model.descriptor
        params["ls_provider"] = descriptor.provider
        params["ls_model_name"] = descriptor.model
        params["ls_temperature"] = descriptor.sampling.temperature
        params["ls_max_tokens"] = descriptor.sampling.max_tokens
        return params

    def _run_options(self, config: RunnableConfig, stop: list[str] | None, batch_size: int) -> dict[str, Any]:
        """What ``on_chat_model_start`` is told of a run besides its messages, as LangChain's own batch tells it."""
        return {
            "invocation_params": self._invocation_params(stop),
            "options": {"stop": stop},
            "name": config.get("run_name"),
            "run_id": config.get("run_id"),
            "batch_size": batch_size,
        }

    def _traced(self, value: Any) -> list[BaseMessage]:
        """What a run shows of an input judgestore cannot key: LangChain's own reading of it, if it has one."""
        try:
            return BaseChatModel._convert_input(self, value).to_messages()
        except Exception:  # no model input at all (a number): the run shows no message, its error says why
            return []

    def _refused_run(
        self, value: Any, config: RunnableConfig, stop: list[str] | None, error: Any, batch_size: int = 1
    ) -> None:
        """Start the run of an input judgestore cannot key and end it in ``error``, as LangChain ends a run whose
        generation raised: tracers see every input."""
        (run,) = self._manager(config, stop).on_chat_model_start(
            dumpd(self), [self._traced(value)], **self._run_options(config, stop, batch_size)
        )
        run.on_llm_error(error)

    async def _arefused_run(
        self, value: Any, config: RunnableConfig, stop: list[str] | None, error: Any, batch_size: int = 1
    ) -> None:
        """:meth:`_refused_run` with the async callback manager."""
        (run,) = await self._amanager(config, stop).on_chat_model_start(
            dumpd(self), [self._traced(value)], **self._run_options(config, stop, batch_size)
        )
        await run.on_llm_error(error)

    def _keyable(self, value: Any, config: RunnableConfig, stop: list[str] | None) -> None:
        """Raise what judgestore says of an input it cannot key, after its run was started and ended in it."""
        try:
            self._convert_input(value)
        except ValueError as e:
            self._refused_run(value, config, stop, e)
            raise

    async def _akeyable(self, value: Any, config: RunnableConfig, stop: list[str] | None) -> None:
        """:meth:`_keyable` with the async callback manager."""
        try:
            self._convert_input(value)
        except ValueError as e:
            await self._arefused_run(value, config, stop, e)
            raise

    def _invocation_params(self, stop: list[str] | None) -> dict[str, Any]:
        return {**self._identifying_params, "_type": self._llm_type, "stop": stop}

    def _requests(
        self, conversations: Sequence[Sequence[BaseMessage]], metadatas: Sequence[Mapping[str, Any] | None]
    ) -> tuple[list[tuple[int, Request]], list[Outcome | None]]:
        """The requests of the conversations and a slot per conversation (:func:`.shapes.requests_of`)."""
        return requests_of(conversations, metadatas, self.role, chat=self._model.descriptor.input_mode == "chat")


class _Batch:
    """A batch call's inputs, read: a slot per input and its config; what it sends; what it cannot key.

    ``picked`` are the inputs sent (``conversations`` theirs); ``refused`` those judgestore cannot key, their
    :class:`UnsupportedMessageError` in their slots; ``bound`` the call's ``max_concurrency`` (None: the model's).
    """

    def __init__(self, slots: list[Outcome | None], configs: list[RunnableConfig], bound: int | None) -> None:
        self.slots = slots
        self.configs = configs
        self.bound = bound
        self.picked: list[int] = []
        self.conversations: list[list[BaseMessage]] = []
        self.refused: list[int] = []

    def raise_refused(self, return_exceptions: bool) -> None:
        """Without ``return_exceptions``, the first input that cannot be keyed is raised before anything is sent."""
        if self.refused and not return_exceptions:
            error = self.slots[self.refused[0]]
            assert isinstance(error, Exception)
            raise error


def _with_run_id(message: AIMessage, run: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun) -> AIMessage:
    """``message`` with the id LangChain's own ``generate`` gives an answer that has none (its run's, first
    generation), so that code keeping or removing messages by id finds one."""
    if message.id is None:
        message.id = f"{LC_ID_PREFIX}-{run.run_id}-0"
    return message
