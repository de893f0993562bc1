"""CachedChatModel: a real langchain-core chat model in front of the store, against the fake OpenAI server.

The same model over the tiny vLLM engine is in ``test_dropin_engine.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate

from inference import CachedModel, CompletionRequest, HostedSpec
from inference.langchain import CachedChatModel
from store import InvalidInputError, RowFilter, Selector, Store
from store.errors import CacheMissError, HostedRequestError, UnsupportedMessageError
from tests.fake_openai import FakeOpenAI

HISTORY = [
    SystemMessage("You are a judge."),
    HumanMessage("Turn 1?"),
    AIMessage("Answer 1."),
    HumanMessage("Which is better?"),
]
SAME_HISTORY = [
    {"role": "system", "content": "You are a judge."},
    {"role": "user", "content": "Turn 1?"},
    {"role": "assistant", "content": "Answer 1."},
    {"role": "user", "content": "Which is better?"},
]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI() as server:
        yield server


def served(fake: FakeOpenAI, **kw: Any) -> HostedSpec:
    return HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url, **kw)


def chat_model(fake: FakeOpenAI, store: Store, **kw: Any) -> CachedChatModel:
    spec_kw = {k: kw.pop(k) for k in ("sampling", "input_mode", "max_concurrency") if k in kw}
    return CachedChatModel(spec=served(fake, **spec_kw), store=store, **{"task": "arena", **kw})


def test_it_is_a_langchain_chat_model_and_a_second_batch_sends_nothing(store: Store, fake: FakeOpenAI) -> None:
    inputs = [f"question {i}" for i in range(5)]
    with chat_model(fake, store) as first:
        assert isinstance(first, BaseChatModel)
        answers = first.batch(inputs)
    assert [a.content for a in answers] == [f"echo: question {i}" for i in range(5)]
    assert len(fake.completions()) == 5
    with chat_model(fake, store) as second:
        again = second.batch(inputs)
        assert not second.cached.engine_loaded  # type: ignore[union-attr]
    assert len(fake.completions()) == 5  # the second batch sent no request
    assert [a.content for a in again] == [a.content for a in answers]
    assert all(a.response_metadata["judgestore"]["cached"] for a in again)
    assert not any(a.response_metadata["judgestore"]["cached"] for a in answers)


def test_abatch_sends_the_misses_concurrently(store: Store, fake: FakeOpenAI) -> None:
    fake.delay = 0.2
    inputs = [f"question {i}" for i in range(64)]
    with chat_model(fake, store) as chat:
        started = time.perf_counter()
        answers = asyncio.run(chat.abatch(inputs))
        seconds = time.perf_counter() - started
    print(f"abatch of 64 misses, server answering in 0.2 s: {seconds:.2f} s (one at a time: 12.8 s)")
    assert [a.content for a in answers] == [f"echo: question {i}" for i in range(64)]  # the caller's order
    assert seconds < 0.4 * 64 * 0.2
    assert 1 < fake.max_in_flight <= 8


def test_a_langchain_history_and_the_same_completion_request_are_one_row(store: Store, fake: FakeOpenAI) -> None:
    spec = served(fake)
    with spec.cached(store, task="arena") as model:
        (response,) = model.complete([CompletionRequest(messages=SAME_HISTORY)])
    with CachedChatModel(spec=spec, store=store, task="arena") as chat:
        message = chat.invoke(HISTORY)
        from_template = chat.invoke(
            ChatPromptTemplate.from_messages(
                [("system", "You are a {who}."), ("human", "Turn 1?"), ("ai", "Answer 1."), ("human", "{q}")]
            ).invoke({"who": "judge", "q": "Which is better?"})
        )
    judgestore = message.response_metadata["judgestore"]
    assert judgestore["input_hash"] == response.samples[0].input_hash
    assert judgestore["cached"] and from_template.response_metadata["judgestore"] == judgestore
    assert judgestore["descriptor_hash"] == spec.descriptor.sha256()
    assert len(fake.completions()) == 1
    assert fake.completions()[0].body["messages"] == SAME_HISTORY  # type: ignore[index]


def test_each_inputs_config_metadata_labels_its_row(store: Store, fake: FakeOpenAI) -> None:
    configs = [
        {"metadata": {"instruction_id": "7", "model_a": "x", "model_b": "y", "orientation": "direct", "other": 1}},
        {"metadata": {"instruction_id": "7", "model_a": "y", "model_b": "x", "orientation": "reversed"}},
        {"metadata": {"instruction_id": "8", "model_a": "x", "model_b": None}},
    ]
    with chat_model(fake, store, role="judgements") as judge:
        judge.batch(["[x first]", "[y first]", "[x alone]"], config=configs)  # type: ignore[arg-type]
    rows = sorted(
        store.query_rows(Selector(role="judgements", task="arena"), RowFilter(judge="fake-judge")),
        key=lambda r: r.record.completion,
    )
    seen = [(r.record.completion, r.record.model_a, r.record.model_b, r.record.orientation) for r in rows]  # type: ignore[union-attr]
    assert seen == [
        ("echo: [x alone]", "x", None, None),
        ("echo: [x first]", "x", "y", "direct"),
        ("echo: [y first]", "y", "x", "reversed"),
    ]


def test_a_refused_input_fails_alone(store: Store, fake: FakeOpenAI) -> None:
    fake.context_length = 10
    inputs = ["short one", "far " * 20, [HumanMessage("hi"), ToolMessage("42", tool_call_id="c")], "short two"]
    with chat_model(fake, store) as chat:
        outcomes = chat.batch(inputs, return_exceptions=True)
        assert isinstance(outcomes[1], HostedRequestError)  # the server refused it
        assert isinstance(outcomes[2], UnsupportedMessageError)  # never sent
        assert [o.content for o in (outcomes[0], outcomes[3])] == ["echo: short one", "echo: short two"]
        with pytest.raises(HostedRequestError):
            chat.batch(inputs[:2])  # without return_exceptions: raised after the batch
        assert chat.batch(["short one"])[0].response_metadata["judgestore"]["cached"]
    assert len(fake.completions()) == 4  # short one, the refused one, short two; then the refused one again


def test_call_time_sampling_is_refused_before_anything_is_sent(store: Store, fake: FakeOpenAI) -> None:
    with chat_model(fake, store, sampling={"stop": ["\n"]}) as chat:
        with pytest.raises(InvalidInputError, match="temperature"):
            chat.invoke("hi", temperature=0.7)
        with pytest.raises(InvalidInputError, match="stop"):
            chat.invoke("hi", stop=["###"])
        assert chat.invoke("hi", stop=["\n"]).content == "echo: hi"  # the spec's own stop is fine
    assert len(fake.completions()) == 1


def test_with_return_exceptions_a_batchs_bad_inputs_and_settings_fail_in_their_slots(
    store: Store, fake: FakeOpenAI
) -> None:
    """As LangChain's own batch does: the failure is each input's, not the call's (and nothing is sent for it)."""
    with chat_model(fake, store) as chat:
        outcomes = chat.batch(["one", 42, "two"], return_exceptions=True)  # type: ignore[list-item]
        assert isinstance(outcomes[1], UnsupportedMessageError) and "input 1" in str(outcomes[1])
        assert [outcomes[0].content, outcomes[2].content] == ["echo: one", "echo: two"]
        settings = chat.batch(["one", "three"], return_exceptions=True, temperature=0.7)
        assert all(isinstance(o, InvalidInputError) and "temperature" in str(o) for o in settings)
        assert len(settings) == 2
        later = asyncio.run(chat.abatch([42, "four"], return_exceptions=True, stop=["###"]))  # type: ignore[list-item]
        assert all(isinstance(o, InvalidInputError) and "stop" in str(o) for o in later)
        for bad in (lambda: chat.batch(["five", 42]), lambda: chat.batch(["five"], temperature=0.7)):  # type: ignore[list-item]
            with pytest.raises(InvalidInputError):
                bad()
    assert sorted(c.body["messages"][0]["content"] for c in fake.completions()) == ["one", "two"]  # type: ignore[index]


