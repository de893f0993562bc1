"""A descriptor schema's state on a PostgreSQL server, and what ``judgestore ls`` / ``db status`` report of it.

Contract:

* :func:`classify` tells a schema's state with one SELECT of its version
  table when it has one (a savepoint guards the miss, so the caller's
  transaction goes on): current, behind, ahead, foreign (tables but no
  version) or empty, against :func:`known_revisions` (this library's line of
  migration scripts, or another given one).
* :func:`schema_info` reads one schema (registry row, state, claims and rows
  when current, size) read-only and never raises for a bad schema: what is
  wrong is its :class:`~store.reports.DatabaseInfo`'s state and error.
  :func:`schema_infos` does it for many schemas in a few statements
  (:mod:`store.backends.postgres.survey`), falling back to
  :func:`schema_info` for any schema the survey cannot read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

from sqlalchemy import Column, Connection, MetaData, String, Table, inspect, select
from sqlalchemy.exc import DBAPIError

from store.backends.postgres.registry import schema_name, schema_options
from store.backends.postgres.rows import PostgresClaimTable, PostgresRepository
from store.backends.postgres.survey import EXISTS_BATCH, claims_of, survey
from store.errors import JudgestoreError, MetadataMismatchError
from store.layout import Location
from store.reports import DatabaseInfo
from store.schema import VERSION_TABLE, DatabaseState, Revisions, SchemaStatus, revisions_of, status_error

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from alembic.script import ScriptDirectory

    from store.layout import StoredMetadata
    from store.settings import Settings

T = TypeVar("T")


class SchemaHost(Protocol):
    """What reading, upgrading and verifying one schema need of the server's storage
    (:class:`~store.backends.postgres.storage.PostgresStorage`)."""

    url: str  # the server as errors name it
    settings: Settings

    def connection(self, *, write: bool = False) -> AbstractContextManager[Connection]: ...
    def location_where(self, location: Location) -> str: ...
    def metadata(self, conn: Connection, location: Location) -> StoredMetadata | None: ...
    def verified(self, location: Location, row: str) -> StoredMetadata: ...
    def size_of(self, location: Location) -> int: ...
    def retry(self, attempt: Callable[[], T]) -> T: ...


UNDEFINED_TABLE = "42P01"


def known_revisions(script: ScriptDirectory | None) -> Revisions:
    """The revisions of ``script``, or of the migration scripts this library ships when None."""
    from store import schema  # the module's attribute: tests stand in another line of scripts

    return schema.revisions() if script is None else revisions_of(script)


# A registered schema in state EMPTY: created with its tables in one transaction, so they were dropped since.
NO_TABLES = "is registered but its schema holds no tables (dropped by hand?); the next write to it builds them again"


def classify(conn: Connection, location: Location, known: Revisions | None = None) -> SchemaStatus:
    """The schema's state, with one SELECT when it has its version table (a savepoint guards the miss)."""
    known = known or known_revisions(None)
    name = schema_name(location)
    version = Table(VERSION_TABLE, MetaData(), Column("version_num", String), schema=name)
    for _ in range(2):
        try:
            with conn.begin_nested():
                rows = conn.execute(select(version.c.version_num)).all()
            unversioned = False
        except DBAPIError as e:
            if getattr(e.orig, "sqlstate", None) != UNDEFINED_TABLE:
                raise
            rows, unversioned = [], True
        if len(rows) == 1 and isinstance(rows[0][0], str) and rows[0][0]:  # an empty one names none
            revision = rows[0][0]
            if revision == known.head:
                return SchemaStatus(DatabaseState.CURRENT, revision, known.head)
            state = DatabaseState.BEHIND if revision in known.known else DatabaseState.AHEAD
            return SchemaStatus(state, revision, known.head)
        tables = tuple(sorted(inspect(conn).get_table_names(schema=name)))
        # Each statement reads what was committed when it began: another job may have created the schema (its
        # version table with the rest, in one transaction) between the two. Then it is asked again.
        if not (unversioned and VERSION_TABLE in tables):
            break
    return SchemaStatus(DatabaseState.FOREIGN if tables else DatabaseState.EMPTY, None, known.head, tables)


def schema_info(
    storage: SchemaHost, location: Location, *, known: Revisions | None = None, count_rows: bool = True
) -> DatabaseInfo:
    """One schema's state (and rows when current), read-only; never raises for a bad schema."""
    known = known or known_revisions(None)
    where = storage.location_where(location)
    revision = rows = error = claims = None
    try:
        with storage.connection() as conn:
            storage.metadata(conn, location)
            status = classify(conn, location, known)
            state, revision, error = status.state, status.revision, status_error(status, where)
            mapped = conn.execution_options(**schema_options(location))
            if status.state is DatabaseState.CURRENT:
                claims = PostgresClaimTable(mapped, location.role).summary()
            if status.state is DatabaseState.CURRENT and count_rows:
                rows = PostgresRepository(mapped, location.role).count()
    except MetadataMismatchError as e:
        state, error = DatabaseState.METADATA_MISMATCH, str(e)
    except JudgestoreError as e:
        state, error = DatabaseState.UNREADABLE, str(e)
    size = storage.size_of(location)
    return DatabaseInfo(location, where, state, revision, known.head, rows, size, error, claims)


def schema_infos(
    storage: SchemaHost, locations: Iterable[Location], *, count_rows: bool = True
) -> Iterator[DatabaseInfo]:
    """:func:`schema_info` of each location, the registry rows, revisions, row counts and sizes read in a few
    statements for all of them (:mod:`~store.backends.postgres.survey`, a transaction per
    :data:`~store.backends.postgres.survey.EXISTS_BATCH` schemas) instead of six round trips per schema;
    a schema that is anything but registered with one revision row is read by :func:`schema_info`."""
    chosen = list(locations)
    known = known_revisions(None)
    for start in range(0, len(chosen), EXISTS_BATCH):
        yield from _surveyed(storage, chosen[start : start + EXISTS_BATCH], known, count_rows)


def _surveyed(
    storage: SchemaHost, chosen: list[Location], known: Revisions, count_rows: bool
) -> Iterator[DatabaseInfo]:
    names = {schema_name(location): location for location in chosen}
    try:
        with storage.connection() as conn:
            rows, versions, counts, sizes = survey(conn, names, known.head if count_rows else None)
            claims = claims_of(conn, {n: names[n] for n, v in versions.items() if v == known.head})
    except JudgestoreError:
        rows, versions, counts, sizes, claims = {}, {}, {}, {}, {}
    for name, location in names.items():
        revision = versions.get(name)
        if name not in rows or not revision or name not in sizes:  # an empty revision names none: classify says so
            yield schema_info(storage, location, known=known, count_rows=count_rows)
            continue
        where = storage.location_where(location)
        try:
            storage.verified(location, rows[name])
        except MetadataMismatchError as e:
            yield DatabaseInfo(location, where, DatabaseState.METADATA_MISMATCH, None, known.head, None,
                               sizes[name], str(e))  # fmt: skip
            continue
        except JudgestoreError as e:
            yield DatabaseInfo(location, where, DatabaseState.UNREADABLE, None, known.head, None, sizes[name],
                               str(e))  # fmt: skip
            continue
        state = DatabaseState.CURRENT if revision == known.head else None
        state = state or (DatabaseState.BEHIND if revision in known.known else DatabaseState.AHEAD)
        status = SchemaStatus(state, revision, known.head)
        yield DatabaseInfo(location, where, state, revision, known.head, counts.get(name) if count_rows else None,
                           sizes[name], status_error(status, where), claims.get(name))  # fmt: skip
