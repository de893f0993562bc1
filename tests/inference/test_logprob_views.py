"""The logprob views parsers read: last-wins and merged ``{token: logprob}``, OpenAI's content shape, a preference."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from inference.logprob_views import openai_logprobs, preference, token_logprobs_last_wins, token_logprobs_merged
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError
from store.logprobs import PositionLogprobs, TokenLogprob, encode, from_text_logprobs, text_logprobs
from store.store import Store

# A judge's first token: "A" twice (two ids that decode alike), "B" once; it sampled a token outside the top 3.
FIRST = PositionLogprobs(
    (
        TokenLogprob("A", -0.2, 65, 1),
        TokenLogprob("B", -1.9, 66, 2),
        TokenLogprob("A", -3.0, 300, 3),
    ),
    sampled=TokenLogprob("[[", -4.0, 91, 7),
)
SECOND = PositionLogprobs((TokenLogprob("]]", -0.1, 93, 1),), sampled=TokenLogprob("]]", -0.1, 93, 1))
ROW = encode([FIRST, SECOND])


def test_the_merged_view_adds_up_the_candidates_that_decode_alike() -> None:
    merged = token_logprobs_merged(ROW)
    assert merged["A"] == pytest.approx(math.log(math.exp(-0.2) + math.exp(-3.0)))
    assert merged["B"] == -1.9
    assert token_logprobs_merged(ROW, position=1) == {"]]": -0.1}


def test_the_last_wins_view_keeps_the_last_candidate_of_a_text_in_rank_order() -> None:
    assert token_logprobs_last_wins(ROW) == {"A": -3.0, "B": -1.9}
    assert list(token_logprobs_last_wins(ROW)) == ["A", "B"]  # first seen order, as a dict comprehension keeps it


def test_in_vllms_order_the_sampled_token_comes_first_and_counts_outside_the_top_k() -> None:
    """vLLM's own dict lists the sampled token first, outside the top k too: a parser of it saw "[[" (was left
    out), and of two "A", the one sampled is replaced by the other."""
    assert token_logprobs_last_wins(ROW, sampled_first=True) == {"[[": -4.0, "A": -3.0, "B": -1.9}
    assert list(token_logprobs_last_wins(ROW, sampled_first=True)) == ["[[", "A", "B"]
    sampled_a = encode([PositionLogprobs(FIRST.candidates, sampled=FIRST.candidates[2])])
    assert token_logprobs_last_wins(sampled_a, sampled_first=True) == {"A": -0.2, "B": -1.9}
    assert token_logprobs_last_wins(sampled_a) == {"A": -3.0, "B": -1.9}  # OpenAI's list: the candidates only
    assert token_logprobs_last_wins(ROW, position=1, sampled_first=True) == {"]]": -0.1}


@pytest.mark.parametrize("view", [token_logprobs_merged, token_logprobs_last_wins])
@pytest.mark.parametrize("position", [-1, "0", 0.0, True])
def test_both_views_refuse_a_position_that_is_no_token_index(view: Callable[..., object], position: object) -> None:
    """last-wins read -1 as the last position (merged refused it) and "0" as a bare TypeError."""
    with pytest.raises(InvalidInputError, match="position must be an integer from 0"):
        view(ROW, position)


def test_the_two_views_read_the_same_row_as_two_different_preferences() -> None:
    assert preference(token_logprobs_merged(ROW)) == pytest.approx(0.14691, abs=1e-5)  # model_a clearly preferred
    assert preference(token_logprobs_last_wins(ROW)) == pytest.approx(0.75026, abs=1e-5)  # read the other way


def test_preference_counts_a_missing_token_as_probability_zero() -> None:
    assert preference({"A": -0.5}) == 0.0
    assert preference({"B": -3.0, "C": -0.1}) == 1.0
    assert preference({"A": -1.0, "B": -1.0}) == 0.5
    assert preference({"C": -0.1}) is None
    assert preference({"A": -math.inf, "B": -math.inf}) is None
    assert preference({"m": -2.0, "M": -0.5}, tokens=("m", "M")) == pytest.approx(1 / (1 + math.exp(-1.5)))


def test_the_openai_shape_gives_the_sampled_token_and_its_top_candidates_per_position() -> None:
    content = openai_logprobs(ROW)
    assert content is not None
    first, second = content["content"]
    assert (first["token"], first["logprob"], first["bytes"]) == ("[[", -4.0, None)  # vLLM's rows hold no bytes
    assert [(t["token"], t["logprob"]) for t in first["top_logprobs"]] == [("A", -0.2), ("B", -1.9), ("A", -3.0)]
    assert second["token"] == "]]" and len(second["top_logprobs"]) == 1


def test_the_openai_shape_keeps_an_apis_bytes() -> None:
    row = encode(
        [
            PositionLogprobs(
                (TokenLogprob("é", -0.3, None, 1, (195, 169)),), TokenLogprob("é", -0.3, None, 1, (195, 169))
            )
        ]
    )
    content = openai_logprobs(row)
    assert content is not None and content["content"][0]["bytes"] == [195, 169]


def test_rows_in_the_older_shape_read_the_same_way() -> None:
    old = {"B": -1.9, "A": -0.2}
    assert token_logprobs_last_wins(old) == {"A": -0.2, "B": -1.9} == token_logprobs_merged(old)
    content = openai_logprobs(old)
    assert content is not None and content["content"][0]["token"] == "A"  # no sampled token: the most likely
    assert token_logprobs_last_wins(from_text_logprobs(old)) == token_logprobs_last_wins(old)


def test_nothing_stored_gives_nothing() -> None:
    assert token_logprobs_last_wins(None) == {} == token_logprobs_merged(None)
    assert token_logprobs_last_wins(ROW, position=5) == {}
    assert openai_logprobs(None) is None


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda: preference({"A": "-0.1", "B": -1.0}), r"the logprob of 'A' must be a number, got '-0.1'"),
        (lambda: preference([("A", -0.1)]), "token_logprobs must map tokens to logprobs, got list"),  # type: ignore[arg-type]
        (lambda: text_logprobs([1, 2]), r"top_logprobs is neither .* nor \{text: logprob\}: \[1, 2\]"),  # type: ignore[arg-type]
    ],
)
def test_a_value_of_the_wrong_shape_is_a_typed_error_naming_it(call: Callable[[], object], said: str) -> None:
    """They raised TypeError and AttributeError from inside (was)."""
    with pytest.raises(InvalidInputError, match=said):
        call()


def test_get_many_of_no_iterable_is_a_typed_error(store: Store) -> None:
    database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="m"))
    with pytest.raises(InvalidInputError, match="get_many takes an iterable of input hashes, not NoneType None"):
        database.get_many(None)  # type: ignore[arg-type]


def test_a_rows_stored_logprobs_are_refused_by_preference_naming_the_view_to_take() -> None:
    """Given a row's ``top_logprobs`` whole, it found no "A" in it and said None, as for a verdict of neither (was)."""
    stored = encode([PositionLogprobs(candidates=(TokenLogprob("A", -0.1), TokenLogprob("B", -2.3)))])
    with pytest.raises(InvalidInputError, match=r"preference\(text_logprobs\(row.top_logprobs\)\)"):
        preference(stored)
    assert preference(text_logprobs(stored)) == pytest.approx(math.exp(-2.3) / (math.exp(-0.1) + math.exp(-2.3)))
