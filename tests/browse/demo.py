"""A store like the one `.ci/demo` leaves, built through the API (no engine): what the browser tests look at.

Two models (``tiny-a``, ``tiny-b``) answer every instruction of ``demo-bench``
(task ``demo``); a judge (``tiny-judge``) judges every pair in both
orientations with first-token logprobs in the stored format. The
instructions make the cases a reader checks:

* ``00-writing``: both orientations favour ``tiny-a`` (they agree);
* ``01-coding``: markdown with code; ``tiny-b``'s answer holds a ``<script>``
  that would change the page's title and set ``window.__pwned``; each
  orientation favours the answer shown first (they disagree: position bias);
* ``02-multi``: two turns (the second input holds each model's first answer);
* ``03-text``: the judge's first token is ``[[``, so its verdict is read from
  its text (``[[B]]``);
* ``04``..``11``: more verdicts, for the judge's figures.

Rows are written at known, distinct times (``T0`` plus minutes), the
completion databases record runs, and one row of ``tiny-a`` was adopted from
an older descriptor (``judgestore adopt``), so the row page has all it shows.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

from store import CompletionRecord, JudgementRecord, ModelDescriptor, Store, input_hash
from store.adoption import adopt_rows
from store.descriptor import render_messages
from store.logprobs import PositionLogprobs, TokenLogprob, encode
from store.runs import record_run
from store.tables.records import AdoptionRecord, RunRecord

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TASK, BENCH = "demo", "demo-bench"
MODELS = ("tiny-a", "tiny-b")
JUDGE = "tiny-judge"
SCRIPT = "<script>document.title='pwned';window.__pwned=1</script>"
QUESTIONS = {
    "00-writing": "Write a two-sentence story about a lighthouse keeper who finds a message in a bottle.",
    "01-coding": "Write a Python function that reverses the words in a sentence.",
    "02-multi": "Name a prime number.",
    "03-text": "What is the sum of the first ten positive odd numbers?",
    **{f"{i:02d}-extra": f"Extra question number {i}." for i in range(4, 12)},
}
FOLLOW_UP = "Now name a bigger one."  # the second turn of 02-multi
ANSWERS = {
    ("00-writing", "tiny-a"): "The keeper found a **bottle**.\n\n- It held a map.\n- He smiled.",
    ("00-writing", "tiny-b"): "A bottle washed up; the keeper read it and wept.",
    ("01-coding", "tiny-a"): "```python\ndef reverse_words(s):\n    return ' '.join(reversed(s.split()))  # <b>\n```",
    ("01-coding", "tiny-b"): f"{SCRIPT} Use `split` and `join`.",
    ("02-multi", "tiny-a"): "Seven.",
    ("02-multi", "tiny-b"): "Two.",
}
FOLLOW_UP_ANSWERS = {"tiny-a": "Eleven is bigger.", "tiny-b": "Thirteen."}
# (instruction, orientation) -> (P(A), P(B)) at the first token; the rest of the mass on other tokens.
FIRST_TOKEN = {
    ("00-writing", "direct"): (0.80, 0.15),  # A = tiny-a: favours tiny-a
    ("00-writing", "reversed"): (0.25, 0.70),  # B = tiny-a: favours tiny-a too
    ("01-coding", "direct"): (0.60, 0.30),  # A = tiny-a: favours tiny-a
    ("01-coding", "reversed"): (0.55, 0.40),  # A = tiny-b: favours tiny-b: the orientations disagree
    ("02-multi", "direct"): (0.35, 0.60),
    ("02-multi", "reversed"): (0.58, 0.38),
}


def descriptor(model: str, **sampling: object) -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model=model, sampling={"temperature": 0, "max_tokens": 24, **sampling})


def first_token(p_a: float, p_b: float, token_ids: tuple[int, int] = (32, 33)) -> dict[str, object]:
    """Stored top logprobs of one position: A, B, a " A" variant of A's mass, and filler, sampled the likelier."""
    candidates = [
        TokenLogprob("A", math.log(p_a * 0.9), token_ids[0]),
        TokenLogprob(" A", math.log(p_a * 0.1), 362),
        TokenLogprob("B", math.log(p_b), token_ids[1]),
        TokenLogprob("The", math.log(max(1e-6, 1 - p_a - p_b)), 785),
    ]
    ranked = sorted(candidates, key=lambda c: -c.logprob)
    ranked = [dataclasses.replace(c, rank=i) for i, c in enumerate(ranked, 1)]
    return encode([PositionLogprobs(tuple(ranked), ranked[0])])


def extra_preference(i: int, orientation: str) -> tuple[float, float]:
    shown_first_bias = 0.1 if orientation == "direct" else -0.05
    p_a = min(0.9, max(0.05, 0.35 + 0.04 * i + shown_first_bias))
    return p_a, round(0.95 - p_a, 6)


def completion(model: str, instruction: str, messages: list[dict[str, str]], text: str, minute: int,
               **extra: object) -> CompletionRecord:  # fmt: skip
    rendered = render_messages(messages)
    return CompletionRecord(input_hash=input_hash(rendered), input_text=rendered, completion=text, benchmark=BENCH,
                            instruction_id=instruction, model=model, finish_reason="stop",
                            usage={"prompt_tokens": 20, "completion_tokens": 12, "engine_seconds": 0.25},
                            run_id="run-demo", created_by="tester", created_at=T0 + timedelta(minutes=minute),
                            **extra)  # type: ignore[arg-type]  # fmt: skip


