"""Helpers of the schema and upgrade tests: the synthetic revision, reading a database without writing to it."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine

import store.schema
from store.schema import migrate, revisions_of
from tests.factories import completion_record, judgement_record

UNKNOWN_REVISION = "9f3e2d1c0b"


def pretend_shipped_scripts_are(script: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the library believe its scripts are ``script`` (a database at the shipped head is then behind)."""
    known = revisions_of(script)
    monkeypatch.setattr(store.schema, "script_directory", lambda: script)
    monkeypatch.setattr(store.schema, "revisions", lambda: known)


def reader(db_path: Path) -> sqlite3.Connection:
    """A connection that writes nothing, not even -wal/-shm files (nobody writes while tests read)."""
    return sqlite3.connect(f"file:{quote(str(db_path))}?immutable=1", uri=True)


def rows_of(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both tables, in the columns the shipped head has (a new column does not hide a lost value)."""
    columns = {
        "completions": "input_hash, sample_index, benchmark, instruction_id, model, finish_reason, run_id, "
        "created_by, created_at, usage, top_logprobs, input_text, completion",
        "judgements": "input_hash, sample_index, benchmark, instruction_id, model_a, model_b, judge, orientation, "
        "finish_reason, run_id, created_by, created_at, usage, top_logprobs, input_text, completion",
    }
    with closing(reader(db_path)) as conn:
        return {t: conn.execute(f"SELECT {c} FROM {t} ORDER BY input_hash").fetchall() for t, c in columns.items()}


def version_of(db_path: Path) -> str:
    with closing(reader(db_path)) as conn:
        return conn.execute("SELECT version_num FROM judgestore_alembic_version").fetchone()[0]


def judgement_columns(db_path: Path) -> list[str]:
    with closing(reader(db_path)) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(judgements)")]


def sample_rows(tag: str, n: int = 6) -> list[Any]:
    return [completion_record(i, completion=f"{tag} answer {i}") for i in range(n)] + [
        judgement_record(i, completion=f"{tag} verdict {i}", pointwise=i % 2 == 0) for i in range(n // 2)
    ]


def at_synthetic_head(db_path: Path, synthetic: Any) -> None:
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.begin() as conn:
        migrate(conn, script=synthetic)
    engine.dispose()
