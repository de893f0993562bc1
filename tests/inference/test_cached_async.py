"""Async calls of the cache boundary, and each call's own summary, with a fake engine and the fake OpenAI server.

The real engine behind ``acomplete`` is shown in ``test_dropin_engine.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from inference import CachedModel, CompletionRequest, HostedSpec
from inference.backends.base import EngineRequest, Generation, Refusal
from inference.cache.model import Responses
from inference.run import run_requests
from store import Settings, Store
from store.descriptor import ModelDescriptor
from store.errors import RequestRefusedError, RequestsFailedError
from tests.fake_openai import FakeOpenAI


class SlowBackend:
    """Answers after ``seconds``, and records how many callers were inside ``generate`` at once."""

    def __init__(self, seconds: float = 0.2, refuse: str | None = None) -> None:
        self.seconds, self.refuse = seconds, refuse
        self.inside = self.most_inside = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        with self._lock:
            self.inside -= 1
        out: list[Generation | Refusal] = []
        for r in requests:
            content = r.rendered["messages"][-1]["content"]
            if content == self.refuse:
                out.append(Refusal(RequestRefusedError(f"refused {content!r}")))
            else:
                out.append(Generation(f"answer to {content}", "stop", {"prompt_tokens": 1, "completion_tokens": 2}))
        return out

    def close(self) -> None:
        pass


class Factory:
    def __init__(self, backend: SlowBackend, seconds: float = 0.0) -> None:
        self.backend, self.seconds, self.calls = backend, seconds, 0

    def __call__(self) -> SlowBackend:
        self.calls += 1
        time.sleep(self.seconds)  # a model load takes a while: concurrent calls must wait for this one
        return self.backend


def ask(i: int) -> CompletionRequest:
    return CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}], benchmark="b", instruction_id=str(i))


@pytest.fixture
def descriptor() -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0})


def test_each_call_returns_its_own_summary_and_last_is_the_latest(store: Store, descriptor: ModelDescriptor) -> None:
    model = CachedModel(store, descriptor, task="t", backend_factory=Factory(SlowBackend(0)))
    first = model.complete([ask(i) for i in range(3)])
    second = model.complete([ask(i) for i in range(5)])
    assert isinstance(first, Responses) and isinstance(first, list)
    assert first.run.plan is not None and (first.run.plan.misses, first.run.generated) == (3, 3)
    assert second.run.plan is not None and (second.run.plan.hits, second.run.plan.misses) == (3, 2)
    assert model.last is second.run and first.run is not second.run


def test_concurrent_async_calls_get_their_own_summaries_and_one_engine(
    store: Store, descriptor: ModelDescriptor
) -> None:
    backend = SlowBackend(0.2)
    factory = Factory(backend, seconds=0.3)
    model = CachedModel(store, descriptor, task="t", backend_factory=factory)

    async def main() -> list[Responses]:
        async with model:
            return await asyncio.gather(*(model.acomplete([ask(10 * k + i) for i in range(k + 1)]) for k in range(4)))

    results = asyncio.run(main())
    assert factory.calls == 1  # four calls met a miss at once; one engine was prepared
    assert backend.most_inside == 1  # a local engine took one chunk at a time
    for k, responses in enumerate(results):
        assert [r.text for r in responses] == [f"answer to q{10 * k + i}" for i in range(k + 1)]
        assert responses.run.plan is not None and responses.run.plan.misses == k + 1 == responses.run.written
    assert not model.engine_loaded  # `async with` closed it


def test_an_async_call_leaves_the_event_loop_free(store: Store, descriptor: ModelDescriptor) -> None:
    backend = SlowBackend(0.5)
    model = CachedModel(store, descriptor, task="t", backend_factory=Factory(backend))
    ticks: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    async def main() -> Responses:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        try:
            return await model.acomplete([ask(i) for i in range(3)])
        finally:
            stop.set()
            await task

    responses = asyncio.run(main())
    assert [r.text for r in responses] == ["answer to q0", "answer to q1", "answer to q2"]
    assert len(ticks) >= 10  # the loop ticked all through the half-second engine call
    assert threading.main_thread().name not in backend.threads


def test_a_failed_request_of_an_async_call_raises_with_every_response_and_its_summary(
    store: Store, descriptor: ModelDescriptor
) -> None:
    model = CachedModel(store, descriptor, task="t", backend_factory=Factory(SlowBackend(0, refuse="q1")))
    with pytest.raises(RequestsFailedError) as raised:
        asyncio.run(model.acomplete([ask(i) for i in range(3)]))
    responses = raised.value.responses
    assert isinstance(responses, Responses) and [r.error is None for r in responses] == [True, False, True]
    assert responses.run.written == 2 and len(responses.run.failed) == 1


# ------------------------------------------------------------------ hosted: the limit is the model's


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI() as server:
        yield server


def test_concurrent_async_calls_of_a_hosted_model_share_its_limit(store: Store, fake: FakeOpenAI) -> None:
    fake.delay = 0.1
    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url, max_concurrency=3)
    model = spec.cached(store, task="t")

    async def main() -> list[Responses]:
        async with model:
            return await asyncio.gather(*(model.acomplete([ask(10 * k + i) for i in range(6)]) for k in range(3)))

    results = asyncio.run(main())
    assert [r.text for r in results[2]] == [f"echo: q{20 + i}" for i in range(6)]
    assert len(fake.completions()) == 18
    assert fake.max_in_flight == 3  # three batches of six, never more than the model's three at once


def test_many_concurrent_single_calls_of_a_hosted_model_reach_its_limit_not_asyncios_pool(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each async call waited in a thread of asyncio's default pool (min(32, cores + 4): 6 here): gather of 64
    single calls had 6 requests in flight, whatever the model's max_concurrency (was)."""
    import concurrent.futures

    fake.delay = 0.5
    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url, max_concurrency=16)
    model = spec.cached(store, task="t")

    async def main() -> list[Responses]:
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        async with model:
            return await asyncio.gather(*(model.acomplete([ask(i)]) for i in range(32)))

    results = asyncio.run(main())
    assert [r.text for r in results[-1]] == ["echo: q31"]
    # Up to the model's limit (16 when every call has planned within the server's delay, which a loaded machine
    # may not), and past the 4 threads of the loop's default pool
    assert 4 < fake.max_in_flight <= 16


