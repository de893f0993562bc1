"""Legacy caches built byte for byte as the old code wrote them: raw sqlite3, exact DDL, legacy hashing.

Nothing here uses judgestore's own hashing or rendering: the legacy rules are
written out again with the stdlib (``json.dumps(sort_keys=True,
separators=(",", ":"), ensure_ascii=False)`` and ``hashlib``), so a test that
imports these files checks judgestore against the legacy rule, not against
itself.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

# ---------------------------------------------------------------- the exact legacy DDL (docs/legacy-formats.md)

S0_DDL = """CREATE TABLE annotations (
    benchmark TEXT NOT NULL, instruction_id TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL,
    judge TEXT NOT NULL, judge_input TEXT NOT NULL, judge_completion TEXT NOT NULL,
    reasoning_content TEXT NOT NULL DEFAULT '',
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0, date TEXT NOT NULL DEFAULT '',
    UNIQUE (benchmark, instruction_id, model_a, model_b, judge))"""
S0_OLD_DDL = """CREATE TABLE annotations (
    benchmark TEXT NOT NULL, instruction_id TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL,
    judge TEXT NOT NULL, judge_input TEXT NOT NULL, judge_completion TEXT NOT NULL, date TEXT NOT NULL DEFAULT '',
    UNIQUE (benchmark, instruction_id, model_a, model_b, judge))"""
S1C_DDL = """CREATE TABLE completions (
    instruction_index INTEGER PRIMARY KEY, completion TEXT, pushed_by TEXT, pushed_at TEXT, run_id TEXT)"""
S1J_DDL = """CREATE TABLE judgements (
    id INTEGER PRIMARY KEY AUTOINCREMENT, instruction_index INTEGER NOT NULL, model_A TEXT NOT NULL,
    model_B TEXT NOT NULL, judge_input TEXT, judge_output TEXT, pushed_by TEXT, pushed_at TEXT, run_id TEXT,
    UNIQUE (instruction_index, model_A, model_B))"""
S2_DDL = (
    """CREATE TABLE inference (
    input_hash TEXT PRIMARY KEY, input_text TEXT NOT NULL, output_text TEXT NOT NULL,
    producer_metadata_json TEXT NOT NULL DEFAULT '{}', pushed_by TEXT NOT NULL, pushed_at TEXT NOT NULL,
    run_id TEXT NOT NULL)""",
    """CREATE TABLE inference_metadata (
    input_hash TEXT NOT NULL, metadata_hash TEXT NOT NULL, metadata_json TEXT NOT NULL, observed_at TEXT NOT NULL,
    run_id TEXT NOT NULL, PRIMARY KEY (input_hash, metadata_hash))""",
)
S3C_DDL = """CREATE TABLE completions (
    input_hash TEXT PRIMARY KEY, input_text TEXT NOT NULL, completion TEXT NOT NULL, benchmark TEXT NOT NULL,
    instruction_id TEXT NOT NULL, model TEXT NOT NULL, pushed_at TEXT NOT NULL)"""
S4C_DDL = """CREATE TABLE completions (
    input_hash TEXT PRIMARY KEY, input_text TEXT NOT NULL, completion TEXT NOT NULL, benchmark TEXT NOT NULL,
    instruction_id TEXT NOT NULL, model TEXT NOT NULL, pushed_by TEXT NOT NULL, pushed_at TEXT NOT NULL,
    run_id TEXT NOT NULL)"""
S7C_DDL = S4C_DDL[:-1] + ", usage_json TEXT)"
S3J_DDL = """CREATE TABLE judgements (
    input_hash TEXT PRIMARY KEY, judge_input TEXT NOT NULL, judge_completion TEXT NOT NULL, benchmark TEXT NOT NULL,
    instruction_id TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL, judge TEXT NOT NULL,
    orientation TEXT, pushed_at TEXT NOT NULL)"""
S4J_DDL = """CREATE TABLE judgements (
    input_hash TEXT PRIMARY KEY, judge_input TEXT NOT NULL, judge_completion TEXT NOT NULL, benchmark TEXT NOT NULL,
    instruction_id TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL, judge TEXT NOT NULL,
    orientation TEXT, pushed_by TEXT NOT NULL, pushed_at TEXT NOT NULL, run_id TEXT NOT NULL)"""
S5J_DDL = """CREATE TABLE judgements (
    input_hash TEXT PRIMARY KEY, judge_input TEXT NOT NULL, judge_completion TEXT NOT NULL, benchmark TEXT NOT NULL,
    instruction_id TEXT NOT NULL, model_a TEXT NOT NULL, model_b TEXT NOT NULL, judge TEXT NOT NULL,
    top_logprobs TEXT, orientation TEXT, pushed_by TEXT NOT NULL, pushed_at TEXT NOT NULL, run_id TEXT NOT NULL)"""
S6J_DDL = S5J_DDL.replace("model_b TEXT NOT NULL", "model_b TEXT")
S7J_DDL = S6J_DDL[:-1] + ", usage_json TEXT)"
LANGCHAIN_DDL = """CREATE TABLE full_llm_cache (
    prompt VARCHAR NOT NULL, llm VARCHAR NOT NULL, idx INTEGER NOT NULL, response VARCHAR,
    PRIMARY KEY (prompt, llm, idx))"""

TABLE_OF_DDL = {
    S0_DDL: "annotations",
    S0_OLD_DDL: "annotations",
    S1C_DDL: "completions",
    S1J_DDL: "judgements",
    S3C_DDL: "completions",
    S4C_DDL: "completions",
    S7C_DDL: "completions",
    S3J_DDL: "judgements",
    S4J_DDL: "judgements",
    S5J_DDL: "judgements",
    S6J_DDL: "judgements",
    S7J_DDL: "judgements",
    LANGCHAIN_DDL: "full_llm_cache",
}

# ---------------------------------------------------------------- the legacy hashing rules, restated


def legacy_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rendered_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """S3 onwards: ``{"messages":[{"content","role"}..],"type":"messages"}``."""
    return legacy_dumps(
        {"type": "messages", "messages": [{"role": m["role"], "content": m["content"]} for m in messages]}
    )


def rendered_text(text: str) -> str:
    return legacy_dumps({"type": "text", "text": text})


def s2_rendered(messages: Sequence[Mapping[str, str]] | None = None, text: str | None = None) -> str:
    if messages is not None:
        return legacy_dumps({"kind": "chat", "messages": [dict(m) for m in messages]})
    return legacy_dumps({"kind": "raw", "text": text})


def s2_hash(canonical: str) -> str:
    """S2 hashed the canonical string *as a JSON string* (quoted, escapes included)."""
    return sha(json.dumps(canonical, ensure_ascii=False))


# ---------------------------------------------------------------- awkward content

LONG = "Lorem ipsum dolor sit amet, ünïcödé — 長い文章。" * 6000  # ~250 k characters
AWKWARD_TEXTS = (
    "¿Qué tal? 🙂 naïve café",
    "日本語のテキストと中文",
    "שלום עולם — RTL text مرحبا",
    "e\u0301 (combining) and Å vs A\u030a",
    "tabs\tnewlines\n\r\nand a form feed\f",
    "quotes \" ' and back\\slashes \\n",
    "control \x01\x1f and DEL \x7f and U+2028\u2028",
)


def multi_turn(question: str, answer: str, follow_up: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a helpful assistant. Réponds en français si possible."},
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": follow_up},
    ]


def conversations(n: int) -> list[list[dict[str, str]]]:
    """``n`` distinct conversations, single- and multi-turn, cycling through the awkward texts."""
    result = []
    for i in range(n):
        text = AWKWARD_TEXTS[i % len(AWKWARD_TEXTS)]
        if i % 3 == 2:
            result.append(multi_turn(f"Q{i}: {text}", f"A{i}: {text[::-1]}", f"Follow-up {i} ✓"))
        else:
            result.append([{"role": "user", "content": f"Q{i}: {text}"}])
    return result


def completion_text(i: int) -> str:
    """Completions: one very long, the rest awkward but short."""
    return LONG if i == 1 else f"answer {i}: {AWKWARD_TEXTS[(i + 3) % len(AWKWARD_TEXTS)]}"


# ---------------------------------------------------------------- writing files


def create_db(
    path: Path,
    ddl: str | Sequence[str],
    rows: Iterable[Mapping[str, Any]] = (),
    *,
    table: str | None = None,
    wal: bool = True,
    leave_wal: bool = False,
    alter: Sequence[str] = (),
) -> Path:
    """A legacy SQLite file: DDL, optional ``ALTER TABLE`` statements, rows; WAL unless told otherwise.

    ``leave_wal`` keeps the last transaction in the ``-wal`` file, as a writer
    that was killed leaves it (the file pair is copied while the writer is open).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    statements = [ddl] if isinstance(ddl, str) else list(ddl)
    table = table or TABLE_OF_DDL.get(statements[0])
    assert table is not None
    rows = list(rows)
    staging = path.with_name(path.name + ".staging") if leave_wal else path
    with closing(sqlite3.connect(staging)) as conn:
        if wal:
            conn.execute("PRAGMA journal_mode=WAL")
        if leave_wal:
            conn.execute("PRAGMA wal_autocheckpoint=0")
        for statement in statements:
            conn.execute(statement)
        for statement in alter:
            conn.execute(statement)
        conn.commit()
        for row in rows:
            columns = list(row)
            placeholders = ", ".join("?" for _ in columns)
            names = ", ".join(f'"{c}"' for c in columns)
            conn.execute(f'INSERT INTO "{table}" ({names}) VALUES ({placeholders})', [row[c] for c in columns])
        conn.commit()
        if leave_wal:
            shutil.copyfile(staging, path)
            shutil.copyfile(f"{staging}-wal", f"{path}-wal")
    if leave_wal:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{staging}{suffix}").unlink(missing_ok=True)
    return path


def s3_metadata(
    model: str,
    model_kwargs: Mapping[str, Any],
    *,
    provider: str = "VLLM",
    input_mode: str = "chat",
    backend_version: str | None = "0.32.0",
    **extra: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": "judgearena-inference-cache/v1",
        "provider": provider,
        "model": model,
        "input_mode": input_mode,
        "model_kwargs": dict(model_kwargs),
    }
    if backend_version is not None:
        doc["backend_version"] = backend_version
    doc.update(extra)
    return doc


def legacy_folder(root: Path, kind: str, task: str, provider: str, model: str, metadata: Mapping[str, Any]) -> Path:
    """``{root}/{kind}/{task}/{provider}/{model}/{hash16}/`` with its metadata.json (pretty-printed, as it was)."""
    hash16 = sha(legacy_dumps(metadata))[:16]
    folder = root / kind / quote(task, safe="") / quote(provider, safe="") / quote(model, safe="") / hash16
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=2, ensure_ascii=False), encoding="utf-8")
    return folder


def file_digests(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file under ``roots`` (and the set of names): what "nothing changed on disk" compares."""
    digests = {}
    for root in roots:
        if not root.exists():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests
