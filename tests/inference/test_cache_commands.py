"""Know your cache, on a real store built by the real engine with the tiny model: explain, stats, prune, export, audit.

The store is built once for the run by `judgestore generate` and `judgestore judge` (two engine loads, in the test's
process: :func:`~tests.inference.conftest.judgestore_here`); each test works on its own copy. A run that must show
what a fresh process does (a full hit that never imports vLLM) or that ends a test's story as a user runs it (stats,
the real prune, vacuum, export, audit) runs in a process of its own; the reports a test reads first (explain, dry runs,
query, stats' JSON, a replay that stops at its miss) run in the test's process. Only `audit` loads the engine again,
once in each.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.layout import walk
from tests.built_once import built_once
from tests.inference.conftest import TINY_ENGINE_KWARGS, judgestore_here
from tests.inference.test_cli import ENGINE_ARGS, judgestore, lines

pytestmark = pytest.mark.engine

PROMPTS = ["Tell me a joke.", "Tell me a fact.", "Tell me a story.", "Name a colour."]
TASK = ["--task", "demo"]
SAMPLING = ["--temperature", "0", "--max-tokens", "8"]
JUDGE_SAMPLING = [*SAMPLING, "--top-logprobs", "3"]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def prompt_rows(prompts: list[str]) -> list[dict[str, Any]]:
    return [{"benchmark": "demo", "instruction_id": str(i), "messages": [{"role": "user", "content": p}]}
            for i, p in enumerate(prompts)]  # fmt: skip


def build_demo_store(folder: Path, tiny_model_dir: Path) -> None:
    """4 completions of the tiny model and 8 judgements of them (both orientations, top logprobs), by the CLI.

    Shared by this module and test_adopt_engine.py (:func:`tests.built_once.built_once`): the summary of the
    first run is kept beside the store, in ``first.json``.
    """
    root = folder / "store"
    prompts = write_jsonl(folder / "prompts.jsonl", prompt_rows(PROMPTS))
    model = ["--model", str(tiny_model_dir), "--label", "tiny"]
    answers = folder / "answers.jsonl"
    first = judgestore_here("generate", *model, *TASK, *SAMPLING, *ENGINE_ARGS, "-i", str(prompts),
                            "-o", str(answers), "--json", root=root).stdout  # fmt: skip
    (folder / "first.json").write_text(first)
    pairs = write_jsonl(folder / "pairs.jsonl", [
        {"question": p, "benchmark": "demo", "instruction_id": a["instruction_id"], "model_a": "tiny",
         "answer_a": a["completion"], "model_b": "reference", "answer_b": "I do not know."}
        for p, a in zip(PROMPTS, lines(answers), strict=True)
    ])  # fmt: skip
    judge = ["--model", str(tiny_model_dir), "--label", "tiny-judge", *JUDGE_SAMPLING]
    judged = orjson.loads(judgestore_here("judge", *judge, *TASK, *ENGINE_ARGS, "-i", str(pairs), "-o",
                                          str(folder / "verdicts.jsonl"), "--json", root=root).stdout)  # fmt: skip
    assert (orjson.loads(first)["rows_written"], judged["rows_written"]) == (4, 8)


def demo_store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The folder :func:`build_demo_store` fills, built once per run (read-only: copy the store to change it)."""
    return built_once(tmp_path_factory, "cli-demo-store", lambda folder: build_demo_store(folder, tiny_model_dir))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Any]:
    """A store holding 4 completions of the tiny model and 8 judgements of them (both orientations)."""
    folder = demo_store(tmp_path_factory, tiny_model_dir)
    model = ["--model", str(tiny_model_dir), "--label", "tiny"]
    judge = ["--model", str(tiny_model_dir), "--label", "tiny-judge", *JUDGE_SAMPLING]
    return {"root": folder / "store", "prompts": folder / "prompts.jsonl", "model": model,
            "judge": judge, "first": orjson.loads((folder / "first.json").read_bytes()),
            "pairs": folder / "pairs.jsonl"}  # fmt: skip


