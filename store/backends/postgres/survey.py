"""A server store listed in a few statements, however many schemas it holds.

Contract: each function answers for many descriptor schemas at once, in
``UNION ALL`` statements of :data:`EXISTS_BATCH` schemas (never a round trip
per schema, and never a catalog query that scans every relation per schema:
tables are looked up by name): :func:`survey` (registry rows, revisions, row
counts, sizes), :func:`claims_of` (shared batches' claims), :func:`matching`
(the schemas a row filter may match), :func:`distinct_values` (what a catalog
keeps to rule schemas out without reading them) and :func:`schema_revisions`. Callers
give each transaction at most :data:`EXISTS_BATCH` schemas, so that the
locks it holds stay few. A schema these cannot read is left out of their
answers; :class:`PostgresStorage` then reads it alone, which says what is
wrong with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, String, any_, bindparam, literal_column, select, text
from sqlalchemy.exc import DBAPIError

from store.backends.postgres import text as pgtext
from store.backends.postgres.registry import quoted, registry, schema_name, schema_options
from store.backends.postgres.rows import PostgresClaimTable, PostgresRepository
from store.claim_table import ClaimsSummary
from store.layout import Location
from store.roles import Role
from store.schema import VERSION_TABLE
from store.tables.filters import DISTINCT_LIMIT, VALUE_COLUMNS, RowFilter
from store.tables.models import Base

# Schemas per statement, and per transaction in the callers: a transaction holds a lock on every table it reads
# until it ends (about 13 per schema for a listing), and a server has max_locks_per_transaction x max_connections
# of them in all (6,400 by default): 5,000 schemas in one transaction ran out ("out of shared memory").
EXISTS_BATCH = 200
SIZES = text(
    "SELECT s, coalesce(sum(pg_total_relation_size(to_regclass(format('%I.%I', s, t)))), 0) "
    "FROM unnest(CAST(:names AS text[])) AS s CROSS JOIN unnest(CAST(:tables AS text[])) AS t GROUP BY s"
)  # bytes each schema's tables take, looked up by name (see PostgresStorage.size_of)
SCHEMA_TABLES = (*Base.metadata.tables, VERSION_TABLE)  # what a descriptor schema holds
PROBE_SCHEMA = "js_x_probe"  # stands for each schema's name in the probe's SQL (names are [a-z0-9_])


def schema_revisions(conn: Connection, names: list[str]) -> dict[str, str]:
    """The revision each of the schemas ``names`` records, where it has its version table with one row."""
    versioned = {name for (name,) in conn.execute(text(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = :t AND c.relkind = 'r'"), {"t": VERSION_TABLE})}  # fmt: skip
    probed = [name for name in names if name in versioned]
    seen: dict[str, list[str]] = {}
    for start in range(0, len(probed), EXISTS_BATCH):
        union = " UNION ALL ".join(
            f"SELECT '{name}', version_num FROM {quoted(name)}.{quoted(VERSION_TABLE)}"
            for name in probed[start : start + EXISTS_BATCH]
        )
        for name, revision in conn.exec_driver_sql(union):
            seen.setdefault(name, []).append(revision)
    return {name: found[0] for name, found in seen.items() if len(found) == 1}


def _probe(conn: Connection, role: Role, flt: RowFilter) -> tuple[str, dict[str, Any]]:
    """The SQL (for the driver) selecting ``PROBE_SCHEMA``'s name if its table holds a row ``flt`` matches."""
    repo = PostgresRepository(conn, role)
    stmt: Select[Any] = (
        select(literal_column(f"'{PROBE_SCHEMA}'").label("s"))
        .select_from(repo.table)
        .where(*repo.clauses(flt))
        .limit(1)
    )
    dialect = conn.dialect
    compiled = stmt.compile(dialect=dialect, schema_translate_map={None: PROBE_SCHEMA}, render_schema_translate=True)
    expanded = compiled.construct_expanded_state()  # IN lists spelt out, one parameter per item
    # The driver gets what SQLAlchemy would send: each value through its column type's bind processor (text
    # escaped as it was stored, store.backends.postgres.text), the items of an IN list through theirs.
    processors = {name: b.type.dialect_impl(dialect).bind_processor(dialect) for name, b in compiled.binds.items()}
    processors.update(expanded.processors)
    params = {
        name: value if (process := processors.get(name)) is None else process(value)
        for name, value in expanded.parameters.items()
    }
    return expanded.statement, params


