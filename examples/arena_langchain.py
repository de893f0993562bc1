"""A JudgeArena-style arena on LangChain's chat model interface, every call answered from the store when it can be.

Two battle models answer the questions, a judge compares every pair of
answers in both orientations (A first, then B first), the preference comes
from the judge's first-token logprobs, read where OpenAI-format parsers read
them (``response_metadata["logprobs"]["content"][0]["top_logprobs"]``), and
position consistency says whether the same model wins both ways. The models
are judgestore's :class:`~inference.langchain.CachedChatModel`, so the code
is plain LangChain (``batch`` with per-input configs); run it twice and the
second run is all hits, never loading a model.

On the tiny local models (no GPU, no network; needs the langchain extra):

    python examples/arena_langchain.py --tiny /tmp/arena-models --store-root /tmp/arena-store

On real models: ``--model-a Qwen/Qwen3-8B --model-b meta-llama/Llama-3.1-8B-Instruct --judge ...``.
"""

from __future__ import annotations

from typing import Any

from arena_common import JUDGE_SYSTEM, JUDGE_TEMPLATE, QUESTIONS, Battle, arguments, report, specs
from langchain_core.messages import BaseMessage
from langchain_core.prompts import ChatPromptTemplate

from inference import CachedChatModel, preference
from store import Store


def cache_step(name: str, replies: list[BaseMessage]) -> tuple[str, int, int]:
    hits = sum(bool(r.response_metadata["judgestore"]["cached"]) for r in replies)
    return name, hits, len(replies) - hits


def first_token_logprobs(verdict: BaseMessage) -> dict[str, float]:
    """``{token: logprob}`` of the verdict's first token, as a parser of OpenAI's logprobs builds it."""
    content = (verdict.response_metadata.get("logprobs") or {}).get("content") or []
    return {t["token"]: t["logprob"] for t in content[0]["top_logprobs"]} if content else {}


def main() -> None:
    args = arguments(__doc__)
    spec_a, spec_b, judge_spec = specs(args)
    labels = (spec_a.display_name, spec_b.display_name)
    steps, answers = [], {}
    with Store(root=args.store_root) if args.store_root else Store() as store:
        questions = [q for _, q in QUESTIONS]
        configs: list[Any] = [{"metadata": {"benchmark": args.task, "instruction_id": i}} for i, _ in QUESTIONS]
        for label, spec in zip(labels, (spec_a, spec_b), strict=True):
            with CachedChatModel(spec=spec, store=store, task=args.task) as model:  # closed: one engine at a time
                replies = model.batch(questions, config=configs)
            answers[label] = [str(r.content) for r in replies]
            steps.append(cache_step(f"answers of {label}", replies))

        prompt = ChatPromptTemplate.from_messages([("system", JUDGE_SYSTEM), ("human", JUDGE_TEMPLATE)])
        inputs, judge_configs = [], []
        for k, (instruction_id, question) in enumerate(QUESTIONS):
            for orientation, (first, second) in (("direct", labels), ("reversed", labels[::-1])):
                answer_a, answer_b = answers[first][k], answers[second][k]
                inputs.append(prompt.invoke({"question": question, "answer_a": answer_a, "answer_b": answer_b}))
                slots = {"model_a": first, "model_b": second, "orientation": orientation}
                judge_configs.append({"metadata": {"benchmark": args.task, "instruction_id": instruction_id, **slots}})
        with CachedChatModel(spec=judge_spec, store=store, task=args.task, role="judgements") as judge:
            verdicts = judge.batch(inputs, config=judge_configs)  # type: ignore[arg-type]
        steps.append(cache_step("judgements", verdicts))

    p_b = [preference(first_token_logprobs(v)) for v in verdicts]
    battles = [Battle(i, p_b[2 * k], p_b[2 * k + 1]) for k, (i, _) in enumerate(QUESTIONS)]
    report(battles, labels, steps, args.json)


if __name__ == "__main__":
    main()
