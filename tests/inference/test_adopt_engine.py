"""`judgestore adopt` on the real engine with the tiny model: a store written "by an older vLLM" carried forward.

The store is built once for the module by `judgestore generate` and `judgestore judge`; each test works on its own
copy, in which a descriptor folder is aged: its descriptor's backend_version is edited to an older vLLM and the
folder re-hashed through the layout's own functions, exactly what a store written by that vLLM looks like. Every
command runs as a user runs it, in a fresh process; only `adopt` loads the engine (for its audit), and the tests
after the first run it in the test's process (:func:`~tests.inference.conftest.judgestore_here`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.layout import Location, metadata_bytes, read_location_metadata, walk, write_metadata
from tests.factories import file_digests
from tests.inference.conftest import judgestore_here
from tests.inference.test_cache_commands import JUDGE_SAMPLING, SAMPLING, TASK, demo_store
from tests.inference.test_cli import ENGINE_ARGS, judgestore

pytestmark = pytest.mark.engine

OLD_VLLM = "0.10.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Any]:
    """4 completions of the tiny model and 8 judgements of them (both orientations, top logprobs)."""
    folder = demo_store(tmp_path_factory, tiny_model_dir)
    model = ["--model", str(tiny_model_dir), "--label", "tiny", *TASK, *SAMPLING, *ENGINE_ARGS]
    judge = ["--model", str(tiny_model_dir), "--label", "tiny-judge", *TASK, *JUDGE_SAMPLING, *ENGINE_ARGS]
    return {"root": folder / "store", "prompts": folder / "prompts.jsonl", "pairs": folder / "pairs.jsonl",
            "model": model, "judge": judge}  # fmt: skip


@pytest.fixture
def copy(built: dict[str, Any], tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(built["root"], root)
    return root


def age(root: Path, role: str, version: str = OLD_VLLM) -> Location:
    """Make ``role``'s folder look written by vLLM ``version``: descriptor edited, folder renamed to its hash."""
    (location,) = [loc for loc in walk(root) if loc.role == role]
    stored = read_location_metadata(root, location)
    older = stored.descriptor.model_copy(update={"backend_version": version})
    aged = Location.of(stored.role, stored.task, older)
    location.folder(root).rename(aged.folder(root))
    write_metadata(aged.folder(root), metadata_bytes(stored.role, stored.task, older, stored.assumptions))
    assert read_location_metadata(root, aged).descriptor == older  # the store accepts the aged folder
    return aged


def run(*args: str, root: Path, check: bool = True) -> Any:
    return judgestore(*args, root=root, check=check)


