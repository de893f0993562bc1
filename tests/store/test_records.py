"""Row filters: which roles a filter applies to, and the times it takes."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from store.errors import InvalidInputError
from store.records import CompletionRecord, JudgementRecord, RowFilter, parse_timestamp, roles_for


def test_judgement_only_filters_select_judgements() -> None:
    assert roles_for(RowFilter()) == ("completions", "judgements")
    assert roles_for(RowFilter(model="m"), "completions") == ("completions",)
    assert roles_for(RowFilter(judge="j")) == ("judgements",)
    assert roles_for(RowFilter(pointwise=False)) == ("judgements",)
    with pytest.raises(InvalidInputError, match="judgements only"):
        roles_for(RowFilter(orientation="direct"), "completions")


def test_timestamps_without_an_offset_are_utc() -> None:
    assert parse_timestamp("2026-01-02") == datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:04:05") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:00:00+02:00") == datetime(2026, 1, 2, 1, tzinfo=UTC)
    assert parse_timestamp("2026-01-02T03:00:00Z").tzinfo is not None
    with pytest.raises(InvalidInputError, match="ISO-8601"):
        parse_timestamp("yesterday")


@pytest.mark.parametrize("record_type", [CompletionRecord, JudgementRecord])
def test_records_are_built_as_their_dataclass_would_build_them(record_type: type[Any]) -> None:
    """Records get an __init__ that stores fields straight into their slots: same signature, same records."""
    fields = dataclasses.fields(record_type)
    reference = dataclasses.make_dataclass(
        record_type.__name__,
        [(f.name, f.type) if f.default is dataclasses.MISSING else (f.name, f.type, f.default) for f in fields],
        frozen=True,
        slots=True,
        kw_only=True,
    )
    assert inspect.signature(record_type) == inspect.signature(reference)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    given = {"input_hash": "h", "input_text": "t", "completion": "c", "created_at": when, "usage": {"n": 1}}
    built, expected = record_type(**given), reference(**given)
    assert dataclasses.asdict(built) == dataclasses.asdict(expected)
    assert dataclasses.replace(built, completion="d").completion == "d"
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.completion = "x"
    for bad in ({**given, "bogus": 1}, {"input_hash": "h"}):
        with pytest.raises(TypeError) as ours:
            record_type(**bad)
        with pytest.raises(TypeError) as theirs:
            reference(**bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError):
        record_type("h")
