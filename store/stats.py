"""What a store holds and what it saved, per descriptor database: rows, size, tokens, finish reasons, runs.

Contract:

* :func:`database_stats` reads one database (one read transaction for its
  rows, one for its runs): the rows added up (:class:`~store.rows.RowTotals`:
  data bytes, tokens in and out, engine seconds recorded), rows per finish
  reason, the recorded runs added up (:class:`~store.runs.RunTotals`: hits,
  tokens and engine seconds saved) and the most recent runs, how many
  rows were adopted from older descriptors and the record of each adoption
  (``judgestore adopt``: from where, across what, on what evidence), and
  the shared batches' work in progress (:func:`store.claims.claims_summary`).
* :func:`store_stats` does that for the databases a
  :class:`~store.layout.Selector` picked (``Store.select``), read-only. A
  database that cannot be opened (behind, foreign, damaged...) is reported
  with its error and never stops the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from store.adoption import adoptions
from store.catalog import UNREADABLE, readable
from store.claim_table import ClaimsSummary
from store.claims import claims_summary
from store.errors import JudgestoreError
from store.layout import Location
from store.repository import Repository
from store.rows import RowTotals
from store.runs import recent_runs, run_totals
from store.store import Database, Store
from store.tables.filters import RowFilter
from store.tables.records import AdoptionRecord, RunRecord, RunTotals

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DatabaseStats:
    """One database as :func:`database_stats` found it (``error``: why it could not be read)."""

    location: Location
    where: str  # the database, as messages name it
    size_bytes: int
    rows: RowTotals = field(default_factory=RowTotals)
    finish_reasons: dict[str | None, int] = field(default_factory=dict)
    runs: RunTotals = field(default_factory=RunTotals)
    recent_runs: tuple[RunRecord, ...] = ()
    error: str | None = None
    adopted_rows: int = 0  # rows copied from older descriptors (their adopted_from is set)
    adoptions: tuple[AdoptionRecord, ...] = ()  # newest first
    claims: ClaimsSummary = field(default_factory=ClaimsSummary)  # shared batches' work in progress

    @property
    def truncated(self) -> int:
        """Rows that stopped at ``max_tokens`` (finish reason ``length``)."""
        return self.finish_reasons.get("length", 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.location.as_dict(),
            "path": self.where,
            "size_bytes": self.size_bytes,
            "rows": self.rows.as_dict(),
            "finish_reasons": {str(k) if k is not None else "null": n for k, n in self.finish_reasons.items()},
            "runs": dataclasses.asdict(self.runs),
            "recent_runs": [dataclasses.asdict(run) for run in self.recent_runs],
            "error": self.error,
            "adopted_rows": self.adopted_rows,
            "adoptions": [dataclasses.asdict(adoption) for adoption in self.adoptions],
            "claims": self.claims.as_dict(),
        }


def database_stats(database: Database, *, recent: int = 5) -> DatabaseStats:
    """The statistics of one open database; ``recent`` most recent runs are listed."""

    def figures(repo: Repository) -> tuple[RowTotals, dict[str | None, int], int]:  # one snapshot: they add up
        reasons = {group.key: group.rows for group in repo.groups("finish_reason")}
        return repo.totals(), reasons, repo.count(RowFilter(adopted=True))

    totals, reasons, adopted = database.read(figures)
    return DatabaseStats(
        database.location,
        database.where,
        database.size_bytes(),
        totals,
        reasons,
        run_totals(database),
        tuple(recent_runs(database, recent)) if recent else (),
        adopted_rows=adopted,
        adoptions=tuple(adoptions(database)),
        claims=claims_summary(database),
    )


def store_stats(
    store: Store, locations: Iterable[Location] | None = None, *, recent: int = 5
) -> Iterator[DatabaseStats]:
    """:func:`database_stats` of each of ``locations`` (a :meth:`~store.store.Store.select`; every database when
    None), in their order (see the module docstring).

    A database unchanged since its statistics were last read gives them back from the store's catalog
    (:meth:`~store.backend.Storage.remembered`): a store of thousands of databases costs what listing it does.
    Statistics whose claims hold live leases or failure marks are read each time (they turn stale with no
    write).
    """

    def compute(location: Location) -> dict[str, Any]:
        try:
            return _stats_json(database_stats(store.open(location), recent=recent))
        except JudgestoreError as e:
            return {UNREADABLE: str(e)}  # never kept (see _lasting): read again next time

    chosen = store.select() if locations is None else locations
    for location, data in store.storage.remembered(chosen, f"stats {recent} claims", compute, lasting=_lasting):
        if UNREADABLE in data:
            (info,) = store.infos([location], count_rows=False)
            yield DatabaseStats(location, info.where, info.size_bytes, error=data[UNREADABLE])
            continue
        yield _stats_of(location, data)


def _lasting(data: dict[str, Any]) -> bool:
    return readable(data) and ClaimsSummary.lasting(data["claims"])


_DATETIME = "$judgestore-datetime"  # how a datetime is kept in a catalog's JSON


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_DATETIME: value.isoformat()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        if value.keys() == {_DATETIME}:
            return datetime.fromisoformat(value[_DATETIME])
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def catalog_fields(instance: Any) -> dict[str, Any]:
    """A dataclass's fields as a catalog keeps them (JSON: times tagged), for :func:`from_catalog_fields`."""
    return {f.name: _plain(getattr(instance, f.name)) for f in dataclasses.fields(instance)}


