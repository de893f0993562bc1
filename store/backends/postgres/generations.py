"""Each descriptor schema's generation on a PostgreSQL server: a stamp that every committed change moves.

Contract:

* The registry schema holds ``generations`` (:data:`~store.backends.postgres.registry.generations`), one row per
  descriptor schema: a counter that a statement-level trigger on each of the
  schema's tables (``judgestore_generation``, calling ``judgestore.touch()``)
  raises by one in each transaction that inserts, updates, deletes or
  truncates there (once: a transaction-local setting marks it raised, so a
  write of many statements costs one raise). The counter is a row, so it
  moves with the writer's transaction: a reader sees it raised exactly when
  it sees the rows that raised it.
  ``touch()`` runs with its owner's rights (``SECURITY DEFINER``), so a role
  that may write a schema's tables needs no grant on the registry.
* The counter's row is locked by each writing transaction from its first
  write until it ends, after the row locks of that first statement: two
  writers would each hold what the other waits for (an enqueue's new claim,
  another enqueue's or a renewal's) and deadlock. So every write transaction
  of a schema's database (:class:`~store.backends.postgres.database.PostgresDatabase`)
  takes :func:`write_lock` first, before any row: its writers take turns in
  one order (they already did from their first write on).
* :func:`install` puts the triggers on a schema's tables, enabled always
  (under ``session_replication_role = replica`` too), and raises its
  counter; creating a schema and upgrading one (:mod:`store.backends.postgres.upgrade`)
  and ``judgestore db upgrade`` of a schema created before generations
  existed, or before its triggers fired always, call it. It is idempotent.
* :func:`stamps` reads, in one statement, each schema's stamp: its counter, a
  digest of its tables as the server's catalog records them (oids, files,
  column counts and row versions: a table dropped, recreated, altered,
  rewritten or restored by hand changes it with no trigger firing) and of
  their triggers' row versions (a trigger disabled and enabled again, as
  ``pg_dump --disable-triggers`` restores do, changes it: the writes between
  fired none), and a
  digest of its registry row, and when the server started. A server's files
  restored from a copy (a backup, a snapshot, a replica promoted) hold the
  same counters, oids and row versions as when they were copied, so writes
  after the restore could reach a stamp the catalog already holds for other
  rows: no such restore happens without a restart, so a restarted server has
  every schema read again, once. A schema whose tables do not all carry the
  trigger enabled always (one made before, or a restore's ``ENABLE TRIGGER
  ALL`` put back as an ordinary one), or that has no counter, has no stamp:
  what is derived from it is never kept (:mod:`store.catalog`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, text

from store.backends.postgres.registry import (
    REGISTRY_SCHEMA,
    SCHEMA_PREFIX,
    TOUCH,
    advisory_lock,
    ensure_registry,
    generations,
    quoted,
)
from store.backends.postgres.survey import SCHEMA_TABLES

TRIGGER = "judgestore_generation"

RAISED = "judgestore.raised_"  # + the schema's name: a transaction's setting saying it has raised that counter

# Once per transaction and schema: the trigger's WHEN skips the call once the transaction has raised the counter (a
# write of N rows through executemany is N statements). The flag is a transaction-local setting, so it ends with
# the transaction, and a rollback to a savepoint undoes it with the raise it marks.
_TOUCH_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {TOUCH}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO {REGISTRY_SCHEMA}.generations AS g (schema_name, generation) VALUES (TG_TABLE_SCHEMA, 1)
    ON CONFLICT (schema_name) DO UPDATE SET generation = g.generation + 1;
    PERFORM set_config('{RAISED}' || TG_TABLE_SCHEMA, 'yes', true);
    RETURN NULL;
END
$$
"""

_RAISE = text(
    f"INSERT INTO {REGISTRY_SCHEMA}.generations AS g (schema_name, generation) VALUES (:name, 1) "
    "ON CONFLICT (schema_name) DO UPDATE SET generation = g.generation + 1"
)

