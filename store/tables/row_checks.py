"""One role's table as the hot paths see it: its shape, the insert statement, the checks on rows.

Contract:

* :func:`table_shape` is a role's table, record type, field names, columns
  and field getter, built once per process.
* :func:`insert_statement` (``INSERT ... ON CONFLICT`` ignoring or replacing)
  is the dialect-specific form of the hot write; each backend's rows module
  compiles and runs it. The bulk key lookup is each backend's own
  ``lookup_statement`` (``json_each`` over one JSON parameter in
  :mod:`store.backends.sqlite.rows`, with its :func:`json_each_keys` and
  ``LOOKUP_BATCH`` for the other files that look keys up in bulk;
  ``= ANY(:keys)`` over one array in :mod:`store.backends.postgres.rows`).
* Every row written passes :func:`refuse_other_type` and :func:`check_key` (its
  ``input_hash`` is :func:`~store.descriptor.input_hash` of its input: a row
  under another key would be a stale hit), or :func:`check_keys` after the
  driver bound the rows; a failure is an :class:`~store.errors.InvalidInputError`
  naming the row, as is text that is not valid Unicode (:func:`not_unicode`).
* Every row written also passes :func:`check_values` before anything is
  sent, on both backends: what one backend would refuse or change, the other
  refuses too, with the same error naming the row and the column. Text
  columns hold text (``None`` where nullable); ``sample_index`` is an integer
  from 0 to :data:`MAX_SAMPLE_INDEX` (PostgreSQL's ``integer``); an indexed
  text value takes at most :data:`INDEXED_TEXT_BYTES` bytes as PostgreSQL
  stores it (two of them fill one btree entry, whose limit is 2,704 bytes);
  ``usage`` and ``top_logprobs`` are JSON objects (``dict``) or ``None``
  (what the records declare, and what sharing's shards carry);
  ``adopted_from`` is a SHA-256 hex digest; ``orientation`` is ``direct``,
  ``reversed`` or ``None``; ``created_at`` is a datetime. A value a column's
  processor refuses (a naive ``created_at``, JSON that cannot be encoded) is
  named by :func:`unwritable`.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    Column,
    String,
    Table,
)

from store import jsonvalues
from store.backends.postgres.text import escaped_bytes
from store.descriptor import input_hash
from store.errors import InvalidInputError, RowValueError
from store.roles import Role
from store.tables.models import MODEL_OF_ROLE
from store.tables.records import RECORD_OF_ROLE, Record, record_fields

OnConflict = Literal["ignore", "replace"]

ROW_OVERHEAD_BYTES = 512  # a row's columns besides its two texts, its index entries and page slack, roughly
MAX_SAMPLE_INDEX = 2**31 - 1  # PostgreSQL's integer; SQLite's would be 2**63 - 1
INDEXED_TEXT_BYTES = 1_300  # an indexed text value, escaped as on PostgreSQL: two fit a btree entry (2,704 bytes)
DIGEST_COLUMNS = ("input_hash", "adopted_from")  # hex digests: checked as such, stored plain (store.tables.models)
_SAFE_INDEXED_CHARS = INDEXED_TEXT_BYTES // 4  # no character takes more than 4 bytes escaped
_HEX_DIGEST = re.compile("[0-9a-f]{64}").fullmatch
_HEX_DIGITS = b"0123456789abcdef"


def journaled_bytes(records: Sequence[Record]) -> int:
    """About the disk space writing ``records`` needs: their text twice over (pages, and SQLite's journal of them)."""
    return 2 * sum(len(r.input_text) + len(r.completion) + ROW_OVERHEAD_BYTES for r in records)


def listed_records(records: Iterable[Record]) -> list[Record]:
    """``records`` as a list; one record, or anything else that holds none, is refused naming what to give (a
    record alone was a TypeError: 'CompletionRecord' object is not iterable)."""
    if not isinstance(records, Iterable) or isinstance(records, str | bytes | Mapping):
        hint = ": put_many([record])" if dataclasses.is_dataclass(records) else ""
        raise InvalidInputError(f"put_many takes a list of records, not {type(records).__name__}{hint}")
    return list(records)


def lookup_keys(hashes: Iterable[str]) -> list[str]:
    """``hashes`` as a list once each is a key (64 lowercase hex characters); else name the first that is not.

    About 0.1 us a key: the keys are checked joined, one by one only to name a bad one.
    """
    if isinstance(hashes, str | bytes):
        raise InvalidInputError(f"get_many takes an iterable of input hashes, not one {type(hashes).__name__}")
    if not isinstance(hashes, Iterable):
        raise InvalidInputError(
            f"get_many takes an iterable of input hashes, not {type(hashes).__name__} {hashes!r:.60}"
        )
    keys = list(hashes)
    try:
        joined = "".join(keys).encode("ascii")
    except (TypeError, UnicodeEncodeError):
        joined = b""
    lengths_ok = len(joined) == 64 * len(keys) and max(map(len, keys), default=64) == 64
    if lengths_ok and not joined.translate(None, _HEX_DIGITS):
        return keys
    bad = next(k for k in keys if not (isinstance(k, str) and _HEX_DIGEST(k)))
    raise InvalidInputError(
        f"get_many: {type(bad).__name__} {bad!r:.100} is not an input hash (64 lowercase hex characters, "
        "store.descriptor.input_hash)"
    )


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
        if (bad := _unencodable(record.input_text)) is not None:
            raise _surrogate(role, record.input_hash, "input_text", bad) from e  # as the driver's refusal says it
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
                return _surrogate(role, values.get("input_hash"), name, bad)
    return InvalidInputError(f"{role} rows hold text that is not valid Unicode")


NOTHING_WRITTEN = "; nothing of the batch was written"  # what a refusal of one row says of the write it was in


def _surrogate(role: Role, key: object, column: str, bad: str) -> RowValueError:
    return RowValueError(
        f"{role} row {key!r}: {column} is not valid Unicode text (it holds the lone surrogate {bad!r}, which has no "
        f"UTF-8 bytes){NOTHING_WRITTEN}",
        column=column,
        rule="is not valid Unicode text (it holds a lone surrogate, which has no UTF-8 bytes)",
    )


def _refused(role: Role, record: Any, column: str, what: str, rule: str | None = None) -> RowValueError:
    """The error of a row whose ``column`` breaks ``rule`` (``what``: the same words, with the value it holds)."""
    return RowValueError(
        f"{role} row {getattr(record, 'input_hash', None)!r}: {column} {what}{NOTHING_WRITTEN}",
        column=column,
        rule=what if rule is None else rule,
    )


@dataclass(frozen=True, slots=True)
class _ValueRules:
    """What :func:`check_values` checks in one role's rows (built once per role from its table)."""

    text_names: tuple[str, ...]  # every text column but the digests, in field order
    indexed_names: tuple[str, ...]  # text columns of an index (the digests aside)
    json_names: tuple[str, ...]  # the JSON columns (usage, top_logprobs)
    orientation: bool  # the table has an orientation column


@functools.cache
def _value_rules(role: Role) -> _ValueRules:
    table, _, fields, _, _ = table_shape(role)
    texts = tuple(n for n in fields if isinstance(table.c[n].type, String) and n not in DIGEST_COLUMNS)
    in_index = {c.name for index in table.indexes for c in index.columns}
    indexed = tuple(n for n in texts if n in in_index)
    jsons = tuple(n for n in fields if isinstance(table.c[n].type, JSON))
    return _ValueRules(texts, indexed, jsons, "orientation" in fields)


def check_values(role: Role, record: Any) -> None:
    """Refuse a value one backend would refuse or change (see the module docstring), naming the row and column."""
    rules = _value_rules(role)
    sample = record.sample_index
    if type(sample) is not int or not 0 <= sample <= MAX_SAMPLE_INDEX:
        rule = f"must be an integer from 0 to {MAX_SAMPLE_INDEX:,}"
        raise _refused(role, record, "sample_index", f"{rule}, got {sample!r}", rule)
    for name in rules.text_names:
        value = getattr(record, name)
        if not isinstance(value, str) and (value is not None or name in ("input_text", "completion")):
            raise _refused(role, record, name, f"must be text, got {type(value).__name__}")
    for name in rules.json_names:  # what the record's type says, and all that sharing's shards carry
        value = getattr(record, name)
        if value is not None and not isinstance(value, dict):
            raise _refused(role, record, name, f"must be a JSON object (a dict) or None, got {type(value).__name__}")
    for name in rules.indexed_names:
        value = getattr(record, name)
        if value and escaped_bytes(value) > INDEXED_TEXT_BYTES:
            limit = f"an indexed column holds at most {INDEXED_TEXT_BYTES:,} bytes (PostgreSQL cannot index more)"
            raise _refused(
                role, record, name, f"takes {escaped_bytes(value):,} bytes; {limit}", f"takes more bytes than {limit}"
            )
    adopted = record.adopted_from
    if adopted is not None and not (type(adopted) is str and _HEX_DIGEST(adopted)):
        rule = "must be a descriptor's SHA-256 (64 hex digits)"
        raise _refused(role, record, "adopted_from", f"{rule}, got {adopted!r}", rule)
    if rules.orientation and record.orientation not in (None, "direct", "reversed"):
        rule = "must be 'direct', 'reversed' or None"
        raise _refused(role, record, "orientation", f"{rule}, got {record.orientation!r}", rule)
    if not isinstance(record.created_at, datetime):
        raise _refused(role, record, "created_at", f"must be a datetime, got {type(record.created_at).__name__}")


def check_row(role: Role, record: Any) -> None:
    """Refuse a row ``put_many`` would refuse, on either backend (the same row, the same error): a record of the
    other table, a value a backend would refuse or change, a key that is not the hash of its input. A dry run
    that takes a write as done asks this of each row it would write."""
    refuse_other_type(role, record)
    check_values(role, record)  # first, as on SQLite's own path
    check_key(role, record)


def plain_values(role: Role, variable: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A Python expression, true only of rows :func:`check_values` passes, over the columns' ``variable`` names.

    It is what generated row code (:mod:`store.backends.sqlite.rows`) runs per row:
    about 40 ns a column, on values already in local variables, against
    about 2 us for a call of :func:`check_values`, which such code calls only
    when the expression is false (to raise its error, or to pass a row the
    expression is too strict for: a ``str`` subclass, a long indexed value
    that still fits). Returns the expression and the names it needs.
    """
    rules = _value_rules(role)
    terms = [f"type({variable['sample_index']}) is int", f"0 <= {variable['sample_index']} <= _max_sample_index"]
    for name in rules.text_names:
        v = variable[name]
        required = name in ("input_text", "completion")
        terms.append(f"type({v}) is str" if required else f"(type({v}) is str or {v} is None)")
    terms += [f"(type({variable[n]}) is dict or {variable[n]} is None)" for n in rules.json_names]
    terms += [f"({variable[n]} is None or len({variable[n]}) <= _safe_chars)" for n in rules.indexed_names]
    terms += [f"{variable['adopted_from']} is None", f"type({variable['created_at']}) is _datetime"]
    if rules.orientation:
        terms.append(f"{variable['orientation']} in _orientations")
    names = {"_max_sample_index": MAX_SAMPLE_INDEX, "_safe_chars": _SAFE_INDEXED_CHARS, "_datetime": datetime,
             "_orientations": frozenset({None, "direct", "reversed"})}  # fmt: skip
    return " and ".join(terms), names


def unwritable(role: Role, record: Any, error: Exception) -> None:
    """Raise the error for a row a column processor refused, naming the column (found by trying each)."""
    table, _, fields, _, _ = table_shape(role)
    column = "a column"
    for name in fields:
        value = getattr(record, name, None)
        try:
            if isinstance(table.c[name].type, JSON) and value is not None:
                jsonvalues.dumps(value)
            elif isinstance(value, datetime) and value.tzinfo is None:
                raise ValueError("naive")
            elif isinstance(value, str):
                value.encode()
        except (ValueError, TypeError):
            column = name
            break
    raise _refused(role, record, column, f"cannot be written ({error})") from error


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
