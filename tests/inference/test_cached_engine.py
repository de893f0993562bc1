"""The cache boundary on the real vLLM engine with the tiny local model.

One engine serves the module (vLLM on CPU runs in-process, where an engine is
closed only at module teardown); each test reaches it through a counting
factory, so "the engine was never prepared" and "exactly the misses were
sent" are counted, not assumed. The crash test runs its own engine in a
child process that kills itself with SIGKILL half-way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.backends.base import EngineRequest, Generation, Refusal
from inference.backends.vllm.backend import VLLMBackend, create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.backends.vllm.preflight import PromptLengthCheck
from inference.cache.model import CachedModel
from inference.cache.plan import Mode
from inference.cli.options import model_spec
from inference.judging import pairwise_requests, pointwise_request
from inference.requests import CompletionRequest
from inference.spec import DEFAULT_SAMPLING, ModelSpec
from store import logprobs
from store.descriptor import ModelDescriptor
from store.errors import CacheMissError, InvalidInputError, PromptTooLongError, RequestRefusedError, RequestsFailedError
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.inference.conftest import REPO_ROOT, TINY_ENGINE_KWARGS, VLLM_ENV

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "max_tokens": 12, "logprobs": 3}
SEEDED = {"temperature": 1.0, "max_tokens": 8, "seed": 1234}
QUESTIONS = [f"Question {i}: name a colour that rhymes with {w}." for i, w in enumerate(["bed", "bean", "sky", "cat"])]


def describe(model_dir: Path, sampling: dict[str, object] = GREEDY) -> ModelDescriptor:
    return descriptor_from_vllm(str(model_dir), engine_kwargs=TINY_ENGINE_KWARGS, sampling=sampling)


class Counting:
    """A streaming view of the shared engine that counts what it is asked; closing it keeps the engine."""

    def __init__(self, engine: VLLMBackend) -> None:
        self.engine = engine
        self.received: list[EngineRequest] = []

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation | Refusal]:
        self.received.extend(requests)
        return self.engine.generate(requests)

    def generate_stream(self, requests: Sequence[EngineRequest]) -> Iterator[tuple[int, Generation | Refusal]]:
        self.received.extend(requests)
        return self.engine.generate_stream(requests)

    def close(self) -> None:
        pass


class Factory:
    """Builds a counting view of the shared engine for one descriptor, and counts how often it is asked to."""

    def __init__(self, engine: VLLMBackend, descriptor: ModelDescriptor) -> None:
        self.engine, self.descriptor = engine, descriptor
        self.calls = 0
        self.backend: Counting | None = None

    def __call__(self) -> Counting:
        self.calls += 1
        self.backend = Counting(self.engine.with_descriptor(self.descriptor))
        return self.backend

    @property
    def received(self) -> list[EngineRequest]:
        return [] if self.backend is None else self.backend.received


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, vllm_env: None) -> Iterator[VLLMBackend]:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed")
    with create_vllm_backend(describe(tiny_model_dir), TINY_ENGINE_KWARGS, model=str(tiny_model_dir)) as backend:
        yield backend


def cached(
    store: Store | None, engine: VLLMBackend, descriptor: ModelDescriptor, mode: Mode = "use", **kw: object
) -> tuple[CachedModel, Factory]:
    factory = Factory(engine, descriptor)
    return CachedModel(store, descriptor, task="mt-bench", backend_factory=factory, mode=mode, **kw), factory  # type: ignore[arg-type]


def chat_request(content: str) -> EngineRequest:
    return EngineRequest({"type": "messages", "messages": [{"role": "user", "content": content}]})


def ask(question: str, n: int = 1) -> CompletionRequest:
    return CompletionRequest(
        messages=[{"role": "user", "content": question}], benchmark="mt-bench", instruction_id=question[:11], n=n
    )


def test_a_full_hit_never_prepares_the_engine(store: Store, engine: VLLMBackend, tiny_model_dir: Path) -> None:
    descriptor = describe(tiny_model_dir)
    first, _ = cached(store, engine, descriptor)
    generated = first.complete([ask(q) for q in QUESTIONS])
    second, factory = cached(store, engine, descriptor)
    hits = second.complete([ask(q) for q in QUESTIONS])
    assert factory.calls == 0 and not second.engine_loaded
    assert [r.cached for r in hits] == [True] * 4
    assert [r.text for r in hits] == [r.text for r in generated]


def test_a_request_the_model_cannot_take_is_named_by_its_index_and_nothing_is_generated(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir)
    model, factory = cached(store, engine, descriptor)
    batch = [ask(QUESTIONS[0]), ask(QUESTIONS[1]), CompletionRequest(text="a text prompt to a chat model")]
    with pytest.raises(InvalidInputError, match=r"^request 2: this model takes chat input"):
        model.complete(batch)
    assert factory.calls == 0 and not model.engine_loaded
    assert store.database("completions", "mt-bench", descriptor).count() == 0


def test_a_partial_hit_sends_exactly_the_misses(store: Store, engine: VLLMBackend, tiny_model_dir: Path) -> None:
    descriptor = describe(tiny_model_dir)
    cached(store, engine, descriptor)[0].complete([ask(QUESTIONS[1]), ask(QUESTIONS[3])])
    model, factory = cached(store, engine, descriptor)
    responses = model.complete([ask(q) for q in QUESTIONS])
    assert [r.rendered["messages"][0]["content"] for r in factory.received] == [QUESTIONS[0], QUESTIONS[2]]
    assert [r.cached for r in responses] == [False, True, False, True]
    assert [r.request.messages[0]["content"] for r in responses] == QUESTIONS  # type: ignore[index]
    assert store.database("completions", "mt-bench", descriptor).count() == 4


def test_cached_results_equal_uncached_ones_logprobs_included(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir)
    uncached = cached(None, engine, descriptor, mode="off")[0].complete([ask(q) for q in QUESTIONS])
    cached(store, engine, descriptor)[0].complete([ask(q) for q in QUESTIONS])
    hits = cached(store, engine, descriptor)[0].complete([ask(q) for q in QUESTIONS])
    assert all(r.cached for r in hits) and not any(r.cached for r in uncached)
    for hit, fresh in zip(hits, uncached, strict=True):
        h, f = hit.samples[0], fresh.samples[0]
        assert (h.text, h.top_logprobs, h.finish_reason) == (f.text, f.top_logprobs, f.finish_reason)
        tokens = ("prompt_tokens", "completion_tokens")  # engine_seconds is each generation's own time
        assert [h.usage[k] for k in tokens] == [f.usage[k] for k in tokens]  # type: ignore[index]
        (first,) = logprobs.decode(h.top_logprobs)  # "logprobs": 3, kept for the first position only
        assert len(first.candidates) == 3 and len({c.token_id for c in first.candidates}) == 3


def test_replay_fails_on_a_miss_and_refresh_replaces(store: Store, engine: VLLMBackend, tiny_model_dir: Path) -> None:
    descriptor = describe(tiny_model_dir)
    cached(store, engine, descriptor)[0].complete([ask(QUESTIONS[0])])
    replay, factory = cached(store, engine, descriptor, mode="replay")
    with pytest.raises(CacheMissError, match=r"request 1 \(mt-bench/Question 1:\)"):
        replay.complete([ask(QUESTIONS[0]), ask(QUESTIONS[1])])
    assert factory.calls == 0
    database = store.database("completions", "mt-bench", descriptor)
    assert database.count(RowFilter(run_id="test-run")) == 1
    refresh, factory = cached(store, engine, descriptor, mode="refresh", settings=Settings(run_id="refresh-run"))
    refresh.complete([ask(QUESTIONS[0])])
    assert len(factory.received) == 1
    assert database.count(RowFilter(run_id="refresh-run")) == 1 and database.count() == 1


def test_asking_for_four_samples_after_two_generates_two(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, SEEDED)
    (two,) = cached(store, engine, descriptor)[0].complete([ask(QUESTIONS[0], n=2)])
    model, factory = cached(store, engine, descriptor)
    (four,) = model.complete([ask(QUESTIONS[0], n=4)])
    assert sorted(r.sample_index for r in factory.received) == [2, 3]
    assert [s.text for s in four.samples[:2]] == [s.text for s in two.samples]
    assert len({s.text for s in four.samples}) > 1  # seeded sampling: the samples differ
    assert store.database("completions", "mt-bench", descriptor).count() == 4


def test_multi_turn_keys_chain_on_the_real_turn_one_answer(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """MT-Bench shape: turn 2 carries the turn-1 answer, so its key changes when that answer does."""
    descriptor = describe(tiny_model_dir)
    model, factory = cached(store, engine, descriptor)
    turn1 = [{"role": "user", "content": "Write a haiku about rain."}]
    (first,) = model.complete([CompletionRequest(messages=turn1, benchmark="mt-bench", instruction_id="81-t1")])
    turn2 = [*turn1, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Now about snow."}]
    (second,) = model.complete([CompletionRequest(messages=turn2, benchmark="mt-bench", instruction_id="81-t2")])
    assert len(factory.received) == 2
    assert factory.received[1].rendered["messages"][1]["content"] == first.text
    rerun, rerun_factory = cached(store, engine, descriptor)
    (again,) = rerun.complete([CompletionRequest(messages=turn2, benchmark="mt-bench", instruction_id="81-t2")])
    assert again.cached and again.text == second.text and rerun_factory.calls == 0
    other = [*turn1, {"role": "assistant", "content": first.text + " (edited)"}, turn2[2]]
    plan = rerun.plan("completions", [CompletionRequest(messages=other)])
    assert plan.misses == 1  # a different turn-1 answer is a different turn-2 input


def test_pairwise_both_orientations_and_pointwise_rows(store: Store, engine: VLLMBackend, tiny_model_dir: Path) -> None:
    judge = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4, "logprobs": 2})
    requests = [
        *pairwise_requests(
            question="2+2?",
            model_a="m-a",
            answer_a="4",
            model_b="m-b",
            answer_b="5",
            benchmark="arena",
            instruction_id="q1",
        ),
        pointwise_request(question="2+2?", model="m-a", answer="4", benchmark="arena", instruction_id="q1"),
    ]
    model, _ = cached(store, engine, judge, label="tiny-judge")
    responses = model.judge(requests)
    assert all(r.top_logprobs for r in responses)
    database = store.database("judgements", "mt-bench", judge)
    rows = {row.orientation: row for row in database.query()}
    assert set(rows) == {"direct", "reversed", None}
    # Positional slots (JudgeArena #128): model_a is the model whose answer the prompt shows first.
    assert (rows["direct"].model_a, rows["direct"].model_b) == ("m-a", "m-b")
    assert (rows["reversed"].model_a, rows["reversed"].model_b) == ("m-b", "m-a")
    for row in (rows["direct"], rows["reversed"]):
        user = orjson.loads(row.input_text)["messages"][1]["content"]
        assert user.index("[Assistant A]\n" + {"m-a": "4", "m-b": "5"}[row.model_a]) >= 0
    assert rows[None].model_b is None and rows[None].judge == "tiny-judge"
    assert database.count(RowFilter(pair=("m-b", "m-a"))) == 2  # the pair, both orientations


CRASHING_RUN = """
import os, signal, sys
from pathlib import Path
from inference.cache.model import CachedModel
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.requests import CompletionRequest
from inference.backends.vllm.backend import create_vllm_backend
from store.store import Store
from tests.inference.conftest import TINY_ENGINE_KWARGS

