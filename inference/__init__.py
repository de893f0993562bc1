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

Where they live: at the top the vocabulary (:mod:`inference.requests`,
:mod:`inference.judging`), the specs (:mod:`inference.spec`) and one whole run
(:mod:`inference.run`); the cache boundary in :mod:`inference.cache`; the
engines in :mod:`inference.backends` (``vllm``, ``hosted``); explain, audit
and adopt in :mod:`inference.drift`; legacy imports in
:mod:`inference.legacy`; the commands in :mod:`inference.cli`; the drop-in
shapes (:mod:`inference.langchain`, :mod:`inference.compat`,
:mod:`inference.messages`, :mod:`inference.logprob_views`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public name -> the module that defines it.
_WHERE = {
    "Spec": "inference.spec",
    "ModelSpec": "inference.spec",
    "DEFAULT_SAMPLING": "inference.spec",
    "HostedSpec": "inference.spec",
    "RetryPolicy": "inference.backends.hosted.client",
    "CachedModel": "inference.cache.model",
    "CachedChatModel": "inference.langchain",
    "Plan": "inference.cache.plan",
    "CallStats": "inference.cache.accounting",
    "CompletionRequest": "inference.requests",
    "JudgementRequest": "inference.requests",
    "Response": "inference.requests",
    "Sample": "inference.requests",
    "pairwise_requests": "inference.judging",
    "pointwise_request": "inference.judging",
    "run_requests": "inference.run",
    "RunResult": "inference.run",
    "RunSummary": "inference.run",
    "audit_database": "inference.drift.audit",
    "AuditReport": "inference.drift.audit",
    "adopt": "inference.drift.adopt",
    "AdoptionReport": "inference.drift.adopt",
    "RequestsFailedError": "store.errors",
    "AdoptionError": "store.errors",
    "Responses": "inference.cache.model",
    "prepare_model": "inference.compat",
    "do_inference": "inference.compat",
    "PreparedModel": "inference.compat",
    "InferenceResult": "inference.compat",
    "chat_messages": "inference.messages",
    "token_logprobs_last_wins": "inference.logprob_views",
    "token_logprobs_merged": "inference.logprob_views",
    "openai_logprobs": "inference.logprob_views",
    "preference": "inference.logprob_views",
}

__all__ = [
    "DEFAULT_SAMPLING",
    "AdoptionError",
    "AdoptionReport",
    "AuditReport",
    "CachedChatModel",
    "CachedModel",
    "CallStats",
    "CompletionRequest",
    "HostedSpec",
    "InferenceResult",
    "JudgementRequest",
    "ModelSpec",
    "Plan",
    "PreparedModel",
    "RequestsFailedError",
    "Response",
    "Responses",
    "RetryPolicy",
    "RunResult",
    "RunSummary",
    "Sample",
    "Spec",
    "adopt",
    "audit_database",
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
    from inference.backends.hosted.client import RetryPolicy
    from inference.cache.accounting import CallStats
    from inference.cache.model import CachedModel, Responses
    from inference.cache.plan import Plan
    from inference.compat import InferenceResult, PreparedModel, do_inference, prepare_model
    from inference.drift.adopt import AdoptionReport, adopt
    from inference.drift.audit import AuditReport, audit_database
    from inference.judging import pairwise_requests, pointwise_request
    from inference.langchain import CachedChatModel
    from inference.logprob_views import openai_logprobs, preference, token_logprobs_last_wins, token_logprobs_merged
    from inference.messages import chat_messages
    from inference.requests import CompletionRequest, JudgementRequest, Response, Sample
    from inference.run import RunResult, RunSummary, run_requests
    from inference.spec import DEFAULT_SAMPLING, HostedSpec, ModelSpec, Spec
    from store.errors import AdoptionError, RequestsFailedError


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
