"""Result lines of a request that failed, and pairs refused over one."""

from __future__ import annotations

import io
import math
from pathlib import Path

import orjson
import pytest

from inference.jsonl import FirstSampleWarning, UnpairedAnswersWarning, make_pairs, response_row, write_responses
from inference.requests import CompletionRequest, Response, Sample
from store.descriptor import input_hash
from store.errors import InvalidInputError, PromptTooLongError


def ask(i: int) -> CompletionRequest:
    return CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}], benchmark="b", instruction_id=str(i))


def answered(i: int, model: str) -> Response:
    sample = Sample(input_hash(ask(i).render_bytes("chat")), 0, f"{model} says {i}", "stop", None, None, cached=False)
    return Response(ask(i), (sample,))


def failed(i: int) -> Response:
    error = PromptTooLongError("the prompt is 300 tokens,\nand the model's context is 256")
    return Response(ask(i), (Sample(f"h{i}", 0, "", None, None, None, cached=False, error=error),))


def test_a_failed_request_has_a_typed_one_line_error_and_no_completion() -> None:
    row = response_row(failed(1), "m")
    assert row["completion"] is None and row["cached"] is False
    assert row["error"] == {
        "type": "PromptTooLongError",
        "message": "the prompt is 300 tokens, and the model's context is 256",
    }
    assert response_row(answered(0, "m"), "m")["error"] is None


def test_result_lines_keep_infinities_and_nan_as_the_store_gives_them() -> None:
    """A masked token's -inf logprob, a NaN in usage: written as null, like a JSON null stored there (was)."""
    logprobs = {"positions": [{"token": "A", "candidates": [{"logprob": -math.inf, "rank": 2}, {"logprob": -0.5}]}]}
    usage = {"engine_seconds": math.nan, "prompt_tokens": 3, "none": None}
    samples = tuple(
        Sample(input_hash(ask(0).render_bytes("chat"), k), k, "A", "stop", usage, logprobs, cached=True)
        for k in range(2)
    )
    out = io.BytesIO()
    write_responses(out, [Response(ask(0), samples)], "m")
    line = orjson.loads(out.getvalue())
    for sample in [line, *line["samples"]]:
        assert sample["top_logprobs"]["positions"][0]["candidates"][0]["logprob"] == {"$float": "-Infinity"}
        assert sample["usage"] == {"engine_seconds": {"$float": "NaN"}, "none": None, "prompt_tokens": 3}


def test_pairs_refuse_an_answers_file_with_a_failed_line(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"".join(orjson.dumps({"messages": ask(i).messages, "instruction_id": str(i),
                                               "benchmark": "b"}) + b"\n" for i in range(2)))  # fmt: skip
    with (tmp_path / "a.jsonl").open("wb") as out:
        write_responses(out, [answered(0, "a"), answered(1, "a")], "a")
    with (tmp_path / "b.jsonl").open("wb") as out:
        write_responses(out, [answered(0, "b"), failed(1)], "b")
    with pytest.raises(InvalidInputError, match=r"b.jsonl:2: b failed on this request \(PromptTooLongError: the"):
        make_pairs(prompts, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])


@pytest.mark.parametrize("messages", [5, [], [{"role": "user"}], "q0"])
def test_pairs_refuse_a_prompt_whose_messages_are_not_a_conversation(tmp_path: Path, messages: object) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(orjson.dumps({"messages": messages, "instruction_id": "0", "benchmark": "b"}) + b"\n")
    for model in ("a", "b"):
        with (tmp_path / f"{model}.jsonl").open("wb") as out:
            write_responses(out, [answered(0, model)], model)
    with pytest.raises(InvalidInputError, match=r"messages|message 0"):
        make_pairs(prompts, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])


def _prompts(tmp_path: Path, ids: list[str | None]) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"messages": ask(i).messages} | ({} if id_ is None else {"instruction_id": id_, "benchmark": "b"})
             for i, id_ in enumerate(ids)]  # fmt: skip
    prompts.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return prompts


def _answers(tmp_path: Path, model: str, responses: list[Response]) -> Path:
    path = tmp_path / f"{model}.jsonl"
    with path.open("wb") as out:
        write_responses(out, responses, model)
    return path


@pytest.mark.parametrize("ids", [[None, None, None], ["81", "81"]], ids=["no ids", "two turns of one id"])
def test_pairs_refuse_prompts_that_share_their_ids_rather_than_pair_one_with_anothers_answer(
    tmp_path: Path, ids: list[str | None]
) -> None:
    prompts = _prompts(tmp_path, ids)
    # What generate writes for these prompts: one line per prompt, the same ids on each.
    answers = [
        _answers(tmp_path, m, [Response(CompletionRequest(messages=ask(i).messages, benchmark=None if id_ is None
                 else "b", instruction_id=id_), answered(i, m).samples) for i, id_ in enumerate(ids)])
        for m in ("a", "b")
    ]  # fmt: skip
    with pytest.raises(InvalidInputError, match="a second time; pairs joins answers to prompts on these ids"):
        make_pairs(prompts, answers)
    # An answers file with one line per id still meets the prompts' repeated id.
    single = [_answers(tmp_path, m, [answered(0, m)]) for m in ("a", "b")]
    with pytest.raises(InvalidInputError, match="two prompts share"):
        make_pairs(_prompts(tmp_path, ["0", "0"]), single)


