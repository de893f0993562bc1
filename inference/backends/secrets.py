"""Secrets never reach a descriptor: what every backend checks its settings with before it builds one.

Contract: :func:`refuse_secrets` raises :class:`~store.errors.InvalidInputError`
for a value holding anything that looks like a credential (a name such as
``api_key`` or ``..._token`` at any depth, a string shaped like a known
provider's key, or one of the keys in the environment), naming the setting
and never the value. A descriptor is written into ``metadata.json``, printed by
``explain`` and shared through the Hub: a key in it would be published.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from store.errors import InvalidInputError

_SECRET_NAME = re.compile(
    r"(api[_-]?key|access[_-]?key|secret|passw(or)?d|authori[sz]ation|bearer|credential|cookie|(^|[_-])token$)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"bearer\s+\S{8,}"
    r"|sk-[A-Za-z0-9_\-]{16,}"  # OpenAI, OpenRouter (sk-or-v1-...), Anthropic (sk-ant-...)
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|tgp_v1_[A-Za-z0-9_\-]{16,}"  # Together
    r"|(gsk|xai)[_-][A-Za-z0-9]{16,}"  # Groq, xAI
    r"|AIza[0-9A-Za-z_\-]{30,}"  # Google
    r")",
    re.IGNORECASE,
)
KEY_REFUSAL = (
    "API keys are read from an environment variable (api_key_env / --api-key-env, or the engine's own), never "
    "written into a key"
)


def refuse_secrets(value: Any, where: str, known: Iterable[str] = ()) -> None:
    """Raise :class:`InvalidInputError` if ``value`` holds anything that looks like a credential.

    Checks names (at any depth) and string values against the patterns above,
    and every string against the ``known`` secrets (the keys in the
    environment). The message names the setting, never the value.
    """
    known = [k for k in known if len(k) >= 8]
    if isinstance(value, Mapping):
        for name, item in value.items():
            if _looks_like_a_key(str(name), known):  # not named: the message would show it
                raise InvalidInputError(f"{where} holds a name that looks like an API key; {KEY_REFUSAL}")
            if _SECRET_NAME.search(str(name)):
                raise InvalidInputError(f"{where}.{name} is named like a credential; {KEY_REFUSAL}")
            refuse_secrets(item, f"{where}.{name}", known)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            refuse_secrets(item, f"{where}[{i}]", known)
    elif isinstance(value, str) and _looks_like_a_key(value, known):
        raise InvalidInputError(f"{where} holds what looks like an API key; {KEY_REFUSAL}")


def _looks_like_a_key(text: str, known: list[str]) -> bool:
    return bool(_SECRET_VALUE.search(text)) or any(k in text for k in known)
