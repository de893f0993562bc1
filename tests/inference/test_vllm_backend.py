"""VLLMBackend on the real vLLM engine, with the tiny local model.

One engine is built for the module and shared through ``with_descriptor``
views (sampling and templates are per request); the determinism test builds a
second one. vLLM on CPU runs in-process, where closing an engine tears down
process-global state, so both are closed only at module teardown.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import EngineRequest, Generation, max_concurrency
from inference.backends.vllm.backend import VLLMBackend, create_vllm_backend
from inference.backends.vllm.checks import verify_loaded
from inference.backends.vllm.descriptor import descriptor_from_vllm
from store import logprobs
from store.descriptor import ModelDescriptor
from store.errors import EngineMismatchError, InvalidInputError, JudgestoreError
from store.logprobs import LOGPROBS_FORMAT
from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV, run_fresh_python

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
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed (bash .ci/setup installs it)")
    with create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS, model=str(tiny_model_dir)) as b:
        yield b


@pytest.fixture(scope="module")
def rebuilt_backend(tiny_model_dir: Path, vllm_env: None, backend: VLLMBackend) -> Iterator[VLLMBackend]:
    """A second engine on the same model; depends on ``backend`` so it is closed first."""
    with create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS, model=str(tiny_model_dir)) as b:
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
def test_the_backend_works_on_as_many_requests_at_once_as_its_scheduler(backend: VLLMBackend) -> None:
    assert backend.max_concurrency == TINY_ENGINE_KWARGS["max_num_seqs"]
    assert max_concurrency(backend) == TINY_ENGINE_KWARGS["max_num_seqs"]  # what a shared batch's blocks follow


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
def test_top_logprobs_keep_every_candidate_with_its_id_and_the_sampled_token(
    backend: VLLMBackend, tiny_model_dir: Path
) -> None:
    with_logprobs = backend.with_descriptor(describe(tiny_model_dir, sampling={**GREEDY, "logprobs": 5}))
    (g,) = with_logprobs.generate([chat(QUESTIONS[0])])
    assert g.top_logprobs is not None and g.top_logprobs["format"] == LOGPROBS_FORMAT
    (first,) = logprobs.decode(g.top_logprobs)  # the first position only, by default
    assert len(first.candidates) == 5
    assert len({c.token_id for c in first.candidates}) == 5 and all(c.token_id is not None for c in first.candidates)
    assert [c.rank for c in first.candidates] == [1, 2, 3, 4, 5]
    assert all(c.logprob <= 0 for c in first.candidates)
    assert first.sampled is not None and first.sampled.rank == 1 and first.sampled == first.candidates[0]  # greedy
    view = logprobs.text_logprobs(g.top_logprobs)  # JudgeArena's {text: logprob}, ids of one text merged
    assert set(view) == {c.text for c in first.candidates}
    (plain,) = backend.generate([chat(QUESTIONS[0])])
    assert g.text == plain.text  # asking for logprobs changes nothing else


@pytest.mark.engine
def test_a_sampled_token_outside_the_top_k_is_kept_apart(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    hot = backend.with_descriptor(
        describe(tiny_model_dir, sampling={"temperature": 2.0, "seed": 3, "max_tokens": 1, "logprobs": 1})
    )
    samples = hot.generate([chat(QUESTIONS[0], k) for k in range(6)])
    positions = [logprobs.decode(g.top_logprobs)[0] for g in samples]
    # At temperature 2 the sampled first token differs between samples; the top-1 candidate is the same for all.
    assert len({g.text for g in samples}) > 1
    assert all(p.candidates == positions[0].candidates and len(p.candidates) == 1 for p in positions)
    outside = [p.sampled for p in positions if p.sampled is not None and p.sampled.rank != 1]
    assert outside and all(t.rank is not None and t.rank > 1 and t.token_id is not None for t in outside)


@pytest.mark.engine
def test_every_generated_position_can_keep_its_candidates(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    every = backend.with_descriptor(
        describe(tiny_model_dir, sampling={**GREEDY, "logprobs": 2, "ignore_eos": True}, logprob_positions="all")
    )
    (g,) = every.generate([chat(QUESTIONS[1])])
    positions = logprobs.decode(g.top_logprobs)
    assert len(positions) == g.usage["completion_tokens"] == 12
    assert all(len(p.candidates) == 2 and p.sampled is not None for p in positions)
    assert "".join(p.sampled.text for p in positions if p.sampled) == g.text  # the sampled tokens spell the text


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
        create_vllm_backend(descriptor, {**TINY_ENGINE_KWARGS, "dtype": "bfloat16"}, model=str(tiny_model_dir))
    with pytest.raises(InvalidInputError, match="model"):
        create_vllm_backend(descriptor, {**TINY_ENGINE_KWARGS, "model": "other/model"})
    with pytest.raises(InvalidInputError, match="pass model="):
        create_vllm_backend(descriptor, TINY_ENGINE_KWARGS)


def test_the_descriptors_explicit_template_must_reach_the_backend(tiny_model_dir: Path) -> None:
    template = "{{ messages[-1]['content'] }}"
    with pytest.raises(InvalidInputError, match="chat template"):
        create_vllm_backend(
            describe(tiny_model_dir, chat_template=template), TINY_ENGINE_KWARGS, model=str(tiny_model_dir)
        )
    with pytest.raises(InvalidInputError, match="chat template"):
        create_vllm_backend(
            describe(tiny_model_dir), TINY_ENGINE_KWARGS, model=str(tiny_model_dir), chat_template=template
        )


def test_importing_the_inference_modules_loads_no_ml_library() -> None:
    code = (
        "import sys\n"
        "import inference.backends.vllm.backend, inference.backends.vllm.descriptor\n"
        "import inference.backends.vllm.tiny_model\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    assert run_fresh_python(code).stdout.strip() == "[]"


@pytest.mark.engine
def test_what_vllm_loaded_is_checked_against_the_descriptor(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    llm, descriptor = backend._llm, backend.descriptor
    verify_loaded(llm, descriptor, str(tiny_model_dir), None)  # the engine the descriptor names: passes
    other_template = descriptor.model_copy(update={"chat_template_sha256": "0" * 64})
    with pytest.raises(EngineMismatchError, match="chat template"):
        verify_loaded(llm, other_template, str(tiny_model_dir), None)
    other_files = descriptor.model_copy(update={"revision": "sha256:" + "0" * 64})
    with pytest.raises(EngineMismatchError, match="digests to"):
        verify_loaded(llm, other_files, str(tiny_model_dir), None)
    other_commit = descriptor.model_copy(update={"revision": "a" * 40})
    with pytest.raises(EngineMismatchError, match="loaded revision None"):
        verify_loaded(llm, other_commit, str(tiny_model_dir), None)


@pytest.mark.engine
def test_a_logit_bias_kept_as_json_reaches_vllm_as_token_ids(backend: VLLMBackend, tiny_model_dir: Path) -> None:
    """JSON keeps a logit_bias's token ids as text; vLLM compares them as ints (before: a TypeError at add)."""
    forced = 300
    biased = describe(tiny_model_dir, sampling={**GREEDY, "max_tokens": 4, "logprobs": 1, "logit_bias": {forced: 100}})
    assert biased.sampling.model_dump()["logit_bias"] == {str(forced): 100}  # how the descriptor keeps it
    (g,) = backend.with_descriptor(biased).generate([chat(QUESTIONS[0])])
    assert g.top_logprobs is not None
    (first,) = logprobs.decode(g.top_logprobs)
    assert first.sampled is not None and first.sampled.token_id == forced  # the bias decided the token


