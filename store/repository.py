"""Statements over one descriptor database's table, on a connection the caller holds.

Contract:

* A :class:`Repository` executes statements and never commits: the caller
  opens the transaction (``with database.transaction() as repo:``).
* :meth:`~Repository.get_many` takes any number of hashes and returns the rows
  found (missing keys are simply absent) in batches of one statement each;
  given a :class:`~store.tables.deferred.DeferredColumns` it leaves ``input_text``
  out of the statement and the records read it on first access.
* :meth:`~Repository.put_many` inserts in one executemany; ``"ignore"`` keeps
  the row already stored, ``"replace"`` overwrites it. It first checks that
  every row is stored under the hash of its input (``input_hash`` is
  :func:`~store.descriptor.input_hash` of ``input_text`` and
  ``sample_index``): a row under another key would be a stale hit until
  ``judgestore verify`` found it; ``verify`` remains the net for files
  written by other tools. ``Database.put_many``, which owns its transaction,
  checks after the rows are bound and before the commit
  (:func:`~store.tables.row_checks.check_keys`: then it costs about the SHA-256
  alone, 3 us for a 3 KB input, not a
  second UTF-8 conversion as well). Text that is not valid Unicode (a lone
  surrogate) is an :class:`~store.errors.InvalidInputError` naming the row
  and column, like a surrogate in a prompt.
* :meth:`~Repository.query` streams: rows are fetched and built
  :data:`STREAM_SLICE` at a time, never all at once (a hundred of the widest
  rows, per-token logprobs, is tens of MB; a reader that gathers them, as a
  check of a file read without locks does, stops at about
  :data:`PARTITION_BYTES` by :func:`records_bytes`).
  :meth:`~Repository.delete` refuses an empty filter.
  :meth:`~Repository.clauses` gives a filter's WHERE clauses to callers that
  compose their own statements over :attr:`~Repository.table`.
* Aggregates (:meth:`~Repository.totals`, :meth:`~Repository.groups`) add
  rows up in the database, and :meth:`~Repository.sample` picks rows at
  random through the primary key; none of them builds a row it does not return.
* The base class is written once for both backends; each backend's
  repository (:mod:`store.backends`) supplies what differs: the two hot
  statements (the bulk key lookup, the insert ignoring or replacing
  duplicates) on its own driver path, the bytes a value takes as stored,
  what counts as a blank completion, and how the browser's search reads a
  text and a rendered input's strings. Nothing here names a dialect.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Literal

import orjson
from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Text,
    and_,
    bindparam,
    case,
    delete,
    func,
    or_,
    select,
)

from store.descriptor import MESSAGES_HEAD, MESSAGES_TAIL, TEXT_HEAD, TEXT_TAIL
from store.errors import EmptyFilterError, InvalidInputError
from store.roles import Role
from store.rows import RowGroup, RowTotals
from store.tables.deferred import DeferredColumns, looked_up, set_deferred
from store.tables.filters import ERROR_FINISH_REASONS, RowFilter
from store.tables.records import CompletionRecord, JudgementRecord, Record
from store.tables.row_checks import (
    OnConflict,
    check_row,
    gc_paused,
    listed_records,
    lookup_keys,
    table_shape,
)

GroupBy = Literal["finish_reason", "run_id", "created_at", "benchmark"]
DATA_COLUMNS = ("input_text", "completion", "usage", "top_logprobs")  # what RowTotals.data_bytes measures
USAGE_TOTALS = ("prompt_tokens", "completion_tokens", "engine_seconds")  # the usage keys RowTotals adds up
# An engine_seconds this large adds nothing, as a non-finite one: two of 1e308 summed past the float range (stats
# crashed on SQLite, whose sum was inf, and called the database unreadable on PostgreSQL); under it, 10^8 rows stay
# within the range.
MAX_ENGINE_SECONDS = 1e300
# A token count this large adds nothing either (no call spends it): two of 1e308 summed to inf and stats crashed.
# Whole numbers under it add up exactly, however large (see the SQLite backend's totals).
MAX_TOKENS = 1e300
STREAM_PARTITION = 1_000  # rows a read of raw values (verify's) fetches at a time
STREAM_SLICE = 100  # records a query builds at a time: its rows' width is known only once they are built
PARTITION_BYTES = 32 << 20  # about what a reader that gathers records (a checked read) holds at once
BLANK = " \t\r\n"  # what a blank completion holds at most (RowFilter.empty)
# The text searches built (Repository.contains_text), by backend, table and text: a few at a time are in use
_SEARCHES: dict[tuple[type[Repository], str, str], ColumnElement[bool]] = {}
_SEARCHES_KEPT = 32


def records_bytes(records: Sequence[object]) -> int:
    """About what ``records`` take in memory, from a sample of at most 8 of them (0 for what are not records)."""
    sample = [r for r in records[:: max(1, len(records) // 8)] if isinstance(r, CompletionRecord | JudgementRecord)]
    if not sample:
        return 0
    return int(sum(map(_approximate_bytes, sample)) / len(sample) * len(records))


def _approximate_bytes(record: Record) -> int:
    """About what ``record`` takes in memory: its texts, and its JSON values as the objects they parse into."""
    return 1_000 + len(record.completion) + len(record.input_text) + _object_bytes(record.top_logprobs)


def _object_bytes(value: Any) -> int:
    """About what a parsed JSON value takes (CPython: a dict about 200 bytes and a few dozen an item, a float 24)."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            total += 200 + 100 * len(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            total += 60 + 8 * len(item)
            pending.extend(item)
        elif isinstance(item, str):
            total += 50 + len(item)
        else:
            total += 32
    return total


