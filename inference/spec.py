"""A model as a user names it: what every spec is (:class:`Spec`), vLLM's and a server's.

Contract:

* :class:`Spec` is the one interface of a model a run can use, whatever runs
  it: a ``descriptor`` (the cache key), a ``display_name`` (recorded in
  rows), ``backend()`` (starts the engine or the client, called only when a
  batch has misses), an optional ``preflight``, ``sent()`` (what was sent to
  a server, for run summaries) and ``cached()``, the model behind a store.
  :class:`ModelSpec` (vLLM, in-process) and :class:`HostedSpec` (a server)
  implement it; :func:`~inference.run.run_requests`, the audit and adoption
  take it.
* :class:`ModelSpec` is the one place where user settings become a
  descriptor (:func:`inference.backends.vllm.descriptor.descriptor_from_vllm`)
  and a lazily prepared engine
  (:func:`inference.backends.vllm.backend.create_vllm_backend`); vLLM is
  imported only when :meth:`Spec.cached` actually needs the engine. Before it
  does, its :attr:`~ModelSpec.preflight`
  (:mod:`inference.backends.vllm.preflight`) refuses the prompts too long for
  the model, which then fail without it.
* :class:`HostedSpec` is the same for a model behind an OpenAI-compatible
  server: its descriptor is
  :func:`~inference.backends.hosted.descriptor.hosted_descriptor`'s, its
  backend the client of :mod:`inference.backends.hosted.client` (which
  imports ``openai`` only then). The API key is read from an environment
  variable when the backend is created, never stored on the spec.

Sampling settings a caller does not give take :data:`DEFAULT_SAMPLING`
(greedy, up to 256 new tokens), the same defaults as the command line;
every other setting is the engine's or the server's own default.
"""

from __future__ import annotations

import abc
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

from inference.backends.base import Backend, Preflight
from inference.backends.hosted.client import DEFAULT_TIMEOUT_S, RequestStats, RetryPolicy
from inference.backends.hosted.descriptor import (
    PROVIDER_DEFAULTS,
    PROVIDERS,
    Provider,
    hosted_descriptor,
    keys_in_environment,
)
from inference.backends.secrets import KEY_REFUSAL, refuse_secrets
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.cache.model import DEFAULT_CHUNK_SIZE, CachedModel
from inference.cache.plan import Mode
from store import Settings, Store
from store.descriptor import InputMode, LogprobPositions, ModelDescriptor
from store.errors import InvalidInputError, MissingAPIKeyError
from store.settings import from_environment

if TYPE_CHECKING:
    from store.sync.remote import Remote

# judgestore's defaults for the library and the command line alike (vLLM's own are
# temperature 1.0 and max_tokens 16, which silently truncates most answers).
DEFAULT_SAMPLING: Mapping[str, Any] = {"temperature": 0.0, "max_tokens": 256}

_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # what an environment variable is named (os.environ's)


def malformed_key_value(items: Sequence[str] | None) -> str | None:
    """The first of ``items`` that is not ``KEY=VALUE`` (a non-empty key), or None."""
    return next((item for item in items or () if not item.partition("=")[0] or "=" not in item), None)


def parse_key_values(items: Sequence[str] | None, option: str) -> dict[str, Any]:
    """``KEY=VALUE`` settings as given on a command line: JSON values when they parse as JSON, else strings.

    ``option`` names the flag in the error a malformed item raises.
    """
    if (bad := malformed_key_value(items)) is not None:
        raise InvalidInputError(f"{option} expects KEY=VALUE, got {bad!r}")
    parsed: dict[str, Any] = {}
    for item in items or ():
        key, _, raw = item.partition("=")
        try:
            parsed[key] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed[key] = raw
    return parsed


def check_spec_fields(spec: Any, mappings: Sequence[str]) -> None:
    """Refuse, by name, what would fail later untyped: an empty model (vLLM would load the current folder) and a
    settings field that is not a mapping (``engine_kwargs=None``)."""
    if not isinstance(spec.model, str) or not spec.model.strip():
        raise InvalidInputError(f"model must name a model (a Hub id, a folder, a served name), got {spec.model!r}")
    for name in mappings:
        value = getattr(spec, name)
        if not isinstance(value, Mapping):
            raise InvalidInputError(f"{name} must be a mapping of settings (a dict), got {value!r:.60}")


