"""What a run cost and saved: engine time shares, usage totals, the runs row."""

from __future__ import annotations

import dataclasses
import math

import pytest

from inference.backends.base import Generation
from inference.cache.accounting import UsageTotals, priced, usage_totals


def test_shares_follow_completion_tokens_and_add_up_to_the_batch_time() -> None:
    batch = [Generation("a", "stop", {"prompt_tokens": 5, "completion_tokens": n}) for n in (1, 3, 0)]
    shares = [g.usage["engine_seconds"] for g in priced(batch, 2.0)]
    assert shares == [0.5, 1.5, 0.0]
    assert [g.usage["prompt_tokens"] for g in priced(batch, 2.0)] == [5, 5, 5]  # the engine's counts are kept
    assert batch[0].usage == {"prompt_tokens": 5, "completion_tokens": 1}  # the input is not changed


def test_pricing_changes_usage_alone() -> None:
    """Every other field of a generation is kept, whatever fields Generation grows."""
    generation = Generation("text", "length", {"completion_tokens": 2}, {"a": -0.5})
    (priced_one,) = priced([generation], 1.0)
    for field in dataclasses.fields(Generation):
        if field.name != "usage":
            assert getattr(priced_one, field.name) == getattr(generation, field.name), field.name
    assert priced_one.usage == {"completion_tokens": 2, "engine_seconds": 1.0}


def test_without_token_counts_the_time_is_shared_equally() -> None:
    shares = [g.usage["engine_seconds"] for g in priced([Generation("a"), Generation("b")], 1.0)]
    assert shares == [0.5, 0.5]
    assert priced([], 3.0) == []


def test_usage_totals_count_rows_without_engine_time() -> None:
    usages = [
        {"prompt_tokens": 10, "completion_tokens": 2, "engine_seconds": 0.25},
        {"prompt_tokens": 5, "completion_tokens": 1},  # an older or imported row
        None,
        {"prompt_tokens": math.nan, "completion_tokens": "x", "engine_seconds": math.inf},
    ]
    totals = usage_totals(usages)
    assert totals == UsageTotals(rows=4, prompt_tokens=15, completion_tokens=3, engine_seconds=0.25, without_cost=3)
    assert (totals + totals).prompt_tokens == 30
    assert usage_totals([]) == UsageTotals()
    assert totals.as_dict()["engine_seconds"] == pytest.approx(0.25)
    # Seconds no call takes are none, as stats counts them: two of 1e308 saved "inf s" and crashed stats (was)
    huge = usage_totals([{"engine_seconds": 1e308}, {"engine_seconds": 10**308}, {"engine_seconds": 0.5}])
    assert (huge.engine_seconds, huge.without_cost) == (0.5, 2)
    # and tokens: a float of 1e308 was a 309-digit count, which no run record holds (was)
    tokens = usage_totals([{"prompt_tokens": 1e308, "completion_tokens": 3.0}, {"prompt_tokens": 2}])
    assert (tokens.prompt_tokens, tokens.completion_tokens) == (2, 3)
