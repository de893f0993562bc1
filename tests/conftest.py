"""Fixtures every test shares: an isolated store root and small record factories."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from store.descriptor import ModelDescriptor, input_hash, render_messages
from store.records import CompletionRecord, JudgementRecord
from store.settings import Settings
from store.store import Store


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches a real store: the default root points into the test's temp folder."""
    for name in list(__import__("os").environ):
        if name.startswith("JUDGESTORE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JUDGESTORE_STORE_ROOT", str(tmp_path / "store"))
    monkeypatch.setenv("JUDGESTORE_RUN_ID", "test-run")
    monkeypatch.setenv("JUDGESTORE_CREATED_BY", "tester")


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> Iterator[Store]:
    with Store(Settings(), root=store_root) as s:
        yield s


@pytest.fixture
def descriptor() -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0, "max_tokens": 64})


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
