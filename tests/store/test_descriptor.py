"""Descriptors, canonical JSON and input hashes: the bytes every cache key is made of."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from store.descriptor import (
    MESSAGES_HEAD,
    MESSAGES_TAIL,
    TEXT_HEAD,
    TEXT_TAIL,
    ModelDescriptor,
    canonical_json,
    input_hash,
    render_messages,
    render_text,
)
from store.errors import InvalidInputError

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_EXACT = 2**53  # integers that survive a round trip through a float

# ---------------------------------------------------------------- strategies

names = st.text(min_size=1, max_size=20).filter(lambda s: s == s.strip())
exact_ints = st.integers(min_value=-MAX_EXACT + 1, max_value=MAX_EXACT - 1)
json_scalars = st.none() | st.booleans() | exact_ints | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]) | st.text(), "content": st.text()}),
    min_size=1,
    max_size=4,
)


@st.composite
def descriptor_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Constructor arguments of a ModelDescriptor, as plain JSON (they can be sent to another process)."""
    sampling: dict[str, Any] = {
        "temperature": draw(st.sampled_from([0, 0.0, 0.7, 1, 1.0])),
        "top_k": draw(st.integers(min_value=-1, max_value=100)),
        "max_tokens": draw(st.none() | st.integers(min_value=1, max_value=4096)),
        "stop": draw(st.lists(st.text(max_size=5), max_size=3)),
        "seed": draw(st.none() | st.integers(min_value=0, max_value=2**31)),
    }
    sampling.update(draw(st.dictionaries(st.sampled_from(["best_of", "new_knob", "logit_bias"]), json_values)))
    return {
        "provider": draw(names),
        "model": draw(names),
        "revision": draw(st.none() | st.text(max_size=12)),
        "input_mode": draw(st.sampled_from(["chat", "text"])),
        "sampling": sampling,
        "chat_template_sha256": draw(st.none() | st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
        "chat_template_kwargs": draw(json_objects),
        "enable_thinking": draw(st.none() | st.booleans()),
        "engine": draw(json_objects),
    }


def reordered(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse insertion order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def names_reordered(fields: dict[str, Any]) -> dict[str, Any]:
    """Descriptor fields with the field names, and each setting object's names, in reverse order; values as given."""
    settings_fields = ("sampling", "engine", "chat_template_kwargs", "routing")
    return {
        name: {k: fields[name][k] for k in reversed(list(fields[name]))} if name in settings_fields else fields[name]
        for name in reversed(list(fields))
    }


def sorted_keys(value: Any) -> Any:
    """The same JSON value with every object's keys in sorted order."""
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def floats_for_ints(value: Any) -> Any:
    """The same JSON value with every integer written as a float (0 -> 0.0)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: floats_for_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [floats_for_ints(v) for v in value]
    return value


def json_dumps_canonical(value: Any) -> bytes:
    """The reference canonical form docs/design.md names (what legacy hashes were computed with)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------- descriptor hashes


def test_default_descriptor_has_the_documented_canonical_form() -> None:
    """Pinned bytes: a change here would orphan every existing store, so it must be deliberate."""
    expected = (
        b'{"backend_version":null,"chat_template_kwargs":{},"chat_template_sha256":null,"enable_thinking":null,'
        b'"engine":{},"format":"judgestore-descriptor/v1","input_mode":"chat","model":"Qwen/Qwen3-8B",'
        b'"provider":"vllm","revision":null,"sampling":{"frequency_penalty":0,"logprobs":null,"max_tokens":16,'
        b'"min_p":0,"presence_penalty":0,"repetition_penalty":1,"seed":null,"stop":[],"temperature":1,"top_k":0,'
        b'"top_p":1},"thinking_token_budget":null}'
    )
    descriptor = ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B")
    assert descriptor.canonical_json() == expected
    assert descriptor.sha256() == hashlib.sha256(expected).hexdigest()
    assert descriptor.hash16() == descriptor.sha256()[:16]


_HASH_IN_CHILD = """
import json, sys
from store.descriptor import ModelDescriptor, input_hash, render_messages
fields, chats = json.load(sys.stdin)
out = [ModelDescriptor(**f).sha256() for f in fields]
out += [input_hash(render_messages(m), k) for m in chats for k in (0, 3)]
print(json.dumps(out))
"""


@settings(max_examples=4, deadline=None)
@given(st.lists(descriptor_fields(), min_size=5, max_size=10), st.lists(messages, min_size=1, max_size=5))
def test_hashes_are_the_same_in_another_process(
    fields: list[dict[str, Any]], chats: list[list[dict[str, str]]]
) -> None:
    here = [ModelDescriptor(**f).sha256() for f in fields]
    here += [input_hash(render_messages(m), k) for m in chats for k in (0, 3)]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str hash seed than this process
    child = subprocess.run(
        [sys.executable, "-c", _HASH_IN_CHILD],
        input=json.dumps([fields, chats]),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        check=True,
    )
    assert json.loads(child.stdout) == here


@settings(max_examples=60, deadline=None)
@given(descriptor_fields())
def test_names_order_and_integral_floats_never_change_the_hash(fields: dict[str, Any]) -> None:
    reference = ModelDescriptor(**fields).sha256()
    assert ModelDescriptor(**names_reordered(fields)).sha256() == reference
    as_floats = {
        **fields,
        "sampling": floats_for_ints(fields["sampling"]),
        "chat_template_kwargs": floats_for_ints(fields["chat_template_kwargs"]),
        "engine": floats_for_ints(fields["engine"]),
    }
    assert ModelDescriptor(**as_floats).sha256() == reference


@settings(max_examples=60, deadline=None)
@given(descriptor_fields())
def test_a_descriptor_whose_objects_are_in_sorted_order_hashes_as_it_did_when_every_key_was_sorted(
    fields: dict[str, Any],
) -> None:
    """Every store written before a setting's key order counted keeps its folder: its metadata.json is sorted."""
    canonical = ModelDescriptor(**sorted_keys(fields)).canonical_json()
    assert canonical == orjson.dumps(orjson.loads(canonical), option=orjson.OPT_SORT_KEYS)


def test_the_key_order_inside_a_settings_value_changes_the_hash() -> None:
    """Structured outputs generate a JSON schema's properties in its order: reasoning then score, or the score
    first. Both orders hashed alike, and the second was served the first one's answers (was)."""
    props = {"reasoning": {"type": "string"}, "score": {"type": "integer"}}

    def judge(order: list[str]) -> ModelDescriptor:
        schema = {"properties": {k: props[k] for k in order}, "required": ["reasoning", "score"], "type": "object"}
        return ModelDescriptor(provider="vllm", model="m", sampling={"structured_outputs": {"json": schema}})

    first, second = judge(["reasoning", "score"]), judge(["score", "reasoning"])
    assert first.hash16() != second.hash16()
    assert judge(["reasoning", "score"]).hash16() == first.hash16()
    # Another format, which judgestore before the rule refuses (it read such a metadata.json as edited, and advised
    # moving its folder); derived, whatever is given
    assert (first.format, second.format) == ("judgestore-descriptor/v1", "judgestore-descriptor/v2")
    assert orjson.loads(second.canonical_json())["format"] == "judgestore-descriptor/v2"
    given = ModelDescriptor(**{**second.model_dump(), "format": "judgestore-descriptor/v1"})
    assert given.format == second.format and given.hash16() == second.hash16()
    assert ModelDescriptor.model_validate({**first.model_dump(), "format": "judgestore-descriptor/v2"}) == first
    tools = [{"name": "f", "description": "d"}]  # an object in a list, as a template's tools
    assert (
        ModelDescriptor(provider="vllm", model="m", chat_template_kwargs={"tools": tools}).hash16()
        != ModelDescriptor(provider="vllm", model="m", chat_template_kwargs={"tools": reordered(tools)}).hash16()
    )


def test_zero_and_zero_point_zero_hash_alike_in_typed_and_free_form_fields() -> None:
    ints = ModelDescriptor(
        provider="vllm",
        model="m",
        sampling={"temperature": 0, "top_k": 0, "max_tokens": 64},
        engine={"max_model_len": 4096},
    )
    floats = ModelDescriptor(
        provider="vllm",
        model="m",
        sampling={"temperature": 0.0, "top_k": 0.0, "max_tokens": 64.0},
        engine={"max_model_len": 4096.0},
    )
    assert ints.sha256() == floats.sha256()


@pytest.mark.parametrize(
    "change",
    [
        {"sampling": {"temperature": 0.5}},
        {"sampling": {"stop": ["b", "a"]}},
        {"sampling": {"an_unknown_setting": 1}},  # unknown settings reach the hash: a spurious miss is safe
        {"engine": {"dtype": "bfloat16"}},
        {"revision": "abc"},
        {"input_mode": "text"},
        {"enable_thinking": False},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"endpoint": "https://openrouter.ai/api/v1"},  # hosted: where requests go
        {"routing": {"order": ["deepinfra"], "allow_fallbacks": False}},  # hosted: who answers
    ],
)
def test_every_output_affecting_field_changes_the_hash(change: dict[str, Any]) -> None:
    base = ModelDescriptor(provider="vllm", model="m", sampling={"stop": ["a", "b"]})
    changed = ModelDescriptor(provider="vllm", model="m", **{"sampling": {"stop": ["a", "b"]}, **change})
    assert changed.sha256() != base.sha256()


def test_descriptor_is_frozen_and_strict() -> None:
    descriptor = ModelDescriptor(provider="vllm", model="m")
    with pytest.raises(ValidationError):
        descriptor.model = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="tensor_parallel"):
        ModelDescriptor(provider="vllm", model="m", tensor_parallel=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="whitespace"):
        ModelDescriptor(provider="vllm", model=" m")
    with pytest.raises(ValidationError):
        ModelDescriptor(provider="", model="m")


