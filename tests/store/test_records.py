"""Records and row filters: records are what the models declare, built as their dataclass would build them."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from store.errors import InvalidInputError
from store.tables import codegen
from store.tables.filters import RowFilter, parse_timestamp, roles_for
from store.tables.models import Adoption, Completion, Judgement, Run
from store.tables.records import AdoptionRecord, CompletionRecord, JudgementRecord, RunRecord, RunTotals


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
    for beyond in ("9999-12-31T23:00:00-02:00", "0001-01-01T01:00:00+02:00"):  # UTC would leave the calendar
        with pytest.raises(InvalidInputError, match="outside the years 1 to 9999 in UTC"):
            parse_timestamp(beyond)
    assert parse_timestamp("9999-12-31T23:00:00+02:00") == datetime(9999, 12, 31, 21, tzinfo=UTC)


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
    ours, theirs = inspect.signature(record_type), inspect.signature(reference)
    assert ours.parameters == theirs.parameters  # (the generated module spells ``-> None`` as a string)
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


def test_the_records_are_what_the_models_give_today() -> None:
    """store/tables/records.py is generated from the models: a model changed without it fails here, naming how."""
    assert codegen.stale() == [], (
        f"run `{codegen.COMMAND}` (the models changed since store/tables/records.py was written)"
    )


@pytest.mark.parametrize(
    ("model", "record_type"),
    [(Completion, CompletionRecord), (Judgement, JudgementRecord), (Run, RunRecord), (Adoption, AdoptionRecord)],
)
def test_a_record_has_exactly_its_table_columns_in_storage_order(model: Any, record_type: type[Any]) -> None:
    assert tuple(f.name for f in dataclasses.fields(record_type)) == tuple(c.key for c in model.__table__.columns)
    nullable = {c.key for c in model.__table__.columns if c.nullable}
    defaults_none = {f.name for f in dataclasses.fields(record_type) if f.default is None}
    assert nullable <= defaults_none  # a nullable column may be left out of a record


def test_run_totals_add_up_the_summed_columns_of_runs() -> None:
    summed = {c.key for c in Run.__table__.columns if c.info.get("summed")}
    assert summed and summed <= {f.name for f in dataclasses.fields(RunTotals)}
    one = RunTotals(runs=1, hits=2, engine_seconds=0.5, first_started_at=datetime(2026, 1, 2, tzinfo=UTC))
    two = RunTotals(runs=2, hits=3, engine_seconds=0.25, first_started_at=datetime(2026, 1, 1, tzinfo=UTC))
    total = one + two
    assert (total.runs, total.hits, total.engine_seconds) == (3, 5, 0.75)
    assert total.first_started_at == datetime(2026, 1, 1, tzinfo=UTC) and total.last_finished_at is None
    assert one + RunTotals() == one


def test_a_text_filter_takes_one_text_value() -> None:
    for bad in (["1", "2"], 3, b"x"):
        with pytest.raises(InvalidInputError, match="instruction_id filters on one text value"):
            RowFilter(instruction_id=bad)  # type: ignore[arg-type]
    assert RowFilter(instruction_id="1").instruction_id == "1"
