"""The ``prepare_model`` / ``do_inference`` call shape: code written against it switches its import, not its calls.

Contract:

* :func:`prepare_model` returns a :class:`PreparedModel`: a model (a
  :class:`~inference.spec.ModelSpec`, a :class:`~inference.spec.HostedSpec`,
  or a string, ``"VLLM/<model id or folder>"``, ``"OpenAI/<model>"`` (or
  ``"ChatOpenAI/<model>"``), ``"OpenRouter/<model>"``, ``"Together/<model>"``,
  anything else being a vLLM model id or folder, except the prefixes of
  engines judgestore does not run, ``"LlamaCpp/"`` and ``"Dummy/"``, which are
  refused with :class:`~store.errors.InvalidInputError` saying what to use
  instead), the role its rows are stored under
  (``completions``, or ``judgements`` for a judge), the task, and the store
  (default: the one the settings name, opened on first use). Nothing is
  resolved, opened or loaded when it is prepared: the model's descriptor is
  computed, and the store opened, on the first :func:`do_inference`; the
  engine only when a call has misses.
* ``do_inference(prepared, inputs, use_tqdm=False, *, return_top_logprobs=False,
  cache_metadata=[...])`` answers ``inputs`` (a list of strings, LangChain
  prompt values or message lists: :func:`inference.messages.chat_messages`;
  one string or prompt value alone is refused, not split) through
  one plan of the cache boundary, hits from the store and the misses in one
  engine call, and returns the results in the caller's order: the texts, or
  with ``return_top_logprobs=True`` :class:`InferenceResult` s carrying
  ``text`` and ``first_token_top_logprobs``. The list also carries what the
  call did (``.run``).
* ``cache_metadata`` holds one dict per input (a :class:`ValueError`,
  :class:`~store.errors.InvalidInputError`, otherwise, before anything
  runs): ``{"instruction_id"}`` for completions,
  ``{"instruction_id", "model_a", "model_b"}`` (``model_b`` None for a
  pointwise judgement) and optionally ``"orientation"`` for judgements;
  ``benchmark`` (default: the task), ``model`` and ``judge`` may be given
  too. Any other key is refused, so a misspelt one is not lost silently.
  A model prepared with ``mode="off"`` (no store) needs none.
* ``first_token_top_logprobs`` is ``{decoded token: logprob}`` of the first
  generated position, a later candidate with the same text replacing an
  earlier one (:func:`inference.logprob_views.token_logprobs_last_wins`):
  the dict a parser builds from the engine's candidates itself. For the
  vLLM engine (a :class:`~inference.spec.ModelSpec`) that is vLLM's own
  logprobs dict: the sampled token first, so it holds the sampled token
  when it ranks below the candidates asked for (``temperature`` > 0); for a
  hosted model, OpenAI's ``top_logprobs`` list, the candidates only.
  :attr:`InferenceResult.first_token_logprobs_merged` adds up the
  probabilities of candidates with the same text instead; None when the
  model was not asked for logprobs.
* An input given more than once at a random sampling (a temperature other
  than 0, no seed, ``top_k`` not 1: :func:`inference.sampling.random_sampling`)
  gets a sample of its own each time, as an engine without a cache answers
  it: the k-th repeat is sample k of that input (``sample_repeats`` of
  :class:`~inference.cache.model.CachedModel`), so a rerun gets the same
  answers back. At any other sampling repeats are answered alike, and
  generated once.
* ``use_tqdm=True`` shows a tqdm progress bar over the misses as they are
  generated (nothing to show when every input is a hit).
* A request that fails (refused by the engine or server) fails alone: every
  other answer is stored, then the call raises
  :class:`~store.errors.RequestsFailedError`, which carries every response.
* A :class:`PreparedModel` pickles and copies (a process pool's argument)
  as prepared, before or after its first call: the copy builds its own
  cached model, engine and store at its first call.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from inference.cache.accounting import CallStats
from inference.cache.model import CachedModel
from inference.cache.plan import MODES, Mode, Plan
from inference.logprob_views import token_logprobs_last_wins, token_logprobs_merged
from inference.messages import chat_messages, text_prompt
from inference.requests import CompletionRequest, JudgementRequest, Request, Response
from inference.sampling import random_sampling
from inference.spec import ModelSpec, Spec
from store import Store
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError
from store.roles import Role, check_role

if TYPE_CHECKING:
    from tqdm import tqdm

_T = TypeVar("_T")

# "Provider/model" strings -> the hosted provider (None: the in-process vLLM engine).
PROVIDER_PREFIXES: Mapping[str, str | None] = {
    "VLLM": None,
    "OpenAI": "openai",
    "OpenRouter": "openrouter",
    "Together": "together",
    "ChatOpenAI": "openai",  # the seed's name of the same client
}
# The seed's prefixes of engines judgestore does not run: refused by name, not read as a vLLM model id.
UNRUN_PREFIXES: Mapping[str, str] = {
    "LlamaCpp": (
        'judgestore does not run llama.cpp: load the GGUF file in vLLM ("VLLM/<path to .gguf>"), or serve it '
        'with llama.cpp\'s OpenAI-compatible llama-server and pass HostedSpec(model=..., provider="vllm-server", '
        'base_url="http://HOST:PORT/v1")'
    ),
    "Dummy": (
        "judgestore has no dummy engine: a test that needs answers without a model can serve them from "
        "an OpenAI-compatible server and pass HostedSpec(..., base_url=...)"
    ),
}
# cache_metadata keys, per role: those a caller must give, and those it may.
REQUIRED_METADATA: Mapping[Role, frozenset[str]] = {
    "completions": frozenset({"instruction_id"}),
    "judgements": frozenset({"instruction_id", "model_a", "model_b"}),
}
OPTIONAL_METADATA: Mapping[Role, frozenset[str]] = {
    "completions": frozenset({"benchmark", "model"}),
    "judgements": frozenset({"benchmark", "judge", "orientation"}),
}


class Outputs(list[_T], Generic[_T]):
    """The results of one :func:`do_inference` call, in the caller's order, and what the call did (:attr:`run`)."""

    run: CallStats

    def __init__(self, results: Iterable[_T] = (), run: CallStats | None = None) -> None:
        super().__init__(results)
        self.run = run if run is not None else CallStats()


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """One answer of :func:`do_inference` with ``return_top_logprobs=True``."""

    text: str
    first_token_top_logprobs: dict[str, float] | None  # last-wins {decoded token: logprob}; None: not asked
    top_logprobs: dict[str, Any] | None = field(repr=False)  # the stored shape (every candidate), see store.logprobs
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    cached: bool = False
    input_hash: str = ""

    @property
    def first_token_logprobs_merged(self) -> dict[str, float] | None:
        """``{text: logprob}`` of the first position, candidates with the same text merged by log-sum-exp."""
        return None if self.top_logprobs is None else token_logprobs_merged(self.top_logprobs)


