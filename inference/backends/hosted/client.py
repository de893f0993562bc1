"""A backend for any OpenAI-compatible server (OpenAI, OpenRouter, Together, ``vllm serve``).

Contract:

* Importing this module does not import ``openai``: :func:`create_openai_backend`
  does, and the cache boundary calls it only when a batch has misses, so a run
  that is all hits never imports the client (nor sends a request).
* :class:`OpenAIBackend` is a :class:`~inference.backends.base.BoundedStreamingBackend`:
  at most ``max_concurrency`` requests are in flight, counted over every
  batch it is sending at once (concurrent async calls of one model share the
  limit), and at most a call's own bound of that call's, when it sets one
  (:meth:`~OpenAIBackend.generate_stream_bounded`); each generation is
  handed to the cache boundary as it completes, so a killed run keeps what
  it paid for; while it waits it yields a heartbeat every :data:`HEARTBEAT_S`.
  It runs its own event loop on a private thread, so it works from plain
  scripts and from inside a running loop (notebooks) alike. Ctrl-C while a
  stream waits stops new requests and hands over what had arrived before
  the interrupt goes on; :meth:`OpenAIBackend.close` cancels the batches in
  flight, and a call still streaming (a cancelled async call's thread) gets
  what had arrived, then a :class:`~store.errors.JudgestoreError`.
* 408, 409, 429, 5xx, timeouts and connection errors are retried with
  exponential backoff and jitter (:class:`RetryPolicy`); ``Retry-After`` (or
  ``retry-after-ms``) is a floor on the wait, and pauses every request of the
  backend, not only the one that met it. A wait longer than
  ``RetryPolicy.max_retry_after`` is not waited out, nor is a spent quota
  (a 429 whose code is in :data:`QUOTA_CODES`): each is a
  :class:`~store.errors.HostedUnavailableError` at once. Retry warnings and
  that error quote what the server said.
* A request the server refuses (400, 413, 422: a prompt longer than its
  context, a value it rejects) fails alone: it comes back as a
  :class:`~inference.backends.base.Refusal` carrying a
  :class:`~store.errors.HostedRequestError` with the server's reason, and
  the other requests go on. A refusal that says its prompt alone is over
  the context (vLLM's "even without any output tokens", or OpenAI's token
  counts) is that request's own and counts towards nothing below. After
  another refusal, while none is answered, no request starts until those in
  flight are in. A server that refuses the
  first :data:`REFUSALS_BEFORE_STOP` requests of a batch and answers none of
  them nor of those still in flight refuses a setting, not a request: no new
  request starts and that error is raised.
  When every one of them says that the request is over the model's context
  (:data:`TOO_LONG_WORDS`), the shortest request not sent yet (one a waiting
  worker holds included) is sent first:
  refused too, ``max_tokens`` leaves no prompt room (the settings); answered,
  the batch was sorted longest first, and it goes on.
* A 2xx body that reports an error (:class:`~inference.backends.hosted.wire.ErrorInBody`)
  is never stored. A top-level ``error`` object's code goes through the
  rules for HTTP statuses above and below (retried when transient, else
  the same typed error), with the server's message. A choice that ended in
  an error (OpenRouter's mid-generation error) is retried when its code is
  transient, and otherwise fails alone as a ``HostedRequestError`` whose
  ``status`` is None: the server answered, so it does not count towards a
  streak of refused settings. So does a model's refusal (a chat message
  whose content is null and whose ``refusal`` is set): the error quotes it,
  and nothing is stored, as a refusal is not the model's answer to cache.
* A request that still fails after every retry fails alone, as a refusal
  does, with the typed error it would have raised
  (:class:`~store.errors.HostedUnavailableError`, or
  :class:`~store.errors.HostedResponseError`), when the server answered a
  request (of any batch of the backend) since the last one that failed so:
  the server is up, and that request is what it cannot serve (an input
  that crashes a worker, a proxy that mangles one answer). Without an answer
  in between, the server is down or overloaded: the error stops the batch
  (below), at most one request after the server went. A 429 (a rate limit,
  the account's) always stops it.
* A 2xx body that is not a completion (malformed JSON, no choices) is
  retried as a transient failure once the backend has had an answer from
  the server; before that it is most likely not an OpenAI-compatible API,
  and it raises at once.
* Other failures are not retried: each raises a typed
  :class:`~store.errors.HostedAPIError` (401/403
  :class:`~store.errors.HostedAuthError`, a model the server does not serve
  :class:`~store.errors.HostedModelNotFoundError`, a malformed body before
  any answer :class:`~store.errors.HostedResponseError`, ...). On a failure,
  no new request starts; those in flight finish and are kept, then it raises.
* What goes over the wire (the request body, the generation a response
  body gives, what a server's error says) is :mod:`inference.backends.hosted.wire`'s.
* The API key is held by the client only: it is never logged, and any
  message built from a server's answer has it blanked out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import random
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from inference.backends.base import Arrival, EngineRequest, Generation, Refusal, check_bound
from inference.backends.hosted.wire import (
    MODEL_MISSING_HINTS,
    ErrorInBody,
    ModelRefusal,
    error_code,
    generation_from_body,
    messages_of,
    printable,
    request_body,
    request_body_keys,
    retry_after_seconds,
    server_message,
)
from store.descriptor import ModelDescriptor
from store.errors import (
    HostedAPIError,
    HostedAuthError,
    HostedModelNotFoundError,
    HostedNotFoundError,
    HostedRequestError,
    HostedResponseError,
    HostedUnavailableError,
    InvalidInputError,
    JudgestoreError,
    install_hint,
)

log = logging.getLogger("judgestore.hosted")

DEFAULT_MAX_CONCURRENCY = 8  # hosted APIs rate-limit per key; 8 in flight keeps most tiers busy without 429 storms
DEFAULT_TIMEOUT_S = 120.0
RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx
REFUSAL_STATUSES = frozenset({400, 413, 422})  # this request is refused (too long, a value): it fails alone
REFUSALS_BEFORE_STOP = 8  # refused in a row from a batch's start, none answered: the settings are refused
_SHORTEST_SECRET = 8  # characters of a key that errors are searched for (see OpenAIBackend.__init__)
_DATED_VERSION = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})")  # what a dated version adds to its model's name
# What a refusal of a request over the model's context says (vLLM, OpenAI, OpenRouter): its prompt, or max_tokens
TOO_LONG_WORDS = ("maximum context length", "context_length_exceeded", "context window", "prompt is too long")
QUOTA_CODES = frozenset({"insufficient_quota"})  # a 429 no wait cures (OpenAI's spent quota): not retried
SAID_CHARS = 300  # how much of a server's message a retry warning or error quotes


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried: ``base_s * 2**attempt`` capped at ``max_s``, times a jitter in [0.5, 1]."""

    max_retries: int = 6
    base_s: float = 1.0
    max_s: float = 60.0
    max_retry_after_s: float = 300.0  # a server asking for a longer pause gets an error instead of a silent wait

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based); ``retry_after`` is a floor."""
        backoff = min(self.max_s, self.base_s * 2**attempt) * random.uniform(0.5, 1.0)
        return max(backoff, retry_after or 0.0)


@dataclass
class RequestStats:
    """What a backend sent, for run summaries: HTTP requests (retries included), retries, tokens."""

    requests_sent: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# ------------------------------------------------------------------ the backend

_DONE = object()
HEARTBEAT_S = 0.5  # a stream waiting this long with nothing arrived yields a heartbeat (None)


def _quota_spent(code: Any) -> bool:
    # A code is whatever the server wrote: an object or a list is no quota code (nor a TypeError in a set lookup).
    return isinstance(code, str) and code in QUOTA_CODES


class _FailsAlone(Exception):
    """Raised in :meth:`OpenAIBackend._one` for a request that fails alone (see the module docstring)."""

    def __init__(self, error: HostedAPIError) -> None:
        super().__init__(str(error))
        self.error = error


def _size(request: EngineRequest) -> int:
    """How long a request's input is, to find the shortest (its rendered messages or prompt, as text)."""
    return len(str(request.rendered))


