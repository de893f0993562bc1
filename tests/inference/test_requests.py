"""Requests: their metadata is text, as every store keeps it, and a request file's integer ids are read as text."""

from __future__ import annotations

import warnings
from pathlib import Path

import orjson
import pytest

from inference.cache.plan import batch_keys
from inference.jsonl import OrientationUnusedWarning, read_completion_requests, read_judgement_requests
from inference.judging import pairwise_requests, pointwise_request
from inference.requests import CompletionRequest, JudgementRequest
from store.errors import InvalidInputError


@pytest.mark.parametrize("field", ["benchmark", "instruction_id", "model"])
def test_metadata_that_is_not_text_is_refused_before_anything_runs(field: str) -> None:
    with pytest.raises(InvalidInputError, match=f"{field} must be text or None, got int 3"):
        CompletionRequest(text="q", **{field: 3})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="judge must be text"):
        JudgementRequest(text="q", judge=["j"])  # type: ignore[arg-type]


def test_integer_ids_in_a_request_file_are_read_as_their_text(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(orjson.dumps({"text": "q", "instruction_id": 81, "benchmark": 2024}) + b"\n")
    (request,) = read_completion_requests(prompts)
    assert (request.instruction_id, request.benchmark) == ("81", "2024")
    pairs = tmp_path / "pairs.jsonl"
    pair = {"question": "q", "model_a": 1, "answer_a": "x", "model_b": "b", "answer_b": "y", "instruction_id": 7}
    pairs.write_bytes(orjson.dumps(pair) + b"\n")
    judged = read_judgement_requests(pairs, ["direct"])
    assert [(r.instruction_id, r.model_a, r.model_b) for r in judged] == [("7", "1", "b")]
    prompts.write_bytes(orjson.dumps({"text": "q", "instruction_id": 1.5}) + b"\n")
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:1: instruction_id must be text"):
        read_completion_requests(prompts)


def test_an_integer_id_past_64_bits_keeps_every_digit(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    long_id = 123456789012345678901234567890  # orjson reads it as a float: 1.2345678901234568e+29
    prompts.write_text(f'{{"text": "q", "instruction_id": {long_id}, "benchmark": {-(2**70)}}}\n')
    (request,) = read_completion_requests(prompts)
    assert (request.instruction_id, request.benchmark) == (str(long_id), str(-(2**70)))


@pytest.mark.parametrize(
    ("field", "value"), [("question", None), ("answer_a", None), ("answer_b", 4), ("answer_a", ["x"])]
)
def test_a_pair_whose_question_or_answer_is_not_text_is_refused_naming_its_line(
    tmp_path: Path, field: str, value: object
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    good = {"question": "q", "model_a": "a", "answer_a": "x", "model_b": "b", "answer_b": "y"}
    pairs.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(good | {field: value}) + b"\n")
    with pytest.raises(InvalidInputError, match=rf"pairs.jsonl:2: {field} must be a string"):
        read_judgement_requests(pairs, ["direct"])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "user", "content": None}], "needs string 'role' and 'content'"),
        ([], "must not be empty"),
        ([{"role": "user", "content": "q", "name": "n"}], "unsupported keys"),
    ],
)
def test_a_bad_message_names_the_file_and_line(tmp_path: Path, messages: object, message: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}]}
    prompts.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps({"messages": messages}) + b"\n")
    with pytest.raises(InvalidInputError, match=rf"prompts.jsonl:2: .*{message}"):
        read_completion_requests(prompts)
    rendered = tmp_path / "rendered.jsonl"
    rendered.write_bytes(orjson.dumps({"messages": messages}) + b"\n")
    with pytest.raises(InvalidInputError, match=rf"rendered.jsonl:1: .*{message}"):
        read_judgement_requests(rendered, ["direct"])


