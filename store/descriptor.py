"""Descriptors, canonical JSON and hashes: the one place where bytes are hashed.

Contract:

* :func:`canonical_json` gives sorted keys, compact separators and unescaped
  UTF-8 (orjson). For strings, ints, bools and null, which is all a rendered
  input holds, that is byte-identical to ``json.dumps(sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)``, so legacy hashes can be checked.
* :class:`ModelDescriptor` holds everything about a model call that changes its
  output. Its :meth:`~ModelDescriptor.sha256` is stable across processes and
  Python versions; integral floats in free-form fields are written as ints, so
  ``0`` and ``0.0`` hash alike everywhere (below 2**53 in magnitude, where a
  float is one integer exactly: ``1e16`` and ``10**16`` hash apart, a spurious
  miss and never a stale hit). Fields added after the first
  release (:data:`ADDED_FIELDS`) are hashed only when they differ from their
  default, so every descriptor that does not use them keeps the hash, and the
  folder, it always had.
* A descriptor's own field names, and the names of its settings (the keys
  of ``sampling``, ``engine``, ``chat_template_kwargs`` and ``routing``), are
  hashed in sorted order; a setting's value as it was given, objects nested
  in it in their own key order: a JSON schema's property order is what
  structured outputs generate in (reasoning before the score, or after it),
  and a template iterates a kwarg's objects in theirs, so two orders are two
  descriptors (they shared one, and the second order was served the first
  one's answers). A value whose objects are in sorted order hashes as before
  (every key was sorted then), and so does every descriptor read back from a
  metadata.json written before (written sorted); :func:`metadata_bytes`
  keeps a value's order since. A descriptor whose canonical form is not
  sorted throughout has the format :data:`ORDERED_FORMAT` (derived, whatever
  a caller gives), which judgestore before this rule refuses as unknown: it
  would read such a metadata.json as edited, and advise moving its folder.
  A folder written before the rule, of a setting that holds objects, was
  keyed without their order: it answers the run whose objects are in sorted
  order, whichever order generated its rows.
* A non-finite float (NaN, ``inf``, ``-inf``) anywhere in the free-form
  settings (``sampling``'s extra fields, ``engine``, ``chat_template_kwargs``,
  ``routing``, nested too) is refused with
  :class:`~store.errors.InvalidInputError` when the descriptor is built (and
  again when it is hashed): JSON writes it as null, so two different settings
  would share one hash, and one database.
* :func:`render_messages` / :func:`render_text` give the canonical rendered
  input (the ``input_text`` column); :func:`input_hash` gives the content
  address of sample ``k`` of it: sample 0 hashes the rendered bytes, sample
  ``k > 0`` hashes the same object with ``"sample": k`` added.
  :func:`render_messages_bytes` / :func:`render_text_bytes` give the same
  input as its UTF-8 bytes, which :func:`input_hash` also takes: a batch of
  lookups hashes them directly, and a rendered input is decoded to text only
  when it is written (decoding and re-encoding a few KB of non-ASCII text
  costs more than hashing it).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from store.errors import InvalidInputError

HASH16_LENGTH = 16  # characters of a descriptor hash that name its folder (hash16)
DESCRIPTOR_FORMAT: Literal["judgestore-descriptor/v1"] = "judgestore-descriptor/v1"
# The format of a descriptor a setting of which holds an object whose keys are not in sorted order (see the module
# docstring): judgestore before 2026-12-06 refuses it, where it read such a metadata.json as edited
ORDERED_FORMAT: Literal["judgestore-descriptor/v2"] = "judgestore-descriptor/v2"
DescriptorFormat = Literal["judgestore-descriptor/v1", "judgestore-descriptor/v2"]
InputMode = Literal["chat", "text"]
LogprobPositions = Literal["first", "all"]
UNPINNED_PREFIX = (
    "unpinned:"  # the revision of a model the caller chose not to pin (see inference.backends.vllm.model_source)
)

LOCAL_DIGEST_PREFIX = "sha256:"  # the revision of a local model folder: a digest of its files (model_source)

_MAX_EXACT_FLOAT_INT = 2**53


def _normalise(value: Any) -> Any:
    """Integral floats below 2**53 in magnitude become ints, recursively; everything else is kept (a larger float
    may stand for several integers: kept a float, it hashes apart from every int)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # most of a descriptor: answered first
        return value
    if kind is dict:
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, float) and value.is_integer() and abs(value) < _MAX_EXACT_FLOAT_INT:
        return int(value)
    if isinstance(value, Mapping):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def _unhashable_at(value: Any, where: str) -> str | None:
    """Where in ``value`` a value the key cannot carry is, and why (``where`` names ``value``); None when there is
    none: a NaN or infinity (JSON writes null), or a key that is not Unicode text (a lone surrogate: the JSON dump
    writes U+FFFD for it, so settings {"\\ud800": 1} and {"\\udfff": 1} shared one hash, was). A lone surrogate in
    a value is refused by :func:`canonical_json`."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (
            f"{where} = {value}: a descriptor holds finite numbers only (JSON has no NaN or infinity; it would hash "
            "as null)"
        )  # fmt: skip
    if isinstance(value, Mapping):
        if (odd := next((k for k in value if isinstance(k, str) and not is_text(k)), None)) is not None:
            return f"{where} has the key {odd!r}, which is no Unicode text (a lone surrogate): a key must be text"
        items: Any = ((f"{where}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for w, v in items if (found := _unhashable_at(v, w)) is not None), None)


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text, with UTF-8 bytes: no lone surrogate (what Python makes of bytes that
    were not UTF-8, a file name's or a command line's)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def canonical_json(value: Any, *, sort_keys: bool = True) -> bytes:
    """Canonical JSON bytes of ``value`` (sorted keys, compact, UTF-8); ``sort_keys=False`` keeps every object's
    own key order (a descriptor's, whose names it has sorted itself).

    Raises :class:`InvalidInputError` for values JSON cannot carry (lone
    surrogates, non-string keys, objects orjson does not know).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except (orjson.JSONEncodeError, TypeError) as e:
        raise InvalidInputError(f"value cannot be written as canonical JSON: {e}") from e


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SamplingSettings(BaseModel):
    """Sampling parameters, with vLLM's ``SamplingParams`` defaults.

    Unknown sampling settings are kept (``extra="allow"``) so they reach the
    hash: a spurious miss is safe, a stale hit is not.
    """

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)  # JSON has no NaN: it would be null

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None


