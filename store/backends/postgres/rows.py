"""PostgreSQL's hot paths: the bulk insert compiled once per schema for psycopg's pipeline, and the bulk lookup.

Contract: :func:`postgres_insert` is one role's ``INSERT ... ON CONFLICT``
for a connection's schema, as SQL for psycopg's executemany (pipeline mode:
one round trip for a batch, as fast as ``COPY``, see ``bench/pg_bench.py``)
with the bind processors SQLAlchemy would apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import JSON, Connection

from store.backends.postgres import text as pgtext
from store.layout import Role
from store.row_checks import OnConflict, insert_statement, table_shape


# (role, on_conflict, schema) -> the PostgreSQL insert's SQL and its columns' bind processors: compiled once per
# process and schema
def _json_text(value: Any) -> str | None:
    return None if value is None else pgtext.dumps_json(value)


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
