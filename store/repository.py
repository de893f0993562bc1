"""Statements over one descriptor database's table, on a connection the caller holds.

Contract:

* A :class:`Repository` executes statements and never commits: the caller
  opens the transaction (``with database.transaction() as repo:``).
* :meth:`~Repository.get_many` takes any number of hashes and returns the rows
  found (missing keys are simply absent) in batches of one statement each.
* :meth:`~Repository.put_many` inserts in one executemany; ``"ignore"`` keeps
  the row already stored, ``"replace"`` overwrites it.
* :meth:`~Repository.query` streams: rows are fetched in partitions, never all
  at once. :meth:`~Repository.delete` refuses an empty filter.
* The two dialect-specific hot statements (insert ignoring duplicates and the
  bulk key lookup) live here and nowhere else. SQLite looks keys up with
  ``json_each`` (one parameter, one plan, no variable limit); other backends
  use chunked ``IN`` lists.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Literal

import orjson
from sqlalchemy import Column, ColumnElement, Connection, String, Table, bindparam, delete, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from store.errors import EmptyFilterError, InvalidInputError
from store.layout import Role
from store.models import MODEL_OF_ROLE
from store.records import RECORD_OF_ROLE, Record, RowFilter, record_fields

OnConflict = Literal["ignore", "replace"]
LOOKUP_BATCH = 20_000  # keys per statement: bounds the JSON parameter, far below planner trouble
IN_LIST_BATCH = 5_000  # other dialects: well under every parameter limit
STREAM_PARTITION = 1_000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small objects (it rescans them all otherwise)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Repository:
    """The rows of one role's table in one descriptor database."""

    def __init__(self, conn: Connection, role: Role) -> None:
        self.conn = conn
        self.role = role
        self.table: Table = MODEL_OF_ROLE[role].__table__  # type: ignore[assignment]
        self.record_type = RECORD_OF_ROLE[role]
        self._fields = record_fields(self.record_type)
        self._columns = [self.table.c[name] for name in self._fields]
        self._values_of = attrgetter(*self._fields)

    # ------------------------------------------------------------ reads

    def _records(self, rows: Sequence[Any]) -> list[Record]:
        make, names = self.record_type, self._fields
        with gc_paused():
            return [make(**dict(zip(names, row, strict=True))) for row in rows]

    def get_many(self, hashes: Iterable[str]) -> dict[str, Record]:
        """Rows stored under any of ``hashes``, keyed by input hash."""
        keys = list(dict.fromkeys(hashes))
        found: dict[str, Record] = {}
        sqlite_dialect = self.conn.dialect.name == "sqlite"
        batch = LOOKUP_BATCH if sqlite_dialect else IN_LIST_BATCH
        for start in range(0, len(keys), batch):
            chunk = keys[start : start + batch]
            key_column = self.table.c.input_hash
            if sqlite_dialect:
                values = func.json_each(bindparam("keys", type_=String)).table_valued("value")
                stmt = select(*self._columns).where(key_column.in_(select(values.c.value)))
                rows = self.conn.execute(stmt, {"keys": orjson.dumps(chunk).decode()}).all()
            else:
                stmt = select(*self._columns).where(key_column.in_(bindparam("keys", expanding=True)))
                rows = self.conn.execute(stmt, {"keys": chunk}).all()
            for record in self._records(rows):
                found[record.input_hash] = record
        return found

    def query(self, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        """Rows matching ``flt`` ordered by creation time, streamed in partitions."""
        stmt = select(*self._columns).where(*self._where(flt or RowFilter()))
        stmt = stmt.order_by(self.table.c.created_at, self.table.c.input_hash)
        if limit is not None:
            stmt = stmt.limit(limit)
        result = self.conn.execution_options(yield_per=STREAM_PARTITION).execute(stmt)
        for partition in result.partitions():
            yield from self._records(partition)

    def count(self, flt: RowFilter | None = None) -> int:
        stmt = select(func.count()).select_from(self.table).where(*self._where(flt or RowFilter()))
        return int(self.conn.execute(stmt).scalar_one())

    # ------------------------------------------------------------ writes

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        """Insert ``records``; returns how many rows were written (ignored duplicates not counted)."""
        if on_conflict not in ("ignore", "replace"):
            raise InvalidInputError(f"on_conflict must be 'ignore' or 'replace', got {on_conflict!r}")
        rows = []
        for record in records:
            if type(record) is not self.record_type:
                raise InvalidInputError(
                    f"{self.role} rows must be {self.record_type.__name__}, got {type(record).__name__}"
                )
            rows.append(dict(zip(self._fields, self._values_of(record), strict=True)))
        if not rows:
            return 0
        result = self.conn.execute(self._insert(on_conflict), rows)
        return max(result.rowcount, 0)

    def _insert(self, on_conflict: OnConflict) -> Any:
        dialect = sqlite if self.conn.dialect.name == "sqlite" else postgresql
        stmt = dialect.insert(self.table)
        if on_conflict == "ignore":
            return stmt.on_conflict_do_nothing(index_elements=["input_hash"])
        updated = {name: stmt.excluded[name] for name in self._fields if name != "input_hash"}
        return stmt.on_conflict_do_update(index_elements=["input_hash"], set_=updated)

    def delete(self, flt: RowFilter) -> int:
        """Delete the rows matching ``flt``; an empty filter raises :class:`EmptyFilterError`."""
        if flt.is_empty():
            raise EmptyFilterError()
        result = self.conn.execute(delete(self.table).where(*self._where(flt)))
        return max(result.rowcount, 0)

    # ------------------------------------------------------------ filters

    def _column(self, name: str) -> Column[Any]:
        if name not in self.table.c:
            raise InvalidInputError(f"{self.role} have no {name} column; this filter applies to the other role")
        return self.table.c[name]

    def _where(self, flt: RowFilter) -> list[ColumnElement[bool]]:
        clauses: list[ColumnElement[bool]] = []
        for name in ("benchmark", "instruction_id", "model_a", "model_b", "judge", "orientation", "run_id",
                     "created_by"):  # fmt: skip
            value = getattr(flt, name)
            if value is not None:
                clauses.append(self._column(name) == value)
        if flt.model is not None:
            if self.role == "completions":
                clauses.append(self.table.c.model == flt.model)
            else:
                clauses.append(or_(self.table.c.model_a == flt.model, self.table.c.model_b == flt.model))
        if flt.pointwise is not None:
            model_b = self._column("model_b")
            clauses.append(model_b.is_(None) if flt.pointwise else model_b.is_not(None))
        if flt.created_after is not None:
            clauses.append(self.table.c.created_at >= flt.created_after)
        if flt.created_before is not None:
            clauses.append(self.table.c.created_at < flt.created_before)
        if flt.input_hashes is not None:
            clauses.append(self.table.c.input_hash.in_(flt.input_hashes))
        return clauses
