"""Is the engine the descriptor's? Checked before vLLM loads it and again after, so no row is stored under a lie.

Contract:

* Before the load: :func:`check_engine_kwargs` refuses engine kwargs whose
  output-affecting part (model, tokenizer, settings) is not the descriptor's,
  and :func:`check_template` a chat template other than the one it hashed;
  both raise :class:`~store.errors.InvalidInputError`.
* After the load: :func:`verify_loaded` raises
  :class:`~store.errors.EngineMismatchError` unless the commit vLLM resolved,
  the local folder's digest and the chat template it will apply
  (:func:`loaded_chat_template`, vLLM's own choice) are what the descriptor
  names. Importing this module imports neither vLLM nor torch; asking a
  loaded engine for its template imports vLLM's renderer, already loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference.backends.vllm.descriptor import engine_settings
from inference.backends.vllm.model_source import COMMIT_RE, local_model_digest, model_name
from store.descriptor import ModelDescriptor, sha256_hex
from store.errors import EngineMismatchError, InvalidInputError


def check_template(descriptor: ModelDescriptor, template: str | None) -> None:
    """Refuse to chat under a template other than the one ``descriptor`` hashed.

    Catches the easy mistake of building the descriptor with an explicit
    template and the backend without it (or the other way round), which would
    store generations under a descriptor that did not produce them.
    """
    if descriptor.input_mode != "chat":
        return
    sha = sha256_hex(template.encode()) if template is not None else None
    if sha != descriptor.chat_template_sha256:
        raise InvalidInputError(
            f"the chat template the engine would apply (sha256 {sha}) is not the descriptor's "
            f"({descriptor.chat_template_sha256}); pass the same chat_template to the descriptor and the backend"
        )


def check_engine_kwargs(descriptor: ModelDescriptor, model: str, engine_kwargs: Mapping[str, Any]) -> None:
    """Refuse engine kwargs whose output-affecting part differs from the descriptor's."""
    name = model_name(os.fspath(engine_kwargs.get("model", model)))
    if name != descriptor.model:
        raise InvalidInputError(f"engine model {name!r} is not the descriptor's {descriptor.model!r}")
    given = engine_settings(engine_kwargs)
    # A separate tokenizer is named in the descriptor with its resolved revision,
    # which the kwargs do not carry: compare the rest.
    expected = {k: v for k, v in descriptor.engine.items() if k not in ("tokenizer", "tokenizer_revision")}
    tokenizer = engine_kwargs.get("tokenizer")
    tokenizer_name = model_name(os.fspath(tokenizer)) if tokenizer is not None else descriptor.model
    if tokenizer_name != descriptor.engine.get("tokenizer", descriptor.model):
        raise InvalidInputError(f"engine tokenizer {tokenizer_name!r} is not the descriptor's")
    if (
        descriptor.model_copy(update={"engine": given}).sha256()
        != descriptor.model_copy(update={"engine": expected}).sha256()
    ):
        differ = sorted(k for k in given.keys() | expected.keys() if given.get(k) != expected.get(k))
        raise InvalidInputError(
            f"engine kwargs differ from the descriptor in {differ}; build the descriptor from the same kwargs"
        )


def pinned_commit(descriptor: ModelDescriptor) -> str | None:
    revision = descriptor.revision
    return revision if revision is not None and COMMIT_RE.match(revision) else None


def loaded_chat_template(llm: Any, explicit: str | None) -> str | None:
    """The template a loaded engine applies to chats: vLLM's own choice (explicit, processor, tokenizer, fallback)."""
    from vllm.renderers.hf import resolve_chat_template

    return resolve_chat_template(llm.get_tokenizer(), explicit, None, model_config=llm.llm_engine.model_config)


def verify_loaded(llm: Any, descriptor: ModelDescriptor, model: str, explicit: str | None) -> None:
    """Raise :class:`EngineMismatchError` unless the loaded engine is what ``descriptor`` names.

    Checked after the load and before any row can be written: the commit vLLM
    resolved (a Hub model), the folder's digest (a local one, whose files may
    have changed since the descriptor was computed), and the chat template it
    will apply. An unpinned descriptor pins neither, by the caller's choice.
    """
    problems = []
    if descriptor.revision is not None and descriptor.revision.startswith("sha256:"):
        digest = local_model_digest(Path(model))
        if digest != descriptor.revision:
            problems.append(f"the folder {model} now digests to {digest}, not the descriptor's {descriptor.revision}")
    elif (commit := pinned_commit(descriptor)) is not None:
        loaded = getattr(llm.llm_engine.model_config, "revision", None)
        if loaded != commit:
            problems.append(f"vLLM loaded revision {loaded}, not the descriptor's commit {commit}")
    if descriptor.input_mode == "chat" and not descriptor.unpinned:
        template = loaded_chat_template(llm, explicit)
        sha = sha256_hex(template.encode()) if template is not None else None
        if sha != descriptor.chat_template_sha256:
            problems.append(
                f"vLLM applies a chat template with sha256 {sha}, "
                f"not the descriptor's {descriptor.chat_template_sha256}"
            )
    if problems:
        raise EngineMismatchError(
            f"{descriptor.model}: the engine vLLM loaded is not the one the cache key describes: "
            + "; ".join(problems)
            + ". Nothing was generated or written; run again (the key is computed afresh), or report the model "
            "if it persists (vLLM may pick a template from files judgestore does not read)"
        )
