"""prepare_model / do_inference: the seed's call shape over the cache boundary, against the fake OpenAI server.

The same calls on the tiny vLLM engine are in ``test_dropin_engine.py``.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate

from inference import HostedSpec, ModelSpec, compat
from inference.compat import InferenceResult, PreparedModel, do_inference, prepare_model
from store import RowFilter, Selector, Store
from store.errors import CacheMissError, InvalidInputError, RequestsFailedError
from tests.fake_openai import FakeOpenAI


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI() as server:
        yield server


def served(fake: FakeOpenAI, **sampling: Any) -> HostedSpec:
    return HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url, sampling=sampling)


def ids(n: int) -> list[dict[str, Any]]:
    return [{"instruction_id": str(i)} for i in range(n)]


def test_results_come_in_the_callers_order_and_a_second_call_sends_nothing(store: Store, fake: FakeOpenAI) -> None:
    with prepare_model(served(fake), task="arena", store=store) as model:
        first = do_inference(model, ["q0", "q1", "q2"], cache_metadata=ids(3))
        inputs = ["q2", "new", "q0", "q2"]
        mixed = do_inference(model, inputs, cache_metadata=[{"instruction_id": s} for s in inputs])
    assert first == ["echo: q0", "echo: q1", "echo: q2"]
    assert mixed == ["echo: q2", "echo: new", "echo: q0", "echo: q2"]
    assert mixed.run.plan is not None and (mixed.run.plan.hits, mixed.run.plan.misses) == (2, 1)
    with prepare_model(served(fake), task="arena", store=store) as again:
        assert do_inference(again, ["q1", "q0"], cache_metadata=ids(2)) == ["echo: q1", "echo: q0"]
        # generators of inputs and of their metadata, read once (the metadata's had no len(), was)
        made = do_inference(again, (f"q{i}" for i in (2, 1)), cache_metadata=({"instruction_id": i} for i in "21"))
        assert made == ["echo: q2", "echo: q1"]
        assert not again.engine_loaded
    assert len(fake.completions()) == 4


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        (None, "one dict per input: 2 inputs, no cache_metadata"),
        ([{"instruction_id": "0"}], "2 inputs, 1 cache_metadata entries"),
        ([{"instruction_id": "0"}, "1"], r"cache_metadata\[1\] is a str"),
        ({"instruction_id": "0"}, r"got one dict: pass a list of 2 dicts. Each is completions take"),
        ([{"instruction_id": "0"}, {}], r"cache_metadata\[1\] lacks \['instruction_id'\]"),
        ([{"instruction_id": "0"}, {"instruction_id": "1", "instruction": "x"}], r"unknown keys \['instruction'\]"),
    ],
)
def test_cache_metadata_must_hold_one_dict_per_input(store: Store, fake: FakeOpenAI, metadata: Any, says: str) -> None:
    with (
        prepare_model(served(fake), task="arena", store=store) as model,
        pytest.raises(ValueError, match=says) as raised,
    ):
        do_inference(model, ["a", "b"], cache_metadata=metadata)
    assert isinstance(raised.value, InvalidInputError)
    assert fake.completions() == [] and store.locations() == []  # refused before anything ran


def test_judgements_take_their_slots_and_orientation_and_the_task_as_benchmark(store: Store, fake: FakeOpenAI) -> None:
    metadata = [
        {"instruction_id": "3", "model_a": "x", "model_b": "y", "orientation": "direct"},
        {"instruction_id": "3", "model_a": "y", "model_b": "x", "orientation": "reversed"},
        {"instruction_id": "4", "model_a": "x", "model_b": None},
    ]
    with prepare_model(served(fake), task="arena", role="judgements", store=store) as judge:
        do_inference(judge, ["[x, y]", "[y, x]", "[x]"], cache_metadata=metadata)
        with pytest.raises(ValueError, match=r"lacks \['model_a', 'model_b'\]"):
            do_inference(judge, ["[x]"], cache_metadata=ids(1))
    rows = store.query_rows(Selector(role="judgements", task="arena"), RowFilter(benchmark="arena"))
    seen = sorted(((r.record.model_a, r.record.model_b, r.record.orientation) for r in rows), key=str)  # type: ignore[union-attr]
    assert seen == [("x", "y", "direct"), ("x", None, None), ("y", "x", "reversed")]


def test_return_top_logprobs_gives_text_and_first_token_logprobs(store: Store, fake: FakeOpenAI) -> None:
    with prepare_model(served(fake, logprobs=2, max_tokens=3), task="arena", store=store) as model:
        fresh = do_inference(model, ["a b", "c d"], return_top_logprobs=True, cache_metadata=ids(2))
        stored = do_inference(model, ["a b", "c d"], return_top_logprobs=True, cache_metadata=ids(2))
    for result in (*fresh, *stored):
        assert isinstance(result, InferenceResult)
        assert result.first_token_top_logprobs == {"echo:": -0.25, "alt1": -1.75}
        assert result.first_token_logprobs_merged == result.first_token_top_logprobs  # no two decode alike here
    assert [r.text for r in stored] == ["echo: a b", "echo: c d"] == [r.text for r in fresh]
    assert [r.cached for r in fresh + stored] == [False, False, True, True]
    with prepare_model(served(fake), task="arena", store=store) as no_logprobs:
        (plain,) = do_inference(no_logprobs, ["a b"], return_top_logprobs=True, cache_metadata=ids(1))
    assert plain.first_token_top_logprobs is None and plain.text == "echo: a b"


def test_use_tqdm_shows_a_progress_bar_over_the_misses(
    store: Store, fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    with prepare_model(served(fake), task="arena", store=store) as model:
        do_inference(model, ["hit"], cache_metadata=ids(1))
        capsys.readouterr()
        do_inference(model, ["hit", "m1", "m2", "m3"], use_tqdm=True, cache_metadata=ids(4))
        bar = capsys.readouterr().err
        do_inference(model, ["hit"], use_tqdm=True, cache_metadata=ids(1))
        nothing = capsys.readouterr().err
    assert "fake-judge: generating" in bar and "3/3" in bar and "4/" not in bar
    assert nothing == ""  # every input a hit: nothing to generate, no bar


def test_inputs_may_be_langchain_prompts_and_a_model_off_the_store_needs_no_metadata(fake: FakeOpenAI) -> None:
    prompt = ChatPromptTemplate.from_messages([("system", "Judge."), ("human", "{q}")]).invoke({"q": "which?"})
    with prepare_model(served(fake), task="arena", mode="off") as model:
        assert do_inference(model, [prompt, "plain"]) == ["echo: which?", "echo: plain"]
    sent = [r.body["messages"] for r in fake.completions()]  # type: ignore[index]
    assert [{"role": "system", "content": "Judge."}, {"role": "user", "content": "which?"}] in sent


def test_threads_making_their_first_call_at_once_share_one_store_and_one_model(
    fake: FakeOpenAI, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread opened a store and built a model of its own (was): N engines loaded, N - 1 stores left open."""
    monkeypatch.setenv("JUDGESTORE_STORE_ROOT", str(tmp_path))
    opened: list[Store] = []

    def slow_store(**options: Any) -> Store:  # opening takes a while: every thread reaches it
        time.sleep(0.2)
        opened.append(Store(**options))
        return opened[-1]

    monkeypatch.setattr(compat, "Store", slow_store)
    model = prepare_model(served(fake), task="arena")
    start = threading.Barrier(4)

    def call() -> list[str]:
        start.wait()
        return do_inference(model, ["q"], cache_metadata=ids(1))

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: call(), range(4)))
    assert answers == [["echo: q"]] * 4
    assert len(opened) == 1 and model.materialize() is model.materialize()
    model.close()


