"""Generated S4c and S6j caches: whatever text they hold, every row comes back exactly, under its legacy hash."""

from __future__ import annotations

import math
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.descriptor import input_hash
from store.logprobs import from_text_logprobs
from tests.legacy import builders as b
from tests.legacy.conftest import all_rows, checksum, expected_row, run_import, utc

# Any Unicode scalar value (surrogates cannot be encoded, so no legacy file could hold them).
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=120)
NONEMPTY = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=400)
ROLE = st.sampled_from(["system", "user", "assistant"])
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLE, "content": TEXT}), min_size=1, max_size=4)
TIME = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(lambda d: d.isoformat())
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
LEGACY_ORIENTATIONS = {"direct": "direct", "reversed": "reversed", "forward": "direct", "swapped": "reversed"}


def _unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({b.rendered_messages(r["messages"]): r for r in rows}.values())


S4C_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "messages": MESSAGES,
            "completion": NONEMPTY,
            "benchmark": TEXT,
            "instruction_id": TEXT,
            "model": TEXT,
            "pushed_by": TEXT,
            "pushed_at": TIME,
            "run_id": TEXT,
        }
    ),
    max_size=15,
).map(_unique)


def _pointwise_single(row: dict[str, Any]) -> dict[str, Any]:
    """A legacy ``single`` row has no model_b (one beside a model_b fails: ``test_convert``)."""
    return {**row, "model_b": None} if row["orientation"] == "single" else row


S6J_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "messages": MESSAGES,
            "completion": NONEMPTY,
            "benchmark": TEXT,
            "instruction_id": TEXT,
            "model_a": TEXT.filter(str.strip),  # a blank one fails its row (test_convert)
            "model_b": st.none() | TEXT.filter(str.strip),  # a blank one is pointwise, as None
            "judge": TEXT,
            "orientation": st.sampled_from([None, "single", *LEGACY_ORIENTATIONS]),
            "top_logprobs": st.none()
            | st.dictionaries(TEXT, st.floats(-50, 0, allow_nan=False) | st.just(-math.inf), max_size=4),
            "pushed_by": TEXT,
            "pushed_at": TIME,
            "run_id": TEXT,
        }
    ).map(_pointwise_single),
    max_size=15,
).map(_unique)


def _import(kind: str, ddl: str, legacy_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = b.legacy_folder(root / "legacy", kind, "task", "VLLM", "m", b.s3_metadata("m", {}))
        b.create_db(folder / f"{kind}.db", ddl, legacy_rows)
        report = run_import([root / "legacy"], root / "store", chunk_size=4)
        assert report.ok and report.totals()["imported"] == len(legacy_rows), report.as_dict()
        return all_rows(root / "store")


@SETTINGS
@given(S4C_ROWS)
def test_generated_s4c_rows_come_back_exactly(rows: list[dict[str, Any]]) -> None:
    legacy, expected = [], []
    for r in rows:
        text = b.rendered_messages(r["messages"])
        plain = {k: v for k, v in r.items() if k != "messages"}
        legacy.append({**plain, "input_hash": b.sha(text), "input_text": text})
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=r["completion"],
                benchmark=r["benchmark"],
                instruction_id=r["instruction_id"],
                model=r["model"] or "legacy-model",
                created_by=r["pushed_by"],
                created_at=utc(r["pushed_at"]),
                run_id=r["run_id"],
            )
        )
    stored = _import("completions", b.S4C_DDL, legacy)
    assert len(stored) == len(rows)
    assert checksum(stored) == checksum(expected)
    assert all(row["input_hash"] == input_hash(row["input_text"]) for row in stored)


@SETTINGS
@given(S6J_ROWS)
def test_generated_s6j_rows_come_back_exactly(rows: list[dict[str, Any]]) -> None:
    legacy, expected = [], []
    for r in rows:
        text = b.rendered_messages(r["messages"])
        top = r["top_logprobs"]
        legacy.append(
            {
                "input_hash": b.sha(text),
                "judge_input": text,
                "judge_completion": r["completion"],
                "benchmark": r["benchmark"],
                "instruction_id": r["instruction_id"],
                "model_a": r["model_a"],
                "model_b": r["model_b"],
                "judge": r["judge"],
                "orientation": r["orientation"],
                "top_logprobs": None if top is None else b.legacy_dumps(top),
                "pushed_by": r["pushed_by"],
                "pushed_at": r["pushed_at"],
                "run_id": r["run_id"],
            }
        )
        pointwise = r["orientation"] == "single" or r["model_b"] is None
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=r["completion"],
                benchmark=r["benchmark"],
                instruction_id=r["instruction_id"],
                model_a=r["model_a"],
                model_b=None if pointwise else r["model_b"],
                judge=r["judge"] or "legacy-model",
                orientation=None if pointwise else LEGACY_ORIENTATIONS.get(r["orientation"]),
                top_logprobs=None if top is None else from_text_logprobs(top),
                created_by=r["pushed_by"],
                created_at=utc(r["pushed_at"]),
                run_id=r["run_id"],
            )
        )
    stored = _import("judgements", b.S6J_DDL, legacy)
    assert len(stored) == len(rows)
    assert checksum(stored) == checksum(expected)


def test_times_are_stored_in_utc() -> None:
    assert utc("2026-01-01T02:00:00+02:00") == datetime(2026, 1, 1, tzinfo=UTC).isoformat()
