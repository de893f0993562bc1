"""Verifying a PostgreSQL store's descriptor schema: its registry row, its state, and every row's input hash.

Contract: :func:`verify_schema` only reads, and never raises for a bad
schema: a registry row that does not match its descriptor, a schema that is
not current, a table or column another tool removed, a value that does not
decode, a row whose input hash is wrong (:class:`~store.reports.RowChecks`)
each become a :class:`~store.reports.Problem` of its
:class:`~store.reports.DatabaseVerification`. The rows are read in a
transaction of their own, so a failure there ends only that part.
"""

from __future__ import annotations

from store.backends.postgres.registry import schema_options
from store.backends.postgres.rows import PostgresRepository
from store.backends.postgres.status import SchemaHost, classify
from store.errors import JudgestoreError, MetadataMismatchError, ServerError, ServerSchemaError
from store.layout import Location
from store.reports import DatabaseVerification, Problem, ProblemKind, RowChecks
from store.schema import USABLE_STATES, DatabaseState, status_error
from store.tables.filters import RowFilter


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
            status = classify(conn, location)
        if status.state not in USABLE_STATES:
            problems.append(Problem(where, ProblemKind.SCHEMA, str(status_error(status, where))))
        elif status.state is DatabaseState.CURRENT:
            checked, found, adopted = _verify_rows(storage, location, where)
            problems += found
    except JudgestoreError as e:
        problems.append(Problem(where, ProblemKind.FILE, str(e)))
    return DatabaseVerification(location, where, checked, tuple(problems), adopted)


def _verify_rows(storage: SchemaHost, location: Location, where: str) -> tuple[int, list[Problem], int]:
    """Every row's input hash, and the adopted rows counted; a table another tool changed is a problem."""
    checks = RowChecks(where)
    try:
        with storage.connection() as conn:  # its own transaction: a failure here ends only this one
            repo = PostgresRepository(conn.execution_options(**schema_options(location)), location.role)
            for record in repo.query():
                checks.hashed(record.input_hash, record.sample_index, record.input_text)
            adopted = repo.count(RowFilter(adopted=True))
    except ServerSchemaError as e:  # a table or column its revision promises is missing
        return checks.checked, [Problem(where, ProblemKind.SCHEMA, str(e))], 0
    except (ServerError, ValueError) as e:  # a JSON value that does not decode (InvalidInputError is one)
        return checks.checked, [Problem(where, ProblemKind.FILE, f"{type(e).__name__}: {e}")], 0
    checked, problems = checks.result()
    return checked, problems, adopted
