"""One legacy row to one record (store/legacy/convert.py): times, hashes, and rows refused alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from store.descriptor import input_hash, render_text, sha256_hex
from store.legacy.convert import RowNotImported, parse_created_at, s2_input_hash, to_record
from store.legacy.formats import InputForm, LegacyRow
from store.tables.records import JudgementRecord
from tests.legacy.conftest import TEXT

FALLBACK = datetime(2026, 1, 1, tzinfo=UTC)


def judged(locator: str, model_a: str | None, model_b: str | None, orientation: str, text: str = "[[A]]") -> LegacyRow:
    """A legacy judgement row of a rendered input, its slots and orientation as given."""
    rendered = render_text("judge this")
    row = LegacyRow(locator, "judgements", InputForm.RENDERED, text, rendered, input_hash(rendered))
    row.model_a, row.model_b, row.orientation = model_a, model_b, orientation
    return row


def test_legacy_times_are_utc_and_a_missing_one_takes_the_fallback() -> None:
    assert parse_created_at("2026-02-01T10:00:00", FALLBACK) == datetime(2026, 2, 1, 10, tzinfo=UTC)
    converted = parse_created_at("2026-02-01T12:00:00+02:00", FALLBACK)
    assert converted == datetime(2026, 2, 1, 10, tzinfo=UTC) and converted.tzinfo is UTC  # stored in UTC
    assert parse_created_at(None, FALLBACK) is FALLBACK
    assert parse_created_at("  ", FALLBACK) is FALLBACK


def test_a_time_that_is_not_iso_8601_fails_its_row_only() -> None:
    with pytest.raises(RowNotImported) as refused:
        parse_created_at("last tuesday", FALLBACK)
    assert refused.value.kind == "fail" and refused.value.reason == "time 'last tuesday' is not ISO-8601"


def test_a_time_beyond_the_calendar_in_utc_fails_its_row_saying_so_not_that_it_is_not_iso_8601() -> None:
    with pytest.raises(RowNotImported) as refused:
        parse_created_at("9999-12-31T23:00:00-05:00", FALLBACK)  # valid ISO-8601, but year 10000 in UTC
    assert refused.value.kind == "fail"
    assert refused.value.reason == "time '9999-12-31T23:00:00-05:00' is outside the years 1 to 9999 in UTC"


def test_s3_rows_are_checked_with_judgestores_hash_and_s2_rows_with_the_json_quoted_rule() -> None:
    rendered = render_text("hello")
    row = LegacyRow("row 1", "completions", InputForm.RENDERED, "hi", rendered, input_hash(rendered))
    assert to_record(row, TEXT, FALLBACK).input_hash == input_hash(rendered)
    s2_text = '{"kind":"raw","text":"hello"}'
    assert s2_input_hash(s2_text) == sha256_hex(json.dumps(s2_text, ensure_ascii=False).encode())
    s2_row = LegacyRow("row 2", "completions", InputForm.S2, "hi", s2_text, s2_input_hash(s2_text))
    assert to_record(s2_row, TEXT, FALLBACK).input_hash == input_hash(rendered)  # rekeyed under judgestore's rule
    row.stored_hash = input_hash(render_text("edited"))
    with pytest.raises(RowNotImported, match="does not match its input"):
        to_record(row, TEXT, FALLBACK)


@pytest.mark.parametrize(
    ("usage_json", "says"),
    [
        ('{"s": "\\ud800"}', "usage"),  # a lone surrogate: no store keeps it
        ('{"n": 12345678901234567890123}', "usage"),  # past 64 bits: orjson would have read a float
        ('{"x": 1, "run": "run\\u0000"}', None),  # U+0000 is text like any other: kept
        ('{"s": NaN}', None),  # what Python's json.dumps wrote: kept
    ],
)
def test_a_value_the_store_refuses_fails_its_row_alone(usage_json: str, says: str | None) -> None:
    """Refused here, the row fails with its locator, and a dry run says so; refused by the store, its whole
    write chunk failed with no locator."""
    rendered = render_text("hello")
    row = LegacyRow("row 7", "completions", InputForm.RENDERED, "hi", rendered, input_hash(rendered))
    row.usage_json = usage_json
    if says is None:
        assert to_record(row, TEXT, FALLBACK).usage == json.loads(usage_json)
        return
    with pytest.raises(RowNotImported) as refused:
        to_record(row, TEXT, FALLBACK)
    assert refused.value.kind == "fail" and says in refused.value.reason


@pytest.mark.parametrize(
    ("orientation", "model_b", "stored"),
    [("single", None, (None, None)), ("direct", None, (None, None)), ("swapped", "y", ("y", "reversed")),
     ("direct", "  ", (None, None))],  # blank as a live request reads it: none (was: a model named "  ")
)  # fmt: skip
def test_orientations_and_model_b_are_read_as_pointwise_or_pairwise(
    orientation: str, model_b: str | None, stored: tuple[str | None, str | None]
) -> None:
    row = judged("row 3", "x", model_b, orientation)
    record = to_record(row, TEXT, FALLBACK)
    assert isinstance(record, JudgementRecord) and (record.model_b, record.orientation) == stored


def test_single_beside_a_model_b_fails_its_row_rather_than_dropping_model_b() -> None:
    """Was: stored pointwise, model_b dropped without a word."""
    row = judged("row 4", "x", "y", "single")
    with pytest.raises(RowNotImported) as refused:
        to_record(row, TEXT, FALLBACK)
    assert refused.value.kind == "fail"
    assert refused.value.reason == "orientation 'single' (pointwise) but model_b 'y': one of them is wrong"


def test_an_instruction_key_is_a_number_only_where_a_float_column_wrote_one() -> None:
    """Any text float() read was a number: "0010", "1e1" and "10" were one instruction, and "328e1" was 3280, so
    an answer was stored under another instruction's prompt (was)."""
    from store.legacy.inputs import normalise_key

    assert [normalise_key(v) for v in (7, 7.0, "7", "7.0", "7.00", "-3.0", 1e1)] == ["7"] * 5 + ["-3", "10"]
    assert [normalise_key(v) for v in ("0010", "1e1", "328e1", "07.0", "7.5", "nan", "abc")] == [
        "0010", "1e1", "328e1", "07.0", "7.5", "nan", "abc"
    ]  # fmt: skip