NONFINITE = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.parametrize("field", ["sampling", "engine", "chat_template_kwargs"])
@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_a_non_finite_float_in_free_form_settings_is_refused(field: str, value: float, shape: str) -> None:
    # JSON writes NaN and infinities as null: accepted, they would share a hash (and a database) with None.
    settings_ = {"x": value} if shape == "flat" else {"x": {"y": [1, {"z": value}]}}
    with pytest.raises(InvalidInputError, match="finite"):
        ModelDescriptor(provider="vllm", model="m", **{field: settings_})


@pytest.mark.parametrize("field", ["sampling", "engine", "chat_template_kwargs"])
def test_a_finite_float_in_free_form_settings_hashes_apart_from_none(field: str) -> None:
    hashes = {ModelDescriptor(provider="vllm", model="m", **{field: {"x": x}}).hash16() for x in (1.5, None, 1e308)}
    assert len(hashes) == 3


@pytest.mark.parametrize("field", ["engine", "chat_template_kwargs", "routing"])
@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_a_setting_named_by_a_lone_surrogate_is_refused_not_hashed_as_another(field: str, shape: str) -> None:
    """The JSON dump wrote a key "\\ud800" as U+FFFD: {"\\ud800": 1}, {"\\udfff": 1} and {"\\ufffd": 1} shared one
    descriptor, and so one database's rows (was); a lone surrogate in a value was refused already."""
    for key in ("\ud800", "\udfff"):
        settings_ = {key: 1} if shape == "flat" else {"x": [{key: 1}]}
        with pytest.raises(InvalidInputError, match="which is no Unicode text") as refused:
            ModelDescriptor(provider="vllm", model="m", **{field: settings_})
        assert f"the key {key!r}" in str(refused.value)
    allowed = ModelDescriptor(provider="vllm", model="m", **{field: {"\ufffd": 1}})  # the character itself is text
    assert allowed.hash16() != ModelDescriptor(provider="vllm", model="m", **{field: {"x": 1}}).hash16()
    copied = ModelDescriptor(provider="vllm", model="m").model_copy(update={field: {"\ud800": 1}})
    with pytest.raises(InvalidInputError, match="no Unicode text"):
        copied.hash16()
    with pytest.raises(InvalidInputError, match="no Unicode text"):  # a sampling setting's object, as an engine's
        ModelDescriptor(provider="vllm", model="m", sampling={"x": {"\ud800": 1}})