class Spec(abc.ABC):
    """A model a run can use, put behind a store: see the module docstring.

    A subclass gives ``descriptor``, ``display_name`` and ``backend()``; the
    rest has defaults that suit a model whose refusals cannot be known before
    it loads and that sends nothing to a server.
    """

    @property
    @abc.abstractmethod
    def descriptor(self) -> ModelDescriptor:
        """The cache key of this model and its settings."""

    @property
    @abc.abstractmethod
    def display_name(self) -> str:
        """The name recorded in rows (the ``model`` / ``judge`` columns)."""

    @abc.abstractmethod
    def backend(self) -> Backend:
        """Start the engine or the client now: called only when a batch has misses."""

    @property
    def preflight(self) -> Preflight | None:
        """What finds, before ``backend()``, the requests it would refuse (None: nothing can be known before)."""
        return None

    def sent(self) -> dict[str, int] | None:
        """What this spec's backends sent a server (requests, retries, tokens); None for an in-process engine."""
        return None

    def _backend_factory(self, settings: Settings | None) -> Callable[[], Backend]:
        """What :meth:`cached` prepares the engine with: :meth:`backend`, under the store's ``settings`` where a
        spec reads any (None: the environment's)."""
        return self.backend

    def cached(
        self,
        store: Store | None,
        *,
        task: str,
        mode: Mode = "use",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        remote: Remote | None = None,
        shared: bool = False,
        settings: Settings | None = None,
    ) -> CachedModel:
        """This model behind ``store``: ``backend()`` runs only if a batch has misses.

        With a ``remote``, the run's descriptor folder is fetched from it first. With ``shared=True``, processes
        and jobs started on the same batch generate each miss once between them (:mod:`inference.cache.shared`).
        The backend reads ``settings`` (default: the store's; without a store, the environment's).
        """
        return CachedModel(
            store,
            self.descriptor,
            task=task,
            # a store that is none (a path) is refused by CachedModel, naming what to give
            backend_factory=self._backend_factory(settings or (store.settings if isinstance(store, Store) else None)),
            mode=mode,
            chunk_size=chunk_size,
            label=self.display_name,
            remote=remote,
            preflight=self.preflight,
            shared=shared,
        )


@dataclass(frozen=True)
class ModelSpec(Spec):
    """Everything needed to describe and, if needed, load one vLLM model.

    ``model`` is a Hub id or a local folder, as ``vllm.LLM(model=...)`` takes
    it; a Hub id is pinned to a commit (pass ``engine_kwargs={"revision": ..}``
    for a branch, tag or commit; ``allow_unpinned=True`` accepts an explicitly
    unpinned descriptor when it cannot be pinned). ``sampling`` is merged over
    :data:`DEFAULT_SAMPLING`.
    """

    model: str
    label: str | None = None  # the name recorded in rows (model / judge columns); default: the descriptor's model
    input_mode: Literal["chat", "text"] = "chat"
    sampling: Mapping[str, Any] = field(default_factory=dict)
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    enable_thinking: bool | None = None
    thinking_token_budget: int | None = None
    logprob_positions: LogprobPositions = "first"
    provider: str = "vllm"
    allow_unpinned: bool = False

    def __post_init__(self) -> None:
        check_spec_fields(self, ("sampling", "engine_kwargs", "chat_template_kwargs"))

    @functools.cached_property
    def descriptor(self) -> ModelDescriptor:
        return descriptor_from_vllm(
            self.model,
            engine_kwargs=self.engine_kwargs,
            sampling={**DEFAULT_SAMPLING, **self.sampling},
            input_mode=self.input_mode,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            enable_thinking=self.enable_thinking,
            thinking_token_budget=self.thinking_token_budget,
            logprob_positions=self.logprob_positions,
            provider=self.provider,
            allow_unpinned=self.allow_unpinned,
        )

    @property
    def display_name(self) -> str:
        """The name recorded in rows: the label, else the descriptor's model (a Hub id, or a folder's name)."""
        return self.label if self.label is not None else self.descriptor.model

    @functools.cached_property
    def preflight(self) -> Preflight | None:
        """Refuses the prompts vLLM would refuse as too long, with the model's tokenizer.

        Built when a run is planned, run only when it has misses; it reads nothing until then
        (:mod:`inference.backends.vllm.preflight`).
        """
        from inference.backends.vllm.preflight import PromptLengthCheck

        return PromptLengthCheck(self.descriptor, self.model, self.engine_kwargs, self.chat_template)

    def backend(self) -> Backend:
        """Load the engine now (imports vLLM)."""
        from inference.backends.vllm.backend import create_vllm_backend

        return create_vllm_backend(
            self.descriptor, self.engine_kwargs, model=self.model, chat_template=self.chat_template
        )


