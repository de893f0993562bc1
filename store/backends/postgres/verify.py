"""Verifying a PostgreSQL store's descriptor schema: its registry row, its state, and every row's input hash.

Contract: :func:`verify_schema` only reads, and never raises for a bad
schema: a registry row that does not match its descriptor, a schema that is
not current, a table or column another tool removed, a value that does not
decode, a row whose input hash is wrong (:class:`~store.reports.RowChecks`)
each become a :class:`~store.reports.Problem` of its
:class:`~store.reports.DatabaseVerification`. The rows are read in a
transaction of their own, so a failure there ends only that part; a value
that does not decode makes a second scan, value by value, name each such
row by its key and check the others.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Connection, Integer, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeEngine

from store.backends.postgres import text as pgtext
from store.backends.postgres.registry import quoted, schema_name, schema_options
from store.backends.postgres.rows import PostgresRepository
from store.backends.postgres.status import NO_TABLES, SchemaHost, classify
from store.backends.postgres.survey import SCHEMA_TABLES
from store.errors import DamagedValueError, JudgestoreError, MetadataMismatchError, ServerError, ServerSchemaError
from store.layout import Location
from store.reports import DatabaseVerification, Problem, ProblemKind, RowChecks
from store.repository import STREAM_PARTITION
from store.schema import USABLE_STATES, DatabaseState, missing_parts, status_error
from store.tables.filters import RowFilter
from store.tables.models import SCHEMA_REVISION, UTCDateTime
from store.tables.row_checks import table_shape


def verify_schema(storage: SchemaHost, location: Location) -> DatabaseVerification:
    """Registry row, schema state, and every row's input hash; never raises for a bad schema."""
    where = storage.location_where(location)
    problems: list[Problem] = []
    checked = adopted = 0
    try:
        with storage.connection() as conn:
            try:
                storage.metadata(conn, location)
            except MetadataMismatchError as e:
                problems.append(Problem(e.where, ProblemKind.METADATA, str(e)))
                named = {"n": schema_name(location)}
                if conn.execute(text("SELECT to_regnamespace(:n)"), named).scalar() is None:
                    # a registry row edited to name another location: no schema of its own, no rows lost
                    return DatabaseVerification(location, where, 0, tuple(problems), 0)
            status = classify(conn, location)
            current = status.state is DatabaseState.CURRENT
            altered = _schema_problems(conn, location, where, status.revision) if current else []
        if status.state is DatabaseState.EMPTY:  # created with its tables in one transaction: they were dropped
            problems.append(Problem(where, ProblemKind.SCHEMA, f"{where} {NO_TABLES}; its rows are gone"))
        elif status.state not in USABLE_STATES:
            problems.append(Problem(where, ProblemKind.SCHEMA, str(status_error(status, where))))
        elif altered:  # rows read through another type would mislead: the schema is the problem
            problems += altered
        elif status.state is DatabaseState.CURRENT:
            checked, found, adopted = _verify_rows(storage, location, where)
            problems += found
    except JudgestoreError as e:
        problems.append(Problem(where, ProblemKind.FILE, str(e)))
    return DatabaseVerification(location, where, checked, tuple(problems), adopted)


# The server's name (pg_type's typname, information_schema's udt_name) of each type the models declare, by its SQL
# name.
_SERVER_TYPES = {"VARCHAR": "varchar", "TEXT": "text", "INTEGER": "int4", "BIGINT": "int8", "FLOAT": "float8",
                 "TIMESTAMP": "timestamp", "JSON": "json", "BOOLEAN": "bool"}  # fmt: skip


