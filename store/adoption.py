"""Adopted rows: an older descriptor's rows copied into a database, each marked, the adoption recorded.

Contract:

* :func:`adopt_rows` copies every row of ``source`` into ``target`` but the
  ``exclude``\\ d keys (sampled rows an audit found different), with
  ``adopted_from`` set to the source descriptor's full SHA-256, and appends
  its :class:`AdoptionRecord` (with the counts) to the target's
  ``adoptions``: all in one write transaction of the target, so a failure
  leaves the target as it was. A key the target already holds keeps its row
  (never replaced), so adopting the same source twice copies nothing new.
  Adopted rows keep every other value (run id, creator, times, ``usage``):
  what they had cost counts as saved when they hit.
* :func:`plan_adoption` counts, read-only, what :func:`adopt_rows` would do
  (``target`` None: a database that does not exist yet).
* :func:`adoptions` reads a database's records back, newest first.
* Deciding whether to adopt (the audit, the thresholds, which fields may
  differ) is the inference layer's (:mod:`inference.drift.adopt`); this module
  only moves rows and keeps the record. Rows adopted earlier are selected
  with :class:`~store.tables.filters.RowFilter` (``adopted_from``, ``adopted``),
  like any other rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import Table, insert, select

from store.errors import InvalidInputError
from store.rows import batched
from store.tables.filters import RowFilter
from store.tables.models import Adoption
from store.tables.records import AdoptionRecord, record_fields

if TYPE_CHECKING:
    from store.store import Database

ADOPTIONS: Table = Adoption.__table__  # type: ignore[assignment]
COPY_BATCH = 1_000  # rows per insert statement (and per lookup when planning)


_FIELDS = record_fields(AdoptionRecord)


@dataclass(frozen=True, slots=True)
class AdoptionCounts:
    """What an adoption copies: ``adopted`` new rows; ``present`` keys the target holds; ``excluded`` left out."""

    source_rows: int
    adopted: int
    present: int
    excluded: int


def _check_pair(source: Database, target: Database | None) -> None:
    if target is not None and (source.location == target.location or source.role != target.role):
        raise InvalidInputError(
            f"cannot adopt {source.where} into {target.where}: a descriptor's rows are adopted into another "
            "descriptor of the same role"
        )


def plan_adoption(source: Database, target: Database | None, exclude: Sequence[str] = ()) -> AdoptionCounts:
    """What :func:`adopt_rows` would copy now (see the module docstring); writes nothing."""
    _check_pair(source, target)
    left_out = frozenset(exclude)
    rows = adopted = present = excluded = 0
    for batch in batched(source.query(), COPY_BATCH):
        rows += len(batch)
        keys = [r.input_hash for r in batch if r.input_hash not in left_out]
        excluded += len(batch) - len(keys)
        held = target.count(RowFilter(input_hashes=tuple(keys))) if target is not None and keys else 0
        present += held
        adopted += len(keys) - held
    return AdoptionCounts(rows, adopted, present, excluded)


def adopt_rows(
    source: Database, target: Database, adoption: AdoptionRecord, exclude: Sequence[str] = ()
) -> AdoptionRecord:
    """Copy ``source``'s rows into ``target``, marked, and record ``adoption`` with the counts (one transaction)."""
    _check_pair(source, target)
    left_out = frozenset(exclude)
    mark = adoption.source_descriptor
    rows = adopted = excluded = 0
    with target.transaction() as repo:
        for batch in batched(source.query(), COPY_BATCH):
            rows += len(batch)
            marked = [dataclasses.replace(r, adopted_from=mark) for r in batch if r.input_hash not in left_out]
            excluded += len(batch) - len(marked)
            adopted += repo.put_many(marked, "ignore")
        written = dataclasses.replace(
            adoption,
            source_rows=rows,
            rows_adopted=adopted,
            rows_present=rows - excluded - adopted,
            rows_excluded=excluded,
            run_id=target.settings.run_id,
            created_by=target.settings.created_by,
            adopted_at=datetime.now(UTC),
        )
        values = {name: getattr(written, name) for name in _FIELDS if name != "id"}
        new_id = repo.conn.execute(insert(ADOPTIONS).values(values).returning(ADOPTIONS.c.id)).scalar_one()
    return dataclasses.replace(written, id=int(new_id))


def adoptions(database: Database) -> list[AdoptionRecord]:
    """Every adoption into ``database``, newest first."""
    stmt = select(*(ADOPTIONS.c[name] for name in _FIELDS)).order_by(ADOPTIONS.c.id.desc())
    rows = database.read(lambda repo: repo.conn.execute(stmt).all())
    return [AdoptionRecord(**dict(zip(_FIELDS, row, strict=True))) for row in rows]
