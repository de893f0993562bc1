"""Record factories (rows whose input hash really is the hash of their input) and test databases."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import time
from collections.abc import Iterable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from sqlalchemy import Connection, Table, insert, inspect

from store.backends.sqlite.catalog import RACY_NS
from store.backends.sqlite.database import SqliteDatabase
from store.backends.sqlite.rows import SqliteRepository
from store.descriptor import ModelDescriptor, input_hash, render_messages
from store.roles import Role
from store.schema import revisions
from store.settings import Settings
from store.store import Store
from store.tables.models import MODEL_OF_ROLE
from store.tables.records import RECORD_OF_ROLE, CompletionRecord, JudgementRecord, Record


def completion_record(
    i: int, *, model: str = "model-a", benchmark: str = "mt-bench", **overrides: object
) -> CompletionRecord:
    """A completion row for prompt ``i`` whose hash really is the hash of its input."""
    text = render_messages([{"role": "user", "content": f"question {i}: ¿qué tal? 🙂"}])
    values: dict[str, object] = {
        "input_hash": input_hash(text),
        "input_text": text,
        "completion": f"answer {i}",
        "benchmark": benchmark,
        "instruction_id": str(i),
        "model": model,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 10 + i, "completion_tokens": 3},
        "top_logprobs": {"A": -0.25, "B": -1.5} if i % 2 else None,
        "run_id": "run-1",
        "created_by": "tester",
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    values.update(overrides)
    return CompletionRecord(**values)  # type: ignore[arg-type]


def judgement_record(
    i: int, *, pointwise: bool = False, orientation: str | None = "direct", **overrides: object
) -> JudgementRecord:
    """A judgement row (pairwise unless ``pointwise``) whose hash is the hash of its input."""
    text = render_messages(
        [{"role": "system", "content": "judge"}, {"role": "user", "content": f"pair {i} {orientation}"}]
    )
    values: dict[str, object] = {
        "input_hash": input_hash(text),
        "input_text": text,
        "completion": f"[[A]] {i}",
        "benchmark": "arena-hard",
        "instruction_id": str(i),
        "model_a": "model-a",
        "model_b": None if pointwise else "model-b",
        "judge": "judge-1",
        "orientation": None if pointwise else orientation,
        "top_logprobs": {"A": -0.1, "B": -2.3},
        "run_id": "run-1",
        "created_by": "tester",
        "created_at": datetime(2026, 1, 2, tzinfo=UTC),
    }
    values.update(overrides)
    return JudgementRecord(**values)  # type: ignore[arg-type]


# ---------------------------------------------------------------- files and databases


def settled() -> None:
    """Wait until the files written so far have stood still past a folder store's racy window
    (:data:`store.backends.sqlite.catalog.RACY_NS`): a catalog taken after it is believed by the next command, one
    taken before is not (a database just written is read again)."""
    time.sleep(1.5 * RACY_NS / 1e9)


SYNTHETIC_REVISIONS = Path(__file__).parent / "store" / "revisions"  # a synthetic revision on top of the shipped head
SHIPPED_HEAD = revisions().head  # the newest revision the library ships
SYNTHETIC_HEAD = "9001"  # tests/store/revisions/9001_add_judgement_reviewer_note.py


def file_digests(*folders: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folders``: equal before and after means nothing was written."""
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def current_database(
    root: Path, role: str, task: str, descriptor: ModelDescriptor, records: Iterable[Record] = ()
) -> Path:
    """A database made by the store (WAL, at head) holding ``records``; the store is closed again.

    Records of the other role go to the other table of the same file (every file holds both
    tables), so schema tests can check that rows of both survive an upgrade.
    """
    rows = list(records)
    with Store(Settings(), root=root) as s:
        database = s.database(role, task, descriptor)
        with database.transaction() as repo:
            for table_role, record_type in RECORD_OF_ROLE.items():
                SqliteRepository(repo.conn, cast(Role, table_role)).put_many(r for r in rows if type(r) is record_type)
        assert isinstance(database, SqliteDatabase)  # a folder store's database is a file
        return database.path