def test_answers_carry_usage_finish_reason_and_openais_logprobs(store: Store, fake: FakeOpenAI) -> None:
    with chat_model(fake, store, sampling={"logprobs": 3, "max_tokens": 2}) as chat:
        message = chat.invoke("a b c")
    assert message.content == "echo: a"
    assert message.response_metadata["finish_reason"] == "length"
    assert message.usage_metadata == {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    first = message.response_metadata["logprobs"]["content"][0]
    assert first["token"] == "echo:" and [t["token"] for t in first["top_logprobs"]] == ["echo:", "alt1", "alt2"]
    assert message.response_metadata["usage"]["engine_seconds"] >= 0


def test_a_hit_says_its_tokens_cost_nothing_now_as_langchains_own_cache_does(store: Store, fake: FakeOpenAI) -> None:
    from langchain_core.callbacks import get_usage_metadata_callback

    with chat_model(fake, store, sampling={"max_tokens": 2}) as chat:
        miss = chat.invoke("a b c")
        with get_usage_metadata_callback() as counted:
            hit = chat.invoke("a b c")
    assert miss.usage_metadata is not None and "total_cost" not in miss.usage_metadata
    assert hit.usage_metadata == {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5, "total_cost": 0}
    assert [usage["total_cost"] for usage in counted.usage_metadata.values()] == [0]


def test_stream_of_a_hit_yields_its_stored_text(store: Store, fake: FakeOpenAI) -> None:
    with chat_model(fake, store) as chat:
        fresh = "".join(str(c.content) for c in chat.stream("stream me"))
        chunks = list(chat.stream("stream me"))
    assert fresh == "echo: stream me" and len(chunks) == 1
    assert chunks[0].content == fresh and chunks[0].response_metadata["judgestore"]["cached"]
    assert len(fake.completions()) == 1


def test_stream_and_astream_label_their_row_from_the_config(store: Store, fake: FakeOpenAI) -> None:
    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kw: Any) -> None:
            self.tokens.append(token)

    async def astreamed(chat: CachedChatModel) -> list[Any]:
        return [c async for c in chat.astream("async s", config={"metadata": {"instruction_id": "8"}})]

    handler = Tokens()
    with chat_model(fake, store) as chat:
        chunks = list(chat.stream("sync s", config={"metadata": {"instruction_id": "7"}, "callbacks": [handler]}))
        (achunk,) = asyncio.run(astreamed(chat))
    assert [c.content for c in chunks] == ["echo: sync s"] and achunk.content == "echo: async s"
    assert handler.tokens == ["echo: sync s"]
    rows = store.query_rows(Selector(role="completions", task="arena"), RowFilter())
    assert sorted((r.record.completion, r.record.instruction_id) for r in rows) == [  # type: ignore[union-attr]
        ("echo: async s", "8"),
        ("echo: sync s", "7"),
    ]


