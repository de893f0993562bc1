"""JSON columns keep every value exactly, NaN and infinities included, or refuse it before anything is written."""

from __future__ import annotations

import math
import sqlite3
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import jsonvalues, logprobs
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError
from store.logprobs import PositionLogprobs, TokenLogprob
from store.store import Store
from tests.factories import completion_record, judgement_record

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equality that counts NaN as equal to NaN and tells -0.0 from 0.0 apart only by value (as JSON does)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# What a column holds: anything but a bare number at the top (refused, see the next test).
COLUMN_VALUES = (
    st.none() | st.booleans() | st.text() | st.lists(JSON, max_size=4) | st.dictionaries(st.text(), JSON, max_size=4)
)


@given(COLUMN_VALUES)
def test_every_json_value_round_trips_exactly(value: Any) -> None:
    assert same(jsonvalues.loads(jsonvalues.dumps(value)), value)


@pytest.mark.parametrize("number", [5, -1.5, 1.0, 2**63, math.nan, -math.inf])
def test_a_bare_number_is_refused(number: float) -> None:
    # SQLite's JSON columns have numeric affinity: the text "5" would be stored as the integer 5 (and "1.0" as 1)
    with pytest.raises(InvalidInputError, match="not a bare number"):
        jsonvalues.dumps(number)
    assert jsonvalues.loads(jsonvalues.dumps({"n": number})).keys() == {"n"}  # in an object it is kept


def test_non_finite_floats_are_tagged_and_the_rest_is_canonical_json() -> None:
    text = jsonvalues.dumps({"b": -math.inf, "a": [math.nan, math.inf, None, 1.5]})
    assert text == '{"a":[{"$float":"NaN"},{"$float":"Infinity"},null,1.5],"b":{"$float":"-Infinity"}}'
    assert jsonvalues.dumps({"b": 1, "a": "ü"}) == '{"a":"ü","b":1}'


def test_a_value_shaped_like_the_tag_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="reserves"):
        jsonvalues.dumps({"x": {"$float": "Infinity"}})
    assert jsonvalues.loads(jsonvalues.dumps({"$float": 1})) == {"$float": 1}  # not a string: not the tag
    with_more = {"$float": "NaN", "k": 1}  # more than one key: not the tag either, kept as it is
    assert jsonvalues.loads(jsonvalues.dumps(with_more)) == with_more


def test_inf_and_nan_survive_a_database_round_trip(store: Store, descriptor: ModelDescriptor) -> None:
    top = logprobs.encode(
        [
            PositionLogprobs(
                (TokenLogprob("A", -0.5, 7, 1), TokenLogprob("B", -math.inf, 9, 2)), TokenLogprob("A", -0.5, 7, 1)
            )
        ]
    )
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "latency_s": math.nan, "budget": math.inf}
    database = store.database("judgements", "t", descriptor)
    written = judgement_record(1, top_logprobs=top, usage=usage)
    database.put_many([written])
    (read,) = database.get_many([written.input_hash]).values()
    assert same(read.top_logprobs, top) and same(read.usage, usage)
    assert logprobs.decode(read.top_logprobs)[0].candidates[1].logprob == -math.inf
    with closing(sqlite3.connect(database.path)) as conn:  # valid JSON for SQLite's own functions
        (stored,) = conn.execute(
            "SELECT json_extract(top_logprobs, '$.positions[0].candidates[1].logprob') FROM judgements"
        ).fetchone()
    assert stored == '{"$float":"-Infinity"}'


def test_a_reserved_value_is_refused_before_anything_is_written(store: Store, descriptor: ModelDescriptor) -> None:
    database = store.database("completions", "t", descriptor)
    kept = completion_record(1)
    database.put_many([kept])
    with pytest.raises(InvalidInputError, match="reserves"):
        database.put_many([completion_record(2), completion_record(3, usage={"x": {"$float": "NaN"}})])
    assert database.count() == 1  # not even the good row of the same batch
    assert database.get_many([kept.input_hash]) == {kept.input_hash: kept}
