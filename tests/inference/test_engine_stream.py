"""The whole batch in flight: a cold call on the real vLLM engine (tiny model) with ``max_num_seqs=256``.

What vLLM's scheduler holds is recorded by wrapping ``Scheduler.schedule``
(running + waiting, and running alone, at every step), so "every miss is in
the engine at once" is measured, not assumed; the outputs are compared with a
plain ``LLM.chat`` over the same batch on the same engine. One engine serves
the module (vLLM on CPU runs in-process, where an engine is closed only at
module teardown).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import EngineRequest, Generation, Refusal
from inference.backends.vllm.backend import VLLMBackend, create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.backends.vllm.outputs import generation
from inference.cache.model import CachedModel
from inference.cache.rows import engine_request
from inference.requests import CompletionRequest, Response
from store.descriptor import ModelDescriptor
from store.errors import BackendError, JudgestoreError
from store.store import Database, Store
from store.tables.records import CompletionRecord
from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV, run_fresh_python

pytestmark = pytest.mark.engine

WIDE_ENGINE_KWARGS = {**TINY_ENGINE_KWARGS, "max_num_seqs": 256}  # execution-only: the same descriptor
GREEDY: dict[str, object] = {"temperature": 0, "max_tokens": 6, "logprobs": 3}
SEEDED: dict[str, object] = {"temperature": 1.0, "max_tokens": 6, "seed": 77}


def describe(model_dir: Path, sampling: Mapping[str, object]) -> ModelDescriptor:
    return descriptor_from_vllm(str(model_dir), engine_kwargs=TINY_ENGINE_KWARGS, sampling=sampling)


def prompts(n: int, start: int = 0, samples: int = 1) -> list[CompletionRequest]:
    return [
        CompletionRequest(
            messages=[{"role": "user", "content": f"Prompt {i}: say something about {i % 7}."}], n=samples
        )
        for i in range(start, start + n)
    ]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, vllm_env: None) -> Iterator[VLLMBackend]:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed")
    descriptor = describe(tiny_model_dir, GREEDY)
    with create_vllm_backend(descriptor, WIDE_ENGINE_KWARGS, model=str(tiny_model_dir)) as backend:
        yield backend


def test_a_signal_while_the_engines_libraries_load_is_held_until_they_are_and_no_engine_starts(
    tiny_model_dir: Path, vllm_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A signal inside torch's first import (the chat template's check pulls it in) aborted the process from C++:
    SIGABRT, a core dump, where a scheduler's SIGTERM meant a clean stop (was)."""
    import inference.backends.vllm.backend as backend_module

    real = backend_module.effective_chat_template

    def loading(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C lands while torch initialises
        return real(*args, **kwargs)

    monkeypatch.setattr(backend_module, "effective_chat_template", loading)
    started: list[int] = []
    monkeypatch.setattr(backend_module, "check_engine_arguments", lambda *args: started.append(1))
    with pytest.raises(KeyboardInterrupt):
        create_vllm_backend(describe(tiny_model_dir, GREEDY), WIDE_ENGINE_KWARGS, model=str(tiny_model_dir))
    assert "stopping once the engine's libraries are loaded" in capsys.readouterr().err
    assert started == []  # stopped once they were: the engine was never set up


def cached(store: Store | None, engine: VLLMBackend, descriptor: ModelDescriptor, **kw: Any) -> CachedModel:
    mode = kw.pop("mode", "use" if store is not None else "off")
    return CachedModel(
        store, descriptor, task="stream", backend_factory=lambda: engine.with_descriptor(descriptor), mode=mode, **kw
    )


@dataclass
class SchedulerPeaks:
    """The most requests vLLM's scheduler held (running + waiting) and ran at once, over the steps it scheduled."""

    held: int = 0
    running: int = 0
    steps: int = 0


@pytest.fixture
def peaks(monkeypatch: pytest.MonkeyPatch) -> SchedulerPeaks:
    from vllm.v1.core.sched.scheduler import Scheduler

    seen = SchedulerPeaks()
    schedule = Scheduler.schedule

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.held = max(seen.held, len(self.running) + len(self.waiting))
        output = schedule(self, *args, **kwargs)
        seen.running = max(seen.running, len(self.running))
        seen.steps += 1
        return output

    monkeypatch.setattr(Scheduler, "schedule", recording)
    return seen


def plain_chat(engine: VLLMBackend, model: CachedModel, requests: list[CompletionRequest]) -> dict[str, Generation]:
    """``LLM.chat`` over the misses of ``requests``, in the order the cache sends them: Generations by input hash."""
    missing = model.plan("completions", requests).missing
    view = model._prepared_backend()
    assert isinstance(view, VLLMBackend)
    outputs = engine._llm.chat(
        [engine_request(inp).rendered["messages"] for inp in missing],
        [view._sampling_params(inp.sample_index) for inp in missing],
        use_tqdm=False,
    )
    return {inp.key: generation(output, view.descriptor) for inp, output in zip(missing, outputs, strict=True)}


def test_every_miss_is_in_the_scheduler_at_once_and_rows_are_written_as_they_finish(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, peaks: SchedulerPeaks
) -> None:
    descriptor = describe(tiny_model_dir, GREEDY)
    requests = prompts(256)
    reference = plain_chat(engine, cached(None, engine, descriptor), requests)
    plain = SchedulerPeaks(peaks.held, peaks.running, peaks.steps)
    assert plain.held == 256  # what a plain LLM.chat over the batch gives the engine
    peaks.held = peaks.running = peaks.steps = 0

    model = cached(store, engine, descriptor)  # chunk_size 64: the write interval, not the engine's batch
    database = store.database("completions", "stream", descriptor)
    rows_at_progress: list[tuple[int, int]] = []
    responses = model.complete(requests, on_progress=lambda done, _: rows_at_progress.append((done, database.count())))
    assert peaks.held == min(256, WIDE_ENGINE_KWARGS["max_num_seqs"]) == 256  # before: 64, one chunk at a time
    assert peaks.running == plain.running > 64  # as many decode at once as under a plain LLM.chat
    assert model.last.generated == model.last.written == database.count() == 256
    assert rows_at_progress[-1] == (256, 256)
    assert len(rows_at_progress) >= 4 and all(done == rows for done, rows in rows_at_progress)  # written as they came
    assert by_key(responses) == expected(reference)  # the outputs of the plain LLM.chat, logprobs included


def by_key(responses: list[Response]) -> dict[str, tuple[Any, ...]]:
    return {
        s.input_hash: (s.text, s.finish_reason, (s.usage or {}).get("completion_tokens"), s.top_logprobs)
        for r in responses
        for s in r.samples
    }


def expected(reference: dict[str, Generation]) -> dict[str, tuple[Any, ...]]:
    return {
        key: (g.text, g.finish_reason, g.usage["completion_tokens"], g.top_logprobs) for key, g in reference.items()
    }


def test_seeded_samples_equal_a_plain_llm_chat_and_the_stored_rows_equal_the_answers(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, SEEDED)
    # 120 misses (sample k has seed 77 + k), whose prompts fit one step's token budget (4,096): vLLM 0.32 on CPU
    # cannot sample a seeded request whose prompt is prefilled over two steps (its CPU generator has no offset).
    requests = prompts(60, start=1000, samples=2)
    reference = plain_chat(engine, cached(None, engine, descriptor), requests)
    model = cached(store, engine, descriptor, chunk_size=50)
    responses = model.complete(requests)
    assert len(reference) == 120 and by_key(responses) == expected(reference)
    assert len({r.samples[0].text for r in responses}) > 1  # seeds differ: not one answer for all
    rows = {row.input_hash: row for row in store.database("completions", "stream", descriptor).query()}
    assert {key: (row.completion, row.finish_reason) for key, row in rows.items()} == {
        key: (g.text, g.finish_reason) for key, g in reference.items()
    }


class Chunked:
    """The engine without streaming: the cache sends it ``chunk_size`` requests at a time, as before."""

    def __init__(self, view: VLLMBackend) -> None:
        self.view = view

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        return self.view.generate(requests)

    def close(self) -> None:
        pass


def test_a_cold_run_equals_the_chunked_path_greedy(store: Store, engine: VLLMBackend, tiny_model_dir: Path) -> None:
    descriptor = describe(tiny_model_dir, GREEDY)
    requests = prompts(130, start=2000)
    chunked = CachedModel(
        None, descriptor, task="stream", mode="off", chunk_size=64,
        backend_factory=lambda: Chunked(engine.with_descriptor(descriptor)),
    )  # fmt: skip
    streamed = cached(store, engine, descriptor).complete(requests)
    assert by_key(streamed) == by_key(chunked.complete(requests))


def test_ctrl_c_stops_the_engine_writes_what_finished_and_says_so(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    requests = prompts(300, start=3000)  # 256 run at once; 44 wait for room
    llm_engine = engine._llm.llm_engine
    step = llm_engine.step
    finished = 0

    def interrupted_step() -> list[Any]:
        nonlocal finished
        if finished:  # Ctrl-C once some requests have finished
            raise KeyboardInterrupt
        outputs = step()
        finished += sum(o.finished for o in outputs)
        return outputs

    monkeypatch.setattr(llm_engine, "step", interrupted_step)
    model = cached(store, engine, descriptor)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(requests)
    monkeypatch.undo()
    database = store.database("completions", "stream", descriptor)
    assert 0 < finished < 300 and database.count() == model.last.written == finished  # what finished was written
    assert f"this call stored {finished} rows" in "\n".join(raised.value.__notes__)
    assert not llm_engine.has_unfinished_requests()  # the rest was aborted: the engine is free

    rerun = cached(store, engine, descriptor)
    responses = rerun.complete(requests)
    assert rerun.last.plan is not None and rerun.last.plan.misses == 300 - finished == rerun.last.written
    assert database.count() == 300 and sum(r.cached for r in responses) == finished


def test_ctrl_c_during_a_write_keeps_what_the_engines_step_had_finished(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the step's finished outputs not yet handed over when Ctrl-C met the write were aborted and lost."""
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    requests = prompts(40, start=9000)
    llm_engine = engine._llm.llm_engine
    step = llm_engine.step
    finished: list[int] = []

    def counted_step() -> list[Any]:
        outputs = step()
        finished.append(sum(o.finished for o in outputs))
        return outputs

    database = store.database("completions", "stream", descriptor)
    kind = type(database)
    put_many = kind.put_many

    def interrupted(self: Database, records: Any, policy: Any = "ignore") -> int:
        monkeypatch.setattr(kind, "put_many", put_many)  # Ctrl-C in the first write; the redone one writes
        raise KeyboardInterrupt

    monkeypatch.setattr(llm_engine, "step", counted_step)
    monkeypatch.setattr(kind, "put_many", interrupted)
    model = cached(store, engine, descriptor, chunk_size=4)
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(requests)
    monkeypatch.undo()
    done = sum(finished)
    assert done > 4 and database.count() == model.last.written == done  # the whole step, not the first 4 of it
    assert f"this call stored {done} rows" in "\n".join(raised.value.__notes__)
    assert not llm_engine.has_unfinished_requests()


def test_a_bounded_call_streams_each_group_and_ctrl_c_keeps_what_finished(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM cannot bound a stream from outside: a call's max_concurrency gives it groups, each one stream."""
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    requests = prompts(300, start=6000)  # one group of 300: 256 run at once, 44 wait for room
    llm_engine = engine._llm.llm_engine
    step = llm_engine.step
    finished = 0

    def interrupted_step() -> list[Any]:
        nonlocal finished
        if finished:  # Ctrl-C once some requests of the group have finished
            raise KeyboardInterrupt
        outputs = step()
        finished += sum(o.finished for o in outputs)
        return outputs

    monkeypatch.setattr(llm_engine, "step", interrupted_step)
    model = cached(store, engine, descriptor, chunk_size=1000)  # the group is the bound, not the write interval
    with pytest.raises(KeyboardInterrupt) as raised:
        model.complete(requests, max_concurrency=300)
    monkeypatch.undo()
    database = store.database("completions", "stream", descriptor)
    assert 0 < finished < 300 and database.count() == model.last.written == finished  # what finished was written
    assert f"this call stored {finished} rows" in "\n".join(raised.value.__notes__)
    assert not llm_engine.has_unfinished_requests()


def test_a_call_from_inside_a_calls_on_progress_is_a_typed_error_not_a_hang(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """The stream holds the engine while its rows are written: a nested call in that thread would wait for itself."""
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    model = cached(store, engine, descriptor, chunk_size=1)
    nested: list[BaseException] = []
    outcome: list[BaseException | None] = []

    def on_progress(done: int, total: int) -> None:
        if not nested:
            try:
                model.complete(prompts(1, start=7100))
            except JudgestoreError as e:
                nested.append(e)
                raise

    def call(bound: int | None) -> None:
        try:
            model.complete(prompts(4, start=7000 + 10 * (bound or 0)), on_progress=on_progress, max_concurrency=bound)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    database = store.database("completions", "stream", descriptor)
    for bound in (None, 2):
        nested.clear()
        before = database.count()
        thread = threading.Thread(target=call, args=(bound,), daemon=True)
        thread.start()
        thread.join(timeout=240)  # a deadlock detector, not a speed check: the call ends either way
        assert not thread.is_alive(), "the nested call waited for the engine its own thread holds"
        assert len(nested) == 1 and outcome[-1] is nested[0] and "on_progress" in str(nested[0])
        assert database.count() > before  # what the outer call finished before is kept
    assert not engine._llm.llm_engine.has_unfinished_requests()


def test_a_stream_ended_in_another_thread_leaves_the_thread_that_started_it_free_to_call(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """The mark "this thread's stream holds the engine" is cleared by whichever thread ends the stream: a stream
    started here and iterated (or closed) in a worker must not leave every later call of this thread refused."""
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    view = engine.with_descriptor(descriptor)
    model = cached(store, engine, descriptor)
    for k, finish in enumerate((list, lambda stream: stream.close())):
        requests = [engine_request(inp) for inp in model.plan("completions", prompts(3, start=7200 + 10 * k)).missing]
        stream = view.generate_stream(requests)
        worker = threading.Thread(target=finish, args=(stream,))
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive()
        assert len(model.complete(prompts(2, start=7300 + 10 * k))) == 2  # not "held by a call in this thread"
    assert not engine._llm.llm_engine.has_unfinished_requests()


def test_concurrent_calls_on_views_of_one_engine_take_it_in_turn(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptors = [describe(tiny_model_dir, {"temperature": 0, "max_tokens": 5 + k}) for k in range(3)]
    batches = [prompts(40, start=4000 + 100 * k) for k in range(3)]
    alone = [cached(None, engine, d).complete(b) for d, b in zip(descriptors, batches, strict=True)]
    results: list[Any] = [None] * 3
    for descriptor in descriptors:  # created before the threads: two first opens of one file at once race
        store.database("completions", "stream", descriptor)

    def call(k: int) -> None:
        results[k] = cached(store, engine, descriptors[k]).complete(batches[k])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert [by_key(r) for r in results] == [by_key(r) for r in alone]


def test_a_miss_another_job_stored_meanwhile_is_answered_with_the_stored_row(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """The row stored first is the answer of record: a call whose write was ignored returns it, as a rerun does."""
    descriptor = describe(tiny_model_dir, GREEDY)
    requests = prompts(6, start=4500)
    database = store.database("completions", "stream", descriptor)

    def another_job_writes(plan: Any) -> None:  # after this call's lookup, before its generation is written
        database.put_many([
            CompletionRecord(input_hash=inp.key, sample_index=inp.sample_index, input_text=inp.rendered.decode(),
                             completion=f"stored by another job {i}", finish_reason="stop", model="other",
                             created_at=datetime.now(UTC))
            for i, inp in enumerate(plan.missing[:4])
        ])  # fmt: skip

    model = cached(store, engine, descriptor)
    first = model.complete(requests, on_plan=another_job_writes)
    texts = [r.samples[0].text for r in first]
    assert texts[:4] == [f"stored by another job {i}" for i in range(4)]  # before: this call's own generations
    assert not any(t.startswith("stored by") for t in texts[4:]) and model.last.written == 2
    assert not any(s.cached for r in first for s in r.samples)
    again = cached(store, engine, descriptor).complete(requests)
    assert [r.samples[0].text for r in again] == texts and all(r.samples[0].cached for r in again)


def test_concurrent_calls_of_one_prompt_at_temperature_1_all_return_the_stored_sample(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """Calls that planned the same miss at once: whichever wrote first, every call returns that row (a rerun's
    answer), not a sample nothing kept."""
    descriptor = describe(tiny_model_dir, {"temperature": 1.0, "max_tokens": 8})
    model = cached(store, engine, descriptor)
    store.database("completions", "stream", descriptor)  # created before the threads (see above)
    results: list[str] = []

    def call() -> None:
        results.append(model.complete(prompts(1, start=4600))[0].samples[0].text)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    (stored,) = store.database("completions", "stream", descriptor).query()
    assert results == [stored.completion] * 4
    assert model.complete(prompts(1, start=4600))[0].samples[0].text == stored.completion


def test_vllms_cpu_failure_on_a_seeded_chunked_prefill_is_a_typed_error_naming_the_setting(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_engine = engine._llm.llm_engine

    def failing_step() -> list[Any]:  # what vLLM 0.32's CPU runner raises (see the seeded test above)
        raise RuntimeError("CPU Generator does not use offset")

    monkeypatch.setattr(llm_engine, "step", failing_step)
    model = cached(store, engine, describe(tiny_model_dir, SEEDED))
    with pytest.raises(BackendError, match="max_num_batched_tokens=<max_num_seqs x max_model_len>"):
        model.complete(prompts(3, start=5000))
    monkeypatch.undo()
    assert not llm_engine.has_unfinished_requests() and model.last.written == 0


def test_an_engine_failure_mid_batch_is_typed_and_says_what_was_kept(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    llm_engine = engine._llm.llm_engine
    step = llm_engine.step
    finished = 0

    def failing_step() -> list[Any]:
        nonlocal finished
        if finished:  # the device fails once some requests have finished
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        outputs = step()
        finished += sum(o.finished for o in outputs)
        return outputs

    monkeypatch.setattr(llm_engine, "step", failing_step)
    model = cached(store, engine, descriptor)
    with pytest.raises(BackendError, match="vLLM failed while generating: RuntimeError: CUDA error") as raised:
        model.complete(prompts(300, start=6000))
    monkeypatch.undo()
    database = store.database("completions", "stream", descriptor)
    assert 0 < finished < 300 and database.count() == raised.value.rows_kept == finished
    assert f"This call stored {finished} rows before the failure" in "\n".join(raised.value.__notes__)
    assert not llm_engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        # was, in both: "they are kept, and running it again in mode use generates only the rest"
        ("refresh", "inputs of this refresh still hold their old rows, if they had any (mode use would return "
                    "those): run it again with --mode refresh"),
        ("readonly", "this mode writes no rows, so the {generated} generated are not kept"),
    ],
)  # fmt: skip
def test_an_engine_failure_says_what_its_mode_left_and_how_to_finish(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mode: str, says: str
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    requests = prompts(300, start=6500)
    if mode == "refresh":  # every input stored: what a refresh regenerates (in readonly, misses are generated)
        cached(store, engine, descriptor).complete(requests)
    llm_engine = engine._llm.llm_engine
    step, finished = llm_engine.step, 0

    def failing_step() -> list[Any]:
        nonlocal finished
        if finished:  # once some requests have finished (a step finishes many together)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        outputs = step()
        finished += sum(o.finished for o in outputs)
        return outputs

    monkeypatch.setattr(llm_engine, "step", failing_step)
    with pytest.raises(BackendError) as raised:
        cached(store, engine, descriptor, mode=mode).complete(requests)
    monkeypatch.undo()
    notes = " ".join(" ".join(raised.value.__notes__).split())
    assert says.format(generated=finished) in notes, notes
    if mode == "refresh":
        assert f"the other {300 - finished} inputs" in notes and raised.value.rows_kept == finished
    else:
        assert raised.value.rows_kept == 0 and "mode use" not in notes


def test_the_stream_beats_between_the_requests_it_finishes(engine: VLLMBackend, tiny_model_dir: Path) -> None:
    view = engine.with_descriptor(describe(tiny_model_dir, {"temperature": 0, "max_tokens": 5}))
    requests = [engine_request(inp) for inp in cached(None, engine, view.descriptor).plan(
        "completions", prompts(6, start=7000)).missing]  # fmt: skip
    arrivals = list(view.generate_stream(requests))
    finished = [a[0] for a in arrivals if a is not None]
    assert sorted(finished) == list(range(6))
    # A heartbeat after every step (five decode steps at least), so a caller writes on time between finishes.
    assert arrivals.count(None) >= 5 and arrivals[-1] is None


def test_closing_the_model_under_a_running_call_stops_it_at_a_step_and_keeps_what_finished(
    tiny_model_dir: Path,
) -> None:
    """In a process of its own: closing an engine here would break the module's (vLLM's state is per process)."""
    code = f"""
import json, tempfile, threading
from pathlib import Path
from inference.backends.vllm.backend import create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.cache.model import CachedModel
from inference.requests import CompletionRequest
from store.errors import BackendError, JudgestoreError
from store.store import Database, Store
from store.settings import Settings
from tests.inference.conftest import TINY_ENGINE_KWARGS

model_dir = {str(tiny_model_dir)!r}
descriptor = descriptor_from_vllm(model_dir, engine_kwargs=TINY_ENGINE_KWARGS, sampling={{"temperature": 0,
                                  "max_tokens": 200, "ignore_eos": True}})
store = Store(Settings(), root=Path(tempfile.mkdtemp()))
model = CachedModel(store, descriptor, task="t", chunk_size=1, backend_factory=lambda: create_vllm_backend(
    descriptor, TINY_ENGINE_KWARGS, model=model_dir))
some_finished = threading.Event()
outcome = {{}}

def call():
    try:
        model.complete([CompletionRequest(messages=[{{"role": "user", "content": f"q {{i}}"}}])
                        for i in range(40)], on_progress=lambda done, total: some_finished.set())
        outcome["error"] = None
    except BackendError as e:
        outcome["error"] = str(e)
        outcome["rows_kept"] = e.rows_kept

worker = threading.Thread(target=call)
worker.start()
some_finished.wait(120)
model.close()  # from another thread, while the call steps the engine
worker.join(120)
outcome["alive"] = worker.is_alive()
outcome["rows"] = store.database("completions", "t", descriptor).count()
print(json.dumps(outcome))
"""
    result = json.loads(run_fresh_python(code, **VLLM_ENV).stdout.strip().splitlines()[-1])
    assert not result["alive"] and result["error"] is not None and "was closed while this call" in result["error"]
    assert 0 < result["rows"] == result["rows_kept"] < 40


def test_closing_the_model_from_its_calls_own_on_progress_does_not_wait_for_itself(tiny_model_dir: Path) -> None:
    """on_progress runs while its stream holds the engine: a close from there cannot wait for that stream to stop.

    In a process of its own (closing an engine here would break the module's), with the close's wait for a
    stream made longer than the deadlock detector's, so a close that waits for its own stream is caught."""
    code = f"""
import json, os, tempfile, threading
from pathlib import Path
from inference.backends.vllm import backend as vllm_backend
from inference.backends.vllm.backend import create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.cache.model import CachedModel
from inference.requests import CompletionRequest
from store.errors import BackendError
from store.store import Database, Store
from store.settings import Settings
from tests.inference.conftest import TINY_ENGINE_KWARGS

vllm_backend._CLOSE_WAIT_S = 3600.0
model_dir = {str(tiny_model_dir)!r}
descriptor = descriptor_from_vllm(model_dir, engine_kwargs=TINY_ENGINE_KWARGS, sampling={{"temperature": 0,
                                  "max_tokens": 40, "ignore_eos": True}})
store = Store(Settings(), root=Path(tempfile.mkdtemp()))
model = CachedModel(store, descriptor, task="t", chunk_size=1, backend_factory=lambda: create_vllm_backend(
    descriptor, TINY_ENGINE_KWARGS, model=model_dir))
outcome = {{}}

def call():
    try:
        model.complete([CompletionRequest(messages=[{{"role": "user", "content": f"q {{i}}"}}]) for i in range(20)],
                       on_progress=lambda done, total: model.close())
        outcome["error"] = None
    except BackendError as e:
        outcome["error"] = str(e)
        outcome["rows_kept"] = e.rows_kept

worker = threading.Thread(target=call, daemon=True)
worker.start()
worker.join(90)  # a deadlock detector, not a speed check (run_fresh_python gives up at 120 s)
outcome["alive"] = worker.is_alive()
if not outcome["alive"]:
    outcome["rows"] = store.database("completions", "t", descriptor).count()
print(json.dumps(outcome), flush=True)
os._exit(0)
"""
    result = json.loads(run_fresh_python(code, **VLLM_ENV).stdout.strip().splitlines()[-1])
    assert not result["alive"], "close() from on_progress waited for the stream its own thread holds"
    assert result["error"] is not None and "was closed while this call" in result["error"]
    assert 0 < result["rows"] == result["rows_kept"] < 20
