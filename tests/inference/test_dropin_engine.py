"""The drop-in entry points on the real vLLM engine with the tiny model: CachedChatModel, async calls, do_inference.

One engine serves the module (building one costs about 10 s on CPU). Each
spec here is a real :class:`~inference.spec.ModelSpec` of the tiny model
whose ``backend()`` hands out a view of that engine and counts how often it
is asked, so "the second batch never loads vLLM" is counted, not assumed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from inference import CompletionRequest, ModelSpec
from inference.backends.base import Backend
from inference.backends.vllm.backend import VLLMBackend, create_vllm_backend
from inference.compat import do_inference, prepare_model
from inference.langchain import CachedChatModel
from store import Store
from tests.inference.conftest import TINY_ENGINE_KWARGS

pytestmark = pytest.mark.engine

SAMPLING = {"temperature": 0, "max_tokens": 6, "logprobs": 5}


@dataclass(frozen=True)
class OnTheModuleEngine(ModelSpec):
    """The tiny model's spec; its backend is a view of the module's engine, and each one asked for is counted."""

    engine: Any = field(default=None, compare=False, repr=False)
    prepared: list[threading.Thread] = field(default_factory=list, compare=False, repr=False)

    def backend(self) -> Backend:
        self.prepared.append(threading.current_thread())
        engine: VLLMBackend = self.engine
        return engine.with_descriptor(self.descriptor)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, vllm_env: None) -> Iterator[VLLMBackend]:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed")
    spec = ModelSpec(model=str(tiny_model_dir), engine_kwargs=TINY_ENGINE_KWARGS, sampling=SAMPLING)
    with create_vllm_backend(spec.descriptor, TINY_ENGINE_KWARGS, model=str(tiny_model_dir)) as backend:
        yield backend


@pytest.fixture
def spec(engine: VLLMBackend, tiny_model_dir: Path) -> OnTheModuleEngine:
    return tiny(engine, tiny_model_dir)


def tiny(engine: VLLMBackend, model_dir: Path, **sampling: Any) -> OnTheModuleEngine:
    return OnTheModuleEngine(
        model=str(model_dir),
        label="tiny",
        engine_kwargs=TINY_ENGINE_KWARGS,
        sampling={**SAMPLING, **sampling},
        engine=engine,
    )


HISTORY = [
    SystemMessage("You are brief."),
    HumanMessage("Name a colour."),
    AIMessage("Blue."),
    HumanMessage("Another?"),
]
SAME_HISTORY = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


def test_a_second_langchain_batch_is_all_hits_and_never_loads_the_engine(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    inputs: list[Any] = ["Why is the sky blue?", "Bake bread.", HISTORY]
    first_spec = tiny(engine, tiny_model_dir)
    with CachedChatModel(spec=first_spec, store=store, task="drop-in") as chat:
        answers = chat.batch(inputs)
    assert len(first_spec.prepared) == 1  # three misses, one engine call
    assert not any(a.response_metadata["judgestore"]["cached"] for a in answers)
    second_spec = tiny(engine, tiny_model_dir)
    with CachedChatModel(spec=second_spec, store=store, task="drop-in") as again:
        hits = again.batch(inputs)
    assert second_spec.prepared == []  # the engine was never asked for
    assert [h.content for h in hits] == [a.content for a in answers]
    assert all(h.response_metadata["judgestore"]["cached"] for h in hits)
    top = hits[0].response_metadata["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == 5 and all(isinstance(t["logprob"], float) for t in top)


def test_a_langchain_history_hits_the_row_of_the_same_completion_request(store: Store, spec: OnTheModuleEngine) -> None:
    with spec.cached(store, task="drop-in") as model:
        (response,) = model.complete([CompletionRequest(messages=SAME_HISTORY)])
    with CachedChatModel(spec=spec, store=store, task="drop-in") as chat:
        message = chat.invoke(HISTORY)
    assert message.response_metadata["judgestore"]["cached"]
    assert message.response_metadata["judgestore"]["input_hash"] == response.samples[0].input_hash
    assert message.content == response.text and len(spec.prepared) == 1


def test_async_calls_run_the_engine_in_worker_threads_with_the_same_answers(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    batches = [
        [CompletionRequest(messages=[{"role": "user", "content": f"Question {k}.{i}?"}]) for i in range(3)]
        for k in range(2)
    ]
    sync_spec = tiny(engine, tiny_model_dir)
    with Store(root=tmp_path / "sync") as other, sync_spec.cached(other, task="drop-in") as model:
        expected = [[r.text for r in model.complete(batch)] for batch in batches]
    async_spec = tiny(engine, tiny_model_dir)

    async def main() -> list[Any]:
        async with async_spec.cached(store, task="drop-in") as model:
            return await asyncio.gather(*(model.acomplete(batch) for batch in batches))

    results = asyncio.run(main())
    assert [[r.text for r in responses] for responses in results] == expected
    assert [responses.run.generated for responses in results] == [3, 3]  # each call's own summary
    assert len(async_spec.prepared) == 1 and async_spec.prepared[0] is not threading.main_thread()

    with CachedChatModel(spec=async_spec, store=store, task="drop-in") as chat:
        hits = asyncio.run(chat.abatch([b.messages[0]["content"] for b in batches[0]]))  # type: ignore[index]
    assert [h.content for h in hits] == expected[0] and all(h.response_metadata["judgestore"]["cached"] for h in hits)


def test_do_inference_judges_with_first_token_logprobs_and_reruns_from_the_store(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    prompts = [f"Answer A: {a}\nAnswer B: {b}\nWhich is better, A or B?" for a, b in (("red", "blue"), ("cat", "dog"))]
    metadata = [{"instruction_id": str(i), "model_a": "x", "model_b": "y", "orientation": "direct"} for i in range(2)]
    with prepare_model(tiny(engine, tiny_model_dir), task="drop-in", role="judgements", store=store) as judge:
        fresh = do_inference(judge, prompts, return_top_logprobs=True, cache_metadata=metadata)
        assert judge.engine_loaded
    rerun_spec = tiny(engine, tiny_model_dir)
    with prepare_model(rerun_spec, task="drop-in", role="judgements", store=store) as judge:
        stored = do_inference(judge, list(reversed(prompts)), return_top_logprobs=True, cache_metadata=metadata)
    assert rerun_spec.prepared == [] and [r.cached for r in stored] == [True, True]
    assert [r.text for r in stored] == [r.text for r in reversed(fresh)]  # the caller's order
    for result in fresh:
        logprobs = result.first_token_top_logprobs
        assert logprobs is not None and 1 <= len(logprobs) <= 5
        assert all(isinstance(t, str) and isinstance(lp, float) and lp <= 0 for t, lp in logprobs.items())
    assert [r.first_token_top_logprobs for r in stored] == [r.first_token_top_logprobs for r in reversed(fresh)]


def test_do_inference_gives_vllms_own_first_token_dict_when_it_samples(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """At temperature 1 the sampled token often ranks below the two asked for: vLLM's dict holds it, and so must
    first_token_top_logprobs (it was left out, so a parser read the sampled verdict as probability 0)."""
    from vllm import SamplingParams

    prompts = [f"Question {i}: which is better, A or B?" for i in range(12)]
    sampling = {"temperature": 1.0, "max_tokens": 4, "logprobs": 2, "seed": 7}
    metadata = [{"instruction_id": str(i)} for i in range(len(prompts))]
    with prepare_model(tiny(engine, tiny_model_dir, **sampling), task="sampled", store=store) as model:
        ours = do_inference(model, prompts, return_top_logprobs=True, cache_metadata=metadata)
    plain = engine._llm.chat([[{"role": "user", "content": p}] for p in prompts], SamplingParams(**sampling))
    theirs = [{lp.decoded_token: lp.logprob for lp in out.outputs[0].logprobs[0].values()} for out in plain]
    assert [r.text for r in ours] == [out.outputs[0].text for out in plain]
    assert [r.first_token_top_logprobs for r in ours] == theirs
    assert any(len(dict_) == 3 for dict_ in theirs)  # a sampled token outside the top 2 is among them


def test_repeats_at_a_random_sampling_are_independent_samples_and_come_back_from_the_store(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """vLLM samples each repeat on its own; judgestore copied one answer to every repeat (was)."""
    prompts, metadata = ["Vote: A or B?"] * 4, [{"instruction_id": "v"}] * 4
    with prepare_model(tiny(engine, tiny_model_dir, temperature=1.0, max_tokens=8), task="votes", store=store) as m:
        votes = do_inference(m, prompts, cache_metadata=metadata)
        again = do_inference(m, prompts, cache_metadata=metadata)
    assert len(set(votes)) == 4  # 8 tokens sampled from 512 at temperature 1: four samples, four answers
    assert again == votes and again.run.plan is not None and again.run.plan.hits == 4