def test_a_blank_model_a_fails_its_row() -> None:
    """Stored as a model's name (was): no live run writes one (it refuses the request)."""
    row = judged("row 5", " ", "y", "direct")
    with pytest.raises(RowNotImported) as refused:
        to_record(row, TEXT, FALLBACK)
    assert refused.value.kind == "fail" and "model_a is blank (' ')" in refused.value.reason


def test_a_row_without_logprobs_under_a_descriptor_that_asks_for_them_is_skipped() -> None:
    """Imported, it was a hit served without the logprobs the run asked for (was); with them, it is imported."""
    row = judged("row 6", "x", "y", "direct")
    asking = TEXT.model_copy(update={"sampling": TEXT.sampling.model_copy(update={"logprobs": 3})})
    with pytest.raises(RowNotImported) as refused:
        to_record(row, asking, FALLBACK)
    assert refused.value.kind == "skip" and "asks for 3 per position" in refused.value.reason
    assert to_record(row, TEXT, FALLBACK).top_logprobs is None  # a descriptor asking none: imported as it was
    row.top_logprobs = json.dumps({"A": -0.1, "B": -2.3})
    assert to_record(row, asking, FALLBACK).top_logprobs is not None
    row.top_logprobs, row.orientation = None, "sideways"  # a row at fault fails for it, not "skipped" (was)
    with pytest.raises(RowNotImported) as failed:
        to_record(row, asking, FALLBACK)
    assert failed.value.kind == "fail" and "unknown orientation 'sideways'" in failed.value.reason


def test_single_beside_a_blank_model_b_is_pointwise() -> None:
    """A blank model_b is none, as a live request reads it: beside "single" it failed as a second model (was)."""
    row = judged("row 8", "x", "  ", "single", "8")
    record = to_record(row, TEXT, FALLBACK)
    assert isinstance(record, JudgementRecord) and (record.model_b, record.orientation) == (None, None)