def json_escaped(text: str) -> str:
    """``text`` as a JSON string holds it (without the quotes), escaped as canonical JSON escapes it: how a
    rendered input spells it."""
    try:
        return orjson.dumps(text)[1:-1].decode()
    except orjson.JSONEncodeError:  # a lone surrogate: no rendered input holds one
        return text


class Repository(ABC):
    """The rows of one role's table in one descriptor database."""

    def __init__(self, conn: Connection, role: Role) -> None:
        self.conn = conn
        self.role = role
        self.table, self.record_type, self._fields, self._columns, self._values_of = table_shape(role)

    # ------------------------------------------------------------ reads

    def _records(self, rows: Sequence[Any]) -> list[Record]:
        make, names = self.record_type, self._fields
        with gc_paused():
            return [make(**dict(zip(names, row, strict=True))) for row in rows]

    def _lean_records(self, rows: Sequence[Any], deferred: DeferredColumns) -> list[Record]:
        """Records of the lean lookup's rows (:func:`~store.tables.deferred.looked_up`), each loading the rest through
        ``deferred``."""
        new, make = object.__new__, self.record_type
        setters = [getattr(make, c.key).__set__ for c in looked_up(self._columns, True)]
        records = []
        with gc_paused():
            for row in rows:
                record = new(make)
                for put, value in zip(setters, row, strict=True):
                    put(record, value)
                set_deferred(record, deferred)
                records.append(record)
        return records

    def get_many(self, hashes: Iterable[str], *, deferred: DeferredColumns | None = None) -> dict[str, Record]:
        """Rows stored under any of ``hashes``, keyed by input hash (missing keys are absent).

        With ``deferred`` the statement leaves the deferred columns out (``input_text``) and each record reads
        them through it on first access (:mod:`store.tables.deferred`); the keys found are recorded in it. A key
        that is not an input hash is an :class:`InvalidInputError` before anything is read
        (:func:`~store.tables.row_checks.lookup_keys`), on both backends.
        """
        return self._get_many(lookup_keys(hashes), deferred)

    @abstractmethod
    def _get_many(self, keys: list[str], deferred: DeferredColumns | None) -> dict[str, Record]:
        """:meth:`get_many` of keys known to be input hashes."""

    def query(self, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        """Rows matching ``flt`` ordered by creation time, streamed in partitions."""
        stmt = select(*self._columns).where(*self._where(flt or RowFilter()))
        stmt = stmt.order_by(self.table.c.created_at, self.table.c.input_hash)
        if limit is not None:
            stmt = stmt.limit(limit)
        result = self.conn.execution_options(stream_results=True, max_row_buffer=STREAM_SLICE).execute(stmt)
        while partition := result.fetchmany(STREAM_SLICE):
            yield from self._records(partition)

    def count(self, flt: RowFilter | None = None) -> int:
        stmt = select(func.count()).select_from(self.table).where(*self._where(flt or RowFilter()))
        return int(self.conn.execute(stmt).scalar_one())

    def count_around(self, flt: RowFilter, moment: datetime) -> tuple[int, int]:
        """The rows ``flt`` matches dated before ``moment``, and those dated at or after it, in one statement."""
        created_at = self.table.c.created_at
        counts = select(func.count().filter(created_at < moment), func.count().filter(created_at >= moment))
        before, later = self.conn.execute(counts.select_from(self.table).where(*self._where(flt))).one()
        return int(before), int(later)

    # ------------------------------------------------------------ writes

    @abstractmethod
    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        """Insert ``records``; returns how many rows were written (ignored duplicates not counted).

        A malformed row raises :class:`InvalidInputError` naming it, before anything is sent:
        a record of the other table, an ``input_hash`` that is not the hash of the row's input
        (:func:`store.descriptor.input_hash`), text that is not valid Unicode (a lone surrogate,
        in any column), a value either backend refuses (:func:`~store.tables.row_checks.check_values`).
        The same row gets the same error on SQLite and PostgreSQL. The transaction must not
        commit after it (the database's own transactions roll back).
        """

    def _checked(self, records: Iterable[Record]) -> Iterator[Record]:
        """Each record, once it is known to be of this table, to hold values both backends keep, and to be stored
        under the hash of its input."""
        for record in listed_records(records):
            check_row(self.role, record)
            yield record

    def delete(self, flt: RowFilter) -> int:
        """Delete the rows matching ``flt``; an empty filter raises :class:`EmptyFilterError`."""
        if flt.is_empty():
            raise EmptyFilterError()
        result = self.conn.execute(delete(self.table).where(*self._where(flt)))
        return max(result.rowcount, 0)

    # ------------------------------------------------------------ aggregates

    @abstractmethod
    def _byte_length(self, column: Any) -> Any:
        """Bytes a text or JSON value takes as stored (0 for NULL), as a SQL expression."""

    @abstractmethod
    def _blank(self, column: Any) -> ColumnElement[bool]:
        """Whether a text value is empty or only whitespace (spaces, tabs, newlines), as a SQL expression."""

    @abstractmethod
    def _json_number(self, column: Any, key: str) -> Any:
        """The number a JSON object column holds under ``key``, as a SQL expression: NULL where the column is
        NULL or the value is anything but a JSON number (a string, an object, a non-finite float's tag), and
        wide enough for any integer the column keeps (a 64-bit one)."""

    def _usage_numbers(self) -> list[Any]:
        """The SQL expressions of the :data:`USAGE_TOTALS` a row's ``usage`` holds (:meth:`_json_number`), a
        token count beyond :data:`MAX_TOKENS` and an ``engine_seconds`` beyond :data:`MAX_ENGINE_SECONDS` NULL."""
        usage = self.table.c.usage
        bounds = (MAX_TOKENS, MAX_TOKENS, MAX_ENGINE_SECONDS)  # in USAGE_TOTALS' order
        numbers = (self._json_number(usage, key) for key in USAGE_TOTALS)
        # Compared on both sides, not through abs(): SQLite's abs(-2^63) overflows, and the table read as damaged
        return [case(((n > -bound) & (n < bound), n)) for n, bound in zip(numbers, bounds, strict=True)]

    def _data_bytes(self) -> Any:
        c = self.table.c
        input_text, completion, usage, top = (self._byte_length(c[name]) for name in DATA_COLUMNS)
        return input_text + completion + usage + top

    def totals(self, flt: RowFilter | None = None) -> RowTotals:
        """The matching rows added up (see :class:`~store.rows.RowTotals`)."""
        prompt, completion, seconds = self._usage_numbers()
        stmt = select(
            func.count(),
            func.coalesce(func.sum(self._data_bytes()), 0),
            func.coalesce(func.sum(prompt), 0),
            func.coalesce(func.sum(completion), 0),
            func.coalesce(func.sum(seconds), 0.0),
            func.count(seconds),
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

    # ------------------------------------------------------------ what a caller composes (the browser)

    def contains_text(self, text: str) -> ColumnElement[bool]:
        """:meth:`_contains_text`, built once per backend, table and text (:data:`_SEARCHES`): a rows page asks it
        of every database it reads, and building it cost more than reading a small database."""
        key = (type(self), self.table.name, text)
        clause = _SEARCHES.get(key)
        if clause is None:
            if len(_SEARCHES) >= _SEARCHES_KEPT:
                _SEARCHES.clear()
            clause = _SEARCHES[key] = self._contains_text(text)
        return clause

    def _contains_text(self, text: str) -> ColumnElement[bool]:
        """Rows whose prompt or completion contains ``text``, as a SQL expression: ASCII letters in any case, every
        other character (U+0000 included) as it is, the same rows on both backends.

        The prompt is looked into for what it says, not for its encoding: in a rendered input
        (:func:`~store.descriptor.render_messages`, :func:`~store.descriptor.render_text`), each message's
        content, or the text, as its JSON string decodes (a quote, a backslash, a newline, U+0000 are found as
        the prompt says them); a word of the JSON's own keys and values around them (``content``, ``role``,
        ``user``, ``system``, ``messages``, ``type``) is not found there. A match lies within one message. An
        input that does not begin and end as a rendered one (text that another tool stored) is looked into as
        the text it is. One difference, about a noncharacter: in a prompt holding U+0000, SQLite (whose JSON
        functions stop there) reads each U+0000 as U+FDD0, and one in ``text`` too; so there, where the prompt's
        JSON also holds ``text`` as the JSON spells it (in a role, say), a U+0000 and a U+FDD0 match each other.
        """
        prompt = self.table.c.input_text
        # First one read of the stored text for the search text as the JSON spells it (what a rendered input's
        # string says is in its JSON, spelled so) or as it is: that rules out most rows of a rare word at the
        # cost of a plain text search; reading a prompt's strings one by one costs 2-4 times that.
        spelled = json_escaped(text)
        found = self._holds(prompt, spelled)
        if spelled != text:  # a quote, a backslash, a control character
            found = or_(found, self._holds(prompt, text))
        said = case(
            (self._rendered(prompt, MESSAGES_HEAD, MESSAGES_TAIL), self._says(prompt, "messages", text)),
            (self._rendered(prompt, TEXT_HEAD, TEXT_TAIL), self._says(prompt, "text", text)),
            else_=self._holds(prompt, text),
        )
        return or_(self._holds(self.table.c.completion, text), and_(found, said))

    def _rendered(self, column: Any, head: str, tail: str) -> ColumnElement[bool]:
        """Whether the text ``column`` begins with ``head`` and ends with ``tail`` (counted in characters)."""
        start = func.substr(column, 1, len(head)) == bindparam(None, head, Text())
        end = func.substr(column, func.length(column) - (len(tail) - 1)) == bindparam(None, tail, Text())
        return and_(start, end)

    @abstractmethod
    def _says(self, column: Any, kind: Literal["messages", "text"], text: str) -> ColumnElement[bool]:
        """Whether the rendered input ``column`` (a chat's ``messages`` or a ``text`` prompt) says ``text`` in one
        of its strings (see :meth:`contains_text`), as a SQL expression."""

    @abstractmethod
    def _holds(self, column: Any, text: str) -> ColumnElement[bool]:
        """Whether the text ``column`` holds ``text`` (see :meth:`contains_text`), as a SQL expression."""

    def in_listing_order(self, clauses: list[ColumnElement[bool]]) -> list[ColumnElement[bool]]:
        """``clauses`` written so that a statement listing the rows in ``created_at`` order reads a page, not
        every matching row; as they are where the database's planner chooses well on its own."""
        return list(clauses)

    # ------------------------------------------------------------ filters

    def _column(self, name: str) -> Column[Any]:
        if name not in self.table.c:
            raise InvalidInputError(f"{self.role} have no {name} column; this filter applies to the other role")
        return self.table.c[name]

    def clauses(self, flt: RowFilter) -> list[ColumnElement[bool]]:
        """The WHERE clauses selecting the rows ``flt`` matches, for statements a caller composes over
        :attr:`table` (the browser's keyset pages): the same clauses :meth:`query` and :meth:`delete` use."""
        return self._where(flt)

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
            blank = self._blank(self.table.c.completion)
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
