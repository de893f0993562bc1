"""A legacy descriptor turned into the live run that reproduces it, so imported rows hit again.

Contract: a legacy metadata.json (S3+ ``judgearena-inference-cache/v1`` or S2
``judgearena-inference-descriptor/v1``) is turned into the vLLM settings a live
run would pass, as a :class:`~inference.spec.ModelSpec`, and the descriptor is
computed by its :attr:`~inference.spec.ModelSpec.descriptor`, i.e.
:func:`inference.backends.vllm.descriptor.descriptor_from_vllm`, the one place where live
settings become a descriptor. Nothing here re-implements a hashing rule.

The mapping of a legacy VLLM descriptor:

* ``provider`` ``VLLM`` is judgestore's ``vllm``; other providers (hosted APIs,
  LlamaCpp, Dummy) have no live rules here, and ``endpoint`` means a served
  model: such sources are imported only under ``--descriptor``.
* S3+ ``model_kwargs`` mixed engine and sampling settings (the legacy wrapper
  passed every kwarg it did not route to ``SamplingParams`` on to
  ``vllm.LLM``). Names of ``SamplingParams`` fields go to sampling
  (:data:`SAMPLING_PARAMS`); ``seed`` is the *engine* seed (``vllm.LLM(seed=)``),
  as the legacy wrapper passed it; ``chat_template`` (inline text, a file, or
  null for the tokenizer's own), ``chat_template_kwargs``,
  ``thinking_token_budget`` and ``disable_thinking`` (true: thinking off;
  false: the template's default) go to their typed fields; everything else is
  an engine setting. ``descriptor_from_vllm`` then drops its own, longer list of
  execution-only settings (the legacy list was only tensor_parallel_size,
  gpu_memory_utilization and enforce_eager) and normalises numbers, so
  ``0`` and ``0.0`` hash alike although the legacy writer kept them apart.
* A missing (or null) ``temperature`` / ``top_p`` meant the legacy vLLM
  defaults 0.6 / 0.95, and is imported as such. A missing ``max_tokens`` is
  not guessed (the legacy wrapper's default was not vLLM's): the source is
  skipped until ``--assume-setting max_tokens=N`` names it.
* ``backend_version`` is the legacy one (the vLLM that produced the rows), not
  the installed one: a live run on another vLLM version computes another
  descriptor and misses, by design. One that is not a version string is
  refused, and so is a ``max_tokens`` below 1 (vLLM refuses it: no live run
  computes that descriptor).
* A legacy key this module does not know (top level, or ``input_mode`` other
  than chat/text) is not guessed: the source is skipped with its name.
* Settings the legacy wrapper hard-coded and never wrote (a logprobs count,
  say) can be asserted with ``--assume-setting KEY=VALUE`` (``assumed``);
  each is returned as a note, for the caller to record as an assumption. A
  key the file does record is never overridden, and one it records
  differently is refused.
* The model's resolved revision and chat template were never recorded: the
  descriptor resolves them from the model *as it is now*, which only
  :mod:`inference.legacy.mapper` decides to allow (``--assume-current-model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson

from inference.backends.vllm.model_source import TEMPLATE_FILES
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, LegacyMappingError, UnpinnedModelError
from store.legacy.metadata import LegacyMetadata, MetadataForm

VLLM_LEGACY_TEMPERATURE = 0.6
VLLM_LEGACY_TOP_P = 0.95
LEGACY_EXECUTION_ONLY = frozenset({"tensor_parallel_size", "gpu_memory_utilization", "enforce_eager"})

# ``vllm.SamplingParams`` fields a legacy model_kwargs could name (``seed`` and
# ``thinking_token_budget`` are routed separately, see the module docstring).
SAMPLING_PARAMS = frozenset(
    {
        "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
        "min_p", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
        "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
        "include_stop_str_in_output", "logit_bias", "allowed_token_ids", "bad_words", "structured_outputs",
        "extra_args",
    }
)  # fmt: skip
_S3_KEYS = frozenset(
    {"schema_version", "provider", "model", "input_mode", "model_kwargs", "backend_version", "endpoint", "sampling"}
)
_S2_KEYS = frozenset(
    {"descriptor_schema_version", "model_spec", "model", "input_mode", "chat_template", "chat_template_kwargs",
     "sampling", "engine_settings", "vllm_version"}
)  # fmt: skip
_TYPED_KWARGS = frozenset({"chat_template", "chat_template_kwargs", "thinking_token_budget", "disable_thinking"})


# The ModelSpec fields a legacy descriptor (or a ``{"vllm": {..}}`` descriptor file) sets; the others keep
# their defaults, as the legacy runs had no such settings.
SPEC_FIELDS = frozenset(
    {"model", "input_mode", "sampling", "engine_kwargs", "chat_template", "chat_template_kwargs", "enable_thinking",
     "thinking_token_budget"}
)  # fmt: skip


def settings_line(spec: ModelSpec) -> str:
    """The settings a live run passes to hit the imported rows, as one line of JSON for reports."""
    shown: dict[str, Any] = {"model": spec.model, "input_mode": spec.input_mode,
                             "sampling": dict(sorted(spec.sampling.items())),
                             "engine_kwargs": dict(sorted(spec.engine_kwargs.items()))}  # fmt: skip
    if spec.chat_template_kwargs:
        shown["chat_template_kwargs"] = dict(sorted(spec.chat_template_kwargs.items()))
    if spec.enable_thinking:
        shown["enable_thinking"] = spec.enable_thinking
    if spec.thinking_token_budget:
        shown["thinking_token_budget"] = spec.thinking_token_budget
    if spec.chat_template is not None:
        shown["chat_template"] = spec.chat_template if len(spec.chat_template) < 60 else "(inline template)"
    # The names sorted, each value in its own order: a JSON schema's property order is part of the key
    return orjson.dumps(dict(sorted(shown.items()))).decode()


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LegacyMappingError(f"{name} is not an object")
    return dict(value)


def _input_mode(value: Any) -> Literal["chat", "text"]:
    mode = {"chat": "chat", "text": "text", "raw": "text", None: "chat"}.get(value)
    if mode is None:
        raise LegacyMappingError(
            f"input_mode {value!r}: chat or text was decided per model at run time, which a live run cannot reproduce"
        )
    return mode  # type: ignore[return-value]


def _vllm_provider(metadata: LegacyMetadata) -> None:
    provider = metadata.provider
    if provider is None or provider.lower() != "vllm":
        raise LegacyMappingError(
            f"provider {provider!r} has no live descriptor rules in judgestore (only vLLM does); import it with "
            "--descriptor FILE"
        )


def _unknown_keys(doc: Mapping[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise LegacyMappingError(
            f"legacy descriptor has fields {unknown} that judgestore does not know; it cannot prove a live run "
            "computes the same descriptor, so it does not guess (import with --descriptor FILE)"
        )


def _apply_assumed(target: dict[str, Any], recorded: Mapping[str, Any], assumed: Mapping[str, Any]) -> list[str]:
    """Add the ``--assume-setting`` values the file does not record; refuse ones it records differently."""
    notes = []
    for key, value in assumed.items():
        if recorded.get(key) is not None:
            if recorded[key] != value:
                raise LegacyMappingError(
                    f"the legacy file records {key}={recorded[key]!r} but --assume-setting says {value!r}"
                )
            continue
        target[key] = value
        notes.append(f"{key}={orjson.dumps(value).decode()}")
    return notes


def _split_s3(kwargs: dict[str, Any], assumed: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(sampling, engine, assumed notes) from an S3+ model_kwargs."""
    notes = _apply_assumed(kwargs, dict(kwargs), assumed)
    sampling = {k: v for k, v in kwargs.items() if k in SAMPLING_PARAMS}
    engine = {k: v for k, v in kwargs.items() if k not in SAMPLING_PARAMS and k not in _TYPED_KWARGS}
    return sampling, engine, notes


