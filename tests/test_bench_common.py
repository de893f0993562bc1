"""The benches' sampling order (bench/common.py): balanced for the call before each call."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from bench.common import _without_password, sample_orders


@pytest.mark.parametrize("k", [2, 3, 4, 5, 7, 8])
def test_every_variant_opens_as_often_and_follows_each_other_equally(k: int) -> None:
    orders = sample_orders(k)
    assert len(orders) == (k if k % 2 == 0 else 2 * k)
    assert all(sorted(order) == list(range(k)) for order in orders)
    openers = Counter(order[0] for order in orders)
    pairs = Counter((a, b) for order in orders for a, b in pairwise(order))
    assert set(openers) == set(range(k)) and len(set(openers.values())) == 1
    assert len(pairs) == k * (k - 1) and len(set(pairs.values())) == 1


def test_one_variant_runs_alone_in_every_sample() -> None:
    assert {tuple(order) for order in sample_orders(1)} == {(0,)}


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://eval:S3cr/t@x@dbhost/evaldb",
        "postgresql+psycopg://eval@/evaldb?host=/tmp/s&password=S3cr/t@x",
        "postgresql+psycopg://eval:S3cr/t@x@/evaldb?PASSWORD=S3cr/t@x&host=/tmp/s",
    ],
)
def test_a_bench_records_its_command_line_without_a_urls_password(url: str) -> None:
    """``environment()["argv"]`` kept ``--url`` whole, password and all, in every --json results file (was)."""
    shown = _without_password(url)
    assert "S3cr" not in shown and shown.startswith("postgresql+psycopg://eval")
    assert _without_password("--reps") == "--reps"


def test_an_argument_that_is_no_store_url_is_recorded_as_given() -> None:
    for arg in ("http://host:8000/v1/models@latest", "--note=see http://x:80/ and mail me@example.com"):
        assert _without_password(arg) == arg