def test_pairs_of_two_models_run_under_one_name_say_so(tmp_path: Path) -> None:
    """Two model folders both named tiny-llama: "answers ... a second time; pairs joins answers to prompts on these
    ids", blaming ids that were fine (was)."""
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir(), second.mkdir()
    answers = [
        _answers(folder, "tiny-llama", [answered(i, "tiny-llama") for i in (0, 1)]) for folder in (first, second)
    ]
    with pytest.raises(InvalidInputError, match="two models run under one name") as refused:
        make_pairs(_prompts(tmp_path, ["0", "1"]), answers)
    assert str(answers[0]) in str(refused.value) and "--label" in str(refused.value)


def test_pairs_join_each_prompt_to_its_own_answers(tmp_path: Path) -> None:
    answers = [_answers(tmp_path, m, [answered(i, m) for i in (1, 0)]) for m in ("a", "b")]
    pairs = make_pairs(_prompts(tmp_path, ["0", "1"]), answers)
    assert [(p["question"], p["answer_a"], p["answer_b"]) for p in pairs] == [
        ("q0", "a says 0", "b says 0"),
        ("q1", "a says 1", "b says 1"),
    ]


def test_answers_no_prompt_names_are_said_to_be_left_out_and_a_file_given_twice_is_refused(tmp_path: Path) -> None:
    """An empty prompts file paired nothing of every answer, "0 pairs written", exit 0, and an answers file given
    twice was "answers ... a second time" of its own first line (was)."""
    answers = [_answers(tmp_path, m, [answered(i, m) for i in (0, 1)]) for m in ("a", "b")]
    with pytest.warns(UnpairedAnswersWarning, match=r"^2 answer lines name no prompt of .*prompts.jsonl \(first "):
        pairs = make_pairs(_prompts(tmp_path, ["0"]), answers)  # a subset: paired, the rest said
    assert [p["instruction_id"] for p in pairs] == ["0"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.warns(UnpairedAnswersWarning, match=r"^4 answer lines name no prompt of .*empty.jsonl"):
        assert make_pairs(empty, answers) == []
    with pytest.raises(InvalidInputError, match="is given twice as --answers"):
        make_pairs(_prompts(tmp_path, ["0"]), [answers[0], answers[0]])


def test_pairs_of_answers_with_several_samples_pair_the_first_and_say_so(tmp_path: Path) -> None:
    """With n = 2 the second sample was dropped without a word (was)."""

    def sampled(i: int, model: str) -> Response:
        key = input_hash(ask(i).render_bytes("chat"))
        return Response(ask(i), tuple(Sample(key, k, f"{model} says {i}.{k}", "stop", None, None, cached=False)
                                      for k in range(2)))  # fmt: skip

    answers = [_answers(tmp_path, "a", [sampled(i, "a") for i in (0, 1)]), _answers(tmp_path, "b", [answered(0, "b"),
               answered(1, "b")])]  # fmt: skip
    with pytest.warns(FirstSampleWarning, match=r"2 answer lines hold several samples .*the others are not judged"):
        pairs = make_pairs(_prompts(tmp_path, ["0", "1"]), answers)
    assert [p["answer_a"] for p in pairs] == ["a says 0.0", "a says 1.0"]


def test_a_pair_of_a_conversation_shows_the_judge_the_whole_of_it(tmp_path: Path) -> None:
    """A system prompt and earlier turns were dropped: the judge rated the last turn's answers out of context."""
    turns = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "turn 1"},
             {"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "turn 2"}]  # fmt: skip
    prompt = CompletionRequest(messages=turns, benchmark="b", instruction_id="0")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(orjson.dumps({"messages": turns, "benchmark": "b", "instruction_id": "0"}) + b"\n")
    key = input_hash(prompt.render_bytes("chat"))
    answers = [
        _answers(tmp_path, m, [Response(prompt, (Sample(key, 0, f"{m} says", "stop", None, None, cached=False),))])
        for m in ("a", "b")
    ]
    (pair,) = make_pairs(prompts, answers)
    assert pair["question"] == "System: Be terse.\n\nUser: turn 1\n\nAssistant: answer 1\n\nUser: turn 2"


def test_pairs_refuse_an_answer_to_another_prompt_under_the_same_ids(tmp_path: Path) -> None:
    """A prompt edited after one model answered it was paired with that answer to the old prompt (was)."""
    answers = [_answers(tmp_path, m, [answered(i, m) for i in (0, 1)]) for m in ("a", "b")]
    prompts = _prompts(tmp_path, ["0", "1"])
    edited = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    edited[1]["messages"][0]["content"] = "q1, reworded"
    prompts.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in edited))
    with pytest.raises(InvalidInputError, match=r"a.jsonl:2: a answered another prompt than .*prompts.jsonl's b/1"):
        make_pairs(prompts, answers)
    for path in answers:  # lines without an input_hash (made by hand) are joined on their ids alone
        path.write_bytes(b"".join(orjson.dumps(orjson.loads(line) | {"input_hash": None}) + b"\n"
                                  for line in path.read_bytes().splitlines()))  # fmt: skip
    assert [p["question"] for p in make_pairs(prompts, answers)] == ["q0", "q1, reworded"]


