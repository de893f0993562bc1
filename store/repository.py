"""Statements over one descriptor database's table, on a connection the caller holds.

Contract:

* A :class:`Repository` executes statements and never commits: the caller
  opens the transaction (``with database.transaction() as repo:``).
* :meth:`~Repository.get_many` takes any number of hashes and returns the rows
  found (missing keys are simply absent) in batches of one statement each.
* :meth:`~Repository.put_many` inserts in one executemany; ``"ignore"`` keeps
  the row already stored, ``"replace"`` overwrites it. It first checks that
  every row is stored under the hash of its input (``input_hash`` is
  :func:`~store.descriptor.input_hash` of ``input_text`` and
  ``sample_index``): a row under another key would be a stale hit until
  ``judgestore verify`` found it. The check hashes each ``input_text`` once,
  about 11 us for an 8 KB row (18% of a 10,000-row put_many); ``verify``
  remains the net for files written by other tools. Text that is not valid
  Unicode (a lone surrogate) is an :class:`~store.errors.InvalidInputError`
  naming the row and column, like a surrogate in a prompt.
* :meth:`~Repository.query` streams: rows are fetched in partitions, never all
  at once. :meth:`~Repository.delete` refuses an empty filter.
* Aggregates (:meth:`~Repository.totals`, :meth:`~Repository.groups`) add
  rows up in the database, and :meth:`~Repository.sample` picks rows at
  random through the primary key; none of them builds a row it does not return.
* The two dialect-specific hot statements (insert ignoring duplicates and the
  bulk key lookup) live here and nowhere else, each in a SQLite and a
  PostgreSQL form. SQLite looks keys up with ``json_each`` (one parameter,
  one plan, no variable limit) and inserts through a compiled ``INSERT OR
  IGNORE`` executemany; PostgreSQL looks keys up with ``= ANY(:keys)`` (one
  array parameter; faster than a join against ``unnest``) and inserts with a
  compiled ``INSERT ... ON CONFLICT DO NOTHING`` in psycopg's executemany
  (pipeline mode; as fast as ``COPY`` into a temporary table, see
  ``bench/pg_bench.py``). :func:`json_each_keys` and :data:`LOOKUP_BATCH`
  are that key list and its batch size, for the other SQLite files that look
  keys up in bulk (the sync bookkeeping).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Literal

import orjson
from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    LargeBinary,
    Select,
    String,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, StatementError
from sqlalchemy.sql.selectable import TableValuedAlias

from store.descriptor import input_hash
from store.errors import EmptyFilterError, InvalidInputError
from store.layout import Role
from store.models import MODEL_OF_ROLE
from store.records import ERROR_FINISH_REASONS, RECORD_OF_ROLE, Record, RowFilter, RowGroup, RowTotals, record_fields

OnConflict = Literal["ignore", "replace"]
GroupBy = Literal["finish_reason", "run_id", "created_at", "benchmark"]
DATA_COLUMNS = ("input_text", "completion", "usage", "top_logprobs")  # what RowTotals.data_bytes measures
LOOKUP_BATCH = 20_000  # keys per statement: bounds the JSON parameter, far below planner trouble
ARRAY_BATCH = 20_000  # PostgreSQL: keys per `= ANY(:keys)` array parameter
STREAM_PARTITION = 1_000
ROW_OVERHEAD_BYTES = 512  # a row's columns besides its two texts, its index entries and page slack, roughly
# (role, on_conflict, dialect, paramstyle, schema) -> (SQL, parameter names in order, their getter, positional):
# compiled once per process and table
_DRIVER_INSERTS: dict[tuple[str, str, str, str, str | None], tuple[str, tuple[str, ...], attrgetter[Any], bool]] = {}


def journaled_bytes(records: Sequence[Record]) -> int:
    """About the disk space writing ``records`` needs: their text twice over (pages, and SQLite's journal of them)."""
    return 2 * sum(len(r.input_text) + len(r.completion) + ROW_OVERHEAD_BYTES for r in records)


def _unencodable(text: str) -> str | None:
    """The first characters of ``text`` that UTF-8 cannot encode (lone surrogates), or None."""
    try:
        text.encode()
    except UnicodeEncodeError as e:
        return text[e.start : e.end]
    return None


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


@functools.cache
def _shape(role: Role) -> tuple[Table, type[Record], tuple[str, ...], tuple[Column[Any], ...], attrgetter[Any]]:
    """A role's table, record type, field names, columns in field order and field getter (built once)."""
    table: Table = MODEL_OF_ROLE[role].__table__  # type: ignore[assignment]
    record_type = RECORD_OF_ROLE[role]
    fields = record_fields(record_type)
    return table, record_type, fields, tuple(table.c[name] for name in fields), attrgetter(*fields)


def json_each_keys() -> TableValuedAlias:
    """SQLite's bulk key list: ``json_each`` over one JSON-array parameter ``keys`` (columns ``value``, ``key``).

    Bind it a JSON array of at most :data:`LOOKUP_BATCH` keys; ``key`` is each value's position in it.
    """
    return func.json_each(bindparam("keys", type_=String)).table_valued("value", "key")


@functools.cache
def _lookup_statement(role: Role, sqlite_dialect: bool) -> Select[Any]:
    """The bulk key lookup, built once per role: its cache key is memoized, not recomputed per call.

    SQLite reads the keys from one JSON parameter (``json_each``); PostgreSQL
    from one array parameter (``= ANY(:keys)``). Either way one statement and
    one plan, whatever the number of keys.
    """
    table, _, _, columns, _ = _shape(role)
    if sqlite_dialect:
        values = json_each_keys()
        return select(*columns).where(table.c.input_hash.in_(select(values.c.value)))
    return select(*columns).where(table.c.input_hash == any_(bindparam("keys", type_=postgresql.ARRAY(String))))


class Repository:
    """The rows of one role's table in one descriptor database."""

    def __init__(self, conn: Connection, role: Role) -> None:
        self.conn = conn
        self.role = role
        self.table, self.record_type, self._fields, self._columns, self._values_of = _shape(role)

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
        batch = LOOKUP_BATCH if sqlite_dialect else ARRAY_BATCH
        stmt = _lookup_statement(self.role, sqlite_dialect)
        # The GC stays paused while rows are fetched too: the JSON columns are decoded into many
        # small dicts as the rows are built, and every collection would rescan all of them.
        with gc_paused():
            for start in range(0, len(keys), batch):
                chunk = keys[start : start + batch]
                param = orjson.dumps(chunk).decode() if sqlite_dialect else chunk
                for record in self._records(self.conn.execute(stmt, {"keys": param}).all()):
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
        """Insert ``records``; returns how many rows were written (ignored duplicates not counted).

        A malformed row raises :class:`InvalidInputError` naming it, and the transaction must
        not commit (the database's own transactions roll back): a record of the other table,
        an ``input_hash`` that is not the hash of the row's input (:func:`store.descriptor.input_hash`),
        text that is not valid Unicode (a lone surrogate, in any column), a value a column refuses.
        """
        if on_conflict not in ("ignore", "replace"):
            raise InvalidInputError(f"on_conflict must be 'ignore' or 'replace', got {on_conflict!r}")
        rows: list[Any] = []
        names: tuple[str, ...] = self._fields
        try:
            sql, names, rows = self._driver_rows(records, on_conflict)
            if not rows:
                return 0
            # The driver's executemany: sqlite3's loop; psycopg's pipeline mode, whose rowcount is the sum.
            result = self.conn.exec_driver_sql(sql, rows)
        except UnicodeEncodeError as e:  # the driver encodes text as it binds it: found before any commit
            raise self._not_unicode(names, rows) from e
        except IntegrityError as e:  # a CHECK or NOT NULL constraint: a malformed row, not a broken file
            raise InvalidInputError(f"{self.role} rows rejected by the database: {e.orig}") from e
        except StatementError as e:
            if isinstance(e, DBAPIError):  # locked, damaged...: the caller's retry and translation handle these
                raise
            raise InvalidInputError(f"{self.role} row cannot be written: {e.orig}") from e  # e.g. a naive created_at
        return max(result.rowcount, 0)

    def _not_unicode(self, names: tuple[str, ...], rows: Sequence[Any]) -> InvalidInputError:
        """The error naming the first row (and column) holding text that is not valid Unicode."""
        for row in rows:
            values = row if isinstance(row, dict) else dict(zip(names, row, strict=True))
            for name, value in values.items():
                if isinstance(value, str) and (bad := _unencodable(value)) is not None:
                    return InvalidInputError(
                        f"{self.role} row {values.get('input_hash')!r}: {name} is not valid Unicode text (it holds "
                        f"the lone surrogate {bad!r}, which has no UTF-8 bytes); nothing of the batch was written"
                    )
        return InvalidInputError(f"{self.role} rows hold text that is not valid Unicode")

    def _checked(self, records: Iterable[Record]) -> Iterator[Record]:
        """Each record, once it is known to be of this table and to be stored under the hash of its input."""
        for record in records:
            if type(record) is not self.record_type:
                raise InvalidInputError(
                    f"{self.role} rows must be {self.record_type.__name__}, got {type(record).__name__}"
                )
            self._check_key(record)
            yield record

    def _check_key(self, record: Record) -> None:
        """Refuse a row whose ``input_hash`` is not the content address of its ``input_text`` (and sample).

        A row stored under another key would be served as a hit for an input it does not answer.
        """
        if not isinstance(record.input_text, str):
            raise InvalidInputError(f"{self.role} row {record.input_hash!r}: input_text must be text")
        try:
            actual = input_hash(record.input_text, record.sample_index)
        except (InvalidInputError, ValueError) as e:  # not UTF-8 text; a sample > 0 of an input that is not JSON
            raise InvalidInputError(f"{self.role} row {record.input_hash!r}: input_text cannot be hashed ({e})") from e
        if actual != record.input_hash:
            raise InvalidInputError(
                f"{self.role} row {record.input_hash!r} (sample {record.sample_index}): its input_text hashes to "
                f"{actual}; a row is stored under the hash of its input (store.descriptor.input_hash). Nothing of "
                "the batch was written"
            )

    def _driver_rows(
        self, records: Iterable[Record], on_conflict: OnConflict
    ) -> tuple[str, tuple[str, ...], list[Any]]:
        """The insert's SQL, its parameter names and rows, bound by the column types' own bind processors.

        This is what ``conn.execute(insert, dicts)`` sends, without SQLAlchemy's per-row parameter
        processing (about 1.3x of raw sqlite3 on ~9 KB rows) and, on PostgreSQL, without its
        insertmanyvalues batches (multi-row VALUES of 14,000 parameters that psycopg parses again
        each time: about 2x raw executemany): the statement is compiled once per table (with its
        schema) and each value goes through the same processor SQLAlchemy would apply (JSON, UTC
        datetimes). Rows are tuples for a positional paramstyle (sqlite3), dicts for a named one.
        """
        dialect = self.conn.dialect
        translate = self.conn.get_execution_options().get("schema_translate_map")
        key = (self.role, on_conflict, dialect.name, dialect.paramstyle, (translate or {}).get(None))
        plan = _DRIVER_INSERTS.get(key)
        if plan is None:
            schema = {"schema_translate_map": translate, "render_schema_translate": True} if translate else {}
            compiled = self._insert(on_conflict).compile(dialect=dialect, column_keys=list(self._fields), **schema)
            names = tuple(compiled.positiontup or ()) if compiled.positional else self._fields
            if sorted(names) != sorted(self._fields) or sorted(compiled.binds) != sorted(self._fields):
                raise AssertionError(f"unexpected insert parameters {names}")
            plan = _DRIVER_INSERTS[key] = (str(compiled), names, attrgetter(*names), compiled.positional)
        sql, names, values_of, positional = plan
        processors = []
        for i, name in enumerate(names):
            column_type = self.table.c[name].type
            process = column_type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors.append((i, process))
        rows = []
        for record in self._checked(records):
            values = list(values_of(record))
            try:
                for i, process in processors:
                    values[i] = process(values[i])
            except Exception as e:  # what SQLAlchemy reports as a StatementError: e.g. a naive created_at
                raise InvalidInputError(f"{self.role} row cannot be written: {e}") from e
            rows.append(tuple(values) if positional else dict(zip(names, values, strict=True)))
        return sql, names, rows

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

    # ------------------------------------------------------------ aggregates

    def _byte_length(self, column: Any) -> Any:
        """Bytes a text or JSON value takes as stored (0 for NULL)."""
        text = column if isinstance(column.type, Text | String) else cast(column, Text)
        if self.conn.dialect.name == "sqlite":
            return func.coalesce(func.length(cast(text, LargeBinary)), 0)
        return func.coalesce(func.octet_length(text), 0)

    def _data_bytes(self) -> Any:
        c = self.table.c
        input_text, completion, usage, top = (self._byte_length(c[name]) for name in DATA_COLUMNS)
        return input_text + completion + usage + top

    def totals(self, flt: RowFilter | None = None) -> RowTotals:
        """The matching rows added up (see :class:`~store.records.RowTotals`)."""
        usage = self.table.c.usage
        stmt = select(
            func.count(),
            func.coalesce(func.sum(self._data_bytes()), 0),
            func.coalesce(func.sum(usage["prompt_tokens"].as_integer()), 0),
            func.coalesce(func.sum(usage["completion_tokens"].as_integer()), 0),
            func.coalesce(func.sum(usage["engine_seconds"].as_float()), 0.0),
            func.count(usage["engine_seconds"].as_float()),
        ).where(*self._where(flt or RowFilter()))
        rows, data, prompt, completion, seconds, priced = self.conn.execute(stmt).one()
        return RowTotals(int(rows), int(data), int(prompt), int(completion), float(seconds), int(priced))

    def groups(self, by: GroupBy, flt: RowFilter | None = None) -> list[RowGroup]:
        """The matching rows grouped by one column's value, in the column's order (NULL first)."""
        key = self._column(by)
        newest = func.max(self.table.c.created_at)
        stmt = (
            select(key, func.count(), func.coalesce(func.sum(self._data_bytes()), 0), newest)
            .where(*self._where(flt or RowFilter()))
            .group_by(key)
            .order_by(key.is_not(None), key)
        )
        return [RowGroup(k, int(n), int(size), when) for k, n, size, when in self.conn.execute(stmt).all()]

    def sample(self, n: int, start: str, flt: RowFilter | None = None) -> list[Record]:
        """Up to ``n`` matching rows: those whose input hash follows ``start``, wrapping around.

        Input hashes are SHA-256 digests, so the rows after a random
        ``start`` are a uniform random sample of the table, read through
        the primary key in ``O(n log rows)``, whatever the table's size.
        """
        clauses = self._where(flt or RowFilter())
        base = select(*self._columns).where(*clauses).order_by(self.table.c.input_hash).limit(n)
        found = self._records(self.conn.execute(base.where(self.table.c.input_hash >= start)).all())
        if len(found) < n:
            wrapped = base.where(self.table.c.input_hash < start).limit(n - len(found))
            found += self._records(self.conn.execute(wrapped).all())
        return found

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
        if flt.pair is not None:
            x, y = flt.pair
            model_a, model_b = self._column("model_a"), self._column("model_b")
            clauses.append(or_(and_(model_a == x, model_b == y), and_(model_a == y, model_b == x)))
        if flt.pointwise is not None:
            model_b = self._column("model_b")
            clauses.append(model_b.is_(None) if flt.pointwise else model_b.is_not(None))
        if flt.created_after is not None:
            clauses.append(self.table.c.created_at >= flt.created_after)
        if flt.created_before is not None:
            clauses.append(self.table.c.created_at < flt.created_before)
        if flt.input_hashes is not None:
            clauses.append(self.table.c.input_hash.in_(flt.input_hashes))
        if flt.finish_reasons is not None:
            clauses.append(self.table.c.finish_reason.in_(flt.finish_reasons))
        if flt.empty is not None:
            strip = func.trim if self.conn.dialect.name == "sqlite" else func.btrim  # PostgreSQL's trim takes FROM
            blank = strip(self.table.c.completion, " \t\r\n") == ""
            clauses.append(blank if flt.empty else ~blank)
        if flt.error is not None:
            failed = self.table.c.finish_reason.in_(ERROR_FINISH_REASONS)
            clauses.append(failed if flt.error else or_(~failed, self.table.c.finish_reason.is_(None)))
        adopted_from = self.table.c.adopted_from
        if flt.adopted_from is not None:
            clauses.append(adopted_from.startswith(flt.adopted_from, autoescape=True))
        if flt.adopted is not None:
            clauses.append(adopted_from.is_not(None) if flt.adopted else adopted_from.is_(None))
        return clauses