def judge_prompt(question: str, first: str, second: str) -> list[dict[str, str]]:
    system = "You are an impartial judge. Reply with A if Assistant A's answer is better, B otherwise."
    user = f"[Question]\n{question}\n\n[Assistant A]\n{first}\n\n[Assistant B]\n{second}\n\n[Verdict]"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def answer_of(instruction: str, model: str) -> str:
    return ANSWERS.get((instruction, model), f"{model} answers {instruction}.")


def build(store: Store) -> None:
    """Fill ``store`` (a folder or a server) with the demo's databases (see the module docstring)."""
    minute = 0
    for model in MODELS:
        rows = []
        for instruction, question in QUESTIONS.items():
            first = [{"role": "user", "content": question}]
            rows.append(completion(model, instruction, first, answer_of(instruction, model), minute))
            minute += 1
            if instruction == "02-multi":
                second = [*first, {"role": "assistant", "content": answer_of(instruction, model)},
                          {"role": "user", "content": FOLLOW_UP}]  # fmt: skip
                rows.append(completion(model, instruction, second, FOLLOW_UP_ANSWERS[model], minute))
                minute += 1
        database = store.database("completions", TASK, descriptor(model))
        database.put_many(rows)
        record_run(database, run_record(len(rows)))
        record_run(database, run_record(len(rows), rerun=True))  # the same run again: all hits
    judgements = []
    for i, (instruction, question) in enumerate(QUESTIONS.items()):
        for orientation in ("direct", "reversed"):
            a, b = MODELS if orientation == "direct" else MODELS[::-1]
            text_a, text_b = answer_of(instruction, a), answer_of(instruction, b)
            if instruction == "02-multi":
                text_a, text_b = FOLLOW_UP_ANSWERS[a], FOLLOW_UP_ANSWERS[b]
            rendered = render_messages(judge_prompt(question, text_a, text_b))
            if instruction == "03-text":  # the verdict's letter is not the first token: read from the text
                top = encode([PositionLogprobs((TokenLogprob("[[", -0.01, 10, 1),), TokenLogprob("[[", -0.01, 10, 1))])
                verdict_text = "[[B]]" if orientation == "direct" else "[[A]]"  # tiny-b both times
            else:
                p_a, p_b = FIRST_TOKEN.get((instruction, orientation)) or extra_preference(i, orientation)
                top = first_token(p_a, p_b)
                verdict_text = ("A" if p_a > p_b else "B") + f": {a if p_a > p_b else b} is better."
                if instruction == "01-coding":  # the judge quotes the script: text there too
                    verdict_text += f" It wrote {SCRIPT}"
            judgements.append(
                JudgementRecord(
                    input_hash=input_hash(rendered),
                    input_text=rendered,
                    completion=verdict_text,
                    benchmark=BENCH,
                    instruction_id=instruction,
                    model_a=a,
                    model_b=b,
                    judge=JUDGE,
                    orientation=orientation,
                    finish_reason="stop",
                    top_logprobs=top,
                    usage={"prompt_tokens": 80, "completion_tokens": 8},
                    run_id="run-judge",
                    created_by="tester",
                    created_at=T0 + timedelta(hours=1, minutes=minute),
                )
            )
            minute += 1
    store.database("judgements", TASK, descriptor(JUDGE, max_tokens=8, logprobs=5)).put_many(judgements)
    _adopted_row(store)


def run_record(rows: int, *, rerun: bool = False) -> RunRecord:
    """The accounting of the run that wrote a database's rows, or of the same run again (all hits)."""
    start = T0 + timedelta(hours=2 if rerun else 0)
    spent = {"prompt_tokens": 20 * rows, "completion_tokens": 12 * rows, "engine_seconds": 0.25 * rows}
    saved = {"saved_" + name: value for name, value in spent.items()}
    return RunRecord(
        role="completions",
        run_id="run-again" if rerun else "run-demo",
        created_by="tester",
        started_at=start,
        finished_at=start + timedelta(minutes=1 if rerun else 30),
        mode="use",
        requested=rows,
        distinct_inputs=rows,
        hits=rows if rerun else 0,
        misses=0 if rerun else rows,
        duplicates=0,
        generated=0 if rerun else rows,
        rows_written=0 if rerun else rows,
        truncated=0,
        **({name: 0 for name in spent} if rerun else spent),  # type: ignore[arg-type]
        **(saved if rerun else {name: 0 for name in saved}),  # type: ignore[arg-type]
        hits_without_cost=0,
        wall_seconds=0.1 if rerun else 30.0,
    )


OLD = descriptor("tiny-a").model_copy(update={"backend_version": "0.10.0"})
ADOPTED_QUESTION = "An older question, answered by an older vLLM."


def _adopted_row(store: Store) -> None:
    """One row of tiny-a under an older vLLM, adopted into tiny-a's database (as `judgestore adopt` does)."""
    source = store.database("completions", TASK, OLD)
    source.put_many([completion("tiny-a", "99-old", [{"role": "user", "content": ADOPTED_QUESTION}], "Old.", 200)])
    target = store.database("completions", TASK, descriptor("tiny-a"))
    audit = AdoptionRecord(source_descriptor=OLD.sha256(), source_task=TASK, source_rows=1,
                           details={"across": ["backend_version"]}, sampled=1, exact=1, max_abs_logprob_delta=None,
                           top_tokens_changed=0, sample_seed=0, min_exact=1.0, max_logprob_delta=None)  # fmt: skip
    adopt_rows(source, target, audit)