@dataclass
class PreparedModel:
    """A model, its role and task, and its store, nothing of which is loaded yet; see the module docstring."""

    spec: Spec
    task: str
    role: Role = "completions"
    store: Store | None = None
    mode: Mode = "use"
    _cached: CachedModel | None = field(default=None, init=False, repr=False)
    _own_store: Store | None = field(default=None, init=False, repr=False)
    # Threads making their first call at once: one of them opens the store and builds the model (each built its
    # own before: N stores left open, N engines loaded, and vLLM's per-process state failing every second one).
    _building: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @property
    def model_spec(self) -> str:
        """The name recorded in rows (the spec's label, else its model)."""
        return self.spec.display_name

    @property
    def descriptor(self) -> ModelDescriptor:
        return self.spec.descriptor

    @property
    def engine_loaded(self) -> bool:
        return self._cached is not None and self._cached.engine_loaded

    @property
    def last(self) -> CallStats:
        """What the latest :func:`do_inference` call did (each call's own is its result's ``.run``)."""
        return self._cached.last if self._cached is not None else CallStats()

    # A copy (pickle, deepcopy: a process pool's argument) is the model as prepared: what a call built (the cached
    # model, its engine, the store it opened) is this process's, holds locks and threads, and is built again by the
    # copy's first call. The lock is the copy's own.
    _BUILT = frozenset({"_building", "_cached", "_own_store"})

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name not in self._BUILT}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _building=threading.Lock(), _cached=None, _own_store=None)

    def materialize(self) -> CachedModel:
        """The model behind its store (the store is opened now; the engine when a call has misses)."""
        with self._building:
            if self._cached is None:
                store = self.store
                if store is None and self.mode != "off":
                    store = self._own_store = Store(readonly=self.mode in ("readonly", "replay"))
                self._cached = self.spec.cached(store, task=self.task, mode=self.mode)
            return self._cached

    def close(self) -> None:
        """Release the engine, and the store if this model opened it."""
        with self._building:
            if self._cached is not None:
                self._cached.close()
            if self._own_store is not None:
                self._own_store.close()
                self._own_store = None
            self._cached = None

    def __enter__(self) -> PreparedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare_model(
    model: Spec | str,
    *,
    task: str,
    role: Role = "completions",
    store: Store | None = None,
    mode: Mode = "use",
    **spec_options: Any,
) -> PreparedModel:
    """A :class:`PreparedModel`; ``spec_options`` (``sampling=``, ``engine_kwargs=``...) build the spec of a string.

    An option that spec does not take (a misspelt one), and a mode that is none of
    :data:`~inference.cache.plan.MODES`, are refused with :class:`~store.errors.InvalidInputError`.
    """
    role = check_role(role)
    if not isinstance(task, str) or not task:  # the benchmark of its rows too: refused by its own name
        raise InvalidInputError(f"task must be a non-empty text, got {task!r:.60}")
    if mode not in MODES:  # refused here, not on the first call after the store was opened
        raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(model, str):
        spec = _spec_of(model, spec_options)
    elif spec_options:
        raise InvalidInputError(f"{sorted(spec_options)} build a spec from a model name; {model!r} is a spec already")
    else:
        spec = model
    return PreparedModel(spec, task, role, store, mode)


