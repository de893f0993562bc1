"""A shared batch (inference/cache/shared.py) in one process: jobs as threads, each with a store of its own on
one folder, an engine that counts what it is asked. The processes, servers and kills are test_shared_batch.py's."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import Arrival, EngineRequest, Generation, Refusal
from inference.cache import shared
from inference.cache.model import CachedModel, Responses
from inference.cache.shared import WAITING_POLLS_PER_SECOND, block_size, poll_seconds
from store.claims import claims_summary
from store.descriptor import ModelDescriptor
from store.errors import DatabaseBusyError, InvalidInputError, RequestsFailedError
from store.runs import run_totals
from store.settings import Settings
from store.store import Store
from tests.inference.test_cached import CountingBackend, Factory, ask

N = 24


class SlowBackend(CountingBackend):
    """Takes ``seconds`` per block; the first ``stall_first`` block takes ``stall`` seconds instead."""

    def __init__(self, seconds: float = 0.05, stall: float = 0.0, refuse: Sequence[str] = ()) -> None:
        super().__init__(refuse=refuse)
        self.seconds, self.stall, self.blocks = seconds, stall, 0
        self.asked = threading.Event()  # set once its first block is asked for (a job's first claim is made)

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        self.blocks += 1
        self.asked.set()
        time.sleep(self.stall if self.blocks == 1 and self.stall else self.seconds)
        return super().generate(requests)


def job(root: Path, descriptor: ModelDescriptor, backend: CountingBackend, lease: float = 5.0) -> CachedModel:
    store = Store(Settings(lease_seconds=lease), root=root)
    return CachedModel(store, descriptor, task="t", backend_factory=Factory(backend), chunk_size=4, shared=True)


def run_jobs(
    models: list[CachedModel],
    requests: list,  # type: ignore[type-arg]
    delays: Sequence[float] = (),
    after: threading.Event | None = None,
) -> list[Responses]:
    """Each model's ``complete(requests)`` in a thread of its own, the i-th after ``delays[i]``; with ``after``,
    every job but the first starts once it is set (the first job's first block asked for: its claim made,
    however slow the machine)."""
    results: list[Responses | BaseException | None] = [None] * len(models)

    def work(i: int) -> None:
        time.sleep(delays[i] if i < len(delays) else 0.0)
        try:
            if after is not None and i > 0 and not after.wait(60):
                raise AssertionError("the first job never asked for its first block")
            results[i] = models[i].complete(requests)
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def prompts_of(backend: CountingBackend) -> list[str]:
    return [r.rendered["messages"][-1]["content"] for r in backend.received]


def test_block_sizes_shrink_near_the_end_of_the_batch() -> None:
    assert block_size(200, 1, 64) == 64
    assert block_size(200, 4, 64) == 25
    assert block_size(20, 4, 64) == 3
    assert block_size(3, 4, 64) == 1 and block_size(0, 4, 64) == 1
    # never below what the engine works on at once, never above the write interval
    assert block_size(20, 4, 64, least=8) == 8 and block_size(3, 4, 64, least=8) == 8
    assert block_size(200, 4, 16, least=32) == 16


def test_waiting_jobs_poll_the_store_a_bounded_number_of_times_a_second() -> None:
    for jobs in (1, 4, 8, 20):
        wait = poll_seconds(jobs, lease_seconds=300)
        assert 0.05 <= wait <= 0.5
        assert jobs / wait <= WAITING_POLLS_PER_SECOND + 1e-9  # all of them together
    assert poll_seconds(4, 300) < poll_seconds(8, 300) < poll_seconds(16, 300)  # fewer jobs look sooner
    assert poll_seconds(200, 300) == 0.5  # many jobs: never longer than half a second
    assert poll_seconds(16, lease_seconds=2) == 0.2  # a tenth of a short lease, to see it expire in time
    assert poll_seconds(4, lease_seconds=0.1) == 0.05


def test_jobs_waiting_at_the_end_poll_as_the_whole_batch_not_as_the_one_job_still_at_work(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The third job's first block takes 6 s; the other two do the rest, then wait for it. Only the third holds a
    # lease by then: counted by holders, two waiting jobs would each poll as if the batch had two jobs. (Blocks of
    # 0.5 s: each waiting job works beside the other for seconds, and so sees three jobs at once, even when a
    # loaded machine starts its thread a second late.)
    waits: list[tuple[str, int]] = []

    def recorded(jobs: int, lease_seconds: float) -> float:
        waits.append((threading.current_thread().name, jobs))
        return poll_seconds(jobs, lease_seconds)

    monkeypatch.setattr(shared, "poll_seconds", recorded)
    backends = [SlowBackend(seconds=0.5), SlowBackend(seconds=0.5), SlowBackend(stall=6.0)]  # 4 s: once too short
    models = [job(store_root, descriptor, b) for b in backends]
    # The two fast jobs start half a block apart: in step, each could read the batch's state just as the other had
    # written a block and not yet claimed the next, and never see three jobs at once (failed about 1 run in 8)
    responses = run_jobs(models, [ask(i) for i in range(N)], delays=[0.1, 0.35, 0.0])
    assert all([r.text for r in rs] == [f"answer to q{i} #0" for i in range(N)] for rs in responses)
    last_wait = {thread: jobs for thread, jobs in waits}  # each waiting thread's last wait
    assert len(last_wait) >= 2 and set(last_wait.values()) == {3}, waits


class BatchingBackend(SlowBackend):
    """Works on ``max_concurrency`` requests at once, as a remote backend or vLLM's scheduler says it does."""

    max_concurrency = 3

    def __init__(self) -> None:
        super().__init__(seconds=0.0)
        self.sizes: list[int] = []

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        self.sizes.append(len(requests))
        return super().generate(requests)