def test_the_models_own_metadata_never_labels_a_row_on_any_path(store: Store, fake: FakeOpenAI) -> None:
    """A model built with ``metadata=`` (LangSmith tracing tags): streamed through ``stream_events`` (version v3)
    or called through ``generate``, its row took the model's instruction_id, not the call's (was)."""
    config = {"metadata": {"instruction_id": "q-17"}}
    with chat_model(fake, store, metadata={"instruction_id": "tracing-tag", "benchmark": "tag"}) as chat:
        chat.invoke("via invoke", config=config)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # version v3 is in beta
            assert chat.stream_events("via v3", config=config, version="v3").output.text == "echo: via v3"  # type: ignore[arg-type]
        chat.generate([[HumanMessage("via generate")]], metadata={"instruction_id": "q-17"})
    rows = store.query_rows(Selector(role="completions", task="arena"), RowFilter())
    assert sorted((r.record.completion, r.record.instruction_id, r.record.benchmark) for r in rows) == [  # type: ignore[union-attr]
        ("echo: via generate", "q-17", None),
        ("echo: via invoke", "q-17", None),
        ("echo: via v3", "q-17", None),
    ]


class Events(BaseCallbackHandler):
    """Records each run's events, in order: ("start", run id, messages), ("end", run id, text), ("error", ...)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, Any]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kw: Any) -> None:
        self.events.append(("start", run_id, messages[0]))

    def on_llm_end(self, response: Any, *, run_id: Any, **kw: Any) -> None:
        self.events.append(("end", run_id, response.generations[0][0].text))

    def on_llm_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
        self.events.append(("error", run_id, error))

    def runs(self) -> list[tuple[Any, Any]]:
        """(messages, how it ended: a text or an error) per run, each run started once and ended once."""
        started = [(run, messages) for kind, run, messages in self.events if kind == "start"]
        ended = {run: outcome for kind, run, outcome in self.events if kind != "start"}
        assert len(ended) == len(started) == len({run for run, _ in started})
        assert len(self.events) == 2 * len(started)
        return [(messages, ended[run]) for run, messages in started]


def test_every_run_carries_langchains_tracing_fields_of_the_model(store: Store, fake: FakeOpenAI) -> None:
    """LangSmith shows a run's provider and model from these fields; a run had none (was), but for stream."""
    seen: list[dict[str, Any]] = []

    class Metadata(BaseCallbackHandler):
        def on_chat_model_start(self, serialized: Any, messages: Any, *, metadata: Any = None, **kw: Any) -> None:
            seen.append(dict(metadata or {}))

    config: Any = {"callbacks": [Metadata()], "metadata": {"instruction_id": "7"}}
    with chat_model(fake, store, sampling={"temperature": 0.5, "max_tokens": 9}) as chat:
        chat.invoke("q", config)
        chat.batch(["q", "r"], config)
        asyncio.run(chat.abatch(["q"], config))
        list(chat.stream("s", config))
    assert len(seen) == 5
    for metadata in seen:
        assert metadata["instruction_id"] == "7" and metadata["ls_model_type"] == "chat"
        assert (metadata["ls_provider"], metadata["ls_model_name"]) == ("vllm-server", "fake-judge")
        assert (metadata["ls_temperature"], metadata["ls_max_tokens"]) == (0.5, 9)


