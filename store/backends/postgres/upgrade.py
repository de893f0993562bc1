"""Upgrading a PostgreSQL store's descriptor schemas to this library's head revision, one schema at a time.

Contract:

* :func:`create_schema` builds a new schema at head as a new SQLite file
  is built (:func:`~store.schema.create_at_head`: from the models, stamped;
  against other scripts, by them) with the schema as ``search_path``;
  :func:`migrate_schema` runs the migrations so (data migrations written as
  plain SQL land there too), with the models mapped onto it. Both put the
  generation triggers on its tables.
* :func:`upgrade_schemas` upgrades each schema in its own transaction under
  the schema's advisory lock and, once it is found behind (or without its
  generation triggers), its write lock
  (:func:`~store.backends.postgres.generations.write_lock`, waited for as a
  write waits: writers of that schema wait while it migrates, and rows one
  committed meanwhile cannot change the counts); a deadlock with a reader
  (each holding a table the other asks for) runs it again, as a write is.
  PostgreSQL's DDL is transactional, so a failed
  migration leaves the schema exactly as it was (no backup is needed) and
  the other schemas go on; the row counts (:func:`row_counts`) must be the
  same after as before. Only a ``behind`` schema is migrated; any other state
  is reported (``refused``, or ``up-to-date``) untouched, except that a usable
  schema made before generations existed gets its generation triggers
  (:mod:`store.backends.postgres.generations`). A second upgrade
  started at once waits on the lock and then finds nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import DBAPIError

from store.backends.postgres import generations
from store.backends.postgres.errors import OWNER_ADVICE, translated
from store.backends.postgres.registry import advisory_lock, quoted, schema_name, schema_options
from store.backends.postgres.status import SchemaHost, classify, known_revisions
from store.errors import JudgestoreError, ServerBusyError, UnexpectedServerError, UpgradeFailedError
from store.interrupts import MIGRATING
from store.layout import Location
from store.reports import UpgradeOutcome, UpgradeResult
from store.schema import (
    USABLE_STATES,
    VERSION_TABLE,
    DatabaseState,
    Revisions,
    create_at_head,
    migrate,
    status_error,
)

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

INSUFFICIENT_PRIVILEGE = "42501"
NOT_STAMPED = (
    "its generation triggers are older than this library's (they must fire always), and only the tables' owner "
    "may change them: its rows are read anew by each command until the owner runs `judgestore db upgrade`"
)


def create_schema(conn: Connection, location: Location) -> None:
    """Build ``location``'s new, empty schema at head, and put the generation triggers on its tables.

    From the models' statements, without importing Alembic or running every
    script (by the scripts a new schema cost 55 ms here, 133 ms the first of
    a process; so 24 and 51 ms); against other scripts (a test's own) they
    run, as :func:`migrate_schema` runs them.
    """
    name = schema_name(location)
    conn.execute(text(f"SET LOCAL search_path TO {quoted(name)}"))
    create_at_head(conn.execution_options(**schema_options(location)))
    generations.install(conn, name)


def migrate_schema(conn: Connection, location: Location, script: ScriptDirectory | None = None) -> None:
    """Migrate ``location``'s schema to the head of ``script`` (this library's scripts when None), and put the
    generation triggers on its tables (:mod:`store.backends.postgres.generations`)."""
    name = schema_name(location)
    conn.execute(text(f"SET LOCAL search_path TO {quoted(name)}"))
    migrate(conn.execution_options(**schema_options(location)), script=script)
    generations.install(conn, name)


def row_counts(conn: Connection, location: Location) -> dict[str, int]:
    """The rows of each table of ``location``'s schema (its version table left out)."""
    name = schema_name(location)
    tables = [t for t in inspect(conn).get_table_names(schema=name) if t != VERSION_TABLE]
    return {t: conn.execute(text(f"SELECT count(*) FROM {quoted(name)}.{quoted(t)}")).scalar_one() for t in tables}


def upgrade_schemas(
    storage: SchemaHost, locations: Iterable[Location], *, script: ScriptDirectory | None = None, dry_run: bool = False
) -> Iterator[UpgradeResult]:
    """Upgrade each schema in its own transaction under its lock (see the module docstring); with ``dry_run``,
    say what each would give (:func:`_would_upgrade`), nothing written."""
    known = known_revisions(script)
    for location in locations:
        where = storage.location_where(location)
        try:
            if dry_run:
                yield _would_upgrade(storage, location, where, known)
                continue
            yield _upgrade(storage, location, where, known, script)
        except JudgestoreError as e:
            yield UpgradeResult(where, UpgradeOutcome.REFUSED, None, None, error=str(e))


def _would_upgrade(storage: SchemaHost, location: Location, where: str, known: Revisions) -> UpgradeResult:
    """A dry run of :func:`_upgrade`, read-only and without the schema's lock: its state and the rows of its
    tables; the migration is not run (a real upgrade runs it in a transaction, so a failure changes nothing)."""
    with storage.connection() as conn:
        storage.metadata(conn, location)
        status = classify(conn, location, known)
        if status.state in USABLE_STATES:
            return UpgradeResult(where, UpgradeOutcome.UP_TO_DATE, status.revision, status.revision)
        if status.state is not DatabaseState.BEHIND:
            error = status_error(status, where)
            return UpgradeResult(where, UpgradeOutcome.REFUSED, status.revision, None, error=error)
        if (lacking := _upgrade_rights_lacking(conn, schema_name(location))) is not None:
            return UpgradeResult(where, UpgradeOutcome.REFUSED, status.revision, None, error=lacking)
        rows = row_counts(conn, location)
    return UpgradeResult(where, UpgradeOutcome.WOULD_UPGRADE, status.revision, known.head, rows=rows)


