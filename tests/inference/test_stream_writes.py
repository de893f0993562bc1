"""Writing a stream on time: heartbeats, a write an interrupt cuts short, a model closed under a running call.

The cache boundary writes what finished every ``chunk_size`` rows or every
``STREAM_FLUSH_SECONDS``; a backend's heartbeats (None between arrivals) keep
that clock going while the next request takes minutes. The fake streams here
drive :func:`inference.cache.generate._stream` step by step; the hosted
backend is driven against the fake server (``tests/fake_openai.py``) through
the real ``openai`` client. The same on the real vLLM engine is in
``test_engine_stream.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from inference.backends.base import Arrival, EngineRequest, Generation, Refusal
from inference.cache import generate
from inference.cache.model import CachedModel
from inference.requests import CompletionRequest
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, JudgestoreError, RequestRefusedError, StoreFullError
from store.store import Database, Store
from tests.fake_openai import FakeOpenAI, Fault
from tests.inference.test_openai_backend import ask, served

DESCRIPTOR = ModelDescriptor(provider="vllm", model="m", sampling={"temperature": 0.0, "max_tokens": 8})


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def answer(i: int) -> Generation:
    return Generation(text=f"answer {i}", finish_reason="stop", usage={"prompt_tokens": 1, "completion_tokens": 1})


def asks(n: int) -> list[CompletionRequest]:
    return [CompletionRequest(messages=[{"role": "user", "content": f"p{i}"}]) for i in range(n)]


class Heartbeats:
    """Request 0 finishes at once; then only heartbeats, each after ``beat`` seconds, until the others finish.

    At each heartbeat it notes how many rows the store holds (``rows_at_beats``), as the caller left them.
    """

    def __init__(self, beats: int, beat: float) -> None:
        self.beats, self.beat = beats, beat
        self.database: Database | None = None
        self.rows_at_beats: list[int] = []

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [answer(i) for i in range(len(requests))]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        yield 0, answer(0)
        for _ in range(self.beats):
            time.sleep(self.beat)
            yield None
            assert self.database is not None
            self.rows_at_beats.append(self.database.count())
        for i in range(1, len(requests)):
            yield i, answer(i)

    def close(self) -> None:
        pass


def test_a_heartbeat_writes_what_finished_once_the_interval_has_passed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate, "STREAM_FLUSH_SECONDS", 0.2)
    backend = Heartbeats(beats=4, beat=0.1)
    backend.database = store.database("completions", "t", DESCRIPTOR)
    CachedModel(store, DESCRIPTOR, task="t", backend_factory=lambda: backend, chunk_size=100).complete(asks(4))
    # Nothing else finished: at the first beat the interval has not passed, by the third it has, without waiting
    # for request 1.
    assert backend.rows_at_beats[0] == 0 and backend.rows_at_beats[2:] == [1, 1]
    assert backend.database.count() == 4


def second_write_fails(monkeypatch: pytest.MonkeyPatch, database: Database, error: BaseException) -> list[int]:
    """Make the second ``put_many`` into ``database``'s kind raise ``error``; the sizes of the writes asked for."""
    kind = type(database)
    put_many, calls = kind.put_many, []

    def failing(self: Database, records: Any, policy: Any = "ignore") -> int:
        calls.append(len(records))
        if len(calls) == 2:
            raise error
        return put_many(self, records, policy)

    monkeypatch.setattr(kind, "put_many", failing)
    return calls


class AllAtOnce:
    """Every request finishes at once."""

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [answer(i) for i in range(len(requests))]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        return iter([(i, answer(i)) for i in range(len(requests))])

    def close(self) -> None:
        pass


def test_ctrl_c_during_a_write_still_writes_that_chunk(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    database = store.database("completions", "t", DESCRIPTOR)
    calls = second_write_fails(monkeypatch, database, KeyboardInterrupt())  # Ctrl-C while the second chunk is written
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=AllAtOnce, chunk_size=10)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(asks(25))
    monkeypatch.undo()
    # The chunk the interrupt cut short is written again (before: dropped, though the note said it was written);
    # what the stream had not handed over yet is not.
    assert calls == [10, 10, 10] and database.count() == 20
    assert "this call stored 20 rows (20 generated)" in "".join(raised.value.__notes__)


class Priced:
    """Every request finishes at once, each costing 100 tokens in and 10 out; request 15 is refused."""

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [self.outcome(i) for i in range(len(requests))]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        return iter([(i, self.outcome(i)) for i in range(len(requests))])

    @staticmethod
    def outcome(i: int) -> Generation | Refusal:
        if i == 15:
            return Refusal(RequestRefusedError("too long"))
        return Generation(text=f"a{i}", finish_reason="stop", usage={"prompt_tokens": 100, "completion_tokens": 10})

    def close(self) -> None:
        pass


