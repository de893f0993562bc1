"""Shared batches' work queue: inputs claimed in blocks, as leases with a deadline, through a descriptor database.

Contract:

* The queue is the database's ``claims`` table (:class:`store.tables.models.Claim`),
  bookkeeping beside the rows and never part of one. Jobs started on one
  batch each :meth:`WorkQueue.join` it (enqueue their misses, ignoring those
  enqueued already), then :meth:`WorkQueue.claim` blocks of them in the
  batch's order: an input is claimable when its row is not stored and nobody
  holds a live lease on it (never leased, or its lease past its deadline: the
  holder died or stalled, and the input is taken over). A claim is one write
  transaction: on PostgreSQL the rows are picked with ``FOR UPDATE SKIP
  LOCKED`` (concurrent claimers skip each other's rows instead of waiting),
  on SQLite under the database's write lock (``BEGIN IMMEDIATE``).
* A holder :meth:`~WorkQueue.renew` s its leases while it works and
  :meth:`~WorkQueue.finish` es a block once its rows are written: the claims
  of stored inputs are deleted, and a failed input keeps a failure mark (its
  error, for the other jobs to report) until its lease ends. A late result
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
* Times are the database's clock where it has one (PostgreSQL's ``now()``, so
  jobs on many nodes agree), else this machine's.
* What differs between backends (the clock, the key-list parameter, the
  insert ignoring duplicates, row locking) is a
  :class:`~store.claim_table.ClaimTable` subclass each backend gives
  (:meth:`store.backend.Database.claims`); the statements are written once,
  in :mod:`store.claim_table`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from store.claim_table import ClaimsSummary, QueueState, job_name

if TYPE_CHECKING:
    from store.backend import Database


class WorkQueue:
    """One job's side of a shared batch over ``database`` (see the module docstring); every call is one
    transaction, a write retried as a whole when the backend says it may run again."""

    def __init__(self, database: Database, *, holder: str | None = None, lease_seconds: float = 120.0) -> None:
        self.database = database
        self.holder = holder or job_name()
        self.lease_seconds = lease_seconds

    def join(self, keys: Sequence[str]) -> None:
        """Enqueue ``keys`` (the batch's misses, in its order); those enqueued already stay as they are."""
        if keys:
            self.database.claims(lambda table: table.enqueue(keys))

    def claim(self, keys: Sequence[str], limit: int) -> list[str]:
        """Lease up to ``limit`` of ``keys`` that nobody holds and that are not stored, in order."""
        if not keys or limit < 1:
            return []
        return self.database.claims(lambda table: table.claim(keys, self.holder, limit, self.lease_seconds))

    def renew(self) -> int:
        return self.database.claims(lambda table: table.renew(self.holder, self.lease_seconds))

    def finish(self, done: Sequence[str], failed: Mapping[str, str] | None = None) -> None:
        """The block's rows are written (``done``), and ``failed`` inputs failed with these errors."""
        failed = failed or {}
        if done or failed:
            self.database.claims(lambda table: table.finish(done, failed, self.holder, self.lease_seconds))

    def state(self, keys: Sequence[str]) -> QueueState:
        return self.database.claims(lambda table: table.state(keys), write=False)


def claims_summary(database: Database) -> ClaimsSummary:
    """Where the claims of ``database`` stand (read-only)."""
    return database.claims(lambda table: table.summary(), write=False)


def sweep(database: Database, grace_seconds: float) -> int:
    """Delete the claims ``database`` no longer needs (see :meth:`~store.claim_table.ClaimTable.sweep`); how many."""
    return database.claims(lambda table: table.sweep(grace_seconds))
