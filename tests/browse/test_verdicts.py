"""Reading a verdict from a judge's row: the verdict token's preference, the text, and a judge's figures."""

from __future__ import annotations

import math

import pytest

from store.browse.verdicts import (
    JudgedRow,
    Reading,
    confidence_bin,
    favoured_model,
    judge_figures,
    preference,
    read_verdict,
    source_pair,
    text_verdict,
)
from store.errors import InvalidInputError
from store.logprobs import PositionLogprobs, TokenLogprob, decode, encode


def stored(*positions: dict[str, float]) -> dict[str, object]:
    return encode(
        PositionLogprobs(tuple(TokenLogprob(text, lp, rank=i) for i, (text, lp) in enumerate(p.items(), 1)))
        for p in positions
    )


def test_the_first_token_gives_p_a_and_p_b_with_variants_of_a_letter_added_up() -> None:
    pref = preference(stored({"A": math.log(0.5), " A": math.log(0.1), "B": math.log(0.3), "The": math.log(0.1)}))
    assert pref is not None
    assert pref.position == 0
    assert pref.p_a == pytest.approx(0.6) and pref.p_b == pytest.approx(0.3)
    assert pref.share_a == pytest.approx(2 / 3) and pref.confidence == pytest.approx(2 / 3)
    assert pref.favoured == "A"


def test_a_judge_answering_in_brackets_is_read_at_its_letter_when_every_position_is_stored() -> None:
    pref = preference(stored({"[[": -0.01}, {"B": math.log(0.7), "A": math.log(0.2)}, {"]]": -0.01}))
    assert pref is not None and pref.position == 1 and pref.favoured == "B"
    assert preference(stored({"[[A": math.log(0.9), "[[B": math.log(0.05)})).favoured == "A"  # type: ignore[union-attr]


def with_sampled(*positions: tuple[str, dict[str, float]]) -> dict[str, object]:
    """Positions as the engines store them: the candidates and the token sampled there."""
    return encode(
        PositionLogprobs(
            tuple(TokenLogprob(text, lp, rank=i) for i, (text, lp) in enumerate(candidates.items(), 1)),
            TokenLogprob(sampled, candidates[sampled], rank=1),
        )
        for sampled, candidates in positions
    )


def test_an_unlikely_letter_beside_a_sampled_bracket_is_not_the_verdict() -> None:
    """A judge answering [[A]], its first position stored: an unlikely B among the "[[" position's candidates was
    read as the verdict, reversed, at confidence 0.95-1.00 (was). The text decides; with every position, the
    letter's own position does."""
    first_only = with_sampled(("[[", {"[[": -0.01, "B": -6.0}))
    assert preference(first_only) is None
    assert read_verdict("[[A]]", first_only) == Reading("A", None)
    every = with_sampled(("[[", {"[[": -0.01, "B": -6.0}), ("A", {"A": -0.05, "B": -3.0}), ("]]", {"]]": -0.01}))
    pref = preference(every)
    assert pref is not None and pref.position == 1 and pref.favoured == "A"
    spaced = preference(with_sampled((" A", {" A": -0.1, "B": -2.6, " B": -3.0, "A": -4.0})))
    assert spaced is not None and spaced.position == 0 and spaced.favoured == "A"
    # A tie ([[C]]) is no A or B read from the explanation after it (the first mend read " A" there, at 0.95)
    tie = with_sampled(("[[", {"[[": -0.01}), ("C", {"C": -0.1, "B": -2.5}), ("]]", {"]]": -0.01}),
                       (" Assistant", {" Assistant": -0.2}), (" A", {" A": -0.05, " B": -3.0}))  # fmt: skip
    assert preference(tie) is None and read_verdict("[[C]] Assistant A and B are equally good.", tie).slot is None


def test_a_sampled_letter_ranked_below_the_candidates_kept_leaves_the_verdict_to_the_text() -> None:
    """Under allowed_token_ids the stored logprobs are the unrestricted ones: the sampled A ranked 304th, no letter
    among the 5 kept. That position was skipped and the next one's B read as the verdict (was)."""
    below = PositionLogprobs(
        (TokenLogprob("x", -0.1, 7, 1), TokenLogprob("y", -2.0, 8, 2)), TokenLogprob("A", -9.0, 35, 304)
    )
    later = PositionLogprobs((TokenLogprob("B", -0.01, 36, 1),), TokenLogprob("B", -0.01, 36, 1))
    assert preference(encode([below, later])) is None
    assert read_verdict("A", encode([below, later])) == Reading("A", None)
    # the other letter among the candidates: it was read as the verdict, the one sampled at P 0 (was)
    other = PositionLogprobs((TokenLogprob("A", -0.4, 1, 1),), TokenLogprob("B", -1.1, 2, 2))
    assert preference(encode([other])) is None
    assert read_verdict("B", encode([other])) == Reading("B", None)


def test_the_old_text_logprob_shape_reads_the_same() -> None:
    pref = preference({"A": math.log(0.2), "B": math.log(0.7)})
    assert pref is not None and pref.p_b == pytest.approx(0.7) and pref.favoured == "B"


def test_no_letter_among_the_stored_tokens_is_no_preference_and_the_text_decides() -> None:
    top = stored({"[[": -0.01})
    assert preference(top) is None
    assert preference(None) is None
    assert read_verdict("Both are fine, but [[A]] ... on reflection [[B]]", top) == Reading("B", None)
    assert read_verdict("A", None) == Reading("A", None)
    assert read_verdict("I cannot decide.", None) == Reading(None, None)
    assert text_verdict("  B\n") == "B" and text_verdict("Because A is longer") is None