model_dir, root, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
sampling = {"temperature": 0, "max_tokens": 8}
descriptor = descriptor_from_vllm(model_dir, engine_kwargs=TINY_ENGINE_KWARGS, sampling=sampling)

def progress(done, total):
    if done >= kill_after:  # the chunk is written before progress is reported
        os.kill(os.getpid(), signal.SIGKILL)

requests = [CompletionRequest(messages=[{"role": "user", "content": f"prompt {i}"}]) for i in range(10)]
model = CachedModel(Store(root=root), descriptor, task="crash", chunk_size=2,
                    backend_factory=lambda: create_vllm_backend(descriptor, TINY_ENGINE_KWARGS, model=model_dir))
model.complete(requests, on_progress=progress)
"""


def test_a_sigkilled_run_loses_at_most_one_chunk_and_the_rerun_resumes(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    env = {**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_RUN, str(tiny_model_dir), str(store.root), "4"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    descriptor = descriptor_from_vllm(
        str(tiny_model_dir), engine_kwargs=TINY_ENGINE_KWARGS, sampling={"temperature": 0, "max_tokens": 8}
    )
    database = store.database("completions", "crash", descriptor)
    assert database.count() == 4  # two chunks of two were written before the kill; none half-written
    model, factory = cached(store, engine, descriptor)
    model.task = "crash"
    responses = model.complete(
        [CompletionRequest(messages=[{"role": "user", "content": f"prompt {i}"}]) for i in range(10)]
    )
    assert len(factory.received) == 6
    assert [r.cached for r in responses] == [True] * 4 + [False] * 6
    assert database.count() == 10
    verify = subprocess.run(
        [sys.executable, "-m", "store", "verify", "--store-root", str(store.root)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_spec_without_sampling_settings_gets_the_command_lines_defaults_and_does_not_truncate_at_16(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    spec = ModelSpec(model=str(tiny_model_dir), engine_kwargs=TINY_ENGINE_KWARGS)
    assert spec.descriptor.sampling.max_tokens == DEFAULT_SAMPLING["max_tokens"] == 256
    assert spec.descriptor.sampling.temperature == DEFAULT_SAMPLING["temperature"] == 0
    engine_args = [f"{k}={json.dumps(v)}" for k, v in TINY_ENGINE_KWARGS.items()]
    cli_spec = model_spec(model=str(tiny_model_dir), engine_arg=engine_args)  # what the command line passes
    assert cli_spec.descriptor.sha256() == spec.descriptor.sha256()  # one set of defaults for both

    long = ModelSpec(model=str(tiny_model_dir), engine_kwargs=TINY_ENGINE_KWARGS, sampling={"ignore_eos": True})
    model, _ = cached(store, engine, long.descriptor)
    (response,) = model.complete([ask(QUESTIONS[0])])
    assert response.samples[0].usage is not None and response.samples[0].usage["completion_tokens"] > 16
    assert model.last.truncated == (response.samples[0].finish_reason == "length")


_CHANGED_FILES_RUN = """
import json, sys
from pathlib import Path
from inference.cache.model import CachedModel
from inference.requests import CompletionRequest
from inference.spec import ModelSpec
from store.errors import EngineMismatchError
from store.store import Store
from tests.inference.conftest import TINY_ENGINE_KWARGS