@dataclass(frozen=True)
class HostedSpec(Spec):
    """A hosted or served model as a user names it; the hosted counterpart of :class:`ModelSpec`.

    ``sampling`` is merged over :data:`DEFAULT_SAMPLING`.
    ``api_key_env`` names the environment variable holding the key (default:
    the provider's); the key itself is read only when a backend is created.
    ``max_concurrency`` bounds the requests in flight (default: the
    ``max_concurrency`` setting of the store it runs behind, else
    ``JUDGESTORE_MAX_CONCURRENCY``, 8 unless set).
    ``stats`` counts what every backend of this spec sent (requests, retries,
    tokens), for run summaries.
    """

    model: str
    provider: Provider = "openai"
    base_url: str | None = None
    api_key_env: str | None = None
    label: str | None = None  # the name recorded in rows; default: the model
    input_mode: InputMode = "chat"
    sampling: Mapping[str, Any] = field(default_factory=dict)
    routing: Mapping[str, Any] = field(default_factory=dict)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    enable_thinking: bool | None = None
    logprob_positions: LogprobPositions = "first"
    revision: str | None = None
    max_concurrency: int | None = None  # None: the store's settings' max_concurrency (else the environment's)
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    stats: RequestStats = field(default_factory=RequestStats, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_spec_fields(self, ("sampling", "routing", "chat_template_kwargs"))
        if self.max_concurrency is not None and (type(self.max_concurrency) is not int or self.max_concurrency < 1):
            raise InvalidInputError(f"max_concurrency must be an integer >= 1, got {self.max_concurrency!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise InvalidInputError(f"timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if self.provider not in PROVIDERS:
            raise InvalidInputError(f"provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}")
        if self.api_key_env is not None:  # a key in the environment, or shaped like one (hf_...), is no name
            named = "api_key_env (--api-key-env)"
            if any(len(key) >= 8 and key in self.api_key_env for key in keys_in_environment()):
                raise InvalidInputError(f"{named} holds what looks like an API key; {KEY_REFUSAL}")
            if not self.api_key_env.isupper():  # as variables are named (HF_TOKEN_FOR_ORG), else a key's shape
                refuse_secrets(self.api_key_env, named)
        if self.api_key_env is not None and not _VARIABLE_NAME.fullmatch(self.api_key_env):
            # the key itself, given where its variable's name goes: the message that named "the variable" printed it
            raise InvalidInputError(
                "api_key_env (--api-key-env) takes the name of the environment variable that holds the key, e.g. "
                "OPENAI_API_KEY; what was given is no variable's name (not shown: it may be the key itself)"
            )

    @functools.cached_property
    def descriptor(self) -> ModelDescriptor:
        return hosted_descriptor(
            self.provider,
            self.model,
            base_url=self.base_url,
            input_mode=self.input_mode,
            sampling={**DEFAULT_SAMPLING, **self.sampling},
            routing=self.routing,
            chat_template_kwargs=self.chat_template_kwargs,
            enable_thinking=self.enable_thinking,
            logprob_positions=self.logprob_positions,
            revision=self.revision,
            api_key_env=self.api_key_env,
        )

    @property
    def display_name(self) -> str:
        """The name recorded in rows: the label, else the model as the API names it."""
        return self.label if self.label is not None else self.descriptor.model

    @property
    def key_env(self) -> str:
        """The environment variable the API key is read from."""
        return self.api_key_env or PROVIDER_DEFAULTS[self.provider].key_env

    def sent(self) -> dict[str, int]:
        """What every backend of this spec sent (:attr:`stats`): requests, retries, tokens."""
        return self.stats.as_dict()

    def _backend_factory(self, settings: Settings | None) -> Callable[[], Backend]:
        return functools.partial(self.backend, settings)

    def backend(self, settings: Settings | None = None) -> Backend:
        """A client for the endpoint, with the key from :attr:`key_env` (imports openai); ``max_concurrency`` unset
        is ``settings``' (None: the environment's)."""
        from inference.backends.hosted.client import create_openai_backend

        given = os.environ.get(self.key_env)
        key = given or None
        if key is None and (self.api_key_env or PROVIDER_DEFAULTS[self.provider].key_required):
            state = "is not set" if given is None else "is empty"
            raise MissingAPIKeyError(
                self.descriptor.endpoint or self.provider,
                f"no API key: the environment variable {self.key_env} {state}. Set it, or name the variable "
                "that holds the key with --api-key-env NAME (api_key_env=...)",
            )
        return create_openai_backend(
            self.descriptor,
            api_key=key,
            key_env=self.key_env if key is not None else None,
            max_concurrency=self.max_concurrency or (settings or from_environment(Settings)).max_concurrency,
            timeout_s=self.timeout_s,
            retry=self.retry,
            stats=self.stats,
        )
