"""``--descriptor FILE``: the descriptor a user names for legacy sources that cannot be mapped.

Contract: :func:`load_user_descriptor` reads one of three forms and returns
the descriptor with the assumption to record in ``metadata.json``:

* a judgestore descriptor;
* a whole judgestore ``metadata.json`` (its ``descriptor``);
* ``{"vllm": {"model": .., "engine_kwargs": {..}, "sampling": {..}, ...}}``:
  the settings of a live run (:data:`~inference.legacy.settings.SPEC_FIELDS`,
  nothing else), resolved by the live rules
  (:attr:`inference.spec.ModelSpec.descriptor`) as the model is now.

A file that cannot be read, is not JSON or is none of these raises
:class:`~store.errors.InvalidInputError` naming the file and what to give.
Which sources the descriptor applies to is :mod:`inference.legacy.mapper`'s call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
from pydantic import ValidationError

from inference.legacy.settings import SPEC_FIELDS
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError


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
