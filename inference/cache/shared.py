"""Many jobs, one batch: the misses of a plan generated once across processes and nodes (``--shared-batch``).

Contract:

* :func:`generate_shared` is what a :class:`~inference.cache.model.CachedModel`
  made with ``shared=True`` does with its plan's misses instead of generating
  them all. Every job started on the same inputs and settings plans the whole
  batch, joins the store's work queue of the descriptor's database
  (:class:`store.claims.WorkQueue`: a folder store's SQLite database for
  processes on one machine, a PostgreSQL schema for jobs on many nodes), then
  claims misses in blocks, generates and writes only what it claimed (through
  :meth:`CachedModel.generate_missing`, the same generation as an unshared
  run), and claims again. A job that starts late joins the remaining work.
* Blocks are sized by guided self-scheduling: the claimable inputs over twice
  the jobs at work, at most ``chunk_size``, so blocks shrink near the end of
  the batch and the jobs finish close together; and at least what the job's
  engine works on at once (its ``max_concurrency``, once prepared, or the
  call's own ``max_concurrency=`` if lower), since a smaller block would
  leave it part idle for as long as a full one.
* A claim is a lease of ``JUDGESTORE_LEASE_SECONDS`` (renewed every third
  of it by a thread while the job works). A job interrupted (Ctrl-C) or
  failed gives back the leases of its block when it stops, so the others (or
  the same command run again) take them at once. A job that dies loses its
  leases when they expire and the others take the inputs over; only the
  inputs that were in flight in the dead job are asked for twice, and a late
  result for a lease that was taken over is never written twice (rows are
  inserted ignoring duplicates: ``rows_written`` counts what this job
  actually stored).
* The job returns when every input of the batch is stored (or failed: an
  input a job failed is reported by every job, and asked for by none again
  while its failure mark lasts, which is while any job at work renews, and
  a lease after; a job that starts when no job is at work on the batch,
  the batch run again, asks for its failed inputs again at once). Every answer is then read from
  the store, so every job returns the same responses, in the caller's order,
  whichever job generated them; those the call missed are not ``cached``.
* A store that stops answering for a moment (a PostgreSQL restart, a busy
  SQLite file) does not end the job: the queue's steps, and the writes of a
  block's rows, are retried for up to a lease (at least 30 s:
  :mod:`inference.cache.patience`), so a block's answers wait for the store
  rather than being asked for again; the claims live in the database and
  survive it.
* The call's :class:`~inference.cache.accounting.CallStats` counts what this
  job generated and wrote; ``from_other_jobs`` the distinct inputs other jobs
  generated (not those they failed), which its ``runs`` row does not count
  as its misses (summed over the jobs, ``runs`` counts each input once). It
  is set however the job ends: a job interrupted (Ctrl-C) or failed counts
  as misses only what it generated or failed before, the rest being the
  other jobs' to generate.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inference.cache.patience import batch_patience, patiently
from inference.cache.plan import Failure, PlannedInput
from inference.cache.rows import generated_sample, stored_sample
from inference.requests import Request, Sample
from store.claims import WorkQueue
from store.errors import (
    InvalidInputError,
    JudgestoreError,
    RequestRefusedError,
)
from store.roles import Role

if TYPE_CHECKING:
    from inference.cache.accounting import CallStats
    from inference.cache.generate import ProgressCallback
    from store import Settings, Store
    from store.descriptor import ModelDescriptor


class SharingModel(Protocol):
    """What a shared batch uses of a :class:`~inference.cache.model.CachedModel` (which calls it, so no import)."""

    @property
    def store(self) -> Store | None: ...
    @property
    def mode(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def task(self) -> str: ...
    @property
    def descriptor(self) -> ModelDescriptor: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def in_flight(self) -> int: ...

    def generate_missing(
        self,
        role: Role,
        requests: Sequence[Request],
        missing: Sequence[PlannedInput],
        run: CallStats,
        on_progress: ProgressCallback | None = None,
        *,
        write_patience: float = 0.0,
    ) -> dict[str, Sample]: ...


log = logging.getLogger(__name__)
SWEEP_AFTER_LEASES = 30  # claims left behind are swept once past their deadline by this many leases (at least 1 h)
WAITING_POLLS_PER_SECOND = 40  # what the waiting jobs of a batch ask the store, at most, all together


def poll_seconds(jobs: int, lease_seconds: float) -> float:
    """How long a job with nothing to claim waits before it looks again, in ``[0.05, 0.5]`` seconds.

    ``jobs`` is the most jobs the caller has seen at work at once (the jobs
    waiting at the end of a batch hold no lease, so the current holders
    undercount them). So many waiting jobs ask the store
    :data:`WAITING_POLLS_PER_SECOND` times a second in all, within those
    bounds, and each at least every tenth of a lease (so it sees an expired
    lease soon). The wait is how late a waiting job sees the batch's last
    rows: the jobs that wait at the end exit that much after the last answer.
    """
    return max(0.05, min(0.5, lease_seconds / 10, max(jobs, 1) / WAITING_POLLS_PER_SECOND))


def block_size(claimable: int, jobs: int, most: int, least: int = 1) -> int:
    """Guided self-scheduling: ``claimable / (2 * jobs)`` rounded up, within ``[least, most]`` (``most`` wins)."""
    return max(1, min(most, max(least, math.ceil(claimable / (2 * max(jobs, 1))))))


class _Renewal:
    """A thread renewing the job's leases every third of a lease until the job is done."""

    def __init__(self, queue: WorkQueue) -> None:
        self.queue = queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="judgestore-lease-renewal", daemon=True)

    def _run(self) -> None:
        every = self.queue.lease_seconds / 3
        while not self._stop.wait(every):
            try:
                self.queue.renew()
            except Exception as e:  # the next tick tries again; the lease outlasts two missed renewals
                log.warning(
                    "renewing the leases of %s failed (%s); trying again in %.1f s", self.queue.holder, e, every
                )

    def __enter__(self) -> _Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class _Share:
    """What this job took on of the batch, kept as it goes so that an interrupted or failed job counts it too."""

    own: dict[str, Sample] = field(default_factory=dict)  # generated (or failed) here, by key
    in_flight: int = 0  # generated (or failed) here of the block the job was interrupted or failed in
    failed_elsewhere: int = 0  # inputs another job failed: neither this job's share nor generated by the others