# A refusal whose prompt alone is over the context: vLLM's words ("... exceeds this limit even without any output
# tokens", a prompt of more characters than any fits, or a prompt of exactly the context, which leaves max_tokens
# clamped to 0), or OpenAI's count of the prompt's tokens (chat: "N in the messages"; completions: "N in your prompt")
_PROMPT_ALONE = re.compile(
    r"even without any output tokens|your prompt contains \d+ characters|max_tokens must be at least 1, got 0"
)
_OPENAI_COUNTS = re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in (?:the messages|your prompt)", re.S)


def _prompt_alone_too_long(refusal: HostedRequestError) -> bool:
    """Whether a refusal says that its prompt alone is over the model's context: that request's own failure,
    whatever the settings (``max_tokens`` too, which the streak of refusals would be taken to refuse)."""
    said = str(refusal)
    if _PROMPT_ALONE.search(said):
        return True
    counts = _OPENAI_COUNTS.search(said)
    return counts is not None and int(counts.group(2)) >= int(counts.group(1))


def _too_long(refusal: HostedRequestError) -> bool:
    """Whether a refusal says that its request is over the model's context (vLLM's and OpenAI's words): its
    prompt, or its prompt and ``max_tokens``."""
    said = str(refusal).lower()
    return any(words in said for words in TOO_LONG_WORDS)


