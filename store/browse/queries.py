"""Every statement the browser runs: keyset pages, bounded scans, a battle's rows, a judge's rows, a row's runs.

Contract:

* Statements are SQLAlchemy Core over the models' tables (:attr:`Repository.table`),
  composed with the store's own filter clauses (:meth:`Repository.clauses`),
  and run inside :meth:`Database.reading`: a read transaction (read-only on
  PostgreSQL; on a read-only SQLite store, a connection that writes no byte).
  Nothing here names a dialect: the two things the backends do their own
  way are the repository's (:meth:`Repository.contains_text`, ``instr`` or
  a regular expression, and :meth:`Repository.in_listing_order`, below).
* Rows are listed by ``created_at`` (newest or oldest first), ties broken by
  the database and then the input hash: a :class:`Key`. A page is the rows
  after a key (*keyset pagination*): each database answers with an index
  range read of ``limit + 1`` rows, whatever the page number.
* Filters on indexed columns (benchmark/instruction, model, model A/B,
  judge, run id, dates, hashes, adoption) narrow the statement. When such a
  filter matches many rows, SQLite's planner (which has no statistics in a
  store's files) would still read every matching row through that index to
  sort them, seconds at a million rows; so there the repository writes the
  filter so that no index serves it, and the statement reads the
  ``created_at`` index in order and stops after a page. PostgreSQL's planner
  decides from its statistics.
  An instruction id without a benchmark is looked up under each benchmark
  the table holds (its index leads with the benchmark), found by a loose
  index scan.
* Filters on columns without an index (orientation, finish reason) and the
  full-text search are *scanned*: each request reads at most
  :data:`SCAN_WINDOW` rows of the indexed selection past the cursor, in
  listing order, and returns the matches among them with the key it scanned
  to (:attr:`Slice.scanned_to`), from which the next request goes on. A
  search for a rare word in a million rows is many short requests, never
  one of seconds. Its cost: each window reads its rows' text (no index
  serves the search), about 15 ms per 1,000 rows of a few KB on SQLite
  (``bench/browse_bench.py``); a prompt that holds the search text in its
  JSON is then read message by message (:meth:`Repository.contains_text`),
  which costs about 3 times that.
* Only what a page shows is read: the first :data:`PROMPT_PREFIX` characters
  of the input and :data:`COMPLETION_PREFIX` of the completion (a
  completion may be megabytes), and the logprobs of judgements only. On
  SQLite, whose text functions stop at a U+0000, a completion holding one
  is read as bytes instead (at most 4 per character of the prefix).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import orjson
from sqlalchemy import (
    ColumnElement,
    LargeBinary,
    String,
    Table,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.types import NullType

from store.backend import Database
from store.backends.postgres.text import ESCAPE
from store.errors import InvalidInputError
from store.layout import Location
from store.tables.filters import RowFilter
from store.tables.models import Run
from store.tables.records import Record

if TYPE_CHECKING:  # what Database.reading() yields; only its public face (table, conn, clauses) is used
    from store.repository import Repository

Order = Literal["newest", "oldest"]
ORDERS: tuple[Order, ...] = ("newest", "oldest")
SCAN_WINDOW = 5_000  # rows a scanned filter or a search reads per window, per database
PROMPT_PREFIX = 600  # characters of the rendered input a rows page reads (the first message's start)
COMPLETION_PREFIX = 400
# Row filters whose columns have no index: applied within the scan window (see the module docstring).
SCANNED_FILTERS = ("orientation", "finish_reasons", "empty", "error", "created_by")
_BEFORE_EVERY_HASH, _AFTER_EVERY_HASH = "", "g"  # input hashes are lowercase hex


@dataclass(frozen=True, slots=True, order=True)
class Key:
    """A row's place in the listing order: its creation time, then its database, then its input hash."""

    created_at: datetime
    database: str
    input_hash: str

    def token(self) -> str:
        """The key as a URL's cursor (``after=``)."""
        raw = orjson.dumps([self.created_at.isoformat(), self.database, self.input_hash])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def from_token(cls, token: str) -> Key:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            created_at, database, input_hash = orjson.loads(raw)
            when = datetime.fromisoformat(created_at)
            if when.tzinfo is None:
                raise InvalidInputError(f"the page cursor {token[:40]!r} has no time zone; start again")
            when.astimezone(UTC)  # a time whose UTC is beyond the calendar (0001-01-01+23:59) is no stored one
            return cls(when, str(database), str(input_hash))
        except InvalidInputError:
            raise
        except (binascii.Error, ValueError, TypeError, OverflowError) as e:
            raise InvalidInputError(f"the page cursor {token[:40]!r} is not one this browser made; start again") from e


