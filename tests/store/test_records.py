"""Row filters: which roles a filter applies to, and the times it takes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from store.errors import InvalidInputError
from store.records import RowFilter, parse_timestamp, roles_for


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