def test_a_prepared_model_pickles_and_copies_as_before_its_lock(fake: FakeOpenAI) -> None:
    """The lock that makes first calls build one model broke pickle and deepcopy (a process pool's argument)."""
    model = prepare_model(served(fake), task="arena", mode="off")
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert (copied.spec, copied.task) == (model.spec, model.task) and copied._building is not model._building
        assert do_inference(copied, ["q"]) == ["echo: q"]
        copied.close()


def test_a_prepared_model_that_has_answered_copies_as_prepared(fake: FakeOpenAI, store_root: Path) -> None:
    """After its first call it held the cached model (locks, the backend's thread): pickle and deepcopy raised a
    bare TypeError ("cannot pickle '_thread.RLock' object")."""
    with Store(root=store_root) as store:
        for model in (
            prepare_model(served(fake), task="arena"),
            prepare_model(served(fake), task="arena", store=store),
        ):
            assert do_inference(model, ["q"], cache_metadata=ids(1)) == ["echo: q"]
            built = model.materialize()
            for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
                assert copied._cached is None and copied._own_store is None and not copied.engine_loaded
                assert do_inference(copied, ["q"], cache_metadata=ids(1)) == ["echo: q"]
                assert copied.last.plan is not None and copied.last.plan.hits == 1  # the same store: a hit
                copied.close()
            assert model.materialize() is built  # the original keeps its own
            model.close()
    assert len(fake.completions()) == 1


