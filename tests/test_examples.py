"""The scripts of examples/ run as a user runs them, on the tiny local models, each in a fresh process.

The LangChain arena fills a store (its misses, through the real engine); the
do_inference arena then runs on that store, where it must be all hits and
report the same numbers: the two call shapes share rows. Each script runs
once (a run loads vLLM and three engines: about 20 s of CPU); do_inference's
own misses on the real engine are tests/inference/test_dropin_engine.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.inference.conftest import VLLM_ENV

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def run_example(script: str, models: Path, store: Path, *extra: str) -> str:
    pytest.importorskip("vllm", reason="the examples load the tiny models with vLLM")
    pytest.importorskip("langchain_core", reason="the LangChain example needs the langchain extra")
    env = {name: value for name, value in os.environ.items() if not name.startswith("JUDGESTORE_")}
    env |= VLLM_ENV | {"PYTHONPATH": str(REPO), "JUDGESTORE_RUN_ID": "examples-test"}
    command = [sys.executable, str(EXAMPLES / script), "--tiny", str(models), "--store-root", str(store), *extra]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arena-models")


@pytest.fixture(scope="module")
def langchain_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("langchain-store")


@pytest.fixture(scope="module")
def langchain_output(models: Path, langchain_store: Path) -> str:
    return run_example("arena_langchain.py", models, langchain_store)


def numbers(line: str) -> list[float | None]:
    return [None if cell == "n/a" else float(cell) for cell in line.split()[1:4]]


def test_the_langchain_arena_generates_judges_and_reports(langchain_output: str) -> None:
    lines = langchain_output.splitlines()
    assert lines[:3] == [
        "answers of tiny-a: 0 hits, 3 generated",
        "answers of tiny-b: 0 hits, 3 generated",
        "judgements: 0 hits, 6 generated",
    ]
    rows = [line for line in lines if line.startswith(("00-", "01-", "02-"))]
    assert len(rows) == 3
    assert all(p is None or 0 <= p <= 1 for row in rows for p in numbers(row))
    assert any(line.startswith("tiny-b over tiny-a: preference ") for line in lines)
    assert any(line.startswith("position consistency: ") for line in lines)
    assert max(len(line) for line in lines) <= 80


def test_the_do_inference_arena_is_all_hits_on_the_langchain_arenas_store(
    models: Path, langchain_store: Path, langchain_output: str
) -> None:
    report: dict[str, Any] = json.loads(run_example("arena_do_inference.py", models, langchain_store, "--json"))
    assert [(s["hits"], s["misses"]) for s in report["steps"]] == [(3, 0), (3, 0), (6, 0)]
    assert [b["instruction_id"] for b in report["battles"]] == ["00-story", "01-train", "02-sky"]
    assert report["summary"]["battles"] == 3
    shown = [numbers(line)[:2] for line in langchain_output.splitlines() if line.startswith(("00-", "01-", "02-"))]
    read = [[b["p_b_direct"], b["p_b_reversed"]] for b in report["battles"]]
    assert [[None if p is None else round(p, 3) for p in pair] for pair in read] == shown