def test_sampling_values_vllm_types_as_its_classes_are_built_from_json(tiny_model_dir: Path) -> None:
    pytest.importorskip("vllm", reason="needs vLLM's SamplingParams")
    from vllm import SamplingParams
    from vllm.sampling_params import RepetitionDetectionParams, StructuredOutputsParams

    from inference.backends.vllm.backend import sampling_params

    sampling = {**GREEDY, "structured_outputs": {"regex": "[ab]+"},
                "repetition_detection": {"max_pattern_size": 4, "min_count": 3}}  # fmt: skip
    params = sampling_params(SamplingParams, describe(tiny_model_dir, sampling=sampling), 0)
    assert isinstance(params.structured_outputs, StructuredOutputsParams) and params.structured_outputs.regex == "[ab]+"
    assert isinstance(params.repetition_detection, RepetitionDetectionParams)
    assert params.repetition_detection.min_count == 3
    with pytest.raises(InvalidInputError, match="rejected the descriptor's sampling"):
        sampling_params(SamplingParams, describe(tiny_model_dir, sampling={**GREEDY, "logit_bias": {"x": 1}}), 0)


@pytest.mark.engine
def test_what_the_engine_refuses_while_it_loads_is_a_typed_error_naming_the_setting(tiny_model_dir: Path) -> None:
    """In a process of its own: the engine that loads and is refused is closed, which would break this module's."""
    code = f"""
import json
from inference.backends.vllm.backend import create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from store.errors import InvalidInputError
from tests.inference.conftest import TINY_ENGINE_KWARGS

model = {str(tiny_model_dir)!r}
found = []
for engine, sampling in (({{**TINY_ENGINE_KWARGS, "kv_cache_memory_bytes": 4096}}, {{"temperature": 0}}),
                         (TINY_ENGINE_KWARGS, {{"temperature": 0, "logprobs": 25}})):
    descriptor = descriptor_from_vllm(model, engine_kwargs=engine, sampling=sampling)
    try:
        create_vllm_backend(descriptor, engine, model=model).close()
        found.append(None)
    except InvalidInputError as e:
        found.append(str(e))
print(json.dumps(found))
"""
    memory, logprobs_refused = json.loads(run_fresh_python(code, **VLLM_ENV).stdout.strip().splitlines()[-1])
    assert memory is not None and "could not start the engine" in memory and "cache" in memory
    assert logprobs_refused is not None and "refuses the descriptor's sampling for every request" in logprobs_refused
    assert "max_logprobs" in logprobs_refused


def test_what_counts_as_a_failure_to_load_the_model_and_what_raises_as_it_is() -> None:
    """A ModelLoadError says to check the model's files, access or memory: right for those failures; a missing
    package or an error in code (a KeyError inside vLLM) keeps its own type and traceback."""
    import httpx
    from huggingface_hub.errors import EntryNotFoundError

    from inference.backends.vllm.backend import _loading_failure

    loads = [OSError("no weights"), RuntimeError("CUDA out of memory"), EntryNotFoundError("404"),
             httpx.ConnectError("refused")]  # fmt: skip
    code = [ModuleNotFoundError("No module named 'flash_attn'"), KeyError("layers.0"), TypeError("x"), IndexError()]
    assert [_loading_failure(e) for e in loads] == [True] * 4
    assert [_loading_failure(e) for e in code] == [False] * 4
