"""Many processes on one server: 8 writers (distinct and overlapping rows) and 4 readers; a backend killed mid-write;
two writers of one schema that deadlocked take turns."""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from typing import Any

import pytest

from store.claim_table import ClaimTable
from store.claims import WorkQueue
from store.descriptor import ModelDescriptor
from store.errors import DatabaseMissingError, ServerUnavailableError
from store.settings import Settings
from store.store import Store
from tests.factories import completion_record
from tests.pg_server import Cluster

pytestmark = pytest.mark.postgres

WRITERS, READERS, ROWS_PER_WRITER, BATCH, OVERLAP = 8, 4, 1_000, 50, 500
DESCRIPTOR = ModelDescriptor(provider="vllm", model="org/shared-model")
ROLE, TASK = "completions", "mt-bench"


def rows_of(worker: int) -> range:
    """Writer ``worker``'s rows: its own 1,000, half of them shared with the next writer."""
    first = worker * (ROWS_PER_WRITER - OVERLAP)
    return range(first, first + ROWS_PER_WRITER)


def write_rows(url: str, worker: int, start: Any, failures: Any) -> None:
    try:
        with Store(Settings(), url=url) as store:
            start.wait()
            database = store.database(ROLE, TASK, DESCRIPTOR)  # all writers race to create the schema
            numbers = list(rows_of(worker))
            for offset in range(0, len(numbers), BATCH):
                database.put_many([completion_record(i) for i in numbers[offset : offset + BATCH]])
    except BaseException:
        failures.put(f"writer {worker}: {traceback.format_exc()}")


def read_rows(url: str, start: Any, done: Any, failures: Any, counts: Any) -> None:
    try:
        with Store(Settings(), url=url, readonly=True) as store:
            start.wait()
            probe = [completion_record(i).input_hash for i in range(0, rows_of(WRITERS - 1).stop, 37)]
            last = 0
            while not done.is_set():
                try:
                    database = store.open(next(iter(store.locations())))
                except (StopIteration, DatabaseMissingError):
                    time.sleep(0.01)  # not created yet: a read-only store creates nothing
                    continue
                seen = database.count()
                if seen < last:
                    raise AssertionError(f"saw {seen} rows after {last}: rows lost")
                for record in database.get_many(probe).values():
                    if record != completion_record(int(record.instruction_id)):
                        raise AssertionError(f"row {record.instruction_id} read back as {record!r}")
                last = seen
            counts.put(last)
    except BaseException:
        failures.put(f"reader: {traceback.format_exc()}")


def test_eight_writers_and_four_readers_on_one_schema_lose_nothing(pg_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, done, failures, counts = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    writers = [ctx.Process(target=write_rows, args=(pg_url, w, start, failures)) for w in range(WRITERS)]
    readers = [ctx.Process(target=read_rows, args=(pg_url, start, done, failures, counts)) for _ in range(READERS)]
    for p in writers + readers:
        p.start()
    start.set()
    for p in writers:
        p.join(300)
    done.set()
    for p in readers:
        p.join(60)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in writers + readers)
    expected = {completion_record(i).input_hash for w in range(WRITERS) for i in rows_of(w)}
    with Store(Settings(), url=pg_url, readonly=True) as store:
        (location,) = store.locations()
        database = store.open(location)
        assert database.count() == len(expected) == WRITERS * (ROWS_PER_WRITER - OVERLAP) + OVERLAP
        assert set(database.get_many(expected)) == expected


def test_a_backend_killed_mid_write_is_retried_and_leaves_no_partial_chunk(pg_url: str, pg_cluster: Cluster) -> None:
    rows = [completion_record(i, completion="x" * 2_000) for i in range(5_000)]
    outcome: list[object] = []
    with Store(Settings(), url=pg_url) as store:
        database = store.database(ROLE, TASK, DESCRIPTOR)

        def write() -> None:
            try:
                outcome.append(database.put_many(rows))
            except ServerUnavailableError as e:  # the typed error, if the retries ran out
                outcome.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        killed = 0
        while writer.is_alive() and not killed:
            killed = len(
                pg_cluster.sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'judgestore' AND state = 'active' AND query ILIKE 'INSERT%'"
                )
            )
        writer.join(120)
        count = database.count()
    assert killed, "the write finished before a backend could be killed; make it longer"
    assert count in (0, len(rows))  # a chunk is a transaction: all of it or none of it
    assert outcome == [len(rows)] and count == len(rows)  # and the retry finished it


def test_two_writers_of_one_schema_take_turns_instead_of_deadlocking(pg_url: str) -> None:
    # Each write transaction locks the schema's generation counter (its trigger) after its first statement's
    # rows: one enqueue holding the counter and about to insert the claim another enqueue has just inserted (and
    # which waits for the counter) closed a cycle, which no retry is allowed here to hide.
    keys = [completion_record(i).input_hash for i in range(2)]
    with Store(Settings(lock_retries=0), url=pg_url) as store:
        database = store.database(ROLE, TASK, DESCRIPTOR)
        failures: list[BaseException] = []

        def other() -> None:
            try:
                WorkQueue(database, holder="other").join([keys[1], keys[0]])
            except BaseException as e:
                failures.append(e)

        second = threading.Thread(target=other)

        def first(table: ClaimTable) -> None:
            table.enqueue(keys[:1])  # holds the counter until this transaction ends
            second.start()
            time.sleep(1.0)  # the other enqueue inserts keys[1] and waits for the counter (or, now, for its turn)
            table.enqueue(keys[1:])

        database.claims(first)
        second.join(timeout=30)
        assert not failures
        assert WorkQueue(database, holder="watcher").state(keys).waiting == 2
