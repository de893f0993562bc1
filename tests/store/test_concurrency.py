"""Many processes on one database: 4 writers racing to create it and fill it, 2 readers meanwhile; and the
journal switch those writers race on."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
import traceback
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from store.backends.sqlite.connections import set_journal_mode
from store.descriptor import ModelDescriptor
from store.errors import DatabaseMissingError
from store.settings import Settings
from store.store import Store
from tests.factories import QWEN, completion_record

WRITERS, ROWS_PER_WRITER, BATCH = 4, 5_000, 100
DESCRIPTOR = ModelDescriptor(provider="vllm", model="org/shared-model")
ROLE, TASK = "completions", "mt-bench"


def _report_failure(failures: Any, who: str) -> None:
    failures.put(f"{who}: {traceback.format_exc()}")
    raise SystemExit(1)


def write_rows(root: str, worker: int, start: Any, created: Any, failures: Any) -> None:
    """Writer ``worker``: rows ``worker * 5000 ..``, 100 per transaction, starting with everyone else."""
    try:
        with Store(Settings(), root=Path(root)) as s:
            start.wait()
            database = s.database(ROLE, TASK, DESCRIPTOR)  # all writers race to create the file
            created.set()
            first = worker * ROWS_PER_WRITER
            for offset in range(0, ROWS_PER_WRITER, BATCH):
                batch = [completion_record(first + offset + i, model=f"w{worker}") for i in range(BATCH)]
                written = database.put_many(batch)
                if written != BATCH:
                    raise AssertionError(f"batch at {offset} wrote {written} rows, not {BATCH}")
    except BaseException:
        _report_failure(failures, f"writer {worker}")


def read_rows(root: str, readonly: bool, start: Any, created: Any, done: Any, failures: Any, loops: Any) -> None:
    """Reader: count and look up rows until the writers finish; every snapshot holds whole batches."""
    try:
        with Store(Settings(), root=Path(root), readonly=readonly) as s:
            start.wait()
            if readonly:  # a read-only store creates nothing: it waits for a writer to create the file
                created.wait(60)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        database = s.database(ROLE, TASK, DESCRIPTOR)
                        break
                    except DatabaseMissingError:  # the file exists but its schema is not committed yet
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
            else:
                database = s.database(ROLE, TASK, DESCRIPTOR)
            last, rounds, partway = 0, 0, 0
            probe = [completion_record(i).input_hash for i in range(0, WRITERS * ROWS_PER_WRITER, 97)]
            while True:
                finished = done.is_set()
                seen = database.count()
                if seen % BATCH or seen < last:
                    raise AssertionError(f"saw {seen} rows after {last}: a partial or lost batch")
                found = database.get_many(probe)
                for record in found.values():
                    expected = completion_record(int(record.instruction_id), model=record.model)
                    if record != expected:
                        raise AssertionError(f"row {record.instruction_id} read back as {record!r}")
                last, rounds = seen, rounds + 1
                if 0 < seen < WRITERS * ROWS_PER_WRITER:
                    partway += 1
                if finished:
                    break
            if last != WRITERS * ROWS_PER_WRITER:
                raise AssertionError(f"after the writers finished the reader saw {last} rows")
            loops.put((rounds, partway))
    except BaseException:
        _report_failure(failures, f"{'read-only' if readonly else 'read-write'} reader")


def test_four_writers_and_two_readers_on_one_database(store_root: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    start, created, done = spawn.Barrier(WRITERS + 2), spawn.Event(), spawn.Event()
    failures, loops = spawn.Queue(), spawn.Queue()
    writers = [
        spawn.Process(target=write_rows, args=(str(store_root), w, start, created, failures)) for w in range(WRITERS)
    ]
    readers = [
        spawn.Process(target=read_rows, args=(str(store_root), readonly, start, created, done, failures, loops))
        for readonly in (False, True)
    ]
    for process in writers + readers:
        process.start()
    for process in writers:
        process.join(120)
    done.set()
    for process in readers:
        process.join(60)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in writers + readers] == [0] * (WRITERS + 2)
    rounds = [loops.get(timeout=5) for _ in readers]
    assert sum(partway for _, partway in rounds) > 0, f"no reader read while the writers wrote: {rounds}"

    with Store(Settings(), root=store_root, readonly=True) as s:
        database = s.database(ROLE, TASK, DESCRIPTOR)
        assert database.count() == WRITERS * ROWS_PER_WRITER
        every = [completion_record(i, model=f"w{i // ROWS_PER_WRITER}") for i in range(WRITERS * ROWS_PER_WRITER)]
        assert database.get_many(r.input_hash for r in every) == {r.input_hash: r for r in every}
        path = database.path
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM judgestore_alembic_version").fetchone() == (1,)


def _switch(conn: sqlite3.Connection, barrier: threading.Barrier, errors: list[str]) -> None:
    barrier.wait()
    try:
        set_journal_mode(conn, "wal")
    except sqlite3.Error as e:
        errors.append(str(e))


def test_connections_switching_a_new_file_to_wal_at_once_all_succeed(tmp_path: Path) -> None:
    """Writers that create one file at once all switch its journal: SQLite answers all but one of them "database
    is locked" at once (waiting would deadlock them), so the switch must be tried again. Without that, 8 of 180
    switches failed here."""
    switchers, files = 6, 30
    errors: list[str] = []
    for n in range(files):
        path = tmp_path / f"new{n}.db"
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE t (x)")
            conn.commit()
        conns = [sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
                 for _ in range(switchers)]  # fmt: skip
        barrier = threading.Barrier(switchers)
        threads = [threading.Thread(target=_switch, args=(conn, barrier, errors)) for conn in conns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for conn in conns:
            conn.close()
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert not errors, errors


def test_closing_never_waits_for_a_call_that_ctrl_c_stopped_before_its_cleanup(tmp_path: Path) -> None:
    """Ctrl-C can land after a write's C call returns and before its context manager's cleanup runs; the lock it
    held was then never released, and closing the store on the way out waited for it forever (was)."""
    with Store(Settings(), root=tmp_path) as store:
        database = store.database("completions", "t", QWEN)
        database.put_many([completion_record(1)])
        stopped = database._driver()  # type: ignore[attr-defined]  # a call whose frame never lets go
        stopped.__enter__()
        closing_thread = threading.Thread(target=store.close, daemon=True)
        closing_thread.start()
        closing_thread.join(timeout=10)
        assert not closing_thread.is_alive(), "close() waited for a call that will never finish"
        assert database.put_many([completion_record(2)]) == 1  # and the database is still usable
        assert database.count() == 2


def test_a_call_under_way_at_close_closes_its_connection_when_it_ends(tmp_path: Path) -> None:
    """A put_many still running when the store closed parked its connection afterwards: an open handle (and the
    -wal and -shm files) outlived close() (was)."""
    with Store(Settings(), root=tmp_path) as store:
        database = store.database("completions", "t", QWEN)
        database.put_many([completion_record(1)])
        running = database._driver()  # type: ignore[attr-defined]
        conn = running.__enter__()
        store.close()
        running.__exit__(None, None, None)
        assert database._idle == []  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")
