"""judgestore's cache boundary: the public names, importable from ``inference`` itself.

Contract:

* ``from inference import ModelSpec, HostedSpec, CompletionRequest,
  JudgementRequest`` (and the other names of :data:`__all__`) is the
  supported way in; the modules behind these names may move, these names
  stay.
* Importing ``inference`` imports nothing of these until a name is used
  (:pep:`562`); nothing here imports vLLM, torch or the ``openai`` client,
  and ``langchain_core`` only when ``CachedChatModel`` is used (the
  ``langchain`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public name -> the module that defines it.
_WHERE = {
    "ModelSpec": "inference.spec",
    "DEFAULT_SAMPLING": "inference.spec",
    "HostedSpec": "inference.hosted",
    "CachedModel": "inference.cached",
    "CachedChatModel": "inference.langchain",
    "CompletionRequest": "inference.requests",
    "JudgementRequest": "inference.requests",
    "Response": "inference.requests",
    "Sample": "inference.requests",
    "pairwise_requests": "inference.judging",
    "pointwise_request": "inference.judging",
    "run_requests": "inference.run",
    "RunSummary": "inference.run",
    "RequestsFailedError": "store.errors",
    "Responses": "inference.cached",
    "prepare_model": "inference.compat",
    "do_inference": "inference.compat",
    "PreparedModel": "inference.compat",
    "InferenceResult": "inference.compat",
    "chat_messages": "inference.messages",
    "token_logprobs_last_wins": "inference.logprob_views",
    "token_logprobs_merged": "inference.logprob_views",
    "openai_logprobs": "inference.logprob_views",
    "preference": "inference.logprob_views",
    "adopt": "inference.adopt",
}

__all__ = [
    "DEFAULT_SAMPLING",
    "CachedChatModel",
    "CachedModel",
    "CompletionRequest",
    "HostedSpec",
    "InferenceResult",
    "JudgementRequest",
    "ModelSpec",
    "PreparedModel",
    "RequestsFailedError",
    "Response",
    "Responses",
    "RunSummary",
    "Sample",
    "adopt",
    "chat_messages",
    "do_inference",
    "openai_logprobs",
    "pairwise_requests",
    "pointwise_request",
    "preference",
    "prepare_model",
    "run_requests",
    "token_logprobs_last_wins",
    "token_logprobs_merged",
]

if TYPE_CHECKING:
    from inference.adopt import adopt
    from inference.cached import CachedModel, Responses
    from inference.compat import InferenceResult, PreparedModel, do_inference, prepare_model
    from inference.hosted import HostedSpec
    from inference.judging import pairwise_requests, pointwise_request
    from inference.langchain import CachedChatModel
    from inference.logprob_views import openai_logprobs, preference, token_logprobs_last_wins, token_logprobs_merged
    from inference.messages import chat_messages
    from inference.requests import CompletionRequest, JudgementRequest, Response, Sample
    from inference.run import RunSummary, run_requests
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
