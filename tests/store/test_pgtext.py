"""How a PostgreSQL store keeps text its server cannot hold: U+0000 escaped, reversibly, and nothing else changed."""

from __future__ import annotations

import math
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from store import jsonvalues
from store.backends.postgres.text import ESCAPE, dumps_json, escape, escaped_bytes, loads_json, unescape

# Text that stresses the escape: NUL and the escape character itself, the digits that follow it, and the rest
# (lone surrogates aside: no store keeps them, tests/store/test_repository.py).
tricky = st.text(
    alphabet=st.sampled_from(["\0", ESCAPE, "0", "1", "a", "é", "\U0001f600", "\u05d0"])
    | st.characters(blacklist_categories=("Cs",))
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True) | tricky,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(tricky)
def test_escape_is_undone_exactly_and_leaves_no_nul(value: str) -> None:
    stored = escape(value)
    assert unescape(stored) == value
    assert "\0" not in stored
    assert escaped_bytes(value) == len(stored.encode())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters=["\0", ESCAPE])))
def test_text_without_nul_or_the_escape_is_stored_unchanged(value: str) -> None:
    assert escape(value) is value and unescape(value) is value


@settings(max_examples=200, deadline=None)
@given(tricky, tricky)
def test_escaping_commutes_with_concatenation_so_filters_and_prefixes_work(a: str, b: str) -> None:
    assert escape(a + b) == escape(a) + escape(b)
    assert escape(a + b).startswith(escape(a))
    assert (escape(a) == escape(b)) == (a == b)


def test_an_escape_character_no_sequence_follows_is_kept_as_it_is() -> None:
    assert unescape(f"x{ESCAPE}y{ESCAPE}") == f"x{ESCAPE}y{ESCAPE}"  # another tool's text
    assert unescape(f"{ESCAPE}0{ESCAPE}1{ESCAPE}10") == f"\0{ESCAPE}{ESCAPE}0"


def same(a: Any, b: Any) -> bool:
    """Equal as stored values (NaN equals NaN)."""
    return jsonvalues.dumps(a) == jsonvalues.dumps(b)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(tricky, json_values, max_size=6))
def test_json_values_round_trip_and_their_text_never_holds_an_escaped_nul(value: dict[str, Any]) -> None:
    text = dumps_json(value)
    assert "\\u0000" not in text.replace("\\\\", "")  # what PostgreSQL's json operators cannot read
    assert same(loads_json(text), value) and same(loads_json(text.encode()), value)
    assert same(loads_json(memoryview(text.encode())), value)  # what psycopg hands its loader


def test_json_without_nul_or_the_escape_is_the_canonical_json_of_a_folder_store() -> None:
    value = {"b": [1, 2.5, None, "¿"], "a": {"x": -math.inf}, "c": "\\u0000 is six characters here"}
    assert dumps_json(value) == jsonvalues.dumps(value)
    assert orjson.loads(dumps_json({"\0": "\0"})) == {f"{ESCAPE}0": f"{ESCAPE}0"}


def keys_in_order(value: Any) -> list[list[str]]:
    """Every dict's keys in ``value``, in the order they come, depth first."""
    if isinstance(value, dict):
        return [list(value), *(keys for v in value.values() for keys in keys_in_order(v))]
    if isinstance(value, list):
        return [keys for v in value for keys in keys_in_order(v)]
    return []


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(tricky, st.dictionaries(tricky, st.booleans(), max_size=4), max_size=6))
def test_keys_read_back_in_canonical_order_though_escaping_changed_how_the_text_sorted_them(
    value: dict[str, Any],
) -> None:
    back = loads_json(dumps_json(value))
    assert keys_in_order(back) == keys_in_order(orjson.loads(jsonvalues.dumps(value)))


def test_a_nul_key_reads_back_before_the_keys_its_escape_sorts_after() -> None:
    value = {"0": 1, "\0": {"a": 1, "\0b": 2, ESCAPE: 3}}
    back = loads_json(dumps_json(value))
    assert list(back) == ["\0", "0"] and list(back["\0"]) == ["\0b", "a", ESCAPE]