def test_answers_carry_the_id_langchains_own_models_give(store: Store, fake: FakeOpenAI) -> None:
    """Answers had id None (was): LangChain's generate names each answer after its run, and code that keeps or
    removes messages by id relies on it."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    run_id = uuid.uuid4()
    theirs = FakeListChatModel(responses=["x"]).invoke("q", {"run_id": run_id}).id
    with chat_model(fake, store) as chat:
        ours = chat.invoke("q", {"run_id": run_id}).id
        batched = [a.id for a in chat.batch(["q", "r", "s"])]
        hits = [a.id for a in asyncio.run(chat.abatch(["q", "r"]))]
    assert ours == theirs == f"lc_run--{run_id}-0"
    assert all(i is not None and i.startswith("lc_run--") for i in batched + hits)
    assert len(set(batched + hits)) == 5  # one run each, the hits' too


def test_callbacks_see_one_run_per_input(store: Store, fake: FakeOpenAI) -> None:
    handler = Events()
    with chat_model(fake, store) as chat:
        outcomes = chat.batch(
            ["one", "two", [ToolMessage("x", tool_call_id="c")], "three"],
            {"callbacks": [handler]},
            return_exceptions=True,
        )
        fake.context_length = 2
        refused = chat.batch(["far too long for it"], {"callbacks": [handler]}, return_exceptions=True)
    assert isinstance(outcomes[2], UnsupportedMessageError) and "input 2" in str(outcomes[2])
    ended = {str(messages[0].content): outcome for messages, outcome in handler.runs()}
    assert len(ended) == 5
    assert [ended[q] for q in ("one", "two", "three")] == ["echo: one", "echo: two", "echo: three"]
    assert ended["x"] is outcomes[2]  # an input judgestore cannot key has its run too, ended in its error
    assert ended["far too long for it"] is refused[0]  # so has a request that fails


def test_an_input_that_cannot_be_keyed_has_its_run_started_and_ended_in_its_error_on_every_path(
    store: Store, fake: FakeOpenAI
) -> None:
    """As LangChain's BaseChatModel ends a run whose generation raised: tracers see the input and why it failed."""
    extra = [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}]

    async def both_async(chat: CachedChatModel, config: Any) -> list[BaseException]:
        raised = []
        with pytest.raises(UnsupportedMessageError) as ainvoked:
            await chat.ainvoke(extra, config)  # type: ignore[arg-type]
        raised.append(ainvoked.value)
        with pytest.raises(UnsupportedMessageError) as astreamed:
            async for _ in chat.astream(42, config):  # type: ignore[arg-type]
                pass
        raised.append(astreamed.value)
        (abatched,) = await chat.abatch([42], config, return_exceptions=True)  # type: ignore[list-item]
        raised.append(abatched)
        return raised

    handler = Events()
    config: Any = {"callbacks": [handler], "run_name": "judge"}
    with chat_model(fake, store) as chat:
        raised = []
        for bad in (lambda: chat.invoke(extra, config), lambda: list(chat.stream(42, config))):  # type: ignore[arg-type]
            with pytest.raises(UnsupportedMessageError) as refused:
                bad()
            raised.append(refused.value)
        with pytest.raises(UnsupportedMessageError) as batched:
            chat.batch(["fine", 42], config)  # type: ignore[list-item]
        raised.append(batched.value)
        raised += asyncio.run(both_async(chat, config))
    runs = handler.runs()
    assert [outcome for _, outcome in runs] == raised  # each its own run, ended in the error its caller got
    assert "cache_control" in str(raised[0]) and "input 1" in str(raised[2])
    # the run shows LangChain's own reading of the input when it has one, else no message
    assert [[m.content for m in messages] for messages, _ in runs] == [["hi"], [], [], ["hi"], [], []]
    assert fake.completions() == []  # nothing was sent, "fine" neither: without return_exceptions it is raised first