def from_catalog_fields(cls: type[T], fields: dict[str, Any]) -> T:
    """The ``cls`` instance :func:`catalog_fields` gave ``fields`` of."""
    # most values are numbers: only dicts and lists are unplained
    return cls(**{name: _unplain(v) if type(v) in (dict, list) else v for name, v in fields.items()})


def _stats_json(stats: DatabaseStats) -> dict[str, Any]:
    """What :func:`_stats_of` reads back (the location aside: the caller knows it)."""
    return {
        "where": stats.where,
        "size_bytes": stats.size_bytes,
        "rows": catalog_fields(stats.rows),
        "finish_reasons": [[reason, n] for reason, n in stats.finish_reasons.items()],
        "runs": catalog_fields(stats.runs),
        "recent_runs": [catalog_fields(run) for run in stats.recent_runs],
        "adopted_rows": stats.adopted_rows,
        "adoptions": [catalog_fields(adoption) for adoption in stats.adoptions],
        "claims": catalog_fields(stats.claims),
    }


def _stats_of(location: Location, data: dict[str, Any]) -> DatabaseStats:
    return DatabaseStats(
        location,
        data["where"],
        data["size_bytes"],
        from_catalog_fields(RowTotals, data["rows"]),
        {reason: n for reason, n in data["finish_reasons"]},
        from_catalog_fields(RunTotals, data["runs"]),
        tuple(from_catalog_fields(RunRecord, run) for run in data["recent_runs"]),
        adopted_rows=data["adopted_rows"],
        adoptions=tuple(from_catalog_fields(AdoptionRecord, adoption) for adoption in data["adoptions"]),
        claims=from_catalog_fields(ClaimsSummary, data["claims"]),
    )


@dataclass(frozen=True, slots=True)
class StoreTotals:
    """Every database of a :func:`store_stats` listing added up."""

    databases: int
    size_bytes: int
    rows: RowTotals
    runs: RunTotals
    truncated: int
    unreadable: int
    adopted_rows: int = 0

    @classmethod
    def of(cls, stats: list[DatabaseStats]) -> StoreTotals:
        rows, runs = RowTotals(), RunTotals()
        for entry in stats:
            rows, runs = rows + entry.rows, runs + entry.runs
        return cls(
            len(stats),
            sum(s.size_bytes for s in stats),
            rows,
            runs,
            sum(s.truncated for s in stats),
            sum(s.error is not None for s in stats),
            sum(s.adopted_rows for s in stats),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "databases": self.databases,
            "size_bytes": self.size_bytes,
            "rows": self.rows.as_dict(),
            "runs": dataclasses.asdict(self.runs),
            "truncated": self.truncated,
            "unreadable": self.unreadable,
            "adopted_rows": self.adopted_rows,
        }