def put_at_old_revision(conn: Connection, role: str, records: Iterable[Record]) -> None:
    """Insert rows into a database an older revision made: only the columns its table has yet."""
    table = cast(Table, MODEL_OF_ROLE[role].__table__)
    present = {column["name"] for column in inspect(conn).get_columns(table.name)}
    rows = [{k: v for k, v in dataclasses.asdict(r).items() if k in present} for r in records]
    conn.execute(insert(table), rows)


def stamp(db_path: Path, revision: str) -> None:
    """Rewrite the revision a database records, as another judgestore version would have left it."""
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE judgestore_alembic_version SET version_num = ?", (revision,))


def hide_a_row_in_a_page(db_path: Path, table: str) -> None:
    """Damage the file as a torn write can: the leaf page holding ``table``'s rows counts one cell fewer.

    SQLite still opens the file and reads every row but the last of that page; ``quick_check`` sees it.
    """
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    with open(db_path, "r+b") as f:
        f.seek((root - 1) * page_size)
        header = f.read(5)
        assert header[0] == 0x0D, "the table's rows must fit its root page (a leaf) for this damage"
        f.seek((root - 1) * page_size + 3)
        f.write((int.from_bytes(header[3:5], "big") - 1).to_bytes(2, "big"))


def hide_a_row_from_an_index(db_path: Path, table: str, index: str) -> None:
    """Damage the file as another tool can: a row is added to ``table`` while ``index`` is not kept up to date.

    Everything that reads through the index (an ordering by its columns) misses the row; ``count(*)`` may too.
    """
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        (sql, root) = conn.execute("SELECT sql, rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("DELETE FROM sqlite_master WHERE name = ?", (index,))
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        row = conn.execute(f"SELECT * FROM {table} LIMIT 1").fetchone()
        columns = [c[1] for c in conn.execute(f"PRAGMA table_info({table})")]
        hidden = completion_record(99, model="hidden")
        values = dict(zip(columns, row, strict=True)) | {
            "input_hash": hidden.input_hash,
            "input_text": hidden.input_text,
            "completion": "the hidden answer",
        }
        conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})", [values[c] for c in columns])
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('index', ?, ?, ?, ?)",
            (index, table, root, sql),
        )


def foreign_database(db_path: Path, kind: str = "optuna") -> None:
    """An SQLite file another tool made: ``optuna`` (its own ``alembic_version``) or ``random`` tables."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(db_path)) as conn, conn:
        if kind == "optuna":
            conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
            conn.execute("INSERT INTO alembic_version VALUES ('v3.2.0.a')")
            conn.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name TEXT)")
            conn.execute("CREATE TABLE trials (trial_id INTEGER PRIMARY KEY, study_id INTEGER, value REAL)")
            conn.execute("INSERT INTO studies VALUES (1, 'demo')")
        else:
            conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
            conn.execute("CREATE TABLE tags (note_id INTEGER, tag TEXT)")
            conn.execute("INSERT INTO notes VALUES (1, 'hello')")


QWEN = ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0})
LLAMA = ModelDescriptor(provider="vllm", model="meta-llama/Llama-3.1-8B", sampling={"temperature": 0.0})
JUDGE = ModelDescriptor(provider="vllm", model="judge-1", sampling={"temperature": 0.0, "max_tokens": 8})


def left_behind(*paths: Path) -> None:
    """Date ``paths`` an hour back: what a crash left, not what a live process is creating (verify's grace)."""
    an_hour_ago = datetime.now(UTC).timestamp() - 3600
    for path in paths:
        os.utime(path, (an_hour_ago, an_hour_ago))


def fill_small_store(root: Path) -> Path:
    """Two completion databases (3 + 2 rows) and one judgement database (4 pairwise + 1 pointwise)."""
    with Store(Settings(), root=root) as store:
        store.database("completions", "mt-bench", QWEN).put_many([completion_record(i, model="qwen") for i in range(3)])
        store.database("completions", "mt-bench", LLAMA).put_many(
            [completion_record(i, model="llama", run_id="run-2") for i in range(10, 12)]
        )
        store.database("judgements", "arena-hard", JUDGE).put_many(
            [judgement_record(i, orientation=o) for i in range(2) for o in ("direct", "reversed")]
            + [judgement_record(7, pointwise=True, run_id="run-2")]
        )
    return root