@pytest.fixture
def copy(built: dict[str, Any], tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(built["root"], root)
    return root


def run(*args: str, root: Path, check: bool = True) -> Any:
    return judgestore(*args, root=root, check=check)


def test_a_full_hit_run_says_what_it_saved_and_stats_add_it_up(built: dict[str, Any], copy: Path) -> None:
    first = built["first"]
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] == 4 * 8 and first["engine_seconds"] > 0
    again = run("generate", *built["model"], *TASK, *SAMPLING, *ENGINE_ARGS, "-i", str(built["prompts"]), root=copy)
    assert "saved: 4 requests not sent" in again.stderr and "(vLLM never imported)" in again.stderr
    summary = orjson.loads(run("generate", *built["model"], *TASK, *SAMPLING, *ENGINE_ARGS, "-i",
                               str(built["prompts"]), "-o", os.devnull, "--json", root=copy).stdout)  # fmt: skip
    assert (summary["hits"], summary["engine_loaded"], summary["vllm_imported"]) == (4, False, False)
    assert (summary["saved_prompt_tokens"], summary["saved_completion_tokens"]) == (
        first["prompt_tokens"], first["completion_tokens"])  # fmt: skip
    assert summary["saved_engine_seconds"] == pytest.approx(first["engine_seconds"], abs=1e-5)
    stats = orjson.loads(judgestore_here("stats", "--json", "--role", "completions", root=copy).stdout)
    (database,) = stats["databases"]
    assert database["runs"]["runs"] == 3 and database["runs"]["hits"] == 8
    assert database["runs"]["saved_completion_tokens"] == 2 * first["completion_tokens"]
    assert database["rows"]["completion_tokens"] == first["completion_tokens"]
    assert database["finish_reasons"] == {"length": 4}  # 8 tokens: every answer truncated
    assert "saved" in run("stats", root=copy).stdout


def test_explain_after_changing_the_temperature(built: dict[str, Any], copy: Path) -> None:
    result = judgestore_here("explain", *built["model"], *TASK, "--temperature", "0.7", "--max-tokens", "8",
                             *ENGINE_ARGS, "--json", root=copy)  # fmt: skip
    report = orjson.loads(result.stdout)["descriptor"]
    assert report["exists"] is False and report["rows"] == 0
    nearest = report["neighbours"][0]
    assert nearest["rows"] == 4 and [(c["field"], c["stored"], c["wanted"]) for c in nearest["changes"]] == [
        ("sampling.temperature", 0.0, 0.7)
    ]
    text = judgestore_here("explain", *built["model"], *TASK, "--temperature", "0.7", "--max-tokens", "8",
                           *ENGINE_ARGS, root=copy).stdout  # fmt: skip
    assert "is not in the store" in text and "sampling.temperature 0.0 -> 0.7" in text


def test_explain_after_a_vllm_version_change(built: dict[str, Any], copy: Path, tmp_path: Path) -> None:
    (location,) = [loc for loc in walk(copy) if loc.role == "completions"]
    metadata = orjson.loads(location.metadata_path(copy).read_bytes())
    stored_version = metadata["descriptor"]["backend_version"]
    metadata["descriptor"]["backend_version"] = "0.99.0"  # the library was upgraded
    edited = tmp_path / "descriptor.json"
    edited.write_bytes(orjson.dumps(metadata))
    report = orjson.loads(
        judgestore_here("explain", "--descriptor-file", str(edited), *TASK, "--json", root=copy).stdout
    )
    (nearest, *_) = report["descriptor"]["neighbours"]
    assert [(c["field"], c["stored"], c["wanted"]) for c in nearest["changes"]] == [
        ("backend_version", stored_version, "0.99.0")
    ]


def test_explain_after_editing_one_prompt_and_the_plan_says_to(
    built: dict[str, Any], copy: Path, tmp_path: Path
) -> None:
    edited = write_jsonl(tmp_path / "edited.jsonl", prompt_rows([*PROMPTS[:2], "Tell me a long story.", PROMPTS[3]]))
    replay = judgestore_here("generate", *built["model"], *TASK, *SAMPLING, *ENGINE_ARGS, "-i", str(edited),
                             "--mode", "replay", root=copy, check=False)  # fmt: skip
    assert replay.returncode == 1  # a miss in replay mode: no engine, nothing written
    assert "note: 1 misses although this descriptor's database holds 4 rows; run `judgestore explain" in replay.stderr
    # the usual causes named, a run that stopped early among them (a resume is no alarm)
    assert "(new inputs, a run that stopped early, or inputs that changed)" in " ".join(replay.stderr.split())
    hint = shlex.split(replay.stderr.split("run `", 1)[1].split("`", 1)[0])
    assert hint[:2] == ["judgestore", "explain"] and "--mode" not in hint
    result = judgestore_here(*hint[1:], "--json", root=copy)
    inputs = orjson.loads(result.stdout)["inputs"]
    assert (inputs["hits"], inputs["misses"]) == (3, 1)
    (miss,) = inputs["explained"]
    assert miss["request"] == "demo/2" and "same benchmark/instruction" in miss["reason"]
    assert miss["source"] == f"{edited}:3"  # the line to open (its index alone, was)
    (diff,) = miss["diffs"]
    assert diff["where"] == "message 0 (user) content" and diff["position"] == len("Tell me a ")
    said = judgestore_here(*hint[1:], root=copy).stdout
    assert "message 0 (user) content at character 10" in said and f"{edited}:3 (demo/2)" in said


