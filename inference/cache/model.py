"""The cache boundary: plan a batch against the store, prepare the engine only for misses.

Contract (docs/design.md, "A run, step by step"):

* The whole batch is rendered and hashed, then looked up in one pass; the
  :class:`~inference.cache.plan.Plan` (hits, misses, duplicates) is known before
  anything runs (:func:`~inference.cache.plan.batch_keys`,
  :func:`~inference.cache.plan.plan_batch`). What the engine is asked, the rows
  written and the samples returned are made by :mod:`inference.cache.rows`.
* The engine factory is called only if something is missing, so a full hit
  never loads a model (nor imports vLLM). Identical inputs in a batch are
  generated once; with ``sample_repeats=True`` (what the drop-in entry
  points pass at a random sampling: :func:`inference.sampling.random_sampling`)
  each repeat of an input takes its next sample instead (the k-th request of
  an input gets sample k), as an engine without a cache answers repeats, each
  on its own; errors and ``missing_requests`` name the caller's requests.
* Every miss of a call goes to the engine at once, and what finishes is
  written as it comes, every ``chunk_size`` generations or every
  :data:`~inference.cache.generate.STREAM_FLUSH_SECONDS`
  (:mod:`inference.cache.generate`): a crash loses at most one write
  interval, a rerun generates only what is still missing, and Ctrl-C stops
  the engine, writes what finished and says so. A backend that cannot stream
  gets ``chunk_size`` misses at a time, each written before the next starts.
* Sample ``k`` of an input has its own key (the sample-index rule), so asking
  for more samples than are stored generates only the missing ones.
* Modes: ``use`` reads and writes; ``refresh`` regenerates and replaces;
  ``off`` never touches the store; ``replay`` only reads and raises
  :class:`CacheMissError` on the first miss, before preparing anything
  (its ``missing_requests`` name every request the store cannot answer, its
  ``responses`` hold the others' answers from the same lookup);
  ``readonly`` reads and generates misses but never writes.
* Every output is a result: an empty completion with a normal finish reason
  (``stop``, ``length``) is stored and hit like any other. (Earlier versions
  returned empty outputs without storing them: such an input is generated
  once more, then hits.)
* A bad request fails alone; only a failure of the engine itself stops the
  call (after what finished was written). Before the engine is prepared, the
  ``preflight`` (:mod:`inference.backends.vllm.preflight`) finds the misses
  it would refuse (a prompt too long for the model): they fail without it,
  and a batch of nothing else never prepares it. A request the engine or
  server refuses anyway comes back as a
  :class:`~inference.backends.base.Refusal`, and a row the store refuses
  (:class:`InvalidInputError`, e.g. a lone surrogate) is split from its
  write, whose other rows are written. None of them is stored. The call
  returns every answer, then raises one :class:`RequestsFailedError` listing
  the failed inputs (:class:`~inference.cache.plan.Failure`, also in
  ``last.failed``) and carrying every response (``.responses``), the failed
  ones marked with their ``error``.
* Each generated row's ``usage`` records what producing it cost: its share of
  its write interval's engine time (:func:`inference.cache.accounting.priced`). ``last``
  counts what the misses cost and what the hits saved, and each call in mode
  ``use`` or ``refresh`` appends that accounting to the database's ``runs``
  table (unless ``JUDGESTORE_RECORD_RUNS=0``); a store that refuses that one
  row (read-only to this user, full) or does not answer as the call ends (a
  server restarting) gives a warning, not an error
  (:class:`~store.runs.RunNotRecordedWarning`): the answers are complete.
* A plan counts apart the hits that are adopted rows (copied from an older
  descriptor by ``judgestore adopt``, :mod:`inference.drift.adopt`): they answer
  like any hit, and the plan and the summary say how many there were.
* A plan with misses says whether they were expected: how many rows the
  descriptor's database already holds, or how many other descriptors of the
  same model the task has (``judgestore explain`` says why they missed).
* Before the engine is prepared,
  the store is checked for what can be known without writing
  (:meth:`~store.store.Store.check_writable`: names, a read-only filesystem,
  permissions), so such a store fails before any model loads; a write that
  fails later (a full disk) raises its typed error with ``rows_kept``, the
  rows this run stored before it, which are kept.
* With a ``remote`` (opt-in), the descriptor folder of a run is fetched from
  it (:func:`store.sync.fetch`) before the first lookup, in modes ``use``
  and ``replay``, so colleagues' rows count as hits.
* With ``shared=True`` (mode ``use``), jobs started on the same batch share
  its misses through the store: each generates only the blocks it claims
  (:mod:`inference.cache.shared`, which calls :meth:`CachedModel.generate_missing`
  for each), and returns every answer as the store holds it.
* Responses come back in the caller's order, as :class:`Responses`: a list
  that also carries what its own call did (``.run``, a
  :class:`~inference.cache.accounting.CallStats`). ``last`` is the latest call's (the
  same object, filled in as that call goes), so concurrent callers read
  ``.run`` of their own result, never ``last``.
* :meth:`CachedModel.acomplete` / :meth:`~CachedModel.ajudge` are the same
  calls for async code: the whole call (plan, lookups, writes, and the
  engine for vLLM) runs in a worker thread, so the event loop stays free; a
  hosted model's misses go out concurrently, at most its
  ``max_concurrency`` at once across every call of the model. A call's own
  ``max_concurrency=`` bounds that call's requests in flight lower
  (:func:`~inference.backends.base.check_bound`; a backend that cannot
  stream under it gets that many misses at a time). ``async
  with`` closes the engine off the loop too. Concurrent calls are safe: the
  engine is prepared once, and a local engine (not safe to call from two
  threads) serves one caller's batch at a time (vLLM's backend holds its
  engine for a whole stream; a backend that cannot stream takes one chunk at
  a time under the model's ``_engine_lock``). Cancelling the awaiting task
  does not stop its thread: what it generates is still written. Closing the
  model (leaving ``async with``) stops such a call's engine work, waits for
  it to write what finished, and refuses it a new engine (a call started
  after the close prepares one again).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache, partial
from typing import TYPE_CHECKING, Any, TypeVar

from inference.backends.base import Backend, Preflight, check_bound, max_concurrency
from inference.cache.accounting import CallStats, usage_totals
from inference.cache.generate import ProgressCallback, Writer, generate_into
from inference.cache.patience import TRANSIENT, batch_patience, patiently
from inference.cache.plan import MODES, Mode, Plan, PlannedInput, Slot, as_batch, batch_keys, plan_batch
from inference.cache.rows import engine_request, stored_sample
from inference.requests import CompletionRequest, JudgementRequest, Request, Response, Sample
from store import Settings, Store
from store.caller import warn_the_caller
from store.descriptor import ModelDescriptor
from store.errors import (
    CacheMissError,
    InvalidInputError,
    JudgestoreError,
    RequestsFailedError,
    RunValueError,
    ServerPermissionError,
    StoreFullError,
    StoreNotWritableError,
)
from store.interrupts import carrying
from store.layout import Selector
from store.roles import Role, check_role
from store.runs import RunNotRecordedWarning, record_run
from store.schema import DatabaseState
from store.settings import from_environment
from store.tables.records import Record
from store.tables.row_checks import gc_paused

if TYPE_CHECKING:
    from store.sync.remote import Remote

log = logging.getLogger("judgestore.model")

CLOSE_WAIT_S = 60.0  # how long close() waits for running calls to stop and write what finished
DEFAULT_CHUNK_SIZE = 64  # generations written per write (also every STREAM_FLUSH_SECONDS): not the engine's batch


class Responses(list[Response]):
    """The responses of one call, in request order, and what that call did (:attr:`run`)."""

    run: CallStats

    def __init__(self, responses: Iterable[Response] = (), run: CallStats | None = None) -> None:
        super().__init__(responses)
        self.run = run if run is not None else CallStats()


T = TypeVar("T")
CALL_THREADS = 256  # async calls in flight at once, each waiting in its own thread


@cache
def _call_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="judgestore-call")


# A forked child inherits the pool without its threads: its calls waited for ever (a multiprocessing worker's)
os.register_at_fork(after_in_child=_call_threads.cache_clear)


async def in_call_thread(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a thread of judgestore's own pool, in a copy of the caller's context (as
    :func:`asyncio.to_thread`). An async call waits out its whole network or engine time in its thread: in
    asyncio's default pool (5-6 threads on a machine of 1-2 cores) ``gather`` of 64 ``ainvoke`` of a hosted model
    had 6 requests in flight, not its ``max_concurrency``, which bounds the calls' requests together."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_call_threads(), partial(context.run, func, *args))


class CachedModel:
    """One model (descriptor) behind the store; see the module docstring.

    ``backend_factory`` is called at most once, the first time something is
    missing; its engine is then reused for later batches until :meth:`close`.
    """

    def __init__(
        self,
        store: Store | None,
        descriptor: ModelDescriptor,
        *,
        task: str,
        backend_factory: Callable[[], Backend],
        mode: Mode = "use",
        settings: Settings | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        label: str | None = None,
        remote: Remote | None = None,
        preflight: Preflight | None = None,
        shared: bool = False,
    ) -> None:
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if shared and mode != "use":
            raise InvalidInputError(f"a shared batch writes what it generates: it needs mode 'use', not {mode!r}")
        if store is None and mode != "off":
            raise InvalidInputError(f"mode {mode!r} needs a store; pass one, or use mode='off'")
        if store is not None and not isinstance(store, Store):  # a folder's path: an AttributeError (was)
            raise InvalidInputError(
                f"store must be a Store, e.g. Store(root={store!r}), got {type(store).__name__}"
                if isinstance(store, str | os.PathLike)
                else f"store must be a Store, got {type(store).__name__} {store!r:.40}"
            )
        if type(chunk_size) is not int or chunk_size < 1:  # before a model loads: range() would refuse 2.5 then
            raise InvalidInputError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
        if label == "":  # a row whose model or judge is "" names nobody; None is what takes the model's name
            raise InvalidInputError("the label is empty: give a name, or leave it out to record the model's")
        try:  # every row and every output line carries it: refused here, not after the engine ran
            (label or "").encode()
        except UnicodeEncodeError as e:
            raise InvalidInputError(f"the label {label!r} is not valid Unicode text ({e.reason})") from e
        self.store = store
        self.descriptor = descriptor
        self.task = task
        self.mode: Mode = mode
        self.settings = settings or (store.settings if store is not None else from_environment(Settings))
        self.chunk_size = chunk_size
        self.label = label or descriptor.model
        self._descriptor_hash: tuple[ModelDescriptor, str] | None = None  # see descriptor_sha256
        self._backend_factory = backend_factory
        self._backend: Backend | None = None
        self.remote = remote
        self._preflight = preflight
        self.shared = shared
        self._fetched: set[Role] = set()
        self._backend_lock = threading.Lock()  # concurrent calls (async ones, threads) prepare one engine
        self._closes = 0  # how often the model was closed: a call running across a close gets no new engine
        self._calls = 0  # calls running now (threads, async calls' worker threads)
        self._idle = threading.Condition()  # notified when a call ends
        # ``closes`` when this thread's call began (None outside a call): a call's callbacks may close the model;
        # ``bound``: that call's own bound on its requests in flight (None: the engine's).
        self._in_call = threading.local()
        self._engine_lock = threading.Lock()  # and a backend that cannot stream takes one chunk at a time
        self.last = CallStats()  # the latest call's; each call's own is its result's ``.run``

    @property
    def descriptor_sha256(self) -> str:
        """``self.descriptor.sha256()``, computed once per descriptor (LangChain's layer names it in every answer's
        metadata: hashing it again per input cost 0.3 ms each, on the event loop)."""
        held = self._descriptor_hash
        if held is None or held[0] is not self.descriptor:
            held = self._descriptor_hash = (self.descriptor, self.descriptor.sha256())
        return held[1]

    @property
    def engine_loaded(self) -> bool:
        return self._backend is not None

    @property
    def in_flight(self) -> int:
        """How many requests its engine works on at once, once prepared (1 before: asking never loads it); in a call
        that bounds its requests in flight lower (``max_concurrency=``), that bound: a shared batch sizes its blocks
        by it, and a block larger than what the call works on would hold inputs the other jobs could take."""
        if self._backend is None:
            return 1
        own, bound = max_concurrency(self._backend), getattr(self._in_call, "bound", None)
        return own if bound is None else min(own, bound)

    def close(self) -> None:
        """Close the engine, then wait for the calls still running (a cancelled async call's thread) to end.

        The engine stops their work first (see the module docstring), and each writes what finished before it
        ends: when this returns, those rows are in the store. Such a call that needs the engine afterwards raises
        :class:`~store.errors.JudgestoreError` rather than prepare one nobody would close; a call started after
        this prepares it again.
        """
        with self._backend_lock:  # after a factory still running: the engine it builds is closed too
            self._closes += 1
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()
        if getattr(self._in_call, "closes", None) is not None:
            return  # closed from a call's own callback: that call cannot end while it waits here
        with self._idle:
            if not self._idle.wait_for(lambda: self._calls == 0, timeout=CLOSE_WAIT_S):
                log.warning("closing %s: %d calls still running after %.0f s", self.label, self._calls, CLOSE_WAIT_S)

    def __enter__(self) -> CachedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CachedModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)  # a vLLM shutdown takes seconds: not on the event loop

    # ------------------------------------------------------------ public API

    def complete(
        self,
        requests: Sequence[CompletionRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
        max_concurrency: int | None = None,
        sample_repeats: bool = False,
    ) -> Responses:
        """Completions for ``requests``, in order; ``.run`` of the result says what this call did (``sample_repeats``:
        see the module docstring)."""
        return self._run("completions", requests, on_plan, on_progress, max_concurrency, sample_repeats)

    def judge(
        self,
        requests: Sequence[JudgementRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
        max_concurrency: int | None = None,
        sample_repeats: bool = False,
    ) -> Responses:
        """Judgements for ``requests``, in order; ``.run`` of the result says what this call did (``sample_repeats``:
        see the module docstring)."""
        return self._run("judgements", requests, on_plan, on_progress, max_concurrency, sample_repeats)

    async def acomplete(
        self,
        requests: Sequence[CompletionRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
        max_concurrency: int | None = None,
        sample_repeats: bool = False,
    ) -> Responses:
        """:meth:`complete` in a worker thread (see the module docstring); the callbacks are called there."""
        return await in_call_thread(
            self._run, "completions", requests, on_plan, on_progress, max_concurrency, sample_repeats
        )

    async def ajudge(
        self,
        requests: Sequence[JudgementRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
        max_concurrency: int | None = None,
        sample_repeats: bool = False,
    ) -> Responses:
        """:meth:`judge` in a worker thread (see the module docstring); the callbacks are called there."""
        return await in_call_thread(
            self._run, "judgements", requests, on_plan, on_progress, max_concurrency, sample_repeats
        )

    def plan(self, role: Role, requests: Sequence[Request], *, sample_repeats: bool = False) -> Plan:
        """Render, hash and look up ``requests`` without generating anything (``sample_repeats``: as a call)."""
        check_role(role)
        requests = as_batch(requests)
        keys, inputs = batch_keys(role, requests, self.descriptor.input_mode, sample_repeats=sample_repeats)
        hits = self._lookup(role, inputs)
        return plan_batch(role, self.mode, requests, keys, inputs, hits, self.descriptor.input_mode)

    # ------------------------------------------------------------ the boundary

    def _fetch(self, role: Role, run: CallStats | None) -> None:
        """Import the remote's rows of this descriptor folder, once per role and model."""
        if self.remote is None or self.store is None or self.mode not in ("use", "replay") or role in self._fetched:
            return
        if self.store.readonly:  # the fetch would fail into its report, unread, and replay miss its rows (was)
            raise InvalidInputError(
                "a remote is fetched into the store before the lookup, and the store was opened read-only "
                "(Store(..., readonly=True)): open it for writing, or pass no remote"
            )
        from store.sync import fetch

        report = fetch(self.store, self.remote, Selector.of(role, self.task, self.descriptor))
        self._fetched.add(role)
        if run is not None:
            run.fetched_rows = report.rows

    def _lookup(self, role: Role, inputs: dict[str, Slot], run: CallStats | None = None) -> dict[str, Record]:
        if self.mode in ("off", "refresh") or self.store is None or not inputs:
            return {}
        self._fetch(role, run)
        store = self.store

        def look_up() -> dict[str, Record]:
            database = store.find(role, self.task, self.descriptor)
            return {} if database is None else database.get_many(inputs)

        try:
            if self.shared:  # a shared batch's job waits out a store that stops answering for a moment, from its start
                return patiently(look_up, batch_patience(self.settings.lease_seconds))
            return look_up()
        except StoreNotWritableError as e:
            if self.mode in ("readonly", "replay") and not store.readonly:  # a mode that never writes, on a writer
                e.add_note(
                    f"mode {self.mode!r} writes nothing, but this store was opened for writing: open a store you may "
                    "only read with Store(..., readonly=True), as `judgestore generate --mode readonly` does"
                )
            raise

    def _run(
        self,
        role: Role,
        requests: Sequence[Request],
        on_plan: Callable[[Plan], None] | None,
        on_progress: ProgressCallback | None,
        max_concurrency: int | None = None,
        sample_repeats: bool = False,
    ) -> Responses:
        check_bound(max_concurrency)
        requests = as_batch(requests)
        with self._idle:
            self._calls += 1
        nested = getattr(self._in_call, "closes", None), getattr(self._in_call, "bound", None)
        self._in_call.closes, self._in_call.bound = self._closes, max_concurrency
        try:
            return self._serve(role, requests, on_plan, on_progress, sample_repeats)
        finally:
            self._in_call.closes, self._in_call.bound = nested
            with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    def _serve(
        self,
        role: Role,
        requests: Sequence[Request],
        on_plan: Callable[[Plan], None] | None,
        on_progress: ProgressCallback | None,
        sample_repeats: bool,
    ) -> Responses:
        started, started_at = time.perf_counter(), datetime.now(UTC)
        run = self.last = CallStats()
        keys, inputs = batch_keys(role, requests, self.descriptor.input_mode, sample_repeats=sample_repeats)
        hits = self._lookup(role, inputs, run)
        seconds = time.perf_counter() - started
        plan = plan_batch(role, self.mode, requests, keys, inputs, hits, self.descriptor.input_mode, seconds)
        plan = self._with_miss_context(plan)
        run.plan = plan
        if on_plan is not None:
            on_plan(plan)
        if plan.missing and self.mode == "replay":
            first = plan.missing[0]
            request = requests[first.request_index]
            absent = {inp.key for inp in plan.missing}
            missing = [not absent.isdisjoint(ks) for ks in keys]
            raise CacheMissError(
                f"replay mode: {plan.misses} of {plan.distinct} inputs are not in the store; the first is "
                f"{request.named(first.request_index)} ({request.describe()}), sample {first.sample_index}, "
                f"input hash {first.key[:16]}. Run once with --mode use to fill the store.",
                missing_requests=[i for i, lacks in enumerate(missing) if lacks],
                responses=[
                    None if lacks else Response(r, tuple(stored_sample(hits[k]) for k in ks))
                    for r, ks, lacks in zip(requests, keys, missing, strict=True)
                ],
            )
        with gc_paused():
            results: dict[str, Sample] = {key: stored_sample(record) for key, record in hits.items()}
        try:
            with carrying("call_stats", run):  # a Ctrl-C carries what this call wrote (its ``written``), for the CLI
                if plan.missing and self.shared:
                    from inference.cache.shared import generate_shared

                    results.update(generate_shared(self, role, requests, plan.missing, on_progress, run))
                elif plan.missing:
                    results.update(self._generate(role, requests, plan.missing, on_progress, run))
        except BaseException:
            # Interrupted or failed: the rows it wrote are kept, so their cost is recorded too (else a rerun
            # would count them as saved without any run having spent them). The original error is what raises.
            run.saved = usage_totals(record.usage for record in hits.values())
            run.seconds = time.perf_counter() - started
            with contextlib.suppress(JudgestoreError):
                self._record_run(plan, started_at, run, failed=True)
            raise
        with gc_paused():
            responses = Responses(
                (Response(r, tuple(map(results.__getitem__, ks))) for r, ks in zip(requests, keys, strict=True)), run
            )
        run.truncated = sum(
            s.finish_reason == "length" and s.error is None for response in responses for s in response.samples
        )
        run.saved = usage_totals(record.usage for record in hits.values())
        run.seconds = time.perf_counter() - started
        self._record_run(plan, started_at, run)
        if run.failed:
            raise RequestsFailedError(run.failed_message(), failures=run.failed, responses=responses)
        return responses

    def _with_miss_context(self, plan: Plan) -> Plan:
        """Say whether the misses were expected (see :attr:`Plan.unexpected_misses`); only runs with misses pay."""
        if not plan.misses or self.store is None or self.mode not in ("use", "readonly", "replay"):
            return plan
        database = self.store.find(plan.role, self.task, self.descriptor)
        if database is not None:
            return replace(plan, stored_rows=database.count())
        mine = Selector.of(plan.role, self.task, self.descriptor)
        # A database known to hold no row (a run that failed before it wrote one) stores nothing to miss.
        others = self.store.infos(self.store.select(replace(mine, descriptor=None)))
        return replace(
            plan, other_descriptors=sum(info.rows != 0 and info.state is not DatabaseState.EMPTY for info in others)
        )

    def _record_run(self, plan: Plan, started_at: datetime, last: CallStats, *, failed: bool = False) -> None:
        """Append this call's accounting to the database's ``runs`` (modes use and refresh, a writable store); a
        call that ``failed`` gets the store's error raised, for its caller to drop (its own error is what raises)."""
        store = self.store
        if store is None or store.readonly or self.mode not in ("use", "refresh") or not plan.requested:
            return
        if not self.settings.record_runs:
            return
        record = last.run_record(
            run_id=self.settings.run_id,
            created_by=self.settings.created_by,
            started_at=started_at,
            finished_at=datetime.now(UTC),
        )
        try:
            database = store.find(plan.role, self.task, self.descriptor)
            if database is None:  # nothing hit and nothing was written
                return
            record_run(database, record)  # not tried again: a commit whose answer was lost would count it twice
        except RunValueError as e:  # a row's usage of more tokens than the table's integers hold: its answers stand
            if failed:  # its answers are not complete: the warning would say they are
                raise
            warn_the_caller(f"this run was not recorded ({e}); its answers are complete.", RunNotRecordedWarning)
        except (StoreNotWritableError, StoreFullError, ServerPermissionError, *TRANSIENT) as e:
            if failed:  # its answers are not complete: the warning would say they are
                raise
            # Every answer is there (the hits, and what was written): losing them for one row of accounting
            # would be worse than the missing row (a user who may only read, all hits, on a server store; a
            # server restarting as the run ends)
            said = f"this run was not recorded in its database's runs table ({e}); its answers are complete."
            if not isinstance(e, TRANSIENT):  # a refusal that every run here would meet
                said += " `--mode readonly` (or JUDGESTORE_RECORD_RUNS=false) does not try to record it"
            warn_the_caller(said, RunNotRecordedWarning)

    def generate_missing(
        self,
        role: Role,
        requests: Sequence[Request],
        missing: Sequence[PlannedInput],
        run: CallStats,
        on_progress: ProgressCallback | None = None,
        *,
        write_patience: float = 0.0,
    ) -> dict[str, Sample]:
        """Generate and write these planned misses of ``requests`` (one block of a shared batch); ``run`` counts it.
        ``write_patience``: how long a write waits for a store that stopped answering (:mod:`inference.cache.patience`).
        """
        return self._generate(role, requests, missing, on_progress, run, write_patience)

    def _generate(
        self,
        role: Role,
        requests: Sequence[Request],
        missing: Sequence[PlannedInput],
        on_progress: ProgressCallback | None,
        run: CallStats,
        write_patience: float = 0.0,
    ) -> dict[str, Sample]:
        """Generate ``missing`` (planned misses of ``requests``), write them, and return their samples by key.

        A call's whole generation path; a caller may call it for any part of a plan's misses.
        """
        store = self.store if self.mode in ("use", "refresh") else None  # the store this run writes to
        if store is not None and store.readonly:  # before the tokenizer loads for the prompts' lengths (was: after)
            raise InvalidInputError(
                f"mode {self.mode!r} writes the misses, and the store was opened read-only (Store(..., "
                "readonly=True)): open it for writing, or read it with mode='readonly' (misses generated, not "
                "stored) or 'replay'"
            )
        writer = Writer(
            requests,
            run,
            total=len(missing),
            label=self.label,
            settings=self.settings,
            refresh=self.mode == "refresh",
            on_progress=on_progress,
            open_database=None if store is None else partial(store.database, role, self.task, self.descriptor),
            write_patience=write_patience,
        )
        engine_requests = [engine_request(inp) for inp in missing]
        refused = self._preflight(engine_requests) if self._preflight is not None else {}
        for index, error in refused.items():
            writer.fail(missing[index], error)
        if refused:
            writer.progress(len(refused))
        todo = [i for i in range(len(missing)) if i not in refused]
        if not todo:  # every miss would be refused: the engine is never prepared for them
            return writer.results

        if store is not None and self._backend is None:
            # Before the engine: a bad name or a store that cannot be written fails in seconds, not after a load
            # (and nothing is created for an engine that may yet be refused).
            store.check_writable(role, self.task, self.descriptor)
        backend = self._prepared_backend()
        run.engine_loaded = True
        generate_into(
            writer,
            backend,
            [missing[i] for i in todo],
            [engine_requests[i] for i in todo],
            chunk_size=self.chunk_size,
            engine_lock=self._engine_lock,
            # The call's own bound, read here so that a shared batch's blocks (generate_missing) keep it too.
            max_concurrency=getattr(self._in_call, "bound", None),
        )
        return writer.results

    def _prepared_backend(self) -> Backend:
        """The engine, prepared by the first call that needs it (concurrent calls wait for that one)."""
        with self._backend_lock:
            began = getattr(self._in_call, "closes", None)
            if began is not None and began != self._closes:
                raise JudgestoreError(
                    f"the model {self.label!r} was closed while this call ran; what it generated before is kept, and "
                    "running it again generates only the rest"
                )
            if self._backend is None:
                self._backend = self._backend_factory()
            return self._backend
