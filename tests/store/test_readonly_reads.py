"""Read-only reads while a writer writes: one snapshot per read, or a typed error; never torn rows or false damage.

A read-only read of a WAL database that no process has open takes no locks (``immutable``: it creates no file);
one of a database a writer has open reads under SQLite's locks (store.backends.sqlite.connections). These tests
put a writer's commits and checkpoints in the middle of a read, at a chosen moment.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from store.backends.sqlite import verify as verify_module
from store.backends.sqlite.database import CHECKED_BATCH_ROWS
from store.errors import ChangedUnderReadError
from store.layout import Location
from store.repository import Repository
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from store.tables.records import Record
from tests.factories import QWEN, completion_record, current_database

ROLE, TASK = "completions", "t"
OLD_ROWS = 3 * CHECKED_BATCH_ROWS


def _row(i: int) -> Record:
    """Rows that fill pages (a checkpoint rewrites many) and sort by number (created_at)."""
    return completion_record(
        i, completion=f"{i} " + "x" * 1500, created_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i)
    )


def _write_and_checkpoint(root: Path, start: int, count: int) -> None:
    """A writer that opens the file, commits ``count`` rows and removes the first old ones, then closes (its close
    checkpoints every page into the main file)."""
    with Store(Settings(), root=root) as s:
        database = s.database(ROLE, TASK, QWEN)
        database.put_many([_row(start + i) for i in range(count)])
        database.delete(RowFilter(instruction_id="5"))


@pytest.fixture
def idle_store(tmp_path: Path) -> Path:
    """A store whose one database no process has open (no -wal, no -shm)."""
    root = tmp_path / "store"
    db_path = current_database(root, ROLE, TASK, QWEN, [_row(i) for i in range(OLD_ROWS)])
    assert not Path(f"{db_path}-wal").exists() and not Path(f"{db_path}-shm").exists()
    return root


def test_a_stream_a_writer_changed_under_after_it_gave_rows_stops_with_a_typed_error(idle_store: Path) -> None:
    # Regression: `judgestore query` read without locks while a writer started and checkpointed: rows were lost
    # and others given twice, and the command exited 0.
    given: list[int] = []
    with Store(root=idle_store, readonly=True) as reader:
        rows = reader.database(ROLE, TASK, QWEN).query()
        with pytest.raises(ChangedUnderReadError) as caught:
            for record in rows:
                given.append(int(record.instruction_id))
                if len(given) == 10:  # the first batch is given: a writer starts now
                    _write_and_checkpoint(idle_store, OLD_ROWS, 2 * CHECKED_BATCH_ROWS)
    # what was given is a whole prefix of the snapshot the read started on, and the error says how much
    assert given == list(range(len(given))) and len(given) % CHECKED_BATCH_ROWS == 0
    assert caught.value.rows_given == len(given)
    assert f"file). The {len(given):,} rows given before it" in str(caught.value)


def test_a_stream_a_writer_changed_before_it_gave_anything_is_read_again_whole(
    idle_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Repository.query
    raced: list[int] = []

    def racing(self: Repository, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        for n, record in enumerate(real(self, flt, limit=limit)):
            if n == 10 and not raced:  # within the first batch: nothing is given yet
                raced.append(1)
                _write_and_checkpoint(idle_store, OLD_ROWS, 2 * CHECKED_BATCH_ROWS)
            yield record

    monkeypatch.setattr(Repository, "query", racing)
    with Store(root=idle_store, readonly=True) as reader:
        ids = [int(r.instruction_id) for r in reader.database(ROLE, TASK, QWEN).query()]
    assert raced
    assert ids == [i for i in range(OLD_ROWS + 2 * CHECKED_BATCH_ROWS) if i != 5]  # the state after the write


def test_verify_while_a_writer_has_the_file_open_and_writes_finds_no_damage(
    idle_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: a writer had the file open with an empty -wal; verify read it without locks, the writer
    # checkpointed under it, and verify said "damaged" (then OK on a rerun).
    real = verify_module._integrity_problems
    with Store(Settings(), root=idle_store) as writer:
        written = writer.database(ROLE, TASK, QWEN)  # open: -wal and -shm exist, the -wal empty

        def writing_meanwhile(conn: object, path: Path) -> object:
            found = real(conn, path)  # type: ignore[arg-type]
            written.put_many([_row(OLD_ROWS + i) for i in range(2 * CHECKED_BATCH_ROWS)])
            written.delete(RowFilter(instruction_id="5"))
            with closing(sqlite3.connect(path)) as conn:  # what its auto-checkpoint does after more commits
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            return found

        monkeypatch.setattr(verify_module, "_integrity_problems", writing_meanwhile)
        with Store(root=idle_store, readonly=True) as reader:
            verified = reader.verify(Location.of(ROLE, TASK, QWEN))
    assert verified.problems == ()
    assert verified.rows_checked == OLD_ROWS  # one snapshot: the rows when the check started


def test_a_query_while_a_writer_thread_writes_and_checkpoints_is_one_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "store"
    current_database(root, ROLE, TASK, QWEN, [_row(i) for i in range(OLD_ROWS)])
    with Store(Settings(), root=root) as writer, Store(root=root, readonly=True) as reader:
        written = writer.database(ROLE, TASK, QWEN)  # open, nothing committed: its -wal is empty
        started, stop = threading.Event(), threading.Event()

        def write() -> None:
            started.wait(10)
            n = OLD_ROWS
            while not stop.is_set():  # thousands of pages: its auto-checkpoints write into the main file
                written.put_many([_row(n + i) for i in range(200)])
                n += 200

        thread = threading.Thread(target=write)
        thread.start()
        ids = []
        try:
            for record in reader.database(ROLE, TASK, QWEN).query():
                ids.append(int(record.instruction_id))
                started.set()  # the read transaction has begun: the writer commits from now on
                time.sleep(0.0005)
        finally:
            stop.set()
            thread.join()
        assert written.count() > 2 * OLD_ROWS  # the writer did write (and checkpoint) during the read
    assert ids == list(range(OLD_ROWS))  # the snapshot the read began on: no row lost, none given twice


def test_statistics_a_writer_changed_under_are_read_again_whole(
    idle_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stats` read its figures without the retry a count has: a short job that opened the file meanwhile made a
    healthy database "unreadable", with advice to upgrade or verify it (was)."""
    from store.stats import database_stats

    real = Repository.totals
    raced: list[int] = []

    def racing(self: Repository, flt: RowFilter | None = None) -> object:
        found = real(self, flt)
        if not raced:
            raced.append(1)
            _write_and_checkpoint(idle_store, OLD_ROWS, 2 * CHECKED_BATCH_ROWS)
        return found

    monkeypatch.setattr(Repository, "totals", racing)
    with Store(root=idle_store, readonly=True) as reader:
        stats = database_stats(reader.open(Location.of(ROLE, TASK, QWEN)))
    assert raced
    after = OLD_ROWS + 2 * CHECKED_BATCH_ROWS - 1  # the state after the write, every figure of it
    assert stats.rows.rows == after and sum(stats.finish_reasons.values()) == after