folder, root = Path(sys.argv[1]), sys.argv[2]
spec = ModelSpec(model=str(folder), engine_kwargs=TINY_ENGINE_KWARGS, sampling={"max_tokens": 4})
descriptor = spec.descriptor  # the key is computed (and the plan made) with the files as they were
config = json.loads((folder / "config.json").read_text())
config["rope_theta"] = config.get("rope_theta", 10000.0) * 2  # then someone changes the model under the run
(folder / "config.json").write_text(json.dumps(config))
model = CachedModel(Store(root=root), descriptor, task="t", backend_factory=spec.backend)
try:
    model.complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])
except EngineMismatchError as e:
    print("refused:", e)
"""


def test_a_model_changed_between_planning_and_loading_writes_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    root = tmp_path / "store"
    result = subprocess.run(
        [sys.executable, "-c", _CHANGED_FILES_RUN, str(folder), str(root)],
        cwd=REPO_ROOT,
        env={**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "now digests to" in result.stdout
    assert not list(root.rglob("*.db"))  # no database, no row: the engine never produced a row under that key


# ---------------------------------------------------------------- one bad request fails alone

LONG = "Write a short poem about the sea. " * 60  # about 500 tokens: over the tiny engine's max_model_len of 256


def test_a_signal_while_the_prompt_check_loads_its_tokenizer_is_held_until_it_is(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check's tokenizer is a run's first import of torch, whose C++ initialisation a signal aborts (SIGABRT):
    held for the engine's libraries, not for this one, which comes first (was)."""
    import transformers

    real = transformers.AutoTokenizer.from_pretrained

    def loading(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C lands while torch initialises
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loading)
    check = PromptLengthCheck(describe(tiny_model_dir, {"max_tokens": 8}), str(tiny_model_dir), TINY_ENGINE_KWARGS)
    with pytest.raises(KeyboardInterrupt):
        check([])
    assert check._tokenizer is not None  # loaded to its end, then stopped
    assert "stopping once the tokenizer is loaded" in capsys.readouterr().err


