"""The claims table of shared batches, as each backend runs it: the statements, written once.

Contract: :class:`ClaimTable` holds every statement of the work queue
(enqueue, claim in order, renew, finish, state, summary, sweep) over the
``claims`` table (:class:`store.tables.models.Claim`); each backend subclasses it for
what differs (its clock, key lists, the insert ignoring duplicates, row
locking) and hands it out through :meth:`store.backend.Database.claims`.
:class:`QueueState` and :class:`ClaimsSummary` are what it reports. The queue
a job drives, above the backends, is :mod:`store.claims`.
"""

from __future__ import annotations

import os
import secrets
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Insert,
    Select,
    Table,
    and_,
    delete,
    exists,
    false,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)

from store.roles import Role
from store.tables.models import MODEL_OF_ROLE, Claim

CLAIMS: Table = Claim.__table__  # type: ignore[assignment]
KEY_BATCH = 20_000  # keys per key-list parameter


def job_name() -> str:
    """A name for this job's leases: host, process id and a random tag (a restarted process is another job)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True)
class QueueState:
    """Where the inputs of one batch stand (:meth:`WorkQueue.state`)."""

    stored: frozenset[str] = frozenset()  # inputs whose rows are stored
    leased: int = 0  # live leases, held by any job
    stale: int = 0  # leases past their deadline, not stored: their holder died or stalled
    waiting: int = 0  # enqueued, never leased
    unqueued: int = 0  # neither stored nor enqueued (swept meanwhile): to be enqueued again
    failed: Mapping[str, str] = field(default_factory=dict)  # input hash -> the error of a live failure mark
    holders: frozenset[str] = frozenset()  # jobs holding live leases

    @property
    def claimable(self) -> int:
        return self.stale + self.waiting + self.unqueued


@dataclass(frozen=True)
class ClaimsSummary:
    """A database's claims as ``ls``, ``stats`` and ``db status`` show them (:func:`claims_summary`)."""

    leased: int = 0  # live leases on inputs not stored yet: work in progress
    stale: int = 0  # leases past their deadline on inputs not stored: a job died (others take them over)
    waiting: int = 0  # enqueued, never leased
    failed: int = 0  # failure marks: inputs a job could not generate (past its deadline, a later job tries again)
    done: int = 0  # claims of inputs stored already (left behind; swept)
    jobs: int = 0  # distinct jobs holding live leases
    oldest_deadline: datetime | None = None  # of the stale leases

    @property
    def in_progress(self) -> bool:
        """Whether a job is at work on the batch (holds a live lease)."""
        return bool(self.leased)

    @property
    def left_over(self) -> bool:
        """Inputs enqueued and never leased, with no job at work: a batch that was stopped (or one starting)."""
        return not self.leased and bool(self.waiting)

    @property
    def total(self) -> int:
        return self.leased + self.stale + self.waiting + self.failed + self.done

    def as_dict(self) -> dict[str, Any]:
        return {
            "leased": self.leased,
            "stale": self.stale,
            "waiting": self.waiting,
            "failed": self.failed,
            "done": self.done,
            "jobs": self.jobs,
            "oldest_stale_deadline": None if self.oldest_deadline is None else self.oldest_deadline.isoformat(),
        }

    @staticmethod
    def lasting(fields: Mapping[str, Any] | None) -> bool:
        """Whether claims kept as their fields (a catalog's JSON) hold while the database's files do: not with
        live leases or failure marks, which pass their deadlines with no write (a job that died leaves leases
        that turn stale)."""
        return not (fields and (fields.get("leased") or fields.get("failed")))

    def short(self) -> str:
        """``12 leased by 3 jobs, 40 waiting, 2 stale`` (empty when there is nothing to say)."""
        parts = []
        if self.leased:
            parts.append(f"{self.leased} leased by {self.jobs} job{'s' if self.jobs != 1 else ''}")
        if self.waiting:
            parts.append(f"{self.waiting} waiting")
        if self.stale:
            parts.append(f"{self.stale} stale")
        if self.failed:
            parts.append(f"{self.failed} failed")
        return ", ".join(parts)


