"""The point of importing: an S6j judge cache, imported, makes a live judging run 100% hits without the engine.

The legacy cache is written the way the legacy code wrote it for the tiny
model: its metadata.json records the model_kwargs the old wrapper resolved
(the engine kwargs of tests/inference/conftest.py minus the three it left out,
the temperature as the int 0, no top_p so the 0.6/0.95 defaults apply to
top_p, the tokenizer's own chat template), the installed vLLM version, and
rows with the S6j shape (top_logprobs, pointwise rows with model_b NULL and
orientation 'single', forward/swapped orientations). After ``judgestore
import --assume-current-model`` the live run with those settings (engine
kwargs as vllm.LLM takes them, float temperature, top_p 0.95) must find every
row: once in-process with a backend factory that fails the test if called,
once through the real ``judgestore judge`` command in a fresh process, which
reports that it neither loaded the engine nor imported vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.backends.base import Backend
from inference.backends.vllm.descriptor import backend_version
from inference.cache.model import CachedModel
from inference.judging import pairwise_requests, pointwise_request
from inference.legacy.settings import LEGACY_EXECUTION_ONLY
from inference.requests import JudgementRequest
from inference.spec import ModelSpec
from store.layout import read_metadata, walk
from store.settings import Settings
from store.store import Store
from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV
from tests.legacy import builders as b
from tests.legacy.conftest import judgestore

TASK = "arena-hard"
LIVE_SAMPLING = {"temperature": 0.0, "top_p": 0.95, "max_tokens": 8, "logprobs": 3}
LEGACY_ORIENTATION = {"direct": "direct", "reversed": "swapped", None: "single"}


def _requests() -> list[JudgementRequest]:
    requests: list[JudgementRequest] = []
    questions = ["2+2?", "Capital of France? 🇫🇷", "日本の首都は？", "Write a haiku.\nAbout rain."]
    for i, question in enumerate(questions):
        requests += pairwise_requests(
            question=question,
            model_a="model-a",
            answer_a=f"answer a{i} ✓",
            model_b="model-b",
            answer_b=f"answer b{i}",
            benchmark=TASK,
            instruction_id=str(i),
        )
        requests.append(
            pointwise_request(
                question=question, model="model-a", answer=f"answer a{i} ✓", benchmark=TASK, instruction_id=str(i)
            )
        )
    return requests


def _legacy_s6j(legacy_root: Path, model: str, requests: list[JudgementRequest]) -> list[dict[str, Any]]:
    """The legacy store, written as the old code did (its own canonical JSON, its own hash)."""
    model_kwargs = {k: v for k, v in TINY_ENGINE_KWARGS.items() if k not in LEGACY_EXECUTION_ONLY}
    model_kwargs |= {"max_tokens": 8, "temperature": 0, "chat_template": None}
    metadata = b.s3_metadata(model, model_kwargs, backend_version=backend_version())
    folder = b.legacy_folder(legacy_root, "judgements", TASK, "VLLM", model, metadata)
    rows = []
    for i, request in enumerate(requests):
        assert request.messages is not None
        text = b.rendered_messages(request.messages)
        rows.append(
            {
                "input_hash": b.sha(text),
                "judge_input": text,
                "judge_completion": f"[[{'AB'[i % 2]}]] verdict {i}",
                "benchmark": TASK,
                "instruction_id": request.instruction_id,
                "model_a": request.model_a,
                "model_b": request.model_b,
                "judge": f"VLLM/{model}",
                "top_logprobs": b.legacy_dumps({"[[": -0.01, "A": -1.5 - i, "B": -2.25}),
                "orientation": LEGACY_ORIENTATION[request.orientation],
                "pushed_by": "legacy-user",
                "pushed_at": "2026-03-01T12:00:00",
                "run_id": "slurm-77",
            }
        )
    b.create_db(folder / "judgements.db", b.S6J_DDL, rows)
    return rows


def _never(_: Any = None) -> Backend:
    pytest.fail("the engine was prepared although every request should hit the imported rows")


def test_an_imported_s6j_store_makes_a_live_judging_run_all_hits(
    tiny_model: Path, legacy_root: Path, store_root: Path, tmp_path: Path
) -> None:
    requests = _requests()
    rows = _legacy_s6j(legacy_root, str(tiny_model), requests)

    imported = judgestore(
        "import",
        str(legacy_root),
        "--store-root",
        str(store_root),
        "--assume-current-model",
        str(tiny_model),
        "--assume-setting",
        "logprobs=3",
        "--json",
    )
    assert imported.returncode == 0, imported.stderr
    report = orjson.loads(imported.stdout)
    assert report["totals"]["imported"] == len(rows) == len(requests)
    (location,) = walk(store_root)
    stored = read_metadata(location.folder(store_root))
    assert any("resolved from" in a for a in stored.assumptions)
    assert any("logprobs=3" in a for a in stored.assumptions)

    # In-process: the live spec, exactly as a user writes it today, and a factory that fails the test.
    spec = ModelSpec(model=str(tiny_model), engine_kwargs=TINY_ENGINE_KWARGS, sampling=LIVE_SAMPLING)
    assert spec.descriptor.hash16() == location.descriptor_hash16
    with Store(Settings(), root=store_root) as store:
        model = CachedModel(store, spec.descriptor, task=TASK, backend_factory=_never, label="tiny-judge")
        responses = model.judge(requests)
    assert model.last.plan is not None and model.last.plan.hits == len(requests) and model.last.plan.misses == 0
    assert not model.engine_loaded and not model.last.engine_loaded
    assert [r.text for r in responses] == [row["judge_completion"] for row in rows]
    # JudgeArena's view of the stored candidates is what the legacy file held
    assert [r.text_logprobs() for r in responses] == [json.loads(row["top_logprobs"]) for row in rows]

    # The real command line, in a fresh process: it must report no engine and no vLLM import.
    lines = tmp_path / "judge-inputs.jsonl"
    lines.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "messages": list(r.messages or []),
                    "model_a": r.model_a,
                    "model_b": r.model_b,
                    "orientation": r.orientation,
                    "benchmark": r.benchmark,
                    "instruction_id": r.instruction_id,
                }
            )
            + b"\n"
            for r in requests
        )
    )
    engine_args = [a for k, v in TINY_ENGINE_KWARGS.items() for a in ("--engine-arg", f"{k}={json.dumps(v)}")]
    judged = judgestore(
        "judge",
        "--model",
        str(tiny_model),
        "--task",
        TASK,
        "-i",
        str(lines),
        "-o",
        str(tmp_path / "out.jsonl"),
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--top-logprobs",
        "3",
        "--sampling",
        "top_p=0.95",
        *engine_args,
        "--store-root",
        str(store_root),
        "--json",
        env=VLLM_ENV,
    )
    assert judged.returncode == 0, judged.stderr
    summary = orjson.loads(judged.stdout)
    assert summary["descriptor"] == location.descriptor_hash16
    assert (summary["hits"], summary["misses"], summary["requested"]) == (len(requests), 0, len(requests))
    assert summary["engine_loaded"] is False and summary["vllm_imported"] is False
    outputs = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert all(line["cached"] for line in outputs)


def test_without_the_assumption_nothing_is_imported_and_the_reason_names_the_option(
    tiny_model: Path, legacy_root: Path, store_root: Path
) -> None:
    _legacy_s6j(legacy_root, str(tiny_model), _requests()[:3])
    result = judgestore("import", str(legacy_root), "--store-root", str(store_root))
    assert result.returncode == 1  # nothing could be attributed: a script must not read this as success
    assert "--assume-current-model" in result.stderr and "3 rows were not imported" in result.stderr
    as_json = judgestore("import", str(legacy_root), "--store-root", str(store_root), "--json")
    report = orjson.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["ok"] is False and report["totals"]["unattributed"] == 3
    assert not store_root.exists()


def _judgearena_style(
    question: str, first: tuple[str, str], second: tuple[str, str], orientation: str
) -> JudgementRequest:
    """A prompt JudgeArena rendered itself: the slots are positional, model_a's answer comes first."""
    content = f"Which answer to '{question}' is better?\nFirst: {first[1]}\nSecond: {second[1]}"
    return JudgementRequest(
        messages=[{"role": "user", "content": content}], model_a=first[0], model_b=second[0],
        orientation=orientation, benchmark=TASK, instruction_id=question,  # type: ignore[arg-type]
    )  # fmt: skip