def test_a_batch_repeating_an_input_at_a_random_sampling_gives_each_repeat_its_own_sample(
    store: Store, fake: FakeOpenAI
) -> None:
    """LangChain's own batch calls the model once per input; the repeats were one request (was). In replay, a miss
    after repeats fails in its own slot, the repeats answered from the store."""
    with chat_model(fake, store, sampling={"temperature": 0.7}) as chat:
        answers = chat.batch(["same", "other", "same", "same"])
        again = asyncio.run(chat.abatch(["same", "same", "same"]))
    keys = [a.response_metadata["judgestore"]["input_hash"] for a in answers]
    assert len(fake.completions()) == 4 and len(set(keys)) == 4
    assert [a.response_metadata["judgestore"]["input_hash"] for a in again] == [keys[0], keys[2], keys[3]]
    with chat_model(fake, store, sampling={"temperature": 0.7}, mode="replay") as replay:
        outcomes = replay.batch(["same", "same", "new"], return_exceptions=True)
        once = replay.batch(["other", "other"], return_exceptions=True)  # "other" was asked once: sample 0 only
    assert [o.content for o in outcomes[:2]] == ["echo: same", "echo: same"]  # type: ignore[union-attr]
    assert isinstance(outcomes[2], CacheMissError) and len(fake.completions()) == 4
    assert once[0].content == "echo: other" and isinstance(once[1], CacheMissError)  # type: ignore[union-attr]


def test_replay_answers_the_hits_and_fails_each_miss_in_its_slot(store: Store, fake: FakeOpenAI) -> None:
    """As LangChain's own batch: with return_exceptions each miss's error in its slot, else the first raised."""
    with chat_model(fake, store) as filling:
        filling.batch(["held one", "held two"])
    inputs = ["held one", "new one", "held two", "new one", "new two"]
    handler = Events()
    with chat_model(fake, store, mode="replay") as replay:
        outcomes = replay.batch(inputs, {"callbacks": [handler]}, return_exceptions=True)
        aoutcomes = asyncio.run(replay.abatch(inputs, return_exceptions=True))
        for answered in (outcomes, aoutcomes):
            assert [answered[0].content, answered[2].content] == ["echo: held one", "echo: held two"]
            assert all(answered[i].response_metadata["judgestore"]["cached"] for i in (0, 2))
            misses = [answered[i] for i in (1, 3, 4)]
            assert all(isinstance(m, CacheMissError) for m in misses)
            assert all("3 of the 5 inputs of this call are not in the store" in str(m) for m in misses)
            assert "'new two'" in str(misses[2])
        assert [outcome for _, outcome in handler.runs()] == [
            "echo: held one",
            outcomes[1],
            "echo: held two",
            outcomes[3],
            outcomes[4],
        ]
        with pytest.raises(CacheMissError, match=r"3 of the 5 inputs .* \('new one'\)"):
            replay.batch(inputs)
        with pytest.raises(CacheMissError, match="1 of the 1 inputs"):
            asyncio.run(replay.ainvoke("new one"))
        assert replay.batch(["held two"])[0].content == "echo: held two"
        assert not replay.cached.engine_loaded  # type: ignore[union-attr]
    assert len(fake.completions()) == 2  # the filling batch's: replay never called the model


