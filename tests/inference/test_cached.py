"""The cache boundary with a counting fake engine: fast checks of every edge case.

Each behaviour here is also shown on the real vLLM engine in
``test_cached_engine.py``; the fake makes it cheap to count exactly what the
engine was asked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import EngineRequest, Generation, Refusal
from inference.cache.model import CachedModel
from inference.requests import CompletionRequest, JudgementRequest
from store.descriptor import ModelDescriptor, input_hash, render_messages
from store.errors import (
    BackendError,
    CacheMissError,
    InvalidInputError,
    JudgestoreError,
    PromptTooLongError,
    RequestRefusedError,
    RequestsFailedError,
)
from store.layout import Selector
from store.store import Store
from store.tables.filters import RowFilter


class CountingBackend:
    """Answers deterministically from the prompt and counts every prompt it receives.

    It refuses (as an engine refuses a prompt too long for it) every prompt in ``refuse``.
    """

    def __init__(self, fail_after: int | None = None, empty_for: str | None = None, refuse: Sequence[str] = ()) -> None:
        self.received: list[EngineRequest] = []
        self.fail_after = fail_after
        self.empty_for = empty_for
        self.refuse = set(refuse)
        self.closed = False

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        if self.fail_after is not None and len(self.received) + len(requests) > self.fail_after:
            raise RuntimeError("engine crashed")
        self.received.extend(requests)
        out: list[Generation | Refusal] = []
        for r in requests:
            content = r.rendered["messages"][-1]["content"]
            if content in self.refuse:
                out.append(Refusal(RequestRefusedError(f"the engine refuses {content!r}")))
                continue
            text = "" if content == self.empty_for else f"answer to {content} #{r.sample_index}"
            out.append(Generation(text, "stop", {"prompt_tokens": 3, "completion_tokens": 4}, {"x": -0.5}))
        return out

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self, backend: CountingBackend) -> None:
        self.backend = backend
        self.calls = 0

    def __call__(self) -> CountingBackend:
        self.calls += 1
        return self.backend


def ask(i: int, n: int = 1) -> CompletionRequest:
    return CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}], benchmark="b", instruction_id=str(i), n=n)


@pytest.fixture
def descriptor() -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0})


def model(store: Store | None, descriptor: ModelDescriptor, backend: CountingBackend, **kw: object) -> CachedModel:
    return CachedModel(store, descriptor, task="t", backend_factory=Factory(backend), **kw)  # type: ignore[arg-type]


def test_full_hit_never_calls_the_factory(store: Store, descriptor: ModelDescriptor) -> None:
    model(store, descriptor, CountingBackend()).complete([ask(i) for i in range(5)])
    again = CountingBackend()
    cached = model(store, descriptor, again)
    responses = cached.complete([ask(i) for i in range(5)])
    assert cached._backend_factory.calls == 0  # type: ignore[attr-defined]
    assert not cached.engine_loaded and not cached.last.engine_loaded
    assert all(r.cached for r in responses)
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(5)]


@pytest.mark.parametrize("mode", ["use", "refresh"])
def test_a_mode_that_writes_is_refused_on_a_store_opened_read_only_before_the_tokenizer_loads(
    store: Store, descriptor: ModelDescriptor, mode: str
) -> None:
    """Refused only once the tokenizer had loaded to measure the prompts, as the handle's DatabaseFileError (was).
    A plan, or a call that is all hits, only reads: it still works."""
    model(store, descriptor, CountingBackend()).complete([ask(0)])
    with Store(root=store.root, readonly=True) as readonly:
        engine = CountingBackend()
        writing = model(readonly, descriptor, engine, mode=mode)
        assert writing.plan("completions", [ask(0), ask(1)]).misses == (1 if mode == "use" else 2)  # refresh: all
        said = f"mode '{mode}' writes the misses, and the store was opened read-only"
        with pytest.raises(InvalidInputError, match=said):
            writing.complete([ask(0), ask(1)])
        assert engine.received == []
        if mode == "use":
            assert [r.cached for r in writing.complete([ask(0)])] == [True]


def test_replay_with_a_remote_on_a_store_opened_read_only_is_refused_not_a_silent_miss(
    store: Store, descriptor: ModelDescriptor, tmp_path: Path
) -> None:
    """The fetch failed into its report, which nobody read, and replay raised CacheMissError for a row the remote
    held, advising to run once with mode use (was)."""
    from store.sync import DirectoryRemote, push

    model(store, descriptor, CountingBackend()).complete([ask(0)])
    shared = tmp_path / "shared"
    shared.mkdir()
    push(store, DirectoryRemote(shared), Selector())
    empty = tmp_path / "empty"
    empty.mkdir()
    with Store(root=empty, readonly=True) as readonly:
        replay = model(readonly, descriptor, CountingBackend(), mode="replay", remote=DirectoryRemote(shared))
        with pytest.raises(InvalidInputError, match=r"a remote is fetched into the store.*opened read-only"):
            replay.complete([ask(0)])
    with Store(root=empty) as writable:
        fetched = model(writable, descriptor, CountingBackend(), mode="replay", remote=DirectoryRemote(shared))
        assert [r.cached for r in fetched.complete([ask(0)])] == [True]


def test_partial_hit_sends_exactly_the_misses_in_caller_order(store: Store, descriptor: ModelDescriptor) -> None:
    model(store, descriptor, CountingBackend()).complete([ask(1), ask(3)])
    backend = CountingBackend()
    responses = model(store, descriptor, backend).complete([ask(i) for i in range(5)])
    assert sorted(r.rendered["messages"][0]["content"] for r in backend.received) == ["q0", "q2", "q4"]
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(5)]
    assert [r.cached for r in responses] == [False, True, False, True, False]
    assert store.database("completions", "t", descriptor).count() == 5


def test_duplicates_in_a_batch_are_generated_once(store: Store, descriptor: ModelDescriptor) -> None:
    backend = CountingBackend()
    cached = model(store, descriptor, backend)
    responses = cached.complete([ask(1), ask(2), ask(1), ask(1)])
    assert len(backend.received) == 2
    assert cached.last.plan is not None
    assert (cached.last.plan.distinct, cached.last.plan.duplicates, cached.last.plan.misses) == (2, 2, 2)
    assert responses[0].text == responses[2].text == responses[3].text


def test_with_sample_repeats_each_repeat_takes_its_inputs_next_samples(
    store: Store, descriptor: ModelDescriptor
) -> None:
    """What the drop-ins ask at a random sampling: the k-th request of an input gets sample k (a request of n
    samples takes n of them), so that no two repeats share a key; a rerun finds each one again."""
    backend = CountingBackend()
    cached = model(store, descriptor, backend)
    responses = cached.complete([ask(1), ask(2, n=2), ask(1), ask(2), ask(1)], sample_repeats=True)
    assert [[s.sample_index for s in r.samples] for r in responses] == [[0], [0, 1], [1], [2], [2]]
    assert sorted((r.rendered["messages"][0]["content"], r.sample_index) for r in backend.received) == [
        ("q1", 0), ("q1", 1), ("q1", 2), ("q2", 0), ("q2", 1), ("q2", 2)
    ]  # fmt: skip
    assert cached.last.plan is not None and cached.last.plan.duplicates == 0
    planned = model(store, descriptor, CountingBackend()).plan("completions", [ask(1)] * 4, sample_repeats=True)
    assert (planned.distinct, planned.hits, planned.misses) == (4, 3, 1)  # samples 0-2 stored, sample 3 not
    again = model(store, descriptor, CountingBackend()).complete([ask(1), ask(1)], sample_repeats=True)
    assert [r.samples[0].input_hash for r in again] == [responses[0].samples[0].input_hash,
                                                        responses[2].samples[0].input_hash]  # fmt: skip
    assert all(r.cached for r in again)


def test_more_samples_generate_only_the_missing_ones(store: Store, descriptor: ModelDescriptor) -> None:
    model(store, descriptor, CountingBackend()).complete([ask(7, n=2)])
    backend = CountingBackend()
    (response,) = model(store, descriptor, backend).complete([ask(7, n=4)])
    assert sorted(r.sample_index for r in backend.received) == [2, 3]
    assert [s.sample_index for s in response.samples] == [0, 1, 2, 3]
    assert [s.cached for s in response.samples] == [True, True, False, False]
    rendered = render_messages([{"role": "user", "content": "q7"}])
    assert response.samples[0].input_hash == input_hash(rendered)
    assert len({s.input_hash for s in response.samples}) == 4


def test_replay_fails_on_a_miss_naming_the_first_and_never_prepares(store: Store, descriptor: ModelDescriptor) -> None:
    model(store, descriptor, CountingBackend()).complete([ask(0)])
    backend = CountingBackend()
    cached = model(store, descriptor, backend, mode="replay")
    with pytest.raises(CacheMissError, match=r"request 1 \(b/1\)") as raised:
        cached.complete([ask(0), ask(1), ask(2), ask(1), ask(0, n=2)])
    assert raised.value.missing_requests == (1, 2, 3, 4)  # a duplicate and a missing sample name theirs too
    assert cached._backend_factory.calls == 0  # type: ignore[attr-defined]
    assert [r.text for r in cached.complete([ask(0)])] == ["answer to q0 #0"]


def test_refresh_regenerates_and_replaces(store: Store, descriptor: ModelDescriptor) -> None:
    model(store, descriptor, CountingBackend()).complete([ask(0)])
    database = store.database("completions", "t", descriptor)
    before = next(iter(database.query()))

    class Other(CountingBackend):
        def generate(self, requests: Sequence[EngineRequest]) -> list[Generation]:
            return [Generation("fresh", "stop") for _ in requests]

    responses = model(store, descriptor, Other(), mode="refresh").complete([ask(0)])
    after = next(iter(database.query()))
    assert responses[0].text == "fresh" and not responses[0].cached
    assert (before.completion, after.completion) == ("answer to q0 #0", "fresh")
    assert database.count() == 1


def test_readonly_generates_but_never_writes(store: Store, descriptor: ModelDescriptor) -> None:
    backend = CountingBackend()
    responses = model(store, descriptor, backend, mode="readonly").complete([ask(0), ask(1)])
    assert [r.cached for r in responses] == [False, False]
    assert store.find("completions", "t", descriptor) is None
    assert not any(store.root.rglob("*.db"))


def test_off_mode_needs_no_store(descriptor: ModelDescriptor) -> None:
    backend = CountingBackend()
    responses = model(None, descriptor, backend, mode="off").complete([ask(0), ask(0)])
    assert len(backend.received) == 1 and responses[1].text == "answer to q0 #0"


def test_an_empty_output_is_a_result_stored_and_hit_like_any_other(store: Store, descriptor: ModelDescriptor) -> None:
    backend = CountingBackend(empty_for="q1")
    responses = model(store, descriptor, backend).complete([ask(0), ask(1)])
    assert responses[1].text == "" and responses[1].samples[0].finish_reason == "stop"
    database = store.database("completions", "t", descriptor)
    assert database.count() == 2
    (row,) = [r for r in database.query() if r.instruction_id == "1"]
    assert row.completion == "" and row.top_logprobs == {"x": -0.5}  # its logprobs are kept too
    rerun = CountingBackend()
    again = model(store, descriptor, rerun)
    hits = again.complete([ask(0), ask(1)])
    assert rerun.received == [] and not again.engine_loaded
    assert [r.cached for r in hits] == [True, True] and hits[1].text == ""


def test_a_refused_request_fails_alone_and_the_rest_is_answered_and_stored(
    store: Store, descriptor: ModelDescriptor
) -> None:
    backend = CountingBackend(refuse=["q2"])
    cached = model(store, descriptor, backend, chunk_size=2)
    with pytest.raises(RequestsFailedError, match=r"1 of 5 inputs to generate failed.*request 2 \(b/2\)") as raised:
        cached.complete([ask(i) for i in range(5)] + [ask(2)])  # the bad one twice: one input, two requests
    responses = raised.value.responses
    assert [r.text for r in responses] == [f"answer to q{i} #0" if i != 2 else "" for i in range(5)] + [""]
    assert [r.error is not None for r in responses] == [False, False, True, False, False, True]
    assert isinstance(responses[2].error, RequestRefusedError) and "refuses 'q2'" in str(responses[2].error)
    (failure,) = raised.value.failures
    assert (failure.request_index, failure.request, failure.sample_index) == (2, "b/2", 0)
    assert cached.last.failed == [failure] and cached.last.written == 4
    assert store.database("completions", "t", descriptor).count() == 4  # everything but the refused input
    rerun = CountingBackend()
    model(store, descriptor, rerun).complete([ask(i) for i in range(5)])
    assert [r.rendered["messages"][0]["content"] for r in rerun.received] == ["q2"]


def test_what_the_preflight_refuses_never_reaches_the_engine(store: Store, descriptor: ModelDescriptor) -> None:
    asked: list[int] = []

    def preflight(requests: Sequence[EngineRequest]) -> dict[int, JudgestoreError]:
        asked.append(len(requests))
        too_long = (i for i, r in enumerate(requests) if r.rendered["messages"][0]["content"] == "q3")
        return {i: PromptTooLongError("the prompt is 300 tokens; max_model_len is 256") for i in too_long}

    backend = CountingBackend()
    first = model(store, descriptor, backend, preflight=preflight)
    with pytest.raises(RequestsFailedError, match="PromptTooLongError: the prompt is 300 tokens"):
        first.complete([ask(i) for i in range(5)])
    assert sorted(r.rendered["messages"][0]["content"] for r in backend.received) == ["q0", "q1", "q2", "q4"]
    rerun = CountingBackend()
    again = model(store, descriptor, rerun, preflight=preflight)
    with pytest.raises(RequestsFailedError) as raised:
        again.complete([ask(i) for i in range(5)])
    assert asked == [5, 1]  # only the misses are checked
    assert rerun.received == [] and again._backend_factory.calls == 0  # type: ignore[attr-defined]
    assert not again.last.engine_loaded and [r.cached for r in raised.value.responses] == [True] * 3 + [False, True]


def test_a_row_the_store_refuses_fails_alone_and_every_other_row_is_written(
    store: Store, descriptor: ModelDescriptor
) -> None:
    backend = CountingBackend()
    answer = backend.generate

    def broken_answer_to_q5(requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [
            Generation("broken \udc80 answer", "stop") if r.rendered["messages"][0]["content"] == "q5" else g
            for r, g in zip(requests, answer(requests), strict=True)
        ]

    backend.generate = broken_answer_to_q5  # type: ignore[method-assign]
    cached = model(store, descriptor, backend, chunk_size=8)
    with pytest.raises(RequestsFailedError, match=r"request 5 \(b/5\): InvalidInputError: .*not valid Unicode"):
        cached.complete([ask(i) for i in range(8)])
    assert cached.last.written == 7 and cached.last.generated == 8
    assert store.database("completions", "t", descriptor).count() == 7
    (failure,) = cached.last.failed
    assert failure.request_index == 5 and isinstance(failure.error, InvalidInputError)


def test_a_streaming_backend_refusal_fails_alone(store: Store, descriptor: ModelDescriptor) -> None:
    backend = StreamingBackend()
    backend.refuse = {"q1"}
    with pytest.raises(RequestsFailedError) as raised:
        model(store, descriptor, backend, chunk_size=2).complete([ask(i) for i in range(4)])
    assert [r.error is None for r in raised.value.responses] == [True, False, True, True]
    assert store.database("completions", "t", descriptor).count() == 3


def test_a_crash_keeps_finished_chunks_and_the_rerun_resumes(store: Store, descriptor: ModelDescriptor) -> None:
    crashing = CountingBackend(fail_after=4)
    with pytest.raises(RuntimeError, match="engine crashed"):
        model(store, descriptor, crashing, chunk_size=2).complete([ask(i) for i in range(7)])
    assert store.database("completions", "t", descriptor).count() == 4  # two whole chunks written
    backend = CountingBackend()
    responses = model(store, descriptor, backend, chunk_size=2).complete([ask(i) for i in range(7)])
    assert len(backend.received) == 3
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(7)]


def test_judgements_record_pair_orientation_and_pointwise(store: Store, descriptor: ModelDescriptor) -> None:
    requests = [
        JudgementRequest(
            messages=[{"role": "user", "content": "A vs B"}], model_a="A", model_b="B", orientation="direct"
        ),
        JudgementRequest(
            messages=[{"role": "user", "content": "B vs A"}], model_a="A", model_b="B", orientation="reversed"
        ),
        JudgementRequest(messages=[{"role": "user", "content": "rate A"}], model_a="A"),
        JudgementRequest(messages=[{"role": "user", "content": "rate B"}], model_a="B", judge="judge-y"),
    ]
    model(store, descriptor, CountingBackend(), label="judge-x").judge(requests)
    database = store.database("judgements", "t", descriptor)
    rows = {(r.orientation, r.model_a): r for r in database.query()}
    assert set(rows) == {("direct", "A"), ("reversed", "A"), (None, "A"), (None, "B")}
    assert rows[None, "A"].model_b is None and rows["direct", "A"].model_b == "B"
    assert {key: r.judge for key, r in rows.items()} == {  # a request's own judge is kept
        ("direct", "A"): "judge-x",
        ("reversed", "A"): "judge-x",
        (None, "A"): "judge-x",
        (None, "B"): "judge-y",
    }
    assert database.count(RowFilter(pointwise=True)) == 2


def test_a_completion_request_names_its_own_model_over_the_label(store: Store, descriptor: ModelDescriptor) -> None:
    requests = [ask(0), CompletionRequest(messages=[{"role": "user", "content": "q1"}], model="fine-tune-7")]
    model(store, descriptor, CountingBackend(), label="base").complete(requests)
    stored = {r.completion: r.model for r in store.database("completions", "t", descriptor).query()}
    assert stored == {"answer to q0 #0": "base", "answer to q1 #0": "fine-tune-7"}


def test_results_equal_what_the_miss_returned(store: Store, descriptor: ModelDescriptor) -> None:
    first = model(store, descriptor, CountingBackend()).complete([ask(0)])[0].samples[0]
    again = model(store, descriptor, CountingBackend()).complete([ask(0)])[0].samples[0]
    assert (first.text, first.top_logprobs, first.usage, first.finish_reason) == (
        again.text,
        again.top_logprobs,
        again.usage,
        again.finish_reason,
    )
    assert again.cached and not first.cached


def test_bad_requests_are_refused_before_anything_runs(store: Store, descriptor: ModelDescriptor) -> None:
    backend = CountingBackend()
    cached = model(store, descriptor, backend)
    with pytest.raises(InvalidInputError, match="chat input"):
        cached.complete([ask(0), CompletionRequest(text="plain")])
    with pytest.raises(InvalidInputError, match="exactly one"):
        CompletionRequest(messages=[{"role": "user", "content": "x"}], text="y")
    with pytest.raises(InvalidInputError, match="n must be"):
        CompletionRequest(text="y", n=0)
    with pytest.raises(InvalidInputError, match="take JudgementRequest"):
        cached.judge([ask(0)])  # type: ignore[list-item]
    assert backend.received == [] and not any(store.root.rglob("*.db"))


class StreamingBackend(CountingBackend):
    """A hosted-API-like backend: generations arrive one by one, last request first; it may fail after some."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.stream_fail_after = fail_after
        self.failure: BaseException = RuntimeError("API failed")
        self.rows_seen_at_arrival: list[int] = []  # rows in the store when each generation was handed over
        self.database: Any = None

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[tuple[int, Generation | Refusal]]:
        generations = CountingBackend.generate(self, requests)
        for sent, index in enumerate(reversed(range(len(requests)))):
            if self.stream_fail_after is not None and sent >= self.stream_fail_after:
                raise self.failure
            if self.database is not None:
                self.rows_seen_at_arrival.append(self.database.count())
            yield index, generations[index]