def test_prepare_model_resolves_nothing_until_a_call(tmp_path: Any) -> None:
    missing = tmp_path / "no-such-model"
    model = prepare_model(f"VLLM/{missing}", task="arena", sampling={"max_tokens": 8})
    assert isinstance(model, PreparedModel) and isinstance(model.spec, ModelSpec)
    assert model.spec.model == str(missing) and model.spec.sampling == {"max_tokens": 8}
    assert not model.engine_loaded
    with pytest.raises(InvalidInputError, match="no such model folder"):
        do_inference(model, ["hi"], cache_metadata=ids(1))
    hosted = prepare_model("OpenRouter/meta/llama-3", task="arena", base_url="http://127.0.0.1:9/v1")
    assert isinstance(hosted.spec, HostedSpec) and (hosted.spec.provider, hosted.spec.model) == (
        "openrouter",
        "meta/llama-3",
    )
    with pytest.raises(InvalidInputError, match="is a spec already"):
        prepare_model(ModelSpec(model="m"), task="arena", sampling={})
    with pytest.raises(InvalidInputError, match="takes a model from prepare_model"):
        do_inference("VLLM/m", ["hi"], cache_metadata=ids(1))  # type: ignore[arg-type]


def test_the_seeds_other_prefixes_are_read_by_name_not_as_a_vllm_model_id() -> None:
    chat = prepare_model("ChatOpenAI/gpt-4o", task="arena")
    assert isinstance(chat.spec, HostedSpec) and (chat.spec.provider, chat.spec.model) == ("openai", "gpt-4o")
    for name, says in [("LlamaCpp/models/q4.gguf", "does not run llama.cpp"), ("Dummy/x", "has no dummy engine")]:
        with pytest.raises(InvalidInputError, match=says) as refused:
            prepare_model(name, task="arena")
        assert repr(name) in str(refused.value)
    folder = prepare_model("VLLM/LlamaCpp/model", task="arena")  # a folder of that name, asked for as vLLM
    assert isinstance(folder.spec, ModelSpec) and folder.spec.model == "LlamaCpp/model"


@pytest.mark.parametrize(
    ("name", "options", "says"),
    [
        ("VLLM/m", {"samplng": {"max_tokens": 8}}, r"ModelSpec, which does not take \['samplng'\]"),
        ("m", {"sampling": {}, "engine_kwarg": {}}, r"does not take \['engine_kwarg'\]"),
        ("OpenAI/gpt-4o", {"engine_kwargs": {}}, r"HostedSpec, which does not take \['engine_kwargs'\]"),
        ("Together/m", {"provider": "openai"}, r"does not take \['provider'\]"),  # the name says it
        ("VLLM/m", {"mode": "replay-only"}, r"mode must be one of use, refresh, off, replay, readonly"),
    ],
)
def test_an_option_the_spec_does_not_take_is_refused_typed(name: str, options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidInputError, match=says):
        prepare_model(name, task="arena", **options)


def test_one_string_as_the_inputs_is_refused_not_split(fake: FakeOpenAI) -> None:
    prompt = ChatPromptTemplate.from_messages([("human", "{q}")]).invoke({"q": "which?"})
    with prepare_model(served(fake), task="arena", mode="off") as model:
        for one in ("abc", prompt):
            with pytest.raises(InvalidInputError, match="takes a list of inputs"):
                do_inference(model, one)  # type: ignore[arg-type]
    assert fake.completions() == []


def test_a_refused_input_fails_alone_and_the_call_raises_after_storing_the_rest(store: Store, fake: FakeOpenAI) -> None:
    fake.context_length = 10
    with prepare_model(served(fake), task="arena", store=store) as model:
        with pytest.raises(RequestsFailedError) as raised:
            do_inference(model, ["short", "long " * 20, "brief"], cache_metadata=ids(3))
        assert [r.text for r in raised.value.responses] == ["echo: short", "", "echo: brief"]
        assert do_inference(model, ["brief", "short"], cache_metadata=ids(2)).run.plan.hits == 2  # type: ignore[union-attr]


