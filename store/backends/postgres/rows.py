"""PostgreSQL's repository: the bulk lookup over one array parameter and the insert in psycopg's pipeline.

Contract:

* :class:`PostgresRepository` is :class:`~store.repository.Repository` on a
  server's connection: keys are looked up with ``= ANY(:keys)`` (one array
  parameter per :data:`ARRAY_BATCH` keys; faster than a join against
  ``unnest``), rows inserted by :func:`postgres_insert`, every row first
  passing the checks both backends share (:mod:`store.tables.row_checks`).
* :func:`postgres_insert` is one role's ``INSERT ... ON CONFLICT`` for a
  connection's schema, as SQL for psycopg's executemany (pipeline mode: one
  round trip for a batch, as fast as ``COPY``, see ``bench/pg_bench.py``)
  with the bind processors SQLAlchemy would apply.
* :class:`PostgresClaimTable` is PostgreSQL's side of the claims table
  (:mod:`store.claims`): claimers on many nodes pick their blocks with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` (a row another claimer's transaction
  holds is skipped, not waited for: PostgreSQL's work-queue idiom); leases
  are measured by the server's ``now()``, so nodes whose clocks differ still
  agree on a deadline; keys are one array parameter, as in the lookup.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    ColumnElement,
    Connection,
    Insert,
    Numeric,
    Select,
    String,
    Text,
    any_,
    bindparam,
    case,
    cast,
    func,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError, StatementError

from store.backends.postgres import text as pgtext
from store.claim_table import CLAIMS, ClaimTable
from store.errors import InvalidInputError
from store.repository import BLANK, Repository, json_escaped
from store.roles import Role
from store.tables.deferred import DeferredColumns, looked_up
from store.tables.records import Record
from store.tables.row_checks import (
    OnConflict,
    check_on_conflict,
    gc_paused,
    insert_statement,
    not_unicode,
    table_shape,
    unwritable,
)

ARRAY_BATCH = 20_000  # PostgreSQL: keys per `= ANY(:keys)` array parameter
# One token of a JSON string as the server stores it (a regular expression): a character that is no quote,
# backslash or server escape; a server escape pair (store.backends.postgres.text); \uXXXX; another escape.
_JSON_STRING_TOKENS = rf'(?:[^"\\{pgtext.ESCAPE}]|{pgtext.ESCAPE}.|\\u[0-9a-fA-F]{{4}}|\\[^u])*'


def _json_text(value: Any) -> str | None:
    return None if value is None else pgtext.dumps_json(value)


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
        table, _, fields, _, _ = table_shape(role)
        schema = {"schema_translate_map": translate, "render_schema_translate": True} if translate else {}
        compiled = insert_statement(role, on_conflict, postgresql).compile(
            dialect=dialect, column_keys=list(fields), **schema
        )
        if compiled.positional or sorted(compiled.binds) != sorted(fields):
            raise AssertionError(f"unexpected insert parameters {sorted(compiled.binds)}")
        processors = []
        for name in fields:
            process: Callable[[Any], Any] | None = table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            if isinstance(table.c[name].type, JSON):
                # Serialized here, not when psycopg sends the row (SQLAlchemy's processor wraps the value for
                # psycopg's own dumper): a value JSON cannot carry is then refused before anything is sent, naming
                # the row and the column as on SQLite. The text goes to the json column as an untyped literal; it is
                # what the engine's serializer writes (store.backends.postgres.connections.create_postgres_engine).
                process = _json_text
            if process is not None:
                processors.append((name, process))
        plan = _POSTGRES_INSERTS[key] = (str(compiled), tuple(processors))
    return plan


@functools.cache
def lookup_statement(role: Role, lean: bool = False) -> Select[Any]:
    """The bulk key lookup of ``role`` (``= ANY(:keys)``): one statement and one plan, whatever the number of keys;
    ``lean`` leaves the deferred columns out (:mod:`store.tables.deferred`)."""
    from sqlalchemy.dialects import postgresql  # here: a SQLite store never imports the PostgreSQL dialect

    table, _, _, columns, _ = table_shape(role)
    keys = bindparam("keys", type_=postgresql.ARRAY(String))
    return select(*looked_up(columns, lean)).where(table.c.input_hash == any_(keys))


class PostgresRepository(Repository):
    """The rows of one role's table in one descriptor schema (see the module docstring)."""

    def _get_many(self, keys: list[str], deferred: DeferredColumns | None) -> dict[str, Record]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, Record] = {}
        stmt = lookup_statement(self.role, deferred is not None)
        # The GC stays paused while rows are fetched too: the JSON columns are decoded into many
        # small dicts as the rows are built, and every collection would rescan all of them.
        with gc_paused():
            for start in range(0, len(keys), ARRAY_BATCH):
                rows = self.conn.execute(stmt, {"keys": keys[start : start + ARRAY_BATCH]}).all()
                records = self._records(rows) if deferred is None else self._lean_records(rows, deferred)
                for record in records:
                    found[record.input_hash] = record
        if deferred is not None:
            deferred.keys = list(found)
        return found

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        check_on_conflict(on_conflict)
        sql, processors = postgres_insert(self.conn, self.role, on_conflict)
        dicts: list[dict[str, Any]] = []
        try:
            for record in self._checked(records):
                row = dict(zip(self._fields, self._values_of(record), strict=True))
                try:
                    for name, process in processors:
                        row[name] = process(row[name])
                except Exception as e:  # what SQLAlchemy reports as a StatementError: e.g. a naive created_at
                    unwritable(self.role, record, e)
                dicts.append(row)
            if not dicts:
                return 0
            # psycopg's executemany (pipeline mode), whose rowcount is the sum of the rows written.
            result = self.conn.exec_driver_sql(sql, dicts)
        except UnicodeEncodeError as e:  # the driver encodes text as it binds it: found before any commit
            raise not_unicode(self.role, self._fields, dicts) from e
        except StatementError as e:
            if isinstance(e, DBAPIError):  # every driver error: the database's retry and translation handle it
                raise
            raise InvalidInputError(f"{self.role} row cannot be written: {e.orig}") from e
        return max(result.rowcount, 0)

    def _byte_length(self, column: Any) -> Any:
        # The text as stored, escaped (store.backends.postgres.text): a U+0000 counts 3 bytes more than a folder
        # store's (2 fewer in JSON), a U+FDD0 1 more. octet_length reads a value's header, a compressed value's
        # too; the unescaped size would read every value (its search for U+FDD0 alone made the totals of 100,000
        # rows of ~9 KB 8x slower, README "Every value a folder keeps").
        text = column if isinstance(column.type, Text | String) else cast(column, Text)
        return func.coalesce(func.octet_length(text), 0)

    def _blank(self, column: Any) -> ColumnElement[bool]:
        return func.btrim(column, BLANK) == ""  # PostgreSQL's trim() takes FROM; btrim takes the characters

    def _json_number(self, column: Any, key: str) -> Any:
        # numeric, not integer or float: a 64-bit count or a fraction is summed exactly, never refused
        return case((func.json_typeof(column[key]) == "number", cast(column[key].as_string(), Numeric)))

    def _holds(self, column: Any, text: str) -> ColumnElement[bool]:
        # The server keeps text escaped (U+0000 as U+FDD0 "0", U+FDD0 as U+FDD0 "1", store.backends.postgres.text):
        # the escaped text is looked for in the escaped column anywhere but right after an escape character,
        # where it would match the "0" or "1" of a pair. Under the "C" collation ~* folds ASCII letters only
        # (ILIKE and lower() fold others too under the server's locale), and it is the fastest of them (0.5x
        # of ILIKE). The pattern is bound as plain text: it is escaped here, not by the column's type.
        # (re.escape puts a backslash before punctuation only, which a PostgreSQL regular expression reads as
        # that character too.)
        pattern = "(^|[^" + pgtext.ESCAPE + "])" + re.escape(pgtext.escape(text))
        return column.collate("C").regexp_match(bindparam(None, pattern, Text()), flags="i")

    def _says(self, column: Any, kind: Literal["messages", "text"], text: str) -> ColumnElement[bool]:
        # Not through json: PostgreSQL 15 cannot ask whether a text is JSON without failing the statement on one
        # that is not, and its JSON functions fail on a string holding \u0000. The canonical JSON is read by
        # one regular expression instead (as _holds reads text): from the opening quote of a message's content
        # (or of the text), whole tokens of a JSON string (_JSON_STRING_TOKENS), then the search text spelled as
        # the JSON spells it, escaped as the server escapes it. A string ends at an unescaped quote, which no
        # token matches: a match lies within one string and begins at a token, never inside an escape sequence.
        # Only a message's content opens with "content":" (a quote inside a string is escaped).
        opening = '"content":"' if kind == "messages" else r'^\{"text":"'
        pattern = opening + _JSON_STRING_TOKENS + re.escape(pgtext.escape(json_escaped(text)))
        return column.collate("C").regexp_match(bindparam(None, pattern, Text()), flags="i")


class PostgresClaimTable(ClaimTable):
    def now(self) -> datetime:
        # The server's clock as it reads now, not when the transaction began (now()): a write transaction waits for
        # its schema's write lock first, and a renewal measured from before that wait would end already expired.
        value: datetime = self.conn.execute(select(func.clock_timestamp())).scalar_one()
        return value.astimezone(UTC)

    def _keys_in(self, column: Any) -> ColumnElement[bool]:
        return column == any_(bindparam("keys", type_=postgresql.ARRAY(String)))  # type: ignore[no-any-return]

    def _keys(self, keys: Sequence[str]) -> Any:
        return list(keys)

    def _insert_ignoring(self) -> Insert:
        return postgresql.insert(CLAIMS).on_conflict_do_nothing()

    def _locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True, of=CLAIMS)