def _arrived(arrivals: queue.SimpleQueue[Any]) -> Iterator[Arrival]:
    """What is in ``arrivals`` now, the end marker left out."""
    while True:
        try:
            item = arrivals.get_nowait()
        except queue.Empty:
            return
        if item is not _DONE:
            yield item


class OpenAIBackend:
    """Requests to one OpenAI-compatible endpoint under one descriptor. Build it with :func:`create_openai_backend`."""

    def __init__(
        self,
        client: Any,
        openai_module: Any,
        descriptor: ModelDescriptor,
        *,
        key_env: str | None,
        secret: str | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        retry: RetryPolicy | None = None,
        stats: RequestStats | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if descriptor.endpoint is None:
            raise InvalidInputError(f"the descriptor of {descriptor.model!r} has no endpoint: build it as a hosted one")
        if max_concurrency < 1:
            raise InvalidInputError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self._client = client
        self._openai = openai_module
        self._descriptor = descriptor
        self._endpoint: str = descriptor.endpoint
        self._key_env = key_env
        # A key of a few characters (a local server's placeholder: "x", "EMPTY") is blanked out nowhere: replacing
        # every "x" of an error made it unreadable ("ma<api key>imum"), and such a key guards nothing
        self._secret = secret if secret and len(secret) >= _SHORTEST_SECRET else None
        self.max_concurrency = max_concurrency
        self._timeout_s = timeout_s  # the whole answer's: the client's own bounds each read (a trickle held a slot)
        self.retry = retry or RetryPolicy()
        self.stats = stats if stats is not None else RequestStats()
        self._not_before = 0.0  # loop time before which no request starts (a server's Retry-After)
        # Shared by every batch in flight (concurrent async calls of one model): the limit is per backend.
        self._slots = asyncio.Semaphore(max_concurrency)
        self._warned_no_logprobs = False
        self._warned_served: str | None = None  # the other model an answer named, once said
        # Answers the server gave (every batch), and how many when a request last failed alone: one that outlasts
        # its retries fails alone if the server answered since (see the module docstring).
        self._answers = 0
        self._with_logprobs = 0  # answers that carried the logprobs asked for
        self._answers_at_lone_failure = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="judgestore-openai", daemon=True)
        self._thread.start()
        # A backend dropped without close() (a notebook) still stops its thread when it is collected.
        self._stop_loop = weakref.finalize(self, self._loop.call_soon_threadsafe, self._loop.stop)
        self._closed = False
        self._batches: set[concurrent.futures.Future[None]] = set()  # generate_stream's, until each is done
        # Held while a batch is submitted and while close() takes the batches to cancel: a batch submitted as
        # close() stopped the loop never ran, and its caller waited for it forever (a cancelled async call).
        self._submitting = threading.Lock()

    @property
    def descriptor(self) -> ModelDescriptor:
        return self._descriptor

    # ------------------------------------------------------------ Backend

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        """One generation (or refusal) per request, in order (all sent at once, ``max_concurrency`` in flight)."""
        results: list[Generation | Refusal | None] = [None] * len(requests)
        for arrival in self.generate_stream(requests):
            if arrival is not None:  # None: a heartbeat
                index, outcome = arrival
                results[index] = outcome
        return [g for g in results if g is not None]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        """``(index, generation)`` as each request completes; see :class:`~inference.backends.base.StreamingBackend`."""
        return self.generate_stream_bounded(requests, self.max_concurrency)

    def generate_stream_bounded(self, requests: Sequence[EngineRequest], max_concurrency: int) -> Iterator[Arrival]:
        """:meth:`generate_stream` with at most ``max_concurrency`` of these requests in flight (and at most the
        backend's own ``max_concurrency`` over every batch it sends)."""
        check_bound(max_concurrency)
        self._refuse_closed()
        for request in requests:  # refuse a wrong input mode before anything is sent
            messages_of(request, self._descriptor.input_mode)
        if not requests:
            return
        arrivals: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._submitting:
            self._refuse_closed()  # again: close() may have come since, from another thread
            future = asyncio.run_coroutine_threadsafe(self._run(requests, arrivals.put, max_concurrency), self._loop)
            self._batches.add(future)
        future.add_done_callback(self._forget)  # outside the lock: a batch done already calls it at once
        future.add_done_callback(lambda _: arrivals.put(_DONE))
        try:
            try:
                while True:
                    try:
                        item = arrivals.get(timeout=HEARTBEAT_S)  # a timeout keeps Ctrl-C responsive
                    except queue.Empty:
                        item = None  # a heartbeat: the caller writes what finished earlier, on time
                    if item is _DONE:
                        break
                    yield item
            except KeyboardInterrupt:
                # Ctrl-C while waiting, or thrown in by a caller it reached between two arrivals (a write): no new
                # request starts, and what had arrived is handed over to be written before the interrupt goes on.
                future.cancel()
                yield from _arrived(arrivals)
                raise
            if future.cancelled():  # by close(), from another thread
                raise JudgestoreError(
                    f"the backend for {self._descriptor.model!r} at {self._endpoint} was closed while this call was "
                    "sending; what had finished was kept, and running it again in mode use sends only the rest"
                )
            future.result()
        finally:
            future.cancel()  # no-op once done; otherwise the caller stopped early: stop sending

    def _refuse_closed(self) -> None:
        if self._closed:
            raise JudgestoreError(f"the backend for {self._descriptor.model!r} at {self._endpoint} is closed")

    def _forget(self, batch: concurrent.futures.Future[None]) -> None:
        with self._submitting:
            self._batches.discard(batch)

    def close(self) -> None:
        """Stop the batches in flight, close the HTTP client and stop the event loop thread. Safe to call twice.

        A call streaming from this backend in another thread (a cancelled async call) gets what had arrived,
        then a :class:`~store.errors.JudgestoreError` saying the backend was closed; its requests in flight are
        abandoned.
        """
        with self._submitting:
            if self._closed:
                return
            self._closed = True
            batches = list(self._batches)
        for batch in batches:
            batch.cancel()
        concurrent.futures.wait(batches, timeout=10)
        try:
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
        except Exception:  # closing is best effort: the connections die with the loop anyway
            log.debug("closing the HTTP client failed", exc_info=True)
        self._stop_loop()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ on the loop thread

    async def _run(
        self,
        requests: Sequence[EngineRequest],
        emit: Callable[[tuple[int, Generation | Refusal]], None],
        bound: int,
    ) -> None:
        taken: set[int] = set()  # the requests a worker or a probe has taken, of those in order
        sent: set[int] = set()  # those started (a worker waiting to start one has taken it, not sent it)
        # Every input's first sample before any input's second: an input the server always fails on, asked for with
        # n > 1, filled every slot with its own samples, so no other answer came to show that it fails alone, and
        # each rerun stopped at it again (was). Emitted by index: the caller's order is kept.
        order = iter(sorted(range(len(requests)), key=lambda i: requests[i].sample_index))
        started = answered = refused = too_long = finished = alone = 0  # alone: refused for the prompt alone
        failures: list[Exception] = []
        # Cleared while a streak of refusals is checked, and after a refusal while none is answered: no request
        # starts until those in flight have finished (each refusal let its worker start another, so a batch sent
        # 2x the concurrency less one before the check, and one that small was never found to refuse the settings).
        may_start = asyncio.Event()
        may_start.set()
        checking = asyncio.Lock()

        def settled() -> None:
            """After a request finished (a streak of refusals long enough to check goes to the check instead):
            starts go on once one is answered, or once those in flight are in and no check is under way; after a
            refusal, none start until then. (An event set wakes its waiters for good: it is set only when they may
            start.)"""
            if answered or (finished == started and not checking.locked()):
                may_start.set()
            elif refused:
                may_start.clear()

        async def worker() -> None:
            for i in order:  # shared: each worker takes the next request not taken yet
                if i in taken:
                    continue
                taken.add(i)
                async with self._slots:  # a request starts only when one of the backend's slots is free
                    if failures or not await one(i):
                        return

        async def settings_refused() -> bool:
            """Whether the refusals so far refuse the settings (see the module docstring); no request starts while
            this is found out."""
            may_start.clear()
            try:
                # Settings refused, or only the first prompts too long? The requests still in flight say: one
                # answer among them and the batch goes on.
                while finished < started and not answered:
                    await asyncio.sleep(0.01)
                if not answered and too_long == refused and len(sent) < len(requests):
                    # Each refused as over the context: a max_tokens no prompt leaves room for, or a batch sorted
                    # longest first? The shortest prompt not sent yet says (one a waiting worker holds included).
                    shortest = min(set(range(len(requests))) - sent, key=lambda j: _size(requests[j]))
                    taken.add(shortest)
                    before = alone
                    await one(shortest, probe=True)
                    if alone > before:  # refused for its own length (fewer characters, more tokens): says nothing
                        return False
                # Every request sent (the probe was the last): each refusal stands alone, nothing was held back
                return not answered and len(sent) < len(requests)
            finally:
                may_start.set()

        async def one(i: int, *, probe: bool = False) -> bool:
            """Send request ``i``; False when no more requests should start."""
            nonlocal started, answered, refused, too_long, finished, alone
            if not probe:
                await may_start.wait()
            if failures:
                return False
            if i in sent:  # a probe sent it while this worker waited
                return True
            sent.add(i)
            started += 1
            try:
                generation = await self._one(requests[i])
            except HostedRequestError as e:  # this request is refused: it fails alone
                if e.status is None:  # refused in a 200: the server took the settings, so it is an answer here
                    answered += 1
                elif _prompt_alone_too_long(e):  # a prompt over the context says nothing of the settings
                    alone += 1
                else:
                    refused += 1
                    too_long += _too_long(e)
                finished += 1
                emit((i, Refusal(e)))
                if not probe and not answered and refused >= REFUSALS_BEFORE_STOP and len(sent) < len(requests):
                    may_start.clear()  # before the lock, which another check may hold: no start meanwhile
                    async with checking:  # one check at a time: a refusal meanwhile waits for its verdict
                        if failures:
                            return False
                        if answered or not await settings_refused():
                            may_start.set()
                            return True
                        failures.append(self._refused_settings(e, refused))
                        may_start.set()  # the workers waiting see the failure and stop
                        return False
                settled()
                return True
            except _FailsAlone as e:  # the server answers others: this request alone is what it cannot serve
                finished += 1
                emit((i, Refusal(e.error)))
                settled()
                return True
            except Exception as e:
                finished += 1
                failures.append(e)
                may_start.set()  # the workers waiting see the failure and stop
                return False
            answered += 1
            finished += 1
            emit((i, generation))
            settled()
            return True

        # Each worker has one request in flight at a time: this batch's bound. The slots are the backend's.
        await asyncio.gather(*(worker() for _ in range(min(bound, self.max_concurrency, len(requests)))))
        if failures:
            raise failures[0]

    def _refused_settings(self, last: HostedRequestError, refused: int) -> HostedRequestError:
        return HostedRequestError(
            self._endpoint,
            f"the server refused the first {refused} requests of the batch and answered none: it refuses the "
            f"settings, not one request, so no more were sent. The last refusal: {last}",
            status=last.status,
        )

    async def _one(self, request: EngineRequest) -> Generation:
        body = request_body(self._descriptor, request)
        attempt = 0
        while True:
            wait = self._not_before - self._loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.stats.requests_sent += 1
            try:
                async with asyncio.timeout(self._timeout_s):
                    raw = await self._send(body)
            except TimeoutError as e:  # an answer that came too slowly, as a whole: retried as the client's timeouts
                reason, said = "a timeout", ""
                delay = self._retry_delay(attempt, reason, None, e)
            except self._openai.APIStatusError as e:
                status = int(e.status_code)
                said = self._said(getattr(e, "body", None))
                if status in RETRY_STATUSES or status >= 500:
                    if _quota_spent(error_code(getattr(e, "body", None))):
                        raise self._quota_spent(str(status), said, status) from self._cause(e)
                    reason = f"HTTP {status}"
                    delay = self._retry_delay(attempt, reason, retry_after_seconds(e.response.headers), e, said)
                else:
                    raise await self._status_error(e) from self._cause(e)
            except self._openai.APIConnectionError as e:  # APITimeoutError included
                if _never_connected(e):  # refused, no route: no server saw it (56 "sent" to none, was)
                    self.stats.requests_sent -= 1
                reason = "a timeout" if isinstance(e, self._openai.APITimeoutError) else f"a connection error ({e})"
                said = ""
                delay = self._retry_delay(attempt, reason, None, e)
            else:
                try:
                    return self._generation(raw)
                except ErrorInBody as e:
                    said = self._said(e.error)
                    http = getattr(raw, "status_code", 200)
                    if _quota_spent(e.code):
                        raise self._quota_spent(f"{http} with error code {e.code}", said, e.status) from self._cause(e)
                    if e.status is None or not (e.status in RETRY_STATUSES or e.status >= 500):
                        raise await self._body_error(e, said, http) from self._cause(e)
                    reason = f"HTTP {http} with {e.where}.error code {e.status}"
                    delay = self._retry_delay(attempt, reason, retry_after_seconds(raw.headers), e, said)
                except HostedResponseError as e:
                    if not self._answers:  # nothing this server said was a completion yet: not such an API, most likely
                        raise
                    reason, said = f"a body that is not a completion ({self._redact(str(e.__cause__))})", ""
                    delay = self._retry_delay(attempt, reason, None, e)
            attempt += 1
            self.stats.retries += 1
            log.warning(
                "%s: %s%s; retry %d of %d in %.1f s",
                self._endpoint,
                reason,
                f" ({said})" if said else "",
                attempt,
                self.retry.max_retries,
                delay,
            )
            await asyncio.sleep(delay)

    async def _send(self, body: dict[str, Any]) -> Any:
        body = dict(body)
        model = body.pop("model")
        if self._descriptor.input_mode == "chat":
            messages = body.pop("messages")
            return await self._client.chat.completions.with_raw_response.create(
                model=model, messages=messages, extra_body=body
            )
        prompt = body.pop("prompt")
        return await self._client.completions.with_raw_response.create(model=model, prompt=prompt, extra_body=body)

    def _retry_delay(
        self,
        attempt: int,
        reason: str,
        retry_after: float | None,
        cause: Exception,
        said: str = "",
    ) -> float:
        """The wait before the next try, or a raised HostedUnavailableError when there is none: a
        :class:`_FailsAlone` when the server answered since the last request that failed so (see the module
        docstring).

        ``said`` is what the server said (its error message), quoted in the error.
        """
        quoted = f" (the server said: {said})" if said else ""
        if retry_after is not None and retry_after > self.retry.max_retry_after_s:
            raise HostedUnavailableError(
                self._endpoint,
                f"{reason} with Retry-After {retry_after:.0f} s, longer than judgestore waits "
                f"({self.retry.max_retry_after_s:.0f} s; usually a spent quota){quoted}. What finished is stored: "
                "rerun later and only the rest is sent",
            ) from self._cause(cause)
        # A rate limit is the account's, not the request's: it stops the batch, so no more requests meet it
        rate_limited = 429 in (getattr(cause, "status_code", None), getattr(cause, "status", None))
        if attempt >= self.retry.max_retries and self._answers > self._answers_at_lone_failure and not rate_limited:
            self._answers_at_lone_failure = self._answers
            alone = (
                f"{reason}, still after {self.retry.max_retries} retries{quoted}, where the server answers other "
                "requests: this request fails alone and nothing of it was stored; a rerun sends it again"
            )
            error_type = HostedResponseError if isinstance(cause, HostedResponseError) else HostedUnavailableError
            raise _FailsAlone(error_type(self._endpoint, alone)) from self._cause(cause)
        if attempt >= self.retry.max_retries:
            if isinstance(cause, HostedResponseError):
                raise HostedResponseError(
                    self._endpoint,
                    f"{reason}, still after {self.retry.max_retries} retries, where it had answered with completions "
                    "before (a failing proxy or server). Answers that finished before are stored: rerun later, and "
                    "only the rest is sent",
                ) from cause
            unreachable = (  # a server that answered before runs at this URL: a connection it dropped is overload
                isinstance(cause, self._openai.APIConnectionError)
                and not isinstance(cause, self._openai.APITimeoutError)
                and not self._answers
            )
            advice = (  # a server that is not there (a wrong --base-url, a vllm serve not started): not overload
                "check that the server runs at this URL (--base-url), then rerun"
                if unreachable
                else "rerun later (or with a lower --max-concurrency)"
            )
            raise HostedUnavailableError(
                self._endpoint,
                f"{reason}, still after {self.retry.max_retries} retries{quoted}. Answers that finished before are "
                f"stored: {advice}, and only the rest is sent",
            ) from self._cause(cause)
        if retry_after is not None:  # every request of this backend waits, not only this one
            self._not_before = max(self._not_before, self._loop.time() + retry_after)
        return self.retry.delay(attempt, retry_after)

    def _quota_spent(self, shown: str, said: str, status: int | None) -> HostedUnavailableError:
        # Retrying would only send every request max_retries more times: no wait brings a quota back.
        return HostedUnavailableError(
            self._endpoint,
            f"{shown}: the quota of the account is spent ({said or 'insufficient_quota'}); not retried. Add "
            "credit or raise the limit, then rerun: what finished is stored and only the rest is sent",
            status=status,
        )

    def _said(self, body: Any) -> str:
        """What a server's error body says, the key blanked out, on one line and cut for a message."""
        said = " ".join(self._redact(server_message(body, "")).split())
        return said if len(said) <= SAID_CHARS else said[: SAID_CHARS - 3] + "..."

    def _generation(self, raw: Any) -> Generation:
        try:
            data = json.loads(raw.content)  # the stdlib reads NaN and Infinity, which some servers write
            generation = generation_from_body(self._descriptor, data)
        except ModelRefusal as e:
            raise HostedRequestError(
                self._endpoint,
                f"the model refused to answer ({self._said(e.text)!r}, in message.refusal with no content); "
                "a refusal is not its answer, so nothing was stored: a rerun asks again",
                status=None,  # the server answered: not a refusal of the settings (see _run)
            ) from self._cause(e)
        except ValueError as e:  # a malformed body; json.JSONDecodeError is a ValueError too
            raise HostedResponseError(
                self._endpoint,
                f"the server answered {getattr(raw, 'status_code', '?')} with a body that is not a "
                f"{'chat ' if self._descriptor.input_mode == 'chat' else ''}completion ({self._redact(str(e))}). "
                "Is the base URL an OpenAI-compatible API?",
            ) from e
        asked = self._descriptor.sampling.logprobs is not None
        if asked and generation.top_logprobs is None and self._with_logprobs:
            # The server gave them to other answers: a transient gap, retried (and failing alone), where it was
            # stored, a hit without logprobs for good, every rerun silent (was).
            gap = {"code": 503, "message": "no logprobs, where the server's other answers of this run had them"}
            raise ErrorInBody("choices[0]", gap)
        self._answers += 1
        self._with_logprobs += 1 if asked and generation.top_logprobs is not None else 0
        self._check_served_model(data)
        if asked and generation.top_logprobs is None and not self._warned_no_logprobs:
            self._warned_no_logprobs = True  # some providers ignore the setting; say so once, keep the text
            log.warning("%s returned no logprobs for %s although asked", self._endpoint, self._descriptor.model)
        self.stats.prompt_tokens += int(generation.usage.get("prompt_tokens", 0))
        self.stats.completion_tokens += int(generation.usage.get("completion_tokens", 0))
        return generation

    def _check_served_model(self, data: Any) -> None:
        """Say once when the answer names a model that is not the one asked for, nor a dated version of it (a
        router's fallback, an alias moved): its rows are stored under the model asked for, which the user pins."""
        served, asked = data.get("model") if isinstance(data, dict) else None, self._descriptor.model
        if self._warned_served is not None or not isinstance(served, str) or not served:
            return
        if self._descriptor.provider == "vllm-server":  # it names the model by its first served name, any alias asked
            return
        served_name, asked_name = (name.rsplit("/", 1)[-1].lower() for name in (served, asked))  # with or without org
        if served_name == asked_name or _DATED_VERSION.fullmatch(served_name.removeprefix(asked_name)):
            return  # the same model, or a dated version of it (gpt-4o-2024-08-06 for gpt-4o)
        self._warned_served = served
        log.warning(
            "%s answered with the model %r where %r was asked for: its answers are stored under %r (pin the model, "
            "or turn off the router's fallbacks, if that is not the one you meant)",
            self._endpoint, printable(self._redact(served)), asked, asked,  # a proxy may echo the key in it
        )  # fmt: skip

    async def _body_error(self, e: ErrorInBody, said: str, http: int) -> HostedAPIError:
        """The typed error for a 2xx body reporting an error that is not retried (see the module docstring)."""
        if e.where == "response":
            shown = f"{http} with error code {e.code!r}"
            return await self._refusal_error(e.status, e.error, said or "no message", shown)
        return HostedRequestError(
            self._endpoint,
            f"the server answered {http}, but the generation ended in an error (choices[0].error, code {e.code!r}): "
            f"{said or 'no message'}. Nothing was stored: a rerun sends it again",
            status=None,  # the server answered: not a refusal of the settings (see _run)
        )

    async def _status_error(self, e: Any) -> HostedAPIError:
        status = int(e.status_code)
        message = printable(self._redact(server_message(getattr(e, "body", None), str(getattr(e, "message", e)))))[:500]
        return await self._refusal_error(status, getattr(e, "body", None), message, str(status))

    async def _refusal_error(self, status: int | None, body: Any, message: str, shown: str) -> HostedAPIError:
        """The typed error for a refusal that is not retried: an HTTP ``status``, or an error code in a 2xx body.

        ``message`` is what the server said, ``shown`` how the refusal is named
        at the start of the error (the status, or the 2xx and its code).
        """
        model = self._descriptor.model
        if status in (401, 403):
            where = f"the key in {self._key_env}" if self._key_env else "the request (no API key was sent)"
            hint = (
                f"check {self._key_env}, or name another variable with --api-key-env"
                if self._key_env
                else ("set the key's environment variable, or name it with --api-key-env")
            )
            return HostedAuthError(
                self._endpoint, f"{shown}: the server refused {where}: {message}; {hint}", status=status
            )
        code = error_code(body)  # the openai client unwraps {"error": {...}}: an APIStatusError's body is the inner one
        lowered = message.lower()
        model_missing = code == "model_not_found" or (
            status in (400, 404, 422) and "model" in lowered and any(h in lowered for h in MODEL_MISSING_HINTS)
        )
        if model_missing:
            served = await self._served_models()
            # the server's own words: the key blanked and a terminal's escapes shown, as in every message
            listed = printable(self._redact(", ".join(served[:20])))
            serves = f" It serves: {listed}{', ...' if len(served) > 20 else ''}." if served else ""
            return HostedModelNotFoundError(
                self._endpoint,
                f"{shown}: the server does not serve the model {model!r} ({message}).{serves} Check --model "
                "(a served name, e.g. a vllm serve --served-model-name)",
                status=status,
            )
        if status == 404:
            return HostedNotFoundError(
                self._endpoint,
                f"{shown} for {self._path()}: {message}. Check --base-url (OpenAI-compatible APIs usually end in /v1)",
                status=status,
            )
        sent = sorted(request_body_keys(self._descriptor))
        if status in REFUSAL_STATUSES:
            return HostedRequestError(
                self._endpoint,
                f"{shown}: the server refused this request: {message} (settings sent: {', '.join(sent)})",
                status=status,
            )
        return HostedAPIError(
            self._endpoint,
            f"{shown}: the server refused the request for {model!r}: {message}. It was sent the settings {sent}",
            status=status,
        )

    async def _served_models(self) -> list[str]:
        """The ids the server lists at ``/models`` (best effort: [] when it lists none)."""
        try:
            page = await self._client.models.list(timeout=10)
            return sorted(str(m.id) for m in page.data)
        except Exception:
            return []

    def _path(self) -> str:
        return "/chat/completions" if self._descriptor.input_mode == "chat" else "/completions"

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "<api key>") if self._secret else text

    def _cause(self, e: BaseException) -> BaseException | None:
        """``e`` to chain, unless its text holds the key (a server echoing it): then nothing is chained."""
        if self._secret and (self._secret in str(e) or self._secret in repr(getattr(e, "body", ""))):
            return None
        return e