def matching(conn: Connection, chosen: list[Location], flt: RowFilter, head: str) -> set[Location]:
    """The ``chosen`` locations whose schemas may hold a row ``flt`` matches: those that do (one ``UNION ALL`` of
    ``LIMIT 1`` probes per :data:`EXISTS_BATCH` schemas), and those without the role's table or at a revision
    other than ``head``, or in a batch the server refused (opening them says what is wrong, or upgrades them)."""
    keep: set[Location] = set()
    tables = {(name, table) for name, table in conn.execute(text(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname IN ('completions', 'judgements') AND c.relkind = 'r'"))}  # fmt: skip
    current = {name for name, revision in schema_revisions(conn, [schema_name(loc) for loc in chosen]).items()
               if revision == head}  # fmt: skip
    for role in ("completions", "judgements"):
        mine = [loc for loc in chosen if loc.role == role]
        usable = {loc for loc in mine if (schema_name(loc), role) in tables and schema_name(loc) in current}
        keep.update(loc for loc in mine if loc not in usable)  # opening them says what is wrong
        probed = [loc for loc in mine if loc in usable]
        if not probed:
            continue
        sql, params = _probe(conn, role, flt)
        for start in range(0, len(probed), EXISTS_BATCH):
            batch = {schema_name(loc): loc for loc in probed[start : start + EXISTS_BATCH]}
            union = " UNION ALL ".join(f"({sql.replace(PROBE_SCHEMA, name)})" for name in batch)
            try:
                with conn.begin_nested():
                    keep.update(batch[name] for (name,) in conn.exec_driver_sql(union, params))
            except DBAPIError as e:
                if e.connection_invalidated:  # a lost connection is no refusal of this batch: the read fails typed
                    raise
                keep.update(batch.values())
    return keep


def survey(
    conn: Connection, names: dict[str, Location], head: str | None
) -> tuple[dict[str, str], dict[str, str], dict[str, int], dict[str, int]]:
    """The registry rows, the one revision, the row count (schemas at revision ``head``; none without one) and
    the size of each schema."""
    from sqlalchemy.dialects import postgresql

    if not names or not conn.dialect.has_table(conn, registry.name, schema=registry.schema):
        return {}, {}, {}, {}
    wanted = list(names)
    keys = bindparam("names", type_=postgresql.ARRAY(String))
    found = conn.execute(
        select(registry.c.schema_name, registry.c.metadata_json).where(registry.c.schema_name == any_(keys)),
        {"names": wanted},
    )
    rows = {name: metadata_json for name, metadata_json in found}
    probed = [name for name in wanted if name in rows]
    versions = schema_revisions(conn, probed)
    probed = [name for name in probed if name in versions]
    counts: dict[str, int] = {}
    if head is not None:
        current = [name for name in probed if versions.get(name) == head]
        for start in range(0, len(current), EXISTS_BATCH):
            union = " UNION ALL ".join(
                f"SELECT '{name}', count(*) FROM {quoted(name)}.{quoted(names[name].role)}"
                for name in current[start : start + EXISTS_BATCH]
            )
            counts.update((name, int(n)) for name, n in conn.exec_driver_sql(union))
    sizes = {name: int(size) for name, size in conn.execute(SIZES, {"names": wanted, "tables": list(SCHEMA_TABLES)})}
    return rows, versions, counts, sizes


def claims_of(conn: Connection, current: dict[str, Location]) -> dict[str, ClaimsSummary]:
    """The shared batches' claims of each current schema, as ``PostgresStorage.info`` reads them: one statement counts
    every schema's claims (:data:`EXISTS_BATCH` schemas each), and only a schema holding some is read whole."""
    names = list(current)
    held: list[str] = []
    for start in range(0, len(names), EXISTS_BATCH):
        union = " UNION ALL ".join(
            f"SELECT '{name}', count(*) FROM {quoted(name)}.claims" for name in names[start : start + EXISTS_BATCH]
        )
        held += [name for name, n in conn.exec_driver_sql(union) if n]
    found = dict.fromkeys(names, ClaimsSummary())
    for name in held:
        mapped = conn.execution_options(**schema_options(current[name]))
        found[name] = PostgresClaimTable(mapped, current[name].role).summary()
    return found


def distinct_values(
    conn: Connection, chosen: list[Location], head: str
) -> dict[Location, dict[str, list[str | None] | None] | None]:
    """The distinct values of each role's :data:`~store.tables.filters.VALUE_COLUMNS` in each of the ``chosen``
    schemas at revision ``head`` (a column with more than :data:`~store.tables.filters.DISTINCT_LIMIT`: None for
    it), one ``UNION ALL`` per :data:`EXISTS_BATCH` schemas; None for a schema that is not at ``head`` or in a
    batch the server refused (nothing is known of it)."""
    current = {name for name, revision in schema_revisions(conn, [schema_name(loc) for loc in chosen]).items()
               if revision == head}  # fmt: skip
    found: dict[Location, dict[str, list[str | None] | None] | None] = dict.fromkeys(chosen)
    readable = [loc for loc in chosen if schema_name(loc) in current]
    for start in range(0, len(readable), EXISTS_BATCH):
        batch = {schema_name(loc): loc for loc in readable[start : start + EXISTS_BATCH]}
        union = " UNION ALL ".join(
            f"(SELECT '{name}', '{column}', v FROM (SELECT DISTINCT {quoted(column)} AS v "
            f"FROM {quoted(name)}.{quoted(loc.role)} LIMIT {DISTINCT_LIMIT + 1}) AS d)"
            for name, loc in batch.items()
            for column in VALUE_COLUMNS[loc.role]
        )
        seen: dict[str, dict[str, list[str | None]]] = {name: {} for name in batch}
        try:
            with conn.begin_nested():
                for name, column, value in conn.exec_driver_sql(union):
                    seen[name].setdefault(column, []).append(None if value is None else pgtext.unescape(value))
        except DBAPIError as e:
            if e.connection_invalidated:  # a lost connection is no refusal of this batch: the read fails typed
                raise
            continue
        for name, loc in batch.items():
            columns = seen[name]
            found[loc] = {column: (values if len(values := columns.get(column, [])) <= DISTINCT_LIMIT else None)
                          for column in VALUE_COLUMNS[loc.role]}  # fmt: skip
    return found