def generate_shared(
    model: SharingModel,
    role: Role,
    requests: Sequence[Request],
    missing: Sequence[PlannedInput],
    on_progress: ProgressCallback | None,
    run: CallStats,
) -> dict[str, Sample]:
    """Generate ``missing`` together with the other jobs of the batch; every answer read from the store.

    ``run.from_other_jobs`` is set on every exit, an interrupt or a failure too (the caller records the run then as
    well): the inputs this job did not generate or fail, so its ``runs`` row counts only its share as misses."""
    share = _Share()
    try:
        return _generate_shared(model, role, requests, missing, on_progress, run, share)
    finally:
        run.from_other_jobs = (
            len({inp.key for inp in missing}) - len(share.own) - share.in_flight - share.failed_elsewhere
        )


def _generate_shared(
    model: SharingModel,
    role: Role,
    requests: Sequence[Request],
    missing: Sequence[PlannedInput],
    on_progress: ProgressCallback | None,
    run: CallStats,
    share: _Share,
) -> dict[str, Sample]:
    store = model.store
    if store is None or model.mode != "use":
        raise InvalidInputError(f"a shared batch needs a store in mode use, not mode {model.mode!r}")
    lease = model.settings.lease_seconds
    patience = batch_patience(lease)
    patiently(lambda: store.check_writable(role, model.task, model.descriptor), patience)  # reads
    database = patiently(lambda: store.database(role, model.task, model.descriptor), patience)  # creates it once
    queue = WorkQueue(database, lease_seconds=lease)
    by_key = {inp.key: inp for inp in missing}
    keys = list(by_key)
    patiently(lambda: queue.sweep(max(3600.0, SWEEP_AFTER_LEASES * lease)), patience)
    patiently(lambda: queue.join(keys), patience)

    own = share.own  # what this job generated (or failed)
    failed_elsewhere: dict[str, str] = {}
    pending = list(keys)  # not yet known to be stored, nor failed by this job
    first = patiently(functools.partial(queue.state, pending), patience)
    if first.failed and not first.leased:
        # No job at work on the batch: its jobs stopped, and this is the batch run again. Its failures are asked
        # for again (a mark stops the jobs of one run from each retrying an input, not the run that follows).
        patiently(functools.partial(queue.retry_failed, list(first.failed)), patience)

    reported = 0
    most_jobs = 1  # the most jobs seen at work at once: near the end most wait, holding no lease
    waiting_since: float | None = None  # when this job last found nothing to claim, with nothing done since
    said_waiting = False

    def progress(done: int) -> None:
        nonlocal reported
        if on_progress is not None and done > reported:  # only forward: a bar is finished once it is full
            reported = done
            on_progress(done, len(keys))

    with _Renewal(queue):
        while pending:
            state = patiently(functools.partial(queue.state, pending), patience)
            failed_elsewhere.update(state.failed)
            pending = [k for k in pending if k not in state.stored]
            progress(len(keys) - len(pending) + len(state.failed))
            if state.unqueued:
                patiently(functools.partial(queue.join, pending), patience)
            if not state.claimable and not state.leased:  # everything left failed
                break
            block: list[str] = []
            jobs = len(state.holders - {queue.holder}) + 1
            most_jobs = max(most_jobs, jobs)
            if state.claimable:
                size = block_size(state.claimable, jobs, model.chunk_size, model.in_flight)
                candidates = [k for k in pending if k not in own]
                block = patiently(functools.partial(queue.claim, candidates, size), patience)
            if not block:
                now = time.monotonic()
                waiting_since = now if waiting_since is None else waiting_since
                if not said_waiting and now - waiting_since >= lease / 4:
                    # Said once: a job that died holds its inputs until its leases end, and a rerun waits that long
                    said_waiting = True
                    holders = len(state.holders - {queue.holder})  # alive or not: a dead job's lease still holds
                    log.warning(
                        "waiting for %d inputs held by %d other job%s; a job that stopped gives its inputs up when "
                        "its leases end, within %.0f s of its last renewal (JUDGESTORE_LEASE_SECONDS)",
                        state.leased, holders, "" if holders == 1 else "s", lease,
                    )  # fmt: skip
                time.sleep(poll_seconds(most_jobs, lease))  # others hold the rest: wait for their rows or leases' end
                continue
            waiting_since = None
            # Retried whole when the store stops answering (a restart) past the writes' own patience: before the
            # engine is asked, nothing is lost; after, the block is asked for again and its rows are written once.
            inputs = [by_key[k] for k in block]
            before = run.generated + len(run.failed)
            failed_before = len(run.failed)

            def generate_block(
                inputs: list[PlannedInput] = inputs, failed_before: int = failed_before
            ) -> dict[str, Sample]:
                del run.failed[failed_before:]  # a block asked for again reports its failures once
                # Its rows' writes wait for the store as long: a restart past the store's own retries no longer
                # throws the answers away (each job asked its whole block again).
                return model.generate_missing(role, requests, inputs, run, write_patience=patience)

            try:
                got = patiently(generate_block, patience)
            except BaseException:
                # Interrupted (Ctrl-C) or failed mid-block: what it generated of the block first is its share too
                # (its rows are stored); the rest is given back, for the others (or this command run again) to take
                # at once rather than a lease later. Given back only if the store answers: else the leases end.
                share.in_flight = min(len(block), run.generated + len(run.failed) - before)
                with contextlib.suppress(JudgestoreError):
                    queue.release(block)
                raise
            own.update(got)
            errors = {k: _error_text(s) for k, s in got.items() if s.error is not None}
            done = [k for k in block if k not in errors]
            patiently(functools.partial(queue.finish, done, errors), patience)
            pending = [k for k in pending if k not in errors]

    stored = patiently(lambda: database.get_many(keys), patience)
    patiently(lambda: queue.finish(list(stored)), patience)  # claims a late join enqueued for stored inputs
    results: dict[str, Sample] = {}
    for key in keys:
        inp = by_key[key]
        if key in stored:  # a miss of this call, whichever job generated it: not "cached", as the summary says
            results[key] = stored_sample(stored[key], cached=False)
        elif key in own:
            results[key] = own[key]  # failed here: already in run.failed
        else:
            share.failed_elsewhere += 1
            error = RequestRefusedError(f"failed in another job of the shared batch: {failed_elsewhere.get(key)}")
            request = requests[inp.request_index]
            run.failed.append(Failure.of(inp.request_index, request, inp, error))
            results[key] = generated_sample(inp, None, error)
    progress(len(keys))
    return results


def _error_text(sample: Sample) -> str:
    error = sample.error
    return "" if error is None else f"{type(error).__name__}: {' '.join(str(error).split())}"