def test_pairs_refuse_an_answer_that_is_not_text(tmp_path: Path) -> None:
    answers = [_answers(tmp_path, m, [answered(0, m)]) for m in ("a", "b")]
    row = orjson.loads(answers[1].read_bytes()) | {"completion": None}
    answers[1].write_bytes(orjson.dumps(row) + b"\n")
    with pytest.raises(InvalidInputError, match=r"b.jsonl:1: completion must be a string, got None"):
        make_pairs(_prompts(tmp_path, ["0"]), answers)


def test_each_sample_of_a_line_carries_its_own_finish_reason_usage_and_logprobs() -> None:
    """With n > 1 the samples' lines had only text, cached and error: what each stopped at and cost was stored but
    never written out (was)."""
    logprobs = {"format": "judgestore-logprobs/v1", "positions": []}
    samples = (
        Sample("h0", 0, "short", "stop", {"prompt_tokens": 3, "completion_tokens": 1}, None, cached=True),
        Sample("h0-1", 1, "long", "length", {"prompt_tokens": 3, "completion_tokens": 8}, logprobs, cached=False),
    )
    row = response_row(Response(ask(0), samples), "m")
    assert [(s["sample_index"], s["finish_reason"], s["usage"], s["top_logprobs"]) for s in row["samples"]] == [
        (0, "stop", {"completion_tokens": 1, "prompt_tokens": 3}, None),
        (1, "length", {"completion_tokens": 8, "prompt_tokens": 3}, logprobs),
    ]
    assert list(row["samples"][1]["usage"]) == ["completion_tokens", "prompt_tokens"]  # as a hit's reads back


def test_a_prompt_a_model_did_not_answer_names_the_model_its_file_and_the_prompt(tmp_path: Path) -> None:
    answers = [_answers(tmp_path, "a", [answered(i, "a") for i in (0, 1)]), _answers(tmp_path, "b", [answered(0, "b")])]
    with pytest.raises(InvalidInputError) as refused:
        make_pairs(_prompts(tmp_path, ["0", "1"]), answers)
    said = str(refused.value)  # (was: "b has no answer for b/1", naming neither file)
    assert said.startswith(f"b ({tmp_path / 'b.jsonl'}) has no answer for {tmp_path / 'prompts.jsonl'}'s ")
    assert "b/1" in said


def test_a_file_that_opens_with_a_byte_order_mark_and_an_empty_n_reads_as_without_them(tmp_path: Path) -> None:
    """Windows PowerShell's UTF-8 opens with a byte order mark, and pandas writes an empty `n` cell as null: both
    lines were refused (was). A mark anywhere else is still no JSON."""
    from inference.jsonl import read_completion_requests, read_judgement_requests

    plain = [{"text": "hello", "instruction_id": "1"}, {"text": "again", "n": 2}]
    given = [{**plain[0], "n": None}, {**plain[1], "n": 2.0}]  # pandas writes a column with an empty cell as floats
    (tmp_path / "plain.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in plain))
    (tmp_path / "marked.jsonl").write_bytes(b"\xef\xbb\xbf" + b"".join(orjson.dumps(row) + b"\r\n" for row in given))
    read = read_completion_requests(tmp_path / "marked.jsonl")
    assert [(r.text, r.n) for r in read] == [(r.text, r.n) for r in read_completion_requests(tmp_path / "plain.jsonl")]
    assert [r.n for r in read] == [1, 2]
    judged = tmp_path / "judged.jsonl"
    judged.write_bytes(b"\xef\xbb\xbf" + orjson.dumps({"text": "x", "model_a": "m", "n": None}) + b"\n")
    assert [r.n for r in read_judgement_requests(judged, to_store=True)] == [1]
    (tmp_path / "late.jsonl").write_bytes(orjson.dumps(plain[0]) + b"\n\xef\xbb\xbf" + orjson.dumps(plain[1]) + b"\n")
    with pytest.raises(InvalidInputError, match=r"late\.jsonl:2: not valid JSON"):
        read_completion_requests(tmp_path / "late.jsonl")
    for n in (0, 2.5):
        (tmp_path / "bad.jsonl").write_bytes(orjson.dumps({"text": "x", "n": n}) + b"\n")
        with pytest.raises(InvalidInputError, match=rf"bad\.jsonl:1: n must be an integer from 1.*got {n}"):
            read_completion_requests(tmp_path / "bad.jsonl")
