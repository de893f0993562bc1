"""Pruning a store: rows older than a duration, of old runs, or the oldest beyond a size, planned before deleted.

Contract:

* A :class:`PruneRule` selects rows by the AND of what it sets: a
  :class:`~store.tables.filters.RowFilter` (``--run-id``, ``--benchmark``, ...),
  ``older_than`` (``created_at`` before now minus it), ``keep_last_runs``
  (rows of every run but the N whose newest rows are newest; rows without a
  run id belong to no run and are kept) and ``max_bytes`` (the oldest rows,
  whole write chunks at a time, until the data of the selected databases
  (:attr:`~store.rows.RowTotals.data_bytes`, what ``judgestore stats``
  shows) fits). A rule that sets nothing is refused: nothing is pruned that
  a filter did not select.
* :func:`plan_prune` reads only: it turns the rule into row filters
  (:attr:`PrunePlan.filters`, disjoint) and counts their rows per database.
  :func:`prune` deletes exactly those filters' rows, one write transaction
  per database, so a dry run's counts are what a prune deletes. Every filter
  is bounded by the plan's time (``created_before``): a row written after the
  plan was made (a run still at work while the prune asks to confirm) is
  never deleted by it; the plan counts the rows that bound alone leaves out
  (:attr:`PrunePlan.later`: dated after the plan by a clock ahead of this
  one's, or with a time another tool wrote).
* Files keep their size until ``judgestore vacuum`` (:mod:`store.backends.sqlite.vacuum`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from store.errors import InvalidInputError
from store.layout import Location, Selector
from store.rows import DeletePlan, RowCount, RowTotals
from store.store import Database, Store
from store.tables.filters import RowFilter

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?))?(b?)\s*$", re.IGNORECASE)
_SIZE_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}
_TICK = timedelta(microseconds=1)  # created_at is stored to the microsecond


def parse_duration(text: str) -> timedelta:
    """``90s``, ``45m``, ``12h``, ``30d``, ``2w`` (a number and one unit, either case; ``M``, months to some, is
    refused), counted back from now: one reaching before the year 1 is refused."""
    match = _DURATION.match(text)
    if match and match.group(2) == "M":  # months to many (ISO 8601's P6M, pandas' 6M): 6M was 6 minutes
        raise InvalidInputError(
            f"{text!r} is ambiguous: M is months to some and minutes to others; give minutes as m (90m) or months in "
            "days (180d)"
        )
    if not match:
        raise InvalidInputError(f"{text!r} is not a duration: give a number and a unit, e.g. 30d, 12h, 2w, 90m, 45s")
    since_year_one = datetime.now(UTC) - datetime.min.replace(tzinfo=UTC)  # a duration is counted back from now
    try:
        duration = timedelta(**{_DURATION_UNITS[match.group(2).lower()]: float(match.group(1))})
    except OverflowError:
        duration = timedelta.max
    if duration > since_year_one:  # said here, in the option's words (PruneRule named its field, was)
        raise InvalidInputError(f"{text!r} reaches before the year 1: give at most {since_year_one.days:,} days")
    return duration


def parse_size(text: str) -> int:
    """Bytes of ``500MB``, ``1.5GiB``, ``200k``, ``1000B`` (decimal units; ``i`` for powers of 1024).

    A number without a unit is refused, as a duration without one is: ``--max-size 20`` meant 20 bytes, and
    pruned the whole store for a user who meant 20GB.
    """
    match = _SIZE.match(text)
    if match and match.group(2) is None and not match.group(4):
        raise InvalidInputError(
            f"{text.strip()!r} has no unit: give bytes as {match.group(1)}B, or a unit, e.g. {match.group(1)}GB, "
            f"{match.group(1)}MB"
        )
    if not match:
        raise InvalidInputError(f"{text!r} is not a size: give a number and a unit, e.g. 500MB, 2GB, 1.5GiB")
    number, prefix, binary, _ = match.groups()
    power = 0 if prefix is None else _SIZE_POWERS[prefix.lower()]
    size = float(number) * (1024 if binary else 1000) ** power
    if size == float("inf"):  # a number of hundreds of digits: a float holds it only as infinity
        raise InvalidInputError(f"{text[:40]!r}... is not a size a disk holds: give e.g. 500MB, 2GB, 1.5GiB")
    return int(size)


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneRule:
    """What to prune (see the module docstring); every criterion that is set must hold."""

    flt: RowFilter = field(default_factory=RowFilter)
    older_than: timedelta | None = None
    keep_last_runs: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.older_than is not None and self.older_than < timedelta(0):
            raise InvalidInputError(f"older_than must not be negative, got {self.older_than}")
        if self.older_than is not None and self.older_than > datetime.now(UTC) - datetime.min.replace(tzinfo=UTC):
            raise InvalidInputError(f"older_than reaches before the year 1, got {self.older_than.days:,} days")
        if self.keep_last_runs is not None and self.keep_last_runs < 0:
            raise InvalidInputError(f"keep_last_runs must be >= 0, got {self.keep_last_runs}")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise InvalidInputError(f"max_bytes must be >= 0, got {self.max_bytes}")

    def is_empty(self) -> bool:
        return (
            self.flt.is_empty() and self.older_than is None and self.keep_last_runs is None and self.max_bytes is None
        )


@dataclass(frozen=True)
class PrunePlan:
    """What :func:`prune` will delete: disjoint row filters and their rows per database.

    ``kept_runs``/``pruned_runs`` are set by ``keep_last_runs`` (newest
    first); ``size_cutoff`` is the ``created_at`` before which ``max_bytes``
    prunes (None: the data already fits, or no cap); ``data_bytes`` is the
    selected databases' data, ``freed_bytes`` the data of the rows to delete;
    ``later`` the rows the rule would prune but for the plan's time bound
    (as :attr:`~store.rows.DeletePlan.later`).
    """

    rule: PruneRule
    now: datetime
    filters: tuple[RowFilter, ...]
    counts: tuple[RowCount, ...]
    kept_runs: tuple[str, ...] = ()
    pruned_runs: tuple[str, ...] = ()
    size_cutoff: datetime | None = None
    data_bytes: int = 0
    freed_bytes: int = 0
    later: int = 0

    @property
    def rows(self) -> int:
        return sum(entry.rows for entry in self.counts)

    def as_dict(self) -> dict[str, Any]:
        rule = self.rule
        return {
            "rule": {
                "filter": rule.flt.as_dict(),
                "older_than_seconds": None if rule.older_than is None else rule.older_than.total_seconds(),
                "keep_last_runs": rule.keep_last_runs,
                "max_bytes": rule.max_bytes,
            },
            "now": self.now,
            "rows": self.rows,
            "kept_runs": list(self.kept_runs),
            "pruned_runs": list(self.pruned_runs),
            "size_cutoff": self.size_cutoff,
            "data_bytes": self.data_bytes,
            "freed_bytes": self.freed_bytes,
            "later": self.later,
            "databases": [entry.as_dict() for entry in self.counts],
        }


def _ranked_runs(databases: list[Database], flt: RowFilter) -> list[str]:
    """Run ids of the matching rows, the run with the newest row first."""
    newest: dict[str, datetime] = {}
    for database in databases:
        with database.reading() as repo:
            for group in repo.groups("run_id", flt):
                if group.key is not None and (group.key not in newest or group.newest > newest[group.key]):
                    newest[group.key] = group.newest
    return sorted(newest, key=lambda run: (newest[run], run), reverse=True)


def _size_cutoff(
    databases: list[Database], filters: tuple[RowFilter, ...], excess: int
) -> tuple[datetime | None, bool]:
    """The ``created_at`` before which the oldest matching rows free ``excess`` bytes (all of them if they cannot),
    and whether they do."""
    chunks: dict[datetime, int] = {}
    for database in databases:
        with database.reading() as repo:
            for flt in filters:
                for group in repo.groups("created_at", flt):
                    chunks[group.key] = chunks.get(group.key, 0) + group.data_bytes
    freed, cutoff = 0, None
    for created_at in sorted(chunks):
        freed += chunks[created_at]
        cutoff = created_at + _TICK
        if freed >= excess:
            return cutoff, True
    return cutoff, False


def plan_prune(store: Store, selector: Selector, rule: PruneRule, *, now: datetime | None = None) -> PrunePlan:
    """Count what ``rule`` prunes in the databases ``selector`` picks; reads only (see the module docstring)."""
    if rule.is_empty():
        raise InvalidInputError(
            "prune needs at least one of --older-than, --keep-last-runs, --max-size or a row filter "
            "(nothing is pruned that a filter did not select)"
        )
    now = now or datetime.now(UTC)
    databases = list(store.databases(selector, rule.flt))
    # Only rows written before the plan: the ones it counts (a run writing meanwhile keeps what it writes).
    base = dataclasses.replace(rule.flt, created_before=min(now, rule.flt.created_before or now))
    if rule.older_than is not None:
        before = now - rule.older_than
        base = dataclasses.replace(base, created_before=min(before, base.created_before or before))
    filters: tuple[RowFilter, ...] = (base,)
    kept: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    if rule.keep_last_runs is not None:
        ranked = _ranked_runs(databases, rule.flt)
        kept, older = tuple(ranked[: rule.keep_last_runs]), ranked[rule.keep_last_runs :]
        filters = tuple(dataclasses.replace(base, run_id=run) for run in older)
        pruned = tuple(older)
    data = RowTotals()  # of the selected databases, whatever rows the filter picks: what the cap is on
    for database in databases if rule.flt.is_empty() else store.databases(selector):
        with database.reading() as repo:
            data += repo.totals()
    cutoff = None
    if rule.max_bytes is not None:
        if data.data_bytes <= rule.max_bytes or not filters:
            filters = ()
        else:
            cutoff, enough = _size_cutoff(databases, filters, data.data_bytes - rule.max_bytes)
            if cutoff is None:
                filters = ()
            elif enough:  # else every row the filters match goes, and they keep their bounds (counted below)
                filters = tuple(
                    dataclasses.replace(f, created_before=min(cutoff, f.created_before or cutoff)) for f in filters
                )
    counts: dict[str, tuple[Location, int]] = {}
    freed = later = 0
    losing: set[str | None] = set()  # the runs that lose rows once every criterion is applied
    for database in databases:
        with database.reading() as repo:
            for flt in filters:
                totals = repo.totals(flt)
                if totals.rows:
                    location, rows = counts.get(database.where, (database.location, 0))
                    counts[database.where] = (location, rows + totals.rows)
                    freed += totals.data_bytes
                    losing.add(flt.run_id)
                if flt.created_before == now:  # bounded by the plan's time alone: count what that leaves out
                    later += repo.count_around(dataclasses.replace(flt, created_before=rule.flt.created_before), now)[1]
    pruned = tuple(run for run in pruned if run in losing)  # a run older than kept but spared by the others: not named
    return PrunePlan(
        rule,
        now,
        filters,
        tuple(RowCount(location, where, rows) for where, (location, rows) in counts.items()),
        kept,
        pruned,
        cutoff,
        data.data_bytes,
        freed,
        later,
    )


def prune(store: Store, plan: PrunePlan) -> list[RowCount]:
    """Delete the rows of ``plan``'s filters in its databases, one write transaction per database; returns the
    rows deleted per database (an error or Ctrl-C midway carries what was deleted before it:
    :meth:`Store.delete_rows`)."""
    return store.delete_rows(DeletePlan(plan.filters, plan.counts)) if plan.filters else []
