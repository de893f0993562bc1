"""Server stores keep U+0000: their text is stored escaped, and values written before are escaped to match.

What changes: no table or index changes, and nothing on SQLite. On
PostgreSQL, judgestore from this revision on stores every text column (and
every string inside a JSON column, keys included) with U+0000 written as
U+FDD0 "0" and U+FDD0 itself as U+FDD0 "1" (``store.backends.postgres.text``), because
PostgreSQL's ``text`` cannot hold U+0000 and its ``json`` cannot read it.
Values written before this revision are stored verbatim: this revision
rewrites the few that the new reading would change, the values holding U+FDD0
(a Unicode noncharacter, which real text almost never holds) in
``completions``, ``judgements``, ``runs`` and ``adoptions``, and the JSON
values holding ``\\u0000`` (a logprob candidate whose text is U+0000, which
psycopg let through inside JSON), which are rewritten in the escaped form.
Why: issue 20. A server store must keep every value a folder store keeps,
byte for byte: the demo's own completions hold U+0000. Without the rewrite,
a value written before this revision that holds U+FDD0 followed by "0" or
"1" would read back changed.
Data impact: every value reads back exactly as it was written; only values
holding U+FDD0 or a JSON ``\\u0000`` are rewritten (their stored form
changes, not their value). Row counts, keys and every other value are
unchanged. The registry's names are not rewritten here: ``store.backends.postgres.registry``
tells an old verbatim name from an escaped one by the schema's name.
Expected cost: on SQLite nothing. On PostgreSQL one sequential read of every
text and JSON value of the four tables (TOAST included: about the time a
``SELECT`` of every row takes, seconds per GB), and an UPDATE of the rows
found, which in practice are none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here on purpose: a migration must not change when store.backends.postgres.text does.
_ESCAPE = "\ufdd0"
_NUL_IN_JSON = "\\u0000"
# table -> (its key, its text columns, its JSON columns), as revision 0004 left them
_TABLES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "completions": (
        "input_hash",
        ("benchmark", "instruction_id", "model", "finish_reason", "run_id", "created_by", "input_text", "completion"),
        ("usage", "top_logprobs"),
    ),
    "judgements": (
        "input_hash",
        (
            "benchmark",
            "instruction_id",
            "model_a",
            "model_b",
            "judge",
            "orientation",
            "finish_reason",
            "run_id",
            "created_by",
            "input_text",
            "completion",
        ),
        ("usage", "top_logprobs"),
    ),
    "runs": ("id", ("role", "run_id", "created_by", "mode"), ()),
    "adoptions": ("id", ("source_task", "run_id", "created_by"), ("details",)),
}


def _escape(value: str) -> str:
    return value.replace(_ESCAPE, _ESCAPE + "1").replace("\0", _ESCAPE + "0")


def _escaped_json(value: Any) -> Any:
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, dict):
        return {_escape(k): _escaped_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped_json(v) for v in value]
    return value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _escape_text_columns(conn: sa.Connection, table: str, columns: tuple[str, ...]) -> None:
    # Before this revision no value holds an escape sequence, so replacing U+FDD0 by its escape is exact.
    assignments = ", ".join(f"{c} = replace({c}, :escape, :escaped)" for c in columns)
    found = " OR ".join(f"strpos({c}, :escape) > 0" for c in columns)
    parameters = {"escape": _ESCAPE, "escaped": _ESCAPE + "1"}
    conn.execute(sa.text(f"UPDATE {table} SET {assignments} WHERE {found}"), parameters)


def _escape_json_column(conn: sa.Connection, table: str, key: str, column: str) -> None:
    # The JSON text of a value may spell a character raw or as an escape: decoded and encoded again in Python.
    rows = conn.execute(
        sa.text(
            f"SELECT {key}, {column}::text FROM {table} "
            f"WHERE strpos({column}::text, :escape) > 0 OR strpos({column}::text, :nul) > 0"
        ),
        {"escape": _ESCAPE, "nul": _NUL_IN_JSON},
    ).all()
    updates = [{"key": k, "value": _canonical(_escaped_json(json.loads(v)))} for k, v in rows]
    if updates:
        conn.execute(sa.text(f"UPDATE {table} SET {column} = CAST(:value AS json) WHERE {key} = :key"), updates)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return  # SQLite keeps every value as it was given: nothing is escaped there
    for table, (key, texts, jsons) in _TABLES.items():
        _escape_text_columns(conn, table, texts)
        for column in jsons:
            _escape_json_column(conn, table, key, column)


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
