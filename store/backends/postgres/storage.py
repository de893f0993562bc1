"""A store on a PostgreSQL server: list, create, open, inspect, upgrade and verify descriptor schemas.

Contract (the layout itself is :mod:`store.backends.postgres.registry`'s):

* :class:`PostgresStorage` is what :class:`~store.store.Store` uses for a
  store URL, as :class:`~store.backends.sqlite.storage.SqliteStorage` is for a folder:
  the same operations, the same typed errors. One pooled engine serves every
  schema; a :class:`PostgresDatabase` maps the models onto its schema with
  ``schema_translate_map``.
* Creating a descriptor's schema is one transaction under the schema's
  advisory lock: ``CREATE SCHEMA``, its tables at head
  (:func:`~store.backends.postgres.upgrade.create_schema`: built from the
  models, as a new SQLite file is, with the schema as ``search_path``), and
  its registry row. A concurrent creator waits on the lock and then finds the
  schema registered. A schema of that name that is not ours is refused
  untouched (:class:`~store.errors.ForeignSchemaError`).
* Opening checks the registry row (its metadata must hash to the descriptor
  folder's hash) and the revision with one SELECT of the schema's version
  table; anything but current is refused with the same typed errors as a
  SQLite file (behind, ahead, foreign), unless ``auto_upgrade``. A registered
  schema without tables (dropped by hand: they are created with it) is refused
  as missing, so reads skip it as they skip an empty SQLite file, and the next
  write builds its tables again; ``verify`` reports it.
* Reading a schema's state and what ``ls`` reports of it, upgrading and
  verifying schemas are :mod:`~store.backends.postgres.status`,
  :mod:`~store.backends.postgres.upgrade` and
  :mod:`~store.backends.postgres.verify`'s, on this storage. Upgrades run
  per schema, each in its own transaction under the schema's advisory lock;
  PostgreSQL's DDL is transactional, so a failed migration leaves the schema
  exactly as it was (no backup is needed) and the other schemas go on.
* Writes retry what a healthy server may answer (a serialisation failure, a
  deadlock, a connection dropped mid-transaction: the server rolled the
  transaction back, so no partial chunk exists; a connection refused while
  the server restarts) with backoff, ``lock_retries`` times, and so do the
  reads that return whole (a lookup, a count; a stream that has begun is
  not run again). Every driver error is typed
  (:func:`store.backends.postgres.errors.translated`).
* A read-only store opens read-only transactions and never creates anything.
* :meth:`~PostgresStorage.discard_if_empty` drops a schema that holds no row
  (a failed copy's), under its advisory lock and its tables' locks.
* What ``ls``, ``db status``, ``stats`` and row filters derive from a schema
  is kept in this machine's catalog (:mod:`store.catalog`, in the side
  folder below) at the schema's stamp
  (:mod:`store.backends.postgres.generations`: a counter its tables' triggers
  raise, and digests of its tables and registry row), read for every
  schema in one statement before any schema is: a listing of thousands of
  schemas reads one table of the server, and the schemas that changed.
* :meth:`~PostgresStorage.read_across` reads many schemas in one statement
  where it can (:mod:`store.backends.postgres.across`).
* Side files (sharing's workspace, the catalog) live in a folder of this
  machine named after the database the URL reaches (its server's host and
  port, its name and OID, however the URL spells them):
  ``$XDG_CACHE_HOME/judgestore/servers/<hash>`` (default ``~/.cache``;
  :attr:`PostgresStorage.local_root`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from store.backends.postgres.connections import create_postgres_engine, display_url, parse_store_url
from store.backends.postgres.database import PostgresDatabase
from store.backends.postgres.errors import pool_exhausted, raise_translated, translated
from store.backends.postgres.generations import forget, stamps
from store.backends.postgres.registry import (
    advisory_lock,
    ensure_registry,
    has_registry,
    misregistered,
    quoted,
    register,
    registered,
    registry,
    schema_name,
    unregistered,
    verified_metadata,
)
from store.backends.postgres.status import NO_TABLES, classify, known_revisions, schema_info, schema_infos
from store.backends.postgres.survey import EXISTS_BATCH, SCHEMA_TABLES, distinct_values, matching
from store.backends.postgres.upgrade import create_schema, row_counts, upgrade_schemas
from store.backends.postgres.verify import verify_schema
from store.catalog import Catalog, cache_home
from store.errors import (
    DatabaseMissingError,
    ForeignSchemaError,
    InvalidInputError,
    JudgestoreError,
    MetadataMismatchError,
    ServerAuthError,
    ServerError,
    ServerPermissionError,
    ServerSchemaError,
    ServerURLError,
    ServerValueError,
)
from store.layout import Location, Selector, StoredMetadata
from store.reports import (
    DatabaseInfo,
    DatabaseVerification,
    Problem,
    ProblemKind,
    UpgradeResult,
    VacuumResult,
    info_json,
    info_lasting,
    info_of,
)
from store.schema import VERSION_TABLE, DatabaseState, Revisions, raise_for_status
from store.settings import Settings
from store.tables.filters import CATALOGUED_FILTERS, ColumnValues, RowFilter, may_match

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

    from store.across.plan import AcrossRows, Plan
    from store.backend import Database, Storage

T = TypeVar("T")
# SQLSTATEs after which the whole transaction may simply run again.
RETRYABLE_STATES = frozenset({"40001", "40P01", "57P01", "08000", "08003", "08006"})


def _retryable(error: DBAPIError) -> bool:
    state = getattr(error.orig, "sqlstate", None)
    # No SQLSTATE on an OperationalError: the client could not reach the server (one restarting refuses
    # connections for a moment); a server that answered, even with a refusal, says why with a state.
    refused = state is None and isinstance(error, OperationalError)
    if refused and isinstance(
        translated("", error), ServerURLError | ServerAuthError | ServerPermissionError | ServerValueError
    ):
        # libpq's words of a server that answered and refused, or of a statement it cannot send (too many values):
        # asking again gets the same answer
        return False
    return error.connection_invalidated or refused or state in RETRYABLE_STATES


class PostgresStorage:
    """A store URL's descriptor schemas (see the module docstring)."""

    def __init__(self, url: str, settings: Settings, *, readonly: bool = False) -> None:
        self.url = url
        self.settings = settings
        self.readonly = readonly
        self.where = display_url(url)
        self.engine = create_postgres_engine(url, settings)
        self._catalog: Catalog | None = None  # read at first use (store.catalog)

    @functools.cached_property
    def _reached(self) -> tuple[str, str]:
        """The database the URL reaches (its host, port, name and OID) and the user it reads as, asked once."""
        with self.connection() as conn:
            info = conn.connection.driver_connection.info  # type: ignore[union-attr]  # psycopg's, once connected
            oid, user = conn.execute(
                text("SELECT oid, current_user FROM pg_database WHERE datname = current_database()")
            ).one()
        return f"{info.host}:{info.port}/{info.dbname}#{oid}", user

    @functools.cached_property
    def local_root(self) -> Path:
        """This machine's folder of the database the URL reaches: named after its host, port, name and OID, so two
        spellings of one URL share it, and a database made again under the same name (whose rows sharing never
        fetched) gets a new one."""
        identity, _ = self._reached
        root = cache_home() / "servers" / hashlib.sha256(identity.encode()).hexdigest()[:16]
        # Before 2026-12-05 the folder was named after the URL's text: its bookkeeping is carried over once, so
        # that the first push after the change does not send every row again
        by_text = cache_home() / "servers" / hashlib.sha256(self.where.encode()).hexdigest()[:16]
        if not root.exists() and by_text.is_dir():
            with contextlib.suppress(OSError):
                by_text.rename(root)
        return root

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.save()
        self.engine.dispose()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            # One per user: what a role may read of the schemas is its own (another's counts are not its answers)
            _, user = self._reached
            user_key = hashlib.sha256(user.encode()).hexdigest()[:16]
            self._catalog = Catalog(self.local_root / f"catalog-{user_key}.json", self.where)
        return self._catalog

    def absence(self) -> str | None:
        """Why the server's database holds no store (no registry); reaching the server is checked on the way."""
        with self.connection() as conn:
            if has_registry(conn):
                return None
            self._refuse_a_lost_registry(conn)
        return "this database holds no judgestore store (no registry)"

    def overlaps(self, other: Storage) -> bool:
        """The same database of the same server, as far as URLs tell (however spelled; passwords left out)."""
        return isinstance(other, PostgresStorage) and _normalised_url(self.url) == _normalised_url(other.url)

    def shown(self, where: str) -> str:
        return where

    def location_where(self, location: Location) -> str:
        return f"{self.where} schema {schema_name(location)}"

    # ------------------------------------------------------------ connections

    def connect(self) -> Connection:
        """A connection of the pool; one every connection of which stayed in use past the pool's wait is a
        :class:`~store.errors.ServerBusyError` naming what holds them (SQLAlchemy's own ``TimeoutError`` was)."""
        try:
            return self.engine.connect()
        except PoolTimeoutError as e:
            raise pool_exhausted(self.url, self.settings.pool_size, self.settings.pool_overflow, e) from e

    @contextmanager
    def connection(self, *, write: bool = False) -> Iterator[Connection]:
        """A connection in a transaction (read-only unless ``write``), driver errors typed."""
        try:
            with self.connect() as conn:
                if not write:
                    conn = conn.execution_options(postgresql_readonly=True)
                with conn.begin():
                    yield conn
        except DBAPIError as e:
            raise_translated(self.url, e)

    def retry(self, attempt: Callable[[], T], *, where: str | None = None) -> T:
        """Run ``attempt`` again after what a healthy server may answer (see the module docstring); ``attempt`` may
        raise the driver's error or its typed one (a read's, translated where it was read). ``where``: the schema
        it works on, which a busy error names (see :func:`~store.backends.postgres.errors.translated`)."""
        for tries in range(self.settings.lock_retries + 1):
            try:
                return attempt()
            except (DBAPIError, ServerError) as e:
                raw = e if isinstance(e, DBAPIError) else e.__cause__
                if not (isinstance(raw, DBAPIError) and _retryable(raw)):
                    if isinstance(e, DBAPIError):
                        raise_translated(self.url, e, where=where)
                    raise
                if tries == self.settings.lock_retries:
                    typed = translated(self.url, raw, where=where)
                    typed.add_note(
                        "(tried once: JUDGESTORE_LOCK_RETRIES is 0; try again later)"
                        if tries == 0
                        else f"(the same {tries + 1} times in a row, over a few seconds; try again later)"
                    )
                    raise typed from raw
                time.sleep(min(2.0, 0.05 * 2**tries) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ the registry

    def locations(self, selector: Selector | None = None) -> list[Location]:
        with self.connection() as conn:  # the registry lists them all at once: the selector is the caller's
            found = registered(conn)
            if not found:
                self._refuse_a_lost_registry(conn)
        self.catalog.keep_only(schema_name(location) for location in found)
        return found

    def _refuse_a_lost_registry(self, conn: Connection) -> None:
        """Raise :class:`ServerSchemaError` when the registry is gone but descriptor schemas are here (another tool
        dropped it): taken for no store, their rows were listed as none, and a write made a new, empty one."""
        if has_registry(conn) or not (orphans := unregistered(conn)):
            return
        rows = sum(n or 0 for _, n in orphans)
        raise ServerSchemaError(
            self.where,
            f"the registry (table judgestore.registry) is missing, but descriptor schemas are here ({len(orphans):,}: "
            f"{orphans[0][0]}{', ...' if len(orphans) > 1 else ''}; {rows:,} rows in all): another tool dropped it, "
            "and without it judgestore cannot tell which descriptor each schema holds. Restore the judgestore "
            "schema from a backup (pg_restore --schema judgestore); nothing was changed",
        )

    def _stamps(self) -> dict[str, list[Any] | None]:
        """Every schema's stamp (:func:`~store.backends.postgres.generations.stamps`), read before any schema is;
        none where they cannot be read (then every schema is read, which says what is wrong)."""
        try:
            with self.connection() as conn:
                return stamps(conn)
        except JudgestoreError:
            return {}

    def remembered(
        self,
        locations: Iterable[Location],
        kind: str,
        compute: Callable[[Location], T],
        *,
        lasting: Callable[[T], bool] | None = None,
    ) -> Iterator[tuple[Location, T]]:
        """``compute(location)`` of each location, or what it gave at the schema's present stamp (read for every
        schema at once, before any is read; never a value ``lasting`` refuses)."""
        chosen = list(locations)
        now = self._stamps() if chosen else {}
        for location in chosen:
            name = schema_name(location)
            work = functools.partial(compute, location)
            yield location, self.catalog.remembered(name, now.get(name), kind, work, lasting=lasting)

    def narrowed(self, locations: Iterable[Location], flt: RowFilter) -> list[Location]:
        """The ``locations`` whose schemas may hold a row ``flt`` matches: ruled out by their catalogued distinct
        values (:func:`~store.backends.postgres.survey.distinct_values`, read for the schemas that changed), the
        rest probed in a few statements (:func:`~store.backends.postgres.survey.matching`)."""
        chosen = list(locations)
        if flt.is_empty() or not chosen:
            return chosen
        head = known_revisions(None).head
        if any(getattr(flt, name) is not None for name in CATALOGUED_FILTERS):
            values = self.column_values(chosen)
            chosen = [loc for loc in chosen if (v := values[loc]) is None or may_match(loc.role, v, flt)]
        keep = set[Location]()
        for start in range(0, len(chosen), EXISTS_BATCH):  # a transaction each: see EXISTS_BATCH
            with self.connection() as conn:
                keep |= matching(conn, chosen[start : start + EXISTS_BATCH], flt, head)
        return [location for location in chosen if location in keep]

    def column_values(self, locations: Iterable[Location]) -> dict[Location, ColumnValues | None]:
        """The catalogued distinct values of each schema (:meth:`narrowed`); those not kept at the present stamp
        are read, :data:`EXISTS_BATCH` schemas a transaction."""
        chosen, head = list(locations), known_revisions(None).head

        def read(misses: list[Location]) -> Iterator[tuple[Location, Any]]:
            for start in range(0, len(misses), EXISTS_BATCH):
                with self.connection() as conn:
                    yield from distinct_values(conn, misses[start : start + EXISTS_BATCH], head).items()

        return self._recalled(chosen, "values", read, lasting=_known)  # for this head (store.catalog)

    def _recalled(
        self,
        chosen: list[Location],
        kind: str,
        read: Callable[[list[Location]], Iterable[tuple[Location, Any]]],
        *,
        lasting: Callable[[Any], bool],
    ) -> dict[Location, Any]:
        """What the catalog kept of ``kind`` for each schema at its present stamp (the stamps read once); the
        schemas it does not know are read together by ``read(misses)`` and kept, unless ``lasting`` refuses."""
        now = self._stamps() if chosen else {}
        found: dict[Location, Any] = {}
        for location in chosen:
            name = schema_name(location)
            if (known := self.catalog.known(name, now.get(name), kind)) is not None:
                found[location] = known[0]
        misses = [location for location in chosen if location not in found]
        for location, value in read(misses) if misses else ():
            name = schema_name(location)
            found[location] = self.catalog.keep(name, now.get(name), kind, value, lasting=lasting)
        return found

    def metadata(self, conn: Connection, location: Location) -> StoredMetadata | None:
        """The registry's record of ``location``, verified like a metadata.json; None when unregistered."""
        if not conn.dialect.has_table(conn, registry.name, schema=registry.schema):
            return None
        row = conn.execute(
            select(registry.c.metadata_json).where(registry.c.schema_name == schema_name(location))
        ).scalar_one_or_none()
        if row is None:
            if (other := misregistered(conn, location)) is not None:  # as a folder's metadata.json moved or edited
                raise MetadataMismatchError(
                    f"{self.location_where(location)} (registry)",
                    f"is named by the registry row of schema {other}, whose task, provider or model was edited "
                    "(the schema's name is a hash of them): set them back to what its metadata_json records",
                )
            return None
        return self.verified(location, row)

    def stored_metadata(self, location: Location) -> StoredMetadata:
        with self.connection() as conn:
            metadata = self.metadata(conn, location)
        if metadata is None:
            raise DatabaseMissingError(self.location_where(location), "is not in the store's registry")
        return metadata

    def verified(self, location: Location, row: str) -> StoredMetadata:
        """The registry's ``metadata_json`` of ``location``, verified like a metadata.json."""
        return verified_metadata(location, row, f"{self.location_where(location)} (registry)")

    # ------------------------------------------------------------ schemas

    def database(self, location: Location, metadata: Callable[[], bytes]) -> PostgresDatabase:
        """The database of ``location``; a read-write store creates and registers its schema if needed, and builds
        again the tables of a registered schema that has none (dropped by hand), as a folder store builds an empty
        file."""
        if self.readonly:
            return self.open(location)
        self._create(location, metadata())
        try:
            return self.open(location)
        except _NoTables:
            self._create(location, metadata(), rebuild=True)
            return self.open(location)

    def _create(self, location: Location, metadata: bytes, *, rebuild: bool = False) -> None:
        name = schema_name(location)
        descriptor_sha256 = orjson.loads(metadata)["descriptor_sha256"]

        def attempt() -> None:
            with self.connect() as conn, conn.begin():
                self._refuse_a_lost_registry(conn)
                ensure_registry(conn)
                advisory_lock(conn, name)
                if self.metadata(conn, location) is not None:
                    if rebuild and classify(conn, location).state is DatabaseState.EMPTY:
                        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted(name)}"))
                        create_schema(conn, location)
                    return  # already there (another process may have won the race)
                found = conn.execute(text("SELECT count(*) FROM pg_namespace WHERE nspname = :n"), {"n": name})
                if found.scalar_one():
                    orphans = dict(unregistered(conn))
                    tables = ", ".join(inspect(conn).get_table_names(schema=name)) or "none"
                    raise ForeignSchemaError(
                        self.where,
                        unregistered_message(name, orphans[name])
                        if name in orphans
                        else f"schema {name} exists but judgestore did not register it (tables: {tables}); it was "
                        "not touched. Drop it, or point the store at another database",
                    )
                conn.execute(text(f"CREATE SCHEMA {quoted(name)}"))
                create_schema(conn, location)
                register(conn, location, descriptor_sha256, metadata.decode())

        self.retry(attempt)

    def discard_if_empty(self, location: Location) -> bool:
        """Drop a registered schema and its registry row if no table of it holds a row; returns whether it did.

        For a copy that created the schema and then failed before any row was
        written: an empty schema would stay listed. The tables are locked
        before they are counted, so a writer that found the schema meanwhile
        either committed first (then its rows keep the schema) or waits and
        then meets no schema.
        """
        name = schema_name(location)

        def attempt() -> bool:
            with self.connect() as conn, conn.begin():
                advisory_lock(conn, name)
                if self.metadata(conn, location) is None:
                    return False
                tables = [t for t in inspect(conn).get_table_names(schema=name) if t != VERSION_TABLE]
                if tables:
                    locked = ", ".join(f"{quoted(name)}.{quoted(t)}" for t in tables)
                    conn.execute(text(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE"))
                    if any(row_counts(conn, location).values()):
                        return False
                conn.execute(text(f"DROP SCHEMA {quoted(name)} CASCADE"))
                conn.execute(registry.delete().where(registry.c.schema_name == name))
                forget(conn, name)
                return True

        return self.retry(attempt)  # every driver error typed (store.backends.postgres.errors.translated)

    def check_writable(self, location: Location, *, as_a_writer: bool = False) -> None:
        """Refuse what the server's grants would refuse of a write, asked of the server without writing: every
        write makes sure of the registry's schema (CREATE on the database), and rows go to the schema's table
        of the role and to ``runs`` (INSERT, where they exist). A standby shows only when a write fails."""
        if self.readonly and not as_a_writer:
            raise DatabaseMissingError(self.location_where(location), "the store was opened read-only")
        name = schema_name(location)
        # CASE, not AND: PostgreSQL may evaluate has_table_privilege first, which fails for a missing table
        insert = text("SELECT CASE WHEN to_regclass(:t) IS NULL THEN true ELSE has_table_privilege(:t, 'INSERT') END")
        with self.connection() as conn:
            lacking = [] if conn.execute(_MAY_CREATE).scalar_one() else ["CREATE on the database"]
            for table in (location.role, "runs"):
                if not conn.execute(insert, {"t": f"{quoted(name)}.{quoted(table)}"}).scalar_one():
                    lacking.append(f"INSERT on {name}.{table}")
        if lacking:
            raise ServerPermissionError(
                self.where,
                f"the store's user may not write this descriptor's rows: it lacks {' and '.join(lacking)} (GRANT "
                "CREATE ON DATABASE ... / GRANT ... ON ALL TABLES IN SCHEMA ... TO ...); nothing was written",
            )

    def open_existing(self, location: Location) -> PostgresDatabase | None:
        try:
            return self.open(location)
        except DatabaseMissingError:
            return None

    def open(self, location: Location) -> PostgresDatabase:
        """Open a registered schema (verifying its registry row and its revision)."""
        with self.connection() as conn:
            stored = self.metadata(conn, location)
            if stored is None:
                raise DatabaseMissingError(self.location_where(location), "is not in this store's registry")
            status = classify(conn, location)
        if status.state is DatabaseState.EMPTY:
            raise _NoTables(self.location_where(location), NO_TABLES)
        if status.state is not DatabaseState.CURRENT:
            raise_for_status(status, self.location_where(location))
        return PostgresDatabase(self, location, stored)

    # ------------------------------------------------------------ the whole store

    def info(self, location: Location, *, known: Revisions | None = None, count_rows: bool = True) -> DatabaseInfo:
        """One schema's state (and rows when current), read-only; never raises for a bad schema."""
        return schema_info(self, location, known=known, count_rows=count_rows)

    def infos(self, locations: Iterable[Location], *, count_rows: bool = True) -> Iterator[DatabaseInfo]:
        """:meth:`info` of each location: what the catalog kept at the schema's present stamp, the others read in a
        few statements for all of them (:func:`~.status.schema_infos`)."""
        chosen = list(locations)

        def read(misses: list[Location]) -> Iterator[tuple[Location, Any]]:
            return ((info.location, info_json(info)) for info in schema_infos(self, misses))

        kept = self._recalled(chosen, "info", read, lasting=info_lasting)  # for this head (store.catalog)
        for location in chosen:
            info = info_of(location, kept[location])
            yield info if count_rows else dataclasses.replace(info, rows=None)

    def size_of(self, location: Location) -> int:
        """Bytes the schema's tables take on the server (indexes and TOAST included).

        The tables are looked up by name (``to_regclass``, through ``pg_class``'s index on names): selecting a
        schema's relations by namespace has no index and scans every relation of every schema, which made
        listing a store of N schemas cost N^2 (103 s at 5,000 schemas).
        """
        query = text(
            "SELECT coalesce(sum(pg_total_relation_size(to_regclass(format('%I.%I', CAST(:n AS text), t)))), 0) "
            "FROM unnest(CAST(:tables AS text[])) AS t"
        )
        try:
            with self.connection() as conn:
                found = conn.execute(query, {"n": schema_name(location), "tables": list(SCHEMA_TABLES)})
                return int(found.scalar_one())
        except JudgestoreError:
            return 0

    def upgrade(
        self,
        locations: Iterable[Location],
        *,
        keep_backup: bool = True,
        script: ScriptDirectory | None = None,
        dry_run: bool = False,
    ) -> Iterator[UpgradeResult]:
        """Upgrade each schema in its own transaction under its lock (:mod:`store.backends.postgres.upgrade`)."""
        return upgrade_schemas(self, locations, script=script, dry_run=dry_run)

    def verify(self, location: Location) -> DatabaseVerification:
        """Registry row, schema state, and every row's input hash (:mod:`store.backends.postgres.verify`)."""
        return verify_schema(self, location)

    def strays(self, selector: Selector) -> list[Problem]:
        """The registry's rows that name no location (edited by hand), and descriptor schemas with no registry row
        (one deleted by hand, a partial restore): the registry is the layout, so both are left out of everything.
        Neither names a location a selector could pick, so a non-empty ``selector`` gets none (a registered schema
        that lost its tables is its own database's problem)."""
        if not selector.is_empty():
            return []
        unreadable: list[tuple[str, str]] = []
        with self.connection() as conn:
            registered(conn, unreadable)
            orphans = unregistered(conn)
        return [
            *(
                Problem(name, ProblemKind.STRAY, f"its registry row names no database ({why}); it is left out")
                for name, why in unreadable
            ),
            *(Problem(name, ProblemKind.STRAY, unregistered_message(name, rows)) for name, rows in orphans),
        ]

    def unlisted(self) -> list[Problem]:
        """The :meth:`strays` of the whole store: every one is a schema, or a registry row, no location names."""
        return self.strays(Selector())

    def read_across(self, databases: Sequence[Database], plan: Plan) -> AcrossRows:
        """One statement over every schema where the SQL allows it (:mod:`store.backends.postgres.across`)."""
        from store.backends.postgres.across import read_across

        return read_across(self, databases, plan)

    def vacuum(self, locations: Iterable[Location], *, dry_run: bool = False) -> Iterator[VacuumResult]:
        raise InvalidInputError(
            f"{self.where} is a PostgreSQL store: vacuum compacts SQLite files. The server's autovacuum "
            "reuses the space of deleted rows; VACUUM FULL (by the owner of the tables or of the database) gives "
            "it back to the disk"
        )


def unregistered_message(name: str, rows: int | None) -> str:
    held = "rows this role may not read" if rows is None else f"{rows:,} rows"
    return (
        f"schema {name} holds judgestore's tables ({held}) but no registry row (deleted by hand, or a partial "
        "restore): every command leaves it out, and it was not touched. Restore its row of judgestore.registry "
        "from a backup (pg_dump); dropping the schema deletes its rows"
    )


_MAY_CREATE = text("SELECT has_database_privilege(current_database(), 'CREATE')")


class _NoTables(DatabaseMissingError):
    """A registered schema without its tables: nothing to read (``open_existing`` gives None), built on a write."""


def _known(values: Any) -> bool:
    return values is not None  # a schema that could not be read is read again next time


# The query parameters that say which server and database a URL reaches; the others tune a connection to it
# (application_name, connect_timeout, sslmode...), which a job's URL may set as it likes
_WHICH_DATABASE = frozenset({"host", "hostaddr", "port", "dbname", "user", "service"})


def _normalised_url(url: str) -> str:
    """The server and database a URL names, however it is spelled (its passwords and tuning left out)."""
    unified = "postgresql+psycopg" + url[url.index("://") :] if "://" in url else url
    try:
        parsed = parse_store_url(unified)
    except (ArgumentError, ValueError):
        return display_url(unified)
    which = {name: value for name, value in parsed.query.items() if name in _WHICH_DATABASE}
    return display_url(parsed.set(query=which).render_as_string(hide_password=False))