def test_replay_answers_the_hits_from_the_lookup_that_found_the_misses(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One lookup a call: the hits come with the misses' error. (The hits were looked up again after the first
    misses, and a repeat after a missing one renumbered to that one's missing sample: two misses for one.)"""
    with chat_model(fake, store) as filling:
        held = filling.batch(["held one", "held two"])
    inputs = ["held one", "new one", "held two"]
    with chat_model(fake, store, mode="replay") as replay:
        model = replay.cached
        assert model is not None
        calls: list[int] = []
        complete, acomplete = model.complete, model.acomplete

        def counted(*args: Any, **kw: Any) -> Any:
            calls.append(len(args[0]))
            return complete(*args, **kw)

        async def acounted(*args: Any, **kw: Any) -> Any:
            calls.append(len(args[0]))
            return await acomplete(*args, **kw)

        monkeypatch.setattr(model, "complete", counted)
        monkeypatch.setattr(model, "acomplete", acounted)
        handler = Events()
        outcomes = replay.batch(inputs, {"callbacks": [handler]}, return_exceptions=True)
        aoutcomes = asyncio.run(replay.abatch(inputs, return_exceptions=True))
    assert calls == [3, 3]
    for answered in (outcomes, aoutcomes):
        assert [answered[0].content, answered[2].content] == [h.content for h in held]  # type: ignore[union-attr]
        assert isinstance(answered[1], CacheMissError)
        assert "1 of the 3 inputs of this call are not in the store" in str(answered[1]) and "'new one'" in str(
            answered[1]
        )
    assert [outcome for _, outcome in handler.runs()] == ["echo: held one", outcomes[1], "echo: held two"]
    with chat_model(fake, store, sampling={"temperature": 0.7}) as sampled:  # samples 0, 1 and 2 of "same"
        keys = [a.response_metadata["judgestore"]["input_hash"] for a in sampled.batch(["same"] * 3)]
    database = store.database("completions", "arena", sampled.cached.descriptor)  # type: ignore[union-attr]
    database.delete(RowFilter(input_hashes=(keys[1],)))  # sample 1 is gone
    with chat_model(fake, store, sampling={"temperature": 0.7}, mode="replay") as replay:
        repeats = replay.batch(["same"] * 3, return_exceptions=True)
    assert isinstance(repeats[1], CacheMissError)
    assert [repeats[i].response_metadata["judgestore"]["input_hash"] for i in (0, 2)] == [keys[0], keys[2]]  # type: ignore[union-attr]


def test_a_configs_max_concurrency_bounds_the_calls_requests_in_flight(store: Store, fake: FakeOpenAI) -> None:
    """LangChain's max_concurrency: the server sees at most min(it, the model's own) of the call's requests at once."""
    fake.delay = 0.1
    with chat_model(fake, store, max_concurrency=4) as chat:
        answers = chat.batch([f"q {i}" for i in range(8)], config={"max_concurrency": 2})
        assert [a.content for a in answers] == [f"echo: q {i}" for i in range(8)]
        assert fake.max_in_flight == 2  # the call's bound, and no lower: its requests still go out together
        fake.max_in_flight = 0
        configs: Any = [{"max_concurrency": 3}, {"max_concurrency": 1}, {}, {}, {}, {}, {}, {}]
        asyncio.run(chat.abatch([f"a {i}" for i in range(8)], configs))  # the first config's, as LangChain reads it
        assert fake.max_in_flight == 3
        fake.max_in_flight = 0
        chat.batch([f"b {i}" for i in range(8)], config={"max_concurrency": 100})
        assert fake.max_in_flight == 4  # the model's own bound still holds
        for bad in (0, "2"):
            with pytest.raises(InvalidInputError, match="max_concurrency must be an integer"):
                chat.batch(["never sent"], config={"max_concurrency": bad})  # type: ignore[typeddict-item]
    assert len(fake.completions()) == 24


def test_ainvoke_a_chain_and_a_text_model(store: Store, fake: FakeOpenAI) -> None:
    prompt = ChatPromptTemplate.from_messages([("human", "Rate {answer}")])
    with chat_model(fake, store) as chat:
        chain = prompt | chat
        assert chain.invoke({"answer": "this"}).content == "echo: Rate this"
        assert asyncio.run(chat.ainvoke("async hi")).content == "echo: async hi"
    with chat_model(fake, store, input_mode="text") as text:
        assert text.invoke("plain prompt").content == "echo: plain prompt"
        with pytest.raises(UnsupportedMessageError, match="text input"):
            text.invoke([SystemMessage("s"), HumanMessage("h")])
    assert fake.completions()[-1].path.endswith("/v1/completions")


def test_generate_reports_what_its_call_did(store: Store, fake: FakeOpenAI) -> None:
    with chat_model(fake, store) as chat:
        chat.batch(["seen"])
        result = chat.generate([[HumanMessage("seen")], [HumanMessage("new")]])
    assert [g[0].text for g in result.generations] == ["echo: seen", "echo: new"]
    assert result.llm_output is not None
    summary = result.llm_output["judgestore"]
    assert (summary["hits"], summary["misses"], summary["written"]) == (1, 1, 1)


def test_it_wraps_a_cached_model_and_refuses_half_a_spec(store: Store, fake: FakeOpenAI) -> None:
    model = CachedModel(store, served(fake).descriptor, task="arena", backend_factory=served(fake).backend)
    with CachedChatModel(cached=model) as chat:
        assert chat.invoke("wrapped").content == "echo: wrapped"
    with pytest.raises(InvalidInputError, match="needs task"):  # typed, not pydantic's ValidationError
        CachedChatModel(spec=served(fake), store=store)
    with pytest.raises(InvalidInputError, match="not both"):
        CachedChatModel(spec=served(fake), cached=model, task="arena")
    with pytest.raises(InvalidInputError, match=r"\['mode', 'task'\] would be ignored"):
        CachedChatModel(cached=model, task="other", mode="replay")  # the cached model's are "arena" and "use"


def test_every_path_refuses_what_cannot_be_keyed_before_langchain_could_drop_it(store: Store, fake: FakeOpenAI) -> None:
    """LangChain's own coercion moves a dict's unknown keys out of sight: the model reads the input first."""
    from langchain_core.messages import AIMessageChunk, messages_to_dict
    from pydantic import BaseModel

    class Verdict(BaseModel):
        winner: str

    with chat_model(fake, store) as chat:
        streamed = None
        for chunk in chat.stream([HumanMessage("hello")]):
            streamed = chunk if streamed is None else streamed + chunk
        assert isinstance(streamed, AIMessageChunk)
        assert chat.invoke([HumanMessage("hello"), streamed, HumanMessage("next")]).content == "echo: next"
        assert chat.invoke(messages_to_dict([HumanMessage("as dicts")])).content == "echo: as dicts"
        kept = len(fake.completions())
        extra = [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}]
        outcomes = chat.batch([extra, "fine"], return_exceptions=True)
        assert isinstance(outcomes[0], UnsupportedMessageError) and "cache_control" in str(outcomes[0])
        for bad in (lambda: chat.invoke(extra), lambda: chat.invoke(42), lambda: list(chat.stream(None))):  # type: ignore[arg-type]
            with pytest.raises(UnsupportedMessageError):
                bad()
        for unsupported in (lambda: chat.bind_tools([Verdict]), lambda: chat.with_structured_output(Verdict)):
            with pytest.raises(InvalidInputError, match="tools and structured output"):
                unsupported()
    assert [c.body["messages"][-1]["content"] for c in fake.completions()[kept:]] == ["fine"]  # type: ignore[index]


