"""Legacy descriptors mapped onto :class:`ModelDescriptor` with exactly the live rules, so imports hit again.

Contract: a legacy metadata.json (S3+ ``judgearena-inference-cache/v1`` or S2
``judgearena-inference-descriptor/v1``) is turned into the vLLM settings a live
run would pass, as a :class:`~inference.spec.ModelSpec`, and the descriptor is
computed by its :attr:`~inference.spec.ModelSpec.descriptor`, i.e.
:func:`inference.descriptors.descriptor_from_vllm`, the one place where live
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
  descriptor and misses, by design.
* A legacy key this module does not know (top level, or ``input_mode`` other
  than chat/text) is not guessed: the source is skipped with its name.

Fields the old files never recorded, and what happens to them:

* The resolved model revision and the chat template's hash were never
  recorded. Without ``--assume-current-model`` such sources are skipped, with
  the reason and the option to use. ``--assume-current-model MODEL`` (the
  legacy model id or path, as recorded) or ``LEGACY=CURRENT`` (the legacy
  model is now at CURRENT, a hub id or folder, which is then the descriptor's
  model) resolves both from the model as it is now, exactly as a live run
  would; the assumption is written into ``metadata.json`` (``assumptions``).
* Settings the legacy wrapper hard-coded and never wrote (a logprobs count,
  say) can be asserted with ``--assume-setting KEY=VALUE``; each is recorded as
  an assumption. A key the file does record is never overridden.
* ``--descriptor FILE`` imports the sources that cannot be mapped (S0, S1,
  DataFrame caches, other providers, sources without an assumption) under a
  descriptor the user names: a judgestore descriptor (or a whole judgestore
  metadata.json), or ``{"vllm": {"model": .., "engine_kwargs": {..},
  "sampling": {..}, ...}}`` resolved by the live rules as the model is now. It
  applies to one legacy descriptor at most: sources carrying two different
  legacy descriptors are refused rather than merged under one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from inference.descriptors import backend_version as installed_backend_version
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, LegacyMappingError, UnpinnedModelError
from store.legacy.detect import Detection
from store.legacy.importer import Attribution
from store.legacy.metadata import LegacyMetadata, MetadataForm, check_metadata_folder

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
    shown: dict[str, Any] = {"model": spec.model, "input_mode": spec.input_mode, "sampling": dict(spec.sampling),
                             "engine_kwargs": dict(spec.engine_kwargs)}  # fmt: skip
    if spec.chat_template_kwargs:
        shown["chat_template_kwargs"] = dict(spec.chat_template_kwargs)
    if spec.enable_thinking:
        shown["enable_thinking"] = spec.enable_thinking
    if spec.thinking_token_budget:
        shown["thinking_token_budget"] = spec.thinking_token_budget
    if spec.chat_template is not None:
        shown["chat_template"] = spec.chat_template if len(spec.chat_template) < 60 else "(inline template)"
    return orjson.dumps(shown, option=orjson.OPT_SORT_KEYS).decode()


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
    value = metadata.doc.get("backend_version" if metadata.form is MetadataForm.S3 else "vllm_version")
    return value if isinstance(value, str) else None


def map_legacy_descriptor(
    metadata: LegacyMetadata, *, model: str | None = None, assumed: Mapping[str, Any] | None = None
) -> tuple[ModelDescriptor, ModelSpec, list[str]]:
    """The descriptor a live run with the legacy settings computes, on the legacy vLLM version.

    Resolves revision and chat template from the model *as it is now* (that is
    what the live rules do): callers record that as an assumption.
    """
    spec, notes = live_spec(metadata, model=model, assumed=assumed)
    try:
        descriptor = spec.descriptor
    except (InvalidInputError, UnpinnedModelError, OSError) as e:
        raise LegacyMappingError(f"the live rules refuse these settings: {e}") from e
    return descriptor.model_copy(update={"backend_version": legacy_backend_version(metadata)}), spec, notes


# ---------------------------------------------------------------- the user's descriptor


@dataclass(frozen=True)
class UserDescriptor:
    """A descriptor named with ``--descriptor FILE``."""

    descriptor: ModelDescriptor
    source: Path
    assumption: str


def load_user_descriptor(path: Path) -> UserDescriptor:
    """Read ``--descriptor FILE`` (see the module docstring for its forms); a bad file raises, naming it."""
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read the descriptor file ({e.strerror})") from e
    except orjson.JSONDecodeError as e:
        raise InvalidInputError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{path}: a descriptor file holds a JSON object")
    today = datetime.now(UTC).date().isoformat()
    if "vllm" in doc:
        vllm = doc["vllm"]
        if not isinstance(vllm, dict) or not isinstance(vllm.get("model"), str):
            raise InvalidInputError(f"{path}: 'vllm' must be an object with at least a 'model'")
        unknown = sorted(set(vllm) - SPEC_FIELDS)
        if unknown:
            raise InvalidInputError(
                f"{path}: invalid vLLM settings (unknown keys {unknown}; known: {sorted(SPEC_FIELDS)})"
            )
        try:
            spec = ModelSpec(**vllm)
            descriptor = spec.descriptor
        except (TypeError, InvalidInputError) as e:
            raise InvalidInputError(f"{path}: invalid vLLM settings ({e})") from e
        assumption = (
            f"imported under the vLLM settings of {path.name}, given by the user; revision and chat template "
            f"resolved from {spec.model} as it was on {today}"
        )
        return UserDescriptor(descriptor, path, assumption)
    raw = doc.get("descriptor", doc)
    try:
        descriptor = ModelDescriptor.model_validate(raw)
    except ValidationError as e:
        raise InvalidInputError(
            f"{path}: not a judgestore descriptor ({e.error_count()} problems, first: {e.errors()[0]['msg']} at "
            f"{'.'.join(map(str, e.errors()[0]['loc']))}); give a descriptor, a judgestore metadata.json, or "
            '{"vllm": {"model": ..., "engine_kwargs": {...}, "sampling": {...}}}'
        ) from e
    return UserDescriptor(descriptor, path, f"imported under the descriptor of {path.name}, given by the user")


# ---------------------------------------------------------------- the resolver


def parse_assumed_models(values: Sequence[str]) -> dict[str, str]:
    """``--assume-current-model`` values: ``MODEL`` (as recorded) or ``LEGACY=CURRENT``; legacy -> current."""
    result: dict[str, str] = {}
    for value in values:
        legacy, sep, current = value.partition("=")
        legacy, current = (legacy, current) if sep else (value, value)
        if not legacy or not current:
            raise InvalidInputError(f"--assume-current-model expects MODEL or LEGACY=CURRENT, got {value!r}")
        if legacy in result and result[legacy] != current:
            raise InvalidInputError(f"--assume-current-model names {legacy!r} twice")
        result[legacy] = current
    return result


def _same_model(a: str, b: str) -> bool:
    """Two spellings of one model: equal ids, or paths of the same folder."""
    if a == b:
        return True
    try:
        return os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)
    except OSError:
        return False


class LegacyDescriptorMapper:
    """The :data:`~store.legacy.importer.Resolver` of ``judgestore import``: live rules, assumptions, --descriptor."""

    def __init__(
        self,
        *,
        user_descriptor: UserDescriptor | None = None,
        assume_current_model: Mapping[str, str] | None = None,
        assume_settings: Mapping[str, Any] | None = None,
        detections: Sequence[Detection] = (),
    ) -> None:
        self.user = user_descriptor
        self.assumed_models = dict(assume_current_model or {})
        self.assumed_settings = dict(assume_settings or {})
        self._derived: dict[Path, Attribution] = {}
        # --descriptor may name one legacy descriptor, never merge several: find out which sources would use it.
        falling_back = {
            d.metadata.sha256
            for d in detections
            if d.ok
            and d.kind != "metadata"
            and d.metadata is not None
            and d.metadata.form in (MetadataForm.S3, MetadataForm.S2)
            and check_metadata_folder(d.metadata, d.tree) is None
            and self._derive(d).descriptor is None
        }
        self._user_refused = len(falling_back) > 1 and self.user is not None

    def _assumed_model_for(self, legacy: str) -> str | None:
        for name, current in self.assumed_models.items():
            if _same_model(name, legacy):
                return current
        return None

    def _derive(self, detection: Detection) -> Attribution:
        """The attribution from the legacy metadata alone (and the assumptions given), cached per source."""
        cached = self._derived.get(detection.path)
        if cached is not None:
            return cached
        self._derived[detection.path] = result = self._derive_uncached(detection)
        return result

    def _derive_uncached(self, detection: Detection) -> Attribution:
        metadata = detection.metadata
        if metadata is None or metadata.form not in (MetadataForm.S3, MetadataForm.S2):
            what = detection.variant or "this file"
            return Attribution(None, reason=f"{what} records no descriptor; import it with --descriptor FILE")
        try:
            recorded, _ = live_spec(metadata, assumed=self.assumed_settings)
        except LegacyMappingError as e:
            return Attribution(None, reason=str(e))
        current = self._assumed_model_for(recorded.model)
        if current is None:
            return Attribution(
                None,
                reason=(
                    f"the legacy descriptor does not record the resolved revision or chat template of "
                    f"{recorded.model!r}; pass --assume-current-model {recorded.model!r} to resolve them from the "
                    "model as it is now (recorded as an assumption), or --descriptor FILE"
                ),
            )
        try:
            descriptor, spec, assumed_notes = map_legacy_descriptor(
                metadata, model=current, assumed=self.assumed_settings
            )
        except LegacyMappingError as e:
            return Attribution(None, reason=str(e))
        today = datetime.now(UTC).date().isoformat()
        assumptions = [
            f"legacy cache recorded no revision or chat template for {metadata.model!r}; both were resolved from "
            f"{current!r} as it was on {today} (revision {descriptor.revision})"
        ]
        assumptions += [f"legacy run assumed to have used {note} (not recorded by the file)" for note in assumed_notes]
        notes = [f"live settings that hit these rows: {settings_line(spec)}"]
        installed = installed_backend_version()
        if descriptor.backend_version != installed:
            notes.append(
                f"rows were produced by vLLM {descriptor.backend_version}; this machine has {installed}: a live run "
                "here computes another descriptor and will not hit them (a different engine may change outputs)"
            )
        return Attribution(descriptor, tuple(assumptions), notes=tuple(notes))

    def __call__(self, detection: Detection) -> Attribution:
        derived = self._derive(detection)
        if derived.descriptor is not None or self.user is None:
            return derived
        if self._user_refused and detection.metadata is not None:
            return Attribution(
                None,
                reason=(
                    "--descriptor applies to one legacy descriptor, and the sources given carry several: "
                    "import each legacy descriptor folder on its own"
                ),
            )
        notes = (f"not mapped from its legacy descriptor: {derived.reason}",) if detection.metadata else ()
        return Attribution(self.user.descriptor, (self.user.assumption,), notes=notes)