def test_native_and_imported_judgements_mean_the_same_by_model_a(
    tiny_model: Path, legacy_root: Path, store_root: Path
) -> None:
    from tests.inference.test_cached import CountingBackend, Factory

    x, y = ("m-x", "4"), ("m-y", "5")
    legacy = [_judgearena_style("2+2?", x, y, "direct"), _judgearena_style("2+2?", y, x, "reversed")]
    _legacy_s6j(legacy_root, str(tiny_model), legacy)
    imported = judgestore(
        "import", str(legacy_root), "--store-root", str(store_root), "--assume-current-model", str(tiny_model),
        "--assume-setting", "logprobs=3",
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr

    spec = ModelSpec(model=str(tiny_model), engine_kwargs=TINY_ENGINE_KWARGS, sampling=LIVE_SAMPLING)
    native = pairwise_requests(question="2+2?", model_a="m-x", answer_a="4", model_b="m-y", answer_b="5",
                               benchmark=TASK, instruction_id="native")  # fmt: skip
    with Store(Settings(), root=store_root) as store:
        CachedModel(store, spec.descriptor, task=TASK, backend_factory=Factory(CountingBackend())).judge(native)

    def query(*filters: str) -> list[dict[str, Any]]:
        result = judgestore("query", "--store-root", str(store_root), "--role", "judgements", *filters, "--json")
        assert result.returncode == 0, result.stderr
        return orjson.loads(result.stdout)

    def first_answer(row: dict[str, Any]) -> str:
        content = orjson.loads(row["input_text"])["messages"][-1]["content"]
        return content.split("[Assistant A]\n")[1][0] if "[Assistant A]" in content else content.split("First: ")[1][0]

    x_first = query("--model-a", "m-x")
    assert sorted(r["instruction_id"] for r in x_first) == ["2+2?", "native"]  # one imported, one native row
    assert {r["orientation"] for r in x_first} == {"direct"} and {first_answer(r) for r in x_first} == {"4"}
    y_first = query("--model-a", "m-y", "--orientation", "reversed")
    assert sorted(r["instruction_id"] for r in y_first) == ["2+2?", "native"]
    assert {first_answer(r) for r in y_first} == {"5"}  # m-y's answer is shown first in both
    assert len(query("--pair", "m-y", "--pair", "m-x")) == 4