def _schema_problems(conn: Connection, location: Location, where: str, revision: str | None) -> list[Problem]:
    """At the models' revision, a table or column they declare that the schema lacks; at any, a column of the role's
    table whose type is not the one they declare (another tool altered it). One query over the schema's columns.

    The tables are looked up by name (``to_regclass``, as :meth:`PostgresStorage.size_of` does): selecting a
    schema's columns by schema (information_schema.columns, or pg_class by namespace) has no index and read every
    column of every schema, so verify grew with the square of the schemas (8.7 ms a call at 1,000, 20.8 at 3,000).
    """
    columns = (
        "SELECT c.relname, a.attname, ty.typname FROM unnest(CAST(:tables AS text[])) AS n(t) "
        "JOIN pg_catalog.pg_class c ON c.oid = to_regclass(format('%I.%I', CAST(:s AS text), n.t)) "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid"
    )
    held: dict[str, dict[str, str]] = {}
    listed = conn.execute(text(columns), {"s": schema_name(location), "tables": list(SCHEMA_TABLES)})
    for table_name, name, kind in listed:
        held.setdefault(str(table_name), {})[str(name)] = str(kind)
    lacking = missing_parts(held) if revision == SCHEMA_REVISION else None
    if lacking is not None:
        return [Problem(where, ProblemKind.SCHEMA, f"{where} {lacking}")]
    table = table_shape(location.role)[0]
    problems = []
    for column in table.c:
        declared = column.type.compile(dialect=postgresql.dialect()).split("(")[0].split()[0]
        expected = _SERVER_TYPES.get(declared)
        found = held.get(table.name, {}).get(column.name, expected)
        if expected is not None and found != expected:
            problems.append(
                Problem(
                    where,
                    ProblemKind.SCHEMA,
                    f"{table.name}.{column.name} is {found}, not the {expected} its schema "
                    "revision declares: another tool altered it. Restore the schema (or copy the store elsewhere)",
                )
            )
    return problems


def _verify_rows(storage: SchemaHost, location: Location, where: str) -> tuple[int, list[Problem], int]:
    """Every row's input hash, and the adopted rows counted; a table another tool changed is a problem."""
    checks = RowChecks(where, location)
    try:
        with storage.connection() as conn:  # its own transaction: a failure here ends only this one
            repo = PostgresRepository(conn.execution_options(**schema_options(location)), location.role)
            for record in repo.query():
                checks.hashed(record.input_hash, record.sample_index, record.input_text)
            adopted = repo.count(RowFilter(adopted=True))
    except ServerSchemaError as e:  # a table or column its revision promises is missing
        return checks.checked, [Problem(where, ProblemKind.SCHEMA, str(e))], 0
    except ServerError as e:  # the server failed (gone, busy): reading again would meet it again
        return checks.checked, [Problem(where, ProblemKind.FILE, f"{type(e).__name__}: {e}")], 0
    except (DamagedValueError, ValueError) as e:  # ValueError: JSON that does not decode
        checked, problems = _raw_row_problems(storage, location, where)
        if not problems:  # the scan value by value read every row: say what the first scan met
            problems = [Problem(where, ProblemKind.FILE, f"{type(e).__name__}: {e}")]
        return checked, problems, 0
    checked, problems = checks.result()
    return checked, problems, adopted


def _raw_row_problems(storage: SchemaHost, location: Location, where: str) -> tuple[int, list[Problem]]:
    """The row scan again, every value fetched as text and read here: names the rows whose values their columns'
    types cannot read (JSON that does not decode, a time Python has no date for: another tool wrote them) by their
    key, and hashes the others."""
    checks = RowChecks(where, location)
    table = table_shape(location.role)[0]
    readers = {column.name: _text_reader(column.type) for column in table.c}
    columns = ", ".join(f"{quoted(column.name)}::text" for column in table.c)
    statement = f"SELECT ctid::text, {columns} FROM {quoted(schema_name(location))}.{quoted(table.name)}"
    with storage.connection() as conn:
        for ctid, *values in conn.execution_options(yield_per=STREAM_PARTITION).execute(text(statement)):
            row: dict[str, Any] = {}
            unreadable = []
            for name, value in zip(readers, values, strict=True):
                try:
                    row[name] = None if value is None else readers[name](value)
                except (ValueError, TypeError, OverflowError):
                    unreadable.append(name)
            key = row.get("input_hash")
            if unreadable or not isinstance(key, str):
                checks.damaged(key, f"ctid {ctid}", [], unreadable or ["input_hash"])
            else:
                checks.hashed(key, row["sample_index"], row["input_text"])
    return checks.result()


def _text_reader(kind: TypeEngine[Any]) -> Callable[[str], Any]:
    """What reads a column of type ``kind`` from the server's text of it, failing where the store's reader would."""
    if isinstance(kind, JSON):
        return pgtext.loads_json
    if isinstance(kind, UTCDateTime):
        return datetime.fromisoformat  # the server's text of a timestamp; 'infinity' and years past 9999 fail
    if isinstance(kind, Integer):
        return int
    return pgtext.unescape  # text, as the store escapes it