def test_an_async_call_in_a_forked_child_runs() -> None:
    """The child inherited judgestore's call pool without its threads: its async calls waited for ever (was)."""
    import os

    from inference.cache.model import in_call_thread

    assert asyncio.run(in_call_thread(lambda: "parent")) == "parent"  # the pool exists before the fork
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its call ran
        try:
            os._exit(0 if asyncio.run(asyncio.wait_for(in_call_thread(lambda: "child"), 10)) == "child" else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_hosted_models_limit_defaults_to_the_setting(
    store_root: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's settings' (was: the environment's only, so a Settings(max_concurrency=...) given to a store or
    to run_requests was ignored); those read from the environment, where none is given."""
    fake.delay = 0.1
    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url)
    with Store(Settings(max_concurrency=2), root=store_root) as store, spec.cached(store, task="t") as model:
        model.complete([ask(i) for i in range(6)])
    assert fake.max_in_flight == 2
    fake.max_in_flight = 0
    monkeypatch.setenv("JUDGESTORE_MAX_CONCURRENCY", "3")
    with Store(root=store_root) as store, spec.cached(store, task="t2") as model:
        model.complete([ask(i) for i in range(6)])
    assert fake.max_in_flight == 3
    fake.max_in_flight = 0
    with spec.cached(None, task="t3", mode="off") as model:  # no store: the environment's
        model.complete([ask(i) for i in range(6)])
    assert fake.max_in_flight == 3
    fake.max_in_flight = 0  # the settings a run is given, with or without a store
    run_requests(spec, [ask(i) for i in range(6)], role="completions", task="t4", mode="off",
                 settings=Settings(max_concurrency=2))  # fmt: skip
    assert fake.max_in_flight == 2
