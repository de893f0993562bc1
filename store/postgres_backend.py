"""The store's operations on a PostgreSQL server: list, create, open, inspect, upgrade and verify descriptor schemas.

Contract (the layout itself is :mod:`store.postgres`'s):

* :class:`PostgresBackend` is what :class:`~store.store.Store` uses for a
  store URL, as it uses the folder tree for a store root. One pooled engine
  serves every schema; a :class:`PostgresDatabase` maps the models onto its
  schema with ``schema_translate_map``.
* Creating a descriptor's schema is one transaction under the schema's
  advisory lock: ``CREATE SCHEMA``, the migrations at head (with the schema as
  ``search_path``, so data migrations written as plain SQL land there too),
  and its registry row. A concurrent creator waits on the lock and then finds
  the schema registered. A schema of that name that is not ours is refused
  untouched (:class:`~store.errors.ForeignSchemaError`).
* Opening checks the registry row (its metadata must hash to the descriptor
  folder's hash) and the revision with one SELECT of the schema's version
  table; anything but current is refused with the same typed errors as a
  SQLite file (behind, ahead, foreign), unless ``auto_upgrade``.
* Upgrades run per schema, each in its own transaction under the schema's
  advisory lock; PostgreSQL's DDL is transactional, so a failed migration
  leaves the schema exactly as it was (no backup file is needed) and the
  other schemas go on. Row counts are verified as for SQLite.
* Writes retry what a server may answer while it is fine (a serialisation
  failure, a deadlock, a connection dropped mid-transaction: the server
  rolled the transaction back, so no partial chunk exists) with backoff,
  ``lock_retries`` times; reads and writes translate every driver error into
  a typed one (:func:`store.postgres.translated`).
* A read-only store opens read-only transactions and never creates anything.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from pydantic import ValidationError
from sqlalchemy import Column, Connection, MetaData, String, Table, func, inspect, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from store.descriptor import ModelDescriptor
from store.errors import (
    DatabaseMissingError,
    ForeignSchemaError,
    InvalidInputError,
    JudgestoreError,
    MetadataMismatchError,
    ServerUnavailableError,
    UpgradeFailedError,
)
from store.layout import METADATA_FILE, Location, StoredMetadata, check_role
from store.postgres import (
    advisory_lock,
    create_postgres_engine,
    display_url,
    ensure_registry,
    quoted,
    raise_translated,
    register,
    registered,
    registry,
    schema_name,
    schema_options,
    translated,
)
from store.repository import Repository
from store.schema import VERSION_TABLE, DatabaseState, Revisions, SchemaStatus, migrate, revisions, revisions_of
from store.settings import Settings

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

T = TypeVar("T")
# SQLSTATEs after which the whole transaction may simply run again.
RETRYABLE_STATES = frozenset({"40001", "40P01", "57P01", "08000", "08003", "08006"})
UNDEFINED_TABLE = "42P01"


def _retryable(error: DBAPIError) -> bool:
    return error.connection_invalidated or getattr(error.orig, "sqlstate", None) in RETRYABLE_STATES


class PostgresBackend:
    """A store URL's descriptor schemas (see the module docstring)."""

    def __init__(self, url: str, settings: Settings, *, readonly: bool = False) -> None:
        self.url = url
        self.settings = settings
        self.readonly = readonly
        self.engine = create_postgres_engine(url, settings)
        self.where = display_url(url)

    def close(self) -> None:
        self.engine.dispose()

    def location_where(self, location: Location) -> str:
        return f"{self.where} schema {schema_name(location)}"

    # ------------------------------------------------------------ connections

    @contextmanager
    def connection(self, *, write: bool = False) -> Iterator[Connection]:
        """A connection in a transaction (read-only unless ``write``), errors translated."""
        try:
            with self.engine.connect() as conn:
                if not write:
                    conn = conn.execution_options(postgresql_readonly=True)
                with conn.begin():
                    yield conn
        except DBAPIError as e:
            raise_translated(self.url, e)

    def retry(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` again after what a healthy server may answer (see the module docstring)."""
        for tries in range(self.settings.lock_retries + 1):
            try:
                return attempt()
            except DBAPIError as e:
                if not _retryable(e):
                    raise_translated(self.url, e)
                if tries == self.settings.lock_retries:
                    raise ServerUnavailableError(
                        self.where, f"still failing after {tries + 1} tries ({str(e.orig).strip()}); try again later"
                    ) from e
                time.sleep(min(2.0, 0.05 * 2**tries) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ the registry

    def locations(self) -> list[Location]:
        with self.connection() as conn:
            return [location for location, _ in registered(conn)]

    def metadata(self, conn: Connection, location: Location) -> StoredMetadata | None:
        """The registry's record of ``location``, verified like a metadata.json; None when unregistered."""
        row = conn.execute(
            select(registry.c.metadata_json).where(registry.c.schema_name == schema_name(location))
        ).scalar_one_or_none()
        if row is None:
            return None
        where = f"{self.location_where(location)} (registry)"
        try:
            doc = orjson.loads(row)
            descriptor = ModelDescriptor.model_validate(doc["descriptor"])
            stored = StoredMetadata(check_role(doc["role"]), doc["task"], descriptor, doc["descriptor_sha256"],
                                    tuple(doc.get("assumptions", ())))  # fmt: skip
        except (KeyError, TypeError, ValueError, ValidationError, InvalidInputError) as e:
            raise MetadataMismatchError(where, f"not a judgestore {METADATA_FILE} ({e})") from e
        actual = descriptor.sha256()
        recorded = (stored.role, stored.task, descriptor.provider, descriptor.model, actual[:16])
        expected = (location.role, location.task, location.provider, location.model, location.descriptor_hash16)
        if stored.descriptor_sha256 != actual or recorded != expected:
            raise MetadataMismatchError(
                where, f"records {'/'.join(recorded)} but is registered as {'/'.join(expected)}; it was edited"
            )
        return stored

    def exists(self, location: Location) -> bool:
        with self.connection() as conn:
            if not conn.dialect.has_table(conn, registry.name, schema=registry.schema):
                return False
            return self.metadata(conn, location) is not None

    # ------------------------------------------------------------ schemas

    def classify(self, conn: Connection, location: Location, known: Revisions | None = None) -> SchemaStatus:
        """The schema's state with one SELECT when it has its version table (a savepoint guards the miss)."""
        known = known or revisions()
        name = schema_name(location)
        version = Table(VERSION_TABLE, MetaData(), Column("version_num", String), schema=name)
        try:
            with conn.begin_nested():
                rows = conn.execute(select(version.c.version_num)).all()
        except DBAPIError as e:
            if getattr(e.orig, "sqlstate", None) != UNDEFINED_TABLE:
                raise
            rows = []
        if len(rows) == 1:
            revision = rows[0][0]
            if revision == known.head:
                return SchemaStatus(DatabaseState.CURRENT, revision, known.head)
            state = DatabaseState.BEHIND if revision in known.known else DatabaseState.AHEAD
            return SchemaStatus(state, revision, known.head)
        tables = tuple(sorted(inspect(conn).get_table_names(schema=name)))
        return SchemaStatus(DatabaseState.FOREIGN if tables else DatabaseState.EMPTY, None, known.head, tables)

    def create(self, location: Location, metadata_json: bytes, descriptor_sha256: str) -> None:
        """Create and register ``location``'s schema at head, once, however many processes try at once."""
        if self.readonly:
            raise DatabaseMissingError(self.location_where(location), "does not exist (read-only open creates nothing)")
        name = schema_name(location)

        def attempt() -> None:
            with self.connection(write=True) as conn:
                ensure_registry(conn)
                advisory_lock(conn, name)
                if self.metadata(conn, location) is not None:
                    return  # another process won the race
                exists = conn.execute(
                    select(func.count()).select_from(text("pg_namespace")).where(text("nspname = :n")), {"n": name}
                ).scalar_one()
                if exists:
                    tables = ", ".join(inspect(conn).get_table_names(schema=name)) or "none"
                    raise ForeignSchemaError(
                        self.where,
                        f"schema {name} exists but is not registered by judgestore (tables: {tables}); it was not "
                        "touched. Drop it, or point the store at another database",
                    )
                conn.execute(text(f"CREATE SCHEMA {quoted(name)}"))
                self._migrate(conn, location)
                register(conn, location, descriptor_sha256, metadata_json.decode())

        self.retry(attempt)

    def _migrate(self, conn: Connection, location: Location, script: ScriptDirectory | None = None) -> None:
        conn.execute(text(f"SET LOCAL search_path TO {quoted(schema_name(location))}"))
        migrate(conn.execution_options(**schema_options(location)), script=script)

    def status(self, location: Location, known: Revisions | None = None) -> SchemaStatus:
        with self.connection() as conn:
            if self.metadata(conn, location) is None:
                raise DatabaseMissingError(self.location_where(location), "is not registered in this store")
            return self.classify(conn, location, known)

    def upgrade(self, location: Location, script: ScriptDirectory | None = None) -> tuple[SchemaStatus, dict[str, int]]:
        """Upgrade one schema in one transaction under its lock; returns the status found and the row counts.

        Raises :class:`~store.errors.UpgradeFailedError` when the migration
        fails (the transaction rolled back: the schema is as it was).
        """
        known = revisions() if script is None else revisions_of(script)
        with self.connection(write=True) as conn:
            advisory_lock(conn, schema_name(location))
            status = self.classify(conn, location, known)
            if status.state is not DatabaseState.BEHIND:
                return status, {}
            before = self._row_counts(conn, location)
            try:
                with conn.begin_nested():
                    self._migrate(conn, location, script)
                    after = self._row_counts(conn, location)
                    if after != before:
                        raise UpgradeFailedError(
                            self.location_where(location), f"row counts changed (before {before}, after {after})"
                        )
            except (DBAPIError, UpgradeFailedError) as e:
                raise UpgradeFailedError(
                    self.location_where(location),
                    f"migration from {status.revision} failed ({e}); rolled back, the schema is as it was",
                ) from e
            return status, before

    def _row_counts(self, conn: Connection, location: Location) -> dict[str, int]:
        name = schema_name(location)
        tables = [t for t in inspect(conn).get_table_names(schema=name) if t != VERSION_TABLE]
        return {t: conn.execute(text(f"SELECT count(*) FROM {quoted(name)}.{quoted(t)}")).scalar_one() for t in tables}

    def size(self, location: Location) -> int:
        """Bytes the schema's tables take on the server (indexes and TOAST included)."""
        name = schema_name(location)
        with self.connection() as conn:
            total = conn.execute(
                text(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :n AND c.relkind = 'r'"
                ),
                {"n": name},
            ).scalar_one()
        return int(total)


class PostgresDatabase:
    """Transactions over one descriptor schema; the same repository as SQLite, on the server's connections."""

    def __init__(self, backend: PostgresBackend, location: Location) -> None:
        self.backend = backend
        self.location = location
        self.where = backend.location_where(location)
        self.readonly = backend.readonly
        self._options = schema_options(location)

    @contextmanager
    def _repository(self, *, write: bool) -> Iterator[Repository]:
        with self.backend.connection(write=write) as conn:
            yield Repository(conn.execution_options(**self._options), self.location.role)

    def check_writable(self) -> None:
        if self.readonly:
            raise InvalidInputError(f"{self.where} was opened read-only: writes are refused")

    def translated_error(self, error: DBAPIError) -> JudgestoreError | DBAPIError:
        return translated(self.backend.url, error)

    def is_retryable(self, error: OperationalError) -> bool:
        return _retryable(error)

    def engine_info(self) -> dict[str, Any]:
        return {"backend": "postgresql", "schema": schema_name(self.location)}
