"""vLLM's default layout: the engine core in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``).

The other engine tests run the core in the test process (faster to build,
and its scheduler can be watched); a user's run, on a GPU or not, gets a
core process unless they say otherwise. There the engine computes while the
calling process plans, creates the database and writes, and an abort has to
reach the other process. One engine serves the module (about 13 s to build
here, against 7 s in-process).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.backends.vllm.backend import VLLMBackend, create_vllm_backend
from inference.cache.model import CachedModel
from store.store import Store
from tests.inference.test_engine_stream import (
    GREEDY,
    WIDE_ENGINE_KWARGS,
    by_key,
    cached,
    describe,
    expected,
    plain_chat,
    prompts,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, vllm_env: None) -> Iterator[VLLMBackend]:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed")
    descriptor = describe(tiny_model_dir, GREEDY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # read when the engine is built
        backend = create_vllm_backend(descriptor, WIDE_ENGINE_KWARGS, model=str(tiny_model_dir))
    with backend:
        from vllm.v1.engine.core_client import SyncMPClient

        assert isinstance(backend._llm.llm_engine.engine_core, SyncMPClient)  # the core is not in this process
        yield backend


def test_a_cold_call_returns_what_the_engine_gives_and_a_second_never_reaches_it(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, GREEDY)
    requests = prompts(300)  # more than max_num_seqs: some wait in the core process's scheduler
    reference = plain_chat(engine, cached(None, engine, descriptor), requests)

    model = cached(store, engine, descriptor)
    responses = model.complete(requests)
    database = store.database("completions", "stream", descriptor)
    assert model.last.generated == model.last.written == database.count() == 300
    assert by_key(responses) == expected(reference)  # logprobs included

    def no_engine() -> VLLMBackend:
        raise AssertionError("a full hit prepared the engine")

    again = CachedModel(store, descriptor, task="stream", backend_factory=no_engine)
    assert by_key(again.complete(requests)) == by_key(responses) and again.last.generated == 0


def test_ctrl_c_aborts_what_the_core_process_still_runs_and_keeps_what_finished(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 8})
    requests = prompts(300, start=5000)
    kept: list[int] = []

    def interrupted(done: int, _total: int) -> None:
        kept.append(done)
        raise KeyboardInterrupt  # Ctrl-C once the first rows are written

    model = cached(store, engine, descriptor, chunk_size=16)
    with pytest.raises(KeyboardInterrupt):
        model.complete(requests, on_progress=interrupted)
    written = model.last.written
    database = store.database("completions", "stream", descriptor)
    assert 16 <= kept[0] <= written < 300 and database.count() == written
    assert not engine._llm.llm_engine.has_unfinished_requests()  # the abort reached the core: the engine is free

    rerun = cached(store, engine, descriptor)
    responses = rerun.complete(requests)
    assert rerun.last.written == 300 - written and database.count() == 300
    assert sum(r.cached for r in responses) == written
