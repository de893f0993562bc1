"""VLLMBackend on the real vLLM engine, with the tiny local model.

One engine is built for the module and shared through ``with_descriptor``
views (sampling and templates are per request); the determinism test builds a
second one. vLLM on CPU runs in-process, where closing an engine tears down
process-global state, so both are closed only at module teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.backend import EngineRequest, Generation
from inference.descriptors import descriptor_from_vllm
from inference.vllm_backend import VLLMBackend, create_vllm_backend
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, JudgestoreError
from tests.inference.conftest import TINY_ENGINE_KWARGS, run_fresh_python

GREEDY = {"temperature": 0, "max_tokens": 12}
QUESTIONS = ["What is the capital of France?", "Write a short poem about the sea."]


def chat(content: str, sample_index: int = 0) -> EngineRequest:
    return EngineRequest({"type": "messages", "messages": [{"role": "user", "content": content}]}, sample_index)


def text(prompt: str, sample_index: int = 0) -> EngineRequest:
    return EngineRequest({"type": "text", "text": prompt}, sample_index)


def describe(model_dir: Path, **kwargs: Any) -> ModelDescriptor:
    kwargs.setdefault("sampling", GREEDY)
    return descriptor_from_vllm(str(model_dir), engine_kwargs=TINY_ENGINE_KWARGS, **kwargs)


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path, vllm_env: None) -> Iterator[VLLMBackend]:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed (pip install judgestore[vllm])")
    with create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS) as b:
        yield b


@pytest.fixture(scope="module")
def rebuilt_backend(tiny_model_dir: Path, vllm_env: None, backend: VLLMBackend) -> Iterator[VLLMBackend]:
    """A second engine on the same model; depends on ``backend`` so it is closed first."""
    with create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS) as b:
        yield b


@pytest.mark.engine
def test_chat_generation(backend: VLLMBackend) -> None:
    first, second = backend.generate([chat(q) for q in QUESTIONS])
    assert first.text and second.text
    assert first.text != second.text  # the answer depends on the prompt
    for g in (first, second):
        assert g.finish_reason in ("stop", "length")
        assert g.usage["prompt_tokens"] > 0 and 0 < g.usage["completion_tokens"] <= 12
        assert g.top_logprobs is None  # not asked for


@pytest.mark.engine
def test_text_generation(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    texts = backend.with_descriptor(describe(tiny_model_dir, input_mode="text"))
    (g,) = texts.generate([text("Once upon a time")])
    assert g.text and g.usage["prompt_tokens"] > 0 and g.usage["completion_tokens"] > 0


@pytest.mark.engine
def test_greedy_is_deterministic_across_engine_builds(backend: VLLMBackend, rebuilt_backend: VLLMBackend) -> None:
    requests = [chat(q) for q in QUESTIONS]
    assert backend.generate(requests) == rebuilt_backend.generate(requests)


@pytest.mark.engine
def test_top_logprobs_of_the_first_token(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    with_logprobs = backend.with_descriptor(describe(tiny_model_dir, sampling={**GREEDY, "logprobs": 3}))
    (g,) = with_logprobs.generate([chat(QUESTIONS[0])])
    assert g.top_logprobs is not None and len(g.top_logprobs) == 3
    assert all(isinstance(token, str) and logprob <= 0 for token, logprob in g.top_logprobs.items())
    (plain,) = backend.generate([chat(QUESTIONS[0])])
    assert g.text == plain.text  # asking for logprobs changes nothing else


@pytest.mark.engine
def test_sampled_token_outside_the_top_n_is_not_reported(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    hot = backend.with_descriptor(
        describe(tiny_model_dir, sampling={"temperature": 2.0, "seed": 3, "max_tokens": 1, "logprobs": 1})
    )
    samples = hot.generate([chat(QUESTIONS[0], k) for k in range(6)])
    # At temperature 2 the sampled first token differs between samples, and vLLM
    # appends it when it is not the best; the top-1 entry is the same for all.
    assert len({g.text for g in samples}) > 1
    assert all(g.top_logprobs == samples[0].top_logprobs for g in samples)
    assert samples[0].top_logprobs is not None and len(samples[0].top_logprobs) == 1


@pytest.mark.engine
def test_short_max_tokens_finishes_by_length(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    short = backend.with_descriptor(
        describe(tiny_model_dir, sampling={"temperature": 0, "max_tokens": 2, "ignore_eos": True})
    )
    (g,) = short.generate([chat(QUESTIONS[1])])
    assert g.finish_reason == "length" and g.usage["completion_tokens"] == 2


@pytest.mark.engine
def test_seeded_samples_are_reproducible_one_by_one(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    sampled = backend.with_descriptor(
        describe(tiny_model_dir, sampling={"temperature": 1.0, "seed": 7, "max_tokens": 12})
    )
    together = sampled.generate([chat(QUESTIONS[0], 0), chat(QUESTIONS[0], 1), chat(QUESTIONS[0], 2)])
    assert together[0].text != together[1].text
    (alone,) = sampled.generate([chat(QUESTIONS[0], 1)])
    assert alone == together[1]  # sample 1 does not depend on how many samples were asked for


@pytest.mark.engine
def test_chat_template_and_its_kwargs_reach_the_template(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    template = "{% if enable_thinking %}Think first. {% endif %}{{ messages[-1]['content'] }}"
    plain = backend.with_descriptor(describe(tiny_model_dir, chat_template=template), chat_template=template)
    thinking = backend.with_descriptor(
        describe(tiny_model_dir, chat_template=template, enable_thinking=True), chat_template=template
    )
    (chatml,) = backend.generate([chat("Hello")])
    (bare,) = plain.generate([chat("Hello")])
    (think,) = thinking.generate([chat("Hello")])
    # ChatML wraps "Hello" in role markers; the bare template sends it alone; thinking adds words.
    assert bare.usage["prompt_tokens"] < chatml.usage["prompt_tokens"]
    assert think.usage["prompt_tokens"] > bare.usage["prompt_tokens"]


@pytest.mark.engine
def test_a_template_other_than_the_descriptors_is_refused(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    with pytest.raises(InvalidInputError, match="chat template"):
        backend.with_descriptor(describe(tiny_model_dir), chat_template="{{ messages[0]['content'] }}")


@pytest.mark.engine
def test_input_of_the_other_mode_is_refused(backend: VLLMBackend) -> None:
    with pytest.raises(InvalidInputError, match="input mode is 'chat'"):
        backend.generate([text("plain prompt")])
    assert backend.generate([]) == []


@pytest.mark.engine
def test_a_view_needs_the_same_engine(backend: VLLMBackend, tiny_model_dir_b: Path) -> None:
    with pytest.raises(InvalidInputError, match="revision"):
        backend.with_descriptor(describe(tiny_model_dir_b))


@pytest.mark.engine
def test_closing_a_view_leaves_the_engine_running(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    view = backend.with_descriptor(describe(tiny_model_dir))
    view.close()
    view.close()  # idempotent
    with pytest.raises(JudgestoreError, match="closed"):
        view.generate([chat("Hello")])
    assert isinstance(backend.generate([chat("Hello")])[0], Generation)


def test_engine_kwargs_must_match_the_descriptor(tiny_model_dir: Path) -> None:
    # Refused before anything is loaded: these never build an engine.
    descriptor = describe(tiny_model_dir)
    with pytest.raises(InvalidInputError, match=r"\['dtype'\]"):
        create_vllm_backend(descriptor, {**TINY_ENGINE_KWARGS, "dtype": "bfloat16"})
    with pytest.raises(InvalidInputError, match="model"):
        create_vllm_backend(descriptor, {**TINY_ENGINE_KWARGS, "model": "other/model"})


def test_the_descriptors_explicit_template_must_reach_the_backend(tiny_model_dir: Path) -> None:
    template = "{{ messages[-1]['content'] }}"
    with pytest.raises(InvalidInputError, match="chat template"):
        create_vllm_backend(describe(tiny_model_dir, chat_template=template), TINY_ENGINE_KWARGS)
    with pytest.raises(InvalidInputError, match="chat template"):
        create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS, chat_template=template)


def test_importing_the_inference_modules_loads_no_ml_library() -> None:
    code = (
        "import sys\n"
        "import inference.vllm_backend, inference.descriptors, inference.tiny_model\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    assert run_fresh_python(code).stdout.strip() == "[]"