def test_a_non_finite_float_set_after_validation_is_refused_before_hashing() -> None:
    copied = ModelDescriptor(provider="vllm", model="m").model_copy(update={"engine": {"x": float("nan")}})
    with pytest.raises(InvalidInputError, match="finite"):
        copied.hash16()


# ---------------------------------------------------------------- rendered inputs


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_any_text_round_trips_through_render_text(text: str) -> None:
    rendered = render_text(text)
    assert orjson.loads(rendered) == {"text": text, "type": "text"}
    assert json.loads(rendered) == {"text": text, "type": "text"}
    assert rendered.encode() == json_dumps_canonical({"type": "text", "text": text})
    assert rendered.startswith(TEXT_HEAD) and rendered.endswith(TEXT_TAIL)  # what the browser's search relies on


@settings(max_examples=150, deadline=None)
@given(messages)
def test_any_messages_round_trip_through_render_messages(chat: list[dict[str, str]]) -> None:
    rendered = render_messages(chat)
    parsed = json.loads(rendered)
    assert parsed == {"type": "messages", "messages": chat}
    assert rendered.encode() == json_dumps_canonical(parsed)
    assert rendered.startswith(MESSAGES_HEAD) and rendered.endswith(MESSAGES_TAIL)  # what the browser's search reads
    # key order of the caller's dicts is irrelevant
    assert render_messages([dict(reversed(m.items())) for m in chat]) == rendered


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_json_equals_json_dumps_for_what_inputs_hold(value: Any) -> None:
    """Strings, ints, bools, null (and containers of them): orjson and json.dumps agree byte for byte."""

    def without_floats(v: Any) -> Any:
        if isinstance(v, float):
            return str(v)
        if isinstance(v, dict):
            return {k: without_floats(x) for k, x in v.items()}
        if isinstance(v, list):
            return [without_floats(x) for x in v]
        return v

    value = without_floats(value)
    assert canonical_json(value) == json_dumps_canonical(value)