def test_a_pointwise_judgement_with_an_orientation_is_refused_naming_its_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="orientation 'direct' needs model_b"):
        JudgementRequest(text="rate it", model_a="a", orientation="direct")
    assert JudgementRequest(text="rate it", model_a="a").orientation is None  # pointwise, no orientation: fine
    rendered = tmp_path / "rendered.jsonl"
    conversation = {"messages": [{"role": "user", "content": "rate it"}], "model_a": "a"}
    lines = [conversation | {"model_b": "b", "orientation": "reversed"}, conversation | {"orientation": "reversed"}]
    rendered.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    with pytest.raises(InvalidInputError, match=r"rendered.jsonl:2: orientation 'reversed' needs model_b"):
        read_judgement_requests(rendered, ["direct"])


def test_a_judge_conversation_that_names_no_model_is_refused_naming_its_line(tmp_path: Path) -> None:
    """A prompts file given to `judge` was judged as it was: verdicts stored under no model (was)."""
    rendered = tmp_path / "prompts.jsonl"
    lines = [{"messages": [{"role": "user", "content": "rate it"}], "model_a": "a"}, {"text": "what is 2+2?"}]
    rendered.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:2: a judge conversation needs model_a .*generate"):
        read_judgement_requests(rendered, ["direct"], to_store=True)
    with pytest.warns(OrientationUnusedWarning):  # no pair lines: nothing to orient
        assert len(read_judgement_requests(rendered, ["direct"])) == 2  # explain and audit store nothing: taken


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"question": "q", "model_a": None, "answer_a": "x"}, "model_a must be a string"),
        ({"question": "q", "model_a": None, "answer_a": "x", "model_b": "b", "answer_b": "y"}, "model_a must be a"),
        ({"question": "q", "model_a": "a", "answer_a": "x", "answer_b": "y"}, "answer_b without model_b"),
        ({"question": "q", "model_a": "a", "answer_a": "x", "model_b": None, "answer_b": "y"}, "answer_b without"),
        ({"question": "q", "model_a": ["a"], "answer_a": "x"}, "model_a must be a string"),
        # "" was stored as a model's name (was), where a legacy cache's "" means a pointwise judgement
        ({"question": "q", "model_a": "a", "answer_a": "x", "model_b": "", "answer_b": "y"}, "model_b is empty"),
        ({"question": "q", "model_a": " ", "answer_a": "x"}, "model_a is empty"),
    ],
)
def test_a_judge_line_that_names_no_model_for_an_answer_is_refused_naming_its_line(
    tmp_path: Path, line: dict[str, object], said: str
) -> None:
    """A judgement that names no model, or that drops a second answer, would be stored as a wrong row."""
    pairs = tmp_path / "pairs.jsonl"
    good = {"question": "q", "model_a": "a", "answer_a": "x"}
    pairs.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(line) + b"\n")
    with pytest.raises(InvalidInputError, match=rf"pairs.jsonl:2: {said}"):
        read_judgement_requests(pairs, ["direct", "reversed"])


@pytest.mark.parametrize("n", [0, -1, True, 1.0, "2", 10_001, 10**11])
def test_a_sample_count_that_is_no_count_or_too_many_is_refused(n: object) -> None:
    """n samples are hashed and planned before the engine starts: n=10**11 would fill the memory."""
    with pytest.raises(InvalidInputError, match="n must be an integer from 1 to 10,000"):
        CompletionRequest(text="q", n=n)  # type: ignore[arg-type]
    assert CompletionRequest(text="q", n=10_000).n == 10_000