def live_spec(
    metadata: LegacyMetadata, *, model: str | None = None, assumed: Mapping[str, Any] | None = None
) -> tuple[ModelSpec, list[str]]:
    """The live run equivalent to a legacy VLLM descriptor, and the ``--assume-setting`` notes applied.

    ``model`` replaces the legacy model id (``--assume-current-model LEGACY=CURRENT``).
    Raises :class:`LegacyMappingError` when the live rules cannot reproduce it.
    """
    doc = metadata.doc
    assumed = dict(assumed or {})
    _vllm_provider(metadata)
    legacy_model = metadata.model
    if not legacy_model:
        raise LegacyMappingError("legacy descriptor has no model")
    if metadata.form is MetadataForm.S3:
        _unknown_keys(doc, _S3_KEYS)
        if doc.get("endpoint"):
            raise LegacyMappingError(
                f"served through the endpoint {doc['endpoint']!r}: the live rules describe the offline engine"
            )
        kwargs = _mapping(doc.get("model_kwargs"), "model_kwargs")
        # An older form recorded the wrapper's sampling defaults beside model_kwargs.
        for key, value in _mapping(doc.get("sampling"), "sampling").items():
            kwargs.setdefault(key, value)
        sampling, engine, notes = _split_s3(kwargs, assumed)
        chat_template = kwargs.get("chat_template")
        template_kwargs = _mapping(kwargs.get("chat_template_kwargs"), "chat_template_kwargs")
        budget = kwargs.get("thinking_token_budget")
        enable_thinking = False if kwargs.get("disable_thinking") is True else None
    elif metadata.form is MetadataForm.S2:
        _unknown_keys(doc, _S2_KEYS)
        sampling = _mapping(doc.get("sampling"), "sampling")
        engine = _mapping(doc.get("engine_settings"), "engine_settings")
        routed_sampling = {k: v for k, v in assumed.items() if k in SAMPLING_PARAMS}
        routed_engine = {k: v for k, v in assumed.items() if k not in SAMPLING_PARAMS}
        notes = _apply_assumed(sampling, dict(sampling), routed_sampling)
        notes += _apply_assumed(engine, dict(engine), routed_engine)
        chat_template = doc.get("chat_template")
        template_kwargs = _mapping(doc.get("chat_template_kwargs"), "chat_template_kwargs")
        budget = sampling.pop("thinking_token_budget", None)
        enable_thinking = None
    else:
        raise LegacyMappingError(f"a {metadata.form.value} metadata.json records no sampling settings")
    input_mode = _input_mode(doc.get("input_mode"))
    if chat_template is not None and not isinstance(chat_template, str):
        raise LegacyMappingError("chat_template is not a string")
    if sampling.get("max_tokens") is None:
        # The legacy wrapper's own default (not vLLM's 16) applied; which one is not recorded, so it is not guessed.
        raise LegacyMappingError(
            "max_tokens is not recorded; pass --assume-setting max_tokens=N with the value the legacy run used"
        )
    max_tokens = sampling["max_tokens"]
    if isinstance(max_tokens, int | float) and not isinstance(max_tokens, bool) and max_tokens < 1:
        # vLLM refuses it, so no live run could compute the descriptor and the rows would never hit.
        raise LegacyMappingError(f"max_tokens {max_tokens!r}: a live run needs at least 1 (vLLM refuses less)")
    # The legacy vLLM wrapper's defaults: a missing or null temperature / top_p meant these.
    if sampling.get("temperature") is None:
        sampling["temperature"] = VLLM_LEGACY_TEMPERATURE
    if sampling.get("top_p") is None:
        sampling["top_p"] = VLLM_LEGACY_TOP_P
    if budget is not None and not isinstance(budget, int):
        raise LegacyMappingError(f"thinking_token_budget {budget!r} is not an integer")
    spec = ModelSpec(
        model=model or legacy_model,
        input_mode=input_mode,
        sampling=sampling,
        engine_kwargs=engine,
        chat_template=chat_template,
        chat_template_kwargs=template_kwargs,
        enable_thinking=enable_thinking,
        thinking_token_budget=budget,
    )
    return spec, notes