def do_inference(
    chat_model: PreparedModel,
    inputs: Iterable[Any],
    use_tqdm: bool = False,
    *,
    return_top_logprobs: bool = False,
    cache_metadata: Iterable[Mapping[str, Any]] | None = None,
) -> Outputs[Any]:
    """The answers to ``inputs`` in order: texts, or :class:`InferenceResult` s (see the module docstring)."""
    if not isinstance(chat_model, PreparedModel):
        raise InvalidInputError(
            f"do_inference takes a model from prepare_model(...), got a {type(chat_model).__name__}"
        )
    if isinstance(inputs, str | Mapping) or hasattr(inputs, "to_messages"):
        raise InvalidInputError(
            f"do_inference takes a list of inputs, got one {type(inputs).__name__}: pass [it] for a single input"
        )
    inputs = list(inputs)
    if isinstance(cache_metadata, Mapping):  # iterating it would give its keys
        raise InvalidInputError(
            f"cache_metadata is one dict per input, got one dict: pass a list of {len(inputs)} dicts. Each is "
            f"{_keys_line(chat_model.role)}"
        )
    if cache_metadata is not None and not isinstance(cache_metadata, Sequence):  # a generator: read it once
        cache_metadata = list(cache_metadata)
    requests = _requests(chat_model, inputs, cache_metadata)
    model = chat_model.materialize()
    bar: list[tqdm[Any]] = []
    on_plan, on_progress = _progress_bar(bar, model.label) if use_tqdm else (None, None)
    repeats = random_sampling(model.descriptor.sampling)  # each repeat its own sample, as without a cache
    try:
        if chat_model.role == "completions":
            responses = model.complete(
                cast(list[CompletionRequest], requests),
                on_plan=on_plan,
                on_progress=on_progress,
                sample_repeats=repeats,
            )
        else:
            responses = model.judge(
                cast(list[JudgementRequest], requests), on_plan=on_plan, on_progress=on_progress, sample_repeats=repeats
            )
    finally:
        for b in bar:
            b.close()
    if return_top_logprobs:
        sampled_first = isinstance(chat_model.spec, ModelSpec)  # vLLM's dict; a hosted model's OpenAI list
        return Outputs((_result(r, sampled_first) for r in responses), responses.run)
    return Outputs((r.text for r in responses), responses.run)


# ------------------------------------------------------------------ internals


