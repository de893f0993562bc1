"""Rows across databases: a row with the database it came from, counts and totals of rows, batches of them.

Contract: :class:`FoundRow` and :class:`RowCount` are a row, or a count of
rows, with the location of the database it came from, as the store's
queries across databases return them (:meth:`FoundRow.as_dict`: location
first, then the record's fields, :func:`row_columns`). :class:`DeletePlan`
is what a delete counted and will delete. :class:`RowTotals`
and :class:`RowGroup` are rows added up in the database. :func:`batched`
reads records lazily in lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.layout import Location
from store.roles import ROLES, Role
from store.tables.filters import RowFilter
from store.tables.records import RECORD_OF_ROLE, Record, record_fields


@dataclass(frozen=True, slots=True)
class RowTotals:
    """Rows of one table added up: how many, their data bytes, and the token counts and engine time in ``usage``.

    ``data_bytes`` is what the row's values take (rendered input, completion,
    ``usage`` and ``top_logprobs`` as stored, on PostgreSQL escaped: see
    ``PostgresRepository._byte_length``), without the index and page
    overhead of the file. Only JSON numbers are added up (a token count given
    as a string, a non-finite ``engine_seconds`` or one of 1e300 or more,
    adds nothing), on either backend; ``rows_with_cost`` counts rows whose
    ``usage`` records ``engine_seconds`` as a number that is added up.
    """

    rows: int = 0
    data_bytes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0
    rows_with_cost: int = 0

    def __add__(self, other: RowTotals) -> RowTotals:
        # Field by field (dataclasses.astuple deep-copies: a total over thousands of databases felt it).
        return RowTotals(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class RowGroup:
    """The rows sharing one value of a column: how many, their data bytes, and when the newest was written."""

    key: Any
    rows: int
    data_bytes: int
    newest: datetime


LOCATION_COLUMNS = ("role", "task", "provider", "descriptor_model", "descriptor")


def row_columns(roles: Iterable[Role] = ROLES) -> tuple[str, ...]:
    """Column names of :meth:`FoundRow.as_dict` for rows of ``roles``: location first, then the record's fields."""
    chosen = set(roles)
    columns: list[str] = list(LOCATION_COLUMNS)
    for role in ROLES:
        if role in chosen:
            columns += [name for name in record_fields(RECORD_OF_ROLE[role]) if name not in columns]
    return tuple(columns)


@dataclass(frozen=True, slots=True)
class FoundRow:
    """A row and the database it came from."""

    location: Location
    record: Record

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = self.location.as_dict(model_key="descriptor_model")
        for name in record_fields(type(self.record)):
            values[name] = getattr(self.record, name)
        return values


@dataclass(frozen=True, slots=True)
class RowCount:
    """How many rows of one database a filter matched (or deleted)."""

    location: Location
    where: str  # the database, as messages name it (a file, or a server's schema)
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {**self.location.as_dict(), "path": self.where, "rows": self.rows}


@dataclass(frozen=True)
class DeletePlan:
    """What a delete counted and will delete: its row filters and the rows they matched per database.

    :meth:`Store.plan_delete <store.store.Store.plan_delete>` makes one (a
    single filter), :func:`store.prune.plan_prune` one per run; they bound every
    filter by the time the plan was made (``created_before``), so
    :meth:`Store.delete_rows <store.store.Store.delete_rows>` deletes the rows
    counted and never a row written since (a plan built by hand gets what its
    filters say). It deletes from the databases of ``counts`` only.
    """

    filters: tuple[RowFilter, ...]
    counts: tuple[RowCount, ...]
    # Rows the filters match that the plan's time bound leaves out: dated after it (written meanwhile, or by a
    # machine whose clock is ahead of this one's), or with a time no clock gives (another tool wrote it)
    later: int = 0

    @property
    def rows(self) -> int:
        return sum(entry.rows for entry in self.counts)


def batched(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    """``records`` in lists of ``size`` (the last one shorter), read lazily: one list is held at a time."""
    batch: list[Record] = []
    for record in records:
        batch.append(record)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