def test_a_repeated_input_at_a_random_sampling_gets_a_sample_of_its_own_each_time(
    store: Store, fake: FakeOpenAI
) -> None:
    """An engine without a cache answers each repeat on its own (majority votes count on it); the repeats were one
    request and one answer copied (was). The k-th repeat is sample k: a rerun gets the same answers back."""
    inputs = ["q", "q", "r", "q"]
    with prepare_model(served(fake, temperature=1.0), task="arena", store=store) as model:
        first = do_inference(model, inputs, return_top_logprobs=True, cache_metadata=ids(4))
        again = do_inference(model, inputs, return_top_logprobs=True, cache_metadata=ids(4))
    assert len(fake.completions()) == 4  # q three times, r once; nothing on the rerun
    assert [r.text for r in first] == ["echo: q", "echo: q", "echo: r", "echo: q"]
    keys = [r.input_hash for r in first]
    assert len(set(keys)) == 4 and keys == [r.input_hash for r in again]  # one row each, found again in order
    assert not any(r.cached for r in first) and all(r.cached for r in again)
    assert store.open(store.locations()[0]).count() == 4
    with prepare_model(served(fake, temperature=1.0, seed=3), task="seeded", store=store) as seeded:
        answers = do_inference(seeded, ["q", "q"], return_top_logprobs=True, cache_metadata=ids(2))
    assert len(fake.completions()) == 5 and answers[0].input_hash == answers[1].input_hash  # a seed: alike, once


def test_a_refused_repeat_fails_in_the_callers_terms(store: Store, fake: FakeOpenAI) -> None:
    """Each failure, and the message, name the caller's input (and the sample its row would be)."""
    fake.context_length = 10
    model = prepare_model(served(fake, temperature=1.0), task="arena", store=store)
    with model, pytest.raises(RequestsFailedError) as raised:
        do_inference(model, ["short", "long " * 20, "long " * 20], cache_metadata=ids(3))
    assert [r.text for r in raised.value.responses] == ["echo: short", "", ""]
    assert [r.error is not None for r in raised.value.responses] == [False, True, True]
    assert sorted((f.request_index, f.sample_index) for f in raised.value.failures) == [(1, 0), (2, 1)]
    assert "request 2 (arena/2), sample 1" in str(raised.value)
    again = prepare_model(served(fake, temperature=1.0), task="arena", store=store)
    with again, pytest.raises(InvalidInputError, match=r"^request 2: "):  # an input that cannot be keyed, by its index
        do_inference(again, ["q", "q", "bad \ud800"], cache_metadata=ids(3))


def test_replay_answers_each_repeat_whose_sample_is_stored(store: Store, fake: FakeOpenAI) -> None:
    """A store that holds sample 0 only (asked once, or before repeats were samples) answers the first repeat."""
    with prepare_model(served(fake, temperature=1.0), task="arena", store=store) as model:
        do_inference(model, ["q"], cache_metadata=ids(1))
    with prepare_model(served(fake, temperature=1.0), task="arena", store=store, mode="replay") as replay:
        assert do_inference(replay, ["q"], cache_metadata=ids(1)) == ["echo: q"]
        with pytest.raises(CacheMissError) as missing:
            do_inference(replay, ["q", "q"], cache_metadata=ids(2))
    assert missing.value.missing_requests == (1,) and "request 1 (arena/1), sample 1" in str(missing.value)


def test_a_task_or_descriptor_of_the_wrong_type_is_refused_by_its_own_name(store: Store, fake: FakeOpenAI) -> None:
    """task=5 was blamed on the benchmark; a dict for a descriptor raised AttributeError (was)."""
    with pytest.raises(InvalidInputError, match="task must be a non-empty text, got 5"):
        prepare_model(served(fake), task=5, store=store)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="descriptor must be a ModelDescriptor, got dict"):
        store.database("completions", "t", {"provider": "vllm", "model": "x"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="task must be text, got int 5"):
        store.database("completions", 5, served(fake).descriptor)  # type: ignore[arg-type]
    assert not store.locations()