class BatchSizes(StreamingBackend):
    """A streaming backend that cannot bound one call's requests in flight (as vLLM's): ``generate`` is its stream
    collected, and it records the size of each stream it is asked for."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__(fail_after)
        self.batches: list[int] = []

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        results: dict[int, Generation | Refusal] = {}
        for arrival in self.generate_stream(requests):
            results.update([arrival])
        return [results[i] for i in range(len(requests))]

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[tuple[int, Generation | Refusal]]:
        self.batches.append(len(requests))
        return super().generate_stream(requests)


def test_a_calls_max_concurrency_gives_a_backend_that_cannot_bound_it_that_many_at_a_time(
    store: Store, descriptor: ModelDescriptor
) -> None:
    backend = BatchSizes()
    cached = model(store, descriptor, backend)
    for bad in (0, 2.5, "3"):
        with pytest.raises(InvalidInputError, match="max_concurrency must be an integer"):
            cached.complete([ask(i) for i in range(5)], max_concurrency=bad)  # type: ignore[arg-type]
    assert backend.received == [] and not cached.engine_loaded
    responses = cached.complete([ask(i) for i in range(5)], max_concurrency=2)
    assert backend.batches == [2, 2, 1]  # not one stream of 5: it could not keep 2 of them in flight
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(5)]
    cached.complete([ask(i) for i in range(5, 8)])
    assert backend.batches == [2, 2, 1, 3]  # without a bound: one stream, every miss at once


def test_a_bounded_call_on_a_backend_that_cannot_bound_it_writes_what_finished_before_ctrl_c(
    store: Store, descriptor: ModelDescriptor
) -> None:
    """Each group is streamed and written as it finishes, as an unbounded call is: Ctrl-C loses no finished row."""
    backend = BatchSizes(fail_after=3)
    backend.failure = KeyboardInterrupt()
    backend.database = store.database("completions", "t", descriptor)
    progress: list[int] = []
    with pytest.raises(KeyboardInterrupt) as raised:
        model(store, descriptor, backend, chunk_size=10).complete(
            [ask(i) for i in range(6)], max_concurrency=4, on_progress=lambda done, _total: progress.append(done)
        )
    assert backend.batches == [4]  # the first group, interrupted after 3 of its 4 arrived
    assert store.database("completions", "t", descriptor).count() == 3  # what arrived is written before it goes on
    assert progress == [3]
    assert "this call stored 3 rows (3 generated)" in "\n".join(raised.value.__notes__)


class ClosableBatchSizes(BatchSizes):
    """:class:`BatchSizes` that refuses a stream once closed, as vLLM's backend does."""

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[tuple[int, Generation | Refusal]]:
        if self.closed:
            raise JudgestoreError("the backend is closed")
        return super().generate_stream(requests)