class ClaimTable(ABC):
    """The claims statements of one descriptor database on a connection inside a transaction (see the module
    docstring); a backend gives the four things that differ."""

    def __init__(self, conn: Connection, role: Role) -> None:
        self.conn = conn
        self.rows: Table = MODEL_OF_ROLE[role].__table__  # type: ignore[assignment]

    # ------------------------------------------------------------ what a backend says

    @abstractmethod
    def now(self) -> datetime:
        """The clock leases are measured by (aware, UTC)."""

    @abstractmethod
    def _keys_in(self, column: Any) -> ColumnElement[bool]:
        """``column`` is one of the keys bound as the parameter ``keys`` (:meth:`_keys`)."""

    @abstractmethod
    def _keys(self, keys: Sequence[str]) -> Any:
        """The value of the ``keys`` parameter for ``keys``."""

    @abstractmethod
    def _insert_ignoring(self) -> Insert:
        """An insert into ``claims`` that leaves a row already there as it is."""

    def _locked(self, stmt: Select[Any]) -> Select[Any]:
        """``stmt`` locking the rows it picks for this transaction, skipping those another holds (if it can)."""
        return stmt

    # ------------------------------------------------------------ statements

    def _stored(self) -> ColumnElement[bool]:
        return exists().where(self.rows.c.input_hash == CLAIMS.c.input_hash)

    def enqueue(self, keys: Sequence[str]) -> None:
        now = self.now()
        rows = [
            {"input_hash": key, "position": i, "holder": None, "deadline": None, "attempts": 0, "failed": None,
             "updated_at": now}
            for i, key in enumerate(keys)
        ]  # fmt: skip
        for start in range(0, len(rows), KEY_BATCH):
            self.conn.execute(self._insert_ignoring(), rows[start : start + KEY_BATCH])

    def claim(
        self,
        keys: Sequence[str],
        holder: str,
        limit: int,
        lease_seconds: float,
        spared: Sequence[tuple[float, float]] = (),
    ) -> list[str]:
        """Lease up to ``limit`` claimable inputs among ``keys`` to ``holder``, in the batch's order.

        ``spared``: stretches the claimer saw the database locked (its writes waited for SQLite's write lock,
        which another process may hold longer than a lease), as (seconds ago it began, seconds ago it ended). A
        lease that expired in one is not taken over: its holder could not renew it then either."""
        now = self.now()
        expired = CLAIMS.c.deadline < now
        for began, ended in spared:
            locked = CLAIMS.c.deadline.between(now - timedelta(seconds=began), now - timedelta(seconds=ended))
            expired = and_(expired, ~locked)
        claimable = and_(
            self._keys_in(CLAIMS.c.input_hash),
            or_(CLAIMS.c.deadline.is_(None), expired),
            ~self._stored(),
        )
        stmt = self._locked(select(CLAIMS.c.input_hash).where(claimable).order_by(CLAIMS.c.position).limit(limit))
        taken: list[str] = []
        for start in range(0, len(keys), KEY_BATCH):
            if len(taken) >= limit:
                break
            chunk = self._keys(keys[start : start + KEY_BATCH])
            taken += self.conn.execute(stmt.limit(limit - len(taken)), {"keys": chunk}).scalars().all()
        if taken:
            deadline = now + timedelta(seconds=lease_seconds)
            leased = update(CLAIMS).where(self._keys_in(CLAIMS.c.input_hash))
            leased = leased.values(
                holder=holder, deadline=deadline, attempts=CLAIMS.c.attempts + 1, failed=None, updated_at=now
            )
            self.conn.execute(leased, {"keys": self._keys(taken)})
        return taken

    def renew(self, holder: str, lease_seconds: float) -> int:
        """Push back the deadline of every lease ``holder`` still holds (not those taken over), and of every live
        failure mark: a mark lasts while any job at work renews, so no job of the run asks for a failed input
        again, and ends a lease after the last stops. How many leases."""
        now = self.now()
        deadline = now + timedelta(seconds=lease_seconds)
        result = self.conn.execute(
            update(CLAIMS)
            .where(CLAIMS.c.holder == holder, CLAIMS.c.failed.is_(None), CLAIMS.c.deadline.is_not(None))
            .values(deadline=deadline, updated_at=now)
        )
        self.conn.execute(
            update(CLAIMS)
            .where(CLAIMS.c.failed.is_not(None), CLAIMS.c.deadline >= now, CLAIMS.c.deadline < deadline)
            .values(deadline=deadline)  # updated_at kept: when the input failed
        )
        return max(result.rowcount, 0)

    def release(self, keys: Sequence[str], holder: str) -> int:
        """Give back ``holder``'s live leases of ``keys`` (not failure marks, nor leases taken over): claimable at
        once by another job. How many."""
        result = self.conn.execute(
            update(CLAIMS)
            .where(self._keys_in(CLAIMS.c.input_hash), CLAIMS.c.holder == holder, CLAIMS.c.failed.is_(None))
            .values(holder=None, deadline=None, updated_at=self.now()),
            {"keys": self._keys(keys)},
        )
        return max(result.rowcount, 0)

    def finish(self, done: Sequence[str], failed: Mapping[str, str], holder: str, lease_seconds: float) -> None:
        """Delete the claims of ``done`` inputs whose rows are stored; mark ``failed`` ones for a lease, which every
        job's renewals extend (:meth:`renew`).

        A failure is marked only on a claim ``holder`` still holds: once another job took the input over (the
        lease expired meanwhile), the mark would overwrite that job's live lease (it could no longer renew it,
        and the others would report the input failed while it generates), so the late failure is left out."""
        if done:
            self.conn.execute(
                delete(CLAIMS).where(self._keys_in(CLAIMS.c.input_hash), self._stored()), {"keys": self._keys(done)}
            )
        now = self.now()
        for key, error in failed.items():
            self.conn.execute(
                update(CLAIMS)
                .where(CLAIMS.c.input_hash == key, CLAIMS.c.holder == holder)
                .values(holder=holder, failed=error, deadline=now + timedelta(seconds=lease_seconds), updated_at=now)
            )

    def retry_failed(self, keys: Sequence[str]) -> int:
        """Clear the failure marks of ``keys``: they wait to be claimed again, by any job. How many."""
        result = self.conn.execute(
            update(CLAIMS)
            .where(self._keys_in(CLAIMS.c.input_hash), CLAIMS.c.failed.is_not(None))
            .values(holder=None, deadline=None, failed=None, updated_at=self.now()),
            {"keys": self._keys(keys)},
        )
        return max(result.rowcount, 0)

    def state(self, keys: Sequence[str]) -> QueueState:
        """Where ``keys`` stand. Their rows and their claims are read in one statement, so in one snapshot even
        where a transaction's statements each see the latest commits (PostgreSQL's READ COMMITTED): read in two,
        an input stored and finished between them was neither stored nor enqueued, counted ``unqueued``, and the
        caller enqueued its whole batch again (overlapping enqueues of many jobs deadlocked)."""
        now = self.now()
        stored: set[str] = set()
        seen: set[str] = set()
        leased = stale = waiting = 0
        failed: dict[str, str] = {}
        holders: set[str] = set()
        nothing = null()
        found = select(self.rows.c.input_hash, true(), nothing, nothing, nothing).where(
            self._keys_in(self.rows.c.input_hash)
        )
        claims = select(CLAIMS.c.input_hash, false(), CLAIMS.c.holder, CLAIMS.c.deadline, CLAIMS.c.failed).where(
            self._keys_in(CLAIMS.c.input_hash), ~self._stored()
        )
        both = union_all(claims, found)  # the claims' first: their columns type the result (not the NULLs)
        for start in range(0, len(keys), KEY_BATCH):
            params = {"keys": self._keys(keys[start : start + KEY_BATCH])}
            for key, is_stored, holder, deadline, error in self.conn.execute(both, params):
                if is_stored:
                    stored.add(key)
                    continue
                seen.add(key)
                if deadline is None:
                    waiting += 1
                elif deadline < now:
                    stale += 1
                elif error is not None:
                    failed[key] = error
                else:
                    leased += 1
                    holders.add(holder)
        unqueued = len(set(keys)) - len(stored) - len(seen)
        return QueueState(frozenset(stored), leased, stale, waiting, max(unqueued, 0), failed, frozenset(holders))

    def summary(self) -> ClaimsSummary:
        now = self.now()
        leased = stale = waiting = failed = done = 0
        holders: set[str] = set()
        oldest: datetime | None = None
        stored = self._stored().label("stored")
        for holder, deadline, error, is_stored in self.conn.execute(
            select(CLAIMS.c.holder, CLAIMS.c.deadline, CLAIMS.c.failed, stored)
        ):
            if is_stored:
                done += 1
            elif deadline is None:
                waiting += 1
            elif error is not None:  # past its deadline too: a mark, not a lease (a job that died, said: was)
                failed += 1
            elif deadline < now:
                stale += 1
                oldest = deadline if oldest is None else min(oldest, deadline)
            else:
                leased += 1
                holders.add(holder)
        return ClaimsSummary(leased, stale, waiting, failed, done, len(holders), oldest)

    def sweep(self, grace_seconds: float) -> int:
        """Delete claims of stored inputs, and leases and failure marks past their deadline by ``grace_seconds``
        (waiting claims too, once untouched that long); how many."""
        old = self.now() - timedelta(seconds=grace_seconds)
        result = self.conn.execute(
            delete(CLAIMS).where(
                or_(
                    self._stored(),
                    CLAIMS.c.deadline < old,
                    and_(CLAIMS.c.deadline.is_(None), CLAIMS.c.updated_at < old),
                )
            )
        )
        return max(result.rowcount, 0)
