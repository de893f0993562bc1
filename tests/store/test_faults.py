"""Faults of a store's files, through the API and the command line: a typed error naming the file and the
next step, exit status 1, no traceback, and every byte of the store as it was."""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from store.errors import CorruptDatabaseError, DamagedTextError, DamagedValueError, StoreFullError
from store.layout import Selector, walk
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from store.tables.records import CompletionRecord
from tests.factories import LLAMA, QWEN, completion_record, file_digests, fill_small_store, judgement_record
from tests.faults import assert_failed_cleanly, damage_text, fill_up, json_error, judgestore, small_filesystem
from tests.store.conftest import know_synthetic_revision


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
            database.get_many([key], deferred=False)
        found = database.get_many([key])  # the lookup leaves the prompt unread: the damage shows where it is read
        with pytest.raises(CorruptDatabaseError):
            _ = found[key].input_text
    assert caught.value.path == qwen_db(root)
    assert "judgestore verify" in str(caught.value) and "`judgestore delete` that removes each" in str(caught.value)
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


# ---------------------------------------------------------------- a value another tool wrote that its type cannot read


@pytest.fixture
def damaged_value(store_root: Path) -> tuple[Path, str]:
    """A small store where one row of the Qwen database holds ``usage`` that is not JSON (written by another tool)."""
    fill_small_store(store_root)
    key = completion_record(1, model="qwen").input_hash
    with closing(sqlite3.connect(qwen_db(store_root))) as conn, conn:
        conn.execute("UPDATE completions SET usage = '{\"x\": NaN}' WHERE input_hash = ?", (key,))
    return store_root, key


def test_a_value_its_type_cannot_read_is_a_typed_error_naming_the_database(damaged_value: tuple[Path, str]) -> None:
    """A bare JSONDecodeError from query, get_many and every command that reads rows (was)."""
    root, key = damaged_value
    before = file_digests(root)
    with Store(Settings(), root=root, readonly=True) as store:
        database = store.database("completions", "mt-bench", QWEN)
        for read in (lambda: list(database.query()), lambda: database.get_many([key])):
            with pytest.raises(DamagedValueError) as caught:
                read()
            assert caught.value.path == qwen_db(root) and "JSONDecodeError" in str(caught.value)
            assert "judgestore verify" in str(caught.value)
        assert database.count() == 3  # what does not read values still works
    assert file_digests(root) == before