class ModelDescriptor(BaseModel):
    """Everything about a model call that changes its output (see docs/design.md, "The key")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: DescriptorFormat = DESCRIPTOR_FORMAT  # derived from the settings, whatever is given (module docstring)
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    revision: str | None = None
    input_mode: InputMode = "chat"
    sampling: SamplingSettings = SamplingSettings()
    chat_template_sha256: str | None = None
    chat_template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    enable_thinking: bool | None = None
    thinking_token_budget: int | None = None
    engine: dict[str, JsonValue] = Field(default_factory=dict)
    backend_version: str | None = None
    # Added in 0.2: which generated positions keep their top logprobs (see store.logprobs).
    logprob_positions: LogprobPositions = "first"
    # Added in 0.3, for hosted APIs and servers (inference.backends.hosted.descriptor): the base URL requests go to
    # (never a secret: no credentials, no query), and the provider routing that changes who answers
    # (OpenRouter's ``provider`` preferences). None / {} for the in-process engine.
    endpoint: str | None = None
    routing: dict[str, JsonValue] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)  # pydantic wraps a validator's ValueError: the typed error is raised here
        self._refuse_unhashable()

    def _refuse_unhashable(self) -> None:
        """Refuse NaN and infinities in the free-form settings (JSON writes them as null: a shared hash), and keys
        that are no Unicode text (written as U+FFFD: a shared hash too)."""
        free_form = {"sampling": self.sampling.model_extra or {}, "engine": self.engine,
                     "chat_template_kwargs": self.chat_template_kwargs, "routing": self.routing}  # fmt: skip
        for name, value in free_form.items():
            if (why := _unhashable_at(value, name)) is not None:
                raise InvalidInputError(why)

    @field_validator("provider", "model")
    @classmethod
    def _no_surrounding_space(cls, v: str) -> str:
        if v != v.strip():
            raise ValueError("must not start or end with whitespace")
        return v

    @property
    def unpinned(self) -> bool:
        """Whether the caller opted into a descriptor that pins neither the model's commit nor its template."""
        return self.revision is not None and self.revision.startswith(UNPINNED_PREFIX)

    def model_post_init(self, context: Any, /) -> None:
        """The format, derived (see the module docstring); after every validation, model_validate's too."""
        object.__setattr__(self, "format", self._format_of())  # frozen: set once, here

    def _format_of(self) -> DescriptorFormat:
        """:data:`ORDERED_FORMAT` when a setting's value holds an object whose keys are not in sorted order."""
        settings = (self.sampling.model_extra or {}, self.engine, self.chat_template_kwargs, self.routing)
        in_order = all(_keys_in_order(value) for setting in settings for value in setting.values())
        return DESCRIPTOR_FORMAT if in_order else ORDERED_FORMAT

    def canonical_json(self) -> bytes:
        """The bytes that are hashed: normalised numbers, field and setting names sorted (a setting's value in its
        own order, and then the format :data:`ORDERED_FORMAT`: see the module docstring), added fields only when
        set."""
        self._refuse_unhashable()  # built without __init__ (model_validate, model_copy): refused before hashing
        data = self.model_dump(mode="json")
        for name, default in ADDED_FIELDS.items():
            if data[name] == default:
                del data[name]
        data["format"] = self._format_of()  # derived, whatever the field holds (model_copy does not validate)
        if data["format"] == DESCRIPTOR_FORMAT:  # every object in sorted order: the first release's bytes
            return canonical_json(_normalise(data))
        return canonical_json(_names_sorted(_normalise(data)), sort_keys=False)

    def sha256(self) -> str:
        """Full SHA-256 hex of :meth:`canonical_json` (written to metadata.json)."""
        return sha256_hex(self.canonical_json())

    def hash16(self) -> str:
        """First 16 hex characters of :meth:`sha256`: the folder name."""
        return self.sha256()[:HASH16_LENGTH]


