"""judgestore's cache boundary: the public names, importable from ``inference`` itself.

Contract:

* ``from inference import ModelSpec, HostedSpec, CompletionRequest,
  JudgementRequest`` (and the other names of :data:`__all__`) is the
  supported way in; the modules behind these names may move, these names
  stay.
* Importing ``inference`` imports nothing of these until a name is used
  (:pep:`562`); nothing here imports vLLM, torch or the ``openai`` client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public name -> the module that defines it.
_WHERE = {
    "ModelSpec": "inference.spec",
    "DEFAULT_SAMPLING": "inference.spec",
    "HostedSpec": "inference.backends.hosted.spec",
    "CachedModel": "inference.cache.model",
    "CompletionRequest": "inference.requests",
    "JudgementRequest": "inference.requests",
    "Response": "inference.requests",
    "Sample": "inference.requests",
    "pairwise_requests": "inference.judging",
    "pointwise_request": "inference.judging",
    "run_requests": "inference.cache.run",
    "RunSummary": "inference.cache.run",
    "RequestsFailedError": "store.errors",
}

__all__ = [
    "DEFAULT_SAMPLING",
    "CachedModel",
    "CompletionRequest",
    "HostedSpec",
    "JudgementRequest",
    "ModelSpec",
    "RequestsFailedError",
    "Response",
    "RunSummary",
    "Sample",
    "pairwise_requests",
    "pointwise_request",
    "run_requests",
]

if TYPE_CHECKING:
    from inference.backends.hosted.spec import HostedSpec
    from inference.cache.model import CachedModel
    from inference.cache.run import RunSummary, run_requests
    from inference.judging import pairwise_requests, pointwise_request
    from inference.requests import CompletionRequest, JudgementRequest, Response, Sample
    from inference.spec import DEFAULT_SAMPLING, ModelSpec
    from store.errors import RequestsFailedError


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
