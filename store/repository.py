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
  ``judgestore verify`` found it; ``verify`` remains the net for files
  written by other tools. ``Database.put_many``, which owns its transaction,
  checks after the rows are bound and before the commit (:func:`check_keys`:
  then it costs about the SHA-256 alone, 3 us for a 3 KB input, not a
  second UTF-8 conversion as well). Text that is not valid Unicode (a lone
  surrogate) is an :class:`~store.errors.InvalidInputError` naming the row
  and column, like a surrogate in a prompt.
* :meth:`~Repository.query` streams: rows are fetched in partitions, never all
  at once. :meth:`~Repository.delete` refuses an empty filter.
* Aggregates (:meth:`~Repository.totals`, :meth:`~Repository.groups`) add
  rows up in the database, and :meth:`~Repository.sample` picks rows at
  random through the primary key; none of them builds a row it does not return.
* The two dialect-specific hot statements (insert ignoring duplicates and the
  bulk key lookup) live here and nowhere else, each in a SQLite and a
  PostgreSQL form. SQLite looks keys up with ``json_each`` (one parameter,
  one plan, no variable limit) and inserts with a compiled ``INSERT ... ON
  CONFLICT`` executemany, both run on the sqlite3 connection itself
  (:func:`sqlite_get_many`, :func:`sqlite_insert`: compiled once per process,
  every value bound and read through its column type's own processors,
  records built straight into their slots); PostgreSQL looks keys up with
  ``= ANY(:keys)`` (one array parameter; faster than a join against
  ``unnest``) and inserts with a compiled ``INSERT ... ON CONFLICT`` in
  psycopg's executemany (pipeline mode; as fast as ``COPY`` into a temporary
  table, see ``bench/pg_bench.py``). :func:`json_each_keys` and :data:`LOOKUP_BATCH`
  are that key list and its batch size, for the other SQLite files that look
  keys up in bulk (the sync bookkeeping).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Literal