def test_a_prompt_over_max_model_len_fails_alone_before_the_engine_and_the_rerun_never_loads_it(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 8})
    check = PromptLengthCheck(descriptor, str(tiny_model_dir), TINY_ENGINE_KWARGS)
    batch = [ask(q) for q in QUESTIONS] + [ask(LONG)] + [ask(f"Question {i}: say hi.") for i in range(3)]
    model, factory = cached(store, engine, descriptor, preflight=check)
    with pytest.raises(RequestsFailedError, match=r"1 of 8 inputs.*request 4 .*PromptTooLongError") as raised:
        model.complete(batch)
    (failure,) = raised.value.failures
    assert failure.request_index == 4 and isinstance(failure.error, PromptTooLongError)
    assert "context is 256 (max_model_len)" in str(failure.error)
    assert len(factory.received) == 7 and LONG not in str(factory.received)  # found before the engine was asked
    responses = raised.value.responses
    assert [r.error is None for r in responses] == [True] * 4 + [False] + [True] * 3
    assert store.database("completions", "mt-bench", descriptor).count() == 7

    rerun, rerun_factory = cached(store, engine, descriptor, preflight=check)
    with pytest.raises(RequestsFailedError) as again:
        rerun.complete(batch)
    assert rerun_factory.calls == 0 and not rerun.last.engine_loaded  # 7 hits; the 8th fails without the engine
    assert [r.cached for r in again.value.responses] == [True] * 4 + [False] + [True] * 3
    assert [r.text for r in again.value.responses] == [r.text for r in responses]


