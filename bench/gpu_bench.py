"""Issue 22 on a GPU: a cold judgestore run beside a plain ``LLM.chat``, on a ~1B-parameter random Llama.

Usage::

    python bench/gpu_bench.py [--prompts 2000] [--max-tokens 128] [--reps 5] [--budget 300]
                              [--model-dir DIR] [--eager] [--no-before] [--own-process] [--json out.json]

Needs a CUDA GPU and vLLM. Nothing is downloaded: the model is
:data:`inference.backends.vllm.tiny_model.LLAMA_1B` (Llama 3.2 1B's body, 16
layers, hidden 2048, MLP 8192, 32 heads, 8 key-value heads, float16, ~0.98
billion parameters) with the tiny model's 512-token vocabulary, built into
``--model-dir`` unless a model is already there.

The prompts are ``--prompts`` distinct chats of 2 to 11 lines of English (90
to 563 tokens as the chat template renders them); sampling is greedy,
``--max-tokens`` tokens at most. One engine with vLLM's own defaults for
the GPU (CUDA graphs, ``max_num_seqs``, memory) except
``max_model_len=2048`` and ``seed=0``, and ``--eager`` for no CUDA graphs;
its core runs in this process (the scheduler's peaks are seen), or with
``--own-process`` in a process of its own, vLLM's default (they are not).
Measured on it, interleaved (the engine part of
``bench/inference_bench.py``, with this model and these prompts):

* judgestore, cold: ``CachedModel(Store(fresh folder), ...).complete(prompts)``,
  what ``judgestore generate`` runs: plan, every miss added to the engine at
  once, rows written every 64 as they finish;
* plain ``LLM.chat`` of the same rendered chats on the same engine;
* judgestore sending 64 misses at a time (before issue 22), unless
  ``--no-before``.

Each is called once untimed first (the warm-up), under a recording scheduler:
the most requests vLLM held (running + waiting) and ran at once, the tokens
generated, and how many texts equal the plain call's (half precision may
round one logit the other way when the batch differs; counted, not required).
Then ``--reps`` interleaved timed calls each (fewer if they would not fit in
``--budget`` seconds, judged by the check calls). Every call starts with vLLM's
prefix cache emptied, so none finds the prompts a call before it computed.
tokens/s = tokens of the check call / median wall. The vocabulary is small, so each engine step costs less
than with a real 128k-token vocabulary: the cache's own share of the time is
larger here than it would be with a real model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/gpu_bench.py` from anywhere

from bench.common import format_seconds, print_table, write_json  # noqa: E402
from bench.inference_bench import PLAIN, EngineBench, EngineCase, log  # noqa: E402
from inference.backends.vllm.tiny_model import CORPUS, LLAMA_1B, build_tiny_model  # noqa: E402
from inference.requests import CompletionRequest  # noqa: E402

# Where the engine core runs (VLLM_ENABLE_V1_MULTIPROCESSING) is EngineBench's to set: --own-process.
GPU_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
MAX_MODEL_LEN = 2048


def prompts(n: int) -> list[CompletionRequest]:
    """``n`` distinct chats of 2 to 11 lines of the tiny model's corpus, each under its own number."""
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    return [
        CompletionRequest(
            messages=[
                {"role": "system", "content": "You are a careful judge. Answer with a verdict and one reason."},
                {
                    "role": "user",
                    "content": f"Case {i}.\n" + "\n".join(lines[(i + j) % len(lines)] for j in range(2 + i % 10)),
                },
            ]
        )
        for i in range(n)
    ]


def gpu_case(n: int, max_tokens: int, eager: bool, before: bool) -> EngineCase:
    engine_kwargs: dict[str, Any] = {"max_model_len": MAX_MODEL_LEN, "seed": 0}
    if eager:
        engine_kwargs["enforce_eager"] = True
    return EngineCase(
        engine_kwargs=engine_kwargs,
        sampling={"temperature": 0, "max_tokens": max_tokens},
        requests=prompts(n),
        env=GPU_ENV,
        same_texts=False,
        beside=before,
    )


class OtherModelError(Exception):
    """``--model-dir`` holds a model of another shape than LLAMA_1B."""


def model_folder(path: Path) -> Path:
    """``path`` holding LLAMA_1B: built there unless it is already there; a model of another shape there is an
    :class:`OtherModelError` (the figures would be another model's)."""
    if (path / "model.safetensors").exists():
        config = json.loads((path / "config.json").read_text())
        wanted = {"hidden_size": LLAMA_1B.hidden_size, "num_hidden_layers": LLAMA_1B.num_layers}
        if found := {key: config.get(key) for key in wanted if config.get(key) != wanted[key]}:
            raise OtherModelError(f"{path} holds another model ({found}, LLAMA_1B has {wanted}): give another folder")
        log(f"model: reusing {path}")
        return path
    t0 = time.perf_counter()
    build_tiny_model(path, seed=0, shape=LLAMA_1B)
    log(f"model: LLAMA_1B ({LLAMA_1B.parameters / 1e9:.2f}B parameters) built in {time.perf_counter() - t0:.0f} s")
    return path