# One row per descriptor schema: its counter, its tables' digest (a sum of hashes: no order, so no sort), its tables,
# those that carry the trigger enabled always (one enabled otherwise misses a replica's writes, or every other:
# believed, it hid them), and its registry row's digest. pg_class is read once for every schema (a scan
# of the server's catalog: the relations themselves are never opened).
_STAMPS = text(
    f"""
WITH relations AS (
    SELECT c.relnamespace AS ns,
           sum(hashtextextended(concat_ws('.', c.oid, c.relfilenode, c.relnatts, c.xmin, t.xmin), 0)) AS digest,
           count(*) AS tables,
           count(t.tgrelid) AS triggered
    FROM pg_class c
    LEFT JOIN (SELECT tgrelid, xmin FROM pg_trigger WHERE tgname = '{TRIGGER}' AND tgenabled = 'A') AS t
        ON t.tgrelid = c.oid
    WHERE c.relkind = 'r'
      AND c.relnamespace IN (SELECT oid FROM pg_namespace WHERE starts_with(nspname, '{SCHEMA_PREFIX}'))
    GROUP BY c.relnamespace
)
SELECT n.nspname, g.generation, CAST(s.digest AS text), s.tables, s.triggered, md5(r.metadata_json),
       CAST(pg_postmaster_start_time() AS text)
FROM relations AS s
JOIN pg_namespace AS n ON n.oid = s.ns
LEFT JOIN {REGISTRY_SCHEMA}.generations AS g ON g.schema_name = n.nspname
LEFT JOIN {REGISTRY_SCHEMA}.registry AS r ON r.schema_name = n.nspname
"""
)


def write_lock(conn: Connection, name: str, *, wait_ms: int | None = None) -> None:
    """Take schema ``name``'s write lock for the caller's transaction (see the module docstring): an advisory
    lock, which needs no grant on the registry, of its own (not the schema's creation and upgrade lock, which a
    transaction may hold while another of the same process writes). ``wait_ms``: as
    :func:`~store.backends.postgres.registry.advisory_lock`'s."""
    advisory_lock(conn, f"{name}:writes", wait_ms=wait_ms)


def _ensure_touch(conn: Connection) -> None:
    """Create the registry's tables and ``touch()`` where they are missing."""
    ensure_registry(conn)
    if conn.execute(text("SELECT to_regproc(:f)"), {"f": TOUCH}).scalar() is None:
        conn.execute(text(_TOUCH_FUNCTION))


def install(conn: Connection, name: str) -> None:
    """Put the generation trigger on each table of schema ``name`` and raise its counter (idempotent; inside the
    caller's transaction, which holds the schema's advisory lock)."""
    _ensure_touch(conn)
    for table, _ in _tables(conn, name):
        target = f"{quoted(name)}.{quoted(table)}"
        conn.execute(text(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {target}"))
        conn.execute(text(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {target} "
            f"FOR EACH STATEMENT WHEN (current_setting('{RAISED}{name}', true) IS DISTINCT FROM 'yes') "
            f"EXECUTE FUNCTION {TOUCH}()"))  # fmt: skip
        # Fired under session_replication_role = replica too (a logical replica's apply, a restore's load), where
        # an ordinary trigger is not: such writes left the counter, and what was derived, as it was (was)
        conn.execute(text(f"ALTER TABLE {target} ENABLE ALWAYS TRIGGER {TRIGGER}"))
    conn.execute(_RAISE, {"name": name})


def forget(conn: Connection, name: str) -> None:
    """Drop schema ``name``'s counter (the schema is being dropped in the caller's transaction)."""
    if conn.dialect.has_table(conn, generations.name, schema=REGISTRY_SCHEMA):
        conn.execute(generations.delete().where(generations.c.schema_name == name))


def installed(conn: Connection, name: str) -> bool:
    """Whether every table of schema ``name`` carries the trigger and the schema has a counter."""
    if not conn.dialect.has_table(conn, generations.name, schema=REGISTRY_SCHEMA):
        return False
    counter = conn.execute(select(generations.c.generation).where(generations.c.schema_name == name)).scalar()
    tables = _tables(conn, name)
    return counter is not None and bool(tables) and all(triggered for _, triggered in tables)


def _tables(conn: Connection, name: str) -> list[tuple[str, bool]]:
    """The tables a descriptor schema holds, and whether each carries the trigger enabled always (looked up by name:
    selecting a schema's relations by namespace scans every relation of every schema)."""
    found = conn.execute(
        text(
            "SELECT t, EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = to_regclass(format('%I.%I', "
            f"CAST(:n AS text), t)) AND g.tgname = '{TRIGGER}' AND g.tgenabled = 'A') "
            "FROM unnest(CAST(:tables AS text[])) AS t WHERE to_regclass(format('%I.%I', CAST(:n AS text), t)) "
            "IS NOT NULL ORDER BY t"
        ),
        {"n": name, "tables": list(SCHEMA_TABLES)},
    )
    return [(table, bool(triggered)) for table, triggered in found]


def stamps(conn: Connection) -> dict[str, list[Any] | None]:
    """Each descriptor schema's stamp (see the module docstring; None: it has none), in one statement."""
    if not conn.dialect.has_table(conn, generations.name, schema=REGISTRY_SCHEMA):
        return {}
    found: dict[str, list[Any] | None] = {}
    for name, generation, relations, tables, triggered, metadata, started in conn.execute(_STAMPS):
        stamped = generation is not None and tables and triggered == tables
        found[name] = [generation, relations, metadata, started] if stamped else None
    return found
