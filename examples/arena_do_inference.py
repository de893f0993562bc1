"""The same arena as ``arena_langchain.py``, written against ``prepare_model`` / ``do_inference``.

Code built around that call shape switches its import
(``from inference import prepare_model, do_inference``) and keeps its call
sites: one metadata dict per input, results in the caller's order, and with
``return_top_logprobs=True`` each result's ``first_token_top_logprobs``
(``{token: logprob}``). It builds the same prompts as the LangChain version,
so the two share rows: after either one, the other is all hits.

On the tiny local models (no GPU, no network):

    python examples/arena_do_inference.py --tiny /tmp/arena-models --store-root /tmp/arena-store

On real models: ``--model-a Qwen/Qwen3-8B --model-b meta-llama/Llama-3.1-8B-Instruct --judge ...``.
"""

from __future__ import annotations

from typing import Any

from arena_common import JUDGE_SYSTEM, JUDGE_TEMPLATE, QUESTIONS, Battle, arguments, report, specs

from inference import do_inference, preference, prepare_model
from store import Store


def cache_step(name: str, outputs: Any) -> tuple[str, int, int]:
    """What the cache did for one do_inference call (each call's result carries its own ``.run``)."""
    plan = outputs.run.plan
    return name, plan.hits, plan.misses


def main() -> None:
    args = arguments(__doc__)
    spec_a, spec_b, judge_spec = specs(args)
    labels = (spec_a.display_name, spec_b.display_name)
    steps, answers = [], {}
    with Store(root=args.store_root) if args.store_root else Store() as store:
        questions = [q for _, q in QUESTIONS]
        metadata = [{"instruction_id": i} for i, _ in QUESTIONS]
        for label, spec in zip(labels, (spec_a, spec_b), strict=True):
            with prepare_model(spec, task=args.task, store=store) as model:  # closed: one engine at a time
                texts = do_inference(model, questions, use_tqdm=True, cache_metadata=metadata)
            answers[label] = list(texts)
            steps.append(cache_step(f"answers of {label}", texts))

        inputs, judge_metadata = [], []
        for k, (instruction_id, question) in enumerate(QUESTIONS):
            for orientation, (first, second) in (("direct", labels), ("reversed", labels[::-1])):
                text = JUDGE_TEMPLATE.format(question=question, answer_a=answers[first][k], answer_b=answers[second][k])
                inputs.append([{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": text}])
                slots = {"model_a": first, "model_b": second, "orientation": orientation}
                judge_metadata.append({"instruction_id": instruction_id, **slots})
        with prepare_model(judge_spec, task=args.task, role="judgements", store=store) as judge:
            verdicts = do_inference(
                judge, inputs, use_tqdm=True, return_top_logprobs=True, cache_metadata=judge_metadata
            )
        steps.append(cache_step("judgements", verdicts))

    p_b = [preference(v.first_token_top_logprobs or {}) for v in verdicts]
    battles = [Battle(i, p_b[2 * k], p_b[2 * k + 1]) for k, (i, _) in enumerate(QUESTIONS)]
    report(battles, labels, steps, args.json)


if __name__ == "__main__":
    main()
