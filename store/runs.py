"""The runs table of a descriptor database: what each call of the cache boundary asked, cost and saved.

Contract:

* A :class:`RunRecord` is one row of ``runs`` (:class:`store.models.Run`):
  the counts of one ``CachedModel.complete``/``judge`` call on this
  database, the tokens and engine seconds its misses cost, and the tokens
  and engine seconds its hits saved (what those rows had cost when they were
  generated).
* :func:`record_run` appends one in its own write transaction;
  :func:`recent_runs` and :func:`run_totals` read them back. They are the
  only statements over ``runs``; nothing here touches the rows.
* Records cross this boundary, never ORM objects; the statements are Core,
  the same on every backend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, func, insert, select

from store.models import Run

if TYPE_CHECKING:
    from store.store import Database

RUNS: Table = Run.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One row of ``runs``; ``id`` is given by the database."""

    role: str
    run_id: str | None
    created_by: str | None
    started_at: datetime
    finished_at: datetime
    mode: str
    requested: int
    distinct_inputs: int
    hits: int
    misses: int
    duplicates: int
    generated: int
    rows_written: int
    truncated: int
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float
    saved_prompt_tokens: int
    saved_completion_tokens: int
    saved_engine_seconds: float
    hits_without_cost: int
    wall_seconds: float
    id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord))
_SUMMED = ("requested", "hits", "misses", "generated", "rows_written", "truncated", "prompt_tokens",
           "completion_tokens", "engine_seconds", "saved_prompt_tokens", "saved_completion_tokens",
           "saved_engine_seconds", "hits_without_cost")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunTotals:
    """The runs of one database added up; times are None when no run was recorded."""

    runs: int
    requested: int
    hits: int
    misses: int
    generated: int
    rows_written: int
    truncated: int
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float
    saved_prompt_tokens: int
    saved_completion_tokens: int
    saved_engine_seconds: float
    hits_without_cost: int
    first_started_at: datetime | None
    last_finished_at: datetime | None

    @classmethod
    def none(cls) -> RunTotals:
        zeros: dict[str, Any] = {name: 0.0 if "seconds" in name else 0 for name in _SUMMED}
        return cls(runs=0, **zeros, first_started_at=None, last_finished_at=None)

    def __add__(self, other: RunTotals) -> RunTotals:
        firsts = [t for t in (self.first_started_at, other.first_started_at) if t is not None]
        lasts = [t for t in (self.last_finished_at, other.last_finished_at) if t is not None]
        sums: dict[str, Any] = {name: getattr(self, name) + getattr(other, name) for name in _SUMMED}
        return RunTotals(runs=self.runs + other.runs, **sums, first_started_at=min(firsts, default=None),
                         last_finished_at=max(lasts, default=None))  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def record_run(database: Database, run: RunRecord) -> int:
    """Append ``run`` to the database's ``runs`` (one write transaction); returns its id."""
    values = {name: getattr(run, name) for name in _FIELDS if name != "id"}
    with database.transaction() as repo:
        return int(repo.conn.execute(insert(RUNS).values(values).returning(RUNS.c.id)).scalar_one())


def recent_runs(database: Database, limit: int = 10) -> list[RunRecord]:
    """The ``limit`` most recently started runs, newest first."""
    stmt = select(*(RUNS.c[name] for name in _FIELDS)).order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
    with database.reading() as repo:
        rows = repo.conn.execute(stmt.limit(limit)).all()
    return [RunRecord(**dict(zip(_FIELDS, row, strict=True))) for row in rows]


def run_totals(database: Database) -> RunTotals:
    """Every recorded run of the database, added up."""
    columns = [func.count(), *(func.coalesce(func.sum(RUNS.c[name]), 0) for name in _SUMMED)]
    stmt = select(*columns, func.min(RUNS.c.started_at), func.max(RUNS.c.finished_at))
    with database.reading() as repo:
        row = repo.conn.execute(stmt).one()
    count, *sums, first, last = row  # min/max keep the column's type: aware UTC datetimes
    typed: dict[str, Any] = {
        name: float(v) if "seconds" in name else int(v) for name, v in zip(_SUMMED, sums, strict=True)
    }
    return RunTotals(runs=int(count), **typed, first_started_at=first, last_finished_at=last)
