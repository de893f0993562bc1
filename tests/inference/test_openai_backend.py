"""The OpenAI-compatible backend against a fake server on loopback, through the real ``openai`` client.

Every fault a hosted API shows (429 with Retry-After, 5xx, timeouts, refused
keys, unknown models, malformed bodies, a killed run) is injected at the
server (``tests/fake_openai.py``) and counted there, so "retried", "not
retried" and "sent only what was left" are counts of HTTP requests, not
assumptions. The same backend against a real ``vllm serve`` is in
``test_openai_server.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from inference.backends.base import EngineRequest
from inference.backends.hosted.client import RetryPolicy
from inference.backends.hosted.wire import generation_from_body, request_body
from inference.judging import pairwise_requests
from inference.requests import CompletionRequest
from inference.spec import HostedSpec
from store import logprobs
from store.descriptor import ModelDescriptor
from store.errors import (
    HostedAPIError,
    HostedAuthError,
    HostedModelNotFoundError,
    HostedNotFoundError,
    HostedRequestError,
    HostedResponseError,
    HostedUnavailableError,
    RequestsFailedError,
)
from store.store import Store
from tests.fake_openai import FakeOpenAI, Fault
from tests.inference.conftest import REPO_ROOT

pytest.importorskip("openai", reason="the hosted backend needs the openai client (pip install 'openai>=1.50')")

FAST_RETRIES = RetryPolicy(max_retries=3, base_s=0.01, max_s=0.05)
KEY = "sk-test-DO-NOT-LEAK-0123456789abcdefXYZ"


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def served(fake: FakeOpenAI, **kw: Any) -> HostedSpec:
    settings: dict[str, Any] = {
        "model": "fake-judge",
        "provider": "vllm-server",
        "base_url": fake.base_url,
        "retry": FAST_RETRIES,
        "timeout_s": 5.0,
        **kw,
    }
    return HostedSpec(**settings)


def ask(i: int) -> CompletionRequest:
    return CompletionRequest(
        messages=[{"role": "user", "content": f"question {i}"}], benchmark="b", instruction_id=str(i)
    )


def stored(store: Store, spec: HostedSpec, task: str = "t") -> int:
    """The completions stored for ``spec`` under ``task`` (0 when its database was never made)."""
    database = store.find("completions", task, spec.descriptor)
    return 0 if database is None else database.count()


# ------------------------------------------------------------------ the happy path


def test_only_misses_are_sent_and_a_rerun_sends_nothing(store: Store, fake: FakeOpenAI) -> None:
    spec = served(fake, sampling={"logprobs": 3, "max_tokens": 5})
    first = spec.cached(store, task="t").complete([ask(i) for i in range(6)])
    assert len(fake.completions()) == 6 and not any(r.cached for r in first)
    again = spec.cached(store, task="t").complete([ask(i) for i in range(8)])
    assert len(fake.completions()) == 8  # only the two new ones
    assert [r.cached for r in again] == [True] * 6 + [False] * 2
    assert [(r.text, r.samples[0].top_logprobs) for r in again[:6]] == [
        (r.text, r.samples[0].top_logprobs) for r in first
    ]
    usage = first[0].samples[0].usage
    assert first[0].text == "echo: question 0" and usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (2, 3) and usage["engine_seconds"] >= 0
    assert spec.stats.as_dict() == {"requests_sent": 8, "retries": 0, "prompt_tokens": 16, "completion_tokens": 24}


def test_judgements_go_through_the_same_boundary(store: Store, fake: FakeOpenAI) -> None:
    spec = served(fake, label="fake-judge-v1", sampling={"logprobs": 2, "max_tokens": 4})
    requests = pairwise_requests(question="2+2?", model_a="m-a", answer_a="4", model_b="m-b", answer_b="5")
    verdicts = spec.cached(store, task="arena").judge(requests)
    assert len(fake.completions()) == 2 and all(v.samples[0].text_logprobs() for v in verdicts)
    rows = {r.orientation: r for r in store.database("judgements", "arena", spec.descriptor).query()}
    assert (rows["reversed"].model_a, rows["reversed"].judge) == ("m-b", "fake-judge-v1")
    assert all(r.cached for r in spec.cached(store, task="arena").judge(requests))
    assert len(fake.completions()) == 2


def test_at_most_max_concurrency_requests_are_in_flight(store: Store, fake: FakeOpenAI) -> None:
    fake.delay = 0.1
    served(fake, max_concurrency=3).cached(store, task="t").complete([ask(i) for i in range(9)])
    # Three at once (one by one would be 1), never more; the server counts, so a loaded machine cannot fake it.
    assert fake.max_in_flight == 3


def test_what_is_sent_is_the_descriptor(fake: FakeOpenAI) -> None:
    spec = served(fake, sampling={"seed": 7, "stop": "\n", "logprobs": 2, "top_k": 20, "ignore_eos": True})
    request = EngineRequest({"type": "messages", "messages": [{"role": "user", "content": "hi"}]}, sample_index=3)
    assert request_body(spec.descriptor, request) == {
        "model": "fake-judge",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.0,
        "max_tokens": 256,
        "top_p": 1.0,  # a vllm-server is sent every setting: its generation_config would fill the gaps
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "seed": 10,  # seed + sample index
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 3,  # one more than kept: vLLM's chat list puts the sampled token first, cut at K
        "ignore_eos": True,  # an unknown setting is sent as it is (and is in the key)
    }
    openai = HostedSpec(model="gpt-4o-2024-08-06", sampling={"temperature": 0.5}).descriptor
    assert request_body(openai, EngineRequest({"type": "messages", "messages": []})) == {
        "model": "gpt-4o-2024-08-06",
        "messages": [],
        "temperature": 0.5,
        "max_completion_tokens": 256,  # OpenAI's chat API refuses max_tokens for newer models
    }


@pytest.mark.parametrize(("provider", "k"), [("vllm-server", 20), ("vllm-server", 3), ("openai", 20)])
def test_logprobs_keep_the_k_best_and_never_a_sampled_token_a_vllm_list_may_have_pushed_in(
    provider: str, k: int
) -> None:
    """vLLM's chat list puts the sampled token first and is cut at what was asked: at its limit of 20 (no K + 1
    to ask), a sampled token sorting 20th may be from outside the top 20, and was stored as rank 20 (was)."""
    descriptor = HostedSpec(
        model="gpt-4o-2024-08-06",
        provider=provider,
        base_url="http://127.0.0.1:1/v1",
        sampling={"logprobs": k, "temperature": 1.0},
    ).descriptor

    def token(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def body(listed: list[dict[str, Any]], sampled: dict[str, Any]) -> dict[str, Any]:
        content = [{**sampled, "top_logprobs": listed}]
        return {"choices": [{"message": {"content": "x"}, "finish_reason": "length", "logprobs": {"content": content}}]}

    best = [token(f"t{i}", -0.1 * (i + 1)) for i in range(k)]  # the model's true top k, best first
    low = token("rare", -9.6)
    at_limit = provider == "vllm-server" and k == 20  # asked for k, not k + 1: the list holds k
    cases = [  # (what the server lists, the sampled token, the candidates stored)
        ([low, *best[: k - 1]], low, k - 1)
        if at_limit
        else ([low, *best] if provider == "vllm-server" else best, low, k),
        ([best[1], best[0], *best[2:]], best[1], k),  # sampled second: listed first, ranked second
    ]
    for listed, sampled, kept in cases:
        (position,) = logprobs.decode(generation_from_body(descriptor, body(listed, sampled)).top_logprobs)
        assert [c.text for c in position.candidates] == [t["token"] for t in best[:kept]]
        assert [c.rank for c in position.candidates] == list(range(1, kept + 1))
        assert position.sampled is not None
        assert position.sampled.rank == (None if sampled is low else 2)


# ------------------------------------------------------------------ retries


def test_a_429_waits_at_least_its_retry_after(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=429, headers={"Retry-After": "1"}))
    spec = served(fake)
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    first, second = fake.completions()
    assert second.at - first.at >= 0.95  # the backoff alone would be 10 ms: Retry-After is a floor
    assert response.text == "echo: question 0" and spec.stats.retries == 1


def test_a_retry_after_longer_than_judgestore_waits_is_an_error_not_a_silent_hour(
    store: Store, fake: FakeOpenAI
) -> None:
    fake.add_fault(Fault(status=429, headers={"Retry-After": "3600"}))
    with pytest.raises(HostedUnavailableError, match="Retry-After 3600 s"):
        served(fake).cached(store, task="t").complete([ask(0)])
    assert len(fake.completions()) == 1


def test_a_500_then_success_is_retried(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=500))
    fake.add_fault(Fault(status=503))
    spec = served(fake)
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    assert response.text == "echo: question 0" and len(fake.completions()) == 3 and spec.stats.retries == 2


def test_5xx_that_outlasts_the_retries_is_a_typed_error(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=502, times=100))
    with pytest.raises(HostedUnavailableError, match="HTTP 502, still after 3 retries"):
        served(fake).cached(store, task="t").complete([ask(0)])
    assert len(fake.completions()) == 4


def test_an_answer_without_the_logprobs_the_servers_other_answers_carry_is_retried_then_fails_alone(
    store: Store, fake: FakeOpenAI
) -> None:
    """One answer came back without logprobs (a gap in a proxy, a server): it was stored so, a hit without them for
    good, every rerun silent (was). A server that never gives them still has its answers stored, with a warning."""
    fake.add_fault(Fault(status=200, choice={"logprobs": None}, times=1, body_contains='question 2"'))
    spec = served(fake, max_concurrency=1, sampling={"logprobs": 2})
    answers = spec.cached(store, task="t").complete([ask(i) for i in range(4)])
    assert all(a.samples[0].top_logprobs is not None for a in answers)  # the gap was retried, not stored
    assert spec.stats.retries == 1 and stored(store, spec) == 4

    fake.add_fault(Fault(status=200, choice={"logprobs": None}, times=100, body_contains='question 6"'))
    with pytest.raises(RequestsFailedError, match=r"1 of 4 inputs") as raised:
        spec.cached(store, task="t").complete([ask(i) for i in range(4, 8)])
    (failure,) = raised.value.failures
    assert failure.request_index == 2 and "no logprobs, where the server's other answers" in str(failure.error)
    assert "fails alone" in str(failure.error) and stored(store, spec) == 7


def test_a_request_that_outlasts_its_retries_where_the_server_answers_others_fails_alone(
    store: Store, fake: FakeOpenAI
) -> None:
    """Was: one input the server cannot serve (a 500 each time) stopped the batch: no request started after it, and
    every rerun met it again before the rest."""
    fake.add_fault(Fault(status=500, times=100, body_contains='question 3"'))
    spec = served(fake, max_concurrency=1)  # one at a time: no other answer while it is retried
    batch = [ask(i) for i in range(8)]
    with pytest.raises(RequestsFailedError, match=r"1 of 8 inputs") as raised:
        spec.cached(store, task="t").complete(batch)
    (failure,) = raised.value.failures
    assert failure.request_index == 3 and isinstance(failure.error, HostedUnavailableError)
    assert "HTTP 500, still after 3 retries" in str(failure.error) and "fails alone" in str(failure.error)
    assert [r.error is None for r in raised.value.responses] == [True] * 3 + [False] + [True] * 4
    assert stored(store, spec) == 7 and len(fake.completions()) == 7 + 4
    # The rerun sends that one only; with no other answer from the server meanwhile, it may be down: the error stops
    with pytest.raises(HostedUnavailableError, match="HTTP 500, still after 3 retries"):
        spec.cached(store, task="t").complete(batch)
    assert len(fake.completions()) == 11 + 4


def test_an_input_of_several_samples_the_server_always_fails_on_fails_alone_and_the_rest_is_stored(
    store: Store, fake: FakeOpenAI
) -> None:
    """Its samples went out first, together, and filled every slot: no other answer came while they were retried, so
    the run stopped at them, and every rerun again (was). Every input's first sample now goes before any second."""
    fake.add_fault(Fault(status=500, times=1000, body_contains='question 1"'))
    # One at a time: in input order its three samples would fail one after another, nothing answered between.
    # (Two in flight raced: the other slot's answers against its retries' jitter, and failed 1 run in 8.)
    spec = served(fake, max_concurrency=1)
    batch = [CompletionRequest(messages=[{"role": "user", "content": f"question {i}"}], n=3) for i in range(5)]
    with pytest.raises(RequestsFailedError, match=r"3 of 15 inputs") as raised:
        spec.cached(store, task="t").complete(batch)
    assert {f.request_index for f in raised.value.failures} == {1}
    assert stored(store, spec) == 12  # every other input's samples


