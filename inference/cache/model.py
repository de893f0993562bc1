"""The cache boundary: plan a batch against the store, prepare the engine only for misses.

Contract (docs/design.md, "A run, step by step"):

* The whole batch is rendered and hashed, then looked up in one pass; the
  :class:`~inference.cache.plan.Plan` (hits, misses, duplicates) is known before
  anything runs (:func:`~inference.cache.plan.batch_keys`,
  :func:`~inference.cache.plan.plan_batch`). What the engine is asked, the rows
  written and the samples returned are made by :mod:`inference.cache.rows`.
* The engine factory is called only if something is missing, so a full hit
  never loads a model (nor imports vLLM). Identical inputs in a batch are
  generated once.
* Misses are generated in chunks and each chunk is written before the next
  starts: a crash loses at most one chunk, and a rerun generates only what
  is still missing. A :class:`~inference.backends.base.StreamingBackend` (a hosted
  API) gets all the misses at once and its generations are written as they
  arrive, every ``chunk_size`` of them or every :data:`STREAM_FLUSH_SECONDS`,
  whichever comes first; what arrived before a failure or an interrupt is
  written before the error propagates. A kill loses at most what arrived
  since the last write and what was in flight.
* Sample ``k`` of an input has its own key (the sample-index rule), so asking
  for more samples than are stored generates only the missing ones.
* Modes: ``use`` reads and writes; ``refresh`` regenerates and replaces;
  ``off`` never touches the store; ``replay`` only reads and raises
  :class:`CacheMissError` on the first miss, before preparing anything;
  ``readonly`` reads and generates misses but never writes.
* Every output is a result: an empty completion with a normal finish reason
  (``stop``, ``length``) is stored and hit like any other. (Earlier versions
  returned empty outputs without storing them: such an input is generated
  once more, then hits.)
* A bad request fails alone; only a failure of the engine itself stops the
  call (after the chunks already finished were written). Before the engine
  is prepared, the ``preflight`` (:mod:`inference.backends.vllm.preflight`) finds the
  misses it would refuse (a prompt too long for the model): they fail
  without it, and a batch of nothing else never prepares it. A request the
  engine or server refuses anyway comes back as a
  :class:`~inference.backends.base.Refusal`, and a row the store refuses
  (:class:`InvalidInputError`, e.g. a lone surrogate) is split from its
  chunk, whose other rows are written. None of them is stored. The call
  returns every answer, then raises one :class:`RequestsFailedError` listing
  the failed inputs (:class:`~inference.cache.plan.Failure`, also in
  ``last.failed``) and carrying every response (``.responses``), the failed
  ones marked with their ``error``.
* Each generated row's ``usage`` records what producing it cost: its share of
  its chunk's engine time (:func:`inference.cache.accounting.priced`). ``last``
  counts what the misses cost and what the hits saved, and each call in mode
  ``use`` or ``refresh`` appends that accounting to the database's ``runs``
  table (unless ``JUDGESTORE_RECORD_RUNS=0``).
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
  ``max_concurrency`` at once across every call of the model. ``async
  with`` closes the engine off the loop too. Concurrent calls are safe: the
  engine is prepared once, and a local engine (not safe to call from two
  threads) takes one chunk at a time. Cancelling the awaiting task does not
  stop its thread: what it generates is still written.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from inference.backends.base import Backend, EngineRequest, Generation, Preflight, Refusal, StreamingBackend
from inference.cache.accounting import CallStats, priced, usage_totals
from inference.cache.plan import MODES, Failure, Mode, Plan, PlannedInput, Slot, batch_keys, plan_batch
from inference.cache.rows import engine_request, generated_record, generated_sample, stored_sample
from inference.requests import CompletionRequest, JudgementRequest, Request, Response, Sample
from store.descriptor import ModelDescriptor
from store.errors import BackendError, CacheMissError, InvalidInputError, JudgestoreError, RequestsFailedError
from store.layout import Role, Selector
from store.records import Record
from store.row_checks import gc_paused
from store.runs import record_run
from store.settings import Settings
from store.store import Database, Store

if TYPE_CHECKING:
    from store.sync.remote import Remote

DEFAULT_CHUNK_SIZE = 64
# A streaming backend's arrivals are written at least this often, so a slow hosted run killed
# half-way loses seconds of paid requests rather than a whole chunk's worth.
STREAM_FLUSH_SECONDS = 2.0


ProgressCallback = Callable[[int, int], None]  # (generated so far, to generate)


class Responses(list[Response]):
    """The responses of one call, in request order, and what that call did (:attr:`run`)."""

    run: CallStats

    def __init__(self, responses: Iterable[Response] = (), run: CallStats | None = None) -> None:
        super().__init__(responses)
        self.run = run if run is not None else CallStats()


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
        if chunk_size < 1:
            raise InvalidInputError(f"chunk_size must be >= 1, got {chunk_size}")
        self.store = store
        self.descriptor = descriptor
        self.task = task
        self.mode: Mode = mode
        self.settings = settings or (store.settings if store is not None else Settings())
        self.chunk_size = chunk_size
        self.label = label or descriptor.model
        self._backend_factory = backend_factory
        self._backend: Backend | None = None
        self.remote = remote
        self._preflight = preflight
        self.shared = shared
        self._fetched: set[Role] = set()
        self._backend_lock = threading.Lock()  # concurrent calls (async ones, threads) prepare one engine
        self._engine_lock = threading.Lock()  # and a local engine takes one chunk at a time
        self.last = CallStats()  # the latest call's; each call's own is its result's ``.run``

    @property
    def engine_loaded(self) -> bool:
        return self._backend is not None

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

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
    ) -> Responses:
        """Completions for ``requests``, in order; ``.run`` of the result says what this call did."""
        return self._run("completions", requests, on_plan, on_progress)

    def judge(
        self,
        requests: Sequence[JudgementRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Responses:
        """Judgements for ``requests``, in order; ``.run`` of the result says what this call did."""
        return self._run("judgements", requests, on_plan, on_progress)

    async def acomplete(
        self,
        requests: Sequence[CompletionRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Responses:
        """:meth:`complete` in a worker thread (see the module docstring); the callbacks are called there."""
        return await asyncio.to_thread(self._run, "completions", requests, on_plan, on_progress)

    async def ajudge(
        self,
        requests: Sequence[JudgementRequest],
        *,
        on_plan: Callable[[Plan], None] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Responses:
        """:meth:`judge` in a worker thread (see the module docstring); the callbacks are called there."""
        return await asyncio.to_thread(self._run, "judgements", requests, on_plan, on_progress)

    def plan(self, role: Role, requests: Sequence[Request]) -> Plan:
        """Render, hash and look up ``requests`` without generating anything."""
        keys, inputs = batch_keys(role, requests, self.descriptor.input_mode)
        hits = self._lookup(role, inputs)
        return plan_batch(role, self.mode, requests, keys, inputs, hits, self.descriptor.input_mode)

    # ------------------------------------------------------------ the boundary

    def _fetch(self, role: Role, run: CallStats | None) -> None:
        """Import the remote's rows of this descriptor folder, once per role and model."""
        if self.remote is None or self.store is None or self.mode not in ("use", "replay") or role in self._fetched:
            return
        from store.sync import fetch

        report = fetch(self.store, self.remote, Selector.of(role, self.task, self.descriptor))
        self._fetched.add(role)
        if run is not None:
            run.fetched_rows = report.rows

    def _lookup(self, role: Role, inputs: dict[str, Slot], run: CallStats | None = None) -> dict[str, Record]:
        if self.mode in ("off", "refresh") or self.store is None or not inputs:
            return {}
        self._fetch(role, run)
        database = self.store.find(role, self.task, self.descriptor)
        return {} if database is None else database.get_many(inputs)

    def _run(
        self,
        role: Role,
        requests: Sequence[Request],
        on_plan: Callable[[Plan], None] | None,
        on_progress: ProgressCallback | None,
    ) -> Responses:
        started, started_at = time.perf_counter(), datetime.now(UTC)
        run = self.last = CallStats()
        keys, inputs = batch_keys(role, requests, self.descriptor.input_mode)
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
            raise CacheMissError(
                f"replay mode: {plan.misses} of {plan.distinct} inputs are not in the store; the first is "
                f"request {first.request_index} ({request.describe()}), sample {first.sample_index}, "
                f"input hash {first.key[:16]}. Run once with --mode use to fill the store."
            )
        with gc_paused():
            results: dict[str, Sample] = {key: stored_sample(record) for key, record in hits.items()}
        if plan.missing and self.shared:
            from inference.cache.shared import generate_shared

            results.update(generate_shared(self, role, requests, plan.missing, on_progress, run))
        elif plan.missing:
            results.update(self._generate(role, requests, plan.missing, on_progress, run))
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
        others = self.store.select(replace(mine, descriptor=None))
        return replace(plan, other_descriptors=len(others))

    def _record_run(self, plan: Plan, started_at: datetime, last: CallStats) -> None:
        """Append this call's accounting to the database's ``runs`` (modes use and refresh, a writable store)."""
        store = self.store
        if store is None or store.readonly or self.mode not in ("use", "refresh") or not plan.requested:
            return
        if not self.settings.record_runs:
            return
        database = store.find(plan.role, self.task, self.descriptor)
        if database is None:  # nothing hit and nothing was written
            return
        record = last.run_record(
            run_id=self.settings.run_id,
            created_by=self.settings.created_by,
            started_at=started_at,
            finished_at=datetime.now(UTC),
        )
        record_run(database, record)

    def generate_missing(
        self,
        role: Role,
        requests: Sequence[Request],
        missing: Sequence[PlannedInput],
        run: CallStats,
        on_progress: ProgressCallback | None = None,
    ) -> dict[str, Sample]:
        """Generate and write these planned misses of ``requests`` (one block of a shared batch); ``run`` counts it."""
        return self._generate(role, requests, missing, on_progress, run)

    def _generate(
        self,
        role: Role,
        requests: Sequence[Request],
        missing: Sequence[PlannedInput],
        on_progress: ProgressCallback | None,
        run: CallStats,
    ) -> dict[str, Sample]:
        store = self.store if self.mode in ("use", "refresh") else None  # the store this run writes to
        results: dict[str, Sample] = {}
        done_count = 0

        def fail(inp: PlannedInput, error: JudgestoreError, gen: Generation | None = None) -> None:
            request = requests[inp.request_index]
            run.failed.append(Failure(inp.request_index, request.describe(), inp.sample_index, inp.key, error))
            results[inp.key] = generated_sample(inp, gen, error)

        def progress(count: int) -> None:
            nonlocal done_count
            done_count += count
            if on_progress is not None:
                on_progress(done_count, len(missing))

        engine_requests = [engine_request(inp) for inp in missing]
        refused = self._preflight(engine_requests) if self._preflight is not None else {}
        for index, error in refused.items():
            fail(missing[index], error)
        if refused:
            progress(len(refused))
        todo = [i for i in range(len(missing)) if i not in refused]
        if not todo:  # every miss would be refused: the engine is never prepared for them
            return results

        if store is not None and self._backend is None:
            # Before the engine: a bad name or a store that cannot be written fails in seconds, not after a load
            # (and nothing is created for an engine that may yet be refused).
            store.check_writable(role, self.task, self.descriptor)
        backend = self._prepared_backend()
        run.engine_loaded = True
        database = None if store is None else store.database(role, self.task, self.descriptor)

        def write(done: Sequence[tuple[PlannedInput, Generation | Refusal]]) -> None:
            answered = [(inp, gen) for inp, gen in done if isinstance(gen, Generation)]
            for inp, outcome in done:
                if isinstance(outcome, Refusal):
                    fail(inp, outcome.error)
            run.spent += usage_totals(gen.usage for _, gen in answered)
            now = datetime.now(UTC)
            records = [
                generated_record(requests[inp.request_index], inp, gen, now, label=self.label, settings=self.settings)
                for inp, gen in answered
            ]
            not_kept: dict[str, InvalidInputError] = {}
            if database is not None and records:
                written, not_kept = self._write(database, records, run)
                run.written += written
            for inp, gen in answered:
                if inp.key in not_kept:
                    fail(inp, not_kept[inp.key], gen)
                else:
                    results[inp.key] = generated_sample(inp, gen)
            run.generated += len(answered)
            progress(len(done))

        chosen = [missing[i] for i in todo]
        if isinstance(backend, StreamingBackend):
            self._stream(backend, chosen, [engine_requests[i] for i in todo], write)
            return results
        for start in range(0, len(todo), self.chunk_size):
            chunk = todo[start : start + self.chunk_size]
            with self._engine_lock:  # a local engine serves one caller's chunk at a time
                generating = time.perf_counter()
                outcomes = backend.generate([engine_requests[i] for i in chunk])
            if len(outcomes) != len(chunk):
                raise BackendError(f"backend returned {len(outcomes)} generations for {len(chunk)} requests")
            done = list(zip((missing[i] for i in chunk), outcomes, strict=True))
            write(self._priced(done, time.perf_counter() - generating))
        return results

    def _prepared_backend(self) -> Backend:
        """The engine, prepared by the first call that needs it (concurrent calls wait for that one)."""
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._backend_factory()
            return self._backend

    def _stream(
        self,
        backend: StreamingBackend,
        missing: Sequence[PlannedInput],
        engine_requests: Sequence[EngineRequest],
        write: Callable[[Sequence[tuple[PlannedInput, Generation | Refusal]]], None],
    ) -> None:
        """Write a streaming backend's generations as they arrive (see the module docstring)."""
        pending: list[tuple[PlannedInput, Generation | Refusal]] = []
        seen: set[int] = set()
        last_write = time.monotonic()
        try:
            for index, outcome in backend.generate_stream(engine_requests):
                if index in seen or not 0 <= index < len(missing):
                    raise BackendError(f"backend returned request index {index} twice or out of range")
                seen.add(index)
                pending.append((missing[index], outcome))
                if len(pending) >= self.chunk_size or time.monotonic() - last_write >= STREAM_FLUSH_SECONDS:
                    done, pending = pending, []
                    write(self._priced(done, time.monotonic() - last_write))
                    last_write = time.monotonic()
        finally:
            # What arrived before a failure or an interrupt was paid for: keep it.
            if pending:
                done, pending = pending, []
                write(self._priced(done, time.monotonic() - last_write))
        if len(seen) != len(missing):
            raise BackendError(f"backend returned {len(seen)} generations for {len(missing)} requests")

    @staticmethod
    def _priced(
        done: Sequence[tuple[PlannedInput, Generation | Refusal]], seconds: float
    ) -> list[tuple[PlannedInput, Generation | Refusal]]:
        """The generations of ``done`` with their shares of ``seconds`` (refusals cost nothing)."""
        answered = {i: outcome for i, (_, outcome) in enumerate(done) if isinstance(outcome, Generation)}
        result = list(done)
        for i, generation in zip(answered, priced(list(answered.values()), seconds), strict=True):
            result[i] = (done[i][0], generation)
        return result

    def _write(
        self, database: Database, records: list[Record], run: CallStats
    ) -> tuple[int, dict[str, InvalidInputError]]:
        """Write one chunk: the rows written, and the rows the store refused (by input hash) with its reason.

        A row the store refuses (:class:`InvalidInputError`: a value it cannot hold) fails alone: the chunk is
        split until that row is alone, and every other row is written. Any other failure (a full disk...) says
        how many rows this run stored before it, and raises.
        """
        policy: Literal["ignore", "replace"] = "replace" if self.mode == "refresh" else "ignore"
        refused: dict[str, InvalidInputError] = {}

        def put(batch: list[Record]) -> int:
            try:
                return database.put_many(batch, policy)
            except InvalidInputError as e:  # the store refused a value before writing anything of the batch
                if len(batch) == 1:
                    refused[batch[0].input_hash] = e
                    return 0
                half = len(batch) // 2
                return put(batch[:half]) + put(batch[half:])

        try:
            return put(records), refused
        except JudgestoreError as e:
            e.rows_kept = run.written
            e.add_note(
                f"This run stored {run.written} rows before the failure ({run.generated} generated); "
                "they are kept, and running it again generates only the rest."
            )
            raise
