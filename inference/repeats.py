"""Repeated inputs of one call answered as an engine without a cache answers them: each with its own sample.

Contract:

* The cache boundary generates identical inputs once: they share a key
  (:mod:`inference.cache.model`). An engine without a cache answers every
  input of a batch on its own, so at a random sampling
  (:func:`random_sampling`: a temperature above 0, no seed, ``top_k`` not 1)
  two identical inputs get two answers, which self-consistency and
  majority-vote code counts on.
* :class:`Repeats` makes the drop-in entry points (``do_inference``,
  ``CachedChatModel``) answer so: at a random sampling, the k-th repeat of an
  input (k from 0) is sample k of one request (the first occurrence's, its
  ``n`` the number of repeats), so each repeat has its own sample and its
  own row, and the same call run again gets the same answers back from the
  store. At any other sampling the requests go as given: repeats are
  answered alike (greedy decoding; a seed, which vLLM applies to each
  request alike), and generated once.
* Identical means the same input as the key reads it (the rendered
  conversation or text); row metadata is not in the key, so the first
  occurrence's labels every sample's row. A request asking for several
  samples itself, or one that does not render (the plan refuses it), is
  never merged with another.
* :meth:`Repeats.answers` gives each input its response (its own request,
  and its sample as sample 0); :meth:`Repeats.translate` says a failed
  call's error in the inputs' terms (a
  :class:`~store.errors.RequestsFailedError`'s responses and failures, a
  :class:`~store.errors.CacheMissError`'s missing requests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from inference.cache.model import Responses
from inference.requests import Request, Response
from store.descriptor import ModelDescriptor, SamplingSettings
from store.errors import CacheMissError, InvalidInputError, RequestsFailedError

R = TypeVar("R", bound=Request)


def random_sampling(sampling: SamplingSettings) -> bool:
    """Whether two identical requests get different answers from an engine: a temperature above 0, no seed, and
    more than the most likely token to sample from."""
    return sampling.temperature != 0 and sampling.seed is None and sampling.top_k != 1


@dataclass(frozen=True)
class Repeats(Generic[R]):
    """The requests to send for ``given`` inputs, and where each input's answer is (see the module docstring)."""

    given: list[R]
    requests: list[R]  # what to send: one request per distinct input, n its repeats (or the inputs as given)
    picks: list[tuple[int, int]]  # per input: (index in ``requests``, sample index)

    @classmethod
    def of(cls, given: Sequence[R], descriptor: ModelDescriptor) -> Repeats[R]:
        if not random_sampling(descriptor.sampling):
            return cls(list(given), list(given), [(i, 0) for i in range(len(given))])
        first: dict[bytes, int] = {}  # rendered input -> its request's index in ``sent``
        sent: list[R] = []
        repeats: list[int] = []
        picks: list[tuple[int, int]] = []
        for request in given:
            rendered = _rendered(request, descriptor)
            j = first.get(rendered) if rendered is not None else None
            if j is None:
                j = len(sent)
                sent.append(request)
                repeats.append(0)
                if rendered is not None:
                    first[rendered] = j
            picks.append((j, repeats[j]))
            repeats[j] += 1
        requests = [dataclasses.replace(r, n=k) if k > 1 else r for r, k in zip(sent, repeats, strict=True)]
        return cls(list(given), requests, picks)

    @property
    def merged(self) -> bool:
        """Whether some inputs share a request (else :attr:`requests` are the inputs' own)."""
        return len(self.requests) != len(self.given)

    def answers(self, responses: Sequence[Response]) -> Responses:
        """Each input's response, from the responses to :attr:`requests` (in their order; ``run`` kept)."""
        if not self.merged:
            return responses if isinstance(responses, Responses) else Responses(responses)
        spread = [
            responses[j] if self.requests[j] is request else Response(request, (responses[j].samples[k],))
            for request, (j, k) in zip(self.given, self.picks, strict=True)
        ]
        return Responses(spread, getattr(responses, "run", None))

    def translate(self, error: RequestsFailedError | CacheMissError) -> None:
        """Put ``error``'s indices and responses in the inputs' terms (in place: the caller raises it on)."""
        if not self.merged:
            return
        if isinstance(error, CacheMissError):
            error.missing_requests = tuple(self._inputs_of(error.missing_requests))
            return
        inputs = {pick: i for i, pick in enumerate(self.picks)}
        error.failures = [
            dataclasses.replace(f, request_index=inputs[pick], sample_index=0)
            if (pick := (f.request_index, f.sample_index)) in inputs
            else f
            for f in error.failures
        ]
        error.responses = self.answers(error.responses)

    def _inputs_of(self, sent: Iterable[int]) -> list[int]:
        wanted = set(sent)
        return [i for i, (j, _) in enumerate(self.picks) if j in wanted]


def _rendered(request: Request, descriptor: ModelDescriptor) -> bytes | None:
    """The input as the key reads it; None for a request never merged (its own samples, or no rendering)."""
    if request.n != 1:
        return None
    try:
        return request.render_bytes(descriptor.input_mode)
    except InvalidInputError:  # the plan refuses it, as it would have
        return None