def test_a_rate_limit_that_outlasts_the_retries_stops_the_batch_though_others_were_answered(
    store: Store, fake: FakeOpenAI
) -> None:
    fake.add_fault(Fault(status=429, times=100, body_contains='question 3"'))
    spec = served(fake, max_concurrency=1)
    with pytest.raises(HostedUnavailableError, match="HTTP 429, still after 3 retries"):
        spec.cached(store, task="t").complete([ask(i) for i in range(8)])
    assert stored(store, spec) == 3 and len(fake.completions()) == 3 + 4  # nothing sent after it


def test_a_server_that_goes_down_stops_the_batch_after_one_request_fails_alone(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=503, times=1000, after=2))  # two answers, then every request a 503
    spec = served(fake, max_concurrency=1)
    with pytest.raises(HostedUnavailableError, match="HTTP 503, still after 3 retries") as raised:
        spec.cached(store, task="t").complete([ask(i) for i in range(10)])
    assert "fails alone" not in str(raised.value) and raised.value.rows_kept == 2
    assert "This call stored 2 rows before the failure" in "".join(raised.value.__notes__)
    # the third failed alone (the server had answered since), the fourth met no answer since: no fifth was sent
    assert len(fake.completions()) == 2 + 4 + 4 and stored(store, spec) == 2