@settings(max_examples=100, deadline=None)
@given(messages, st.integers(min_value=1, max_value=10_000))
def test_sample_index_rule(chat: list[dict[str, str]], k: int) -> None:
    rendered = render_messages(chat)
    sample0 = input_hash(rendered)
    assert sample0 == input_hash(rendered, 0) == hashlib.sha256(rendered.encode()).hexdigest()
    sample_k = input_hash(rendered, k)
    expected_k = hashlib.sha256(json_dumps_canonical({**json.loads(rendered), "sample": k})).hexdigest()
    assert sample_k == expected_k == input_hash(rendered, k)
    assert sample_k != sample0
    assert input_hash(rendered, k + 1) != sample_k


def test_text_and_chat_inputs_never_share_a_hash() -> None:
    assert input_hash(render_text("hi")) != input_hash(render_messages([{"role": "user", "content": "hi"}]))


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "hello",
        [{"role": "user"}],
        [{"role": "user", "content": 1}],
        [{"role": "user", "content": "x", "name": "bob"}],
        [{"content": "x", "name": "bob"}],  # two keys, but not role and content
        [{"role": "user", "content": "fine"}, {"role": None, "content": "x"}],  # the second one is bad
        ["not a message"],
        [{"role": "user", "content": "lone surrogate \ud800"}],
    ],
)
def test_bad_messages_are_refused_with_a_typed_error(bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        render_messages(bad)


def test_bad_text_and_sample_index_are_refused() -> None:
    with pytest.raises(InvalidInputError):
        render_text(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        render_text("\udc80")
    with pytest.raises(InvalidInputError):
        input_hash(render_text("x"), -1)
    with pytest.raises(InvalidInputError):
        canonical_json({1: "non-string key"})