@dataclass(frozen=True, slots=True)
class Listed:
    """One row as a rows page shows it (``prompt`` and ``completion`` are the first characters)."""

    key: Key
    location: Location
    sample_index: int
    benchmark: str | None
    instruction_id: str | None
    finish_reason: str | None
    run_id: str | None
    adopted_from: str | None
    prompt: str
    completion: str
    completion_chars: int  # at least this many (exact unless a SQLite text holds U+0000 beyond the prefix)
    model: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    judge: str | None = None
    orientation: str | None = None
    top_logprobs: dict[str, Any] | None = None

    @property
    def input_hash(self) -> str:
        return self.key.input_hash


@dataclass(frozen=True, slots=True)
class Slice:
    """One database's part of a page: up to ``limit + 1`` rows in listing order.

    ``scanned_to`` is set when a scan window ended before the rows ran out
    and before ``limit + 1`` matches were found: every row at or before it
    (in listing order) was read; those after it were not.
    """

    rows: list[Listed]
    scanned_to: Key | None = None


def split_filter(flt: RowFilter) -> tuple[RowFilter, RowFilter, RowFilter]:
    """``flt`` as its time range, its other indexed filters, and its scanned filters (:data:`SCANNED_FILTERS`)."""
    times = RowFilter(created_after=flt.created_after, created_before=flt.created_before)
    scanned = RowFilter(**{name: getattr(flt, name) for name in SCANNED_FILTERS})
    others = dataclasses.replace(flt, created_after=None, created_before=None, **dict.fromkeys(SCANNED_FILTERS))
    return times, others, scanned


def _benchmarks(repo: Repository) -> list[str]:
    """The distinct benchmarks of the table, one index seek each (a loose index scan, not a read of every row)."""
    b = repo.table.c.benchmark
    seen = select(func.min(b).label("value")).cte("seen", recursive=True)
    following = select(select(func.min(b)).where(b > seen.c.value).scalar_subquery())
    seen = seen.union_all(following.where(seen.c.value.is_not(None)))
    return [value for (value,) in repo.conn.execute(select(seen.c.value).where(seen.c.value.is_not(None)))]


def _indexed(repo: Repository, flt: RowFilter) -> list[ColumnElement[bool]]:
    """The clauses of ``flt`` (indexed columns only), each able to use its index.

    The index of instruction ids leads with the benchmark: an instruction id
    alone is looked up under every benchmark the table holds (and none).
    """
    if flt.instruction_id is None or flt.benchmark is not None:
        return repo.clauses(flt)
    t = repo.table
    instruction = t.c.instruction_id == flt.instruction_id
    clauses = repo.clauses(dataclasses.replace(flt, instruction_id=None))
    known = _benchmarks(repo)
    in_any = or_(and_(t.c.benchmark.in_(known), instruction), and_(t.c.benchmark.is_(None), instruction))
    return [*clauses, in_any if known else and_(t.c.benchmark.is_(None), instruction)]


def _after(t: Table, database: str, key: Key, order: Order) -> ColumnElement[bool]:
    """The rows of ``database`` after ``key`` in listing order (``database`` is constant within a table)."""
    at, input_hash = t.c.created_at, t.c.input_hash
    if order == "newest":
        if database < key.database:
            return at <= key.created_at
        if database > key.database:
            return at < key.created_at
        return and_(at <= key.created_at, or_(at < key.created_at, input_hash < key.input_hash))
    if database > key.database:
        return at >= key.created_at
    if database < key.database:
        return at > key.created_at
    return and_(at >= key.created_at, or_(at > key.created_at, input_hash > key.input_hash))


def _order_by(t: Table, order: Order) -> tuple[Any, ...]:
    if order == "newest":
        return (t.c.created_at.desc(), t.c.input_hash.desc())
    return (t.c.created_at.asc(), t.c.input_hash.asc())


