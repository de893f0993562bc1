"""SQLite's hot paths on the driver's connection: the bulk lookup and the insert, as SQLAlchemy would run them.

Contract:

* :func:`sqlite_get_many` and :func:`sqlite_insert` run their statement on
  the ``sqlite3`` connection itself: compiled once per process by the store's
  SQLite dialect (:func:`store.backends.sqlite.connections.sqlite_dialect`), every value bound and
  read through its column type's own processors, so the bytes and the values
  are SQLAlchemy's, without its per-row and per-call work (result rows,
  parameter dicts, events). :class:`~store.repository.Repository` uses them
  inside its transaction; :class:`~store.backends.sqlite.database.SqliteDatabase` with a
  transaction of its own on a pooled connection.
* The per-row code is generated from the models once per process, as
  :mod:`dataclasses` generates ``__init__``: for each table a reader,
  ``read_completions``/``read_judgements`` (records built straight into their
  slots), and a binder, ``bind_completions``/``bind_judgements`` (each
  record's parameters, through the column types' processors). Their source
  is registered with :mod:`linecache` (tracebacks and debuggers show it) and
  printed by ``python -m store.backends.sqlite.rows``; tests hold their
  results against SQLAlchemy's own reads and writes.
* :class:`SqliteClaimTable` is SQLite's side of the claims table
  (:mod:`store.claims`): this machine's clock and the same ``json_each`` key
  list. A claim runs in a write transaction that took the database's write
  lock up front (``BEGIN IMMEDIATE``), so claimers on this machine take turns
  and no row lock is needed.
* A delete hears Ctrl-C while SQLite runs it (:func:`signals_abort`):
  Python runs a signal's handler only between bytecodes, and a DELETE of
  400,000 rows answered it 6.5 s later, once done (then rolled back).
"""

from __future__ import annotations

import functools
import linecache
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from fractions import Fraction
from operator import attrgetter
from typing import Any, Literal