def _spec_of(name: str, options: dict[str, Any]) -> Spec:
    prefix, sep, rest = name.partition("/")
    if sep and prefix in UNRUN_PREFIXES:  # a folder of that name is still "VLLM/LlamaCpp/..."
        raise InvalidInputError(f"{name!r}: {UNRUN_PREFIXES[prefix]}")
    if not (sep and prefix in PROVIDER_PREFIXES):
        rest = name
    elif (provider := PROVIDER_PREFIXES[prefix]) is not None:
        from inference.spec import HostedSpec  # only what a hosted model needs

        _check_options(HostedSpec, name, options, {"model", "provider"})
        return HostedSpec(model=rest, provider=provider, **options)  # type: ignore[arg-type]
    _check_options(ModelSpec, name, options, {"model"})
    return ModelSpec(model=rest, **options)


def _check_options(spec: type[Spec], name: str, options: Mapping[str, Any], named: set[str]) -> None:
    """Refuse options the spec does not take (a misspelt one) and those the name already says."""
    allowed = {f.name for f in dataclasses.fields(spec) if f.init} - named  # type: ignore[arg-type]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidInputError(
            f"prepare_model({name!r}) builds a {spec.__name__}, which does not take {unknown}: "
            f"it takes {', '.join(sorted(allowed))}"
        )


def _requests(
    prepared: PreparedModel, inputs: Sequence[Any], cache_metadata: Sequence[Mapping[str, Any]] | None
) -> list[Request]:
    """One request per input, its row metadata checked (see the module docstring) before anything runs."""
    role = prepared.role
    if cache_metadata is None and prepared.mode == "off":
        cache_metadata = [{}] * len(inputs)
    if cache_metadata is None or len(cache_metadata) != len(inputs):
        given = "no cache_metadata" if cache_metadata is None else f"{len(cache_metadata)} cache_metadata entries"
        raise InvalidInputError(
            f"cache_metadata must hold one dict per input: {len(inputs)} inputs, {given}. Each is {_keys_line(role)}"
        )
    chat = prepared.descriptor.input_mode == "chat"
    requests: list[Request] = []
    for i, (item, metadata) in enumerate(zip(inputs, cache_metadata, strict=True)):
        fields = _row_fields(i, role, metadata, prepared)
        prompt: dict[str, Any] = {"messages": chat_messages(item)} if chat else {"text": text_prompt(item)}
        requests.append(
            CompletionRequest(**prompt, **fields) if role == "completions" else JudgementRequest(**prompt, **fields)
        )
    return requests


def _row_fields(i: int, role: Role, metadata: Any, prepared: PreparedModel) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"cache_metadata[{i}] is a {type(metadata).__name__}, not a dict: {_keys_line(role)}")
    if prepared.mode == "off" and not metadata:
        return {}
    missing = sorted(REQUIRED_METADATA[role] - set(metadata))
    unknown = sorted(set(metadata) - REQUIRED_METADATA[role] - OPTIONAL_METADATA[role])
    if missing or unknown:
        what = "; ".join(
            part
            for part in (f"lacks {missing}" if missing else "", f"has unknown keys {unknown}" if unknown else "")
            if part
        )
        raise InvalidInputError(f"cache_metadata[{i}] {what}: {_keys_line(role)}")
    fields = dict(metadata)
    fields.setdefault("benchmark", prepared.task)
    return fields


def _keys_line(role: Role) -> str:
    required = ", ".join(sorted(REQUIRED_METADATA[role]))
    optional = ", ".join(sorted(OPTIONAL_METADATA[role]))
    return f"{role} take {{{required}}} (and optionally {optional})"


def _result(response: Response, sampled_first: bool) -> InferenceResult:
    sample = response.samples[0]
    stored = sample.top_logprobs
    return InferenceResult(
        text=sample.text,
        first_token_top_logprobs=(
            None if stored is None else token_logprobs_last_wins(stored, sampled_first=sampled_first)
        ),
        top_logprobs=stored,
        finish_reason=sample.finish_reason,
        usage=sample.usage,
        cached=sample.cached,
        input_hash=sample.input_hash,
    )


def _progress_bar(bars: list[Any], label: str) -> tuple[Callable[[Plan], None], Callable[[int, int], None]]:
    """A plan callback that opens a tqdm bar over the misses, and a progress callback that moves it."""

    def on_plan(plan: Plan) -> None:
        if plan.misses and plan.mode != "replay":
            from tqdm.auto import tqdm  # imported by the calls that show a bar

            bars.append(tqdm(total=plan.misses, desc=f"{label}: generating", unit="input"))

    def on_progress(done: int, total: int) -> None:
        if bars:
            bars[0].update(done - bars[0].n)

    return on_plan, on_progress
