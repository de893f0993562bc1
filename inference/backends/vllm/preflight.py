"""What vLLM would refuse, found before it loads: prompts that leave no room for an answer, and empty ones.

Contract:

* :class:`PromptLengthCheck` is the :data:`~inference.backends.base.Preflight` of a
  vLLM model (:meth:`inference.spec.ModelSpec.preflight`). It refuses, with
  :class:`~store.errors.PromptTooLongError`, a request whose prompt is at
  least ``max_model_len`` tokens: exactly what vLLM 0.32 refuses (it keeps
  one position for the first generated token). A prompt that fits but
  leaves fewer positions than ``max_tokens`` is not refused: vLLM answers
  it, stopping at ``max_model_len`` with finish reason ``length``, and the
  answer is stored like any other. A prompt of no tokens at all (an empty
  text whose tokenizer adds no BOS) is a
  :class:`~store.errors.RequestRefusedError`, as vLLM refuses it.
* Tokens are counted as vLLM counts them: the model's tokenizer
  (``transformers.AutoTokenizer``, as vLLM loads it, from the model folder
  or the Hugging Face snapshot of the descriptor's commit) renders a chat
  with the template vLLM applies (the explicit one, else the tokenizer's),
  ``add_generation_prompt`` and the descriptor's chat template kwargs, and
  tokenizes it without adding special tokens; a text prompt is tokenized
  with them.
* It refuses only what it is sure of. The context is the engine's
  ``max_model_len`` when given, else the model's ``config.json`` when it
  names one plainly (no RoPE scaling factor). Whatever it cannot tell (no
  tokenizer files here, a tokenizer mode other than ``auto``/``hf``, a chat
  the template refuses to render, a context it cannot read) it leaves to
  the engine, which refuses such a request alone
  (:class:`~inference.backends.vllm.backend.VLLMBackend`).
* Lazy: nothing is read or imported until a batch has misses (a run that is
  all hits never calls it); the tokenizer is loaded once per check. Loading
  it imports transformers, which the engine that follows imports anyway: the
  check is free unless every miss is refused, and then the engine is never
  loaded at all.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.backends.base import EngineRequest
from inference.backends.vllm.descriptor import load_chat_template_text
from inference.backends.vllm.model_source import COMMIT_RE, cached_snapshot
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, JudgestoreError, PromptTooLongError, RequestRefusedError
from store.interrupts import deferred_interrupts

log = logging.getLogger("judgestore.preflight")

# Where vLLM reads a model's own context length (the smallest wins), as in vLLM 0.32's
# ModelArchConfigConvertorBase.derive_max_model_len_and_key; model_max_length overrides them.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_MISTRAL_FILES = ("tekken.json", "params.json")  # vLLM's auto mode picks its own tokenizer for these
# Settings under which vLLM counts or cuts a prompt otherwise than this check does.
_UNSURE_ENGINE = ("skip_tokenizer_init", "hf_overrides", "tokenizer_mode")
_UNSURE_SAMPLING = ("truncate_prompt_tokens",)


def _check_compiles(template: str) -> None:
    """Raise :class:`InvalidInputError` for a chat template Jinja cannot compile, as transformers compiles it."""
    from jinja2 import TemplateSyntaxError
    from transformers.utils import chat_template_utils

    compile_template = getattr(chat_template_utils, "_compile_jinja_template", None)  # private: checked if there
    if compile_template is None:
        return
    try:
        compile_template(template)
    except TemplateSyntaxError as e:
        raise InvalidInputError(f"the chat template is not valid Jinja: {e.message} (line {e.lineno})") from e


def context_length(config_folder: Path | None, engine_kwargs: Mapping[str, Any]) -> tuple[int, str] | None:
    """vLLM's ``max_model_len`` for these settings, and where it comes from; None when it cannot be sure."""
    given = engine_kwargs.get("max_model_len")
    if given is not None:
        if isinstance(given, int) and not isinstance(given, bool) and given > 0:
            return given, "max_model_len"
        return None  # "auto", -1, "32k": vLLM works it out
    if config_folder is None:
        return None
    try:
        config = json.loads((config_folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        return None
    for rope in (text.get("rope_scaling"), text.get("rope_parameters")):
        if isinstance(rope, dict) and rope.get("factor") not in (None, 1, 1.0):
            return None  # vLLM scales the context by the RoPE factor, depending on its type
    found = {key: text[key] for key in _CONTEXT_KEYS if isinstance(text.get(key), int) and text[key] > 0}
    if "model_max_length" in found:
        return found["model_max_length"], "config.json model_max_length"
    if not found:
        return None  # vLLM assumes 2048 and warns
    key = min(found, key=lambda k: found[k])
    return found[key], f"config.json {key}"


class PromptLengthCheck:
    """The preflight of one vLLM model: refuses prompts of ``max_model_len`` tokens or more (module docstring)."""

    def __init__(
        self,
        descriptor: ModelDescriptor,
        model: str,
        engine_kwargs: Mapping[str, Any],
        chat_template: str | None = None,
    ) -> None:
        self._descriptor = descriptor
        self._model = model
        self._engine_kwargs = dict(engine_kwargs)
        self._chat_template = chat_template
        self._prepared = False
        self._tokenizer: Any = None
        self._context: tuple[int, str] | None = None
        self._template: str | None = None

    def __call__(self, requests: Sequence[EngineRequest]) -> dict[int, JudgestoreError]:
        if not self._prepared:
            self._prepared = True
            self._prepare()
        if self._tokenizer is None or self._context is None:
            return {}
        limit, source = self._context
        refused: dict[int, JudgestoreError] = {}
        for i, request in enumerate(requests):
            count = self._count(request)
            if count == 0:  # an empty text prompt whose tokenizer adds no BOS: vLLM refuses it, after it loads
                refused[i] = RequestRefusedError(
                    "the prompt is empty (0 tokens): vLLM refuses an empty prompt. Give it some text, or drop it"
                )
            elif count is not None and count >= limit:
                refused[i] = PromptTooLongError(
                    f"the prompt is {count} tokens{' with its chat template' if self._chat else ''}, and the model's "
                    f"context is {limit} ({source}): vLLM refuses a prompt that leaves no room for one generated "
                    "token. Shorten it, or raise --engine-arg max_model_len (a new descriptor)"
                )
        return refused

    @property
    def _chat(self) -> bool:
        return self._descriptor.input_mode == "chat"

    def _prepare(self) -> None:
        """Find the context and load the tokenizer; on any doubt, leave both unset (the engine decides). An explicit
        chat template that does not compile is refused here, before the engine loads (vLLM compiles it the same way,
        through transformers, once loaded)."""
        kwargs = self._engine_kwargs
        if self._chat:
            # A template passed per request wins over the engine's own (LLM(chat_template=...)), as in vLLM.
            explicit = self._chat_template if self._chat_template is not None else kwargs.get("chat_template")
            self._template = None if explicit is None else load_chat_template_text(explicit)
            if self._template is not None:
                _check_compiles(self._template)
        extra = self._descriptor.sampling.model_extra or {}
        if any(kwargs.get(k) not in (None, False, "auto", "hf") for k in _UNSURE_ENGINE) or any(
            extra.get(k) is not None for k in _UNSURE_SAMPLING
        ):
            return
        tokenizer_folder = self._folder(kwargs.get("tokenizer"), self._descriptor.engine.get("tokenizer_revision"))
        model_folder = self._folder(None, None)
        if tokenizer_folder is None or any((tokenizer_folder / name).exists() for name in _MISTRAL_FILES):
            return
        self._context = context_length(model_folder, kwargs)
        if self._context is None:
            return
        # The run's first import of torch, through transformers: a signal inside its C++ initialisation aborts the
        # process (SIGABRT, a core dump), so it is held until the tokenizer is loaded, as the engine's start is
        with deferred_interrupts("once the tokenizer is loaded"):
            try:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(
                    os.fspath(tokenizer_folder),
                    trust_remote_code=bool(kwargs.get("trust_remote_code", False)),
                    local_files_only=True,
                )
            except Exception as e:  # a tokenizer this check cannot load: the engine decides
                log.debug("no prompt-length check for %s: %s", self._model, e)
                self._tokenizer = None

    def _folder(self, tokenizer: Any, tokenizer_revision: Any) -> Path | None:
        """The local folder of the model's (or its separate tokenizer's) files, or None when it is not here."""
        name = os.fspath(tokenizer) if tokenizer is not None else self._model
        if Path(name).is_dir():
            return Path(name)
        revision = tokenizer_revision if tokenizer is not None else self._descriptor.revision
        if not isinstance(revision, str) or not COMMIT_RE.match(revision):
            return None  # unpinned: which files vLLM will load is not known here
        return cached_snapshot(name, revision, self._engine_kwargs.get("download_dir"))

    def _count(self, request: EngineRequest) -> int | None:
        """The prompt's tokens as vLLM counts them, or None when this check cannot tell."""
        tokenizer = self._tokenizer
        try:
            if not self._chat:
                return len(tokenizer(request.rendered["text"], add_special_tokens=True, verbose=False)["input_ids"])
            template_kwargs: dict[str, Any] = dict(self._descriptor.chat_template_kwargs)
            if self._descriptor.enable_thinking is not None:
                template_kwargs["enable_thinking"] = self._descriptor.enable_thinking
            # vLLM's own settings win over the caller's template kwargs (vllm.renderers.params.merge_kwargs).
            template_kwargs |= {"add_generation_prompt": True, "continue_final_message": False}
            text = tokenizer.apply_chat_template(
                request.rendered["messages"], chat_template=self._template, tokenize=False, **template_kwargs
            )
            return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        except Exception as e:  # the template refuses the chat, say: the engine refuses it alone, with its reason
            log.debug("cannot count the prompt of a request to %s: %s", self._model, e)
            return None