def test_without_the_preflight_the_engine_refuses_the_long_prompt_alone_and_generates_the_rest_together(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 8})
    alone = cached(None, engine, descriptor, mode="off")[0].complete([ask(q) for q in QUESTIONS])
    model, factory = cached(store, engine, descriptor)
    batch = [ask(QUESTIONS[0]), ask(LONG), ask(QUESTIONS[1]), ask(LONG + "!"), ask(QUESTIONS[2]), ask(QUESTIONS[3])]
    with pytest.raises(RequestsFailedError, match="2 of 6 inputs") as raised:
        model.complete(batch)
    assert len(factory.received) == 6  # the engine was asked for all of them, and refused two
    errors = [r.error for r in raised.value.responses]
    for error in (errors[1], errors[3]):
        assert isinstance(error, RequestRefusedError) and "vLLM refused this request" in str(error)
        assert "maximum context length is 256 tokens" in str(error)
    answered = [r for r in raised.value.responses if r.error is None]
    assert [r.text for r in answered] == [r.text for r in alone]  # the same answers as in a batch of their own
    assert store.database("completions", "mt-bench", descriptor).count() == 4
    (next_call,) = engine.with_descriptor(descriptor).generate([chat_request(QUESTIONS[0])])  # nothing left queued
    assert isinstance(next_call, Generation) and next_call.text == alone[0].text


