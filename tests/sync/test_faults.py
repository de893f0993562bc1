"""Sharing under faults: folders whose names start with a dot, a read-only store, damaged local files.

Every case runs the real `judgestore hub push/fetch` command in-process and checks the exit status, that
no traceback escaped, and that nothing was changed or silently dropped.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from store.descriptor import ModelDescriptor
from store.layout import Location, walk
from store.settings import Settings
from store.store import Store
from tests.factories import QWEN, completion_record, file_digests, fill_small_store
from tests.faults import assert_failed_cleanly, fill_up, json_error, judgestore, remount, small_filesystem

DOT_MODEL = ModelDescriptor(provider="vllm", model="./models/x", sampling={"temperature": 0.0})
DOT_TASK = ".hidden-task"


def all_rows(root: Path) -> dict[str, set[str]]:
    with Store(Settings(), root=root, readonly=True) as store:
        return {str(loc.relative_folder()): {r.input_hash for r in store.open(loc).query()} for loc in walk(root)}


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    return folder


def test_fetch_all_brings_every_folder_push_wrote_even_those_whose_names_start_with_a_dot(
    store_root: Path, shared: Path, tmp_path: Path
) -> None:
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "mt-bench", DOT_MODEL).put_many([completion_record(i) for i in range(3)])
        store.database("completions", DOT_TASK, DOT_MODEL).put_many([completion_record(i) for i in range(4, 6)])
    assert Location.of("completions", "mt-bench", DOT_MODEL).relative_folder().parts[3].startswith(".")
    pushed = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(store_root))
    assert pushed.exit_code == 0, pushed.output
    # what a shared filesystem leaves beside the files: a writer's temporary file, an NFS placeholder
    (shared / "completions" / "mt-bench" / ".nfs000000001").write_bytes(b"x")
    (shared / "completions" / ".metadata.json.0123456789abcdef0123456789abcdef.tmp").write_bytes(b"half")
    fresh = tmp_path / "fresh"
    fetched = judgestore("hub", "fetch", "--all", "--dir", str(shared), "--store-root", str(fresh), "--json")
    assert fetched.exit_code == 0, fetched.output
    assert all_rows(fresh) == all_rows(store_root)  # every folder, every row: none silently dropped
    assert len(all_rows(fresh)) == 5


def test_a_push_removes_what_a_killed_push_left_in_staging(store_root: Path, shared: Path) -> None:
    """A push killed by SIGKILL (a cluster's time limit) left its staging folder, a shard's worth of bytes, and
    every later push kept it (was). Pushes take turns under the workspace lock: any other folder there is stale."""
    fill_small_store(store_root)
    staging = store_root / ".judgestore-sync" / "staging"
    (staging / "5fa6874b").mkdir(parents=True)
    (staging / "5fa6874b" / "shard-000.jsonl.gz").write_bytes(b"x" * 4096)
    (staging / "stray-file").write_bytes(b"x")
    pushed = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(store_root))
    assert pushed.exit_code == 0, pushed.output
    assert list(staging.iterdir()) == []
    assert any(path.is_file() for path in shared.rglob("*"))  # the push itself went through


# ---------------------------------------------------------------- a read-only store


@pytest.mark.parametrize("command", ["push", "fetch"])
def test_push_and_fetch_on_a_read_only_store_refuse_cleanly_before_doing_anything(
    command: str, shared: Path, tmp_path: Path
) -> None:
    source = fill_small_store(tmp_path / "source")
    assert judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(source)).exit_code == 0
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        root = fill_small_store(disk / "store")
        remount(disk, "ro")
        before, remote_before = file_digests(root), file_digests(shared)
        result = judgestore("hub", command, "--all", "--dir", str(shared), "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        error = json_error(result)
        assert error["type"] == "StoreNotWritableError" and ".judgestore-sync" in error["path"]
        assert "read-only filesystem" in error["error"] and "must be writable" in error["notes"][0]
        assert file_digests(root) == before and file_digests(shared) == remote_before
        human = judgestore("hub", command, "--all", "--dir", str(shared), "--store-root", str(root))
        assert_failed_cleanly(human)
        advice = "copy the store to a writable folder (`judgestore copy --from-root STORE --to-root DIR`)"
        assert advice in " ".join(human.stderr.split())
        # A preview writes nothing, so a store that never shared anything is previewed (was, for a push: refused)
        preview = judgestore("hub", command, "--all", "--dry-run", "--dir", str(shared), "--store-root", str(root))
        assert preview.exit_code == 0, preview.output
        assert "Would" in preview.stdout and file_digests(root) == before and file_digests(shared) == remote_before


def test_push_of_a_store_whose_sync_workspace_exists_on_a_read_only_mount_is_refused_too(
    shared: Path, tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "disk", "4m") as disk:
        root = fill_small_store(disk / "store")
        pushed = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(root))
        assert pushed.exit_code == 0, pushed.output
        with Store(Settings(), root=root) as store:  # something new to push
            store.database("completions", "mt-bench", DOT_MODEL).put_many([completion_record(1)])
        remount(disk, "ro")
        before, remote_before = file_digests(root), file_digests(shared)
        result = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        assert json_error(result)["type"] == "StoreNotWritableError"
        assert file_digests(root) == before and file_digests(shared) == remote_before
        assert orjson.loads(judgestore("ls", "--json", "--store-root", str(root)).stdout)  # reads still work


# ---------------------------------------------------------------- names longer than a file name may be


def test_folders_with_names_too_long_for_a_file_name_are_pushed_and_fetched_whole(
    store_root: Path, shared: Path, tmp_path: Path
) -> None:
    long_model = ModelDescriptor(provider="vllm", model="org/" + "m" * 300, sampling={"temperature": 0.0})
    cjk_task = "评测任务" * 30
    with Store(Settings(), root=store_root) as store:
        store.database("completions", cjk_task, long_model).put_many([completion_record(i) for i in range(3)])
        store.database("completions", "mt-bench", long_model).put_many([completion_record(9)])
    pushed = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(store_root))
    assert pushed.exit_code == 0, pushed.output
    fresh = tmp_path / "fresh"
    for selection in (["--all"], ["--model-id", long_model.model, "--task", cjk_task]):
        fetched = judgestore("hub", "fetch", *selection, "--dir", str(shared), "--store-root", str(fresh), "--json")
        assert fetched.exit_code == 0, fetched.output
    assert all_rows(fresh) == all_rows(store_root) and len(all_rows(fresh)) == 2
    report = orjson.loads(judgestore("ls", "--json", "--store-root", str(fresh)).stdout)
    assert {(d["task"], d["model"]) for d in report} == {(cjk_task, long_model.model), ("mt-bench", long_model.model)}


# ---------------------------------------------------------------- a full disk


def test_a_sync_bookkeeping_that_meets_a_full_disk_says_the_disk_is_full(shared: Path, tmp_path: Path) -> None:
    """It said the bookkeeping database could not be used, and to move it away: its history with it (was)."""
    source = tmp_path / "source"
    with Store(Settings(), root=source) as store:
        store.database("completions", "mt-bench", QWEN).put_many([completion_record(i) for i in range(3)])
    assert judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(source)).exit_code == 0
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        root = disk / "store"
        root.mkdir()
        fill_up(disk)
        result = judgestore("hub", "fetch", "--all", "--dir", str(shared), "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        error = orjson.loads(result.stderr)
        assert error["type"] == "StoreFullError" and "the disk is full" in error["error"], error
        assert "move it away" not in error["error"]


def test_fetch_onto_a_full_disk_fails_cleanly_and_keeps_what_it_imported(shared: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    big = ModelDescriptor(provider="vllm", model="big", sampling={"temperature": 0.0})
    with Store(Settings(), root=source) as store:
        database = store.database("completions", "mt-bench", big)
        for start in range(0, 60, 10):  # six pushes: six shards, imported one group after another
            database.put_many([completion_record(i, completion="x" * 50_000) for i in range(start, start + 10)])
            assert judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(source)).exit_code == 0
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        root = disk / "store"
        for args in (["--json"], []):
            result = judgestore("hub", "fetch", "--all", "--dir", str(shared), "--store-root", str(root), *args)
            assert_failed_cleanly(result)
            assert "disk is full" in " ".join(result.output.split())
        kept = all_rows(root)
        assert judgestore("verify", "--store-root", str(root)).exit_code == 0  # what it imported is intact
        assert all(rows <= all_rows(source)[folder] for folder, rows in kept.items())