def test_prune_dry_run_counts_equal_the_real_prune(built: dict[str, Any], copy: Path) -> None:
    args = ["prune", "--role", "judgements", "--orientation", "reversed", "--json"]
    planned = orjson.loads(judgestore_here(*args, "--dry-run", root=copy).stdout)
    done = orjson.loads(run(*args, "--yes", root=copy).stdout)
    assert planned["rows"] == done["deleted"] == 4
    truncated = orjson.loads(judgestore_here("delete", "--finish-reason", "length", "--role", "completions",
                                             "--dry-run", "--json", root=copy).stdout)  # fmt: skip
    assert truncated["matched"] == 4
    every = orjson.loads(judgestore_here("prune", "--older-than", "0s", "--dry-run", "--json", root=copy).stdout)
    assert every["rows"] == 8 and orjson.loads(run("prune", "--older-than", "0s", "--yes", "--json",
                                                   root=copy).stdout)["deleted"] == 8  # fmt: skip
    vacuumed = orjson.loads(run("vacuum", "--json", root=copy).stdout)
    assert {r["outcome"] for r in vacuumed["results"]} == {"vacuumed"}


def test_export_parquet_round_trips_to_query_jsonl(built: dict[str, Any], copy: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from store import jsonvalues

    target = tmp_path / "rows.parquet"
    run("export", "--format", "parquet", "-o", str(target), root=copy)
    queried = [
        orjson.loads(line) for line in judgestore_here("query", "--format", "jsonl", root=copy).stdout.splitlines()
    ]
    exported = pq.read_table(target).to_pylist()
    assert len(exported) == len(queried) == 12
    for row in exported:
        row["created_at"] = row["created_at"].isoformat()
        for name in ("usage", "top_logprobs"):
            row[name] = None if row[name] is None else jsonvalues.to_plain(jsonvalues.loads(row[name]))
    assert exported == [{name: row.get(name) for name in exported[0]} for row in queried]


def test_audit_reports_exact_matches_and_finds_an_altered_completion(built: dict[str, Any], copy: Path) -> None:
    judged = orjson.loads(judgestore_here("audit", *built["judge"], *TASK, *ENGINE_ARGS, "--role", "judgements",
                                          "--sample", "8", "--json", root=copy).stdout)  # fmt: skip
    assert (judged["sampled"], judged["exact"], judged["exact_rate"]) == (8, 8, 1.0)
    assert judged["max_abs_logprob_delta"] is not None and judged["max_abs_logprob_delta"] < 1e-3
    assert judged["top_tokens_changed"] == 0
    (location,) = [loc for loc in walk(copy) if loc.role == "completions"]
    with closing(sqlite3.connect(location.db_path(copy))) as conn, conn:
        conn.execute("UPDATE completions SET completion = completion || ' (edited)' WHERE instruction_id = '1'")
    altered = run("audit", *built["model"], *TASK, *SAMPLING, *ENGINE_ARGS, "--sample", "4", "--json", "--verbose",
                  root=copy, check=False)  # fmt: skip
    assert altered.returncode == 1  # under --fail-under 1.0
    assert "INFO" in altered.stderr and "vllm" in altered.stderr.lower()  # -v: the engine's own log, on stderr
    report = orjson.loads(altered.stdout)
    assert (report["sampled"], report["exact"]) == (4, 3)
    (mismatch,) = report["mismatches"]
    assert mismatch["instruction_id"] == "1" and mismatch["stored"].endswith(" (edited)")
    assert TINY_ENGINE_KWARGS  # the same engine settings as the rows were written with
