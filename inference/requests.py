"""What callers pass to the cache boundary, and what they get back.

Contract:

* A request carries chat ``messages`` or a plain ``text`` prompt (exactly
  one), the metadata recorded on its row (benchmark, instruction id; for a
  judgement also model_a, model_b (None: pointwise), judge label and
  orientation) and ``n``, the number of samples wanted (1 to
  :data:`MAX_SAMPLES`).
* The metadata is never part of the key: the same input asked under two
  benchmarks is one row (the first writer's metadata is kept). It is text
  (or None): anything else is refused when the request is made, before a
  run, as every store would refuse it when the row is written.
* ``messages`` are ``{"role", "content"}`` dicts, keyed and sent to the
  chat template as given; other shapes (LangChain's messages, its
  ``{"type": "human"}`` dicts) go through :mod:`inference.messages`, which
  maps their roles (``human`` -> ``user``...), and a request given one says so.
* A :class:`Response` holds one :class:`Sample` per requested sample, each
  saying whether it came from the store. A sample that failed (its request
  was refused, or the store refused its row) carries the typed ``error`` and
  was not stored; its text is empty unless it was generated and only the
  store refused it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from store.descriptor import InputMode, render_messages_bytes, render_text_bytes
from store.errors import InvalidInputError, JudgestoreError
from store.logprobs import text_logprobs
from store.tables.models import ORIENTATIONS, Orientation

# Samples of one request: every one is hashed, planned and stored before the engine starts, so a typo
# (n=100000000000) must be refused rather than fill the memory.
MAX_SAMPLES = 10_000
# Fields stored in text columns: text or None, as every store keeps them (store.tables.row_checks.check_values).
_TEXT_FIELDS = ("benchmark", "instruction_id", "model", "model_a", "model_b", "judge")


def request_named(source: str | None, index: int) -> str:
    """A request for messages: where it was read from (``prompts.jsonl:5``), else its index in the call
    (``request 3``)."""
    return source or f"request {index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    messages: Sequence[Mapping[str, Any]] | None = None
    text: str | None = None
    benchmark: str | None = None
    instruction_id: str | None = None
    n: int = 1
    # Where the request was read from (``prompts.jsonl:5``), set by the JSONL readers for the messages that name a
    # failed or missed input: no part of its key, nor of equality
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise InvalidInputError("a request needs exactly one of `messages` or `text`")
        if type(self.n) is not int or not 1 <= self.n <= MAX_SAMPLES:  # True is no count
            raise InvalidInputError(f"n must be an integer from 1 to {MAX_SAMPLES:,}, got {self.n!r:.40}")
        for name in _TEXT_FIELDS:  # stored in text columns, which hold text on every backend: refused before a run
            value = getattr(self, name, None)
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(f"{name} must be text or None, got {type(value).__name__} {value!r}")

    def render(self, input_mode: InputMode) -> str:
        """The canonical rendered input; the model's input mode must match the request's shape."""
        return self.render_bytes(input_mode).decode()

    def render_bytes(self, input_mode: InputMode) -> bytes:
        """:meth:`render` as UTF-8 bytes (what :func:`~store.descriptor.input_hash` hashes)."""
        self.check_shape(input_mode)
        if input_mode == "text":
            return render_text_bytes(cast(str, self.text))  # check_shape: it is given
        try:
            return render_messages_bytes(cast(Sequence[Mapping[str, Any]], self.messages))
        except InvalidInputError as e:
            langchain = isinstance(self.messages, Sequence) and any(
                isinstance(m, Mapping) and "role" not in m and "type" in m for m in self.messages
            )
            if langchain:
                raise InvalidInputError(
                    f"{e}. Messages are {{'role', 'content'}} dicts; LangChain's {{'type': 'human'}} shape (and "
                    "its message objects) converts with inference.messages.chat_messages(...)"
                ) from e
            raise

    def check_shape(self, input_mode: InputMode) -> None:
        """Refuse a request a model of ``input_mode`` cannot take: ``messages`` for chat, ``text`` for text."""
        if input_mode == "chat" and self.messages is None:
            raise InvalidInputError(
                "this model takes chat input: give `messages`, not `text` (or take text as it is: --input-mode text, "
                "input_mode='text')"
            )
        if input_mode == "text" and self.text is None:
            raise InvalidInputError(
                "this model takes text input: give `text`, not `messages` (or take chat messages: --input-mode chat, "
                "input_mode='chat')"
            )

    def named(self, index: int) -> str:
        """:func:`request_named` of this request, the ``index``-th of its call."""
        return request_named(self.source, index)

    def describe(self) -> str:
        """A short human name for messages: benchmark/instruction, or the start of the prompt."""
        if self.benchmark is not None or self.instruction_id is not None:
            return f"{_shortened(self.benchmark or '?')}/{_shortened(self.instruction_id or '?')}"
        shown = self.text if self.text is not None else str(self.messages and self.messages[-1].get("content"))
        return repr(shown[:60])


def _shortened(label: str, at: int = 60) -> str:
    """``label`` for a message: whole up to ``at`` characters, else its start and an ellipsis (a label may be
    kilobytes long: the store refuses it, and the message that says so must stay readable)."""
    return label if len(label) <= at else label[: at - 1] + "…"


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(_Request):
    """A prompt to complete; ``model`` labels the row (default: the descriptor's model)."""

    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgementRequest(_Request):
    """A rendered judge conversation about ``model_a`` (and ``model_b``, None when pointwise).

    The slots are positional (JudgeArena #128): ``model_a`` is the model whose
    answer the prompt shows first, ``model_b`` the second; ``orientation``
    (``direct``/``reversed``) relates that order to the source pair's.
    """

    model_a: str | None = None
    model_b: str | None = None
    judge: str | None = None
    orientation: Orientation | None = None

    def __post_init__(self) -> None:
        _Request.__post_init__(self)
        for name in ("model_a", "model_b"):  # "" was stored as a model's name; a legacy cache's "" means none
            if isinstance(getattr(self, name), str) and not getattr(self, name).strip():
                raise InvalidInputError(
                    f"{name} is empty: name the model whose answer the prompt shows"
                    + (", or leave model_b out (None) for a pointwise judgement" if name == "model_b" else "")
                )
        if self.orientation is not None and self.orientation not in ORIENTATIONS:
            raise InvalidInputError(f"orientation must be 'direct', 'reversed' or None, got {self.orientation!r}")
        if self.orientation is not None and self.model_b is None:
            # a pointwise judgement has no pair to orient: a stored orientation would put it under --orientation
            raise InvalidInputError(
                f"orientation {self.orientation!r} needs model_b: a pointwise judgement (no model_b) has no orientation"
            )

    def describe(self) -> str:
        """:meth:`_Request.describe`, and the orientation: a pair line's two requests are told apart by it."""
        described = _Request.describe(self)
        return described if self.orientation is None else f"{described}, {self.orientation}"


Request = CompletionRequest | JudgementRequest


@dataclass(frozen=True, slots=True)
class Sample:
    """One generated (or stored) sample of one request."""

    input_hash: str
    sample_index: int
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    top_logprobs: dict[str, Any] | None  # stored shape, see store.logprobs
    cached: bool
    error: JudgestoreError | None = None  # why it failed (never stored); None for an answer

    def text_logprobs(self, position: int = 0) -> dict[str, float]:
        """``{text: logprob}`` at one generated position: JudgeArena's view (:func:`store.logprobs.text_logprobs`)."""
        return text_logprobs(self.top_logprobs, position)


@dataclass(frozen=True, slots=True)
class Response:
    """The samples of one request, in sample order; ``text`` etc. are sample 0's."""

    request: Request
    samples: tuple[Sample, ...] = field(default=())

    @property
    def text(self) -> str:
        return self.samples[0].text

    @property
    def top_logprobs(self) -> dict[str, Any] | None:
        return self.samples[0].top_logprobs

    def text_logprobs(self, position: int = 0) -> dict[str, float]:
        """Sample 0's ``{text: logprob}`` at ``position`` (e.g. ``.get("A")`` for a verdict token)."""
        return self.samples[0].text_logprobs(position)

    @property
    def cached(self) -> bool:
        return all(s.cached for s in self.samples)

    @property
    def error(self) -> JudgestoreError | None:
        """Why the request failed (its first failed sample's error), or None when every sample was answered."""
        return next((s.error for s in self.samples if s.error is not None), None)