def create_openai_backend(
    descriptor: ModelDescriptor,
    *,
    api_key: str | None,
    key_env: str | None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    stats: RequestStats | None = None,
) -> OpenAIBackend:
    """An :class:`OpenAIBackend` for ``descriptor.endpoint`` (the only place ``openai`` is imported).

    ``api_key`` is sent as the bearer token (None: a placeholder, for servers
    without keys); ``key_env`` names where it came from, for messages.
    The client's own retries are off: :class:`RetryPolicy` retries, and counts.
    """
    try:
        import openai
    except ImportError as e:
        raise JudgestoreError(
            "hosted models need the openai client library: " + install_hint("openai", "'openai>=1.50'")
        ) from e
    # Always an explicit key: left None, the client would fall back to OPENAI_API_KEY and send an
    # OpenAI key to whatever endpoint this is.
    client = openai.AsyncOpenAI(
        api_key=api_key or "no-key", base_url=descriptor.endpoint, max_retries=0, timeout=timeout_s
    )
    return OpenAIBackend(
        client,
        openai,
        descriptor,
        key_env=key_env,
        secret=api_key,
        max_concurrency=max_concurrency,
        retry=retry,
        stats=stats,
        timeout_s=timeout_s,
    )


def _never_connected(error: BaseException) -> bool:
    """Whether the client's connection error is one of a request that reached no server (refused, no route, the
    connect timing out), not one a server dropped after it was sent: only those count as sent. Read by the
    transport's class names: the client's transport is httpx or its fork httpx2, by version."""
    cause: BaseException | None = error
    while cause is not None:
        if type(cause).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