def test_the_preflight_refuses_an_empty_text_prompt_as_vllm_does_before_it_loads(
    engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    """vLLM refuses a prompt of no tokens ("The decoder prompt cannot be empty"): a rerun loaded the engine to hear
    it again (was)."""
    descriptor = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs=TINY_ENGINE_KWARGS, input_mode="text",
                                      sampling={"temperature": 0, "max_tokens": 4})  # fmt: skip
    texts = [EngineRequest({"type": "text", "text": t}) for t in ("", "Say hi.")]
    refused = PromptLengthCheck(descriptor, str(tiny_model_dir), TINY_ENGINE_KWARGS)(texts)
    assert list(refused) == [0] and isinstance(refused[0], RequestRefusedError) and "empty" in str(refused[0])
    engine_says = engine.with_descriptor(descriptor).generate(texts)
    assert isinstance(engine_says[0], Refusal) and isinstance(engine_says[1], Generation)  # the engine agrees


def test_the_preflight_counts_tokens_as_vllm_does_and_agrees_on_the_boundary(
    engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    descriptor = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4})
    check = PromptLengthCheck(descriptor, str(tiny_model_dir), TINY_ENGINE_KWARGS)
    check([])  # loads the tokenizer
    prompts = [*QUESTIONS, "", "Ünïcödé ✓ 評価 🙂", "x" * 100]
    view = engine.with_descriptor(descriptor)
    for prompt, generation in zip(prompts, view.generate([chat_request(p) for p in prompts]), strict=True):
        assert isinstance(generation, Generation)
        assert check._count(chat_request(prompt)) == generation.usage["prompt_tokens"], prompt

    def sized(tokens: int) -> str:  # a prompt of exactly ``tokens`` tokens with the chat template
        words = 1
        while (count := check._count(chat_request("a " * words))) is not None and count < tokens:
            words += 1
        assert count == tokens, f"no prompt of exactly {tokens} tokens"
        return "a " * words

    fits, full = sized(255), sized(256)
    assert check([chat_request(fits), chat_request(full)]).keys() == {1}
    fitted, refused = view.generate([chat_request(fits), chat_request(full)])
    assert isinstance(fitted, Generation) and fitted.finish_reason == "length"  # one token of room: vLLM answers it
    assert isinstance(refused, Refusal)  # none: vLLM refuses it, as the preflight said


def test_a_judge_whose_answers_are_empty_stores_them_and_the_rerun_is_all_hits(
    store: Store, engine: VLLMBackend, tiny_model_dir: Path
) -> None:
    requests = [
        *pairwise_requests(question="2+2?", model_a="m-a", answer_a="4", model_b="m-b", answer_b="5"),
        *pairwise_requests(
            question="Capital of France?", model_a="m-a", answer_a="Paris", model_b="m-b", answer_b="Rome"
        ),
        pointwise_request(question="Say hi.", model="m-a", answer="hi"),
    ]
    probe = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4, "logprobs": 2})
    first_tokens = {
        logprobs.decode(r.top_logprobs)[0].sampled.text
        for r in cached(None, engine, probe, mode="off")[0].judge(requests)
    }
    stops = sorted(t for t in first_tokens if t.strip() and "\ufffd" not in t)
    assert stops, f"the judge's first tokens {first_tokens} give no stop string"
    # A stop string equal to a judge's first token: that answer is empty (finish_reason stop), its logprobs real.
    judge = describe(tiny_model_dir, {"temperature": 0, "max_tokens": 4, "logprobs": 2, "stop": stops})
    model, _ = cached(store, engine, judge)
    responses = model.judge(requests)
    empty = [r for r in responses if r.text == ""]
    assert empty and all(r.samples[0].finish_reason == "stop" and r.top_logprobs for r in empty)
    database = store.database("judgements", "mt-bench", judge)
    assert database.count() == len(requests) == model.last.written  # the empty answers too
    rerun, rerun_factory = cached(store, engine, judge)
    again = rerun.judge(requests)
    assert rerun_factory.calls == 0 and not rerun.last.engine_loaded
    assert [(r.text, r.top_logprobs) for r in again] == [(r.text, r.top_logprobs) for r in responses]
