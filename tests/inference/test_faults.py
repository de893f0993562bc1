"""Faults met by `judgestore generate`, `judge` and `import`: a full disk, a read-only store.

The commands run in-process through the whole app; ``generate`` gets a counting engine instead of vLLM
(the fault is the store's, not the engine's), so these tests need no model load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.cache.model import CachedModel
from inference.cache.plan import Mode
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import StoreNotWritableError
from store.layout import walk
from store.settings import Settings
from store.store import Store
from tests.factories import file_digests
from tests.faults import assert_failed_cleanly, json_error, judgestore, remount, small_filesystem
from tests.inference.test_cached import CountingBackend, ask
from tests.legacy import builders


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> CountingBackend:
    """The engine every ModelSpec loads in this test: counts what it is asked, answers at once."""
    backend = CountingBackend()
    monkeypatch.setattr(ModelSpec, "backend", lambda self: backend)
    # It takes a prompt of any length: no preflight counts these long prompts against the tiny model's context.
    monkeypatch.setattr(ModelSpec, "preflight", None)
    return backend


def requests_file(path: Path, count: int, size: int) -> Path:
    """``count`` chat requests whose prompt (and so the counting engine's answer) is ``size`` characters long."""
    lines = [{"instruction_id": str(i), "messages": [{"role": "user", "content": f"{i} " + "x" * size}]} for i in
             range(count)]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def generate(model: Path, root: Path, requests: Path, *args: str) -> Any:
    output = str(requests.with_suffix(".out"))
    return judgestore("generate", "--model", str(model), "--task", "t", "-i", str(requests), "-o", output,
                      "--store-root", str(root), "--chunk-size", "2", *args)  # fmt: skip


def stored_keys(root: Path) -> set[str]:
    with Store(Settings(), root=root, readonly=True) as store:
        return {r.input_hash for loc in walk(root) for r in store.open(loc).query()}


# ---------------------------------------------------------------- a full disk


def test_generate_onto_a_full_disk_says_how_many_rows_it_kept_and_a_rerun_resumes(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    requests = requests_file(tmp_path / "requests.jsonl", 40, 30_000)
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        root = disk / "store"
        result = generate(tiny_model_dir, root, requests, "--json")
        assert_failed_cleanly(result)
        error = json_error(result)
        assert error["type"] == "StoreFullError" and "disk is full" in error["error"]
        kept = error["rows_kept"]
        assert 0 < kept < 40 and f"This run stored {kept} rows before the failure" in error["notes"][0]
        # the failed chunk was generated too (was: "(0 generated)" with 0 rows kept)
        assert f"({kept + 2} generated, this batch's included)" in error["notes"][0]
        assert len(stored_keys(root)) == kept  # every row of every committed chunk, none of the failed one
        assert judgestore("verify", "--store-root", str(root)).exit_code == 0
        human = generate(tiny_model_dir, root, requests)
        assert_failed_cleanly(human)
        assert "disk is full" in human.stderr and "rows before the failure" in human.stderr
        said = " ".join(human.stderr.split())
        assert ". This run stored" in said  # the note a sentence of its own (was glued on: "...`verify` This run")
        remount(disk, "size=16m")
        engine.received.clear()
        rerun = generate(tiny_model_dir, root, requests, "--json")
        assert rerun.exit_code == 0, rerun.output
        summary = orjson.loads(rerun.stdout)
        assert summary["hits"] >= kept and len(engine.received) == 40 - summary["hits"]
        assert len(stored_keys(root)) == 40


def test_judge_onto_a_full_disk_says_how_many_rows_it_kept_and_a_rerun_resumes(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    lines = [{"instruction_id": str(i), "question": f"{i} " + "q" * 10_000, "model_a": "a", "answer_a": "x" * 10_000,
              "model_b": "b", "answer_b": "y" * 10_000} for i in range(20)]  # fmt: skip
    pairs.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))

    def judge(root: Path) -> Any:
        return judgestore("judge", "--model", str(tiny_model_dir), "--task", "t", "-i", str(pairs), "-o",
                          str(tmp_path / "verdicts.jsonl"), "--orientation", "both", "--store-root", str(root),
                          "--chunk-size", "2", "--json")  # fmt: skip

    with small_filesystem(tmp_path / "disk", "2m") as disk:
        root = disk / "store"
        result = judge(root)
        assert_failed_cleanly(result)
        error = json_error(result)
        assert error["type"] == "StoreFullError" and "disk is full" in error["error"]
        kept = error["rows_kept"]
        assert 0 < kept < 40 and len(stored_keys(root)) == kept  # both orientations of 20 pairs: 40 rows asked
        remount(disk, "size=16m")
        engine.received.clear()
        rerun = judge(root)
        assert rerun.exit_code == 0, rerun.output
        summary = orjson.loads(rerun.stdout)
        assert summary["hits"] >= kept and len(engine.received) == 40 - summary["hits"]
        assert len(stored_keys(root)) == 40


def test_import_onto_a_full_disk_fails_cleanly_and_keeps_what_was_stored(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"
    rows = [
        {"benchmark": "mt-bench", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "gpt-4",
         "judge_input": f"Compare the answers to question {i} " + "x" * 20_000,
         "judge_completion": "[[A]] " + "y" * 20_000, "date": "2025-12-31T23:59:59"}
        for i in range(200)
    ]  # fmt: skip
    source = builders.create_db(legacy / "cache" / "db" / "mt-bench" / "gpt-4.db", builders.S0_DDL, rows)
    descriptor = ModelDescriptor(provider="vllm", model="gpt-4-judge", sampling={"temperature": 0.0})
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(descriptor.model_dump_json())
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        root = disk / "store"
        before_source = file_digests(legacy)
        args = ["import", str(source), "--store-root", str(root), "--descriptor", str(descriptor_file),
                "--task", "mt-bench"]  # fmt: skip
        result = judgestore(*args, "--json")
        assert_failed_cleanly(result)
        report = orjson.loads(result.stdout)
        assert not report["ok"] and report["totals"]["failed"] > 0
        assert "disk is full" in report["sources"][0]["error"]
        human = judgestore(*args)
        assert_failed_cleanly(human)
        assert "disk is full" in " ".join(human.output.split())
        assert file_digests(legacy) == before_source  # the source is read-only to an import
        assert judgestore("verify", "--store-root", str(root)).exit_code == 0  # what was stored is intact


# ---------------------------------------------------------------- a read-only store


def test_generate_on_a_read_only_store_fails_before_the_engine_loads_and_readonly_mode_works(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    requests = requests_file(tmp_path / "requests.jsonl", 4, 10)
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        root = disk / "store"
        assert generate(tiny_model_dir, root, requests_file(tmp_path / "two.jsonl", 2, 10)).exit_code == 0
        remount(disk, "ro")
        before = file_digests(root)
        engine.received.clear()
        for mode in ("use", "refresh"):
            result = generate(tiny_model_dir, root, requests, "--mode", mode, "--json")
            assert_failed_cleanly(result)
            assert json_error(result)["type"] == "StoreNotWritableError"
            assert engine.received == []  # refused before the engine was asked anything
        readonly = generate(tiny_model_dir, root, requests, "--mode", "readonly", "--json")
        assert readonly.exit_code == 0, readonly.output
        assert orjson.loads(readonly.stdout)["hits"] == 2 and len(engine.received) == 2
        assert file_digests(root) == before


def test_python_modes_that_only_read_on_a_read_only_mount_name_the_read_only_open(
    tmp_path: Path, engine: CountingBackend
) -> None:
    requests = [ask(i) for i in range(2)]
    descriptor = ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0})

    def cached(store: Store, mode: Mode) -> CachedModel:
        return CachedModel(store, descriptor, task="t", mode=mode, backend_factory=lambda: engine)

    with small_filesystem(tmp_path / "disk", "4m") as disk:
        root = disk / "store"
        with Store(Settings(), root=root) as store:
            cached(store, "use").complete(requests)
        remount(disk, "ro")
        before = file_digests(root)
        engine.received.clear()
        for mode in ("readonly", "replay"):
            with Store(Settings(), root=root) as store, pytest.raises(StoreNotWritableError) as raised:
                cached(store, mode).complete(requests)
            assert "Store(..., readonly=True)" in " ".join(raised.value.__notes__)
            with Store(Settings(), root=root, readonly=True) as store:
                model = cached(store, mode)
                responses = model.complete(requests)
            assert model.last.plan.hits == 2
            assert [r.samples[0].text for r in responses] == ["answer to q0 #0", "answer to q1 #0"]
        assert engine.received == []
        assert file_digests(root) == before


# ---------------------------------------------------------------- a database with no tables yet (zero bytes)


def test_generate_readonly_over_a_zero_byte_database_generates_the_misses(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    root = tmp_path / "store"
    assert generate(tiny_model_dir, root, requests_file(tmp_path / "two.jsonl", 2, 10)).exit_code == 0
    (location,) = walk(root)
    db_path = location.db_path(root)
    for side in db_path.parent.iterdir():
        if side.name != "metadata.json":
            side.unlink()
    db_path.write_bytes(b"")  # what another process creating the database leaves for an instant
    engine.received.clear()
    before = file_digests(root)
    readonly = generate(tiny_model_dir, root, requests_file(tmp_path / "four.jsonl", 4, 10), "--mode", "readonly")
    assert readonly.exit_code == 0, readonly.output
    assert len(engine.received) == 4 and file_digests(root) == before
    replay = generate(tiny_model_dir, root, requests_file(tmp_path / "four.jsonl", 4, 10), "--mode", "replay")
    assert_failed_cleanly(replay)
    assert "not in the store" in replay.stderr and file_digests(root) == before


# ---------------------------------------------------------------- text that is not valid Unicode


def test_a_lone_surrogate_in_a_completion_fails_that_request_alone_and_in_a_prompt_is_a_typed_error(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = engine.generate

    def broken_answer_to_prompt_3(requests: Any) -> Any:
        return [
            dataclasses.replace(g, text="broken \udc80 answer") if r.rendered["messages"][0]["content"][0] == "3" else g
            for r, g in zip(requests, answer(requests), strict=True)
        ]

    monkeypatch.setattr(engine, "generate", broken_answer_to_prompt_3)
    root = tmp_path / "store"
    requests = requests_file(tmp_path / "six.jsonl", 6, 10)
    result = generate(tiny_model_dir, root, requests, "--json")
    assert_failed_cleanly(result)  # exit 1: one request failed; the other five are written and stored
    summary = orjson.loads(result.stdout)
    assert (summary["failed"], summary["rows_written"], len(stored_keys(root))) == (1, 5, 5)
    (failure,) = summary["failures"]
    assert failure["request_index"] == 3 and failure["type"] == "InvalidInputError"
    assert "completion is not valid Unicode" in failure["error"]
    assert failure["error"].endswith("; not stored") and "nothing of the batch" not in failure["error"]  # 5 were
    lines = [orjson.loads(line) for line in requests.with_suffix(".out").read_bytes().splitlines()]
    assert [line["error"] is None for line in lines] == [True, True, True, False, True, True]
    assert lines[3]["completion"] is None and lines[3]["error"]["type"] == "InvalidInputError"
    assert judgestore("verify", "--store-root", str(root)).exit_code == 0

    prompts = tmp_path / "surrogate.jsonl"
    prompts.write_bytes(b'{"messages": [{"role": "user", "content": "\\udc80"}]}\n')
    engine.received.clear()
    before = file_digests(root)
    bad_prompt = generate(tiny_model_dir, root, prompts, "--json")
    assert_failed_cleanly(bad_prompt)
    assert (
        json_error(bad_prompt)["type"] == "InvalidInputError" and "surrogate.jsonl:1" in json_error(bad_prompt)["error"]
    )
    assert engine.received == [] and file_digests(root) == before


# ---------------------------------------------------------------- names longer than a file name may be


@pytest.mark.parametrize("task", ["t" * 300, "評価" * 40], ids=["300 characters", "80 CJK characters"])
def test_generate_with_a_task_too_long_for_a_file_name_works_and_lists_the_whole_name(
    task: str, tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    root = tmp_path / "store"
    requests = requests_file(tmp_path / "two.jsonl", 2, 10)
    for mode in ("use", "refresh"):
        result = judgestore("generate", "--model", str(tiny_model_dir), "--task", task, "-i", str(requests),
                            "--store-root", str(root), "--mode", mode, "--json")  # fmt: skip
        assert result.exit_code == 0, result.output
    listed = orjson.loads(judgestore("ls", "--json", "--store-root", str(root)).stdout)
    assert [(d["task"], d["rows"]) for d in listed] == [(task, 2)]
    assert judgestore("verify", "--store-root", str(root)).exit_code == 0


def test_a_name_the_store_refuses_is_refused_before_the_engine_loads(
    tmp_path: Path, tiny_model_dir: Path, engine: CountingBackend
) -> None:
    for mode in ("use", "refresh", "readonly"):
        result = judgestore("generate", "--model", str(tiny_model_dir), "--task", "..", "-i",
                            str(requests_file(tmp_path / "r.jsonl", 2, 10)), "--store-root", str(tmp_path / "s"),
                            "--mode", mode, "--json")  # fmt: skip
        assert_failed_cleanly(result, exit_code=2)  # a task that names no folder: a usage error, before anything
        assert "Invalid value for '--task'" in result.stderr and engine.received == []
