"""The real engine behind :class:`inference.backends.base.Backend`: offline vLLM.

Contract:

* :func:`create_vllm_backend` is the only place that imports vLLM (and with it
  torch); importing this module imports neither. It builds ``vllm.LLM`` from
  the full engine kwargs, execution-only ones included, after checking that
  their output-affecting part and the chat template it would apply are what
  the descriptor says, and what it loaded after
  (:mod:`inference.backends.vllm.checks`), so generations are never written
  under a descriptor that did not produce them.
* :meth:`VLLMBackend.generate_stream` (a
  :class:`~inference.backends.base.StreamingBackend`) adds every request of
  the batch to the engine at once, as ``LLM.chat`` does for chat input (the
  explicit chat template if one was given, ``chat_template_kwargs``, and
  ``enable_thinking`` inside them) and ``LLM.generate`` for text input
  (``LLM.enqueue_chat`` / ``enqueue``), with one ``SamplingParams`` per
  sample index built from ``descriptor.sampling``; then it steps the engine
  (``LLMEngine.step``) and yields each request as it finishes (and a
  heartbeat, None, after each step), so the
  scheduler holds as many as ``max_num_seqs`` allows and the outputs are
  those of ``LLM.chat`` over the same batch. :meth:`~VLLMBackend.generate`
  is the same, returned in request order. Sample ``k`` gets seed
  ``seed + k`` when the descriptor sets a seed, so it is the same whether it
  is asked for alone or with others.
* One stream at a time holds an engine (its views share the lock), from the
  moment ``generate_stream`` returns to the last request; closing the stream
  early, an engine failure or Ctrl-C aborts what is unfinished, so the
  engine is left empty for the next call. A stream started in the thread
  that steps the stream holding the engine (a call made from inside a call's
  ``on_progress``, which runs while its stream holds the engine) raises
  :class:`~store.errors.JudgestoreError` at once instead of waiting for
  itself; the mark is the engine's, so a stream closed or finished in
  another thread than the one that started it frees that thread too.
  vLLM's own failures (a CUDA error, an out-of-memory) are raised as
  :class:`~store.errors.BackendError`.
* A request vLLM refuses (its ``VLLMClientError``: a prompt longer than the
  model's context, a chat its template rejects) fails alone: vLLM adds
  nothing of a refused call, so the batch is added again in halves, down to
  each refused request, which comes back as a
  :class:`~inference.backends.base.Refusal`
  (:class:`~store.errors.RequestRefusedError` with vLLM's reason); the others
  are generated together.
* Each :class:`Generation` carries the text, finish reason, token counts and,
  when ``sampling.logprobs`` is set, every candidate vLLM returned, in the
  lossless shape of :mod:`store.logprobs` (:mod:`inference.backends.vllm.outputs`).
* :meth:`VLLMBackend.close` shuts the engine down; it is idempotent, and a
  closed backend (or a view of it) refuses to generate. A stream running in
  another thread is stopped at its next step first (it raises
  :class:`~store.errors.BackendError`, its caller writes what finished), so
  the engine is never shut down under a step.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

from inference.backends.base import Arrival, EngineRequest, Generation, Refusal
from inference.backends.vllm.checks import check_engine_kwargs, check_template, pinned_commit, verify_loaded
from inference.backends.vllm.descriptor import effective_chat_template, load_chat_template_text
from inference.backends.vllm.engine_logs import engine_is_quiet
from inference.backends.vllm.outputs import generation
from store.descriptor import ModelDescriptor
from store.errors import BackendError, InvalidInputError, JudgestoreError, ModelLoadError, RequestRefusedError
from store.interrupts import deferred_interrupts
from store.spelling import meant

_RENDERED_TYPE = {"chat": "messages", "text": "text"}
# What to check when vLLM could not load a model, by where the model comes from
_WHAT_TO_CHECK = {
    "folder": "that its folder's config.json and weights are whole (a copy cut short)",
    "hub": "the model id, your access to it (HF_TOKEN), the network, or its files in the Hugging Face cache",
}
# What vLLM's ModelConfig says of a folder whose config.json it cannot use (its pydantic check, not an argument's)
_MODEL_CONFIG_WORDS = ("Unrecognized model", "config.json")
_CLOSE_WAIT_S = 30.0  # how long close() waits for a running stream to stop before it shuts the engine down
# vLLM 0.32 on CPU fails a seeded request whose prompt is prefilled over two steps (its CPU generator has no
# offset to rewind): a batch whose new prompts exceed one step's token budget meets it.
_CPU_SEEDED_CHUNK = "Generator does not use offset"
_CPU_SEEDED_MESSAGE = (
    "vLLM on CPU cannot sample a seeded request whose prompt it prefills over two steps, which a batch of more "
    "prompt tokens than one step's budget needs; give the engine a budget for every sequence at once: "
    "--engine-arg max_num_batched_tokens=<max_num_seqs x max_model_len> (an execution setting: the cache key "
    "and the rows already stored stay the same), then run again: what finished is kept"
)


class _Holder:
    """Which thread steps the stream that holds an engine (None: no stream holds it); shared by its views."""

    def __init__(self) -> None:
        self.thread: int | None = None


class VLLMBackend:
    """A loaded ``vllm.LLM`` generating under one descriptor. Build it with :func:`create_vllm_backend`.

    One live engine per process when vLLM runs in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as on CPU): vLLM's shutdown tears
    down process-global torch.distributed state, so closing one engine breaks
    any other still open. Close a backend before creating the next.
    """

    def __init__(
        self,
        llm: Any,
        sampling_params_cls: type,
        descriptor: ModelDescriptor,
        chat_template: str | None = None,
        *,
        engine_template: str | None = None,
        owns_engine: bool = True,
        engine_lock: threading.Lock | None = None,
        closing: threading.Event | None = None,
        holding: _Holder | None = None,
    ) -> None:
        """Wrap a loaded engine; ``chat_template`` is the explicit template text, if any.

        ``engine_template`` is the template the engine applies when none is
        passed per request (its own ``chat_template`` kwarg, or the model's).
        """
        check_template(descriptor, chat_template if chat_template is not None else engine_template)
        self._llm: Any = llm
        self._sampling_params_cls = sampling_params_cls
        self._descriptor = descriptor
        self._chat_template = chat_template
        self._engine_template = engine_template
        self._owns_engine = owns_engine
        # One stream at a time on an engine, across its views: vLLM's engine is not safe from two threads,
        # and a stream's steps must return only its own requests.
        self._engine_lock = engine_lock if engine_lock is not None else threading.Lock()
        # Which thread steps the stream holding the engine (shared by the views): a stream started from inside that
        # stream's callbacks would wait for the lock its own thread holds.
        self._holding = holding if holding is not None else _Holder()
        # Set when the owner closes, for its views too: a stream running then stops at its next step.
        self._closing = closing if closing is not None else threading.Event()
        kwargs: dict[str, Any] = dict(descriptor.chat_template_kwargs)
        if descriptor.enable_thinking is not None:
            kwargs["enable_thinking"] = descriptor.enable_thinking
        self._chat_template_kwargs = kwargs or None

    @property
    def descriptor(self) -> ModelDescriptor:
        return self._descriptor

    @property
    def max_concurrency(self) -> int:
        """The engine's ``max_num_seqs``: how many sequences its scheduler runs at once."""
        if self._llm is None:
            raise JudgestoreError(f"the vLLM backend for {self._descriptor.model!r} is closed")
        return int(self._llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)

    def with_descriptor(self, descriptor: ModelDescriptor, *, chat_template: str | None = None) -> VLLMBackend:
        """A backend on the same loaded engine for another sampling, template or input mode.

        Only what is applied per request may differ (sampling, thinking, chat
        template and its kwargs, input mode); the model, its revision, the
        engine settings and the vLLM version must be the same, or it raises.
        The view does not own the engine: closing it leaves the engine running,
        and it must not be used after the owner is closed.
        """
        if self._llm is None:
            raise JudgestoreError(f"the vLLM backend for {self._descriptor.model!r} is closed")
        engine_fields = ("provider", "model", "revision", "engine", "backend_version")
        differ = [k for k in engine_fields if getattr(self._descriptor, k) != getattr(descriptor, k)]
        if differ:
            raise InvalidInputError(f"descriptor needs another engine: it differs in {differ}")
        return VLLMBackend(
            self._llm,
            self._sampling_params_cls,
            descriptor,
            load_chat_template_text(chat_template) if chat_template is not None else None,
            engine_template=self._engine_template,
            owns_engine=False,
            engine_lock=self._engine_lock,
            closing=self._closing,
            holding=self._holding,
        )

    def _sampling_params(self, sample_index: int) -> Any:
        return sampling_params(self._sampling_params_cls, self._descriptor, sample_index)

    def _batch_params(self, requests: Sequence[EngineRequest]) -> list[Any]:
        """The ``SamplingParams`` of each request: one object per sample index, shared as ``LLM.chat`` shares one.

        vLLM clones the params of each request it adds; building one per request cost about 10 us each.
        """
        by_sample = {k: self._sampling_params(k) for k in {r.sample_index for r in requests}}
        return [by_sample[r.sample_index] for r in requests]

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        """One generation per request, in order; a request vLLM refuses is a :class:`Refusal`. Raises on failure."""
        results: list[Generation | Refusal | None] = [None] * len(requests)
        for arrival in self.generate_stream(requests):
            if arrival is not None:  # None: a heartbeat
                index, outcome = arrival
                results[index] = outcome
        done = [r for r in results if r is not None]
        if len(done) != len(requests):
            raise BackendError(f"vLLM returned {len(done)} outputs for {len(requests)} requests")
        return done

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        """``(index, generation or refusal)`` for every request, as the engine finishes them (see the module docstring).

        When it returns, the engine is this stream's and every request is added; iterating steps the engine.
        Closing the stream, an exception or an interrupt aborts what is unfinished and frees the engine; an
        interrupt thrown into it (the caller's Ctrl-C between two arrivals) first hands over what the engine's
        last step had finished.
        """
        if self._llm is None or self._closing.is_set():
            raise JudgestoreError(f"the vLLM backend for {self._descriptor.model!r} is closed")
        mode = self._descriptor.input_mode
        expected = _RENDERED_TYPE[mode]
        for i, r in enumerate(requests):
            if r.rendered.get("type") != expected:
                raise InvalidInputError(
                    f"request {i} is {r.rendered.get('type')!r} input but the descriptor's input mode is {mode!r}"
                )
        stream = self._run(requests, self._batch_params(requests))
        next(stream)  # up to the first yield: the engine taken, every request added
        return stream

    def _run(self, requests: Sequence[EngineRequest], params: Sequence[Any]) -> Generator[Arrival, None, None]:
        """Add every request, yield ``None``, then step the engine, yielding each request as it finishes and ``None``
        after each step (a heartbeat)."""
        llm = self._llm
        engine = llm.llm_engine
        if self._holding.thread == threading.get_ident():
            raise JudgestoreError(
                f"the vLLM engine for {self._descriptor.model!r} is held by a call still running in this thread: a "
                "call made from inside its on_progress callback cannot generate on it, as it would wait "
                "for itself; make that call once the first one has returned"
            )
        finished: list[Any] = []  # a step's finished outputs not yet handed over
        with self._engine_lock:
            # vLLM numbers requests with its counter (the request ids of their outputs): everything numbered
            # from here on is this stream's, including what a half-finished add left behind.
            first = llm.request_counter.counter
            try:
                # The mark is the engine's, not a thread-local: it is cleared below by whichever thread ends the
                # stream (a stream handed to another thread, closed there), never left on the one that started it.
                self._holding.thread = threading.get_ident()
                pending, refused = self._add(requests, params)
                yield None
                self._holding.thread = threading.get_ident()  # the thread that steps it is the one its callbacks run in
                yield from refused.items()
                while pending and engine.has_unfinished_requests():
                    if self._closing.is_set():
                        raise BackendError(
                            f"the model was closed while this call generated; {len(pending)} of {len(requests)} "
                            "requests were left unfinished"
                        )
                    finished = [output for output in engine.step() if output.finished]
                    finished.reverse()  # popped from the end: in the engine's order
                    while finished:
                        yield self._arrival(finished.pop(), pending)
                    yield None  # a step's worth of time passed: the caller may write what finished, on time
                if pending:
                    raise BackendError(f"vLLM stopped with {len(pending)} of {len(requests)} requests unfinished")
            except BaseException as e:  # an engine failure, Ctrl-C, or the stream closed early: leave nothing running
                engine.abort_request([str(i) for i in range(first, llm.request_counter.counter)], internal=False)
                if isinstance(e, KeyboardInterrupt):  # its caller's Ctrl-C (a write): hand over what had finished
                    while finished:
                        yield self._arrival(finished.pop(), pending)
                if isinstance(e, RuntimeError) and _CPU_SEEDED_CHUNK in str(e):
                    raise BackendError(_CPU_SEEDED_MESSAGE) from e
                if isinstance(e, Exception) and not isinstance(e, JudgestoreError):
                    # vLLM's own failure (a CUDA error, an out-of-memory): typed, so the caller can say what was kept
                    raise BackendError(f"vLLM failed while generating: {type(e).__name__}: {e}") from e
                raise
            finally:
                self._holding.thread = None

    def _arrival(self, output: Any, pending: dict[str, int]) -> tuple[int, Generation]:
        """A finished output as ``(index, generation)``, taken out of ``pending`` (indexes by vLLM request id)."""
        index = pending.pop(output.request_id, None)
        if index is None:
            raise BackendError(f"vLLM returned request {output.request_id!r}, which it was not asked")
        return index, generation(output, self._descriptor)

    def _add(
        self, requests: Sequence[EngineRequest], params: Sequence[Any]
    ) -> tuple[dict[str, int], dict[int, Refusal]]:
        """Add ``requests`` to the engine: their indexes by vLLM request id, and the ones vLLM refused.

        vLLM adds nothing of a call it refuses: a refused batch is added again in halves, down to each refused
        request.
        """
        from vllm.exceptions import VLLMClientError  # vLLM is loaded already: this backend holds an engine

        counter = self._llm.request_counter
        added: dict[str, int] = {}
        refused: dict[int, Refusal] = {}

        def add(indexes: list[int]) -> None:
            before = counter.counter
            try:
                self._enqueue([requests[i] for i in indexes], [params[i] for i in indexes])
            except VLLMClientError as e:
                if len(indexes) == 1:
                    reason = " ".join(str(e).split())
                    refused[indexes[0]] = Refusal(RequestRefusedError(f"vLLM refused this request: {reason}"))
                    return
                half = len(indexes) // 2
                add(indexes[:half])
                add(indexes[half:])
                return
            if counter.counter - before != len(indexes):
                raise BackendError(f"vLLM numbered {counter.counter - before} requests for the {len(indexes)} added")
            added.update((str(before + k), index) for k, index in enumerate(indexes))

        if requests:
            add(list(range(len(requests))))
        return added, refused

    def _enqueue(self, requests: Sequence[EngineRequest], params: Sequence[Any]) -> list[str]:
        """Add ``requests`` to the engine without running it (their ids); vLLM adds none if it refuses one.

        The same rendering as ``LLM.chat`` / ``LLM.generate``, which add their requests the same way before
        running the engine.
        """
        if self._descriptor.input_mode == "chat":
            return self._llm.enqueue_chat(  # type: ignore[no-any-return]
                [r.rendered["messages"] for r in requests],
                list(params),
                use_tqdm=False,
                chat_template=self._chat_template,
                chat_template_kwargs=self._chat_template_kwargs,
            )
        return self._llm.enqueue(  # type: ignore[no-any-return]
            [r.rendered["text"] for r in requests], list(params), use_tqdm=False
        )

    def close(self) -> None:
        """Shut the engine down (memory, worker processes). Safe to call twice.

        A stream running on the engine (another thread's call) is stopped first: it aborts what is unfinished
        at its next step and raises :class:`BackendError` (its caller then writes what finished;
        :meth:`~inference.cache.model.CachedModel.close` waits for that), and only then is the engine shut down,
        never under a step. Closed from inside the callbacks of the stream holding the engine (in the thread that
        steps it), it shuts down at once: that stream stops at its next step.
        """
        llm, self._llm = self._llm, None
        if llm is None or not self._owns_engine:
            return
        self._closing.set()
        # The stream holds the lock until it has stopped; a stream left open and never stepped again must not hang
        # the close: shut down after a while anyway. A close from inside the holding stream's own callbacks (a
        # call's on_progress) would wait only for itself, as that stream cannot step while it waits: not at all.
        own = self._holding.thread == threading.get_ident()
        taken = not own and self._engine_lock.acquire(timeout=_CLOSE_WAIT_S)
        try:
            self._shutdown(llm)
        finally:
            if taken:
                self._engine_lock.release()

    @staticmethod
    def _shutdown(llm: Any) -> None:
        # vLLM 0.32 has no public LLM.shutdown(); the engine core's shutdown
        # releases the workers and tears down torch.distributed state, which
        # a second engine in the same process needs.
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sampling_params(sampling_params_cls: Any, descriptor: ModelDescriptor, sample_index: int) -> Any:
    """vLLM's ``SamplingParams`` for sample ``sample_index`` of ``descriptor``; InvalidInputError if vLLM refuses."""
    from vllm.exceptions import VLLMError  # loaded already: the class is vLLM's

    sampling = descriptor.sampling
    # model_dump keeps the extra (unknown) fields, so they reach vLLM too.
    fields = sampling.model_dump()
    fields["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        fields["seed"] = sampling.seed + sample_index
    if descriptor.thinking_token_budget is not None:
        # vLLM 0.32 honours it only with a reasoning config on the engine
        # (engine kwarg ``reasoning_config``) and says so when it is missing.
        fields["thinking_token_budget"] = descriptor.thinking_token_budget
    try:
        return sampling_params_cls(**_vllm_values(fields))
    except (TypeError, ValueError, VLLMError) as e:  # unknown field; value out of vLLM's range
        raise InvalidInputError(f"vLLM's SamplingParams rejected the descriptor's sampling {fields}: {e}") from e


def _vllm_values(fields: dict[str, Any]) -> dict[str, Any]:
    """The descriptor's JSON sampling values as ``SamplingParams`` takes them (its constructor converts nothing).

    JSON keeps object keys as text: ``logit_bias``'s token ids become ints again. A JSON object for a field
    vLLM types as one of its parameter classes (``structured_outputs``, ``repetition_detection``) becomes
    that class. Raises TypeError/ValueError for values that cannot be converted.
    """
    from vllm import sampling_params as vllm_sampling

    values = dict(fields)
    if isinstance(values.get("logit_bias"), dict):
        values["logit_bias"] = {int(token): float(bias) for token, bias in values["logit_bias"].items()}
    for name, class_name in _PARAMETER_CLASSES.items():
        if isinstance(values.get(name), dict):
            values[name] = getattr(vllm_sampling, class_name)(**values[name])
    return values


# Sampling fields vLLM types as one of its parameter classes, by the class's name in vllm.sampling_params.
_PARAMETER_CLASSES = {
    "structured_outputs": "StructuredOutputsParams",
    "repetition_detection": "RepetitionDetectionParams",
}


def _check_sampling_on(llm: Any, params: Any) -> None:
    """Raise InvalidInputError if the loaded engine refuses ``params`` (the descriptor's sampling) for any request.

    vLLM checks sampling against the engine (``max_logprobs``, the vocabulary) only when a request is added: a
    setting it refuses would otherwise come back as a refusal of every request, each telling the user to fix
    their inputs.
    """
    from vllm.exceptions import VLLMError

    engine = llm.llm_engine
    validate = getattr(getattr(engine, "input_processor", None), "_validate_params", None)
    if not callable(validate):  # another vLLM: its add checks the requests, one by one
        return
    try:
        validate(params, engine.get_supported_tasks())
    except (TypeError, ValueError, AttributeError, VLLMError) as e:
        raise InvalidInputError(
            f"this engine refuses the descriptor's sampling for every request: {e}. Change the sampling setting, "
            "or the engine argument that bounds it (--engine-arg, e.g. max_logprobs=N for more top logprobs)"
        ) from e


def check_engine_arguments(llm_cls: Any, engine_kwargs: Mapping[str, Any]) -> None:
    """Refuse, before the engine loads, a kwarg neither ``vllm.LLM`` nor ``vllm.EngineArgs`` takes (a misspelt
    ``--engine-arg``): vLLM raises a bare ``TypeError`` for it."""
    from vllm.engine.arg_utils import EngineArgs  # loaded already: vllm.LLM builds one

    known = set(inspect.signature(llm_cls.__init__).parameters) | {f.name for f in dataclasses.fields(EngineArgs)}
    for name in sorted(set(engine_kwargs) - known):
        close = meant(name, known, cutoff=0.6)
        raise InvalidInputError(
            f"vLLM's engine takes no argument {name!r} (--engine-arg / engine_kwargs)"
            + (f"; did you mean {close!r}?" if close else "; see vllm.EngineArgs for the ones it takes")
        )


def _loading_failure(error: Exception) -> bool:
    """Whether ``error`` is what loading a model fails with: a file (missing, cut short, unreadable), a device (out
    of memory), a download (the Hub, its HTTP client), safetensors' reader."""
    if isinstance(error, ImportError):  # a package vLLM or the model needs: not the model's files
        return False
    library = type(error).__module__.split(".")[0]
    return isinstance(error, OSError | RuntimeError) or library in ("safetensors", "huggingface_hub", "httpx")


def create_vllm_backend(
    descriptor: ModelDescriptor,
    engine_kwargs: Mapping[str, Any],
    *,
    model: str | None = None,
    chat_template: str | None = None,
) -> VLLMBackend:
    """Load ``vllm.LLM(model, **engine_kwargs)`` for ``descriptor`` (the only place vLLM is imported).

    ``model`` is what vLLM loads (a Hub id or a folder, however spelled;
    default: the descriptor's model). ``engine_kwargs`` are the full
    ``vllm.LLM`` kwargs, execution-only ones included; a Hub model is pinned to
    the descriptor's commit. ``chat_template`` (text or file) is the explicit
    template the descriptor was built with, if any. Settings and template are
    checked against the descriptor before the load, and what was loaded after
    it (:func:`verify_loaded`); a mismatch shuts the engine down and raises.
    """
    if model is None:
        model = os.fspath(engine_kwargs.get("model", descriptor.model))
        local = descriptor.revision is not None and descriptor.revision.startswith("sha256:")
        if local and "model" not in engine_kwargs:
            raise InvalidInputError(
                f"the descriptor of {descriptor.model!r} names a local folder by its name only: pass model=<its path>"
            )
    check_engine_kwargs(descriptor, model, engine_kwargs)
    kwargs = dict(engine_kwargs)
    kwargs["model"] = model
    if (commit := pinned_commit(descriptor)) is not None:
        # The descriptor resolved a branch or tag to this commit: load exactly
        # that, even if the branch has moved on the hub since.
        kwargs["revision"] = commit

    # Checked against the descriptor before the slow part.
    explicit = load_chat_template_text(chat_template) if chat_template is not None else None
    engine_template = None
    # The first import of torch (through transformers, for the template) and of vLLM: a signal inside torch's C++
    # initialisation aborts the process (SIGABRT, a core dump where a scheduler's SIGTERM meant a clean stop)
    with deferred_interrupts("once the engine's libraries are loaded"):
        if not descriptor.unpinned:
            engine_template = effective_chat_template(model, engine_kwargs=kwargs)
        from pydantic import ValidationError
        from vllm import LLM, SamplingParams
    if not descriptor.unpinned:
        check_template(descriptor, explicit if explicit is not None else engine_template)

    sampling_params(SamplingParams, descriptor, 0)  # a value vLLM refuses, refused before the engine loads
    check_engine_arguments(LLM, kwargs)
    if engine_is_quiet():  # the "Loading safetensors checkpoint shards" bar; it changes no output
        kwargs.setdefault("use_tqdm_on_load", False)
    from vllm.exceptions import VLLMError

    llm = None
    try:
        with deferred_interrupts("once the engine has started"):  # its start is not safe to interrupt
            llm = LLM(**kwargs)
    except KeyboardInterrupt:  # held back until the engine was up: shut it, or its process outlives ours
        if llm is not None:
            VLLMBackend._shutdown(llm)
        raise
    except ValidationError as e:  # vLLM's configs are pydantic: a value of the wrong type (max_model_len="abc")
        if any(words in str(e) for words in _MODEL_CONFIG_WORDS):  # ModelConfig's check of the folder's config.json
            raise ModelLoadError(f"vLLM could not load the model {model!r}: {e}") from e
        raise InvalidInputError(f"vLLM refused an engine argument (--engine-arg / engine_kwargs): {e}") from e
    except (ValueError, VLLMError) as e:  # a value vLLM checks while it builds (no room for the KV cache...)
        raise InvalidInputError(
            f"vLLM could not start the engine with these engine arguments (--engine-arg / engine_kwargs): {e}"
        ) from e
    except Exception as e:  # the weights' loader (a file missing or cut short), a download, a device out of memory
        if not _loading_failure(e):
            raise  # a missing package, or an error in vLLM's code or ours: as it is, with its traceback
        where = _WHAT_TO_CHECK["folder" if os.path.isdir(model) else "hub"]
        raise ModelLoadError(
            f"vLLM could not load the model {model!r}: {type(e).__name__}: {e}. Check {where}; out of memory, lower "
            "max_model_len, max_num_seqs or gpu_memory_utilization (--engine-arg)"
        ) from e
    backend = VLLMBackend(llm, SamplingParams, descriptor, explicit, engine_template=engine_template)
    try:
        verify_loaded(llm, descriptor, model, explicit)
        _check_sampling_on(llm, backend._sampling_params(0))
    except BaseException:
        backend.close()
        raise
    return backend