def legacy_backend_version(metadata: LegacyMetadata) -> str | None:
    """The vLLM version the legacy rows came from, None where the file records none.

    Any other value (a number, an empty string) is refused: read as "none
    recorded", it would put the rows of two engine versions under one descriptor.
    """
    name = "backend_version" if metadata.form is MetadataForm.S3 else "vllm_version"
    value = metadata.doc.get(name)
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise LegacyMappingError(f"{name} {value!r} is not a version (a string, such as '0.10.1')")
    return value


def pinned_descriptor(spec: ModelSpec) -> ModelDescriptor:
    """``spec.descriptor``, where the model cannot be pinned with the advice that works for an import.

    A live run may cache under an unpinned descriptor (``--allow-unpinned``); an import may not: rows under one
    never hit a pinned run, which is what an import is for.
    """
    try:
        return spec.descriptor
    except UnpinnedModelError as e:
        raise LegacyMappingError(
            f"{spec.model} cannot be pinned to a commit: the local Hugging Face cache does not have it and the Hub "
            f"cannot be asked. Put its tokenizer files in the cache first (`hf download {spec.model} "
            f"{' '.join(TEMPLATE_FILES)}`), or name a whole judgestore descriptor with --descriptor FILE (the "
            "metadata.json of a live run)"
        ) from e


def map_legacy_descriptor(
    metadata: LegacyMetadata, *, model: str | None = None, assumed: Mapping[str, Any] | None = None
) -> tuple[ModelDescriptor, ModelSpec, list[str]]:
    """The descriptor a live run with the legacy settings computes, on the legacy vLLM version.

    Resolves revision and chat template from the model *as it is now* (that is
    what the live rules do): callers record that as an assumption.
    """
    backend_version = legacy_backend_version(metadata)  # first: it may refuse the file before the model is read
    spec, notes = live_spec(metadata, model=model, assumed=assumed)
    try:
        descriptor = pinned_descriptor(spec)
    except LegacyMappingError:
        raise
    except (InvalidInputError, OSError) as e:
        raise LegacyMappingError(f"the live rules refuse these settings: {e}") from e
    return descriptor.model_copy(update={"backend_version": backend_version}), spec, notes
