"""One role's table as the hot paths see it: its shape, the two dialect-specific statements, the checks on rows.

Contract:

* :func:`table_shape` is a role's table, record type, field names, columns
  and field getter, built once per process.
* :func:`lookup_statement` (the bulk key lookup: ``json_each`` over one JSON
  parameter on SQLite, ``= ANY(:keys)`` over one array on PostgreSQL) and
  :func:`insert_statement` (``INSERT ... ON CONFLICT`` ignoring or replacing)
  are the only dialect-specific forms of the hot statements;
  :mod:`store.sqlite_rows` and :class:`~store.repository.Repository` compile
  and run them. :func:`json_each_keys` and :data:`LOOKUP_BATCH` are SQLite's
  key list and its batch size, for the other files that look keys up in bulk
  (the sync bookkeeping).
* Every row written passes :func:`refuse_other_type` and :func:`check_key` (its
  ``input_hash`` is :func:`~store.descriptor.input_hash` of its input: a row
  under another key would be a stale hit), or :func:`check_keys` after the
  driver bound the rows; a failure is an :class:`~store.errors.InvalidInputError`
  naming the row, as is text that is not valid Unicode (:func:`not_unicode`).
"""

from __future__ import annotations

import functools
import gc
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Literal

from sqlalchemy import (
    Column,
    Select,
    String,
    Table,
    any_,
    bindparam,
    func,
    select,
)
from sqlalchemy.sql.selectable import TableValuedAlias

from store.descriptor import input_hash
from store.errors import InvalidInputError
from store.layout import Role
from store.models import MODEL_OF_ROLE
from store.records import RECORD_OF_ROLE, Record, record_fields

OnConflict = Literal["ignore", "replace"]

LOOKUP_BATCH = 20_000  # keys per statement: bounds the JSON parameter, far below planner trouble
ARRAY_BATCH = 20_000  # PostgreSQL: keys per `= ANY(:keys)` array parameter
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
def table_shape(role: Role) -> tuple[Table, type[Record], tuple[str, ...], tuple[Column[Any], ...], attrgetter[Any]]:
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
def lookup_statement(role: Role, sqlite_dialect: bool) -> Select[Any]:
    """The bulk key lookup, built once per role: its cache key is memoized, not recomputed per call.

    SQLite reads the keys from one JSON parameter (``json_each``); PostgreSQL
    from one array parameter (``= ANY(:keys)``). Either way one statement and
    one plan, whatever the number of keys.
    """
    table, _, _, columns, _ = table_shape(role)
    if sqlite_dialect:
        values = json_each_keys()
        return select(*columns).where(table.c.input_hash.in_(select(values.c.value)))
    from sqlalchemy.dialects import postgresql  # here: a SQLite store never imports the PostgreSQL dialect

    return select(*columns).where(table.c.input_hash == any_(bindparam("keys", type_=postgresql.ARRAY(String))))


def insert_statement(role: Role, on_conflict: OnConflict, dialect: Any) -> Any:
    """``INSERT ... ON CONFLICT`` of one role's rows in ``dialect`` (the sqlite or postgresql module)."""
    table, _, fields, _, _ = table_shape(role)
    stmt = dialect.insert(table)
    if on_conflict == "ignore":
        return stmt.on_conflict_do_nothing(index_elements=["input_hash"])
    updated = {name: stmt.excluded[name] for name in fields if name != "input_hash"}
    return stmt.on_conflict_do_update(index_elements=["input_hash"], set_=updated)


def check_on_conflict(on_conflict: str) -> None:
    if on_conflict not in ("ignore", "replace"):
        raise InvalidInputError(f"on_conflict must be 'ignore' or 'replace', got {on_conflict!r}")


def refuse_other_type(role: Role, record: Any) -> None:
    expected = RECORD_OF_ROLE[role]
    if type(record) is not expected:
        raise InvalidInputError(f"{role} rows must be {expected.__name__}, got {type(record).__name__}")


def check_key(role: Role, record: Record) -> None:
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


def not_unicode(role: Role, names: tuple[str, ...], rows: Sequence[Any]) -> InvalidInputError:
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


def unwritable(role: Role, error: Exception) -> None:
    raise InvalidInputError(f"{role} row cannot be written: {error}") from error


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
        check_key(role, record)  # raises what is wrong, or passes a sample k > 0 hashed right