def test_a_tie_favours_no_slot() -> None:
    pref = preference(stored({"A": math.log(0.4), "B": math.log(0.4)}))
    assert pref is not None and pref.favoured is None and pref.share_a == 0.5


def test_slots_map_back_to_models_and_pairs_to_their_source_order() -> None:
    assert favoured_model("A", "x", "y") == "x" and favoured_model("B", "x", "y") == "y"
    assert favoured_model(None, "x", "y") is None
    assert source_pair("x", "y", "direct") == ("x", "y")
    assert source_pair("y", "x", "reversed") == ("x", "y")
    assert source_pair("x", None, None) is None


def test_confidence_bins_cover_one_half_to_one() -> None:
    assert [confidence_bin(c) for c in (0.5, 0.549, 0.55, 0.97, 1.0)] == [0, 0, 1, 9, 9]


def row(question: str, a: str, b: str, orientation: str, slot: str | None, confidence: float | None = 0.8) -> JudgedRow:
    return JudgedRow((question,), a, b, orientation, slot, confidence)  # type: ignore[arg-type]


def test_a_judges_figures_count_wins_by_model_position_bias_and_agreement() -> None:
    rows = [
        row("q1", "x", "y", "direct", "A"),  # x
        row("q1", "y", "x", "reversed", "B"),  # x: agrees
        row("q2", "x", "y", "direct", "A"),  # x
        row("q2", "y", "x", "reversed", "A", 0.99),  # y: disagrees (slot A won both times)
        row("q3", "x", "y", "direct", None, None),  # no verdict
        row("q4", "x", "z", "direct", "B", None),  # z, from the text
    ]
    figures = judge_figures(rows, pointwise=2)
    assert (figures.rows, figures.pointwise, figures.no_verdict) == (6, 2, 1)
    assert (figures.slot_a_wins, figures.slot_b_wins) == (3, 2)
    assert figures.slot_a_rate == pytest.approx(3 / 5)
    assert (figures.both_orientations, figures.agreeing) == (2, 1)
    assert figures.agreement_rate == 0.5
    xy, xz = figures.pairs[("x", "y")], figures.pairs[("x", "z")]
    assert (xy.first_wins, xy.second_wins, xy.no_verdict, xy.judged) == (3, 1, 1, 5)
    assert (xz.first_wins, xz.second_wins) == (0, 1)
    assert (figures.from_logprobs, figures.from_text) == (4, 1)  # 6 rows: 4 at a logprob, 1 from the text, 1 none
    assert sum(figures.confidence_bins) == 4 and figures.confidence_bins[9] == 1 and figures.confidence_bins[6] == 3


def test_no_verdicts_give_no_rates() -> None:
    figures = judge_figures([])
    assert figures.slot_a_rate is None and figures.agreement_rate is None


def test_unreadable_stored_logprobs_leave_the_verdict_to_the_text() -> None:
    for value in ({"A": "x"}, {"A": None}, {"format": "weird"}, {"positions": [{"candidates": [{"bad": 1}]}]}):
        reading = read_verdict("Better: [[B]]", value)
        assert (reading.slot, reading.preference) == ("B", None) and reading.logprobs_error, value
    assert read_verdict("[[B]]", stored({"A": math.log(0.9)})).logprobs_error is None


def test_a_verdict_candidate_that_is_no_log_probability_leaves_the_verdict_to_the_text() -> None:
    """Logprobs of +5 and +3 were shown as P 148.4 and 20.1, favouring A; a NaN A beside a -inf B as P 0 and 0 and
    no verdict, though the text said [[A]] (was)."""
    for value in ({"A": 5.0, "B": 3.0}, {"A": math.nan, "B": -math.inf}):
        reading = read_verdict("[[A]]", stored(value))
        assert (reading.slot, reading.preference) == ("A", None), value
        assert reading.logprobs_error is not None and "which is no log-probability" in reading.logprobs_error
    certain = preference(stored({"A": 1e-9, "B": -30.0}))  # an engine's certain token, a hair above 0
    assert certain is not None and certain.favoured == "A"


def test_a_row_holding_every_position_is_read_at_its_verdict_position_and_no_further() -> None:
    """The preference decoded every stored position (was): a judge's row holding thousands cost that much, and a
    position past the verdict token that could not be read made the whole row unreadable."""
    filler = [{f"tok{i}_{k}": -0.1 - k for k in range(20)} for i in range(300)]
    value = stored(*filler[:150], {"[[": -0.01}, {"A": math.log(0.7), "B": math.log(0.2)}, {"]]": -0.01},
                   *filler[150:])  # fmt: skip
    pref = preference(value)
    assert pref is not None and pref.position == 151
    # the same as read from the whole decoded value
    (expected,) = [p for p in decode(value) if any(c.text in ("A", "B") for c in p.candidates)]
    assert (pref.p_a, pref.p_b) == tuple(math.exp(c.logprob) for c in expected.candidates if c.text in ("A", "B"))
    damaged = value | {"positions": [*value["positions"], {"candidates": [{"bad": 1}]}]}  # type: ignore[list-item]
    assert preference(damaged) == pref and read_verdict("[[A]]", damaged).logprobs_error is None
    with pytest.raises(InvalidInputError):
        decode(damaged)  # decode still reads (and checks) every position