import orjson
from sqlalchemy import (
    JSON,
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
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, StatementError
from sqlalchemy.sql.selectable import TableValuedAlias

from store.descriptor import input_hash
from store.engine import sqlite_dialect
from store.errors import EmptyFilterError, InvalidInputError
from store.layout import Role
from store.models import MODEL_OF_ROLE, UTCDateTime
from store.records import ERROR_FINISH_REASONS, RECORD_OF_ROLE, Record, RowFilter, RowGroup, RowTotals, record_fields

OnConflict = Literal["ignore", "replace"]
GroupBy = Literal["finish_reason", "run_id", "created_at", "benchmark"]
DATA_COLUMNS = ("input_text", "completion", "usage", "top_logprobs")  # what RowTotals.data_bytes measures
LOOKUP_BATCH = 20_000  # keys per statement: bounds the JSON parameter, far below planner trouble
ARRAY_BATCH = 20_000  # PostgreSQL: keys per `= ANY(:keys)` array parameter
STREAM_PARTITION = 1_000
ROW_OVERHEAD_BYTES = 512  # a row's columns besides its two texts, its index entries and page slack, roughly


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
    from sqlalchemy.dialects import postgresql  # here: a SQLite store never imports the PostgreSQL dialect

    return select(*columns).where(table.c.input_hash == any_(bindparam("keys", type_=postgresql.ARRAY(String))))


def _insert_statement(role: Role, on_conflict: OnConflict, dialect: Any) -> Any:
    """``INSERT ... ON CONFLICT`` of one role's rows in ``dialect`` (the sqlite or postgresql module)."""
    table, _, fields, _, _ = _shape(role)
    stmt = dialect.insert(table)
    if on_conflict == "ignore":
        return stmt.on_conflict_do_nothing(index_elements=["input_hash"])
    updated = {name: stmt.excluded[name] for name in fields if name != "input_hash"}
    return stmt.on_conflict_do_update(index_elements=["input_hash"], set_=updated)


def _check_on_conflict(on_conflict: str) -> None:
    if on_conflict not in ("ignore", "replace"):
        raise InvalidInputError(f"on_conflict must be 'ignore' or 'replace', got {on_conflict!r}")


def _refuse_other_type(role: Role, record: Any) -> None:
    expected = RECORD_OF_ROLE[role]
    if type(record) is not expected:
        raise InvalidInputError(f"{role} rows must be {expected.__name__}, got {type(record).__name__}")


def _check_key(role: Role, record: Record) -> None:
    """Refuse a row whose ``input_hash`` is not the content address of its ``input_text`` (and sample).

    A row stored under another key would be served as a hit for an input it does not answer.
    """
    if not isinstance(record.input_text, str):
        raise InvalidInputError(f"{role} row {record.input_hash!r}: input_text must be text")
    try:
        actual = input_hash(record.input_text, record.sample_index)
    except (InvalidInputError, ValueError) as e:  # not UTF-8 text; a sample > 0 of an input that is not JSON
        raise InvalidInputError(f"{role} row {record.input_hash!r}: input_text cannot be hashed ({e})") from e
    if actual != record.input_hash:
        raise InvalidInputError(
            f"{role} row {record.input_hash!r} (sample {record.sample_index}): its input_text hashes to "
            f"{actual}; a row is stored under the hash of its input (store.descriptor.input_hash). Nothing of "
            "the batch was written"
        )


def _not_unicode(role: Role, names: tuple[str, ...], rows: Sequence[Any]) -> InvalidInputError:
    """The error naming the first row (and column) holding text that is not valid Unicode."""
    for row in rows:
        values = row if isinstance(row, dict) else dict(zip(names, row, strict=True))
        for name, value in values.items():
            if isinstance(value, str) and (bad := _unencodable(value)) is not None:
                return InvalidInputError(
                    f"{role} row {values.get('input_hash')!r}: {name} is not valid Unicode text (it holds "
                    f"the lone surrogate {bad!r}, which has no UTF-8 bytes); nothing of the batch was written"
                )
    return InvalidInputError(f"{role} rows hold text that is not valid Unicode")


# ---------------------------------------------------------------- SQLite's hot paths, on the driver's connection
#
# get_many and put_many on SQLite run their statement on the sqlite3 connection itself: compiled once per
# process by the store's SQLite dialect (store.engine.sqlite_dialect), every value bound and read through its
# column type's own processors, as SQLAlchemy would, without its per-row and per-call work (result rows,
# parameter dicts, events). Repository uses them inside its transaction; SqliteDatabase with a transaction
# of its own on a pooled connection.

RecordReader = Callable[[Iterable[Sequence[Any]], dict[str, Record]], None]


def _utc_from_text(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``created_at`` as UTCDateTime reads it from SQLite's text, faster; ``process`` (the type's own) for the rest.

    The type's processor parses the text with ``datetime.fromisoformat`` and
    then sets UTC with ``replace(tzinfo=...)``, which alone costs 0.7 us; parsing
    the text with an explicit ``+00:00`` gives the same aware datetime in 0.08 us.
    Text that does not parse that way (it has an offset, or is a date alone)
    goes to the type's processor, so the result is the same for every text.
    """
    fromisoformat = datetime.fromisoformat

    def read(value: Any) -> Any:
        try:
            parsed = fromisoformat(value + "+00:00")
        except (TypeError, ValueError):
            return process(value)
        return parsed if parsed.tzinfo is UTC else process(value)  # a date alone ignores the offset

    return read


def _utc_to_text(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``created_at`` as UTCDateTime binds it for SQLite (``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC), faster.

    An aware :class:`datetime` is converted to UTC and written by ``isoformat``
    (the type's processor formats seven fields through a dict, 1.5 us); the
    rows of one batch usually share one ``created_at`` object, whose text is
    kept. Anything else (naive, None, another type) goes to the type's own
    processor, which writes it or raises what it always raised.
    """
    memo: tuple[Any, Any] = (object(), None)  # (the last datetime, its text): replaced as one object

    def bind(value: Any) -> Any:
        nonlocal memo
        seen, text = memo
        if value is seen:
            return text
        if type(value) is not datetime:
            return process(value)
        utc = value
        if value.tzinfo is not UTC:
            if value.tzinfo is None or value.utcoffset() is None:
                return process(value)
            utc = value.astimezone(UTC)
        text = utc.isoformat(" ", "microseconds")[:-6]  # less "+00:00"
        memo = (value, text)
        return text

    return bind


def _record_reader(role: Role) -> RecordReader:
    """A function putting each row of the lookup into ``found`` as the role's record, keyed by input hash.

    It is generated once per role, as :mod:`dataclasses` generates ``__init__``:
    one line per column, the value read through the column type's own result
    processor (JSON decoded where not NULL, ``created_at`` as an aware UTC
    datetime) and stored straight into the record's slot, which is what the
    frozen record's ``__init__`` does field by field. At 10,000 rows that is
    0.75 us per row, against 2.9 us for ``Record(**dict(zip(fields, row)))``.
    """
    _, record_type, fields, columns, _ = _shape(role)
    if hasattr(record_type, "__post_init__") or set(getattr(record_type, "__slots__", ())) != set(fields):
        raise AssertionError(f"{record_type.__name__} must be a slots dataclass without __post_init__")
    dialect = sqlite_dialect()
    namespace: dict[str, Any] = {"new": object.__new__, "record_type": record_type}
    values = []
    for i, (name, column) in enumerate(zip(fields, columns, strict=True)):
        namespace[f"set_{i}"] = getattr(record_type, name).__set__  # the slot's member descriptor
        process = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if process is None:
            values.append(f"c{i}")
        elif isinstance(column.type, JSON):
            # What SQLite's JSON processor does with text, without its two wrapping calls; it has the rest
            # (a number SQLite stored as such).
            namespace[f"process_{i}"], namespace[f"loads_{i}"] = process, dialect._json_deserializer
            values.append(f"None if c{i} is None else loads_{i}(c{i}) if type(c{i}) is str else process_{i}(c{i})")
        else:
            namespace[f"process_{i}"] = _utc_from_text(process) if isinstance(column.type, UTCDateTime) else process
            values.append(f"None if c{i} is None else process_{i}(c{i})")
    key = fields.index("input_hash")
    lines = [
        "def read(rows, found):",
        f"    for ({', '.join(f'c{i}' for i in range(len(fields)))},) in rows:",
        "        record = new(record_type)",
        *(f"        set_{i}(record, {value})" for i, value in enumerate(values)),
        f"        found[c{key}] = record",
    ]
    reader: RecordReader = _generated(f"{role} reader", lines, namespace)
    return reader


def _generated(name: str, lines: list[str], namespace: dict[str, Any]) -> Any:
    """The function that ``lines`` define, compiled in ``namespace`` (sources built from our own columns only)."""
    exec(compile("\n".join(lines), f"<judgestore {name}>", "exec"), namespace)
    return namespace[lines[0].split()[1].partition("(")[0]]


@functools.cache
def _sqlite_lookup(role: Role) -> tuple[str, RecordReader]:
    """The bulk lookup's SQL (one ``?``: a JSON array of keys) and the reader of its rows, built once per process."""
    return str(_lookup_statement(role, True).compile(dialect=sqlite_dialect())), _record_reader(role)


def sqlite_get_many(conn: sqlite3.Connection, role: Role, keys: Sequence[str]) -> dict[str, Record]:
    """:meth:`Repository.get_many` on SQLite, on the driver's connection (see the section's comment).

    Several batches are read in one transaction: the caller's, or one of
    their own. Duplicate keys cost nothing in one batch (``IN`` matches a row
    once); beyond one batch they are dropped first, so no key is read twice.
    """
    if len(keys) > LOOKUP_BATCH:
        keys = list(dict.fromkeys(keys))
    sql, read = _sqlite_lookup(role)
    found: dict[str, Record] = {}
    own = len(keys) > LOOKUP_BATCH and not conn.in_transaction
    # The GC stays paused while rows are read: the JSON columns are decoded into many small dicts,
    # and every collection would rescan all of them.
    with gc_paused():
        if own:
            conn.execute("BEGIN")
        try:
            for start in range(0, len(keys), LOOKUP_BATCH):
                batch = keys if len(keys) <= LOOKUP_BATCH else keys[start : start + LOOKUP_BATCH]
                cursor = conn.execute(sql, (orjson.dumps(batch).decode(),))
                try:
                    read(cursor, found)
                finally:
                    # A row that fails to decode (text that is not UTF-8) leaves the statement running and
                    # its snapshot held: closing the cursor ends it, whatever the exception's frames keep.
                    cursor.close()
        finally:
            if own and conn.in_transaction:
                conn.execute("ROLLBACK")  # it only read
    return found


class SqliteInsert:
    """One role's insert on SQLite, compiled once per process: the SQL and how a record becomes its parameters."""

    def __init__(self, role: Role, on_conflict: OnConflict) -> None:
        table, record_type, fields, _, _ = _shape(role)
        self.role = role
        dialect = sqlite_dialect()
        compiled = _insert_statement(role, on_conflict, sqlite).compile(dialect=dialect, column_keys=list(fields))
        self.sql = str(compiled)
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ())
        if sorted(self.names) != sorted(fields):
            raise AssertionError(f"unexpected insert parameters {self.names}")
        self.rows: Callable[[Iterable[Record]], list[tuple[Any, ...]]] = self._rows_function(table, record_type)

    def _rows_function(self, table: Table, record_type: type[Record]) -> Any:
        """``rows(records)``: each record's parameters, bound by the column types' own processors.

        Generated once, as :func:`_record_reader` is: the record's values in
        one ``attrgetter`` call, then one tuple with each value processed
        inline (JSON objects by the JSON serializer the processor itself calls,
        aware ``created_at`` by :func:`_utc_to_text`, the rest by the type's own
        processor). A record of the other table, or a value a processor
        refuses (a naive ``created_at``), is an :class:`InvalidInputError`;
        keys are not checked here (:func:`check_keys`).
        """
        dialect = sqlite_dialect()
        namespace: dict[str, Any] = {
            "record_type": record_type,
            "values_of": attrgetter(*self.names),
            "refuse": functools.partial(_refuse_other_type, self.role),
            "unwritable": functools.partial(_unwritable, self.role),
        }
        values = []
        for i, name in enumerate(self.names):
            column_type = table.c[name].type
            process = column_type.dialect_impl(dialect).bind_processor(dialect)
            namespace[f"process_{i}"] = process
            if process is None:
                values.append(f"v{i}")
            elif isinstance(column_type, UTCDateTime):
                namespace[f"process_{i}"] = _utc_to_text(process)
                values.append(f"process_{i}(v{i})")
            elif isinstance(column_type, JSON):
                # An object is what SQLAlchemy's JSON processor hands its serializer (store.jsonvalues.dumps):
                # it goes there directly; the processor has the rest (None is NULL, its NULL markers).
                namespace[f"serialize_{i}"] = dialect._json_serializer
                values.append(
                    f"None if v{i} is None else serialize_{i}(v{i}) if type(v{i}) is dict else process_{i}(v{i})"
                )
            else:
                values.append(f"process_{i}(v{i})")
        variables = ", ".join(f"v{i}" for i in range(len(self.names)))
        lines = [
            "def rows(records):",
            "    bound = []",
            "    for record in records:",
            "        if type(record) is not record_type:",
            "            refuse(record)",
            f"        {variables} = values_of(record)",
            "        try:",
            f"            bound.append(({', '.join(values)}))",
            "        except Exception as e:  # what SQLAlchemy reports as a StatementError: e.g. a naive created_at",
            "            unwritable(e)",
            "    return bound",
        ]
        return _generated(f"{self.role} insert rows", lines, namespace)

    def execute(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        """Run the insert inside the caller's write transaction; returns the rows written."""
        try:
            cursor = conn.executemany(self.sql, rows)
        except UnicodeEncodeError as e:  # the driver encodes text as it binds it
            raise _not_unicode(self.role, self.names, rows) from e
        except sqlite3.IntegrityError as e:  # a CHECK or NOT NULL constraint: a malformed row, not a broken file
            raise InvalidInputError(f"{self.role} rows rejected by the database: {e}") from e
        return max(cursor.rowcount, 0)


def _unwritable(role: Role, error: Exception) -> None:
    raise InvalidInputError(f"{role} row cannot be written: {error}") from error


@functools.cache
def sqlite_insert(role: Role, on_conflict: OnConflict) -> SqliteInsert:
    """The compiled insert of ``role`` (``on_conflict``: ``"ignore"`` or ``"replace"``), built once per process."""
    _check_on_conflict(on_conflict)
    return SqliteInsert(role, on_conflict)


# (role, on_conflict, schema) -> the PostgreSQL insert's SQL and its columns' bind processors: compiled once per
# process and schema
_POSTGRES_INSERTS: dict[tuple[str, str, str | None], tuple[str, tuple[tuple[str, Callable[[Any], Any]], ...]]] = {}


def postgres_insert(conn: Connection, role: Role, on_conflict: OnConflict) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The insert of ``role`` for ``conn``'s schema, as SQL for psycopg's executemany, and the columns to bind.

    psycopg's executemany runs in pipeline mode: one compiled statement, one
    round trip for the batch. SQLAlchemy's insertmanyvalues instead sends
    multi-row VALUES of 14,000 parameters that psycopg parses anew each time
    (about 2x raw executemany on ~8 KB rows, ``bench/pg_bench.py``). The schema
    (``schema_translate_map``) is rendered into the SQL; each value goes through
    the processor SQLAlchemy would apply (returned as ``(name, processor)``).
    """
    translate = conn.get_execution_options().get("schema_translate_map")
    key = (role, on_conflict, (translate or {}).get(None))
    plan = _POSTGRES_INSERTS.get(key)
    if plan is None:
        from sqlalchemy.dialects import postgresql  # here: a SQLite store never imports the PostgreSQL dialect

        dialect = conn.dialect
        table, _, fields, _, _ = _shape(role)
        schema = {"schema_translate_map": translate, "render_schema_translate": True} if translate else {}
        compiled = _insert_statement(role, on_conflict, postgresql).compile(
            dialect=dialect, column_keys=list(fields), **schema
        )
        if compiled.positional or sorted(compiled.binds) != sorted(fields):
            raise AssertionError(f"unexpected insert parameters {sorted(compiled.binds)}")
        processors = []
        for name in fields:
            process = table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors.append((name, process))
        plan = _POSTGRES_INSERTS[key] = (str(compiled), tuple(processors))
    return plan


def check_keys(role: Role, records: Iterable[Record]) -> None:
    """Refuse the first record whose ``input_hash`` is not the hash of its input (see :meth:`Repository.put_many`).

    Run after the driver bound the rows and before the commit, this costs
    about the SHA-256 alone: binding leaves each text's UTF-8 inside the
    ``str`` (CPython keeps it), so encoding it again is a copy, not a second
    conversion of a few KB of non-ASCII text.
    """
    sha256 = hashlib.sha256
    for record in records:
        text = record.input_text
        if record.sample_index == 0 and type(text) is str:
            try:
                if sha256(text.encode()).hexdigest() == record.input_hash:
                    continue
            except UnicodeEncodeError:
                pass
        _check_key(role, record)  # raises what is wrong, or passes a sample k > 0 hashed right


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
        if self.conn.dialect.name == "sqlite":
            return sqlite_get_many(self._driver_connection(), self.role, list(hashes))
        keys = list(dict.fromkeys(hashes))
        found: dict[str, Record] = {}
        stmt = _lookup_statement(self.role, False)
        # The GC stays paused while rows are fetched too: the JSON columns are decoded into many
        # small dicts as the rows are built, and every collection would rescan all of them.
        with gc_paused():
            for start in range(0, len(keys), ARRAY_BATCH):
                chunk = keys[start : start + ARRAY_BATCH]
                for record in self._records(self.conn.execute(stmt, {"keys": chunk}).all()):
                    found[record.input_hash] = record
        return found

    def _driver_connection(self) -> sqlite3.Connection:
        """The sqlite3 connection under this repository's (inside its transaction)."""
        conn: sqlite3.Connection = self.conn.connection.driver_connection  # type: ignore[assignment]
        return conn

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

        A malformed row raises :class:`InvalidInputError` naming it, before anything is sent:
        a record of the other table, an ``input_hash`` that is not the hash of the row's input
        (:func:`store.descriptor.input_hash`), text that is not valid Unicode (a lone surrogate,
        in any column), a value a column refuses. The transaction must not commit after it (the
        database's own transactions roll back).
        """
        _check_on_conflict(on_conflict)
        if self.conn.dialect.name == "sqlite":
            insert = sqlite_insert(self.role, on_conflict)
            rows = insert.rows(self._checked(records))
            return insert.execute(self._driver_connection(), rows) if rows else 0
        sql, processors = postgres_insert(self.conn, self.role, on_conflict)
        dicts: list[dict[str, Any]] = []
        try:
            for record in self._checked(records):
                row = dict(zip(self._fields, self._values_of(record), strict=True))
                try:
                    for name, process in processors:
                        row[name] = process(row[name])
                except Exception as e:  # what SQLAlchemy reports as a StatementError: e.g. a naive created_at
                    _unwritable(self.role, e)
                dicts.append(row)
            if not dicts:
                return 0
            # psycopg's executemany (pipeline mode), whose rowcount is the sum of the rows written.
            result = self.conn.exec_driver_sql(sql, dicts)
        except UnicodeEncodeError as e:  # the driver encodes text as it binds it: found before any commit
            raise _not_unicode(self.role, self._fields, dicts) from e
        except IntegrityError as e:  # a CHECK or NOT NULL constraint: a malformed row, not a broken file
            raise InvalidInputError(f"{self.role} rows rejected by the database: {e.orig}") from e
        except StatementError as e:
            if isinstance(e, DBAPIError):  # locked, damaged...: the caller's retry and translation handle these
                raise
            raise InvalidInputError(f"{self.role} row cannot be written: {e.orig}") from e
        return max(result.rowcount, 0)

    def _checked(self, records: Iterable[Record]) -> Iterator[Record]:
        """Each record, once it is known to be of this table and to be stored under the hash of its input."""
        for record in records:
            _refuse_other_type(self.role, record)
            _check_key(self.role, record)
            yield record

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