SETTINGS_FIELDS = ("sampling", "engine", "chat_template_kwargs", "routing")  # objects of named settings


def _keys_in_order(value: Any) -> bool:
    """Whether every object in ``value`` has its keys in sorted order (the order canonical JSON sorts them in)."""
    if isinstance(value, Mapping):
        keys = list(value)
        return keys == sorted(keys) and all(_keys_in_order(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_keys_in_order(v) for v in value)
    return True


def _names_sorted(data: dict[str, Any]) -> dict[str, Any]:
    """A descriptor's dump with its field names and its settings' names in sorted order, their values as given."""
    return {
        name: {key: data[name][key] for key in sorted(data[name])} if name in SETTINGS_FIELDS else data[name]
        for name in sorted(data)
    }


# Fields added after the first release, with the default that leaves them out of the hash.
ADDED_FIELDS: dict[str, Any] = {"logprob_positions": "first", "endpoint": None, "routing": {}}


_dumps, _SORT_KEYS, _sha256 = orjson.dumps, orjson.OPT_SORT_KEYS, hashlib.sha256  # bound once: called per input


# How every rendered input begins and ends (canonical JSON, keys sorted), for readers that look inside one in SQL
# (the browser's search): a chat's first message opens with its content, its last one closes with its role.
MESSAGES_HEAD, MESSAGES_TAIL = '{"messages":[{"content":"', '"}],"type":"messages"}'
TEXT_HEAD, TEXT_TAIL = '{"text":"', '","type":"text"}'


def render_messages_bytes(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """UTF-8 bytes of :func:`render_messages`: ``{"messages":[{"content","role"},..],"type":"messages"}``."""
    # The common case first: a non-empty list of plain dicts holding exactly a string role and content
    # serialises (keys sorted) to the same bytes as the copy the general path below builds. A batch renders
    # thousands of these, so the check is written for speed: a missing key lands in the general path too.
    if type(messages) is list and messages:
        for m in messages:
            if type(m) is dict and len(m) == 2:
                try:
                    if type(m["role"]) is str and type(m["content"]) is str:
                        continue
                except KeyError:
                    pass
            break
        else:
            try:
                return _dumps({"messages": messages, "type": "messages"}, option=_SORT_KEYS)
            except orjson.JSONEncodeError:
                pass  # a lone surrogate: the general path raises the typed error
    if type(messages) is not list and (isinstance(messages, str | bytes) or not isinstance(messages, Sequence)):
        raise InvalidInputError("messages must be a list of {'role', 'content'} objects")
    clean: list[Mapping[str, Any]] = []
    for i, m in enumerate(messages):
        if type(m) is not dict and not isinstance(m, Mapping):
            raise InvalidInputError(f"message {i} is not an object: {m!r:.80}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise InvalidInputError(f"message {i} needs string 'role' and 'content': {m!r:.80}")
        if len(m) != 2:  # both keys are there, so any other key is one too many
            raise InvalidInputError(f"message {i} has unsupported keys {sorted(set(m) - {'role', 'content'})}")
        # A plain dict holding exactly these two keys serialises (keys sorted) to the same bytes as its copy.
        clean.append(m if type(m) is dict else {"content": content, "role": role})
    if not clean:
        raise InvalidInputError("messages must not be empty")
    return canonical_json({"messages": clean, "type": "messages"})


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Rendered input of a chat: ``{"messages":[{"content","role"},..],"type":"messages"}``."""
    return render_messages_bytes(messages).decode()


def render_text_bytes(text: str) -> bytes:
    """UTF-8 bytes of :func:`render_text`: ``{"text":..,"type":"text"}``."""
    if not isinstance(text, str):
        raise InvalidInputError(f"text prompt must be a string, got {type(text).__name__}")
    return canonical_json({"text": text, "type": "text"})


def render_text(text: str) -> str:
    """Rendered input of a plain prompt: ``{"text":..,"type":"text"}``."""
    return render_text_bytes(text).decode()


def input_hash(rendered: str | bytes, sample_index: int = 0) -> str:
    """Content address of sample ``sample_index`` of a rendered input (text, or its UTF-8 bytes)."""
    if sample_index == 0:
        if type(rendered) is bytes:
            return _sha256(rendered).hexdigest()  # sha256_hex, inlined: a batch hashes thousands
        if isinstance(rendered, bytes):
            return sha256_hex(rendered)
        try:
            return sha256_hex(rendered.encode())
        except UnicodeEncodeError as e:
            raise InvalidInputError(f"rendered input is not valid UTF-8 text: {e}") from e
    if sample_index < 0:
        raise InvalidInputError(f"sample_index must be >= 0, got {sample_index}")
    payload = orjson.loads(rendered)
    payload["sample"] = sample_index
    return sha256_hex(canonical_json(payload))
