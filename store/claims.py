"""Shared batches' work queue: inputs claimed in blocks, as leases with a deadline, through a descriptor database.

Contract:

* The queue is the database's ``claims`` table (:class:`store.tables.models.Claim`),
  bookkeeping beside the rows and never part of one. Jobs started on one
  batch each :meth:`WorkQueue.join` it (enqueue their misses, ignoring those
  enqueued already), then :meth:`WorkQueue.claim` blocks of them in the
  batch's order: an input is claimable when its row is not stored and nobody
  holds a live lease on it (never leased, or its lease past its deadline: the
  holder died or stalled, and the input is taken over). A claim is one write
  transaction, and the writers of a database take turns: on SQLite under its
  write lock (``BEGIN IMMEDIATE``), on PostgreSQL under the schema's
  (:func:`store.backends.postgres.generations.write_lock`; the rows are also
  picked with ``FOR UPDATE SKIP LOCKED``).
* While another process holds that lock (a prune, a delete, a copy) no
  holder can renew, so a lease that expired then says nothing about its
  holder. Each job notes how long its queue writes (claims, renewals...)
  wait for the database: a wait over a tenth of a lease says it was locked,
  and the job takes over no lease that expired during such a wait (one
  still waiting included) until half a lease after it ended; by then a live
  holder has renewed. A job at work renews every third of a lease, so it
  sees every lock long enough to end a live lease.
* A holder :meth:`~WorkQueue.renew` s its leases while it works,
  :meth:`~WorkQueue.release` s those it will not finish when it stops
  (Ctrl-C, a failure: the others take them at once, not a lease later), and
  :meth:`~WorkQueue.finish` es a block once its rows are written: the claims
  of stored inputs are deleted, and a failed input keeps a failure mark (its
  error, for the other jobs to report, and no job asks for it again) while
  any job at work on the database renews (each renewal extends the live
  marks), ending a lease after the last job stops. A late result
  for a lease that was taken over is harmless: rows are content-addressed and
  inserted ignoring duplicates, so it is never written twice; a late failure
  marks nothing (a mark is set only by the job holding the claim, so it
  never overwrites the live lease of the job that took the input over).
* :meth:`~WorkQueue.state` says where a batch stands (stored, leased, stale,
  waiting, failed, jobs at work); :func:`claims_summary` says it for a whole
  database (``judgestore ls``/``stats``/``db status``); :func:`sweep` deletes
  what is left behind (claims of stored inputs, and leases and failure marks
  past their deadline by more than ``grace``). A claim left behind never
  blocks anything: an input whose row is stored is never claimed again.
* Times are the database's clock where it has one (PostgreSQL's ``clock_timestamp()``, so
  jobs on many nodes agree), else this machine's.
* What differs between backends (the clock, the key-list parameter, the
  insert ignoring duplicates, row locking) is a
  :class:`~store.claim_table.ClaimTable` subclass each backend gives
  (:meth:`store.backend.Database.claims`); the statements are written once,
  in :mod:`store.claim_table`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from store.claim_table import ClaimsSummary, QueueState, job_name

if TYPE_CHECKING:
    from store.backend import Database
    from store.claim_table import ClaimTable

T = TypeVar("T")
# A write that waited longer than this share of a lease says the database was locked (another process's long
# write): renewals come every third of a lease, so a shorter wait cannot have cost a live holder its lease.
LOCKED_WAIT_LEASES = 0.1
# A lease that expired while the database was locked is spared this share of a lease after the lock ends: its
# holder's renewal, blocked too or due within a third of a lease, gets through by then if the holder lives.
SPARED_LEASES = 0.5


class WorkQueue:
    """One job's side of a shared batch over ``database`` (see the module docstring); every call is one
    transaction, a write retried as a whole when the backend says it may run again."""

    def __init__(self, database: Database, *, holder: str | None = None, lease_seconds: float = 120.0) -> None:
        self.database = database
        self.holder = holder or job_name()
        self.lease_seconds = lease_seconds
        self._locked: list[tuple[float, float]] = []  # monotonic stretches this job's writes waited for the lock
        self._waiting: dict[object, float] = {}  # the writes waiting now: when each asked
        self._guard = threading.Lock()  # the renewal thread writes too

    def join(self, keys: Sequence[str]) -> None:
        """Enqueue ``keys`` (the batch's misses, in its order); those enqueued already stay as they are."""
        if keys:
            self._write(lambda table: table.enqueue(keys))

    def claim(self, keys: Sequence[str], limit: int) -> list[str]:
        """Lease up to ``limit`` of ``keys`` that nobody holds and that are not stored, in order (a lease that
        expired while the database was locked is spared a while: see the module docstring)."""
        if not keys or limit < 1:
            return []
        return self._write(lambda table: table.claim(keys, self.holder, limit, self.lease_seconds, self._spared()))

    def renew(self) -> int:
        return self._write(lambda table: table.renew(self.holder, self.lease_seconds))

    def release(self, keys: Sequence[str]) -> int:
        """Give back this job's leases of ``keys`` it will not finish (it stops): the others take them at once."""
        return self._write(lambda table: table.release(keys, self.holder)) if keys else 0

    def finish(self, done: Sequence[str], failed: Mapping[str, str] | None = None) -> None:
        """The block's rows are written (``done``), and ``failed`` inputs failed with these errors."""
        failed = failed or {}
        if done or failed:
            self._write(lambda table: table.finish(done, failed, self.holder, self.lease_seconds))

    def retry_failed(self, keys: Sequence[str]) -> int:
        """Clear the failure marks of ``keys`` (a batch run again once its jobs stopped): any job may claim them."""
        return self._write(lambda table: table.retry_failed(keys)) if keys else 0

    def sweep(self, grace_seconds: float) -> int:
        """:func:`sweep` as this job's write (a wait for the lock is noted, as every write's is)."""
        return self._write(lambda table: table.sweep(grace_seconds))

    def _write(self, work: Callable[[ClaimTable], T]) -> T:
        """``work`` in a write transaction, noting how long it waits for it (for :meth:`_spared`)."""
        token, asked = object(), time.monotonic()  # a retry of the transaction keeps this: its whole wait counts
        with self._guard:
            self._waiting[token] = asked

        def timed(table: ClaimTable) -> T:
            self._granted(token, asked, time.monotonic())
            return work(table)

        try:
            return self.database.claims(timed)
        finally:
            with self._guard:
                self._waiting.pop(token, None)

    def _granted(self, token: object, asked: float, granted: float) -> None:
        spared = SPARED_LEASES * self.lease_seconds
        with self._guard:
            self._waiting.pop(token, None)
            if granted - asked < LOCKED_WAIT_LEASES * self.lease_seconds:
                return
            kept = [(start, end) for start, end in self._locked if end + spared > granted]  # still sparing
            overlapping = [(start, end) for start, end in kept if start <= granted and asked <= end]
            merged = (min([asked, *(s for s, _ in overlapping)]), max([granted, *(e for _, e in overlapping)]))
            self._locked = [stretch for stretch in kept if stretch not in overlapping] + [merged]

    def _spared(self) -> list[tuple[float, float]]:
        """The stretches this job saw the database locked that still spare leases, as (seconds ago it began,
        seconds ago it ended): those its writes waited, and those its writes still wait (another thread's
        renewal, which may see the lock go only after this claim)."""
        now = time.monotonic()
        spared, locked = SPARED_LEASES * self.lease_seconds, LOCKED_WAIT_LEASES * self.lease_seconds
        with self._guard:
            stretches = [stretch for stretch in self._locked if stretch[1] + spared > now]
            stretches += [(asked, now) for asked in self._waiting.values() if now - asked >= locked]
        return [(now - start, now - end) for start, end in stretches]

    def state(self, keys: Sequence[str]) -> QueueState:
        return self.database.claims(lambda table: table.state(keys), write=False)


def claims_summary(database: Database) -> ClaimsSummary:
    """Where the claims of ``database`` stand (read-only)."""
    return database.claims(lambda table: table.summary(), write=False)


def sweep(database: Database, grace_seconds: float) -> int:
    """Delete the claims ``database`` no longer needs (see :meth:`~store.claim_table.ClaimTable.sweep`); how many."""
    return database.claims(lambda table: table.sweep(grace_seconds))