def test_a_store_of_an_older_vllm_is_adopted_and_the_next_run_is_all_hits_without_the_engine(
    built: dict[str, Any], copy: Path
) -> None:
    aged = age(copy, "completions")
    generate = ["generate", *built["model"], "-i", str(built["prompts"]), "-o", os.devnull]
    assert run(*generate, "--mode", "replay", root=copy, check=False).returncode == 1  # the aged rows never hit

    report = orjson.loads(run("adopt", *built["model"], "--across", "backend_version", "--sample", "4", "--json",
                              root=copy).stdout)  # fmt: skip
    assert report["met"] and report["adopted"] and report["source"]["descriptor"] == aged.descriptor_hash16
    assert (report["audit"]["sampled"], report["audit"]["exact"], report["audit"]["exact_rate"]) == (4, 4, 1.0)
    assert report["counts"] == {"source_rows": 4, "adopted": 4, "present": 0, "excluded": 0}
    assert [c["field"] for c in report["changes"]] == ["backend_version"]
    assert report["changes"][0]["stored"] == OLD_VLLM

    summary = orjson.loads(run(*generate, "--json", root=copy).stdout)
    assert (summary["hits"], summary["adopted_hits"], summary["misses"]) == (4, 4, 0)
    assert summary["engine_loaded"] is False and summary["vllm_imported"] is False
    assert "4 hits (4 adopted)" in run(*generate, root=copy).stderr

    # query, stats and verify tell adopted rows apart; the source folder is left as it was
    adopted = orjson.loads(run("query", "--adopted", "--json", root=copy).stdout)
    source_sha256 = read_location_metadata(copy, aged).descriptor_sha256
    assert len(adopted) == 4 and {row["adopted_from"] for row in adopted} == {source_sha256}
    assert orjson.loads(run("verify", "--json", root=copy).stdout)["rows_adopted"] == 4
    stats = orjson.loads(run("stats", "--json", "--role", "completions", root=copy).stdout)
    assert {d["descriptor"]: d["adopted_rows"] for d in stats["databases"]} == {
        aged.descriptor_hash16: 0, summary["descriptor"]: 4}  # fmt: skip

    # never served for a descriptor that differs in a field --across did not allow
    hotter = ["generate", *built["model"], "--temperature", "0.5", "-i", str(built["prompts"]), "--mode", "replay"]
    assert run(*hotter, root=copy, check=False).returncode == 1
    longer = run("adopt", *built["model"], "--max-tokens", "16", "--across", "backend_version", "--json", root=copy,
                 check=False)  # fmt: skip
    (error,) = longer.stderr.splitlines()  # one JSON line: refused before any engine was loaded (it logs there)
    assert longer.returncode == 1 and orjson.loads(error)["type"] == "AdoptionError"
    assert "sampling.max_tokens 8 -> 16 [not allowed: sampling.max_tokens]" in orjson.loads(error)["error"]

    deleted = orjson.loads(run("delete", "--adopted-from", aged.descriptor_hash16, "--yes", "--json",
                               root=copy).stdout)  # fmt: skip
    assert deleted["deleted"] == 4
    assert run(*generate, "--mode", "replay", root=copy, check=False).returncode == 1  # taken back out


def test_a_store_whose_rows_were_altered_is_refused_with_the_differing_rows_named(
    built: dict[str, Any], copy: Path
) -> None:
    aged = age(copy, "completions")
    with closing(sqlite3.connect(aged.db_path(copy))) as conn, conn:
        conn.execute("UPDATE completions SET completion = completion || ' (edited)' WHERE instruction_id = '1'")
        (edited,) = conn.execute("SELECT input_hash FROM completions WHERE instruction_id = '1'").fetchone()
    before = file_digests(copy)
    refused = judgestore_here("adopt", *built["model"], "--across", "backend_version", "--sample", "4", root=copy,
                              check=False)  # fmt: skip
    assert refused.returncode == 1
    text = " ".join(refused.stdout.split())
    assert "3 of 4 sampled rows regenerated exactly (75.0%)" in text
    assert f"{edited[:16]} (demo/1, sample 0) differs at character" in text and "(edited)" in text
    assert "refused: the exact-match rate 75.0% is under --min-exact 100.0%" in text and "Nothing was written" in text
    assert file_digests(copy) == before  # nothing written: no new folder, no adopted row


def test_a_dry_run_of_judgements_checks_the_verdict_logprobs_and_writes_nothing(
    built: dict[str, Any], copy: Path
) -> None:
    aged = age(copy, "judgements")
    before = file_digests(copy)
    report = orjson.loads(judgestore_here("adopt", *built["judge"], "--role", "judgements", "--across",
                                          "backend_version", "--sample", "8", "--max-logprob-delta", "0.01",
                                          "--dry-run", "--json", root=copy).stdout)  # fmt: skip
    assert report["met"] and report["dry_run"] and not report["adopted"] and report["record"] is None
    assert report["source"]["descriptor"] == aged.descriptor_hash16
    assert report["audit"]["exact_rate"] == 1.0 and report["audit"]["max_abs_logprob_delta"] < 0.01
    assert report["counts"] == {"source_rows": 8, "adopted": 8, "present": 0, "excluded": 0}
    assert file_digests(copy) == before  # byte-identical: the store was opened read-only