def test_a_malformed_body_after_answers_is_retried_and_one_that_persists_fails_alone(
    store: Store, fake: FakeOpenAI
) -> None:
    """Was: a body cut short by a proxy, once, stopped the batch ("Is the base URL an OpenAI-compatible API?")."""
    fake.add_fault(Fault(status=200, body=b'{"choices": [{"message": {"content": "cut', after=1))
    spec = served(fake, max_concurrency=1)
    responses = spec.cached(store, task="t").complete([ask(i) for i in range(4)])
    assert all(r.error is None for r in responses) and spec.stats.retries == 1 and stored(store, spec) == 4
    fake.add_fault(Fault(status=200, times=100, body=b"<html>oops</html>", body_contains='question 5"'))
    with pytest.raises(RequestsFailedError, match=r"1 of 3 inputs") as raised:
        spec.cached(store, task="t").complete([ask(i) for i in range(4, 7)])
    (failure,) = raised.value.failures
    assert failure.request_index == 1 and isinstance(failure.error, HostedResponseError)
    assert "a body that is not a completion" in str(failure.error) and "fails alone" in str(failure.error)
    assert stored(store, spec) == 6


def test_an_answer_from_another_model_than_the_one_asked_for_is_said_once(
    store: Store, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: stored under the model asked for without a word (a router's fallback)."""
    body = {"id": "x", "object": "chat.completion", "created": 0, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
    for name in ("fake-judge-2024-08-06", "org/Fake-Judge"):  # a dated version, the org named: the same model
        fake.add_fault(Fault(status=200, body=json.dumps({**body, "model": name}).encode()))
    fake.add_fault(Fault(status=200, times=2, body=json.dumps({**body, "model": "fake-judge-mini"}).encode()))
    caplog.set_level(logging.WARNING, logger="judgestore.hosted")
    monkeypatch.setenv("TOGETHER_API_KEY", "k")
    served(fake, provider="together", max_concurrency=1).cached(store, task="t").complete([ask(i) for i in range(5)])
    said = [r.getMessage() for r in caplog.records if "answered with the model" in r.getMessage()]
    fake.add_fault(Fault(status=200, body=json.dumps({**body, "model": "first-alias"}).encode()))
    served(fake).cached(store, task="t").complete([ask(9)])  # a vllm serve names its first served name: not said
    said = [r.getMessage() for r in caplog.records if "answered with the model" in r.getMessage()]
    assert said == [f"{fake.base_url} answered with the model 'fake-judge-mini' where 'fake-judge' was asked for: its "
                    "answers are stored under 'fake-judge' (pin the model, or turn off the router's fallbacks, if that "
                    "is not the one you meant)"]  # fmt: skip


def test_retry_warnings_and_the_error_after_the_retries_quote_the_server(
    store: Store, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_fault(Fault(status=503, times=100, body=b'{"error": {"message": "upstream  overloaded\\n"}}'))
    said = r"still after 3 retries \(the server said: upstream overloaded\)"  # on one line
    caplog.set_level(logging.WARNING, logger="judgestore.hosted")
    with pytest.raises(HostedUnavailableError, match=said):
        served(fake).cached(store, task="t").complete([ask(0)])
    assert "HTTP 503 (upstream overloaded); retry 1 of 3" in caplog.text  # before: "HTTP 503; retry 1 of 3"


def test_what_a_server_says_reaches_the_user_without_the_key_or_a_terminals_escapes(
    store: Store, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy naming the answering model after the key printed it (that warning was not redacted), and an error
    message holding a terminal's escapes cleared the user's screen (was)."""
    key = "sk-" + "S3cretKey9" * 3
    monkeypatch.setenv("TOGETHER_API_KEY", key)
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": f"proxy-for-{key}", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
    fake.add_fault(Fault(status=200, body=json.dumps(body).encode()))
    fake.add_fault(Fault(status=503, body=rb'{"error": {"message": "\u001b[2J\u001b[31moverloaded"}}'))
    caplog.set_level(logging.WARNING, logger="judgestore.hosted")
    served(fake, provider="together", max_concurrency=1).cached(store, task="t").complete([ask(0), ask(1)])
    assert "answered with the model 'proxy-for-<api key>'" in caplog.text and key not in caplog.text
    assert "HTTP 503 (?[2J?[31moverloaded)" in caplog.text and "\x1b" not in caplog.text
    fake.add_fault(Fault(status=400, body=rb'{"error": {"message": "\u001b[2Jbad thing"}}'))  # not retried
    with pytest.raises(RequestsFailedError) as refused:
        served(fake).cached(store, task="t").complete([ask(2)])
    assert "?[2Jbad thing" in str(refused.value) and "\x1b" not in str(refused.value)


def test_a_429_for_a_spent_quota_is_not_retried_and_says_so(store: Store, fake: FakeOpenAI) -> None:
    message = "You exceeded your current quota, please check your plan and billing details."
    quota = {"error": {"message": message, "type": "insufficient_quota", "code": "insufficient_quota"}}
    fake.add_fault(Fault(status=429, times=100, body=orjson.dumps(quota)))
    spec = served(fake)
    with pytest.raises(HostedUnavailableError, match=r"429: the quota of the account is spent \(You") as caught:
        spec.cached(store, task="t").complete([ask(0)])
    assert caught.value.status == 429
    assert len(fake.completions()) == 1 and spec.stats.retries == 0  # before: 1 + max_retries for every request


def test_a_timeout_is_retried(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=200, delay=1.5))  # answers, but after the client gave up
    spec = served(fake, timeout_s=0.3)
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    assert response.text == "echo: question 0" and spec.stats.retries == 1


def test_an_answer_trickled_slower_than_the_timeout_as_a_whole_is_a_timeout(store: Store, fake: FakeOpenAI) -> None:
    """timeout_s bounded each read only: a server sending its answer a byte at a time held the request (and its
    slot) as long as it liked, with timeout_s=2 for 15 s (was)."""
    fake.add_fault(Fault(status=200, trickle=0.03))  # some 300 bytes: about 9 s, no read waiting over 0.03 s
    spec = served(fake, timeout_s=0.5)
    started = time.monotonic()
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    assert response.text == "echo: question 0" and spec.stats.retries == 1  # the retry is answered at once
    assert time.monotonic() - started < 6  # a third of the trickle: room for a loaded machine


def test_a_timeout_that_never_ends_is_a_typed_error(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=200, delay=1.0, times=100))
    with pytest.raises(HostedUnavailableError, match=r"a timeout, still after 1 retries.*lower --max-concurrency"):
        served(fake, timeout_s=0.2, retry=RetryPolicy(max_retries=1, base_s=0.01)).cached(store, task="t").complete(
            [ask(0)]
        )


def test_a_server_that_is_not_there_is_retried_then_a_typed_error(store: Store, fake: FakeOpenAI) -> None:
    spec = HostedSpec(
        model="m", provider="vllm-server", base_url="http://127.0.0.1:9/v1", retry=RetryPolicy(1, 0.01), timeout_s=2
    )
    with pytest.raises(HostedUnavailableError, match="connection error") as raised:
        spec.cached(store, task="t").complete([ask(0)])
    # two tries, neither reached a server: none counted as sent (the summary said it sent them, was)
    assert (spec.stats.requests_sent, spec.stats.retries) == (0, 1)
    # what to check: the server and its URL, not the load (it advised a lower --max-concurrency, was)
    assert "check that the server runs at this URL (--base-url), then rerun" in str(raised.value)
    assert "--max-concurrency" not in str(raised.value)


# ------------------------------------------------------------------ failures that are not retried


def test_a_refused_key_is_a_typed_error_sent_once_that_names_the_variable_not_the_key(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with FakeOpenAI(api_key="sk-the-right-one-000000000000") as fake:
        with pytest.raises(HostedAuthError, match="401: the server refused the key in JUDGE_KEY") as caught:
            served(fake, api_key_env="JUDGE_KEY").cached(store, task="t").complete([ask(0)])
        assert len(fake.completions()) == 1
    printed = "".join(traceback.format_exception(caught.value))
    assert KEY not in printed and "<api key>" in printed  # the server echoed the key: blanked out


def test_a_placeholder_key_of_a_few_characters_is_not_blanked_out_of_every_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key "x" (a local server takes any) turned "maximum context length" into "ma<api key>imum" (was)."""
    monkeypatch.setenv("JUDGE_KEY", "x")
    with FakeOpenAI(api_key="the-right-one") as fake, pytest.raises(HostedAuthError) as caught:
        served(fake, api_key_env="JUDGE_KEY").cached(store, task="t").complete([ask(0)])
    assert "<api key>" not in str(caught.value) and "401" in str(caught.value)


def test_a_403_is_an_auth_error_too_and_is_not_retried(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=403, body=b'{"error": {"message": "this key may not use fake-judge"}}'))
    with pytest.raises(HostedAuthError, match=r"403: the server refused the request \(no API key was sent\): this key"):
        served(fake).cached(store, task="t").complete([ask(0)])
    assert len(fake.completions()) == 1


def test_a_model_the_server_does_not_serve_is_a_typed_error_listing_what_it_serves(
    store: Store, fake: FakeOpenAI
) -> None:
    with pytest.raises(HostedModelNotFoundError, match=r"does not serve the model 'fake-judje'.*It serves: fake-judge"):
        served(fake, model="fake-judje").cached(store, task="t").complete([ask(0)])
    assert len(fake.completions()) == 1


def test_a_404_whose_code_is_model_not_found_is_a_missing_model_whatever_its_message_says(
    store: Store, fake: FakeOpenAI
) -> None:
    error = {"message": "Model m is currently unavailable", "code": "model_not_found", "type": "invalid_request_error"}
    fake.add_fault(Fault(status=404, body=orjson.dumps({"error": error})))
    # Before: the code was looked up under e.body["error"], which the openai client has already unwrapped.
    with pytest.raises(HostedModelNotFoundError, match=r"currently unavailable\)\. It serves: fake-judge"):
        served(fake).cached(store, task="t").complete([ask(0)])


def test_a_base_url_without_v1_is_a_typed_404_with_a_hint(store: Store, fake: FakeOpenAI) -> None:
    with pytest.raises(HostedNotFoundError, match=r"404 for /chat/completions.*usually end in /v1"):
        served(fake, base_url=fake.base_url.removesuffix("/v1")).cached(store, task="t").complete([ask(0)])


def test_a_setting_the_server_refuses_is_a_typed_error_naming_what_was_sent(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=400, body=b'{"error": {"message": "Unrecognized request argument: top_k"}}'))
    with pytest.raises(RequestsFailedError) as raised:
        served(fake).cached(store, task="t").complete([ask(0)])
    (failure,) = raised.value.failures
    assert isinstance(failure.error, HostedRequestError) and failure.error.status == 400
    assert re.search(r"Unrecognized request argument: top_k \(settings sent: .*top_k", str(failure.error))
    assert len(fake.completions()) == 1  # a refusal is not retried


def test_a_server_that_refuses_the_first_eight_requests_and_answers_none_refuses_the_settings(
    store: Store, fake: FakeOpenAI
) -> None:
    fake.add_fault(Fault(status=400, times=100, body=b'{"error": {"message": "Unrecognized request argument: top_k"}}'))
    spec = served(fake, max_concurrency=2)
    with pytest.raises(HostedRequestError, match=r"refused the first \d+ requests of the batch and answered none"):
        spec.cached(store, task="t").complete([ask(i) for i in range(30)])
    assert 8 <= len(fake.completions()) <= 9  # the eighth refusal stops it (one more may have been in flight)
    assert (
        store.find("completions", "t", spec.descriptor) is None
        or store.database("completions", "t", spec.descriptor).count() == 0
    )


@pytest.mark.parametrize("prompts", [12, 40])
def test_at_the_default_concurrency_eight_refusals_in_a_row_refuse_the_settings_and_no_more_are_sent(
    store: Store, fake: FakeOpenAI, prompts: int
) -> None:
    """Each refusal let its worker start the next request: 40 prompts sent 15 before the verdict, and 12 were all
    sent, each its own refusal, the settings never named (was)."""
    fake.add_fault(Fault(status=400, times=1000, body=b'{"error": {"message": "Unrecognized request argument: x"}}'))
    with pytest.raises(HostedRequestError, match=r"refused the first 8 requests of the batch and answered none"):
        served(fake).cached(store, task="t").complete([ask(i) for i in range(prompts)])
    assert len(fake.completions()) == 8


def test_prompts_over_the_context_fail_alone_however_many_and_the_one_that_fits_is_answered(store: Store) -> None:
    """vLLM says when a prompt alone is over the context: nine such prompts and one that fits stopped the batch as
    "refuses the settings", the tenth never sent and no result written; so did every rerun whose misses were all
    too long (was)."""
    with FakeOpenAI(context_length=40) as fake:
        spec = served(fake)
        too_long = [CompletionRequest(messages=[{"role": "user", "content": f"{i} " + "word " * 50}]) for i in range(9)]
        with pytest.raises(RequestsFailedError, match=r"9 of 10 inputs"):
            spec.cached(store, task="t").complete([*too_long, ask(0)])
        assert len(fake.completions()) == 10 and store.database("completions", "t", spec.descriptor).count() == 1
        with pytest.raises(RequestsFailedError, match=r"9 of 9 inputs .* 1 hits"):  # the rerun: each miss alone
            spec.cached(store, task="t").complete([*too_long, ask(0)])
        assert len(fake.completions()) == 19


@pytest.mark.parametrize(
    "said",
    [
        # OpenAI's legacy completions
        "This model's maximum context length is 4097 tokens, however you requested 5008 tokens (5000 in your "
        "prompt; 8 for the completion). Please reduce your prompt; or completion length.",
        # vLLM, a prompt of exactly max_model_len tokens: max_tokens clamped to 0
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
    ],
    ids=["openai-completions", "vllm-exactly-the-context"],
)
def test_other_words_for_a_prompt_alone_over_the_context_fail_alone_too(
    store: Store, fake: FakeOpenAI, said: str
) -> None:
    """Not read as the prompt's own length: a batch of such prompts, or every rerun of its misses, stopped as
    "refuses the settings" with no result written (was)."""
    fake.add_fault(Fault(status=400, times=100, body_contains="LONG", body=orjson.dumps({"error": {"message": said}})))
    long = [CompletionRequest(messages=[{"role": "user", "content": f"LONG {i}"}]) for i in range(10)]
    with pytest.raises(RequestsFailedError, match=r"10 of 11 inputs"):
        served(fake).cached(store, task="t").complete([*long, ask(0)])
    assert len(fake.completions()) == 11


def test_a_probe_refused_for_its_own_prompt_says_nothing_of_the_settings(store: Store, fake: FakeOpenAI) -> None:
    """The shortest prompt by characters can be the longest in tokens: its refusal was taken for the settings',
    and the five prompts that fit were never sent (was)."""

    def refusal(prompt: int) -> bytes:
        message = (f"This model's maximum context length is 100 tokens. However, you requested {prompt + 60} "
                   f"tokens ({prompt} in the messages, 60 in the completion).")  # fmt: skip
        return orjson.dumps({"error": {"message": message, "code": "context_length_exceeded"}})

    fake.add_fault(Fault(status=400, times=100, body_contains="LONG", body=refusal(90)))  # ambiguous: it fits
    fake.add_fault(Fault(status=400, times=100, body_contains="TINY", body=refusal(150)))  # its own length
    long = [CompletionRequest(messages=[{"role": "user", "content": f"LONG {i} " + "x" * 80}]) for i in range(8)]
    tiny = CompletionRequest(messages=[{"role": "user", "content": "TINY"}])
    with pytest.raises(RequestsFailedError, match=r"9 of 14 inputs"):
        served(fake).cached(store, task="t").complete([*long, *(ask(i) for i in range(5)), tiny])
    assert len(fake.completions()) == 14


def test_the_probe_after_eight_refusals_is_the_shortest_request_not_sent_one_a_waiting_worker_holds_included(
    store: Store, fake: FakeOpenAI
) -> None:
    """After a refusal the workers wait holding their next request: the probe found none left to send, and the
    batch stopped as "refuses the settings" with those two never sent (was)."""
    refusal = b'{"error": {"message": "the prompt is too long for this context window"}}'  # no counts: ambiguous
    fake.add_fault(Fault(status=400, times=8, body=refusal))
    with pytest.raises(RequestsFailedError, match=r"8 of 10 inputs"):
        served(fake).cached(store, task="t").complete([ask(i) for i in range(10)])
    assert len(fake.completions()) == 10


def test_the_first_prompts_refused_while_others_are_in_flight_are_not_taken_for_refused_settings(
    store: Store,
) -> None:
    with FakeOpenAI(context_length=40) as fake:
        fake.delay = 0.3  # the answers take longer than the refusals: eight refusals come back first
        spec = served(fake, max_concurrency=8)
        too_long = [CompletionRequest(messages=[{"role": "user", "content": f"{i} " + "word " * 50}]) for i in range(8)]
        with pytest.raises(RequestsFailedError, match=r"8 of 20 inputs") as raised:
            spec.cached(store, task="t").complete(too_long + [ask(i) for i in range(8, 20)])
        # Before: "refused the first 8 requests of the batch and answered none", with answers stored.
        assert all("maximum context length" in str(f.error) for f in raised.value.failures)
        assert store.database("completions", "t", spec.descriptor).count() == 12


def test_a_batch_sorted_longest_first_is_not_taken_for_refused_settings(store: Store) -> None:
    """Was: ten prompts over the context first, one at a time, stopped the batch ("it refuses the settings"), and
    every rerun met the same wall: the twelve that fit were never sent."""
    with FakeOpenAI(context_length=40) as fake:
        spec = served(fake, max_concurrency=1)
        too_long = [CompletionRequest(messages=[{"role": "user", "content": "word " * (60 - i)}]) for i in range(10)]
        with pytest.raises(RequestsFailedError, match=r"10 of 22 inputs") as raised:
            spec.cached(store, task="t").complete(too_long + [ask(i) for i in range(12)])
        assert all("maximum context length" in str(f.error) for f in raised.value.failures)
        assert store.database("completions", "t", spec.descriptor).count() == 12 and len(fake.completions()) == 22


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_max_tokens_no_prompt_leaves_room_for_is_refused_settings(
    store: Store, fake: FakeOpenAI, concurrency: int
) -> None:
    """vLLM says "maximum context length" of max_tokens over the context too: every request is refused, and the
    shortest one, sent once eight were, says that the settings are (a review found all 40 sent; then one probe per
    request in flight)."""
    said = ("This model's maximum context length is 4096 tokens. However, you requested 8210 tokens (18 in the "
            "messages, 8192 in the completion). Please reduce the length of the messages or completion.")  # fmt: skip
    refusal = json.dumps({"error": {"message": said, "code": 400}}).encode()
    fake.add_fault(Fault(status=400, times=100, delay=0.02, body=refusal))  # a while each: several in flight
    spec = served(fake, max_concurrency=concurrency)
    shorter = [CompletionRequest(messages=[{"role": "user", "content": f"q{i} " + "x" * (40 - i)}]) for i in range(40)]
    with pytest.raises(HostedRequestError, match=r"refused the first \d+ requests of the batch and answered none"):
        spec.cached(store, task="t").complete(shorter)
    sent = [str(r.body["messages"][-1]["content"]).split()[0] for r in fake.completions() if r.body]
    # Those sent in order until eight were refused (and those then in flight), then one probe: the shortest, the last
    in_order = len(sent) - 1
    assert set(sent[:-1]) == {f"q{i}" for i in range(in_order)} and sent[-1] == "q39"
    assert 8 <= in_order <= 8 + concurrency - 1


def test_a_batch_whose_every_prompt_is_over_the_context_fails_each_alone(store: Store) -> None:
    """With the probe the last request, nothing was held back: "so no more were sent" was not true (a review)."""
    with FakeOpenAI(context_length=10) as fake:
        spec = served(fake, max_concurrency=1)
        too_long = [CompletionRequest(messages=[{"role": "user", "content": "word " * (20 + i)}]) for i in range(9)]
        with pytest.raises(RequestsFailedError, match=r"9 of 9 inputs"):
            spec.cached(store, task="t").complete(too_long)
        assert len(fake.completions()) == 9


def test_a_prompt_over_the_servers_context_is_a_400_that_fails_alone_and_the_rest_is_stored(store: Store) -> None:
    with FakeOpenAI(context_length=40) as fake:
        spec = served(fake)
        batch = [ask(0), ask(1), CompletionRequest(messages=[{"role": "user", "content": "word " * 50}]), ask(3)]
        with pytest.raises(RequestsFailedError, match=r"1 of 4 inputs.*request 2 .*HostedRequestError") as raised:
            spec.cached(store, task="t").complete(batch)
        (failure,) = raised.value.failures
        assert failure.request_index == 2 and isinstance(failure.error, HostedRequestError)
        assert "maximum context length is 40 tokens" in str(failure.error) and failure.error.status == 400
        assert [r.error is None for r in raised.value.responses] == [True, True, False, True]
        assert len(fake.completions()) == 4  # not retried
        assert store.database("completions", "t", spec.descriptor).count() == 3
        with pytest.raises(RequestsFailedError):
            spec.cached(store, task="t").complete(batch)
        assert len(fake.completions()) == 5  # the rerun sends only the refused one

        # An answer that would not fit stops at the context, as vLLM's server stops it: a result, stored.
        near = CompletionRequest(messages=[{"role": "user", "content": "word " * 38}])
        (stopped,) = served(fake, sampling={"max_tokens": 10}).cached(store, task="t").complete([near])
        assert stopped.samples[0].finish_reason == "length" and stopped.samples[0].usage["completion_tokens"] == 2  # type: ignore[index]


def test_a_judge_whose_answers_are_empty_stores_them_and_the_rerun_sends_nothing(
    store: Store, fake: FakeOpenAI
) -> None:
    fake.empty_replies = True
    spec = served(fake, sampling={"logprobs": 2})
    requests = pairwise_requests(question="2+2?", model_a="m-a", answer_a="4", model_b="m-b", answer_b="5")
    verdicts = spec.cached(store, task="t").judge(requests)
    assert [(r.text, r.samples[0].finish_reason) for r in verdicts] == [("", "stop"), ("", "stop")]
    assert all(r.top_logprobs for r in verdicts)  # the first position's logprobs are real
    assert store.database("judgements", "t", spec.descriptor).count() == 2
    again = spec.cached(store, task="t")
    hits = again.judge(requests)
    assert len(fake.completions()) == 2 and not again.engine_loaded
    assert [(r.cached, r.text, r.top_logprobs) for r in hits] == [(True, "", r.top_logprobs) for r in verdicts]


@pytest.mark.parametrize(
    "body", [b"<html>502 Bad Gateway</html>", b'{"id": "x", "object": "chat.completion"}', b'{"choices": []}']
)
def test_a_malformed_body_is_a_typed_error_and_nothing_is_stored(store: Store, fake: FakeOpenAI, body: bytes) -> None:
    fake.add_fault(Fault(status=200, body=body))
    spec = served(fake)
    with pytest.raises(HostedResponseError, match="not a chat completion"):
        spec.cached(store, task="t").complete([ask(0)])
    assert store.find("completions", "t", spec.descriptor) is None or not list(
        store.database("completions", "t", spec.descriptor).query()
    )


def test_a_failure_stops_new_requests_and_keeps_what_finished(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=401, after=2))
    spec = served(fake, max_concurrency=1)
    with pytest.raises(HostedAuthError):
        spec.cached(store, task="t").complete([ask(i) for i in range(6)])
    assert len(fake.completions()) == 3  # two answers, the refusal, and nothing after it
    assert store.database("completions", "t", spec.descriptor).count() == 2
    spec.cached(store, task="t").complete([ask(i) for i in range(6)])
    assert len(fake.completions()) == 3 + 4


# ------------------------------------------------------------------ errors in a 200

ENDED_IN_ERROR = {"message": {"role": "assistant", "content": ""}, "finish_reason": "error"}


@pytest.mark.parametrize(
    "choice",
    [
        {**ENDED_IN_ERROR, "error": {"code": 400, "message": "upstream provider rejected it"}},  # OpenRouter's shape
        {"error": {"code": "provider_error", "message": "upstream provider rejected it"}},  # an error, finish "stop"
        ENDED_IN_ERROR,  # no error object at all
    ],
)
def test_a_choice_that_ended_in_an_error_fails_alone_and_is_not_stored(
    store: Store, fake: FakeOpenAI, choice: dict[str, Any]
) -> None:
    fake.add_fault(Fault(status=200, after=1, choice=choice))
    spec = served(fake, max_concurrency=1)
    with pytest.raises(RequestsFailedError, match=r"1 of 3 inputs") as raised:
        spec.cached(store, task="t").complete([ask(0), ask(1), ask(2)])
    (failure,) = raised.value.failures
    assert failure.request_index == 1 and isinstance(failure.error, HostedRequestError)
    assert failure.error.status is None and "the generation ended in an error (choices[0].error" in str(failure.error)
    said = choice.get("error", {}).get("message", "no message")
    assert said in str(failure.error)
    # Before: stored as a completion '' (finish reason 'error' or 'stop'), a hit for ever after.
    assert stored(store, spec) == 2 and len(fake.completions()) == 3
    (again,) = spec.cached(store, task="t").complete([ask(1)])
    assert not again.cached and again.text == "echo: question 1" and len(fake.completions()) == 4


def test_a_choice_that_ended_in_a_transient_error_is_retried(
    store: Store, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    ended = {**ENDED_IN_ERROR, "error": {"code": 502, "message": "upstream provider error"}}
    fake.add_fault(Fault(status=200, times=2, choice=ended))
    spec = served(fake)
    caplog.set_level(logging.WARNING, logger="judgestore.hosted")
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    assert response.text == "echo: question 0" and spec.stats.retries == 2 and len(fake.completions()) == 3
    assert "choices[0].error code 502 (upstream provider error); retry 1 of 3" in caplog.text


def test_choices_that_end_in_errors_are_not_taken_for_refused_settings(store: Store, fake: FakeOpenAI) -> None:
    ended = {**ENDED_IN_ERROR, "error": {"code": 400, "message": "upstream provider rejected it"}}
    fake.add_fault(Fault(status=200, times=100, choice=ended))
    spec = served(fake, max_concurrency=2)
    with pytest.raises(RequestsFailedError, match=r"12 of 12 inputs"):
        spec.cached(store, task="t").complete([ask(i) for i in range(12)])
    assert len(fake.completions()) == 12  # the server answered each: every request is sent, none stored
    assert stored(store, spec) == 0


def test_a_models_refusal_fails_alone_quoting_it_and_is_not_stored(store: Store, fake: FakeOpenAI) -> None:
    refusal = {"role": "assistant", "content": None, "refusal": "I'm sorry, I can't judge this."}
    fake.add_fault(Fault(status=200, after=1, choice={"message": refusal}))
    spec = served(fake, max_concurrency=1)
    with pytest.raises(RequestsFailedError, match=r"1 of 3 inputs") as raised:
        spec.cached(store, task="t").complete([ask(0), ask(1), ask(2)])
    (failure,) = raised.value.failures
    assert failure.request_index == 1 and isinstance(failure.error, HostedRequestError)
    assert failure.error.status is None
    assert "the model refused to answer (\"I'm sorry, I can't judge this.\"" in str(failure.error)
    assert stored(store, spec) == 2  # before: stored as '' with finish reason 'stop'

    # Content null without a refusal (a reasoning model that spent max_tokens thinking) is an empty answer, stored.
    thought = {"message": {"role": "assistant", "content": None}, "finish_reason": "length"}
    fake.add_fault(Fault(status=200, choice=thought))
    (empty,) = spec.cached(store, task="t").complete([ask(3)])
    assert (empty.text, empty.samples[0].finish_reason) == ("", "length") and stored(store, spec) == 3


def test_a_generation_the_server_aborted_is_retried_not_stored(store: Store, fake: FakeOpenAI) -> None:
    """vLLM's finish_reason "abort" (a request it stopped before its end). Was: stored as the answer, never asked
    again."""
    fake.add_fault(Fault(status=200, choice={"message": {"role": "assistant", "content": "echo:"},
                                             "finish_reason": "abort"}))  # fmt: skip
    spec = served(fake)
    (response,) = spec.cached(store, task="t").complete([ask(0)])
    assert (response.text, response.samples[0].finish_reason) == ("echo: question 0", "stop")
    assert spec.stats.retries == 1 and len(fake.completions()) == 2
    (row,) = store.database("completions", "t", spec.descriptor).query()
    assert (row.completion, row.finish_reason) == ("echo: question 0", "stop")


def test_a_200_whose_body_is_a_transient_error_object_is_retried_then_a_typed_error_quoting_it(
    store: Store, fake: FakeOpenAI
) -> None:
    fake.add_fault(Fault(status=200, times=100, body=b'{"error": {"message": "Provider returned error", "code": 502}}'))
    spec = served(fake)
    # Before: "a body that is not a chat completion ... Is the base URL an OpenAI-compatible API?", not retried.
    said = r"HTTP 200 with response.error code 502, still after 3 retries \(the server said: Provider returned error\)"
    with pytest.raises(HostedUnavailableError, match=said):
        spec.cached(store, task="t").complete([ask(0)])
    assert len(fake.completions()) == 4 and stored(store, spec) == 0


def test_a_200_whose_body_is_an_error_object_gets_the_typed_error_of_its_code(store: Store, fake: FakeOpenAI) -> None:
    fake.add_fault(Fault(status=200, body=b'{"error": {"message": "this key may not use fake-judge", "code": 403}}'))
    with pytest.raises(HostedAuthError, match=r"200 with error code 403: the server refused .*this key may not use"):
        served(fake).cached(store, task="t").complete([ask(0)])

    fake.add_fault(Fault(status=200, body=b'{"error": {"message": "prompt too long", "code": "400"}}'))
    spec = served(fake, max_concurrency=1)
    with pytest.raises(RequestsFailedError, match=r"1 of 2 inputs") as raised:
        spec.cached(store, task="t").complete([ask(0), ask(1)])  # a refusal of one request: it fails alone
    (failure,) = raised.value.failures
    assert isinstance(failure.error, HostedRequestError) and failure.error.status == 400
    assert "200 with error code '400': the server refused this request: prompt too long" in str(failure.error)

    fake.add_fault(Fault(status=200, body=b'{"error": "Provider returned error"}'))  # no code: not retried
    with pytest.raises(HostedAPIError, match=r"200 with error code None: .*: Provider returned error") as caught:
        served(fake).cached(store, task="t").complete([ask(2)])
    assert type(caught.value) is HostedAPIError

    fake.add_fault(Fault(status=200, body=b'{"error": {"message": "odd", "code": {"upstream": 7}}}'))  # not a TypeError
    with pytest.raises(HostedAPIError, match=r"200 with error code \{'upstream': 7\}: .*: odd") as caught:
        served(fake).cached(store, task="t").complete([ask(2)])
    assert type(caught.value) is HostedAPIError
    assert len(fake.completions()) == 5 and stored(store, spec) == 1


# ------------------------------------------------------------------ logprobs


def test_chat_logprobs_are_stored_losslessly_for_the_first_or_every_position(store: Store, fake: FakeOpenAI) -> None:
    first = served(fake, sampling={"logprobs": 3}).cached(store, task="t").complete([ask(0)])[0].samples[0]
    (position,) = logprobs.decode(first.top_logprobs)
    assert [(c.text, c.rank, c.token_id) for c in position.candidates] == [
        ("echo:", 1, None),
        ("alt1", 2, None),
        ("alt2", 3, None),
    ]
    assert position.candidates[0].bytes == tuple(b"echo:")
    assert position.sampled is not None and (position.sampled.text, position.sampled.rank) == ("echo:", 1)
    assert first.text_logprobs() == {"echo:": -0.25, "alt1": -1.75, "alt2": -3.25}  # JudgeArena's view

    every = served(fake, sampling={"logprobs": 1}, logprob_positions="all").cached(store, task="t").complete([ask(0)])
    positions = logprobs.decode(every[0].samples[0].top_logprobs)
    assert [p.sampled.text for p in positions if p.sampled] == ["echo:", " question", " 0"]


def test_text_completions_and_their_logprobs(store: Store, fake: FakeOpenAI) -> None:
    spec = served(fake, input_mode="text", sampling={"logprobs": 2, "max_tokens": 2})
    (response,) = spec.cached(store, task="t").complete([CompletionRequest(text="plain prompt")])
    assert fake.completions()[-1].path == "/v1/completions" and fake.completions()[-1].body["prompt"] == "plain prompt"  # type: ignore[index]
    assert response.text == "echo: plain" and response.samples[0].finish_reason == "length"
    (position,) = logprobs.decode(response.samples[0].top_logprobs)
    assert [(c.text, c.rank) for c in position.candidates] == [("echo:", 1), ("alt1", 2)]
    assert position.sampled is not None and position.sampled.rank == 1


def test_chat_logprobs_whose_content_is_null_are_no_logprobs_the_text_is_kept_and_warned_once(
    store: Store, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_fault(Fault(status=200, times=2, choice={"logprobs": {"content": None}}))  # OpenAI's schema allows it
    spec = served(fake, sampling={"logprobs": 2}, max_concurrency=1)
    with caplog.at_level(logging.WARNING, logger="judgestore.hosted"):
        responses = spec.cached(store, task="t").complete([ask(0), ask(1), ask(2)])
    # Before: "choices[0].logprobs is not the shape the API documents", and the batch stopped.
    assert [(r.text, r.top_logprobs is None) for r in responses] == [
        ("echo: question 0", True),
        ("echo: question 1", True),
        ("echo: question 2", False),
    ]
    assert caplog.text.count("returned no logprobs") == 1 and stored(store, spec) == 3


def test_a_text_logprob_that_is_not_a_number_is_a_malformed_body_not_a_traceback(
    store: Store, fake: FakeOpenAI
) -> None:
    spec = served(fake, input_mode="text", sampling={"logprobs": 2})
    odd = {"tokens": ["hi"], "token_logprobs": [-0.1], "top_logprobs": [{"hi": -0.1, "ho": None}], "text_offset": [0]}
    fake.add_fault(Fault(status=200, choice={"text": "hi", "logprobs": odd}))
    # Before: float(None), a raw TypeError out of the backend.
    with pytest.raises(HostedResponseError, match=r"not a completion .*top_logprobs\[0\]\['ho'\] is NoneType"):
        spec.cached(store, task="t").complete([CompletionRequest(text="p")])
    assert stored(store, spec) == 0


def test_a_vllm_server_body_with_empty_bytes_and_a_sampled_token_outside_the_top(fake: FakeOpenAI) -> None:
    descriptor: ModelDescriptor = served(fake, sampling={"logprobs": 1}).descriptor
    body = {
        "choices": [
            {
                "message": {"content": "\ufffdx"},
                "finish_reason": "length",
                "logprobs": {
                    "content": [
                        {
                            "token": "",
                            "logprob": -2.5,
                            "bytes": [],
                            "top_logprobs": [{"token": "I", "logprob": -0.5, "bytes": [73]}],
                        }
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    generation = generation_from_body(descriptor, body)
    (position,) = logprobs.decode(generation.top_logprobs)
    assert position.sampled is not None and (position.sampled.text, position.sampled.rank) == ("", None)
    assert position.sampled.bytes == () and position.candidates[0].bytes == (73,)
    assert generation.usage == {"prompt_tokens": 4, "completion_tokens": 2}


# ------------------------------------------------------------------ a killed run, secrets

_KILLED_RUN = """
import os, signal, sys
from inference.spec import HostedSpec
from inference.requests import CompletionRequest
from store.store import Store

base_url, root, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])

def progress(done, total):
    if done >= kill_after:  # rows are written before progress is reported
        os.kill(os.getpid(), signal.SIGKILL)

spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=base_url, max_concurrency=2)
requests = [CompletionRequest(messages=[{"role": "user", "content": f"prompt {i}"}]) for i in range(12)]
spec.cached(Store(root=root), task="killed", chunk_size=2).complete(requests, on_progress=progress)
"""


def _settled_count(fake: FakeOpenAI) -> int:
    """The requests the server recorded once no more arrive: a killed client's last one (two are in flight) can
    reach the server's thread after the client is gone, and was counted as the rerun's (a flake under load)."""
    count = len(fake.completions())
    while True:
        time.sleep(0.3)
        if (now := len(fake.completions())) == count:
            return count
        count = now


def test_a_sigkilled_run_keeps_what_it_wrote_and_the_rerun_sends_only_the_rest(store: Store, fake: FakeOpenAI) -> None:
    fake.delay = 0.05
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, fake.base_url, str(store.root), "4"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    spec = served(fake)
    kept = store.database("completions", "killed", spec.descriptor).count()
    sent_before = _settled_count(fake)
    assert 4 <= kept < 12 and sent_before < 12
    requests = [CompletionRequest(messages=[{"role": "user", "content": f"prompt {i}"}]) for i in range(12)]
    responses = spec.cached(store, task="killed").complete(requests)
    assert len(fake.completions()) - sent_before == 12 - kept  # exactly the requests that were not stored
    assert sum(r.cached for r in responses) == kept
    assert store.database("completions", "killed", spec.descriptor).count() == 12


def test_the_key_never_reaches_the_store_the_logs_or_a_summary(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUDGE_KEY", KEY)
    caplog.set_level(logging.DEBUG)  # every logger, the client's and httpx's included
    with FakeOpenAI(api_key=KEY) as fake:
        fake.add_fault(Fault(status=429, headers={"Retry-After": "0"}))  # a retry, logged
        spec = served(fake, api_key_env="JUDGE_KEY", sampling={"logprobs": 2})
        model = spec.cached(store, task="t")
        model.complete([ask(i) for i in range(3)])
        model.judge(pairwise_requests(question="q", model_a="a", answer_a="x", model_b="b", answer_b="y"))
        assert fake.completions()[-1].headers["authorization"] == f"Bearer {KEY}"  # it was sent: to the server only
        summary = orjson.dumps(
            {"descriptor": spec.descriptor.model_dump(), "stats": spec.stats.as_dict(), "run": repr(model.last)}
        ).decode()
        print(repr(spec), summary, model.last.plan.summary() if model.last.plan else "")
    files = [path for path in store.root.rglob("*") if path.is_file()]  # metadata.json, the dbs, their WAL files
    assert {"metadata.json", "completions.db", "judgements.db"} <= {path.name for path in files}
    assert not [path for path in files if KEY.encode() in path.read_bytes()]
    captured = capsys.readouterr()
    assert KEY not in captured.out + captured.err
    assert KEY not in caplog.text and "retry 1 of 3" in caplog.text