def test_a_bug_in_the_read_path_is_not_called_a_damaged_value(
    damaged_value: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a stored value that does not decode is damage: a TypeError of the code itself passes as it is (a bug
    reported as 'delete these rows' would have the user delete good rows)."""
    from store.repository import Repository

    root, _ = damaged_value

    def broken(*args: object, **kwargs: object) -> object:
        raise TypeError("a bug, not a value")

    monkeypatch.setattr(Repository, "query", broken)
    with Store(Settings(), root=root, readonly=True) as store:
        database = store.database("completions", "mt-bench", QWEN)
        with pytest.raises(TypeError, match="a bug, not a value"):
            list(database.query())


@pytest.mark.parametrize("args", [["query"], ["export", "--format", "jsonl", "-o", "-"], ["copy", "--to-root"]])
def test_commands_reading_a_value_its_type_cannot_read_fail_cleanly(
    damaged_value: tuple[Path, str], args: list[str], tmp_path: Path
) -> None:
    root, _ = damaged_value
    before = file_digests(root)
    if args[0] == "copy":
        args = [*args, str(tmp_path / "copied"), "--from-root", str(root)]
    else:
        args = [*args, "--store-root", str(root)]
    result = judgestore(*args)
    assert_failed_cleanly(result)
    assert "holds a value its column's type cannot read" in " ".join(result.output.split())
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


def test_verify_names_the_damaged_row_and_the_delete_it_advises_removes_that_row_alone(
    damaged_text: tuple[Path, str],
) -> None:
    root, key = damaged_text
    with Store(Settings(), root=root) as store:  # the same input, healthy, in two other databases
        for task, descriptor in (("mt-bench", LLAMA), ("other-task", QWEN)):
            store.database("completions", task, descriptor).put_many([completion_record(0, model="kept")])
    found = judgestore("verify", "--store-root", str(root), "--json")
    assert_failed_cleanly(found)
    assert "Traceback" not in found.stdout
    (problem,) = orjson.loads(found.stdout)["problems"]
    assert problem["kind"] == "text" and key in problem["message"]
    advised = re.search(r"`judgestore (delete [^`]*)`", problem["message"])
    assert advised is not None and f"--input-hash {key}" in advised.group(1)
    # An input hash alone would pick this input's rows in the other two databases as well (it did).
    deleted = judgestore(*shlex.split(advised.group(1)), "--yes", "--store-root", str(root), "--json")
    assert deleted.exit_code == 0, deleted.output
    assert orjson.loads(deleted.stdout)["deleted"] == 1
    assert judgestore("verify", "--store-root", str(root)).exit_code == 0
    with Store(Settings(), root=root, readonly=True) as store:  # the other rows are intact
        assert len(list(store.database("completions", "mt-bench", QWEN).query())) == 2
        for task, descriptor in (("mt-bench", LLAMA), ("other-task", QWEN)):
            kept = store.database("completions", task, descriptor).get_many([key], deferred=False)
            assert [r.completion for r in kept.values()] == ["answer 0"]


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


def test_verify_names_a_value_that_does_not_decode_beside_a_column_the_user_added(filled: Path) -> None:
    with closing(sqlite3.connect(qwen_db(filled))) as conn, conn:
        conn.execute("ALTER TABLE completions ADD COLUMN my_score REAL")
        conn.execute("UPDATE completions SET my_score = 0.5")
        key = conn.execute("SELECT input_hash FROM completions LIMIT 1").fetchone()[0]
        conn.execute("UPDATE completions SET usage = '{\"x\": NaN' WHERE input_hash = ?", (key,))
    before = file_digests(filled)
    found = judgestore("verify", "--store-root", str(filled), "--json")
    assert_failed_cleanly(found)
    (problem,) = orjson.loads(found.stdout)["problems"]
    assert key in problem["message"] and "usage" in problem["message"] and "my_score" not in problem["message"]
    assert file_digests(filled) == before


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


# ---------------------------------------------------------------- a full disk


def big_rows(start: int, count: int) -> list[CompletionRecord]:
    return [completion_record(i, completion=f"{i} " + "x" * 40_000) for i in range(start, start + count)]


def test_a_write_onto_a_full_disk_is_a_typed_error_and_committed_rows_are_intact(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", "2m") as disk, Store(Settings(), root=disk / "store") as store:
        database = store.database("completions", "mt-bench", QWEN)
        committed: list[CompletionRecord] = []
        with pytest.raises(StoreFullError) as caught:
            for start in range(0, 1000, 5):  # chunks of 5 rows of 40 kB until the disk is full
                chunk = big_rows(start, 5)
                database.put_many(chunk)
                committed += chunk
        assert committed, "the first chunks fit"
        full = caught.value
        assert full.path == database.path and full.needed_bytes is not None and full.needed_bytes > 400_000
        assert "disk is full" in str(full) and "rows stored before it are intact" in str(full)
        assert not isinstance(full.__cause__, StoreFullError)  # the driver's error is chained
        stored = database.get_many(r.input_hash for r in committed + big_rows(len(committed), 5))
        assert stored == {r.input_hash: r for r in committed}  # every committed row, byte for byte; no partial chunk
        verified = judgestore("verify", "--store-root", str(disk / "store"))
        assert verified.exit_code == 0, verified.output


def test_writes_refused_by_a_full_disk_leave_every_row_readable(tmp_path: Path) -> None:
    # A write that fails on a full disk leaves an empty -wal and a -shm that cannot grow: reading through them
    # (mode=ro) failed with "the disk is full" until space was freed. An empty -wal holds no commit.
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        root = fill_small_store(disk / "store")
        fill_up(disk)
        for refused in (["vacuum"], ["delete", "--run-id", "run-1", "--yes"]):
            assert_failed_cleanly(judgestore(*refused, "--store-root", str(root)))
        rows = judgestore("query", "--format", "jsonl", "--store-root", str(root))
        assert rows.exit_code == 0 and len(rows.stdout.splitlines()) == 10, rows.output
        verified = judgestore("verify", "--store-root", str(root))
        assert verified.exit_code == 0 and "10 rows, no problems" in verified.stdout, verified.output


def test_creating_a_database_on_a_full_disk_leaves_nothing_behind(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        (disk / "store").mkdir()
        fill_up(disk)
        before = file_digests(disk / "store")
        with Store(Settings(), root=disk / "store") as store, pytest.raises(StoreFullError) as caught:
            store.database("completions", "mt-bench", QWEN)
        assert "disk is full" in str(caught.value)
        assert file_digests(disk / "store") == before
        assert list((disk / "store").iterdir()) == []  # not even the folders of the descriptor


def test_db_upgrade_on_a_full_disk_refuses_and_leaves_no_partial_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        root = disk / "store"
        with Store(Settings(), root=root) as store:
            store.database("completions", "mt-bench", QWEN).put_many(big_rows(0, 20))
        know_synthetic_revision(monkeypatch)  # the database is now behind: the upgrade backs it up first
        fill_up(disk)
        before = file_digests(root)
        result = judgestore("db", "upgrade", "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        (outcome,) = orjson.loads(result.stdout)["results"]
        assert outcome["outcome"] == "refused" and "disk is full" in outcome["error"]
        # no write was made, and the room is for a copy of the file (was: a failed write's text, "twice the rows")
        assert "the upgrade's backup (a copy of the file beside it) needs" in outcome["error"], outcome["error"]
        assert "nothing was changed" in outcome["error"] and "twice the rows" not in outcome["error"]
        assert file_digests(root) == before  # no partial backup; the database as it was


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_a_disk_that_fills_during_the_migration_is_named_and_the_file_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """The backup fit, then the migration met a full disk: SQLAlchemy's raw text, its SQL and a link (was)."""
    from store.backends.sqlite import upgrade

    with small_filesystem(tmp_path / "disk", "3m") as disk:
        root = disk / "store"
        with Store(Settings(), root=root) as store:
            store.database("judgements", "arena", QWEN).put_many([judgement_record(i) for i in range(20)])
        know_synthetic_revision(monkeypatch)  # 9001 adds a column to the judgements table
        before = file_digests(root)
        backed_up = upgrade._backup

        def backup_then_fill(db_path: Path, revision: str | None) -> Path:
            backup = backed_up(db_path, revision)
            fill_up(disk)
            return backup

        monkeypatch.setattr(upgrade, "_backup", backup_then_fill)
        if not json_output:  # the backup named once, with what to do with it (twice, was)
            result = judgestore("db", "upgrade", "--store-root", str(root))
            assert_failed_cleanly(result)
            text = " ".join(result.stdout.split())
            [backup] = [p for p in root.rglob("*") if ".bak-" in p.name]
            assert text.count(backup.name) == 1 and "delete it to give a retry the room" in text, text
            return
        result = judgestore("db", "upgrade", "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        (outcome,) = orjson.loads(result.stdout)["results"]
        assert outcome["outcome"] == "failed" and "disk is full" in outcome["error"], outcome["error"]
        assert "[SQL:" not in outcome["error"] and "sqlalche.me" not in outcome["error"]
        assert "holds the same bytes: delete it to give a retry the room" in outcome["error"]
        # said once, for an upgrade (".." and a generate's "rows already stored are not computed again", was)
        assert "judgestore db upgrade` again" in outcome["error"] and "computed again" not in outcome["error"]
        assert ".." not in outcome["error"].replace("...", "")
        backup = Path(outcome["backup"])
        kept = {k: v for k, v in file_digests(root).items() if not k.endswith((".lock", "-wal", "-shm"))}
        assert kept.pop(str(backup)) == before[str(backup).split(".bak-")[0]]  # the backup: the file as it was
        assert kept == {k: v for k, v in before.items() if not k.endswith((".lock", "-wal", "-shm"))}


def test_vacuum_on_a_full_disk_says_so_in_the_stores_words_and_keeps_the_file(tmp_path: Path) -> None:
    """Was SQLite's bare 'database or disk is full', where every other command names the disk and the room."""
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        root = disk / "store"
        with Store(Settings(), root=root) as store:
            database = store.database("completions", "mt-bench", QWEN)
            database.put_many(big_rows(0, 20))
            database.delete(RowFilter(instruction_id="3"))
        fill_up(disk)
        before = file_digests(root)
        result = judgestore("vacuum", "--store-root", str(root), "--json")
        assert_failed_cleanly(result)
        (outcome,) = orjson.loads(result.stdout)["results"]
        assert outcome["outcome"] == "refused" and "disk is full" in outcome["error"], outcome
        assert orjson.loads(result.stdout)["ok"] is False
        kept = {k: v for k, v in file_digests(root).items() if not k.endswith((".lock", "-wal", "-shm"))}
        assert kept == {k: v for k, v in before.items() if not k.endswith((".lock", "-wal", "-shm"))}


def test_a_backup_that_fails_midway_is_removed_and_the_upgrade_refused(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def copy_half(source: Path, target: Path) -> None:
        target.write_bytes(Path(source).read_bytes()[:1000])
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    know_synthetic_revision(monkeypatch)
    monkeypatch.setattr(shutil, "copy2", copy_half)
    before = file_digests(filled)
    result = judgestore("db", "upgrade", "--store-root", str(filled), "--json")
    assert_failed_cleanly(result)
    outcomes = orjson.loads(result.stdout)["results"]
    assert {o["outcome"] for o in outcomes} == {"refused"}
    assert all("disk is full" in o["error"] and "the upgrade's backup" in o["error"] for o in outcomes)
    assert {k: v for k, v in file_digests(filled).items() if not k.endswith((".lock", "-wal", "-shm"))} == {
        k: v for k, v in before.items() if not k.endswith((".lock", "-wal", "-shm"))
    }
    assert not list(filled.rglob("*.bak-*"))


# ---------------------------------------------------------------- a database with no tables yet (zero bytes)


@pytest.fixture
def zero_byte(store_root: Path) -> Path:
    """A small store plus a descriptor folder whose database is zero bytes (another process is creating it)."""
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:
        path = store.database("completions", "other-task", QWEN).path
    for side in path.parent.iterdir():
        if side.name != "metadata.json":
            side.unlink()
    path.write_bytes(b"")
    return path


def test_a_zero_byte_database_is_empty_with_nothing_to_read_through_the_api(zero_byte: Path, store_root: Path) -> None:
    before = file_digests(store_root)
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert store.find("completions", "other-task", QWEN) is None
        assert len(list(store.query_rows(Selector(), RowFilter()))) == 10
    assert file_digests(store_root) == before
    with Store(Settings(), root=store_root) as store:  # a writer creates its tables, as it creates the file
        database = store.find("completions", "other-task", QWEN)
        assert database is not None and database.count() == 0


def test_every_command_reads_a_zero_byte_database_as_empty(zero_byte: Path, store_root: Path, tmp_path: Path) -> None:
    before = file_digests(store_root)
    listed = judgestore("ls", "--json", "--store-root", str(store_root))
    assert listed.exit_code == 0, listed.output
    (empty,) = [d for d in orjson.loads(listed.stdout) if d["path"] == str(zero_byte)]
    assert (empty["state"], empty["rows"]) == ("empty", 0)
    for args in (["db", "status"], ["verify"], ["query", "--format", "jsonl"], ["delete", "--run-id", "x", "--yes"]):
        result = judgestore(*args, "--store-root", str(store_root))
        assert result.exit_code == 0, (args, result.output)
    assert file_digests(store_root) == before
    shared = tmp_path / "shared"
    shared.mkdir()
    pushed = judgestore("hub", "push", "--all", "--dir", str(shared), "--store-root", str(store_root), "--json")
    assert pushed.exit_code == 0, pushed.output
    report = orjson.loads(pushed.stdout)
    assert report["ok"] and report["rows"] == 10 and report["unchanged_folders"] == 1
    assert zero_byte.read_bytes() == b""


def test_a_real_process_over_damaged_text_prints_one_line_and_no_traceback(
    damaged_text: tuple[Path, str], tmp_path: Path
) -> None:
    root, _ = damaged_text
    before = file_digests(root)
    result = subprocess.run(
        [sys.executable, "-m", "store", "query", "--format", "jsonl", "--store-root", str(root)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("Error: ") and "not valid UTF-8" in result.stderr
    assert file_digests(root) == before