def gpu_facts() -> dict[str, Any]:
    import torch
    import vllm

    return {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "vllm": vllm.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def report(bench: EngineBench) -> list[dict[str, Any]]:
    plain = bench.timings[PLAIN]
    plain_rate = bench.tokens[PLAIN] / plain.median
    rows, out = [], []
    for name, timing in bench.timings.items():
        rate = bench.tokens[name] / timing.median
        peaks = None if bench.own_process else bench.peaks[name]  # the scheduler runs in the core's process
        rows.append(
            [
                name,
                format_seconds(timing.median),
                format_seconds(bench.check_seconds[name]),
                f"{bench.tokens[name]:,}",
                f"{rate:,.0f}",
                f"{rate / plain_rate:.3f}x",
                f"{timing.median / plain.median:.3f}x",
                "-" if peaks is None else str(peaks.held),
                "-" if peaks is None else str(peaks.running),
                f"{bench.same_texts[name]:,}",
            ]
        )
        out.append(
            {
                "name": name,
                "median_s": timing.median,
                "times_s": timing.times,
                "check_call_s": bench.check_seconds[name],
                "tokens": bench.tokens[name],
                "tokens_per_s": rate,
                "throughput_vs_plain": rate / plain_rate,
                "wall_vs_plain": timing.median / plain.median,
                "peak_held": None if peaks is None else peaks.held,
                "peak_running": None if peaks is None else peaks.running,
                "texts_equal_to_plain": bench.same_texts[name],
            }
        )
    print()
    headers = [
        "run",
        "median",
        "check call",
        "tokens",
        "tokens/s",
        "throughput vs plain",
        "wall vs plain",
        "held",
        "running",
        "same text",
    ]
    print_table(headers, rows, right=tuple(range(1, 10)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2000, help="chat prompts per call (default 2000)")
    parser.add_argument("--max-tokens", type=int, default=128, help="greedy tokens at most per prompt (default 128)")
    parser.add_argument("--reps", type=int, default=5, help="timed calls of each variant at most (default 5)")
    parser.add_argument(
        "--budget", type=float, default=300, help="seconds for the check and timed calls: fewer reps if need be"
    )
    parser.add_argument("--model-dir", type=Path, help="where the model is built or found (default: a temp folder)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager=True: no CUDA graphs, no compilation")
    parser.add_argument(
        "--no-before",
        action="store_true",
        help="run only judgestore and the plain call: skip the variants beside them (64 misses at a time, the "
        "database already created, no store)",
    )
    parser.add_argument(
        "--own-process", action="store_true", help="the engine core in a process of its own (vLLM's default)"
    )
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.reps < 1:
        parser.error("--prompts and --reps must be at least 1")
    if not 1 <= args.max_tokens < MAX_MODEL_LEN:
        parser.error(f"--max-tokens must be between 1 and {MAX_MODEL_LEN - 1} (the engine's max_model_len)")
    if args.budget <= 0:
        parser.error("--budget must be positive")
    import torch

    if not torch.cuda.is_available():  # before minutes of building: on a CPU vLLM fails on memory, or runs for hours
        parser.error(f"no CUDA GPU here (torch {torch.__version__}): this benchmark measures one")

    workdir = Path(tempfile.mkdtemp(prefix="judgestore-gpu-bench-"))
    started = time.perf_counter()
    try:
        try:
            model_dir = model_folder(args.model_dir or workdir / "llama-1b")
        except (OtherModelError, OSError, ValueError) as e:  # ValueError: a config.json that is not JSON
            parser.error(str(e))
        case = gpu_case(args.prompts, args.max_tokens, args.eager, not args.no_before)
        bench = EngineBench(
            workdir,
            args.reps,
            model_dir=model_dir,
            case=case,
            warmup=False,
            budget_s=args.budget,
            own_process=args.own_process,
        )
        bench.run()
        facts = gpu_facts()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = report(bench)
    notes = [
        *bench.notes,
        f"engine built in {bench.build_seconds:.0f} s; medians of {bench.reps} interleaved calls after one untimed "
        f"call each; {time.perf_counter() - started:.0f} s in all",
        "; ".join(f"{k} {v}" for k, v in facts.items()),
    ]
    for note in notes:
        print(f"* {note}")
    if args.json:
        given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(args.json, {"facts": facts, "args": given | {"model_dir": str(model_dir)}, "runs": rows})
    print(json.dumps({r["name"].strip(): round(r["throughput_vs_plain"], 4) for r in rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