def test_a_model_closed_between_a_bounded_calls_groups_stops_it_as_an_engine_failure_saying_what_was_kept(
    store: Store, descriptor: ModelDescriptor
) -> None:
    """A close between two groups stops the call as a close during a group does: typed, with ``rows_kept``."""
    backend = ClosableBatchSizes()
    cached = model(store, descriptor, backend, chunk_size=10)
    with pytest.raises(BackendError, match=r"stopped between this call's groups.*closed.*4 of 6") as raised:
        cached.complete([ask(i) for i in range(6)], max_concurrency=2, on_progress=lambda *_: cached.close())
    assert backend.batches == [2]  # no group started on the closed engine
    assert raised.value.rows_kept == 2 == store.database("completions", "t", descriptor).count()
    assert "This call stored 2 rows before the failure" in "\n".join(raised.value.__notes__)


def test_a_streaming_backend_gets_every_miss_at_once_and_rows_are_written_as_they_arrive(
    store: Store, descriptor: ModelDescriptor
) -> None:
    backend = StreamingBackend()
    backend.database = store.database("completions", "t", descriptor)
    progress: list[tuple[int, int]] = []
    responses = model(store, descriptor, backend, chunk_size=2).complete(
        [ask(i) for i in range(5)], on_progress=lambda done, total: progress.append((done, total))
    )
    assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(5)]  # caller's order
    assert backend.rows_seen_at_arrival == [0, 0, 2, 2, 4]  # written every chunk_size arrivals, not at the end
    assert progress == [(2, 5), (4, 5), (5, 5)]  # reported after each write