@functools.cache  # the same few, built once: a rows page asks for them of every database it reads
def _listing_columns(t: Table, dialect: str) -> tuple[Any, ...]:
    c = t.c
    columns = [
        c.input_hash,
        c.created_at,
        c.sample_index,
        c.benchmark,
        c.instruction_id,
        c.finish_reason,
        c.run_id,
        c.adopted_from,
        # type_coerce: the column's type reads the value back as stored (a server escapes U+0000)
        type_coerce(func.substr(c.input_text, 1, PROMPT_PREFIX), c.input_text.type).label("prompt"),
        *_completion_prefix(t, dialect),
    ]
    if t.name == "judgements":
        columns += [c.model_a, c.model_b, c.judge, c.orientation, c.top_logprobs]
    else:
        columns.append(c.model)
    return tuple(columns)


def _completion_prefix(t: Table, dialect: str) -> list[Any]:
    """The columns ``completion`` (its first :data:`COMPLETION_PREFIX` characters, or more: :func:`_listed` cuts
    it) and ``completion_chars`` (its length), each as the backend can read them when the text holds U+0000.

    A server keeps U+0000 and U+FDD0 as two characters (:mod:`store.backends.postgres.text`): twice the prefix is
    read, and the length leaves out the escape character of each pair. SQLite's ``substr`` and ``length`` stop
    at a U+0000: there a completion holding one is read as its first bytes (at most 4 a character; bytes, which
    :func:`_listed` decodes) and its byte count (negative, to tell it apart).
    """
    text = t.c.completion
    if dialect == "postgresql":
        unpaired = func.replace(text, literal(ESCAPE, String()), "")
        return [
            type_coerce(func.substr(text, 1, 2 * COMPLETION_PREFIX), text.type).label("completion"),
            func.length(unpaired).label("completion_chars"),
        ]
    prefix = type_coerce(func.substr(text, 1, COMPLETION_PREFIX), text.type)
    raw = cast(text, LargeBinary)
    holds_nul = func.instr(raw, b"\x00") > 0
    return [
        type_coerce(case((holds_nul, func.substr(raw, 1, 4 * COMPLETION_PREFIX)), else_=prefix), NullType).label(
            "completion"
        ),
        case((holds_nul, -func.length(raw)), else_=func.length(text)).label("completion_chars"),
    ]


def page(
    database: Database,
    name: str,
    flt: RowFilter,
    *,
    search: str | None = None,
    order: Order = "newest",
    after: Key | None = None,
    limit: int = 50,
) -> Slice:
    """Up to ``limit + 1`` rows of ``database`` (called ``name`` in keys) after ``after`` (see the module docstring)."""
    times, others, scanned_flt = split_filter(flt)
    with database.reading() as repo:
        t = repo.table
        where = [*repo.clauses(times), *repo.in_listing_order(_indexed(repo, others))]
        scanned = repo.clauses(scanned_flt)
        if search:
            scanned.append(repo.contains_text(search))
        if after is not None:
            where.append(_after(t, name, after, order))
        end = None
        if scanned:
            at = t.c.created_at
            last = select(at).where(*where).order_by(at.desc() if order == "newest" else at.asc())
            end = repo.conn.execute(last.offset(SCAN_WINDOW - 1).limit(1)).scalar_one_or_none()
            if end is not None:  # the window ends there: the rows of that instant are read whole
                where.append(at >= end if order == "newest" else at <= end)
        columns = _listing_columns(t, repo.conn.dialect.name)
        stmt = select(*columns).where(*where, *scanned).order_by(*_order_by(t, order)).limit(limit + 1)
        found = repo.conn.execute(stmt).mappings().all()
    rows = [_listed(database.location, name, row) for row in found]
    if end is None or len(rows) > limit:
        return Slice(rows)
    return Slice(rows, Key(end, name, _BEFORE_EVERY_HASH if order == "newest" else _AFTER_EVERY_HASH))


def created_span(database: Database) -> tuple[datetime, datetime] | None:
    """The oldest and the newest ``created_at`` of the database's rows (None: no row), two index seeks: one
    statement of two scalar subqueries, as SQLite reads ``min`` or ``max`` from the index only when alone."""
    with database.reading() as repo:
        at = repo.table.c.created_at
        oldest, newest = repo.conn.execute(
            select(select(func.min(at)).scalar_subquery(), select(func.max(at)).scalar_subquery())
        ).one()
    return None if oldest is None else (oldest, newest)


