"""The descriptor of a hosted or served model: OpenAI, OpenRouter, Together or a ``vllm serve``.

Contract:

* :func:`hosted_descriptor` is the one place where the settings of a hosted
  model become a :class:`~store.descriptor.ModelDescriptor`;
  :class:`inference.spec.HostedSpec` is the spec that uses it, as
  :class:`~inference.spec.ModelSpec` uses
  :func:`~inference.backends.vllm.descriptor.descriptor_from_vllm`.
* In the key: ``provider``; ``model`` as the API names it; ``endpoint``, the
  base URL requests go to (lowercase scheme and host, no trailing ``/``;
  the provider's default when not given, ``OPENAI_BASE_URL`` for ``openai``);
  ``sampling`` with the same defaults as the in-process engine
  (:data:`~inference.spec.DEFAULT_SAMPLING`) and the same spelling rules, so
  exactly what :func:`~inference.backends.hosted.wire.request_body` sends is
  hashed; ``routing``, OpenRouter's ``provider`` preferences, which decide
  who answers; ``chat_template_kwargs`` / ``enable_thinking`` (a
  ``vllm-server`` only); ``revision``, a pin the caller asserts (the commit a
  served model runs, say), which is recorded, never checked; and
  ``backend_version``, the version of judgestore's request mapping
  (:data:`HOSTED_PROTOCOL`), bumped if what is sent for the same descriptor
  ever changes.
* Outside the key, by necessity: a server's own defaults for what is not
  sent, and a model updated behind an unchanged name. Pin what can be
  pinned: dated model names (``gpt-4o-2024-08-06``), and for OpenRouter one
  provider with ``allow_fallbacks: false``. An OpenAI alias without a date
  and unpinned OpenRouter routing are allowed, with a :class:`HostedKeyWarning`.
* Sampling settings judgestore does not know are sent as given (a provider's
  own); one spelt almost like one it knows (``temprature``) is sent too,
  with a :class:`SamplingKeyWarning`.
* Secrets never reach a descriptor: the API key is read from an environment
  variable when the backend is created (``OPENAI_API_KEY``,
  ``OPENROUTER_API_KEY``, ``TOGETHER_API_KEY``, ``VLLM_API_KEY``, or the one
  ``api_key_env`` names: :data:`PROVIDER_DEFAULTS`), never stored on the spec; a URL with credentials,
  a query or a fragment, a setting named like a credential (``api_key``,
  ``token``, ``authorization``...), a value shaped like a key
  (``sk-...``, ``Bearer ...``), or the value of any of those variables
  anywhere in the descriptor is refused with :class:`InvalidInputError`,
  which names the setting and never shows the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from pydantic import JsonValue, ValidationError

from inference.backends.hosted.wire import RESERVED_BODY_KEYS
from inference.backends.secrets import KEY_REFUSAL, refuse_secrets
from inference.sampling import json_value, sampling_settings_from
from store.caller import warn_the_caller
from store.descriptor import InputMode, LogprobPositions, ModelDescriptor, SamplingSettings
from store.errors import InvalidInputError, invalid_values
from store.spelling import meant

Provider = Literal["openai", "openrouter", "together", "vllm-server"]
PROVIDERS: tuple[Provider, ...] = get_args(Provider)
HOSTED_PROTOCOL = "judgestore-openai/1"


@dataclass(frozen=True)
class ProviderDefaults:
    """Where a provider answers by default, and where its key is read from."""

    url: str | None
    key_env: str
    key_required: bool = True
    url_env: str | None = None


PROVIDER_DEFAULTS: dict[str, ProviderDefaults] = {
    "openai": ProviderDefaults("https://api.openai.com/v1", "OPENAI_API_KEY", url_env="OPENAI_BASE_URL"),
    "openrouter": ProviderDefaults("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "together": ProviderDefaults("https://api.together.xyz/v1", "TOGETHER_API_KEY"),
    # vllm serve needs no key unless started with --api-key (or VLLM_API_KEY).
    "vllm-server": ProviderDefaults(None, "VLLM_API_KEY", key_required=False),
}


class HostedKeyWarning(UserWarning):
    """The descriptor cannot pin what answers: an undated model alias, or routing that lets several providers answer."""


class SamplingKeyWarning(UserWarning):
    """A sampling setting judgestore does not know, spelt almost like one it does (``temprature``)."""


def keys_in_environment(api_key_env: str | None = None) -> list[str]:
    """The API keys this environment holds (each provider's variable, and ``api_key_env``): no descriptor may hold
    one."""
    names = {d.key_env for d in PROVIDER_DEFAULTS.values()} | ({api_key_env} if api_key_env else set())
    return [os.environ[n] for n in sorted(names) if os.environ.get(n)]


# ------------------------------------------------------------------ the descriptor


def normalise_endpoint(provider: str, base_url: str | None) -> str:
    """The endpoint of the key: the given URL, else the provider's default (``OPENAI_BASE_URL`` for openai).

    Scheme and host are lowercased, a scheme's default port (443, 80) and
    trailing ``/`` dropped; a URL with credentials, a query or a fragment is
    refused (they hold secrets, or change nothing a cache key should see).
    """
    defaults = PROVIDER_DEFAULTS[provider]
    url = base_url or (os.environ.get(defaults.url_env) if defaults.url_env else None) or defaults.url
    if not url:
        raise InvalidInputError(
            f"provider {provider!r} has no default URL: pass base_url (--base-url), e.g. http://host:8000/v1"
        )
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # parses it: a bad port raises here
    except ValueError as e:  # its message quotes the part it refused: not shown, as the URL may hold a secret
        raise InvalidInputError(
            "base URL is not a URL (its port is no number, or a bracket is left open), e.g. http://host:8000/v1"
        ) from e
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInputError("base URL must be http:// or https:// with a host, e.g. https://api.openai.com/v1")
    if parts.username is not None or parts.password is not None:
        raise InvalidInputError(f"base URL carries credentials (user:password@); {KEY_REFUSAL}")
    if parts.query or parts.fragment:
        raise InvalidInputError("base URL has a query or fragment: give the plain base URL (.../v1)")
    host, scheme = parts.hostname.lower(), parts.scheme.lower()
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:  # https://x:443 is https://x: one server, one key
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _routing(provider: str, routing: Mapping[str, Any], known: list[str]) -> dict[str, JsonValue]:
    if provider != "openrouter":
        if routing:
            raise InvalidInputError(f"routing is OpenRouter's provider preferences; provider {provider!r} has none")
        return {}
    plain = json_value(dict(routing), "routing")
    assert isinstance(plain, dict)
    refuse_secrets(plain, "routing", known)
    for name in ("only", "order", "ignore"):
        given = plain.get(name)
        if given is not None and not (isinstance(given, list) and all(isinstance(p, str) for p in given)):
            raise InvalidInputError(
                f"routing {name} must be a list of provider names (OpenRouter's), got {given!r}: e.g. "
                f"routing={{'{name}': ['deepinfra']}} (on the command line: --routing '{name}=[\"deepinfra\"]')"
            )
    listed = plain.get("only") or plain.get("order") or []
    if plain.get("allow_fallbacks") is not False or not isinstance(listed, list) or len(listed) != 1:
        warn_the_caller(
            "OpenRouter routing is not pinned to one provider: rows under this key may come from different "
            "providers (quantisations, implementations). Pin it with "
            "routing={'order': ['<provider>'], 'allow_fallbacks': False} (on the command line: "
            "--routing 'order=[\"<provider>\"]' --routing allow_fallbacks=false)",
            HostedKeyWarning,
        )
    return plain


_DATED = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})$")  # gpt-4o-2024-08-06, gpt-4-0613


def hosted_descriptor(
    provider: str,
    model: str,
    *,
    base_url: str | None = None,
    input_mode: InputMode = "chat",
    sampling: Mapping[str, Any] | None = None,
    routing: Mapping[str, Any] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    enable_thinking: bool | None = None,
    logprob_positions: LogprobPositions = "first",
    revision: str | None = None,
    api_key_env: str | None = None,
) -> ModelDescriptor:
    """The descriptor of ``model`` served by ``provider`` (see the module docstring).

    ``sampling`` is taken as given (:class:`~inference.spec.HostedSpec` merges it over
    :data:`~inference.spec.DEFAULT_SAMPLING`); ``logprobs: k`` asks for the
    top ``k`` candidates. ``api_key_env`` names one more variable whose value
    must not appear in the descriptor.
    """
    if provider not in PROVIDERS:
        raise InvalidInputError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    known = keys_in_environment(api_key_env)
    # Before they are parsed: a parser's message quotes the value it refused (a key given as a seed, as a port)
    refuse_secrets(base_url, "base URL", known)
    refuse_secrets(dict(sampling or {}), "sampling", known)
    endpoint = normalise_endpoint(provider, base_url)
    settings = sampling_settings_from(sampling or {}, logprob_positions)
    extras = settings.model_extra or {}
    clash = sorted(RESERVED_BODY_KEYS & set(extras))
    if clash:
        raise InvalidInputError(
            f"sampling {clash} are set by judgestore itself (max_tokens, logprobs, routing, chat_template_kwargs)"
        )
    for extra in extras:  # sent as given, and a server ignores what it does not know: a typo would be lost
        if (close := meant(extra, SamplingSettings.model_fields)) is not None:
            warn_the_caller(
                f"sampling {extra!r} is not a setting judgestore knows, so it is sent as given (and hashed); "
                f"did you mean {close!r}?",
                SamplingKeyWarning,
            )
    refuse_secrets(settings.model_dump(), "sampling", known)
    template_kwargs: dict[str, JsonValue] = {}
    if input_mode == "chat":
        template_kwargs = {
            str(k): json_value(v, f"chat_template_kwargs.{k}") for k, v in (chat_template_kwargs or {}).items()
        }
        in_kwargs = template_kwargs.pop("enable_thinking", None)
        if isinstance(in_kwargs, bool):
            if enable_thinking is not None and in_kwargs != enable_thinking:
                raise InvalidInputError("enable_thinking is given twice with different values")
            enable_thinking = in_kwargs
        elif in_kwargs is not None:
            template_kwargs["enable_thinking"] = in_kwargs
        if (template_kwargs or enable_thinking is not None) and provider != "vllm-server":
            raise InvalidInputError(
                f"chat template kwargs and enable_thinking reach the template of a vllm-server only, not {provider!r}"
            )
        refuse_secrets(template_kwargs, "chat_template_kwargs", known)
    else:
        enable_thinking = None
    if provider == "openai" and not _DATED.search(model):
        warn_the_caller(
            f"{model!r} is an alias OpenAI may move to a newer snapshot without notice; rows cached under it "
            "would then mix two models. Pin a dated snapshot (e.g. gpt-4o-2024-08-06)",
            HostedKeyWarning,
        )
    for name, text in (("model", model), ("revision", revision), ("endpoint", endpoint)):
        refuse_secrets(text, name, known)
    try:
        return ModelDescriptor(
            provider=provider,
            model=model,
            revision=revision,
            input_mode=input_mode,
            sampling=settings,
            chat_template_kwargs=template_kwargs,
            enable_thinking=enable_thinking,
            logprob_positions=logprob_positions,
            backend_version=HOSTED_PROTOCOL,
            endpoint=endpoint,
            routing=_routing(provider, routing or {}, known),
        )
    except ValidationError as e:
        raise InvalidInputError(f"invalid descriptor for hosted model {model!r}: {invalid_values(e)}") from e
