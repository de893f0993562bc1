"""The lossless logprobs shape, the old shape it still reads, and JudgeArena's derived {text: logprob} view."""

from __future__ import annotations

import math

import pytest

from store import logprobs
from store.errors import InvalidInputError
from store.logprobs import LOGPROBS_FORMAT, PositionLogprobs, TokenLogprob


def test_two_ids_with_one_text_stay_two_candidates_and_merge_in_the_view() -> None:
    # Byte-level pieces of one character both decode to "": vLLM reports them as two tokens.
    position = PositionLogprobs(
        (
            TokenLogprob("", math.log(0.3), 11, 1),
            TokenLogprob("A", math.log(0.2), 12, 2),
            TokenLogprob("", math.log(0.1), 13, 3),
        ),
        TokenLogprob("", math.log(0.3), 11, 1),
    )
    stored = logprobs.encode([position])
    assert stored["format"] == LOGPROBS_FORMAT
    assert logprobs.decode(stored) == [position]  # nothing merged, nothing dropped
    view = logprobs.text_logprobs(stored)
    assert view.keys() == {"", "A"}
    assert view[""] == pytest.approx(math.log(0.4))  # probabilities add up: log-sum-exp
    assert view["A"] == pytest.approx(math.log(0.2))


def test_the_old_shape_still_reads() -> None:
    old = {"B": -2.0, "A": -0.1, "[[": -0.1}
    (position,) = logprobs.decode(old)
    assert [(c.text, c.rank, c.token_id) for c in position.candidates] == [
        ("A", 1, None),
        ("[[", 2, None),
        ("B", 3, None),
    ]
    assert position.sampled is None
    assert logprobs.text_logprobs(old) == old
    assert logprobs.decode(logprobs.from_text_logprobs(old)) == [position]


def test_positions_beyond_the_stored_ones_are_empty_and_bad_values_are_typed_errors() -> None:
    stored = logprobs.encode([PositionLogprobs((TokenLogprob("A", -1.0, 1, 1),))])
    assert logprobs.text_logprobs(stored, position=3) == {}
    assert logprobs.text_logprobs(None) == {}
    with pytest.raises(InvalidInputError):
        logprobs.decode({"A": "not a number"})


@pytest.mark.parametrize(
    "positions",
    [
        [{"candidates": [{"text": "A"}]}],  # no logprob
        [{"candidates": [{"text": "A", "logprob": "x"}]}],  # not a number
        [{"candidates": [{"text": "A", "logprob": -1.0, "bytes": 7}]}],  # bytes not a list
        [{"candidates": "A"}],  # candidates not a list
        [1],  # a position that is not an object
    ],
)
def test_a_damaged_stored_value_is_a_typed_error_naming_it(positions: list[object]) -> None:
    damaged = {"format": LOGPROBS_FORMAT, "positions": positions}
    with pytest.raises(InvalidInputError, match="not a stored"):
        logprobs.decode(damaged)
    with pytest.raises(InvalidInputError, match="not a stored"):
        logprobs.text_logprobs(damaged)


@pytest.mark.parametrize("position", [-1, -5, "0", 1.0, True])
def test_a_position_that_is_not_a_count_from_zero_is_refused(position: object) -> None:
    stored = logprobs.encode([PositionLogprobs((TokenLogprob("A", -1.0, 1, 1),))])
    with pytest.raises(InvalidInputError, match="position must be an integer from 0"):
        logprobs.text_logprobs(stored, position)  # type: ignore[arg-type]


def test_log_sum_exp_handles_infinities_and_nan() -> None:
    assert logprobs.logsumexp([-math.inf, -math.inf]) == -math.inf
    assert logprobs.logsumexp([-math.inf, -1.0]) == -1.0
    assert math.isnan(logprobs.logsumexp([math.nan, -1.0]))
    assert logprobs.logsumexp([-1000.0, -1000.0]) == pytest.approx(-1000.0 + math.log(2))


def test_a_token_is_written_with_its_keys_in_the_order_the_store_reads_them_back() -> None:
    """Canonical JSON sorts keys: a fresh answer's line put "bytes" last, a hit's first (was), so they differed."""
    token = TokenLogprob(text="é", logprob=-0.5, token_id=7, rank=1, bytes=(195, 169))
    written = token.to_json()
    assert list(written) == sorted(written) and TokenLogprob.from_json(written) == token