def _listed(location: Location, name: str, row: Any) -> Listed:
    values = dict(row)
    if isinstance(values["completion"], bytes):  # SQLite, a text holding U+0000 (see _completion_prefix)
        read, size = values["completion"], -values["completion_chars"]
        text = read.decode("utf-8", "ignore")  # the read may end inside a character: that one is dropped
        # A character is at most 4 bytes: a text of more bytes than were read has more than ``size / 4`` chars.
        values["completion"] = text
        values["completion_chars"] = len(text) if size <= len(read) else max(len(text), -(-size // 4))
    values["completion"] = values["completion"][:COMPLETION_PREFIX]
    key = Key(values.pop("created_at"), name, values.pop("input_hash"))
    return Listed(key=key, location=location, **values)


# ---------------------------------------------------------------- one instruction, one judge, one row


def instruction_rows(
    database: Database, benchmark: str | None, instruction_id: str, *, model: str | None = None
) -> list[Record]:
    """Every row of one instruction (of ``model``, if given); a ``benchmark`` of None means rows without one.

    The rows are found through the benchmark/instruction index alone; the model is checked on the few found
    (SQLite's planner, without statistics, would take the model's index: every row of the model).
    """
    with database.reading() as repo:
        t = repo.table
        same = t.c.benchmark == benchmark if benchmark is not None else t.c.benchmark.is_(None)
        models = [t.c[name] for name in ("model", "model_a", "model_b") if name in t.c]
        stmt = select(t.c.input_hash, *models).where(same, t.c.instruction_id == instruction_id)
        hashes = [h for h, *named in repo.conn.execute(stmt).all() if model is None or model in named]
    found = database.get_many(hashes, deferred=False)
    return sorted(found.values(), key=lambda record: (record.created_at, record.input_hash))


@dataclass(frozen=True, slots=True)
class JudgeRow:
    """What a judge's figures read of one of its rows."""

    benchmark: str | None
    instruction_id: str | None
    sample_index: int
    model_a: str | None
    model_b: str | None
    orientation: str | None
    completion: str
    top_logprobs: dict[str, Any] | None
    created_at: datetime


def judge_rows(database: Database, judge: str, limit: int) -> list[JudgeRow]:
    """The newest ``limit`` rows of ``judge`` in a judgements database."""
    with database.reading() as repo:
        t = repo.table
        where = repo.in_listing_order(repo.clauses(RowFilter(judge=judge)))
        columns = [t.c[f.name] for f in dataclasses.fields(JudgeRow)]
        stmt = select(*columns).where(*where).order_by(*_order_by(t, "newest")).limit(limit)
        return [JudgeRow(*row) for row in repo.conn.execute(stmt).all()]


def judges(database: Database) -> dict[str, int]:
    """Rows per judge in a judgements database (read through the judge index)."""
    with database.reading() as repo:
        t = repo.table
        stmt = select(t.c.judge, func.count()).where(t.c.judge.is_not(None)).group_by(t.c.judge)
        return {judge: int(n) for judge, n in repo.conn.execute(stmt).all()}


def finish_reasons(database: Database) -> dict[str | None, int]:
    """Rows per finish reason (a full read of the table: no index holds it)."""
    with database.reading() as repo:
        return {group.key: group.rows for group in repo.groups("finish_reason")}


RUN_COLUMNS = ("id", "run_id", "created_by", "started_at", "finished_at", "mode", "requested", "hits", "misses",
               "rows_written")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunLine:
    """A recorded run, as a row's page lists it."""

    id: int
    run_id: str | None
    created_by: str | None
    started_at: datetime
    finished_at: datetime
    mode: str
    requested: int
    hits: int
    misses: int
    rows_written: int


def runs_of_row(database: Database, run_id: str | None, created_at: datetime, limit: int = 20) -> tuple[
    list[RunLine], list[RunLine]
]:  # fmt: skip
    """The recorded runs with the row's run id (which wrote it), and the later runs that hit something.

    Runs record counts, not keys: a later run with hits may have hit this row, or others.
    """
    runs: Table = Run.__table__  # type: ignore[assignment]
    columns = [runs.c[name] for name in RUN_COLUMNS]
    with database.reading() as repo:
        wrote: list[RunLine] = []
        if run_id is not None:
            stmt = select(*columns).where(runs.c.run_id == run_id).order_by(runs.c.started_at).limit(limit)
            wrote = [RunLine(*row) for row in repo.conn.execute(stmt).all()]
        later = (
            select(*columns)
            .where(runs.c.finished_at >= created_at, runs.c.hits > 0)
            .order_by(runs.c.started_at.desc())
            .limit(limit)
        )
        hit = [RunLine(*row) for row in repo.conn.execute(later).all()]
    return wrote, hit
