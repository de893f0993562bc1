"""Every legacy variant of docs/legacy-formats.md, built in its exact shape, imported and read back row for row.

Each case builds its files with raw sqlite3 (pandas/pyarrow for the DataFrame
caches), holding awkward content: multi-turn conversations, non-ASCII and
control characters, a ~250 k character completion, NULLs where the format
allows them, duplicate inputs. The expected rows are written out from the
legacy values and the legacy hashing rule (tests/legacy/builders.py), and
compared with what the ORM reads back: count, content checksum, and every
input hash recomputed from its stored input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from store.descriptor import input_hash
from store.errors import InvalidInputError
from store.legacy.detect import detect
from store.legacy.inputs import InputsTable
from store.logprobs import from_text_logprobs
from tests.legacy import builders as b
from tests.legacy.conftest import (
    TEXT,
    all_rows,
    checksum,
    expected_row,
    fixed,
    judgestore,
    mtime,
    run_import,
    stored_rows,
    utc,
)

T1, T2, T3 = "2026-02-01T10:00:00", "2026-02-02T09:30:00.250000+02:00", "2026-03-04 05:06:07Z"
TIMES = (T1, T2, T3)


@dataclass
class Case:
    sources: list[Path]
    expected: list[dict[str, Any]]
    counts: dict[str, int]  # imported, already_present, conflicts, skipped, failed
    variant: str
    import_kwargs: dict[str, Any] = field(default_factory=dict)
    expected_fn: Callable[[], list[dict[str, Any]]] | None = None  # for expectations known only after writing


def _legacy_tree_db(root: Path, kind: str, ddl: str, rows: list[dict[str, Any]], **kw: Any) -> Path:
    folder = b.legacy_folder(root, kind, "mt-bench", "VLLM", "Qwen/Qwen3-8B", b.s3_metadata("Qwen/Qwen3-8B", {}))
    return b.create_db(folder / f"{kind}.db", ddl, rows, **kw)


# ---------------------------------------------------------------- S3 onwards: completions


def _completion_rows(n: int, *, with_provenance: bool, usage: bool = False) -> tuple[list[dict[str, Any]], list]:
    legacy, expected = [], []
    for i, conversation in enumerate(b.conversations(n)):
        text = b.rendered_messages(conversation)
        when = TIMES[i % 3]
        row: dict[str, Any] = {
            "input_hash": b.sha(text),
            "input_text": text,
            "completion": b.completion_text(i),
            "benchmark": "mt-bench",
            "instruction_id": f"{i}-ñ",
            "model": "VLLM/Qwen/Qwen3-8B",
            "pushed_at": when,
        }
        if with_provenance:
            row |= {"pushed_by": f"user-{i % 2}", "run_id": f"slurm-{100 + i}"}
        usage_value = {"completion_tokens": i, "prompt_tokens": 10 * i} if usage and i % 2 else None
        if usage:
            row["usage_json"] = None if usage_value is None else b.legacy_dumps(usage_value)
        legacy.append(row)
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=row["completion"],
                benchmark="mt-bench",
                instruction_id=f"{i}-ñ",
                model="VLLM/Qwen/Qwen3-8B",
                usage=usage_value,
                run_id=row.get("run_id"),
                created_by=row.get("pushed_by"),
                created_at=utc(when),
            )
        )
    return legacy, expected


def case_s3c(root: Path) -> Case:
    rows, expected = _completion_rows(9, with_provenance=False)
    return Case([_legacy_tree_db(root, "completions", b.S3C_DDL, rows)], expected, {"imported": 9}, "S3c")


def case_s4c(root: Path) -> Case:
    rows, expected = _completion_rows(12, with_provenance=True)
    # leave_wal: the last transaction sits in the -wal file, as a killed writer leaves it
    path = _legacy_tree_db(root, "completions", b.S4C_DDL, rows, leave_wal=True)
    return Case([path], expected, {"imported": 12}, "S4c")


def case_s7c(root: Path) -> Case:
    rows, expected = _completion_rows(8, with_provenance=True, usage=True)
    return Case([_legacy_tree_db(root, "completions", b.S7C_DDL, rows)], expected, {"imported": 8}, "S7c")


def case_s4c_altered(root: Path) -> Case:
    """An old S4c file that got usage_json by ALTER TABLE, with rows written before (NULL) and after."""
    rows, expected = _completion_rows(8, with_provenance=True, usage=True)
    alter = ["ALTER TABLE completions ADD COLUMN usage_json TEXT"]
    path = _legacy_tree_db(root, "completions", b.S4C_DDL, rows, alter=alter)
    return Case([path], expected, {"imported": 8}, "S7c")


# ---------------------------------------------------------------- S3 onwards: judgements

ORIENTATIONS = [
    ("direct", "direct"),
    ("reversed", "reversed"),
    ("forward", "direct"),
    ("swapped", "reversed"),
    (None, None),
]


def _judgement_rows(
    n: int, *, provenance: bool, logprobs: bool, pointwise: bool, usage: bool = False, empty_model_b: bool = False
) -> tuple[list[dict[str, Any]], list]:
    """Judgement rows; every fourth is pointwise when ``pointwise`` (model_b NULL, or '' where it is NOT NULL)."""
    legacy, expected = [], []
    for i, conversation in enumerate(b.conversations(n)):
        text = b.rendered_messages([{"role": "system", "content": "Judge fairly. ⚖️"}, *conversation])
        when = TIMES[i % 3]
        legacy_orientation, orientation = ORIENTATIONS[i % len(ORIENTATIONS)]
        model_b: str | None = f"model-b-{i % 2}"
        if pointwise and i % 4 == 3:
            legacy_orientation, orientation, model_b = "single", None, None
        row: dict[str, Any] = {
            "input_hash": b.sha(text),
            "judge_input": text,
            "judge_completion": b.completion_text(i),
            "benchmark": "arena-hard",
            "instruction_id": str(i),
            "model_a": "model-á",
            "model_b": "" if model_b is None and empty_model_b else model_b,
            "judge": "VLLM/judge",
            "orientation": legacy_orientation,
            "pushed_at": when,
        }
        if provenance:
            row |= {"pushed_by": "ana", "run_id": f"run-{i % 3}"}
        # -inf: a masked token, which the legacy writer (json.dumps) wrote as -Infinity
        top = {"A": -0.01 * i, "B": -4.5, "Ü": -9.0, "X": -math.inf} if logprobs and i % 3 else None
        if logprobs:
            row["top_logprobs"] = None if top is None else b.legacy_dumps(top)
        usage_value = {"prompt_tokens": 100 + i} if usage and i % 2 == 0 else None
        if usage:
            row["usage_json"] = None if usage_value is None else b.legacy_dumps(usage_value)
        legacy.append(row)
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=row["judge_completion"],
                benchmark="arena-hard",
                instruction_id=str(i),
                model_a="model-á",
                model_b=model_b,
                judge="VLLM/judge",
                orientation=orientation,
                top_logprobs=None if top is None else from_text_logprobs(top),
                usage=usage_value,
                run_id=row.get("run_id"),
                created_by=row.get("pushed_by"),
                created_at=utc(when),
            )
        )
    return legacy, expected


def _judgement_case(root: Path, variant: str, ddl: str, n: int, **kw: Any) -> Case:
    alter = kw.pop("alter", ())
    rows, expected = _judgement_rows(n, **kw)
    path = _legacy_tree_db(root, "judgements", ddl, rows, alter=alter)
    return Case([path], expected, {"imported": n}, variant)


def case_s3j(root: Path) -> Case:
    return _judgement_case(root, "S3j", b.S3J_DDL, 10, provenance=False, logprobs=False, pointwise=False)


def case_s4j(root: Path) -> Case:
    return _judgement_case(root, "S4j", b.S4J_DDL, 10, provenance=True, logprobs=False, pointwise=False)


def case_s5j(root: Path) -> Case:
    return _judgement_case(root, "S5j", b.S5J_DDL, 10, provenance=True, logprobs=True, pointwise=False)


def case_s6j(root: Path) -> Case:
    return _judgement_case(root, "S6j", b.S6J_DDL, 12, provenance=True, logprobs=True, pointwise=True)


def case_s7j(root: Path) -> Case:
    return _judgement_case(root, "S7j", b.S7J_DDL, 12, provenance=True, logprobs=True, pointwise=True, usage=True)


def case_s6j_altered(root: Path) -> Case:
    alter = ["ALTER TABLE judgements ADD COLUMN usage_json TEXT"]
    return _judgement_case(
        root, "S7j", b.S6J_DDL, 12, provenance=True, logprobs=True, pointwise=True, usage=True, alter=alter
    )


def case_s4j_pointwise_empty_model_b(root: Path) -> Case:
    """model_b is NOT NULL in S4j: pointwise rows there say '' and 'single'; both mean pointwise."""
    rows, expected = _judgement_rows(8, provenance=True, logprobs=False, pointwise=True, empty_model_b=True)
    path = _legacy_tree_db(root, "judgements", b.S4J_DDL, rows)
    return Case([path], expected, {"imported": 8}, "S4j")


# ---------------------------------------------------------------- S2


def case_s2(root: Path) -> Case:
    metadata = {
        "descriptor_schema_version": "judgearena-inference-descriptor/v1",
        "model_spec": "VLLM/Qwen/Qwen3-8B",
        "model": "Qwen/Qwen3-8B",
        "input_mode": "chat",
        "chat_template": None,
        "chat_template_kwargs": {},
        "sampling": {"temperature": 0.0, "max_tokens": 64},
        "engine_settings": {"max_model_len": 4096},
        "vllm_version": "0.11.0",
    }
    folder = b.legacy_folder(root, "inference", "mt-bench", "VLLM", "Qwen/Qwen3-8B", metadata)
    inference, meta_rows, expected = [], [], []
    for i, conversation in enumerate(b.conversations(9)):
        canonical = b.s2_rendered(conversation)
        stored = b.s2_hash(canonical)
        judgement = i % 3 == 0
        meta: dict[str, Any] = {"benchmark": "mt-bench", "instruction_id": str(i)}
        if judgement:
            meta |= {
                "model_a": "a",
                "model_b": None if i == 3 else "b",
                "judge": "j",
                "orientation": "swapped" if i == 6 else "direct",
            }
        else:
            meta["model"] = "Qwen/Qwen3-8B"
        inference.append(
            {
                "input_hash": stored,
                "input_text": canonical,
                "output_text": b.completion_text(i),
                "producer_metadata_json": "{}",
                "pushed_by": "bo",
                "pushed_at": TIMES[i % 3],
                "run_id": "s2-run",
            }
        )
        observed = ["2026-01-01T00:00:00", "2026-01-02T00:00:00"] if i % 2 else ["2026-01-01T00:00:00"]
        for k, when in enumerate(observed):
            row_meta = meta if k == 0 else {**meta, "benchmark": "other-benchmark"}
            text = b.legacy_dumps(row_meta)
            meta_rows.append(
                {
                    "input_hash": stored,
                    "metadata_hash": b.sha(text),
                    "metadata_json": text,
                    "observed_at": when,
                    "run_id": "s2-run",
                }
            )
        ours = b.rendered_messages(conversation)
        role_values: dict[str, Any] = (
            {
                "model_a": "a",
                "model_b": None if i == 3 else "b",
                "judge": "j",
                "orientation": None if i == 3 else ("reversed" if i == 6 else "direct"),
            }
            if judgement
            else {"model": "Qwen/Qwen3-8B"}
        )
        expected.append(
            expected_row(
                input_hash=b.sha(ours),
                input_text=ours,
                completion=b.completion_text(i),
                benchmark="mt-bench",
                instruction_id=str(i),
                run_id="s2-run",
                created_by="bo",
                created_at=utc(TIMES[i % 3]),
                **role_values,
            )
        )
    path = folder / "inference.db"
    b.create_db(path, b.S2_DDL, inference, table="inference")
    _insert(path, meta_rows)
    return Case([path], expected, {"imported": 9}, "S2")


def _insert(path: Path, rows: list[dict[str, Any]]) -> None:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            "INSERT INTO inference_metadata VALUES "
            "(:input_hash, :metadata_hash, :metadata_json, :observed_at, :run_id)",
            rows,
        )
        conn.commit()


# ---------------------------------------------------------------- S0 and S1 (no descriptor: the user names one)


def case_s0(root: Path) -> Case:
    path = root / "cache" / "db" / "mt-bench" / "gpt-4.db"
    rows: list[dict[str, Any]] = []
    prompts = [f"[Question] {t}\n[Answer A] ...\n[Answer B] ..." for t in b.AWKWARD_TEXTS] + [b.LONG]
    for i, prompt in enumerate(prompts):
        completion = b.completion_text(i + 2)
        date = "" if i % 3 == 0 else TIMES[i % 3]
        rows.append(
            {
                "benchmark": "mt-bench",
                "instruction_id": str(i),
                "model_a": "a",
                "model_b": "b",
                "judge": "gpt-4",
                "judge_input": prompt,
                "judge_completion": completion,
                "reasoning_content": "thinking…" if i % 2 else "",
                "input_tokens": 11 * i,
                "output_tokens": 3 if i else 0,
                "reasoning_tokens": 0,
                "date": date,
            }
        )
    # A duplicate input with the same output (another instruction id: the identity key differs): already present.
    rows.append({**rows[1], "instruction_id": "dup-same"})
    # A duplicate input with a different output: a conflict, reported and not imported.
    rows.append({**rows[2], "instruction_id": "dup-other", "judge_completion": "a different verdict"})
    # An empty output: skipped.
    rows.append({**rows[3], "instruction_id": "empty", "judge_input": "unique prompt", "judge_completion": ""})
    b.create_db(path, b.S0_DDL, rows)

    def expected_rows() -> list[dict[str, Any]]:
        result = []
        for i, row in enumerate(rows[: len(prompts)]):
            text = b.rendered_messages([{"role": "user", "content": row["judge_input"]}])
            usage: dict[str, Any] = {}
            if row["input_tokens"]:
                usage["prompt_tokens"] = row["input_tokens"]
            if row["output_tokens"]:
                usage["completion_tokens"] = row["output_tokens"]
            if row["reasoning_content"]:
                usage["reasoning_content"] = row["reasoning_content"]
            result.append(
                expected_row(
                    input_hash=b.sha(text),
                    input_text=text,
                    completion=row["judge_completion"],
                    benchmark="mt-bench",
                    instruction_id=str(i),
                    model_a="a",
                    model_b="b",
                    judge="gpt-4",
                    usage=usage or None,
                    created_at=utc(row["date"]) if row["date"] else mtime(path),
                )
            )
        return result

    counts = {"imported": len(prompts), "already_present": 1, "conflicts": 1, "skipped": 1}
    return Case([path], [], counts, "S0", {"task": "mt-bench"}, expected_rows)


def case_s0_old(root: Path) -> Case:
    path = root / "old" / "judge.db"
    rows = [
        {
            "benchmark": "alpaca",
            "instruction_id": str(i),
            "model_a": "a",
            "model_b": "b",
            "judge": "j",
            "judge_input": f"prompt {i} ✓",
            "judge_completion": f"verdict {i}",
            "date": T1,
        }
        for i in range(5)
    ]
    b.create_db(path, b.S0_OLD_DDL, rows, wal=False)
    expected = [
        expected_row(
            input_hash=b.sha(b.rendered_messages([{"role": "user", "content": r["judge_input"]}])),
            input_text=b.rendered_messages([{"role": "user", "content": r["judge_input"]}]),
            completion=r["judge_completion"],
            benchmark="alpaca",
            instruction_id=r["instruction_id"],
            model_a="a",
            model_b="b",
            judge="j",
            created_at=utc(T1),
        )
        for r in rows
    ]
    return Case([path], expected, {"imported": 5}, "S0", {"task": "alpaca"})


def case_s0_text_mode(root: Path) -> Case:
    """Under a text-mode descriptor, an S0 prompt is a plain text input."""
    path = root / "text" / "judge.db"
    rows = [
        {
            "benchmark": "x",
            "instruction_id": str(i),
            "model_a": "a",
            "model_b": "b",
            "judge": "j",
            "judge_input": f"Rate this: {t}",
            "judge_completion": "7",
            "date": T1,
        }
        for i, t in enumerate(b.AWKWARD_TEXTS)
    ]
    b.create_db(path, b.S0_DDL, rows)
    expected = [
        expected_row(
            input_hash=b.sha(b.rendered_text(r["judge_input"])),
            input_text=b.rendered_text(r["judge_input"]),
            completion="7",
            benchmark="x",
            instruction_id=r["instruction_id"],
            model_a="a",
            model_b="b",
            judge="j",
            created_at=utc(T1),
        )
        for r in rows
    ]
    return Case([path], expected, {"imported": len(rows)}, "S0", {"task": "x", "resolver": fixed(TEXT)})


def _inputs_file(root: Path, lines: list[dict[str, Any]]) -> Path:
    path = root / "inputs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n", encoding="utf-8")
    return path


def case_s1c(root: Path) -> Case:
    path = root / "s1" / "completions.db"
    conversations = b.conversations(6)
    rows = [
        {
            "instruction_index": i,
            "completion": None if i == 4 else b.completion_text(i),
            "pushed_by": None if i == 2 else "cy",
            "pushed_at": None if i == 2 else T2,
            "run_id": None,
        }
        for i in range(6)
    ]
    rows.append(
        {"instruction_index": 99, "completion": "no input for me", "pushed_by": "cy", "pushed_at": T1, "run_id": "r"}
    )
    b.create_db(path, b.S1C_DDL, rows)
    inputs = _inputs_file(
        root, [{"instruction_index": i, "messages": c, "benchmark": "arena"} for i, c in enumerate(conversations)]
    )

    def expected_rows() -> list[dict[str, Any]]:
        out = []
        for i, c in enumerate(conversations):
            if i == 4:
                continue
            text = b.rendered_messages(c)
            out.append(
                expected_row(
                    input_hash=b.sha(text),
                    input_text=text,
                    completion=b.completion_text(i),
                    benchmark="arena",
                    instruction_id=str(i),
                    model="legacy-model",
                    created_by=None if i == 2 else "cy",
                    created_at=mtime(path) if i == 2 else utc(T2),
                )
            )
        return out

    counts = {"imported": 5, "skipped": 2}  # NULL completion; no input for index 99
    return Case([path], [], counts, "S1c", {"task": "arena", "inputs": inputs}, expected_rows)


def case_s1j(root: Path) -> Case:
    path = root / "s1" / "judgements.db"
    rows: list[dict[str, Any]] = [
        {
            "instruction_index": i,
            "model_A": "a",
            "model_B": f"b{i % 2}",
            "judge_input": None if i == 5 else f"Which is better ({i})? {b.AWKWARD_TEXTS[i % 7]}",
            "judge_output": "[[A]]" if i % 2 else "[[B]]",
            "pushed_by": "dee",
            "pushed_at": T3,
            "run_id": "s1",
        }
        for i in range(8)
    ]
    b.create_db(path, b.S1J_DDL, rows)
    expected = []
    for r in rows:
        if r["judge_input"] is None:
            continue
        text = b.rendered_messages([{"role": "user", "content": r["judge_input"]}])
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=r["judge_output"],
                instruction_id=str(r["instruction_index"]),
                model_a="a",
                model_b=r["model_B"],
                judge="legacy-model",
                run_id="s1",
                created_by="dee",
                created_at=utc(T3),
            )
        )
    return Case([path], expected, {"imported": 7, "skipped": 1}, "S1j", {"task": "arena"})


# ---------------------------------------------------------------- DataFrame caches (pandas / pyarrow)


def _mt_bench_expected(questions: list[list[str]], answers: Sequence[tuple[str | None, str | None]]) -> list:
    out = []
    for i, ((q1, q2), (a1, a2)) in enumerate(zip(questions, answers, strict=True)):
        turn1 = [{"role": "user", "content": q1}]
        for turn, messages, answer in (
            (1, turn1, a1),
            (2, [*turn1, {"role": "assistant", "content": a1 or ""}, {"role": "user", "content": q2}], a2),
        ):
            if not answer or (turn == 2 and not a1):
                continue
            text = b.rendered_messages(messages)
            out.append(
                expected_row(
                    input_hash=b.sha(text),
                    input_text=text,
                    completion=answer,
                    benchmark="mt-bench",
                    instruction_id=f"{81 + i}-turn-{turn}",
                    model="legacy-model",
                )
            )
    return out


def case_dataframes(root: Path) -> Case:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    cache = root / "data" / "cache"
    cache.mkdir(parents=True)
    conversations = b.conversations(5)
    completions = [b.completion_text(i) if i != 2 else None for i in range(5)]
    pd.DataFrame({"completion": completions, "instruction_index": range(5)}).to_csv(
        cache / "alpaca-eval_model-x.csv.zip", index=False
    )
    pd.DataFrame({"instruction_index": [10, 11], "completion": ["parquet ✓", "zweite Antwort"]}).to_parquet(
        cache / "arena-hard_model-x.parquet"
    )
    questions = [["Write a haiku about rain.", "Now one about snow ❄️"], ["日本の首都は？", "Und Deutschlands?"]]
    answers = [("Rain falls softly…", "Snow settles"), ("東京です。", None)]
    pd.DataFrame(
        {
            "instruction_index": [81, 82],
            "completion_turn_1": [a for a, _ in answers],
            "completion_turn_2": [a for _, a in answers],
        }
    ).to_csv(cache / "mt-bench_model-x.csv.zip", index=False)
    (cache / "elo").mkdir()
    pd.DataFrame(
        {
            "judge_completion": ["[[A]]", "[[B]]"],
            "instruction": ["q0", "q1"],
            "completion_A": ["x", "y"],
            "completion_B": ["z", "w"],
            "pref": [0.0, 1.0],
            "use_model_a_as_opponent": [True, False],
            "our_model_is_position_a": [False, True],
            "opponent_model": ["gpt-4", "llama"],
        }
    ).to_csv(cache / "elo" / "judge_model-x.csv.zip", index=False)
    lines: list[dict[str, Any]] = [{"instruction_index": i, "messages": c} for i, c in enumerate(conversations)]
    lines += [
        {"instruction_index": 10, "messages": [{"role": "user", "content": "Parquet question"}]},
        {"instruction_index": 11, "messages": [{"role": "user", "content": "Zweite Frage"}]},
    ]
    lines += [{"instruction_index": 81 + i, "turns": q, "benchmark": "mt-bench"} for i, q in enumerate(questions)]
    judge_inputs = [[{"role": "user", "content": f"Judge pair {k} ⚖️"}] for k in range(2)]
    lines += [
        {"row": k, "messages": m, "instruction_id": f"q{k}", "model": "model-x"} for k, m in enumerate(judge_inputs)
    ]
    inputs = _inputs_file(root, lines)
    # One inputs file serves every cache here: their instruction_index keys do not overlap.
    expected = []
    for i, c in enumerate(conversations):
        if completions[i] is None:
            continue
        text = b.rendered_messages(c)
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=completions[i],
                instruction_id=str(i),
                model="legacy-model",
            )
        )
    for idx, (question, answer) in ((10, ("Parquet question", "parquet ✓")), (11, ("Zweite Frage", "zweite Antwort"))):
        text = b.rendered_messages([{"role": "user", "content": question}])
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=answer,
                instruction_id=str(idx),
                model="legacy-model",
            )
        )
    expected += _mt_bench_expected(questions, answers)
    for k, m in enumerate(judge_inputs):
        text = b.rendered_messages(m)
        expected.append(
            expected_row(
                input_hash=b.sha(text),
                input_text=text,
                completion=["[[A]]", "[[B]]"][k],
                instruction_id=f"q{k}",
                # row 0 showed gpt-4 first (our_model_is_position_a False): [[A]] is a gpt-4 win, of the pair
                # (model-x, gpt-4) in reversed orientation; the opponent of row 0 once made it a pointwise row (was)
                model_a=["gpt-4", "model-x"][k],
                model_b=["model-x", "llama"][k],
                orientation=["reversed", "direct"][k],
                judge="legacy-model",
            )
        )
    sources = sorted(p for p in cache.rglob("*") if p.is_file())

    # 5 + 2 + 4 + 2 outputs; one NULL completion, one missing turn-2 answer
    counts = {"imported": 11, "skipped": 2}
    return Case(sources, expected, counts, "DF", {"task": "pass-level", "inputs": inputs})


CASES = {
    "S0": case_s0,
    "S0-old-columns": case_s0_old,
    "S0-text-mode": case_s0_text_mode,
    "S1c": case_s1c,
    "S1j": case_s1j,
    "S2": case_s2,
    "S3c": case_s3c,
    "S3j": case_s3j,
    "S4c-with-pending-wal": case_s4c,
    "S4j": case_s4j,
    "S4j-pointwise": case_s4j_pointwise_empty_model_b,
    "S5j": case_s5j,
    "S6j": case_s6j,
    "S7c": case_s7c,
    "S7j": case_s7j,
    "S4c-altered-usage_json": case_s4c_altered,
    "S6j-altered-usage_json": case_s6j_altered,
    "DataFrame-caches": case_dataframes,
}


def _without_time(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "created_at"} for r in rows]


@pytest.mark.parametrize("name", list(CASES))
def test_every_variant_is_imported_row_for_row(name: str, legacy_root: Path, store_root: Path) -> None:
    case = CASES[name](legacy_root)
    kwargs = dict(case.import_kwargs)
    resolver = kwargs.pop("resolver", fixed())
    detected = {d.variant for d in detect(case.sources).detections}
    assert detected == ({case.variant} if case.variant != "DF" else {"DF-completions", "DF-mt-bench", "DF-elo-judge"})
    report = run_import(case.sources, store_root, resolver, **kwargs)
    totals = report.totals()
    for key in ("imported", "already_present", "conflicts", "skipped", "failed"):
        assert totals[key] == case.counts.get(key, 0), (key, report.as_dict())
    assert report.ok
    expected = case.expected_fn() if case.expected_fn else case.expected
    rows = all_rows(store_root)
    assert len(rows) == len(expected)
    if name == "DataFrame-caches":  # no time is recorded: each file's modification time; compared without it
        assert checksum(_without_time(rows)) == checksum(_without_time(expected))
    else:
        assert checksum(rows) == checksum(expected)
    for row in rows:  # every key is judgestore's hash of the stored input
        assert row["input_hash"] == input_hash(row["input_text"])


def test_s3_onwards_keys_equal_the_legacy_hashes(legacy_root: Path, store_root: Path) -> None:
    """S3+ hashed the same canonical bytes: no row changes key on import."""
    case = case_s6j(legacy_root)
    report = run_import(case.sources, store_root)
    assert report.sources[0].rekeyed == 0
    assert {r["input_hash"] for r in all_rows(store_root)} == {r["input_hash"] for r in case.expected}


def test_s2_rows_are_rekeyed_from_the_quoted_hash(legacy_root: Path, store_root: Path) -> None:
    case = case_s2(legacy_root)
    report = run_import(case.sources, store_root)
    source = report.sources[0]
    assert source.rekeyed == 9
    assert any("extra S2 metadata rows" in note for note in source.notes)
    assert sorted(t.split("/")[0] for t in source.targets) == ["completions", "judgements"]


def test_a_langchain_cache_is_never_imported(legacy_root: Path, store_root: Path) -> None:
    path = b.create_db(
        legacy_root / ".langchain.db",
        b.LANGCHAIN_DDL,
        [{"prompt": '[{"lc": 1, "type": "constructor"}]', "llm": "VLLM params", "idx": 0, "response": "{}"}],
    )
    report = run_import([path], store_root)
    source = report.sources[0]
    assert (source.variant, source.status, source.rows, sum(source.skipped.values())) == ("LangChain", "skipped", 1, 1)
    assert "never imported" in (source.error or "")
    assert not store_root.exists()


def test_an_elo_row_whose_slots_cannot_be_known_fails_and_one_without_the_evaluated_model_is_skipped(
    legacy_root: Path, store_root: Path
) -> None:
    """An unreadable our_model_is_position_a was read as "ours first" (a guessed slot), and an opponent-first row
    was stored with model_b empty: a pointwise row to every filter (was)."""
    pd = pytest.importorskip("pandas")
    elo = legacy_root / "cache" / "elo"
    elo.mkdir(parents=True)
    flags = [True, False, None, True]
    pd.DataFrame(
        {"judge_completion": ["[[A]]", "[[B]]", "[[A]]", "[[B]]"], "instruction": ["q"] * 4,
         "completion_A": ["x"] * 4, "completion_B": ["y"] * 4, "pref": [0.0, 1.0, 0.0, 1.0],
         "use_model_a_as_opponent": [True] * 4, "our_model_is_position_a": flags,
         "opponent_model": ["gpt-4", "llama", "gpt-4", "gpt-4"]}
    ).to_csv(elo / "judge_ours.csv", index=False)  # fmt: skip
    lines = [{"row": k, "messages": [{"role": "user", "content": f"battle {k}"}], "model": "ours"} for k in range(3)]
    lines.append({"row": 3, "messages": [{"role": "user", "content": "battle 3"}]})  # no model named
    report = run_import([elo], store_root, task="arena", inputs=_inputs_file(legacy_root, lines))
    (source,) = report.sources
    assert (source.imported, sum(source.failed.values()), sum(source.skipped.values())) == (2, 1, 1)
    assert list(source.failed) == ["our_model_is_position_a is None, not true or false"]
    assert list(source.skipped) == ["the blob does not name the evaluated model: give model in its inputs line"]
    stored = sorted((r["model_a"], r["model_b"], r["orientation"]) for r in all_rows(store_root))
    assert stored == [("llama", "ours", "reversed"), ("ours", "gpt-4", "direct")]  # none pointwise
    with pytest.raises(InvalidInputError, match=r"unknown keys \['model'\] \(model names the evaluated model"):
        InputsTable.load(_inputs_file(legacy_root, [{"instruction_index": 0, "text": "q", "model": "ours"}]))


def test_pass_level_caches_without_descriptor_or_inputs_are_skipped(legacy_root: Path, store_root: Path) -> None:
    pd = pytest.importorskip("pandas")
    cache = legacy_root / "cache"
    cache.mkdir(parents=True)
    pd.DataFrame({"completion": ["a", "b"], "instruction_index": [0, 1]}).to_csv(cache / "x.csv.zip", index=False)
    no_inputs = run_import([cache], store_root, task="t")
    assert no_inputs.sources[0].skipped == {
        "DF-completions holds no inputs (only outputs keyed by position): pass --inputs FILE naming each input": 2
    }
    inputs = _inputs_file(legacy_root, [{"instruction_index": 0, "text": "q0"}])
    from store.legacy.importer import Attribution

    no_descriptor = run_import(
        [cache], store_root, lambda d: Attribution(None, reason="no descriptor"), task="t", inputs=inputs
    )
    assert no_descriptor.sources[0].skipped == {"no descriptor": 2}
    assert not store_root.exists()


def test_rows_the_inputs_file_does_not_cover_share_one_reason_and_no_inputs_names_the_option(
    legacy_root: Path, store_root: Path
) -> None:
    """Each missing index was its own reason (2,000 lines of report for 2,000 rows), and a cache imported without
    --inputs was blamed on the descriptor (was)."""
    pd = pytest.importorskip("pandas")
    cache = legacy_root / "cache"
    cache.mkdir(parents=True)
    pd.DataFrame({"completion": [f"a{i}" for i in range(50)], "instruction_index": range(50)}).to_csv(
        cache / "x.csv", index=False
    )
    inputs = _inputs_file(legacy_root, [{"instruction_index": 0, "messages": [{"role": "user", "content": "q0"}]}])
    report = run_import([cache], store_root, task="t", inputs=inputs)
    (source,) = report.sources
    assert source.imported == 1 and source.skipped == {"no input for its instruction_index in inputs.jsonl": 49}
    result = judgestore("import", str(cache), "--task", "t", "--store-root", str(store_root / "cli"))
    assert result.returncode == 1
    said = " ".join(result.stderr.split())
    assert "50 rows were not imported because their descriptor, task or inputs could not be named" in said
    assert "--inputs)" in said and "pass --inputs FILE naming each input" in said
    pd.DataFrame({"completion": ["a0"], "instruction_index": [0]}).to_csv(cache / "x.csv", index=False)
    one = judgestore("import", str(cache), "--task", "t", "--store-root", str(store_root / "cli"))
    assert "1 row was not imported because" in " ".join(one.stderr.split())  # "1 rows were" (was)


def test_an_s0_token_count_that_is_no_count_fails_its_row(legacy_root: Path, store_root: Path) -> None:
    """A text, a fraction or a negative number was imported as usage, and stats added it up (was)."""
    counts: list[object] = [12, "many", 7.5, -3]
    rows = [
        {"benchmark": "x", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "j",
         "judge_input": f"Rate answer {i}", "judge_completion": "7", "date": T1, "input_tokens": count}
        for i, count in enumerate(counts)
    ]  # fmt: skip
    b.create_db(legacy_root / "judge.db", b.S0_DDL, rows)
    report = run_import([legacy_root], store_root, task="x")
    (source,) = report.sources
    assert source.imported == 1 and sum(source.failed.values()) == 3
    assert {reason.split(": ", 1)[1] for reason in source.failed} == {"'many'", "7.5", "-3"}
    assert all(reason.startswith("column input_tokens is not a count of tokens") for reason in source.failed)
    ((stored,),) = stored_rows(store_root).values()
    assert stored["usage"] == {"prompt_tokens": 12}


def test_a_binary_answer_column_is_stored_as_its_text_or_fails_its_row(legacy_root: Path, store_root: Path) -> None:
    """pyarrow's binary column came back as bytes and was stored as the text "b'...'" (was)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    cache = legacy_root / "cache"
    cache.mkdir(parents=True)
    answers = ["bytes ✓".encode(), b"\xff\xfe not text"]
    pd.DataFrame({"completion": answers, "instruction_index": [0, 1]}).to_parquet(cache / "binary.parquet")
    lines = [{"instruction_index": i, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(2)]
    report = run_import([cache], store_root, task="t", inputs=_inputs_file(legacy_root, lines))
    (source,) = report.sources
    assert source.imported == 1 and source.failed == {"completion holds bytes that are not UTF-8 text": 1}
    ((stored,),) = stored_rows(store_root).values()
    assert stored["completion"] == "bytes ✓"
