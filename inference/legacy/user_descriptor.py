"""``--descriptor FILE``: the descriptor a user names for legacy sources that cannot be mapped.

Contract: :func:`load_user_descriptor` reads one of three forms and returns
the descriptor with the assumption to record in ``metadata.json``:

* a judgestore descriptor;
* a whole judgestore ``metadata.json`` (its ``descriptor``);
* ``{"vllm": {"model": .., "engine_kwargs": {..}, "sampling": {..}, ...}}``:
  the settings of a live run (:data:`~inference.legacy.settings.SPEC_FIELDS`,
  and ``backend_version``: the vLLM that made the rows), resolved by the live
  rules (:attr:`inference.spec.ModelSpec.descriptor`) as the model is now.
  Without ``backend_version``, the vLLM installed here is assumed, and the
  assumption recorded says so.

A file that cannot be read, is not JSON or is none of these raises
:class:`~store.errors.InvalidInputError` naming the file and what to give.
Which sources the descriptor applies to is :mod:`inference.legacy.mapper`'s call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from pydantic import ValidationError

from inference.backends.hosted.descriptor import keys_in_environment
from inference.backends.secrets import KEY_REFUSAL, refuse_secrets
from inference.legacy.settings import SPEC_FIELDS, pinned_descriptor
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError

_VERSION = "backend_version"


@dataclass(frozen=True)
class UserDescriptor:
    """A descriptor named with ``--descriptor FILE``."""

    descriptor: ModelDescriptor
    source: Path
    assumption: str
    spec: ModelSpec | None = None  # the live settings of the vllm form, which an adopt command line names


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
        settings = {k: v for k, v in vllm.items() if k != "backend_version"}
        unknown = sorted(set(settings) - SPEC_FIELDS)
        if unknown:
            raise InvalidInputError(
                f"{path}: invalid vLLM settings (unknown keys {unknown}; known: {sorted(SPEC_FIELDS | {_VERSION})})"
            )
        made_by = vllm.get("backend_version")
        if made_by is not None and (not isinstance(made_by, str) or not made_by.strip()):
            raise InvalidInputError(f'{path}: backend_version must be a vLLM version such as "0.8.5"')
        try:
            spec = ModelSpec(**settings)
            descriptor = pinned_descriptor(spec)
            if made_by is not None:
                descriptor = ModelDescriptor.model_validate(descriptor.model_dump() | {_VERSION: made_by.strip()})
        except (TypeError, InvalidInputError, ValidationError) as e:
            raise InvalidInputError(f"{path}: invalid vLLM settings ({e})") from e
        version = (
            f"made by vLLM {made_by.strip()}, as the file says"
            if made_by is not None
            else f"made by vLLM {descriptor.backend_version}, the version installed here (the file names none: "
            "give backend_version if another made them)"
        )
        assumption = (
            f"imported under the vLLM settings of {path.name}, given by the user; revision and chat template "
            f"resolved from {spec.model} as it was on {today}; {version}"
        )
        return UserDescriptor(_without_secrets(descriptor, path), path, assumption, spec)
    raw = doc.get("descriptor", doc)
    try:
        descriptor = ModelDescriptor.model_validate(raw)
    except ValidationError as e:
        raise InvalidInputError(
            f"{path}: not a judgestore descriptor ({e.error_count()} problems, first: {e.errors()[0]['msg']} at "
            f"{'.'.join(map(str, e.errors()[0]['loc']))}); give a descriptor, a judgestore metadata.json, or "
            '{"vllm": {"model": ..., "engine_kwargs": {...}, "sampling": {...}}}'
        ) from e
    return UserDescriptor(
        _without_secrets(descriptor, path), path, f"imported under the descriptor of {path.name}, given by the user"
    )


def _without_secrets(descriptor: ModelDescriptor, path: Path) -> ModelDescriptor:
    """``descriptor``, refused if it holds a credential: it is written into metadata.json and pushed to the Hub
    with the rows (a key in the file's endpoint or sampling was imported and published, was). The refusal names
    the field, never the value."""
    refuse_secrets(
        descriptor.model_dump(mode="json", exclude={"endpoint"}), f"{path}: descriptor", keys_in_environment()
    )
    if descriptor.endpoint is not None:
        refuse_secrets(descriptor.endpoint, f"{path}: descriptor.endpoint", keys_in_environment())
        parts = urlsplit(descriptor.endpoint)
        if "@" in parts.netloc or parts.query or parts.fragment:
            raise InvalidInputError(
                f"{path}: descriptor.endpoint carries credentials, a query or a fragment (not shown); give the plain "
                "base URL (.../v1): " + KEY_REFUSAL
            )
    return descriptor
