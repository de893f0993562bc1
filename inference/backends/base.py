"""What the cache boundary asks of an engine, and what it gets back.

Contract: a :class:`Backend` turns :class:`EngineRequest` s into
:class:`Generation` s, one per request, in request order. A request the
engine or server refuses (a prompt too long for it, a value it rejects) comes
back as a :class:`Refusal` in its place: it fails alone, and the others are
generated. A failure of the engine itself raises. A backend is prepared
(model loaded) lazily by its factory, never by the cache layer's planning.
Sample ``k`` of an input is generated with its own seed (``seed + k`` when the
descriptor sets a seed), so it does not depend on how many samples are asked
for at once.

A :data:`Preflight` finds, before the engine is prepared, the requests it
would refuse (:mod:`inference.backends.vllm.preflight`): those fail without it, and a batch
of nothing else never loads it.

A :class:`StreamingBackend` (the local vLLM engine, a remote API: requests
finish one by one) also yields ``(index, generation)`` pairs as they
complete, over all the misses of a batch at once: the engine keeps as many
in flight as it can (a local engine's scheduler holds up to its
``max_num_seqs``, a remote one's concurrency stays busy), and the cache
boundary writes them as they finish instead of waiting for a whole batch.

A call may bound its own requests in flight below the backend's
(:func:`check_bound`: a LangChain config's ``max_concurrency``). A
:class:`BoundedStreamingBackend` (the hosted one) streams under that bound;
any other backend is given at most that many requests at a time
(:func:`inference.cache.generate.generate_into`: a streaming one, vLLM, as
one stream per group, written as it finishes), which keeps the bound but
waits for each group's slowest request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from store.errors import InvalidInputError, JudgestoreError


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One prompt for the engine: a rendered input (parsed) and its sample index."""

    rendered: dict[str, Any]  # {"type": "messages", "messages": [...]} or {"type": "text", "text": ...}
    sample_index: int = 0


@dataclass(frozen=True, slots=True)
class Generation:
    """What the engine produced for one request."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, int | float] = field(default_factory=dict)  # prompt_tokens, completion_tokens (engine_seconds)
    top_logprobs: dict[str, float] | None = None  # first generated token: decoded token -> logprob


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the engine or server refused (a :class:`~store.errors.RequestRefusedError`): it fails alone."""

    error: JudgestoreError


# Requests an engine would refuse, by their index in the batch, found without preparing it.
Preflight = Callable[[Sequence[EngineRequest]], Mapping[int, JudgestoreError]]


def max_concurrency(backend: Backend) -> int:
    """How many requests ``backend`` works on at once: its ``max_concurrency`` attribute, 1 when it has none.

    A remote backend's is its requests in flight; vLLM's its scheduler's
    ``max_num_seqs``. A batch smaller than this leaves the engine part idle.
    """
    value = getattr(backend, "max_concurrency", 1)
    return value if isinstance(value, int) and value >= 1 else 1


def check_bound(value: object) -> int | None:
    """A call's bound on its requests in flight: None (the backend's own bound) or an integer >= 1.

    Anything else is an :class:`~store.errors.InvalidInputError`, raised before anything is sent.
    """
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidInputError(f"max_concurrency must be an integer >= 1 (or None: the model's own), got {value!r}")
    return value


class Backend(Protocol):
    def generate(self, requests: Sequence[EngineRequest]) -> Sequence[Generation | Refusal]:
        """One generation (or refusal) per request, in order. Raises on engine failure."""
        ...

    def close(self) -> None:
        """Release the engine (GPU memory, worker processes)."""
        ...


# What a stream yields: a finished request by its index, or None (a heartbeat: nothing more finished yet).
Arrival = tuple[int, Generation | Refusal] | None


@runtime_checkable
class StreamingBackend(Backend, Protocol):
    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        """``(index in requests, generation or refusal)`` once per request, in the order they complete.

        Between them it may yield None, a heartbeat saying that nothing more has
        finished yet, at least every second or so while it waits: the caller
        writes what finished earlier on time even when the next request takes
        minutes. On a failure it yields what completed first (requests already
        in flight are let finish), then raises. Closing the iterator early
        cancels the rest. A :class:`KeyboardInterrupt` thrown into it (the
        caller's Ctrl-C, met between two arrivals) stops new work, and it
        yields what had finished and was not yet handed over, then raises it.
        """
        ...


@runtime_checkable
class BoundedStreamingBackend(StreamingBackend, Protocol):
    def generate_stream_bounded(self, requests: Sequence[EngineRequest], max_concurrency: int) -> Iterator[Arrival]:
        """:meth:`~StreamingBackend.generate_stream` with at most ``max_concurrency`` of these requests in flight.

        The backend's own bound still holds over everything it sends: this stream has at most the smaller of the
        two in flight.
        """
        ...
