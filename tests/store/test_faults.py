"""Faults of a store's files, through the API and the command line: a typed error naming the file and the
next step, exit status 1, no traceback, and every byte of the store as it was."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from store.errors import CorruptDatabaseError, DamagedTextError
from store.layout import walk
from store.settings import Settings
from store.store import Store
from tests.factories import QWEN, completion_record, file_digests, fill_small_store
from tests.faults import assert_failed_cleanly, damage_text, json_error, judgestore


def qwen_db(root: Path) -> Path:
    return next(loc.db_path(root) for loc in walk(root) if loc.descriptor_hash16 == QWEN.hash16())


# ---------------------------------------------------------------- text that is not UTF-8 (a damaged page)


@pytest.fixture
def damaged_text(store_root: Path) -> tuple[Path, str]:
    """A small store where one row of the Qwen database holds an input_text that is not UTF-8."""
    fill_small_store(store_root)
    return store_root, damage_text(qwen_db(store_root))


@pytest.mark.parametrize("readonly", [True, False], ids=["read-only", "read-write"])
def test_damaged_text_read_through_the_api_is_a_typed_error(damaged_text: tuple[Path, str], readonly: bool) -> None:
    root, key = damaged_text
    before = file_digests(root)
    with Store(Settings(), root=root, readonly=readonly) as store:
        database = store.database("completions", "mt-bench", QWEN)
        with pytest.raises(DamagedTextError) as caught:
            list(database.query())
        with pytest.raises(CorruptDatabaseError):  # a kind of damage: callers that handle damage handle it
            database.get_many([key])
    assert caught.value.path == qwen_db(root)
    assert "judgestore verify" in str(caught.value) and "--input-hash" in str(caught.value)
    if readonly:
        assert file_digests(root) == before


@pytest.mark.parametrize("args", [["query"], ["query", "--format", "jsonl"], ["query", "--format", "csv"]])
def test_query_over_damaged_text_exits_1_naming_the_file(damaged_text: tuple[Path, str], args: list[str]) -> None:
    root, _ = damaged_text
    before = file_digests(root)
    result = judgestore(*args, "--store-root", str(root), "--role", "completions")
    assert_failed_cleanly(result)
    assert str(qwen_db(root)) in " ".join(result.stderr.split()) and "not valid UTF-8" in result.stderr
    as_json = judgestore(*args, "--store-root", str(root), "--json")
    assert_failed_cleanly(as_json)
    assert json_error(as_json)["type"] == "DamagedTextError"
    assert json_error(as_json)["path"] == str(qwen_db(root))
    assert file_digests(root) == before


def test_push_reports_the_damaged_folder_and_pushes_the_others(damaged_text: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = damaged_text
    shared = tmp_path / "shared"
    shared.mkdir()
    before = {k: v for k, v in file_digests(root).items() if ".judgestore-sync" not in k}
    result = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(root), "--json")
    assert_failed_cleanly(result)
    assert "not valid UTF-8" in result.stdout and "Qwen%2FQwen3-8B" in result.stdout
    assert {k: v for k, v in file_digests(root).items() if ".judgestore-sync" not in k} == before
    assert any(p.name.endswith(".jsonl.gz") for p in shared.rglob("*"))  # the other folders were pushed


def test_verify_names_the_damaged_row_and_delete_by_hash_repairs_the_store(damaged_text: tuple[Path, str]) -> None:
    root, key = damaged_text
    found = judgestore("verify", "--store-root", str(root), "--json")
    assert_failed_cleanly(found)
    assert "Traceback" not in found.stdout
    (problem,) = orjson.loads(found.stdout)["problems"]
    assert problem["kind"] == "text" and key in problem["message"]
    assert f"judgestore delete --input-hash {key}" in problem["message"]
    deleted = judgestore("delete", "--input-hash", key, "--yes", "--store-root", str(root))
    assert deleted.exit_code == 0, deleted.output
    assert judgestore("verify", "--store-root", str(root)).exit_code == 0
    with Store(Settings(), root=root, readonly=True) as store:  # the other rows are intact
        assert len(list(store.database("completions", "mt-bench", QWEN).query())) == 2


def test_verify_still_checks_the_hash_of_the_rows_around_damaged_text(store_root: Path) -> None:
    rows = [completion_record(i) for i in range(4)]
    edited = completion_record(9, input_hash=rows[3].input_hash.replace(rows[3].input_hash[0], "0", 1))
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many(rows[:3])
    with closing(sqlite3.connect(qwen_db(store_root))) as conn, conn:  # a row edited by hand: its hash is wrong
        conn.execute(
            "INSERT INTO completions (input_hash, sample_index, input_text, completion, created_at)"
            " VALUES (?, 0, ?, 'x', '2026-01-01 00:00:00.000000')",
            (edited.input_hash, edited.input_text),
        )
    damaged = damage_text(qwen_db(store_root))
    problems = orjson.loads(judgestore("verify", "--store-root", str(store_root), "--json").stdout)
    kinds = {p["kind"]: p["message"] for p in problems["problems"]}
    assert set(kinds) == {"text", "input-hash"} and problems["rows_checked"] == 4
    assert damaged in kinds["text"] and edited.input_hash in kinds["input-hash"]


# ---------------------------------------------------------------- the edge


def test_a_raw_driver_error_that_escapes_a_library_path_is_still_typed_at_the_edge(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's last line of defence: whatever slips past the library's translation."""

    def fail(*_: object, **__: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Store, "query_rows", fail)
    result = judgestore("query", "--store-root", str(filled), "--json")
    assert_failed_cleanly(result)
    assert json_error(result)["type"] == "UnexpectedDatabaseError"
    assert json_error(result)["path"] == str(filled) and "disk I/O error" in json_error(result)["error"]