def test_a_streaming_backend_that_fails_keeps_what_arrived(store: Store, descriptor: ModelDescriptor) -> None:
    with pytest.raises(RuntimeError, match="API failed"):
        model(store, descriptor, StreamingBackend(fail_after=3), chunk_size=10).complete([ask(i) for i in range(5)])
    assert store.database("completions", "t", descriptor).count() == 3  # arrived, so paid for: written
    rerun = CountingBackend()
    model(store, descriptor, rerun).complete([ask(i) for i in range(5)])
    assert sorted(r.rendered["messages"][0]["content"] for r in rerun.received) == ["q0", "q1"]


def test_ctrl_c_writes_what_arrived_and_says_so(store: Store, descriptor: ModelDescriptor) -> None:
    backend = StreamingBackend(fail_after=3)
    backend.failure = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as raised:
        model(store, descriptor, backend, chunk_size=10).complete([ask(i) for i in range(5)])
    assert store.database("completions", "t", descriptor).count() == 3
    assert "this call stored 3 rows (3 generated)" in "\n".join(raised.value.__notes__)


# ---------------------------------------------------------------- what it cost, what it saved


def test_each_row_records_its_share_of_the_engine_time(store: Store, descriptor: ModelDescriptor) -> None:
    responses = model(store, descriptor, CountingBackend()).complete([ask(i) for i in range(3)])
    rows = list(store.database("completions", "t", descriptor).query())
    for row in rows:
        assert row.usage is not None and row.usage["completion_tokens"] == 4 and row.usage["engine_seconds"] >= 0
    assert [r.samples[0].usage for r in responses] == [  # what a miss returns is what its row holds
        next(row.usage for row in rows if row.input_hash == r.samples[0].input_hash) for r in responses
    ]


