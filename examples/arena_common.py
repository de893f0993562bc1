"""What the two arena examples share: the questions, the judge prompt, the models, and the report.

The examples differ only in how they call the models (``arena_langchain.py``:
LangChain's ``batch`` on :class:`inference.langchain.CachedChatModel`;
``arena_do_inference.py``: ``do_inference`` on a prepared model). They build
the same prompts, so they share rows: run one, then the other on the same
store, and the second is all hits.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inference import ModelSpec

QUESTIONS = [
    ("00-story", "Write a two-sentence story about a lighthouse keeper."),
    ("01-train", "A train leaves at 3 pm at 60 km/h. How far has it gone by 5:30 pm?"),
    ("02-sky", "Explain in one sentence why the sky is blue."),
]
JUDGE_SYSTEM = "You are a fair judge. Compare two answers to a question."
JUDGE_TEMPLATE = (
    "[Question]\n{question}\n\n[Answer A]\n{answer_a}\n\n[Answer B]\n{answer_b}\n\n"
    "Which answer is better? Reply with one letter: A or B."
)

# vLLM on a small CPU for the tiny models (as .ci/demo sizes it); a GPU run drops these.
TINY_ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 8,
    "seed": 0,
    "kv_cache_memory_bytes": 64 << 20,
    "block_size": 32,
    "max_logprobs": 512,
}
TINY_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TORCH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
}


def arguments(description: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-a", help="first battle model: a Hub id or a folder")
    parser.add_argument("--model-b", help="second battle model")
    parser.add_argument("--judge", help="the judge model")
    parser.add_argument("--tiny", type=Path, metavar="DIR", help="build three tiny random models in DIR and use them")
    parser.add_argument("--store-root", type=Path, help="the store (default: JUDGESTORE_STORE_ROOT / _URL)")
    parser.add_argument("--task", default="arena-example")
    parser.add_argument("--max-tokens", type=int, default=256, help="answer length (tiny: 16)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.tiny is None and not (args.model_a and args.model_b and args.judge):
        parser.error("give --model-a, --model-b and --judge, or --tiny DIR")
    return args


def specs(args: argparse.Namespace) -> tuple[ModelSpec, ModelSpec, ModelSpec]:
    """The two battle models and the judge; the judge's first token keeps its top logprobs."""
    if args.tiny is None:
        answer = {"temperature": 0, "max_tokens": args.max_tokens}
        judge = {"temperature": 0, "max_tokens": 4, "logprobs": 20}
        return (
            ModelSpec(model=args.model_a, sampling=answer),
            ModelSpec(model=args.model_b, sampling=answer),
            ModelSpec(model=args.judge, sampling=judge),
        )
    from inference.backends.vllm.tiny_model import build_tiny_model

    for name, value in TINY_ENV.items():
        os.environ.setdefault(name, value)  # read by vLLM when a miss first imports it
    folders = [build_tiny_model(args.tiny / name, seed=seed) for seed, name in enumerate(("tiny-a", "tiny-b", "judge"))]
    answer = {"temperature": 0, "max_tokens": min(args.max_tokens, 16)}
    # A random model rarely ranks "A" or "B" among its top 20: ask for every token of its 512.
    judge = {"temperature": 0, "max_tokens": 4, "logprobs": 512}
    return (
        ModelSpec(model=str(folders[0]), label="tiny-a", sampling=answer, engine_kwargs=TINY_ENGINE),
        ModelSpec(model=str(folders[1]), label="tiny-b", sampling=answer, engine_kwargs=TINY_ENGINE),
        ModelSpec(model=str(folders[2]), label="tiny-judge", sampling=judge, engine_kwargs=TINY_ENGINE),
    )


@dataclass
class Battle:
    """One question judged in both orientations; ``p_b_*``: the judge's P(B) over {A, B} in each."""

    instruction_id: str
    p_b_direct: float | None  # A = model a, B = model b
    p_b_reversed: float | None  # A = model b, B = model a

    @property
    def model_b_preferred(self) -> float | None:
        """How much the judge prefers model b, both orientations averaged (0.5: no preference)."""
        views = [
            p for p in (self.p_b_direct, None if self.p_b_reversed is None else 1 - self.p_b_reversed) if p is not None
        ]
        return sum(views) / len(views) if views else None

    @property
    def consistent(self) -> bool | None:
        """The same model wins in both orientations (None: a verdict could not be read)."""
        if self.p_b_direct is None or self.p_b_reversed is None:
            return None
        return (self.p_b_direct > 0.5) == (self.p_b_reversed < 0.5)


def report(battles: list[Battle], labels: tuple[str, str], steps: list[tuple[str, int, int]], as_json: bool) -> None:
    """Print the battles, the preference for model b and the position consistency, and what the cache did."""
    read = [b for b in battles if b.consistent is not None]
    consistent = sum(bool(b.consistent) for b in read)
    prefs = [p for p in (b.model_b_preferred for b in battles) if p is not None]
    summary = {
        "model_a": labels[0],
        "model_b": labels[1],
        "model_b_preference": sum(prefs) / len(prefs) if prefs else None,
        "position_consistent": consistent,
        "battles_read": len(read),
        "battles": len(battles),
    }
    if as_json:
        steps_json = [{"step": s, "hits": h, "misses": m} for s, h, m in steps]
        print(json.dumps({"summary": summary, "battles": [asdict(b) for b in battles], "steps": steps_json}))
        return
    for step, hits, misses in steps:
        print(f"{step}: {hits} hits, {misses} generated")
    print(f"\n{'instruction':<14} {'P(B) direct':>12} {'P(B) reversed':>14} {'prefers b':>10} {'consistent':>11}")
    for b in battles:
        cells = [_number(b.p_b_direct), _number(b.p_b_reversed), _number(b.model_b_preferred)]
        mark = {True: "yes", False: "no", None: "n/a"}[b.consistent]
        print(f"{b.instruction_id:<14} {cells[0]:>12} {cells[1]:>14} {cells[2]:>10} {mark:>11}")
    print(f"\n{labels[1]} over {labels[0]}: preference {_number(summary['model_b_preference'])} (0.5: even)")
    print(f"position consistency: {consistent} of {len(read)} battles read in both orientations")


def _number(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"