def _upgrade_rights_lacking(conn: Connection, schema: str) -> str | None:
    """Why the store's user may not upgrade ``schema`` (None: it may): a migration creates tables in it (CREATE on
    it) and alters its tables, which only their owner (or a member of the owner's role) may do. A dry run said
    "would upgrade" for a schema a colleague's login owned, whose upgrade then failed (was)."""
    may_create, foreign = conn.execute(
        text(
            "SELECT has_schema_privilege(CAST(:s AS text), 'CREATE'), ARRAY(SELECT c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND c.relkind IN ('r', 'p') "
            "AND NOT pg_has_role(c.relowner, 'USAGE') ORDER BY c.relname)"
        ),
        {"s": schema},
    ).one()
    if may_create and not foreign:
        return None
    lacks = ([] if may_create else ["CREATE on the schema"]) + (
        [f"ownership of its tables {', '.join(foreign)}"] if foreign else []
    )
    return f"{schema}: the store's user may not upgrade it: it lacks {' and '.join(lacks)}. {OWNER_ADVICE}"


def _upgrade(
    storage: SchemaHost, location: Location, where: str, known: Revisions, script: ScriptDirectory | None
) -> UpgradeResult:
    """:func:`_upgrade_once`, again after a deadlock the server broke by rolling it back (:meth:`retry`)."""
    return storage.retry(lambda: _upgrade_once(storage, location, where, known, script))


def _upgrade_once(
    storage: SchemaHost, location: Location, where: str, known: Revisions, script: ScriptDirectory | None
) -> UpgradeResult:
    migrating = False  # Ctrl-C once it is: the command asks whether its commit finished
    patience_ms = storage.settings.busy_timeout_ms * (storage.settings.lock_retries + 1)  # as a write's
    try:
        with storage.connection(write=True) as conn:
            advisory_lock(conn, schema_name(location))
            storage.metadata(conn, location)
            status = classify(conn, location, known)
            if status.state in USABLE_STATES:
                # made before generations, or before its triggers fired always
                if not generations.installed(conn, schema_name(location)):
                    # its triggers' DDL waits for writers' and readers' tables: as long as a write would, not without
                    # a bound (the write lock's, which bounds every lock wait of the transaction)
                    generations.write_lock(conn, schema_name(location), wait_ms=patience_ms)
                    try:
                        with conn.begin_nested():
                            generations.install(conn, schema_name(location))
                    except DBAPIError as e:
                        if getattr(e.orig, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
                            raise
                        # Usable as it is, read each time (no stamp): not refused, as a colleague's schema was
                        return UpgradeResult(where, UpgradeOutcome.UP_TO_DATE, status.revision, status.revision,
                                             error=f"{where}: {NOT_STAMPED}")  # fmt: skip
                return UpgradeResult(where, UpgradeOutcome.UP_TO_DATE, status.revision, status.revision)
            if status.state is not DatabaseState.BEHIND:
                return UpgradeResult(where, UpgradeOutcome.REFUSED, status.revision, None,
                                     error=status_error(status, where))  # fmt: skip
            # Only a schema to migrate waits for its writers (a current one is reported at once). A writer that
            # committed rows during the migration changed the counts (refused as if rows were lost), or deadlocked
            # with it. The revision cannot move meanwhile: only an upgrade moves it, and this one holds its lock.
            # the migration's DDL waits for a long reader as a write would: the write lock's bound
            generations.write_lock(conn, schema_name(location), wait_ms=patience_ms)
            migrating, before = True, row_counts(conn, location)
            try:
                with conn.begin_nested():  # rolled back as a whole if anything below fails
                    migrate_schema(conn, location, script)
                    after = row_counts(conn, location)
                    if {t: n for t, n in after.items() if t in before} != before:
                        raise UpgradeFailedError(where, f"row counts changed (before {before}, after {after})")
            except Exception as e:  # whatever a migration script raises: its savepoint is rolled back
                said = translated(storage.url, e) if isinstance(e, DBAPIError) else e  # a refused right, by its name
                if isinstance(said, ServerBusyError):  # a deadlock with a reader: the whole transaction again
                    raise
                if isinstance(said, UnexpectedServerError):  # what the schema holds: a rerun fails the same way
                    driver = str(getattr(e, "orig", e)).strip().splitlines()[0]
                    said = UpgradeFailedError(where, f"the migration to {known.head} failed there ({driver})")
                failure = f"{type(said).__name__}: {said}; rolled back, the schema is as it was"
                return UpgradeResult(where, UpgradeOutcome.FAILED, status.revision, None, error=failure)
            reached = classify(conn, location, known).revision
            return UpgradeResult(where, UpgradeOutcome.UPGRADED, status.revision, reached, rows=before)
    except KeyboardInterrupt as e:
        if migrating:
            setattr(e, MIGRATING, where)
        raise
