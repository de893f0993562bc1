"""Record factories: rows whose input hash really is the hash of their input."""

from __future__ import annotations

from datetime import UTC, datetime

from store.descriptor import input_hash, render_messages
from store.records import CompletionRecord, JudgementRecord


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