def test_a_full_hit_run_says_what_it_saved_and_records_it(store: Store, descriptor: ModelDescriptor) -> None:
    from store.runs import recent_runs

    first = model(store, descriptor, CountingBackend())
    first.complete([ask(i) for i in range(4)])
    assert (first.last.spent.rows, first.last.spent.prompt_tokens, first.last.spent.completion_tokens) == (4, 12, 16)
    assert first.last.saved.rows == 0
    again = model(store, descriptor, CountingBackend())
    again.complete([ask(i) for i in range(4)] + [ask(0)])
    saved = again.last.saved
    assert (saved.rows, saved.prompt_tokens, saved.completion_tokens, saved.without_cost) == (4, 12, 16, 0)
    assert saved.engine_seconds == pytest.approx(first.last.spent.engine_seconds)
    assert again.last.spent.rows == 0
    second, one = recent_runs(store.database("completions", "t", descriptor))
    assert (one.hits, one.misses, one.generated, one.rows_written, one.prompt_tokens) == (0, 4, 4, 4, 12)
    assert (second.requested, second.hits, second.duplicates, second.saved_completion_tokens) == (5, 4, 1, 16)
    assert second.run_id == "test-run" and second.created_by == "tester" and second.mode == "use"


def test_runs_are_not_recorded_when_nothing_may_be_written(
    store: Store, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.runs import recent_runs
    from store.settings import Settings

    model(store, descriptor, CountingBackend()).complete([ask(0)])
    database = store.database("completions", "t", descriptor)
    model(store, descriptor, CountingBackend(), mode="readonly").complete([ask(0), ask(1)])
    model(store, descriptor, CountingBackend(), mode="replay").complete([ask(0)])
    monkeypatch.setenv("JUDGESTORE_RECORD_RUNS", "0")
    model(store, descriptor, CountingBackend(), settings=Settings()).complete([ask(0)])
    assert len(recent_runs(database)) == 1


def test_a_plan_says_when_misses_are_unexpected(store: Store, descriptor: ModelDescriptor) -> None:
    fresh = model(store, descriptor, CountingBackend()).plan("completions", [ask(0)])
    model(store, descriptor, CountingBackend()).complete([ask(0), ask(1)])
    cached = model(store, descriptor, CountingBackend())
    cached.complete([ask(0), ask(2)])
    plan = cached.last.plan
    assert plan is not None and plan.stored_rows == 2 and plan.unexpected_misses
    assert plan.miss_note() == "1 misses although this descriptor's database holds 2 rows"
    other = descriptor.model_copy(update={"sampling": descriptor.sampling.model_copy(update={"temperature": 0.7})})
    elsewhere = model(store, other, CountingBackend(), mode="replay")
    with pytest.raises(CacheMissError):
        elsewhere.complete([ask(0)])
    assert elsewhere.last.plan is not None and elsewhere.last.plan.other_descriptors == 1
    assert str(elsewhere.last.plan.miss_note()).endswith("1 other descriptor of this model and task is")
    # replay generates nothing: its plan says what is missing (was: "1 to generate")
    assert "1 missing, 0 duplicates (mode replay)" in elsewhere.last.plan.summary()
    # a database created by a run that failed before writing a row stores nothing: no surprise to point at
    unwritten = descriptor.model_copy(update={"sampling": descriptor.sampling.model_copy(update={"top_p": 0.5})})
    store.database("completions", "t", unwritten)
    again = model(store, other, CountingBackend(), mode="replay")
    with pytest.raises(CacheMissError):
        again.complete([ask(0)])
    assert again.last.plan is not None and again.last.plan.other_descriptors == 1
    assert fresh.miss_note() is None  # plan() alone does not look further; an empty store is no surprise either
    assert model(store, descriptor, CountingBackend()).last.plan is None


@pytest.mark.postgres
def test_on_a_server_store_a_row_it_refuses_fails_alone_too(pg_url: str, descriptor: ModelDescriptor) -> None:
    from store.settings import Settings

    backend = CountingBackend()
    answer = backend.generate

    def broken_answer_to_q1(requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [
            Generation("broken \udc80 answer", "stop") if r.rendered["messages"][0]["content"] == "q1" else g
            for r, g in zip(requests, answer(requests), strict=True)
        ]

    backend.generate = broken_answer_to_q1  # type: ignore[method-assign]
    with Store(Settings(), url=pg_url) as server:
        cached = model(server, descriptor, backend, chunk_size=4)
        with pytest.raises(RequestsFailedError, match=r"request 1 \(b/1\): InvalidInputError"):
            cached.complete([ask(i) for i in range(6)])
        assert server.database("completions", "t", descriptor).count() == 5 == cached.last.written


@pytest.mark.postgres
def test_a_server_that_stops_answering_as_the_run_ends_costs_the_runs_row_only(
    descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row stored, then the server restarted as the run's accounting was written: the call failed, and
    `generate` wrote no output file and exited 1 (was). A server of its own: this test stops it."""
    from inference.cache import model as cached_model
    from store.runs import RunNotRecordedWarning, recent_runs
    from store.settings import Settings
    from tests.pg_server import running_cluster

    with running_cluster() as cluster:
        url = cluster.url(cluster.new_database())
        recorded = cached_model.record_run

        def record_while_the_server_is_down(*args: Any) -> int:
            cluster.stop()
            return recorded(*args)

        monkeypatch.setattr(cached_model, "record_run", record_while_the_server_is_down)
        with Store(Settings(connect_timeout_s=1), url=url) as server:
            cached = model(server, descriptor, CountingBackend())
            with pytest.warns(RunNotRecordedWarning, match="its answers are complete") as said:
                responses = cached.complete([ask(i) for i in range(3)])
            assert [r.text for r in responses] == [f"answer to q{i} #0" for i in range(3)]
            assert "JUDGESTORE_RECORD_RUNS" not in str(said[0].message)  # no refusal: nothing to turn off
        cluster.start_again()
        with Store(Settings(), url=url, readonly=True) as server:
            database = server.open(server.locations()[0])
            assert database.count() == 3 and recent_runs(database) == []


@pytest.mark.postgres
def test_a_call_the_server_ends_midway_raises_its_error_and_never_says_its_answers_are_complete(
    descriptor: ModelDescriptor,
) -> None:
    import warnings

    from store.errors import ServerUnavailableError
    from store.settings import Settings
    from tests.pg_server import running_cluster

    with running_cluster() as cluster:
        url = cluster.url(cluster.new_database())
        backend = CountingBackend()
        answer = backend.generate

        def answer_then_go_down(requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
            if backend.received:  # the second chunk: the server goes before it is written
                cluster.stop()
            return answer(requests)

        backend.generate = answer_then_go_down  # type: ignore[method-assign]
        with Store(Settings(connect_timeout_s=1), url=url) as server, warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with pytest.raises(ServerUnavailableError):
                model(server, descriptor, backend, chunk_size=2).complete([ask(i) for i in range(4)])
        cluster.start_again()  # for the cluster's own stop
        assert not [w for w in said if "answers are complete" in str(w.message)], [str(w.message) for w in said]


@pytest.mark.parametrize("chunk_size", [0, 2.5, "8", True])
def test_a_chunk_size_that_is_no_count_is_refused_before_a_model_loads(
    store: Store, descriptor: ModelDescriptor, chunk_size: object
) -> None:
    factory = Factory(CountingBackend())
    with pytest.raises(InvalidInputError, match="chunk_size must be an integer >= 1"):
        CachedModel(store, descriptor, task="t", backend_factory=factory, chunk_size=chunk_size).complete([ask(0)])  # type: ignore[arg-type]
    assert factory.calls == 0


def test_requests_given_as_a_generator_are_read_once_and_what_is_no_batch_is_refused(
    store: Store, descriptor: ModelDescriptor
) -> None:
    """A generator failed with "'generator' object is not subscriptable" after its keys were computed, and
    plan("x", ...) said "x take JudgementRequest" (was)."""
    backend = CountingBackend()
    cached = model(store, descriptor, backend)
    answers = cached.complete(ask(i) for i in range(4))  # type: ignore[arg-type]
    assert [r.request for r in answers] == [ask(i) for i in range(4)] and len(backend.received) == 4
    assert cached.complete(iter([ask(0)])).run.generated == 0  # type: ignore[arg-type]  # a hit
    for not_a_batch in ("q0", {"messages": []}, 5):
        with pytest.raises(InvalidInputError, match="requests must be a list of requests, got"):
            cached.complete(not_a_batch)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="role"):
        cached.plan("x", [ask(0)])  # type: ignore[arg-type]


def test_a_store_given_as_a_path_is_refused_naming_what_to_give(tmp_path: Any, descriptor: ModelDescriptor) -> None:
    """``spec.cached("/tmp/x", task=...)`` was an AttributeError ('str' object has no attribute 'settings')."""
    from inference.spec import HostedSpec

    with pytest.raises(InvalidInputError, match=r"store must be a Store, e.g. Store\(root='.*x'\), got str"):
        model(str(tmp_path / "x"), descriptor, CountingBackend())  # type: ignore[arg-type]
    spec = HostedSpec(model="m", provider="vllm-server", base_url="http://h/v1")
    with pytest.raises(InvalidInputError, match="store must be a Store"):
        spec.cached(str(tmp_path / "x"), task="t")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_a_store_pickles_as_what_opens_it_again_for_a_worker_process(store: Store, descriptor: ModelDescriptor) -> None:
    """Pickled for a spawned worker once a database was open, it failed on a local function of the SQLite
    connector (was); a worker opens its own connections to the same store."""
    import copy
    import pickle

    cached = model(store, descriptor, CountingBackend())
    cached.complete([ask(0)])  # a database open
    again = pickle.loads(pickle.dumps(store))
    assert again is not store and again.where == store.where and again.settings == store.settings
    assert model(again, descriptor, CountingBackend()).complete([ask(0)])[0].cached  # the row is there
    assert copy.copy(store).where == store.where
    again.close()


def test_a_token_count_no_run_record_holds_costs_the_runs_row_only(store: Store, descriptor: ModelDescriptor) -> None:
    """A server's usage of 2^63 prompt tokens: every row stored, then recording the run raised a bare
    OverflowError, the answers were lost, and every later hit of the row did the same (was)."""
    from store.runs import RunNotRecordedWarning, recent_runs

    backend = CountingBackend()
    answer = backend.generate

    def absurd_usage(requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return [
            Generation(g.text, g.finish_reason, {"prompt_tokens": 2**63, "completion_tokens": 1}, g.top_logprobs)
            if isinstance(g, Generation)
            else g
            for g in answer(requests)
        ]

    backend.generate = absurd_usage  # type: ignore[method-assign]
    for _ in range(2):  # generated, then all hits: the same
        with pytest.warns(RunNotRecordedWarning, match=r"prompt_tokens past what the runs table holds") as said:
            responses = model(store, descriptor, backend).complete([ask(i) for i in range(2)])
        assert [r.text for r in responses] == ["answer to q0 #0", "answer to q1 #0"]
        assert "its answers are complete" in str(said[0].message)
    database = store.database("completions", "t", descriptor)
    assert database.count() == 2 and recent_runs(database) == []
