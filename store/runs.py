"""The runs table of a descriptor database: what each call of the cache boundary asked, cost and saved.

Contract:

* A :class:`RunRecord` is one row of ``runs`` (:class:`store.tables.models.Run`):
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

import functools
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, Table, case, func, insert, select

from store.errors import RunValueError
from store.repository import MAX_ENGINE_SECONDS
from store.tables.models import Run
from store.tables.records import RUN_SUMMED, RunRecord, RunTotals, record_fields

if TYPE_CHECKING:
    from store.store import Database

RUNS: Table = Run.__table__  # type: ignore[assignment]


class RunNotRecordedWarning(UserWarning):
    """A call's answers are complete, but the store refused the row of its accounting (read-only, full)."""


_FIELDS = record_fields(RunRecord)


def record_run(database: Database, run: RunRecord) -> int:
    """Append ``run`` to the database's ``runs`` (one write transaction); returns its id. A count no 64-bit
    integer holds is a :class:`RunValueError`, before anything is written (SQLite raised a bare OverflowError)."""
    values = {name: getattr(run, name) for name in _FIELDS if name != "id"}
    wide = sorted(name for name, value in values.items() if type(value) is int and not -(2**63) <= value < 2**63)
    if wide:
        raise RunValueError(f"{', '.join(wide)} past what the runs table holds (64-bit integers)")
    with database.transaction() as repo:
        return int(repo.conn.execute(insert(RUNS).values(values).returning(RUNS.c.id)).scalar_one())


def recent_runs(database: Database, limit: int = 10) -> list[RunRecord]:
    """The ``limit`` most recently started runs, newest first."""
    stmt = select(*(RUNS.c[name] for name in _FIELDS)).order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
    rows = database.read(lambda repo: repo.conn.execute(stmt.limit(limit)).all())
    return [RunRecord(**dict(zip(_FIELDS, row, strict=True))) for row in rows]


@functools.cache
def _totals_statement() -> Select[Any]:
    # Built once: a listing of thousands of databases (stats, the browser's overview) runs it in each
    columns = [func.count(), *(func.coalesce(func.sum(_summed(RUNS.c[name])), 0) for name in RUN_SUMMED)]
    return select(*columns, func.min(RUNS.c.started_at), func.max(RUNS.c.finished_at))


def _summed(column: Any) -> Any:
    """A run's figure as its total adds it up: seconds none a run takes (one saved 1e308 s, summed to inf, which
    crashed stats) are left out, as :meth:`~store.repository.Repository.totals` leaves out a row's."""
    if "seconds" not in column.name:
        return column
    return case((func.abs(column) < MAX_ENGINE_SECONDS, column))


def run_totals(database: Database) -> RunTotals:
    """Every recorded run of the database, added up."""
    row = database.read(lambda repo: repo.conn.execute(_totals_statement()).one())
    count, *sums, first, last = row  # min/max keep the column's type: aware UTC datetimes
    typed: dict[str, Any] = {
        name: float(v) if "seconds" in name else int(v) for name, v in zip(RUN_SUMMED, sums, strict=True)
    }
    return RunTotals(runs=int(count), **typed, first_started_at=first, last_finished_at=last)


def hit_rate(hits: int, asked: int) -> str:
    """``hits`` of ``asked`` as the whole percentage a person reads: a half rounds up, and 100 % (0 %) only when
    every input (none) hit: 999 of 1,000 read "100%", 5 of 8 "62%" (was)."""
    value = math.floor(100 * hits / asked + 0.5)
    if hits < asked:
        value = min(value, 99)
    if hits > 0:
        value = max(value, 1)
    return f"{value}%"
