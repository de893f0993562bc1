"""Models, engines and hosted servers, and the cache boundary in front of them.

Contract:

* :class:`ModelError` is every error about the model a run names and the
  engine (vLLM) or server (an OpenAI-compatible endpoint, :class:`HostedAPIError`)
  that serves it; a hosted error names the endpoint, never an API key.
* One request the engine or server refuses is a :class:`RequestRefusedError`,
  which fails alone: the rest of its batch is generated and stored.
* At the cache boundary: :class:`CacheMissError` (``replay`` met an input the
  store does not hold), :class:`AdoptionError`, and
  :class:`RequestsFailedError`, raised at the end of a call some of whose
  requests failed, carrying every answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store.errors.base import JudgestoreError
from store.errors.inputs import InvalidInputError

__all__ = [
    "AdoptionError",
    "BackendError",
    "CacheMissError",
    "EngineMismatchError",
    "HostedAPIError",
    "HostedAuthError",
    "HostedModelNotFoundError",
    "HostedNotFoundError",
    "HostedRequestError",
    "HostedResponseError",
    "HostedUnavailableError",
    "MissingAPIKeyError",
    "ModelError",
    "ModelFolderNotFoundError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelWeightsChangedError",
    "PromptTooLongError",
    "RequestRefusedError",
    "RequestsFailedError",
    "UnpinnedModelError",
]


class ModelError(JudgestoreError):
    """Base class of the errors about the model a run names and the engine that serves it."""


class UnpinnedModelError(ModelError):
    """A Hub model that can be pinned to a commit neither from the local cache nor through the Hub."""


class ModelNotFoundError(ModelError, InvalidInputError):
    """The Hub does not know this model, this revision, or refuses access to it."""


class ModelFolderNotFoundError(ModelError, InvalidInputError):
    """A model named by a path (``./m``, ``../m``, ``/m``, ``~/m``, or ``d/m`` with ``d`` an existing folder) that is
    not a folder."""


class ModelLoadError(ModelError):
    """The engine could not load the model: a folder whose config or weights are missing or damaged, a device
    without the memory for it (nothing was generated, nothing written)."""


class ModelWeightsChangedError(ModelError):
    """A local model folder's weights changed in bytes its key does not read, since this machine first used it."""


class EngineMismatchError(ModelError):
    """The engine vLLM loaded (commit, folder, chat template) is not what the descriptor names."""


class RequestRefusedError(ModelError, InvalidInputError):
    """The engine or server refused one request of a batch (a value it rejects, a prompt too long for it).

    That request fails alone: nothing of it is stored, and the rest of the batch is generated and stored.
    """


class PromptTooLongError(RequestRefusedError):
    """A prompt leaves no room for one generated token within the engine's context (``max_model_len``).

    Found with the model's own tokenizer and chat template before the engine loads.
    """


class BackendError(ModelError):
    """An engine or server broke the backend contract (e.g. returned the wrong number of generations)."""


# ---------------------------------------------------------------- the cache boundary


class CacheMissError(JudgestoreError):
    """``replay`` mode met an input that the store does not hold.

    ``missing_requests`` holds the index (in the call's request order) of
    every request with a sample the store does not hold, and ``responses``
    one entry per request of the call: the response the store gave it, None
    for a missing one, so a caller answers the others from the same lookup
    (the LangChain model does).
    """

    def __init__(self, message: str, *, missing_requests: Sequence[int] = (), responses: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.missing_requests = tuple(missing_requests)
        self.responses = list(responses)


class RequestsFailedError(JudgestoreError):
    """Some requests of a ``complete``/``judge`` call failed; every other one was answered (and stored).

    Raised at the end of the call. ``failures`` lists each failed input (an
    :class:`inference.cache.plan.Failure`: its request, sample and typed error);
    ``responses`` holds every response in request order, the failed ones
    marked with their ``error``, so nothing answered is lost by raising.
    """

    def __init__(self, message: str, *, failures: Sequence[Any], responses: Sequence[Any]) -> None:
        self.failures = list(failures)
        # A list is kept as given: the cache boundary's carries what its call did (``responses.run``).
        self.responses = responses if isinstance(responses, list) else list(responses)
        super().__init__(message)


class AdoptionError(JudgestoreError, ValueError):
    """``judgestore adopt`` has no single source descriptor it may adopt from: none, several, or one that differs
    in a field the caller did not allow. Raised before any engine is loaded; nothing is written."""


# ---------------------------------------------------------------- hosted models (OpenAI-compatible servers)


class HostedAPIError(ModelError):
    """A hosted API or served model (OpenAI-compatible endpoint) could not be used.

    ``endpoint`` is the base URL (never a secret); ``status`` the HTTP status
    when there was one. Messages never include an API key.
    """

    def __init__(self, endpoint: str, message: str, *, status: int | None = None) -> None:
        self.endpoint, self.status = endpoint, status
        super().__init__(f"{endpoint}: {message}")


class MissingAPIKeyError(HostedAPIError):
    """The environment variable that should hold the API key is not set, or empty."""


class HostedAuthError(HostedAPIError):
    """401 / 403: the server refused the API key, or the key may not use this model."""


class HostedNotFoundError(HostedAPIError):
    """404 for something other than the model: usually a base URL without its ``/v1``."""


class HostedModelNotFoundError(HostedNotFoundError):
    """The server does not serve the model the descriptor names."""


class HostedRequestError(HostedAPIError, RequestRefusedError):
    """The server rejected a request itself (400, 413, 422): a prompt too long for it, a value or setting it refuses.

    Like every :class:`RequestRefusedError`, it fails that request alone.
    """


class HostedResponseError(HostedAPIError):
    """The server answered 200 with a body that is not a completion (malformed JSON, no choices)."""


class HostedUnavailableError(HostedAPIError):
    """429 / 5xx / timeouts / connection errors that outlasted every retry, or a wait no retry would end.

    The latter: a Retry-After too long to wait, or a spent quota (a 429
    ``insufficient_quota``), neither of them retried.
    """
