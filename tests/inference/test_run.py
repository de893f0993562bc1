"""inference/run.py: a whole run's summary says which limit stopped outputs that did not finish."""

from __future__ import annotations

from collections.abc import Sequence

from inference.backends.base import EngineRequest, Generation
from inference.run import run_requests
from store.descriptor import ModelDescriptor
from store.settings import Settings
from tests.inference.test_audit import FakeSpec
from tests.inference.test_cached import CountingBackend, ask

WINDOW = ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0, "max_tokens": 1024},
                         engine={"max_model_len": 256})  # fmt: skip


class WindowBackend(CountingBackend):
    """Every answer runs into the context window: 250 tokens, finish_reason length (as vLLM reports it)."""

    def generate(self, requests: Sequence[EngineRequest]) -> list[Generation]:
        self.received.extend(requests)
        return [Generation("…", "length", {"prompt_tokens": 6, "completion_tokens": 250}, None) for _ in requests]


def test_outputs_cut_by_max_model_len_are_blamed_on_it_not_on_max_tokens(store_root: object) -> None:
    spec = FakeSpec(WindowBackend(), WINDOW)
    summary = run_requests(spec, [ask(i) for i in range(3)], role="completions", task="t", settings=Settings()).summary
    assert (summary.truncated, summary.context_limited, summary.max_model_len) == (3, 3, 256)
    note = summary.truncation_note()
    assert note is not None and "3 at the engine's max_model_len (256 tokens for prompt and answer together" in note
    assert "raise --engine-arg max_model_len" in note and "raise --max-tokens" not in note
    assert "max_model_len" not in summary.as_dict() and "context_limited" not in summary.as_dict()  # --json as it was
    again = run_requests(spec, [ask(i) for i in range(3)], role="completions", task="t", settings=Settings()).summary
    assert again.hits == 3 and again.context_limited == 3  # the stored rows' usage tells the same on a full hit


def test_outputs_cut_by_max_tokens_still_say_raise_max_tokens(store_root: object) -> None:
    class MaxTokens(CountingBackend):
        def generate(self, requests: Sequence[EngineRequest]) -> list[Generation]:
            return [Generation("…", "length", {"prompt_tokens": 6, "completion_tokens": 24}, None) for _ in requests]

    spec = FakeSpec(MaxTokens(), WINDOW.model_copy(update={"sampling": WINDOW.sampling.model_copy(
        update={"max_tokens": 24})}))  # fmt: skip
    summary = run_requests(spec, [ask(0)], role="completions", task="t", settings=Settings()).summary
    assert summary.truncation_note() == (
        "note: 1 outputs stopped at max_tokens (24; finish_reason=length): raise --max-tokens to let them finish"
    )