def test_an_export_to_a_file_a_writer_changed_under_is_read_again_from_the_start(
    idle_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows go to a file beside the destination, renamed into place at the end: nothing has reached the user
    when a writer changes the database under the read, yet `export -o` failed (half the runs, while short jobs
    wrote) (was)."""
    from store.export import export_rows
    from store.layout import Selector

    real = Repository.query
    raced: list[int] = []

    def racing(self: Repository, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        for n, record in enumerate(real(self, flt, limit=limit)):
            if n == CHECKED_BATCH_ROWS + 10 and not raced:  # a batch was given to the file already
                raced.append(1)
                _write_and_checkpoint(idle_store, OLD_ROWS, 2 * CHECKED_BATCH_ROWS)
            yield record

    monkeypatch.setattr(Repository, "query", racing)
    out = tmp_path / "rows.jsonl"
    with Store(root=idle_store, readonly=True) as reader:
        written = export_rows(reader, out, "jsonl", Selector(), RowFilter())
    assert raced
    after = OLD_ROWS + 2 * CHECKED_BATCH_ROWS - 1
    assert written == after == len(out.read_text().splitlines())
    assert not list(tmp_path.glob(".rows.jsonl.*"))  # the first attempt's file was removed


@pytest.mark.parametrize("dry_run", [False, True], ids=["copy", "dry-run"])
def test_a_copy_whose_source_a_writer_changed_under_copies_it_again_from_the_start(
    idle_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    """A short job opening the source file while it was read made the copy fail that database ("the source cannot
    be read ... Verified: NO"), 10 runs in 12 (was): the file is sound, and is read again."""
    from store.copy import copy_store

    real = Repository.query
    raced: list[int] = []

    def racing(self: Repository, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        for n, record in enumerate(real(self, flt, limit=limit)):
            if n == CHECKED_BATCH_ROWS + 10 and not raced:  # chunks were written to the target already
                raced.append(1)
                _write_and_checkpoint(idle_store, OLD_ROWS, 2 * CHECKED_BATCH_ROWS)
            yield record

    monkeypatch.setattr(Repository, "query", racing)
    with Store(root=idle_store, readonly=True) as source, Store(root=tmp_path / "target") as target:
        report = copy_store(source, target, chunk_size=100, dry_run=dry_run)
        (copied,) = report.databases
        assert raced and copied.verified, copied.as_dict()
        after = OLD_ROWS + 2 * CHECKED_BATCH_ROWS - 1
        if dry_run:  # what the copy would write: the source as the second read found it (was: both reads' rows)
            assert (copied.source_rows, copied.written, copied.already_there) == (after, after, 0)
            assert target.open_existing(Location.of(ROLE, TASK, QWEN)) is None
            return
        # the row the writer deleted was copied by the first attempt: it stays, as in any copy of a moving source
        assert (copied.source_rows, copied.written, copied.already_there) == (after, after + 1, 0)
        assert target.open(Location.of(ROLE, TASK, QWEN)).count() == after + 1