def test_no_block_is_smaller_than_what_the_engine_works_on_at_once(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    backend = BatchingBackend()
    with job(store_root, descriptor, backend) as model:  # chunk_size 4: blocks of 4, then half what is left
        model.complete([ask(i) for i in range(N)])
        assert model.in_flight == 3
    # 24 inputs: five blocks of 4, then 3 (half of 4 would leave the engine idle), then the last one.
    assert backend.sizes == [4, 4, 4, 4, 4, 3, 1]
    assert sorted(prompts_of(backend)) == sorted(f"q{i}" for i in range(N))


def test_a_calls_own_bound_is_what_its_blocks_are_at_least(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that works on one request at a time claims no block of its engine's three near the end."""
    least: list[int] = []

    def recorded(claimable: int, jobs: int, most: int, at_least: int = 1) -> int:
        least.append(at_least)
        return block_size(claimable, jobs, most, at_least)

    monkeypatch.setattr(shared, "block_size", recorded)
    backend = BatchingBackend()
    with job(store_root, descriptor, backend) as model:  # chunk_size 4
        model.complete([ask(i) for i in range(N)], max_concurrency=1)
        assert model.in_flight == 3  # outside the call: its engine's
    assert set(least[1:]) == {1}  # the first block is claimed before the engine is prepared (1 then too)
    assert backend.sizes == [1] * N and sorted(prompts_of(backend)) == sorted(f"q{i}" for i in range(N))


def test_three_jobs_generate_every_input_once_and_return_the_same_answers(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    backends = [SlowBackend() for _ in range(3)]
    models = [job(store_root, descriptor, b) for b in backends]
    requests = [ask(i) for i in range(N)]
    responses = run_jobs(models, requests)
    asked = [p for b in backends for p in prompts_of(b)]
    assert sorted(asked) == sorted(f"q{i}" for i in range(N))  # each input once, across the jobs
    assert all(prompts_of(b) for b in backends)  # and every job took a share
    texts = [[r.text for r in rs] for rs in responses]
    assert texts[0] == texts[1] == texts[2] == [f"answer to q{i} #0" for i in range(N)]
    runs = [rs.run for rs in responses]
    assert sum(r.generated for r in runs) == sum(r.written for r in runs) == N
    # Each job's misses are its own or another's; a job that planned after another wrote a block (a thread
    # started late on a loaded machine) saw those rows as hits.
    plans = [r.plan for r in runs if r.plan is not None]
    assert len(plans) == 3 and all(plan.hits + plan.misses == N for plan in plans)
    assert all(r.generated + r.from_other_jobs == plan.misses for r, plan in zip(runs, plans, strict=True))
    # a miss of the call is not "cached", whichever job generated it (every answer said cached, was)
    assert [sum(r.cached for r in rs) for rs in responses] == [plan.hits for plan in plans]
    database = models[0].store.database("completions", "t", descriptor)  # type: ignore[union-attr]
    assert database.count() == N
    totals = run_totals(database)
    assert (totals.misses, totals.generated, totals.rows_written) == (N, N, N)  # each input counted once
    assert claims_summary(database).total == 0  # nothing left behind


def test_a_late_result_for_a_lease_taken_over_is_never_written_twice(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stalled job renews nothing (its renewal thread is what stalled): its first block's leases expire
    # while it sleeps, the other job takes them over, and the stalled job's answers arrive late.
    monkeypatch.setattr(shared._Renewal, "_run", lambda self: None)
    stalled, other = SlowBackend(stall=1.5), SlowBackend(seconds=0.05)
    models = [job(store_root, descriptor, stalled, lease=0.5), job(store_root, descriptor, other, lease=0.5)]
    requests = [ask(i) for i in range(8)]
    responses = run_jobs(models, requests, after=stalled.asked)
    first_block = prompts_of(stalled)[:4]
    assert first_block == ["q0", "q1", "q2", "q3"] and set(first_block) <= set(prompts_of(other))  # taken over
    runs = [rs.run for rs in responses]
    assert runs[0].generated + runs[1].generated == 8 + 4  # the taken-over block was asked for twice
    assert runs[0].written + runs[1].written == 8  # and stored once: the late result was ignored
    database = models[0].store.database("completions", "t", descriptor)  # type: ignore[union-attr]
    assert database.count() == 8
    assert [r.text for r in responses[0]] == [r.text for r in responses[1]]


def test_a_job_left_waiting_on_inputs_others_hold_says_so_once(
    store_root: Path, descriptor: ModelDescriptor, caplog: pytest.LogCaptureFixture
) -> None:
    """A rerun after a job was killed sat silent until the dead job's leases ended (was): it says what it waits for
    once, after a quarter of a lease."""
    slow, quick = SlowBackend(stall=2.5), SlowBackend(seconds=0.01)
    models = [job(store_root, descriptor, slow, lease=2.0), job(store_root, descriptor, quick, lease=2.0)]
    with caplog.at_level(logging.WARNING, logger="inference.cache.shared"):
        run_jobs(models, [ask(i) for i in range(8)], after=slow.asked)
    said = [r.getMessage() for r in caplog.records if r.name == "inference.cache.shared"]
    assert len(said) == 1, said  # the quick job waited on the slow one's block, and said it once
    # "held by", not "at work": the job holding them may be dead (it was said at work, was)
    assert said[0].startswith("waiting for 4 inputs held by 1 other job;") and "leases end" in said[0]


class FailingStream(CountingBackend):
    """Streams its first block; on its second, hands over ``before_failing`` generations, then fails."""

    def __init__(self, before_failing: int) -> None:
        super().__init__()
        self.before_failing, self.blocks = before_failing, 0

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        self.blocks += 1
        generations = self.generate(requests)
        for index, generation in enumerate(generations):
            if self.blocks == 2 and index == self.before_failing:
                raise RuntimeError("API failed")
            yield index, generation


def test_a_job_that_fails_mid_batch_records_only_its_share_of_the_misses(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    # The failing job generates a block of 4 and 2 of its second block, then its engine fails: its run is
    # recorded with those 6 as its misses, and the other job's (which takes the failed job's leases over once
    # they end) with the other 18, so the runs count each input once. Recorded as the whole batch's misses, the
    # failed job's run counted the 18 again.
    failing, other = FailingStream(before_failing=2), SlowBackend(seconds=0.05)
    models = [job(store_root, descriptor, failing, lease=1.0), job(store_root, descriptor, other, lease=1.0)]
    requests = [ask(i) for i in range(N)]
    with pytest.raises(RuntimeError, match="API failed"):
        models[0].complete(requests)
    assert models[0].last.generated == 6 and models[0].last.from_other_jobs == N - 6
    responses = models[1].complete(requests)
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(N)]
    assert responses.run.generated == responses.run.plan.misses == N - 6  # type: ignore[union-attr]
    database = models[0].store.database("completions", "t", descriptor)  # type: ignore[union-attr]
    totals = run_totals(database)
    assert (totals.runs, totals.misses, totals.generated, totals.rows_written) == (2, N, N, N)


class InterruptedStream(FailingStream):
    """Ctrl-C in its second block, after ``before_failing`` generations of it."""

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        try:
            yield from super().generate_stream(requests)
        except RuntimeError:
            raise KeyboardInterrupt from None


def test_an_interrupted_job_gives_its_leases_back_so_a_rerun_need_not_wait_for_them(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    """Ctrl-C kept the block's leases for a whole lease (120 s by default): the same command run again, and every
    other job, waited that long for inputs nobody was generating."""
    interrupted = job(store_root, descriptor, InterruptedStream(before_failing=2), lease=600.0)
    requests = [ask(i) for i in range(N)]
    with pytest.raises(KeyboardInterrupt):
        interrupted.complete(requests)
    database = interrupted.store.database("completions", "t", descriptor)  # type: ignore[union-attr]
    summary = claims_summary(database)
    assert (summary.leased, summary.jobs, summary.stale) == (0, 0, 0) and summary.waiting == N - 6

    rerun = job(store_root, descriptor, SlowBackend(seconds=0.0), lease=600.0)
    responses = rerun.complete(requests)  # before the fix: waited 600 s for the 2 leases of the cut block
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(N)]
    assert responses.run.generated == N - 6  # type: ignore[union-attr]


def test_a_late_job_joins_the_remaining_work(store_root: Path, descriptor: ModelDescriptor) -> None:
    early, late = SlowBackend(seconds=0.2), SlowBackend(seconds=0.2)
    models = [job(store_root, descriptor, early), job(store_root, descriptor, late)]
    responses = run_jobs(models, [ask(i) for i in range(N)], after=early.asked)
    assert prompts_of(late) and "q0" not in prompts_of(late)  # it took part of what was left
    assert sorted(prompts_of(early) + prompts_of(late)) == sorted(f"q{i}" for i in range(N))
    assert [r.text for r in responses[1]] == [f"answer to q{i} #0" for i in range(N)]


@pytest.mark.postgres
@pytest.mark.parametrize("down_at", ["its start", "its first claim"])
def test_a_job_that_starts_while_the_server_restarts_waits_for_it(
    descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch, down_at: str
) -> None:
    """A job reaching the batch as the server went down for a few seconds ended at once ("cannot reach the
    server"), though the batch's later steps wait for it (was): at its lookup, or at its first steps in the
    batch. A server of its own: this test stops it."""
    from tests.pg_server import running_cluster

    with running_cluster() as cluster:
        url = cluster.url(cluster.new_database())
        store = Store(Settings(connect_timeout_s=1, lease_seconds=30), url=url)
        back = threading.Timer(2.0, cluster.start_again)

        def down_for_two_seconds() -> None:
            if not back.is_alive() and not back.finished.is_set():
                cluster.stop()
                back.start()

        if down_at == "its first claim":
            checked = store.check_writable

            def check_as_the_server_goes_down(*args: Any, **kwargs: Any) -> None:
                down_for_two_seconds()
                checked(*args, **kwargs)

            monkeypatch.setattr(store, "check_writable", check_as_the_server_goes_down)
        backend = SlowBackend(seconds=0.0)
        cached = CachedModel(store, descriptor, task="t", backend_factory=Factory(backend), chunk_size=4, shared=True)
        try:
            with store:
                if down_at == "its start":
                    down_for_two_seconds()
                responses = cached.complete([ask(i) for i in range(6)])
                assert back.finished.is_set()  # it was down
                assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(6)]
                assert store.database("completions", "t", descriptor).count() == 6
        finally:
            back.join()  # up again, for the cluster's own stop


def test_an_input_one_job_failed_is_reported_by_every_job_and_never_stored(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    backends = [SlowBackend(refuse=["q5"]) for _ in range(2)]
    models = [job(store_root, descriptor, b) for b in backends]
    outcomes: list[RequestsFailedError] = []

    def work(m: CachedModel) -> None:
        with pytest.raises(RequestsFailedError) as failed:
            m.complete([ask(i) for i in range(12)])
        outcomes.append(failed.value)

    threads = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == 2
    for error in outcomes:
        assert [f.request_index for f in error.failures] == [5]
        assert [r.text for r in error.responses if r.error is None] == [
            f"answer to q{i} #0" for i in range(12) if i != 5
        ]
    assert [p for b in backends for p in prompts_of(b)].count("q5") == 1  # the other job did not try it again
    for error in outcomes:  # the failed input is no input another job generated (it was counted one, was)
        run = error.responses.run
        assert run.plan is not None and run.generated + run.from_other_jobs + len(run.failed) == run.plan.misses
    assert models[0].store.database("completions", "t", descriptor).count() == 11  # type: ignore[union-attr]


def test_the_batch_run_again_after_its_jobs_stopped_asks_for_its_failed_input_at_once(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    """Run again within a lease of the failure, it sent nothing, reported the input "failed in another job" and
    counted it generated by other jobs (was)."""
    first = SlowBackend(refuse=["q5"])
    with pytest.raises(RequestsFailedError) as failed:
        job(store_root, descriptor, first, lease=60.0).complete([ask(i) for i in range(8)])
    assert [f.request_index for f in failed.value.failures] == [5] and prompts_of(first).count("q5") == 1
    again = SlowBackend()  # the input is fine now (a server's error passed, a prompt fixed on the engine's side)
    responses = job(store_root, descriptor, again, lease=60.0).complete([ask(i) for i in range(8)])
    assert prompts_of(again) == ["q5"] and responses[5].text == "answer to q5 #0" and not responses[5].cached
    assert (responses.run.generated, responses.run.from_other_jobs) == (1, 0)


def test_a_shared_batch_needs_mode_use(store: Store, descriptor: ModelDescriptor) -> None:
    for mode in ("refresh", "readonly", "replay", "off"):
        with pytest.raises(InvalidInputError, match="shared batch"):
            CachedModel(store, descriptor, task="t", backend_factory=CountingBackend, mode=mode, shared=True)  # type: ignore[arg-type]


def test_a_block_asked_for_again_after_the_store_was_busy_reports_its_refusals_once(
    store_root: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = CountingBackend(refuse=["q3"])
    model = job(store_root, descriptor, backend)
    model.chunk_size = 64  # one block
    database = model.store.database("completions", "t", descriptor)  # type: ignore[union-attr]
    kind = type(database)
    put_many, calls = kind.put_many, []

    def busy_once(self: Any, records: Any, policy: Any = "ignore") -> int:
        calls.append(len(records))
        if len(calls) == 1:
            raise DatabaseBusyError(database.path, "locked by another process")
        return put_many(self, records, policy)

    monkeypatch.setattr(kind, "put_many", busy_once)
    with pytest.raises(RequestsFailedError) as raised:
        model.complete([ask(i) for i in range(8)])
    # Before: the refusal counted once per attempt ("2 of 8 inputs ... failed").
    assert [f.request_index for f in raised.value.failures] == [3] and len(calls) >= 2  # the busy write retried
    assert database.count() == 7