def test_a_line_of_the_wrong_shape_or_type_names_its_line_blank_lines_counted(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    chat = orjson.dumps({"messages": [{"role": "user", "content": "q"}]})
    prompts.write_bytes(chat + b"\n\n\n" + orjson.dumps({"text": "q"}) + b"\n")
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:4: this model takes chat input.*--input-mode text"):
        read_completion_requests(prompts, "chat")  # the way to take it names the flag (it did not, was)
    assert len(read_completion_requests(prompts)) == 2  # no model yet: both shapes are requests
    prompts.write_bytes(orjson.dumps({"text": 5}) + b"\n")
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:1: text prompt must be a string, got int"):
        read_completion_requests(prompts)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(orjson.dumps({"question": "q", "model_a": "a", "answer_a": "x"}) + b"\n")
    said = r"pairs.jsonl:1: a pair or pointwise line is judged as chat messages .* --input-mode text does not take"
    with pytest.raises(InvalidInputError, match=said):  # was: "give `text`, not `messages`", of a line with neither
        read_judgement_requests(pairs, ["direct"], input_mode="text")


def test_a_request_is_described_in_a_line_whatever_the_length_of_its_labels() -> None:
    """A failure line names the request; a label of kilobytes (which the store refuses) made it kilobytes long."""
    long = CompletionRequest(text="x", benchmark="b" * 2000, instruction_id="i" * 70)
    assert long.describe() == "b" * 59 + "…/" + "i" * 59 + "…"
    whole = CompletionRequest(text="x", benchmark="mt-bench", instruction_id="i" * 60)
    assert whole.describe() == "mt-bench/" + "i" * 60
    assert CompletionRequest(text="x", instruction_id="7").describe() == "?/7"


def test_orientations_asked_for_a_file_without_pair_lines_warn_that_they_change_nothing(tmp_path: Path) -> None:
    """`judge --orientation direct` on rendered or pointwise lines did nothing, and said nothing (was)."""
    rendered = tmp_path / "rendered.jsonl"
    conversation = {"messages": [{"role": "user", "content": "which?"}], "model_a": "a", "model_b": "b"}
    pointwise = {"question": "q", "model_a": "a", "answer_a": "x"}
    rendered.write_bytes(orjson.dumps(conversation | {"orientation": "reversed"}) + b"\n" + orjson.dumps(pointwise))
    with pytest.warns(OrientationUnusedWarning, match="rendered.jsonl has no pair lines.*asked for \\(direct\\)"):
        judged = read_judgement_requests(rendered, ["direct"])
    assert [r.orientation for r in judged] == ["reversed", None]  # the lines' own, as without the option
    pair = {"question": "q", "model_a": "a", "answer_a": "x", "model_b": "b", "answer_b": "y"}
    rendered.write_bytes(orjson.dumps(pair) + b"\n" + orjson.dumps(pointwise))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a file with a pair line uses them, and None (both) never warns
        assert [r.orientation for r in read_judgement_requests(rendered, ["direct"])] == ["direct", None]
        assert [r.orientation for r in read_judgement_requests(rendered)] == ["direct", "reversed", None]


def test_a_line_to_judge_given_as_a_completion_request_says_which_command_reads_it(tmp_path: Path) -> None:
    """`explain -i pairs.jsonl` without --role judgements said only "unknown keys" (was)."""
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(orjson.dumps({"question": "q", "model_a": "a", "answer_a": "x"}) + b"\n")
    with pytest.raises(InvalidInputError, match=r"requests.jsonl:1: unknown keys .*read by `judgestore judge`"):
        read_completion_requests(requests)
    requests.write_bytes(orjson.dumps({"text": "q", "benchmrk": "b"}) + b"\n")  # a typo is only a typo
    with pytest.raises(InvalidInputError, match=r"unknown keys \['benchmrk'\]") as refused:
        read_completion_requests(requests)
    assert "judgestore judge" not in str(refused.value)


def test_each_request_names_the_line_it_was_read_from_and_no_key_or_equality_depends_on_it(tmp_path: Path) -> None:
    """A failed or missed input is named by its line: blank lines are skipped and a pair line is two requests, so
    a request's index was no line number (was)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'\n{"text": "a"}\n\n{"text": "b"}\n')
    assert [r.source for r in read_completion_requests(prompts)] == [f"{prompts}:2", f"{prompts}:4"]
    pairs = tmp_path / "pairs.jsonl"
    pair = {"question": "q", "model_a": "x", "answer_a": "1", "model_b": "y", "answer_b": "2"}
    pairs.write_bytes(b"\n" + orjson.dumps(pair) + b"\n")
    both = read_judgement_requests(pairs, None)
    assert [(r.orientation, r.source) for r in both] == [("direct", f"{pairs}:2"), ("reversed", f"{pairs}:2")]
    assert [r.describe().rsplit(", ", 1)[1] for r in both] == ["direct", "reversed"]  # one line: told apart
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b'{"messages": [{"role": "user", "content": "a"}]}\n\n{"text": "plain"}\n')
    with pytest.raises(InvalidInputError, match=rf"^{mixed}:3: this model takes chat input"):  # "request 1" (was)
        batch_keys("completions", read_completion_requests(mixed), "chat")
    (read,) = [r for r in read_completion_requests(prompts) if r.text == "a"]
    assert read == CompletionRequest(text="a") and read.named(7) == f"{prompts}:2"
    assert CompletionRequest(text="a").named(7) == "request 7"  # not read from a file: its index


@pytest.mark.parametrize(
    ("field", "value"), [("question", ["q1", "q2"]), ("answer_a", None), ("answer_b", 4), ("answer", None)]
)
def test_a_judge_prompt_of_a_value_that_is_no_text_is_refused(field: str, value: object) -> None:
    """``pairwise_requests(answer_a=None)`` wrote "None" into the judge prompt, and the verdict was cached (was)."""
    pair = {"question": "q", "model_a": "x", "answer_a": "1", "model_b": "y", "answer_b": "2"}
    single = {"question": "q", "model": "x", "answer": "1"}
    with pytest.raises(InvalidInputError, match=f"^{field} must be text, got {type(value).__name__}"):
        if field in pair:
            pairwise_requests(**{**pair, field: value})  # type: ignore[arg-type]
        else:
            pointwise_request(**{**single, field: value})  # type: ignore[arg-type]


def test_orientations_given_as_one_string_are_refused() -> None:
    pair = {"question": "q", "model_a": "x", "answer_a": "1", "model_b": "y", "answer_b": "2"}
    with pytest.raises(InvalidInputError, match=r"orientations is a list of them, e.g. \('direct',\)"):
        pairwise_requests(**pair, orientations="direct")  # type: ignore[arg-type]
    assert [r.orientation for r in pairwise_requests(**pair, orientations=("direct",))] == ["direct"]


@pytest.mark.parametrize("wrong", ["hello", {"messages": [{"role": "user", "content": "hi"}]}, None])
def test_a_batch_holding_something_that_is_no_request_is_refused_by_index(wrong: object) -> None:
    """It was an AttributeError ('str' object has no attribute 'named') after the requests learnt their lines."""
    with pytest.raises(InvalidInputError, match=rf"^request 1 is a {type(wrong).__name__}; completions take"):
        batch_keys("completions", [CompletionRequest(text="a"), wrong], "text")  # type: ignore[list-item]


def test_an_id_past_a_doubles_range_keeps_every_digit_and_nan_stays_refused(tmp_path: Path) -> None:
    """A 400-digit instruction_id was "not valid JSON (number is infinity when parsed as double)" (was); 300 digits
    were kept whole. NaN is no JSON value, however the line is read."""
    prompts = tmp_path / "prompts.jsonl"
    chat = '"messages": [{"role": "user", "content": "q"}]'
    prompts.write_text(f'{{"instruction_id": {"7" * 400}, {chat}}}\n')
    (request,) = read_completion_requests(prompts)
    assert request.instruction_id == "7" * 400
    prompts.write_text(f'{{"instruction_id": {"7" * 400}, "n": NaN, {chat}}}\n')
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:1: not valid JSON \(NaN is no JSON value\)"):
        read_completion_requests(prompts)
    prompts.write_text(f'{{"instruction_id": 01, {chat}}}\n')  # orjson's own words, not "give a long id as text"
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:1: not valid JSON \(number with leading zero"):
        read_completion_requests(prompts)
    prompts.write_text(f'{{"instruction_id": 1{"0" * 5000}, {chat}}}\n')
    with pytest.raises(InvalidInputError, match=r"prompts.jsonl:1: .*give a long id as text"):
        read_completion_requests(prompts)
