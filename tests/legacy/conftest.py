"""Helpers for the legacy-import tests: run an import, read the store back through the ORM, checksum rows."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from store import jsonvalues
from store.backends.sqlite.connections import create_sqlite_engine
from store.descriptor import ModelDescriptor
from store.layout import walk
from store.legacy.detect import Detection, detect
from store.legacy.importer import Attribution, ImportOptions, ImportProgress, import_sources
from store.legacy.inputs import InputsTable
from store.legacy.report import ImportReport
from store.settings import Settings
from store.store import Store
from store.tables.models import MODEL_OF_ROLE
from tests.built_once import built_once

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT = ModelDescriptor(provider="vllm", model="legacy-model", sampling={"temperature": 0.0, "max_tokens": 64})
TEXT = ModelDescriptor(provider="vllm", model="legacy-model", input_mode="text", sampling={"max_tokens": 64})
ROW_FIELDS = (
    "input_hash",
    "sample_index",
    "input_text",
    "completion",
    "benchmark",
    "instruction_id",
    "model",
    "model_a",
    "model_b",
    "judge",
    "orientation",
    "usage",
    "top_logprobs",
    "run_id",
    "created_by",
    "created_at",
)


def fixed(descriptor: ModelDescriptor = CHAT, *assumptions: str) -> Callable[[Detection], Attribution]:
    """A resolver that attributes every source to ``descriptor`` (the user's --descriptor, in library form)."""
    return lambda _detection: Attribution(descriptor, assumptions)


def run_import(
    sources: Sequence[Path],
    store_root: Path,
    resolver: Callable[[Detection], Attribution] | None = None,
    *,
    task: str | None = None,
    dry_run: bool = False,
    inputs: Path | None = None,
    chunk_size: int = 7,
    on_progress: Callable[[ImportProgress], None] | None = None,
) -> ImportReport:
    """Detect and import ``sources``; every source report must balance (every row accounted for)."""
    resolver = resolver or fixed()
    result = detect(sources)
    options = ImportOptions(
        task=task, dry_run=dry_run, chunk_size=chunk_size, inputs=InputsTable.load(inputs) if inputs else None
    )
    with Store(Settings(), root=store_root, readonly=dry_run) as store:
        report = import_sources(result.detections, store, resolver, options, on_progress=on_progress)
    for source in report.sources:
        assert source.balanced(), source.as_dict()
    return report


def row_dict(obj: Any) -> dict[str, Any]:
    values: dict[str, Any] = {name: getattr(obj, name, None) for name in ROW_FIELDS}
    values["created_at"] = values["created_at"].astimezone(UTC).isoformat()
    return values


def stored_rows(store_root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row of every descriptor database, read with ORM sessions, keyed by the database's folder."""
    found: dict[str, list[dict[str, Any]]] = {}
    settings = Settings()
    for location in walk(store_root):
        engine = create_sqlite_engine(location.db_path(store_root), settings, readonly=True)
        model = MODEL_OF_ROLE[location.role]
        with Session(engine) as session:
            found[str(location.relative_folder())] = [row_dict(r) for r in session.scalars(select(model))]
        engine.dispose()
    return found


def all_rows(store_root: Path) -> list[dict[str, Any]]:
    return [row for rows in stored_rows(store_root).values() for row in rows]


def checksum(rows: Iterable[dict[str, Any]]) -> str:
    """Order-independent digest of row contents."""
    lines = sorted(jsonvalues.dumps_bytes(r) for r in rows)  # infinities stay distinct from None
    return hashlib.sha256(b"\n".join(lines)).hexdigest()


def expected_row(**values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row["sample_index"] = 0
    row.update(values)
    created = row["created_at"]
    if isinstance(created, datetime):
        row["created_at"] = created.astimezone(UTC).isoformat()
    return row


def utc(text: str) -> str:
    """A legacy ISO time as judgestore stores it (no offset means UTC)."""
    parsed = datetime.fromisoformat(text)
    return (parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)).isoformat()


def mtime(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()


def judgestore(*args: str, env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """The `judgestore` CLI (with `import` registered) in a fresh process."""
    code = "from inference.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def legacy_root(tmp_path: Path) -> Path:
    return tmp_path / "legacy"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny local model of inference.backends.vllm.tiny_model (the inference tests' own, built once per run)."""
    from inference.backends.vllm.tiny_model import build_tiny_model

    return (
        built_once(tmp_path_factory, "tiny-model", lambda f: build_tiny_model(f / "tiny-llama", seed=0)) / "tiny-llama"
    )