def test_a_metadata_key_spelt_almost_like_a_row_field_is_warned_of_and_the_row_still_written(
    store: Store, fake: FakeOpenAI
) -> None:
    from inference.langchain.shapes import MetadataKeyWarning

    with chat_model(fake, store) as chat, pytest.warns(MetadataKeyWarning, match="did you mean 'instruction_id'"):
        chat.invoke("spelt", config={"metadata": {"instruction_idd": "7", "tags_of_mine": "x"}})
    (row,) = store.database("completions", "arena", chat.cached.descriptor).query()  # type: ignore[union-attr]
    assert row.completion == "echo: spelt" and row.instruction_id is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # LangChain's own keys, and far-off ones, say nothing
        with chat_model(fake, store) as chat:
            chat.invoke("other", config={"metadata": {"instruction_id": "8", "ls_provider": "x", "run": "r"}})


def test_a_judge_field_sent_to_a_completions_model_is_warned_of(store: Store, fake: FakeOpenAI) -> None:
    from inference.langchain.shapes import MetadataKeyWarning

    judged = {"instruction_id": "1", "model_a": "x", "model_b": "y", "orientation": "direct"}
    told = "built with role='judgements'"
    with chat_model(fake, store) as chat, pytest.warns(MetadataKeyWarning, match=told) as seen:
        chat.batch(["verdict?"], config=[{"metadata": judged}])
    assert sorted(str(w.message).split("'")[1] for w in seen) == ["model_a", "model_b", "orientation"]
    (row,) = store.database("completions", "arena", chat.cached.descriptor).query()  # type: ignore[union-attr]
    assert row.instruction_id == "1"  # the completions field is still stored
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same keys to a judge are its row's
        with chat_model(fake, store, role="judgements") as judge:
            judge.batch(["verdict?"], config=[{"metadata": judged}])
    with chat_model(fake, store, role="judgements") as judge, pytest.warns(MetadataKeyWarning, match="as model_a"):
        judge.invoke("which?", config={"metadata": {"model": "gpt-4o"}})  # a completions field, to a judge


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        # not taken: pydantic dropped them, and temperature=0.7 answered greedily (was)
        ({"temperature": 0.7}, r"does not take \['temperature'\].*sampling="),
        ({"max_tokens": 5}, r"does not take \['max_tokens'\]"),
        ({"rol": "judgements"}, r"does not take \['rol'\]"),
        ({"model_name": "gpt-4o"}, r"does not take \['model_name'\]"),
        # wrong-typed: pydantic's ValidationError and its link (was)
        ({"role": "judgment"}, "CachedChatModel: role: "),
        ({"mode": "replya"}, "CachedChatModel: mode: "),
        ({"disable_streaming": "sometimes"}, r"CachedChatModel: disable_streaming\."),
    ],
)
def test_a_setting_the_constructor_cannot_take_is_a_typed_error_naming_it(
    store: Store, fake: FakeOpenAI, settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(InvalidInputError, match=said) as refused:
        chat_model(fake, store, **settings)
    assert "pydantic" not in str(refused.value)
    assert len(fake.completions()) == 0


def test_output_version_v1_gives_content_blocks_on_every_path(store: Store, fake: FakeOpenAI) -> None:
    blocks = [{"type": "text", "text": "echo: q one"}]
    with chat_model(fake, store, output_version="v1") as chat:
        invoked = chat.invoke("q one")  # a miss, then hits on the other paths
        batched = chat.batch(["q one"])
        streamed = list(chat.stream("q one"))
        awaited = asyncio.run(chat.ainvoke("q one"))
    for message in (invoked, *batched, awaited, *streamed):
        assert [{k: b[k] for k in ("type", "text")} for b in message.content] == blocks  # type: ignore[index, union-attr]
    assert invoked.response_metadata["output_version"] == "v1"
    with chat_model(fake, store, output_version="v1") as chat:  # an answer put back into the history keys as text
        history = [HumanMessage("q one"), chat.invoke("q one"), HumanMessage("q two")]
        again = chat.invoke(history)
    with chat_model(fake, store) as plain:
        assert (
            plain.invoke([HumanMessage("q one"), AIMessage("echo: q one"), HumanMessage("q two")]).response_metadata[
                "judgestore"
            ]["input_hash"]
            == again.response_metadata["judgestore"]["input_hash"]
        )
    with chat_model(fake, store) as plain:
        assert plain.invoke("q one").content == "echo: q one"


def test_configurable_fields_is_refused_when_asked_and_configurable_alternatives_picks_a_built_model(
    store: Store, fake: FakeOpenAI
) -> None:
    from langchain_core.runnables import ConfigurableField

    with chat_model(fake, store) as arena, chat_model(fake, store, task="other") as other:
        # LangChain would build the configured copy from this model's spec and its built cached model together,
        # at the first call ("takes a spec ... or a cached model, not both"): refused here, naming the way that works.
        with pytest.raises(InvalidInputError, match=r"\(task asked for\).*configurable_alternatives"):
            arena.configurable_fields(task=ConfigurableField(id="task"))
        assert arena.invoke("still the same").content == "echo: still the same"  # the refusal changed nothing
        chooser = arena.configurable_alternatives(ConfigurableField(id="task"), default_key="arena", other=other)
        by_default = chooser.invoke("picked")
        chosen = chooser.with_config(configurable={"task": "other"}).invoke("picked")
        again = chooser.with_config(configurable={"task": "other"}).invoke("picked")
    assert by_default.content == chosen.content == "echo: picked"
    assert not chosen.response_metadata["judgestore"]["cached"] and again.response_metadata["judgestore"]["cached"]
    assert len(fake.completions()) == 3  # "still the same", then "picked" once per task
    tasks = {
        task: sorted(
            row.record.completion for row in store.query_rows(Selector(role="completions", task=task), RowFilter())
        )
        for task in ("arena", "other")
    }
    assert tasks == {"arena": ["echo: picked", "echo: still the same"], "other": ["echo: picked"]}