def test_an_interrupt_after_a_chunk_was_written_counts_it_once(store: Store) -> None:
    progress: list[int] = []

    def interrupted_once(done: int, _total: int) -> None:
        progress.append(done)
        if len(progress) == 1:
            raise KeyboardInterrupt  # Ctrl-C lands in the progress bar, after the chunk was written

    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(asks(25), on_progress=interrupted_once)
    run = model.last
    # Before: the redo counted the chunk again (20 generated, 2,000 tokens, 10 rows stored).
    assert progress == [10] and (run.generated, run.written, run.spent.prompt_tokens) == (10, 10, 1000)
    assert store.database("completions", "t", DESCRIPTOR).count() == 10
    assert "this call stored 10 rows (10 generated)" in "".join(raised.value.__notes__)


def test_a_write_redone_after_ctrl_c_counts_the_refusals_of_its_chunk_in_the_progress(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = store.database("completions", "t", DESCRIPTOR)
    second_write_fails(monkeypatch, database, KeyboardInterrupt())  # the chunk holding the refusal (request 15)
    progress: list[int] = []
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(KeyboardInterrupt):
        model.complete(asks(25), on_progress=lambda done, _total: progress.append(done))
    monkeypatch.undo()
    run = model.last
    assert progress == [10, 20]  # 19 rows and the refusal (before: [10, 19])
    assert (run.written, [f.request_index for f in run.failed]) == (19, [15])


def test_ctrl_c_landing_after_a_chunks_commit_still_counts_its_rows_as_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redo of a write whose commit had landed inserted nothing (policy ignore) and counted nothing: "this call
    stored 10 rows" with 19 in the store (was; seen once in 30 Ctrl-Cs of a real run)."""
    database = store.database("completions", "t", DESCRIPTOR)
    kind = type(database)
    put_many, calls = kind.put_many, []

    def committed_then_interrupted(self: Database, records: Any, policy: Any = "ignore") -> int:
        calls.append(len(records))
        written = put_many(self, records, policy)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C between the commit and its count
        return written

    monkeypatch.setattr(kind, "put_many", committed_then_interrupted)
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(asks(25))
    monkeypatch.undo()
    stored = database.count()
    assert stored == 19 and model.last.written == stored  # request 15 refused; the second chunk committed
    assert f"this call stored {stored} rows" in "".join(raised.value.__notes__)


def test_a_chunk_the_store_refuses_still_counts_what_it_cost_and_its_refusals(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = store.database("completions", "t", DESCRIPTOR)
    second_write_fails(monkeypatch, database, StoreFullError(database.path, free_bytes=0, needed_bytes=1))
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(StoreFullError):
        model.complete(asks(25))
    run = model.last
    assert (run.written, run.spent.prompt_tokens) == (10, 1900)  # the second chunk was paid for: 9 answers
    assert [f.request_index for f in run.failed] == [15]  # and its refusal is reported


def test_a_failure_before_any_row_was_stored_does_not_say_they_are_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: "This run stored 0 rows before the failure (10 generated ...); they are kept"."""
    database = store.database("completions", "t", DESCRIPTOR)
    kind = type(database)

    def full(self: Database, records: Any, policy: Any = "ignore") -> int:
        raise StoreFullError(database.path, free_bytes=0, needed_bytes=1)

    monkeypatch.setattr(kind, "put_many", full)
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(StoreFullError) as raised:
        model.complete(asks(25))
    monkeypatch.undo()
    said = " ".join(raised.value.__notes__)
    assert raised.value.rows_kept == 0 == database.count()  # type: ignore[attr-defined]
    assert "stored 0 rows" in said and "nothing of it is kept: running it again generates them again" in said
    assert "they are kept" not in said


def test_a_failure_in_a_later_part_of_a_split_chunk_counts_the_parts_written_before(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk split around a row the store refuses: its first parts were written, then the disk filled: "stored
    0 rows ... nothing of it is kept" with 4 rows in the store (was)."""
    database = store.database("completions", "t", DESCRIPTOR)
    kind = type(database)
    put_many = kind.put_many

    def picky(self: Database, records: Any, policy: Any = "ignore") -> int:
        texts = {record.completion for record in records}
        if "a2" in texts:
            raise InvalidInputError("a value the store cannot hold; nothing was written")
        if "a7" in texts:
            raise StoreFullError(database.path, free_bytes=0, needed_bytes=1)
        return put_many(self, records, policy)

    monkeypatch.setattr(kind, "put_many", picky)
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Priced, chunk_size=10)
    with pytest.raises(StoreFullError) as raised:
        model.complete(asks(25))
    monkeypatch.undo()
    assert database.count() == 4 == raised.value.rows_kept == model.last.written  # type: ignore[attr-defined]
    assert "This run stored 4 rows before the failure" in " ".join(raised.value.__notes__)


class Watched:
    """Every request finishes at once; it notes whether the call's database existed when the stream was asked
    for (the engine taking the requests) and when it was first stepped, and whether it was closed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.database_at: dict[str, bool] = {}
        self.closed = False

    def exists(self) -> bool:
        return self.store.find("completions", "t", DESCRIPTOR) is not None

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [answer(i) for i in range(len(requests))]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[Arrival]:
        # As the vLLM backend's: started up to its first yield (the requests added), so closing it runs its finally.
        def stream() -> Iterator[Arrival]:
            try:
                self.database_at["requests added"] = self.exists()
                yield None
                self.database_at["first step"] = self.exists()
                yield from ((i, answer(i)) for i in range(len(requests)))
            finally:
                self.closed = True

        started = stream()
        next(started)
        return started

    def close(self) -> None:
        pass


def test_a_new_database_is_created_when_the_first_outcome_arrives(store: Store) -> None:
    # An engine in its own process (vLLM's default) computes while the database is created; a call none of whose
    # requests is answered creates none (a hosted model's name mistyped left an empty database, was).
    backend = Watched(store)
    CachedModel(store, DESCRIPTOR, task="t", backend_factory=lambda: backend, chunk_size=10).complete(asks(25))
    assert backend.database_at == {"requests added": False, "first step": False}
    assert store.database("completions", "t", DESCRIPTOR).count() == 25


def test_a_database_that_cannot_be_created_stops_the_stream_and_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = Watched(store)
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=lambda: backend, chunk_size=10)

    def full(*_args: Any) -> Database:
        raise StoreFullError(store.root, free_bytes=0, needed_bytes=1)

    monkeypatch.setattr(store, "database", full)  # the disk fills between the writability check and the creation
    with pytest.raises(StoreFullError):
        model.complete(asks(25))
    monkeypatch.undo()
    run = model.last
    assert backend.closed  # the engine's requests were aborted at its first outcome
    assert (run.generated, run.written) == (0, 0) and not backend.exists()


def test_an_interrupt_while_the_database_is_created_keeps_the_answers_that_had_come(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created at the first answers: a Ctrl-C landing in that creation dropped them, paid for and not counted
    (was, in a first version of the later creation)."""
    backend = Watched(store)
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=lambda: backend, chunk_size=10)
    create, tries = store.database, []

    def interrupted_once(*args: Any) -> Database:
        database = create(*args)
        if not tries:
            tries.append(1)
            raise KeyboardInterrupt
        return database

    monkeypatch.setattr(store, "database", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        model.complete(asks(25))
    monkeypatch.undo()
    run = model.last
    assert backend.closed and run.written == run.generated > 0
    assert store.database("completions", "t", DESCRIPTOR).count() == run.written


# ------------------------------------------------------------------ the hosted backend


def test_a_hosted_answer_is_written_on_time_while_a_slow_one_is_still_out(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate, "STREAM_FLUSH_SECONDS", 0.2)
    fake.add_fault(Fault(status=200, delay=4.0, after=2))  # the third request takes 4 s
    spec = served(fake, max_concurrency=3)
    database = store.database("completions", "t", spec.descriptor)
    seen: list[int] = []

    def probe() -> None:
        while len(fake.completions()) < 3:
            time.sleep(0.05)
        time.sleep(2.0)  # a heartbeat (0.5 s) after the interval, well before the slow answer
        seen.append(database.count())

    prober = threading.Thread(target=probe)
    prober.start()
    spec.cached(store, task="t", chunk_size=100).complete([ask(i) for i in range(3)])
    prober.join()
    assert seen == [2] and database.count() == 3


def test_ctrl_c_during_a_write_keeps_the_hosted_answers_that_had_arrived_meanwhile(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the answers waiting in the backend's queue (received, paid for) were dropped; the note said "what had
    finished was written"."""
    spec = served(fake, max_concurrency=4)
    database = store.database("completions", "t", spec.descriptor)
    kind = type(database)
    put_many = kind.put_many

    def slow_then_interrupted(self: Database, records: Any, policy: Any = "ignore") -> int:
        monkeypatch.setattr(kind, "put_many", put_many)  # the first write only; the redone one writes
        while len(fake.completions()) < 12:  # the other answers arrive while this write is slow
            time.sleep(0.02)
        time.sleep(0.5)
        raise KeyboardInterrupt

    monkeypatch.setattr(kind, "put_many", slow_then_interrupted)
    model = spec.cached(store, task="t", chunk_size=2)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete([ask(i) for i in range(12)])
    assert database.count() == model.last.written == 12
    assert "this call stored 12 rows (12 generated)" in "".join(raised.value.__notes__)


def test_closing_a_hosted_model_under_a_cancelled_call_ends_it_and_writes_what_arrived_before_it_returns(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate, "STREAM_FLUSH_SECONDS", 1000.0)  # nothing is written before the call ends
    fake.add_fault(Fault(status=200, delay=30.0, after=2, times=10))  # all but two take 30 s
    spec = served(fake, max_concurrency=6)
    database = store.database("completions", "t", spec.descriptor)
    written_at_exit: list[int] = []

    async def main() -> None:
        async with spec.cached(store, task="t", chunk_size=100) as model:
            call = asyncio.ensure_future(model.acomplete([ask(i) for i in range(6)]))
            while len(fake.completions()) < 6:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the two quick answers have arrived, unwritten
            call.cancel()
        written_at_exit.append(database.count())
        with contextlib.suppress(asyncio.CancelledError):
            await call

    started = time.monotonic()
    asyncio.run(main())
    # Before: close() stopped the loop under the batch and its thread waited forever (asyncio.run never returned);
    # then close() returned before the cancelled call had written what arrived.
    assert time.monotonic() - started < 20
    assert written_at_exit == [2] and database.count() == 2


class Counted:
    """A backend that counts how often it is made and closed."""

    made = closed = 0

    def __init__(self) -> None:
        Counted.made += 1

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [answer(i) for i in range(len(requests))]

    def close(self) -> None:
        Counted.closed += 1


def test_a_cancelled_call_that_reaches_the_engine_after_the_model_closed_gets_no_new_one(store: Store) -> None:
    planned, outcome = threading.Event(), []

    def on_plan(_plan: Any) -> None:
        planned.set()
        time.sleep(0.5)  # still planning when the caller cancels and leaves `async with`

    async def main() -> None:
        async with CachedModel(store, DESCRIPTOR, task="t", backend_factory=Counted) as model:
            await model.acomplete(asks(1))  # the engine is prepared
            call = asyncio.ensure_future(model.acomplete(asks(3), on_plan=on_plan))
            while not planned.is_set():
                await asyncio.sleep(0.01)
            call.cancel()
        outcome.append((Counted.made, Counted.closed, model._backend))  # close() waited for the call to end

    Counted.made = Counted.closed = 0
    asyncio.run(main())
    # Before: the call prepared a second engine after close(), which nothing ever closed.
    assert outcome == [(1, 1, None)]
    assert store.database("completions", "t", DESCRIPTOR).count() == 1


def test_a_closed_hosted_backend_says_so_to_the_call_still_streaming(fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=200, delay=30.0, times=10))
    backend = served(fake, max_concurrency=2).backend()
    stream = backend.generate_stream([EngineRequest({"type": "messages", "messages": [
        {"role": "user", "content": f"q{i}"}]}) for i in range(2)])  # fmt: skip
    assert next(stream) is None  # a heartbeat: nothing arrived yet
    closer = threading.Timer(0.2, backend.close)
    closer.start()
    with pytest.raises(JudgestoreError, match="was closed while this call was sending"):
        list(stream)
    closer.join()


def test_a_batch_submitted_as_the_backend_closes_is_refused_not_left_waiting(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() from another thread between a call's check that the backend is open and its submit (a cancelled
    async call's close): the batch went to a loop that had stopped, and its caller waited for it forever (the
    process then hung at exit, was)."""
    import inference.backends.hosted.client as client

    backend = served(fake, max_concurrency=2).backend()
    checked = client.messages_of
    closers: list[threading.Thread] = []

    def closed_meanwhile(request: Any, mode: Any) -> Any:
        if not closers:  # the first request's check: the call is past its "is it closed?" and has sent nothing
            closers.append(threading.Thread(target=backend.close))
            closers[0].start()
            closers[0].join()
        return checked(request, mode)

    monkeypatch.setattr(client, "messages_of", closed_meanwhile)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            list(backend.generate_stream([EngineRequest({"type": "messages", "messages": [
                {"role": "user", "content": "q"}]})]))  # fmt: skip
        except BaseException as e:  # whatever it is, the assertions below name it
            raised.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive(), "the call still waits for a batch that never runs"
    (error,) = raised
    assert isinstance(error, JudgestoreError) and "is closed" in str(error), repr(error)
    assert fake.completions() == []  # nothing was sent


def test_a_call_started_after_close_prepares_the_engine_again(store: Store) -> None:
    Counted.made = Counted.closed = 0
    model = CachedModel(store, DESCRIPTOR, task="t", backend_factory=Counted)
    with model:
        model.complete(asks(1))
    model.complete(asks(2))  # as LangChain's wrapper does after `with chat:`
    assert (Counted.made, Counted.closed) == (2, 1) and model.engine_loaded
    model.close()
    assert Counted.closed == 2