import orjson
from sqlalchemy import (
    JSON,
    ColumnElement,
    Insert,
    LargeBinary,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    true,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.selectable import TableValuedAlias

from store.backends.sqlite.connections import sqlite_dialect
from store.claim_table import CLAIMS, ClaimTable
from store.errors import InvalidInputError
from store.repository import BLANK, Repository
from store.roles import Role
from store.rows import RowTotals
from store.tables.deferred import DeferredColumns, looked_up, set_deferred
from store.tables.filters import RowFilter
from store.tables.models import UTCDateTime
from store.tables.records import Record
from store.tables.row_checks import (
    OnConflict,
    check_on_conflict,
    check_values,
    gc_paused,
    insert_statement,
    not_unicode,
    plain_values,
    refuse_other_type,
    table_shape,
    unwritable,
)

LOOKUP_BATCH = 20_000  # keys per statement: bounds the JSON parameter, far below planner trouble
LISTING_PROBE_ROWS = 2_000  # a filter matching at least this many rows is read in created_at order


def json_each_keys() -> TableValuedAlias:
    """SQLite's bulk key list: ``json_each`` over one JSON-array parameter ``keys`` (columns ``value``, ``key``).

    Bind it a JSON array of at most :data:`LOOKUP_BATCH` keys; ``key`` is each value's position in it.
    """
    return func.json_each(bindparam("keys", type_=String)).table_valued("value", "key")


@functools.cache
def lookup_statement(role: Role, lean: bool = False) -> Select[Any]:
    """The bulk key lookup of ``role``: the keys come from one JSON parameter (``json_each``), one plan for any
    number of them; built once per role (its cache key is memoized, not recomputed per call). ``lean`` leaves
    the deferred columns out (:mod:`store.tables.deferred`)."""
    table, _, _, columns, _ = table_shape(role)
    values = json_each_keys()
    return select(*looked_up(columns, lean)).where(table.c.input_hash.in_(select(values.c.value)))


GENERATED: dict[str, str] = {}  # generated function name -> its source
RecordReader = Callable[[Iterable[Sequence[Any]], dict[str, Record], DeferredColumns | None], None]


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


def _record_reader(role: Role, lean: bool = False) -> RecordReader:
    """A function putting each row of the lookup into ``found`` as the role's record, keyed by input hash.

    ``lean``: the rows of the lean lookup (without the deferred columns); each record gets the lookup's
    :class:`~store.tables.deferred.DeferredColumns` (the reader's third argument) instead.

    It is generated once per role, as :mod:`dataclasses` generates ``__init__``:
    one line per column, the value read through the column type's own result
    processor (JSON decoded where not NULL, ``created_at`` as an aware UTC
    datetime) and stored straight into the record's slot, which is what the
    frozen record's ``__init__`` does field by field. At 10,000 rows that is
    0.75 us per row, against 2.9 us for ``Record(**dict(zip(fields, row)))``.
    """
    _, record_type, all_fields, all_columns, _ = table_shape(role)
    if hasattr(record_type, "__post_init__") or set(getattr(record_type, "__slots__", ())) != set(all_fields):
        raise AssertionError(f"{record_type.__name__} must be a slots dataclass without __post_init__")
    columns = looked_up(all_columns, lean)
    fields = tuple(column.key for column in columns)
    dialect = sqlite_dialect()
    namespace: dict[str, Any] = {"new": object.__new__, "record_type": record_type, "set_deferred": set_deferred}
    values = []
    for name, column in zip(fields, columns, strict=True):
        namespace[f"set_{name}"] = getattr(record_type, name).__set__  # the slot's member descriptor
        process = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if process is None:
            values.append(name)
        elif isinstance(column.type, JSON):
            # What SQLite's JSON processor does with text, without its two wrapping calls; it has the rest
            # (a number SQLite stored as such).
            namespace[f"process_{name}"], namespace["loads"] = process, dialect._json_deserializer
            values.append(
                f"None if {name} is None else loads({name}) if type({name}) is str else process_{name}({name})"
            )
        else:
            namespace[f"process_{name}"] = _utc_from_text(process) if isinstance(column.type, UTCDateTime) else process
            values.append(f"None if {name} is None else process_{name}({name})")
    lines = [
        f"def read_{role}{'_lean' if lean else ''}(rows, found, deferred):",
        f"    for ({', '.join(fields)},) in rows:",
        "        record = new(record_type)",
        *(f"        set_{name}(record, {value})" for name, value in zip(fields, values, strict=True)),
        *(["        set_deferred(record, deferred)"] if lean else []),
        "        found[input_hash] = record",
    ]
    reader: RecordReader = _generated(lines, namespace)
    return reader


def _generated(lines: list[str], namespace: dict[str, Any]) -> Any:
    """The function that ``lines`` define (its name on the first line), compiled in ``namespace``.

    The source is built from the models' own columns, never from data; it is
    kept in :data:`GENERATED` and in :mod:`linecache` under a file name of its
    own, so a traceback through it shows its lines.
    """
    name = lines[0].split()[1].partition("(")[0]
    source = "\n".join(lines) + "\n"
    filename = f"<judgestore generated {__name__}.{name}>"
    exec(compile(source, filename, "exec"), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    GENERATED[name] = source
    return namespace[name]


@functools.cache
def _sqlite_lookup(role: Role, lean: bool) -> tuple[str, RecordReader]:
    """The bulk lookup's SQL (one ``?``: a JSON array of keys) and the reader of its rows, built once per process."""
    return str(lookup_statement(role, lean).compile(dialect=sqlite_dialect())), _record_reader(role, lean)


def sqlite_get_many(
    conn: sqlite3.Connection, role: Role, keys: Sequence[str], deferred: DeferredColumns | None = None
) -> dict[str, Record]:
    """:meth:`Repository.get_many` on SQLite, on the driver's connection (see the section's comment).

    Several batches are read in one transaction: the caller's, or one of
    their own. Duplicate keys cost nothing in one batch (``IN`` matches a row
    once); beyond one batch they are dropped first, so no key is read twice.
    With ``deferred`` the deferred columns are left out and each record loads
    them through it (the keys found are recorded in it).
    """
    if len(keys) > LOOKUP_BATCH:
        keys = list(dict.fromkeys(keys))
    sql, read = _sqlite_lookup(role, deferred is not None)
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
                    read(cursor, found, deferred)
                finally:
                    # A row that fails to decode (text that is not UTF-8) leaves the statement running and
                    # its snapshot held: closing the cursor ends it, whatever the exception's frames keep.
                    cursor.close()
        finally:
            if own and conn.in_transaction:
                conn.execute("ROLLBACK")  # it only read
    if deferred is not None:
        deferred.keys = list(found)
    return found


class SqliteInsert:
    """One role's insert on SQLite, compiled once per process: the SQL and how a record becomes its parameters."""

    def __init__(self, role: Role, on_conflict: OnConflict) -> None:
        table, record_type, fields, _, _ = table_shape(role)
        self.role = role
        dialect = sqlite_dialect()
        compiled = insert_statement(role, on_conflict, sqlite).compile(dialect=dialect, column_keys=list(fields))
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
        processor). A record of the other table, a value :func:`check_values`
        refuses, or a value a processor refuses (a naive ``created_at``), is an
        :class:`InvalidInputError`; keys are not checked here (:func:`check_keys`).
        """
        dialect = sqlite_dialect()
        namespace: dict[str, Any] = {
            "record_type": record_type,
            "values_of": attrgetter(*self.names),
            "refuse": functools.partial(refuse_other_type, self.role),
            "check": functools.partial(check_values, self.role),
            "unwritable": functools.partial(unwritable, self.role),
        }
        values = []
        for name in self.names:
            column_type = table.c[name].type
            process = column_type.dialect_impl(dialect).bind_processor(dialect)
            namespace[f"process_{name}"] = process
            if process is None:
                values.append(name)
            elif isinstance(column_type, UTCDateTime):
                namespace[f"process_{name}"] = _utc_to_text(process)
                values.append(f"process_{name}({name})")
            elif isinstance(column_type, JSON):
                # An object is what SQLAlchemy's JSON processor hands its serializer (store.jsonvalues.dumps):
                # it goes there directly; the processor has the rest (None is NULL, its NULL markers).
                namespace["serialize"] = dialect._json_serializer
                values.append(
                    f"None if {name} is None else serialize({name}) if type({name}) is dict else process_{name}({name})"
                )
            else:
                values.append(f"process_{name}({name})")
        variables = ", ".join(self.names)
        plain, names = plain_values(self.role, {name: name for name in self.names})
        namespace.update(names)
        lines = [
            f"def bind_{self.role}(records):",
            "    bound = []",
            "    for record in records:",
            "        if type(record) is not record_type:",
            "            refuse(record)",
            f"        {variables} = values_of(record)",
            f"        if not ({plain}):",
            "            check(record)  # raises what is wrong (or passes a row the expression is too strict for)",
            "        try:",
            f"            bound.append(({', '.join(values)}))",
            "        except Exception as e:  # what SQLAlchemy reports as a StatementError: e.g. a naive created_at",
            "            unwritable(record, e)",
            "    return bound",
        ]
        return _generated(lines, namespace)

    def execute(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        """Run the insert inside the caller's write transaction; returns the rows written."""
        try:
            cursor = conn.executemany(self.sql, rows)
        except UnicodeEncodeError as e:  # the driver encodes text as it binds it
            raise not_unicode(self.role, self.names, rows) from e
        except sqlite3.IntegrityError as e:  # a CHECK or NOT NULL constraint: a malformed row, not a broken file
            raise InvalidInputError(f"{self.role} rows rejected by the database: {e}") from e
        return max(cursor.rowcount, 0)


@functools.cache
def sqlite_insert(role: Role, on_conflict: OnConflict) -> SqliteInsert:
    """The compiled insert of ``role`` (``on_conflict``: ``"ignore"`` or ``"replace"``), built once per process."""
    check_on_conflict(on_conflict)
    return SqliteInsert(role, on_conflict)


_NUL_STAND_IN = "\ufdd0"  # what a U+0000 of a prompt reads as in SQLite's search (SqliteRepository._says)
_SET_ASIDE = "\x01"  # stands in for an escaped backslash: JSON that json_valid accepts holds no raw U+0001


def _nul_rewritten(column: Any) -> Any:
    """The JSON text ``column`` (valid JSON) with every escape \\u0000 written \\ufdd0, as a SQL expression.

    An escaped backslash (\\\\, a whole escape, read from the left as JSON reads it) is set aside first, so
    that the text "\\u0000" that a prompt says (spelled \\\\u0000) is left as it is.
    """

    def text(value: str) -> Any:
        return bindparam(None, value, Text())

    backslash, nul, stand_in = "\\\\", "\\u0000", "\\ufdd0"
    aside = func.replace(column, text(backslash), text(_SET_ASIDE))
    return func.replace(func.replace(aside, text(nul), text(stand_in)), text(_SET_ASIDE), text(backslash))


_STEPS_BETWEEN_CHECKS = 100_000  # SQLite VM steps between two looks for a signal: a few ms of work


class _SignalsAbort:
    """What :func:`signals_abort` shares between the statements running under it at once (threads): sqlite3's
    callback tracebacks and ``sys.unraisablehook`` are the process's, turned on by the first and back by the
    last (was: the first to end turned them off under the others); each thread keeps its own exceptions."""

    lock = threading.Lock()
    users = 0
    previous_hook: Any = None
    local = threading.local()

    @classmethod
    def enter(cls) -> list[BaseException]:
        with cls.lock:
            if cls.users == 0:
                cls.previous_hook = sys.unraisablehook
                sys.unraisablehook = cls.kept
                sqlite3.enable_callback_tracebacks(True)
            cls.users += 1
        raised: list[BaseException] = []
        cls.local.raised = raised
        return raised

    @classmethod
    def leave(cls) -> None:
        cls.local.raised = None
        with cls.lock:
            cls.users -= 1
            if cls.users == 0:
                sqlite3.enable_callback_tracebacks(False)  # sqlite3's default (judgestore never turns it on elsewhere)
                sys.unraisablehook = cls.previous_hook

    @classmethod
    def kept(cls, unraisable: Any) -> None:
        raised = getattr(cls.local, "raised", None)
        if unraisable.object is _steps and unraisable.exc_value is not None and raised is not None:
            raised.append(unraisable.exc_value)
        else:
            cls.previous_hook(unraisable)


@contextmanager
def signals_abort(conn: sqlite3.Connection) -> Iterator[None]:
    """A signal whose handler raises (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's, a deadline's own exception) stops
    a statement run inside at once, and its exception is raised here.

    SQLite calls a progress handler every :data:`_STEPS_BETWEEN_CHECKS` steps; being Python code, it runs a
    pending signal's handler, whose exception makes it fail, which aborts the statement (SQLite rolls back its
    transaction). sqlite3 hands that exception to ``sys.unraisablehook`` (with callback tracebacks on) instead of
    raising it, so it is kept there (:class:`_SignalsAbort`), and raised in place of sqlite3's "interrupted"
    (was: every signal's became a ``KeyboardInterrupt``).
    """
    raised = _SignalsAbort.enter()
    conn.set_progress_handler(_steps, _STEPS_BETWEEN_CHECKS)
    try:
        yield
    except (OperationalError, sqlite3.OperationalError):
        if raised:
            raise raised[0] from None
        raise
    finally:
        conn.set_progress_handler(None, _STEPS_BETWEEN_CHECKS)
        _SignalsAbort.leave()


def _steps() -> int:
    return 0  # go on (an exception raised here, by a signal's handler, aborts the statement)


class SqliteRepository(Repository):
    """The rows of one role's table in one SQLite file; the hot paths run on the driver's connection."""

    def _driver(self) -> sqlite3.Connection:
        """The sqlite3 connection under this repository's (inside its transaction)."""
        conn: sqlite3.Connection = self.conn.connection.driver_connection  # type: ignore[assignment]
        return conn

    def delete(self, flt: RowFilter) -> int:
        with signals_abort(self._driver()):
            return super().delete(flt)

    def _get_many(self, keys: list[str], deferred: DeferredColumns | None) -> dict[str, Record]:
        return sqlite_get_many(self._driver(), self.role, keys, deferred)

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        insert = sqlite_insert(self.role, on_conflict)
        rows = insert.rows(self._checked(records))
        return insert.execute(self._driver(), rows) if rows else 0

    def totals(self, flt: RowFilter | None = None) -> RowTotals:
        try:
            return super().totals(flt)
        except OperationalError as e:
            if "integer overflow" not in str(e.orig):
                raise
        # SQLite's sum() of 64-bit integers stops at 2^63, where PostgreSQL's numeric goes on. Only a table whose
        # usage adds up past it comes here: its numbers are added up in Python, exactly, as the server does.
        where = self._where(flt or RowFilter())
        numbers = self._usage_numbers()
        stmt = select(func.count(), func.coalesce(func.sum(self._data_bytes()), 0), func.count(numbers[-1]))
        rows, data, priced = self.conn.execute(stmt.where(*where)).one()
        sums: list[int | Fraction] = [0, 0, 0]  # a float as a Fraction: 2^63 + 0.5 stays exact until the end
        for values in self.conn.execute(select(*numbers).where(*where)):
            sums = [total + Fraction(value or 0) for total, value in zip(sums, values, strict=True)]
        prompt, completion, seconds = sums
        return RowTotals(int(rows), int(data), int(prompt), int(completion), float(seconds), int(priced))

    def _byte_length(self, column: Any) -> Any:
        text = column if isinstance(column.type, Text | String) else cast(column, Text)
        return func.coalesce(func.length(cast(text, LargeBinary)), 0)

    def _blank(self, column: Any) -> ColumnElement[bool]:
        return func.trim(column, BLANK) == ""

    def _json_number(self, column: Any, key: str) -> Any:
        path = f'$."{key}"'
        return case((func.json_type(column, path).in_(("integer", "real")), func.json_extract(column, path)))

    def _holds(self, column: Any, text: str) -> ColumnElement[bool]:
        # instr() on lower(), not LIKE: LIKE reads text as a C string, so it stops at a U+0000, in the pattern
        # (a search for one matched every row) and in the text (what follows one was never found). SQLite's
        # lower() folds ASCII letters only, as the contract says. It copies each text it reads: 2.4x the time
        # of LIKE per row, within the browser's time-bounded windows.
        return func.instr(func.lower(column), func.lower(bindparam(None, text, Text()))) > 0

    def _says(self, column: Any, kind: Literal["messages", "text"], text: str) -> ColumnElement[bool]:
        # json_tree fails the statement on text that is not JSON: such a text (another tool's, that merely begins
        # and ends as a rendered input) is looked into as the text it is. SQLite's JSON functions decode a string
        # only up to a U+0000 (json_extract('"a\u0000b"') is 'a'): an input that holds one (rare: canonical JSON
        # writes it \u0000) is decoded with each such escape rewritten \ufdd0 (_nul_rewritten), and looked into
        # for the search text with its U+0000 written U+FDD0 (a noncharacter, never assigned): there only, a
        # U+0000 and a U+FDD0 stand for each other. Never for the JSON's spelling: a match in it may begin inside
        # an escape (the "n" of a "\n", the "u" of a "\u0000"), which the server's reading never finds. A prompt
        # that says "\u0000" (its JSON spells "\\u0000") holds no U+0000: its escaped backslashes are left out
        # before the second look (each "\\" a whole escape, read from the left as JSON reads it).
        nul = bindparam(None, "\\u0000", Text())
        nul_held = and_(
            func.instr(column, nul) > 0,
            func.instr(func.replace(column, bindparam(None, "\\\\", Text()), ""), nul) > 0,
        )
        return case(
            (func.json_valid(column) == 0, self._holds(column, text)),
            (nul_held, self._said(_nul_rewritten(column), kind, text.replace("\0", _NUL_STAND_IN))),
            else_=self._said(column, kind, text),
        )

    def _said(self, column: Any, kind: Literal["messages", "text"], text: str) -> Any:
        """Whether one of the rendered input ``column``'s strings, decoded, holds ``text``."""
        if kind == "text":
            said = func.json_extract(column, "$.text")
            return and_(func.json_type(column, "$.text") == "text", self._holds(said, text))
        # One walk of the messages (json_tree parses the input once; json_each and a json_extract per message
        # parse each message again, 1.2-1.5x the time): every string under a "content" key, which a rendered
        # input has in its messages only, as the server's regular expression finds them.
        node = func.json_tree(column, "$.messages").table_valued("key", "value", "type", "fullkey").alias("node")
        content = and_(node.c.key == "content", node.c.type == "text", self._holds(node.c.value, text))
        return select(literal(1)).select_from(node).where(content).exists()

    def in_listing_order(self, clauses: list[ColumnElement[bool]]) -> list[ColumnElement[bool]]:
        """A filter matching at least :data:`LISTING_PROBE_ROWS` rows (counted through its own index) is
        written ``(clause) IS 1``, which no index serves.

        SQLite's planner has no statistics in a store's files: it would read
        every matching row through the filter's index to sort them (seconds
        at a million rows). Unable to use that index, it reads the
        ``created_at`` index in order and stops after a page.
        """
        if not clauses:
            return clauses
        probe = select(literal(1)).select_from(self.table).where(*clauses).limit(LISTING_PROBE_ROWS).subquery()
        if self.conn.execute(select(func.count()).select_from(probe)).scalar_one() < LISTING_PROBE_ROWS:
            return clauses  # few rows: the filter's own index finds them, and sorting them is cheap
        return [clause.is_(true()) for clause in clauses]


class SqliteClaimTable(ClaimTable):
    def now(self) -> datetime:
        return datetime.now(UTC)

    def _keys_in(self, column: Any) -> ColumnElement[bool]:
        return column.in_(select(json_each_keys().c.value))  # type: ignore[no-any-return]

    def _keys(self, keys: Sequence[str]) -> Any:
        return orjson.dumps(list(keys)).decode()

    def _insert_ignoring(self) -> Insert:
        return sqlite.insert(CLAIMS).on_conflict_do_nothing()


def generated_sources() -> str:
    """The source of every generated reader and binder, as this process builds them."""
    for role in ("completions", "judgements"):
        _sqlite_lookup(role, False)
        _sqlite_lookup(role, True)
        sqlite_insert(role, "ignore")
    return "\n\n".join(GENERATED[name] for name in sorted(GENERATED))


if __name__ == "__main__":
    sys.stdout.write(generated_sources())
