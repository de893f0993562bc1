"""Statements over one descriptor database: get_many, put_many, query, delete, count."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, insert, select
from sqlalchemy.orm import Session

import store.backends.sqlite.rows
import store.jsonvalues
from store import logprobs
from store.backends.postgres.text import ESCAPE
from store.backends.sqlite.connections import sqlite_dialect
from store.backends.sqlite.database import SqliteDatabase
from store.descriptor import ModelDescriptor, input_hash, render_messages, render_text
from store.errors import DamagedTextError, EmptyFilterError, InvalidInputError
from store.logprobs import PositionLogprobs, TokenLogprob
from store.repository import Repository
from store.settings import Settings
from store.stats import database_stats
from store.store import Database, Store
from store.tables.filters import RowFilter
from store.tables.models import MODEL_OF_ROLE, UTCDateTime
from store.tables.records import CompletionRecord, JudgementRecord, record_fields
from store.tables.row_checks import MAX_SAMPLE_INDEX
from tests.factories import completion_record, current_database, file_digests, judgement_record
from tests.faults import damage_text

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def completions(store: Store, descriptor: ModelDescriptor) -> Database:
    return store.database("completions", "mt-bench", descriptor)


@pytest.fixture
def judgements(store: Store, descriptor: ModelDescriptor) -> Database:
    return store.database("judgements", "arena-hard", descriptor)


@pytest.fixture
def statements(completions: Database) -> Iterator[list[str]]:
    """The SQL statements SQLite runs for the database, parameters filled in (one entry per statement).

    Traced on the connection the database keeps (get_many, put_many) and on its engine's (everything else).
    """
    seen: list[str] = []

    def trace(dbapi_connection: Any, *_rest: Any) -> None:
        dbapi_connection.set_trace_callback(seen.append)

    def untrace(dbapi_connection: Any, *_rest: Any) -> None:
        dbapi_connection.set_trace_callback(None)

    assert isinstance(completions, SqliteDatabase)
    with completions._driver() as kept:
        trace(kept)
    event.listen(completions.engine.pool, "checkout", trace)
    event.listen(completions.engine.pool, "checkin", untrace)
    yield seen
    event.remove(completions.engine.pool, "checkout", trace)
    event.remove(completions.engine.pool, "checkin", untrace)
    with completions._driver() as kept:
        untrace(kept)


def lookups(statements: list[str]) -> list[str]:
    """The bulk lookups among ``statements`` (lean or whole: both key on one JSON array)."""
    return [s for s in statements if s.lstrip().startswith("SELECT") and "json_each" in s]


# ---------------------------------------------------------------- get_many


@pytest.mark.parametrize("hit_percent", [0, 50, 100])
def test_get_many_returns_exactly_the_stored_rows(hit_percent: int, completions: Database) -> None:
    stored = [completion_record(i) for i in range(100)]
    completions.put_many(stored)
    asked = [completion_record(i).input_hash for i in range(100 - hit_percent, 200 - hit_percent)]
    found = completions.get_many(asked)
    expected = {r.input_hash: r for r in stored if r.input_hash in set(asked)}
    assert len(expected) == hit_percent
    assert found == expected


def test_get_many_of_nothing_is_empty(completions: Database) -> None:
    completions.put_many([completion_record(1)])
    assert completions.get_many([]) == {}
    assert completions.get_many(iter(())) == {}


def test_get_many_batches_keys_beyond_one_statement(
    completions: Database, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.backends.sqlite.rows, "LOOKUP_BATCH", 7)
    stored = [completion_record(i) for i in range(50)]
    completions.put_many(stored)
    statements.clear()
    asked = [r.input_hash for r in stored] + [completion_record(i).input_hash for i in range(1000, 1030)]
    found = completions.get_many(asked)
    assert len(lookups(statements)) == math.ceil(80 / 7)
    assert found == {r.input_hash: r for r in stored}  # reads the deferred prompts: 50 keys, ceil(50 / 7) more
    assert len(lookups(statements)) == math.ceil(80 / 7) + math.ceil(50 / 7)


def test_duplicate_keys_are_looked_up_once(
    completions: Database, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.backends.sqlite.rows, "LOOKUP_BATCH", 10)
    stored = [completion_record(i) for i in range(10)]
    completions.put_many(stored)
    statements.clear()
    found = completions.get_many([r.input_hash for r in stored] * 5)
    assert len(lookups(statements)) == 1  # 50 keys, 10 distinct: one batch
    assert found == {r.input_hash: r for r in stored}


def test_get_many_uses_one_json_parameter_on_sqlite(completions: Database, statements: list[str]) -> None:
    completions.put_many([completion_record(1)])
    statements.clear()
    keys = [completion_record(i).input_hash for i in range(500)]
    completions.get_many(keys)
    (lookup,) = lookups(statements)  # traced with its parameter filled in: one JSON array of the 500 keys
    assert lookup.count("json_each(") == 1 and f"json_each('{orjson.dumps(keys).decode()}')" in lookup


# ---------------------------------------------------------------- put_many


def test_put_many_ignore_keeps_stored_rows_and_counts_new_ones(completions: Database) -> None:
    first = [completion_record(i) for i in range(10)]
    assert completions.put_many(first) == 10
    changed = [completion_record(i, completion="changed") for i in range(15)]
    assert completions.put_many(changed, on_conflict="ignore") == 5
    found = completions.get_many(r.input_hash for r in changed)
    assert [found[r.input_hash].completion for r in changed] == [f"answer {i}" for i in range(10)] + ["changed"] * 5
    assert completions.count() == 15


def test_put_many_replace_overwrites_stored_rows(completions: Database) -> None:
    completions.put_many([completion_record(i) for i in range(10)])
    changed = [completion_record(i, completion="changed", top_logprobs=None, run_id="run-2") for i in range(15)]
    assert completions.put_many(changed, on_conflict="replace") == 15
    found = completions.get_many(r.input_hash for r in changed)
    assert found == {r.input_hash: r for r in changed}
    assert completions.count() == 15


def test_put_many_writes_each_input_once_even_if_repeated(completions: Database) -> None:
    assert completions.put_many([completion_record(1), completion_record(1), completion_record(2)]) == 2
    assert completions.count() == 2


def test_put_many_of_nothing_writes_nothing(completions: Database) -> None:
    assert completions.put_many([]) == 0
    assert completions.count() == 0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: judgement_record(1), id="judgement-in-completions"),
        pytest.param(lambda: {"input_hash": "x"}, id="a-dict"),
        pytest.param(lambda: completion_record(1, created_at=datetime(2026, 1, 1)), id="naive-created-at"),
        pytest.param(lambda: completion_record(1, sample_index=-1), id="negative-sample-index"),
        pytest.param(lambda: completion_record(1, input_text=None), id="no-input-text"),
        pytest.param(lambda: completion_record(1, created_at=None), id="no-created-at"),
    ],
)
def test_malformed_rows_are_refused_and_nothing_of_the_batch_is_written(bad: Any, completions: Database) -> None:
    completions.put_many([completion_record(100)])
    with pytest.raises(InvalidInputError):
        completions.put_many([completion_record(1), completion_record(2), bad()])
    assert completions.count() == 1


def test_a_row_whose_key_is_not_the_hash_of_its_input_is_refused_on_write(completions: Database) -> None:
    """Such a row would be served as a hit for an input it does not answer (verify is the net for other writers)."""
    other = completion_record(7)
    sample_1 = completion_record(8, sample_index=1)  # sample k > 0 is keyed by input_hash(rendered, k)
    for bad in (
        completion_record(1, input_hash=other.input_hash),
        completion_record(1, input_hash="h1"),
        dataclasses.replace(sample_1, input_hash=completion_record(8).input_hash),
        completion_record(1, sample_index=1, input_text="not JSON"),
    ):
        with pytest.raises(InvalidInputError, match=r"hash") as caught:
            completions.put_many([completion_record(2), bad])
        assert bad.input_hash in str(caught.value)
    assert completions.count() == 0
    assert completions.put_many([dataclasses.replace(sample_1, input_hash=input_hash(sample_1.input_text, 1))]) == 1


def test_a_bad_orientation_is_refused(judgements: Database) -> None:
    with pytest.raises(InvalidInputError, match="orientation"):
        judgements.put_many([judgement_record(1), judgement_record(2, orientation="sideways")])
    assert judgements.count() == 0


def test_unknown_conflict_policy_is_refused(completions: Database) -> None:
    with pytest.raises(InvalidInputError, match="on_conflict"):
        completions.put_many([completion_record(1)], on_conflict="update")  # type: ignore[arg-type]
    assert completions.count() == 0


def test_writes_inside_one_transaction_commit_together_or_not_at_all(completions: Database) -> None:
    with pytest.raises(RuntimeError), completions.transaction() as repo:
        repo.put_many([completion_record(1)])
        raise RuntimeError("caller failed half-way")
    assert completions.count() == 0
    with completions.transaction() as repo:
        repo.put_many([completion_record(1)])
        repo.put_many([completion_record(2)])
        assert repo.count() == 2
    assert completions.count() == 2


# ---------------------------------------------------------------- round trips, on a folder and on a server


@pytest.fixture(params=["folder", pytest.param("server", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, store_root: Path) -> Iterator[Store]:
    """The same tests on a folder store (SQLite) and a server store (PostgreSQL): they keep the same values."""
    with Store(root=store_root) if request.param == "folder" else Store(url=request.getfixturevalue("pg_url")) as s:
        yield s


@pytest.fixture
def both(store_root: Path, pg_url: str) -> Iterator[tuple[Store, Store]]:
    """A folder store and a server store at once, to compare what each says."""
    with Store(root=store_root) as folder, Store(url=pg_url) as server:
        yield folder, server


@pytest.mark.parametrize(
    ("given", "said"),
    [("record", "not CompletionRecord: put_many([record])"), ("none", "not NoneType"), ("dict", "not dict")],
)
def test_put_many_of_no_list_of_records_is_refused_naming_what_to_give(
    backend: Store, descriptor: ModelDescriptor, given: str, said: str
) -> None:
    """A record alone was a TypeError ('CompletionRecord' object is not iterable), from inside (was)."""
    database = backend.database("completions", "t", descriptor)
    value = {"record": completion_record(0), "none": None, "dict": {"input_hash": "x"}}[given]
    with pytest.raises(InvalidInputError, match=re.escape(f"put_many takes a list of records, {said}")):
        database.put_many(value)
    assert database.count() == 0


BAD_KEYS: list[tuple[Any, str]] = [
    ([123], "int 123 is not an input hash"),
    ([None], "NoneType None is not an input hash"),
    ([b"ab" * 32], "bytes b'abab"),
    (["ab" * 16], "str 'abab"),  # too short
    (["ab" * 32 + "a"], "str 'abab"),  # too long
    (["zz" * 32], "str 'zzzz"),  # not hex
    (["AB" * 32], "str 'ABAB"),  # not lowercase: never a stored key
    (["é" * 64], "str 'éé"),
    ("ab" * 32, "an iterable of input hashes, not one str"),
]


@pytest.mark.parametrize(("keys", "named"), BAD_KEYS)
def test_get_many_refuses_what_is_not_an_input_hash(backend: Store, descriptor: ModelDescriptor, keys: Any,
                                                    named: str) -> None:  # fmt: skip
    database = backend.database("completions", "t", descriptor)
    good = completion_record(0)
    database.put_many([good])
    with pytest.raises(InvalidInputError, match=re.escape(named)):
        database.get_many([good.input_hash, *keys] if isinstance(keys, list) else keys)
    with pytest.raises(InvalidInputError, match=re.escape(named)):
        database.get_many(keys, deferred=False)
    with database.reading() as repo, pytest.raises(InvalidInputError, match=re.escape(named)):
        repo.get_many(keys)  # inside a transaction too
    assert set(database.get_many([good.input_hash])) == {good.input_hash}


# NUL, the server's escape character and the digits that follow it, 4-byte UTF-8, right-to-left text and
# bidirectional controls, then any character (lone surrogates aside: no store keeps them, see below).
special = st.sampled_from(["\0", ESCAPE, "0", "1", "\U0001f600", "\U00020000", "\u05e9", "\u0627", "\u202e", "\u200f"])
characters = special | st.characters(blacklist_categories=("Cs",))
texts = st.text(alphabet=characters, max_size=300)
keys = st.text(alphabet=characters, max_size=20)
floats = st.floats(allow_nan=True, allow_infinity=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | floats | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
tokens = st.builds(
    TokenLogprob,
    text=keys,
    logprob=floats,
    token_id=st.none() | st.integers(0, 2**31),
    rank=st.none() | st.integers(1, 2**20),
    bytes=st.none() | st.lists(st.integers(0, 255), max_size=8).map(tuple),
)
positions = st.builds(PositionLogprobs, candidates=st.lists(tokens, max_size=5).map(tuple), sampled=st.none() | tokens)
logprob_structures = st.lists(positions, max_size=3).map(logprobs.encode) | st.dictionaries(keys, floats, max_size=8)


def test_arbitrary_text_json_and_logprobs_round_trip(backend: Store, descriptor: ModelDescriptor) -> None:
    completions = backend.database("completions", "mt-bench", descriptor)

    @settings(max_examples=60, deadline=None)
    @given(
        prompt=texts,
        answer=texts,
        top=st.none() | logprob_structures,
        usage=st.none() | st.dictionaries(keys, json_values, max_size=6),
        meta=st.none() | texts,
        when=st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
        sample=st.integers(min_value=0, max_value=MAX_SAMPLE_INDEX),
    )
    def round_trip(
        prompt: str, answer: str, top: Any, usage: Any, meta: str | None, when: datetime, sample: int
    ) -> None:
        rendered = render_text(prompt)
        record = CompletionRecord(
            input_hash=input_hash(rendered, sample),
            sample_index=sample,
            input_text=rendered,
            completion=answer,
            benchmark=meta,
            instruction_id=meta,
            model=meta,
            finish_reason=meta,
            usage=usage,
            top_logprobs=top,
            run_id=meta,
            created_by=meta,
            created_at=when,
        )
        completions.put_many([record], on_conflict="replace")
        back = completions.get_many([record.input_hash])[record.input_hash]
        assert same_records(back, record), (back, record)
        assert back.input_hash == input_hash(back.input_text, back.sample_index)  # the key still is its input's
        assert back.created_at.tzinfo is UTC
        if top is not None:
            assert list(back.top_logprobs) == sorted(top)  # canonical JSON: keys come back sorted
        (queried,) = completions.query(RowFilter(input_hashes=(record.input_hash,)))
        assert same_records(queried, record)
        if meta is not None:  # a filter value is escaped as the stored one is: the row is found by it
            assert completions.count(RowFilter(benchmark=meta, model=meta, run_id=meta, created_by=meta)) >= 1

    round_trip()


def test_a_ten_megabyte_completion_with_every_kind_of_text_round_trips(
    backend: Store, descriptor: ModelDescriptor
) -> None:
    piece = "answer \0 \U0001f600 \u05e9\u05dc\u05d5\u05dd \u202eevil\u202c " + ESCAPE + "0 \n"
    answer = piece * (10_000_000 // len(piece.encode()) + 1)
    record = completion_record(1, completion=answer, top_logprobs={"\0": -math.inf, ESCAPE: math.nan})
    database = backend.database("completions", "t", descriptor)
    assert database.put_many([record]) == 1
    back = database.get_many([record.input_hash])[record.input_hash]
    assert len(answer.encode()) > 10_000_000 and back.completion == answer and same_records(back, record)
    assert backend.verify(database.location).ok


def test_rows_are_selected_and_deleted_by_values_holding_nul(backend: Store, descriptor: ModelDescriptor) -> None:
    judgements = backend.database("judgements", "t", descriptor)
    names = ["a\0b", "a", "a\0", ESCAPE + "0", "\0", ESCAPE]  # distinct values, some of them spelled alike escaped
    rows = [judgement_record(i, benchmark=name, model_a=name, judge=name) for i, name in enumerate(names)]
    judgements.put_many(rows)
    for i, name in enumerate(names):
        for flt in (RowFilter(benchmark=name), RowFilter(model=name), RowFilter(judge=name, model_a=name)):
            assert [r.instruction_id for r in judgements.query(flt)] == [str(i)], (name, flt)
    assert judgements.delete(RowFilter(benchmark="a\0b")) == 1 and judgements.count() == len(names) - 1
    totals = judgements.count(RowFilter(model_a="\0")), judgements.count(RowFilter(model_a=ESCAPE))
    assert totals == (1, 1)


def test_usage_totals_add_up_the_numbers_and_skip_everything_else(backend: Store, descriptor: ModelDescriptor) -> None:
    usages = [
        {"prompt_tokens": 3, "completion_tokens": 2**40, "engine_seconds": 0.5},
        {"prompt_tokens": 1.5, "completion_tokens": 2**62, "engine_seconds": math.nan},
        {"prompt_tokens": "12", "completion_tokens": True, "engine_seconds": -math.inf},
        {"prompt_tokens": {"n": 1}, "completion_tokens": [2], "engine_seconds": "0.25"},
        {},
        None,
    ]
    database = backend.database("completions", "t", descriptor)
    database.put_many([completion_record(i, usage=usage) for i, usage in enumerate(usages)])
    with database.transaction() as repo:
        totals = repo.totals()
    # 3 + 1.5 (whole tokens), the 64-bit counts exactly, the one finite number of seconds (NaN and -inf are kept,
    # but they are no time to add up); a string, a boolean, an object or a list is no count.
    assert (totals.rows, totals.prompt_tokens, totals.completion_tokens) == (6, 4, 2**40 + 2**62)
    assert (totals.engine_seconds, totals.rows_with_cost) == (0.5, 1)


def test_usage_totals_past_64_bits_are_exact_on_both_backends(backend: Store, descriptor: ModelDescriptor) -> None:
    """SQLite's sum() stops at 2^63; the totals go on, as the server's numeric does (and stats reads them)."""
    usages = [{"prompt_tokens": 2**63 - 1, "completion_tokens": 1, "engine_seconds": 2**62}] * 3
    usages += [{"prompt_tokens": 0.5, "completion_tokens": None, "engine_seconds": 0.25}]
    database = backend.database("completions", "t", descriptor)
    database.put_many([completion_record(i, usage=usage) for i, usage in enumerate(usages)])
    with database.transaction() as repo:
        every, some = repo.totals(), repo.totals(RowFilter(instruction_id="1"))
    assert (every.rows, every.prompt_tokens, every.completion_tokens) == (4, 3 * (2**63 - 1), 3)
    assert (every.engine_seconds, every.rows_with_cost) == (3 * 2**62 + 0.25, 4)
    assert (some.rows, some.prompt_tokens, some.completion_tokens) == (1, 2**63 - 1, 1)
    assert every.data_bytes > some.data_bytes > 0


def test_seconds_that_would_add_up_past_the_float_range_add_nothing(
    backend: Store, descriptor: ModelDescriptor
) -> None:
    """Two engine_seconds of 1e308 summed past the float range: stats crashed on SQLite (inf, kept as null) and
    called the database unreadable on PostgreSQL (was)."""
    usages = [{"engine_seconds": 1e308}, {"engine_seconds": -1e308}, {"engine_seconds": 1e308}]
    usages += [{"engine_seconds": 0.5}]
    database = backend.database("completions", "t", descriptor)
    database.put_many([completion_record(i, usage=usage) for i, usage in enumerate(usages)])
    with database.transaction() as repo:
        totals = repo.totals()
    assert (totals.rows, totals.engine_seconds, totals.rows_with_cost) == (4, 0.5, 1)
    assert database_stats(database).rows.engine_seconds == 0.5


def test_token_counts_that_would_add_up_past_the_float_range_add_nothing(
    backend: Store, descriptor: ModelDescriptor
) -> None:
    """Two prompt_tokens of 1e308 summed to inf and stats crashed (int(inf)); whole numbers still add up exactly."""
    usages = [{"prompt_tokens": 1e308, "completion_tokens": 1.5e308}, {"prompt_tokens": 1e308}]
    usages += [{"prompt_tokens": 7, "completion_tokens": 2**62}, {"completion_tokens": 2**62}]
    usages += [{"prompt_tokens": -(2**63)}]  # SQLite's abs() of it overflowed: the table read as damaged
    database = backend.database("completions", "t", descriptor)
    database.put_many([completion_record(i, usage=usage) for i, usage in enumerate(usages)])
    with database.transaction() as repo:
        totals = repo.totals()
    assert (totals.rows, totals.prompt_tokens, totals.completion_tokens) == (5, 7 - 2**63, 2**63)
    assert database_stats(database).rows.prompt_tokens == 7 - 2**63


def refusals() -> list[Any]:
    """Rows some backend would refuse or change: each is refused on both, with the same error."""
    surrogate = "before \ud800 after"
    columns = ("completion", "benchmark", "instruction_id", "model", "finish_reason", "run_id", "created_by")
    rows: list[Any] = [
        pytest.param(completion_record(1, **{column: surrogate}), column, id=f"surrogate-in-{column}")
        for column in (*columns, "input_text")
    ]
    rows += [
        pytest.param(completion_record(1, usage={"k": surrogate}), "usage", id="surrogate-in-a-json-value"),
        pytest.param(completion_record(1, top_logprobs={surrogate: -1.0}), "top_logprobs", id="surrogate-in-a-key"),
        pytest.param(completion_record(1, usage={1: 2}), "usage", id="json-key-not-text"),
        pytest.param(completion_record(1, usage={"x": 2**64}), "usage", id="json-integer-beyond-64-bits"),
        pytest.param(completion_record(1, usage={"$float": "x"}), "usage", id="json-float-tag"),
        pytest.param(completion_record(1, usage=5), "usage", id="json-bare-integer"),
        pytest.param(completion_record(1, top_logprobs=-1.5), "top_logprobs", id="json-bare-float"),
        # Sharing's shards carry objects only: a fetch refused the whole shard such a row was pushed in (was)
        pytest.param(completion_record(1, usage=["x"]), "usage", id="json-list"),
        pytest.param(completion_record(1, top_logprobs="null"), "top_logprobs", id="json-string"),
        pytest.param(completion_record(1, usage=True), "usage", id="json-boolean"),
        pytest.param(completion_record(1, sample_index=MAX_SAMPLE_INDEX + 1), "sample_index", id="sample-2**31"),
        pytest.param(completion_record(1, sample_index=-1), "sample_index", id="sample-negative"),
        pytest.param(completion_record(1, sample_index=True), "sample_index", id="sample-bool"),
        pytest.param(completion_record(1, benchmark="\U0001f600" * 400), "benchmark", id="indexed-text-too-long"),
        pytest.param(completion_record(1, run_id="\0" * 400), "run_id", id="indexed-nul-too-long-escaped"),
        pytest.param(completion_record(1, model=5), "model", id="text-column-holding-an-int"),
        pytest.param(completion_record(1, completion=None), "completion", id="no-completion"),
        pytest.param(completion_record(1, completion=b"bytes"), "completion", id="completion-bytes"),
        pytest.param(completion_record(1, adopted_from="x" * 64), "adopted_from", id="adopted-from-not-a-digest"),
        pytest.param(completion_record(1, adopted_from="AB" * 32), "adopted_from", id="adopted-from-upper-case"),
        pytest.param(completion_record(1, created_at=datetime(2026, 1, 1)), "created_at", id="naive-created-at"),
        pytest.param(completion_record(1, created_at="2026-01-01"), "created_at", id="created-at-text"),
        pytest.param(judgement_record(1, orientation="sideways"), "orientation", id="orientation"),
        pytest.param(judgement_record(1, judge="j\udfff"), "judge", id="surrogate-in-judge"),
    ]
    return rows


@pytest.mark.postgres
@pytest.mark.parametrize(("bad", "column"), refusals())
def test_a_value_either_backend_refuses_is_the_same_typed_error_on_both_and_nothing_is_written(
    bad: Any, column: str, both: tuple[Store, Store], descriptor: ModelDescriptor
) -> None:
    role = "judgements" if isinstance(bad, JudgementRecord) else "completions"
    good = judgement_record if role == "judgements" else completion_record
    messages = []
    for backend in both:
        database = backend.database(role, "t", descriptor)
        database.put_many([good(100)])
        with pytest.raises(InvalidInputError) as caught:
            database.put_many([good(2), bad, good(3)])
        with pytest.raises(InvalidInputError) as in_a_transaction, database.transaction() as repo:
            repo.put_many([good(4), bad])
        assert str(in_a_transaction.value) == str(caught.value)
        assert database.count() == 1
        messages.append(str(caught.value))
    folder, server = messages
    assert folder == server and column in folder and bad.input_hash in folder, messages


def test_a_lone_surrogate_in_a_prompt_is_refused_before_any_row_exists() -> None:
    with pytest.raises(InvalidInputError):
        render_messages([{"role": "user", "content": "\udc80"}])


def test_created_at_comes_back_as_aware_utc(completions: Database) -> None:
    paris = timezone(timedelta(hours=2))
    record = completion_record(1, created_at=datetime(2026, 6, 1, 14, 30, 15, 123456, tzinfo=paris))
    completions.put_many([record])
    back = completions.get_many([record.input_hash])[record.input_hash]
    assert back.created_at == datetime(2026, 6, 1, 12, 30, 15, 123456, tzinfo=UTC)
    assert back.created_at.tzinfo is UTC


def test_json_none_is_stored_as_sql_null(completions: Database) -> None:
    completions.put_many([completion_record(2, top_logprobs=None, usage=None)])
    with completions.reading() as repo:
        raw = repo.conn.exec_driver_sql("SELECT top_logprobs IS NULL, usage IS NULL FROM completions").one()
    assert tuple(raw) == (1, 1)


# ---------------------------------------------------------------- query, count, delete


def judgement_rows() -> list[JudgementRecord]:
    """A small arena: every field takes a few values so each filter selects a strict subset."""
    rows = []
    for i in range(60):
        pointwise = i % 5 == 0
        rows.append(
            judgement_record(
                i,
                pointwise=pointwise,
                orientation=None if pointwise else ("direct" if i % 2 else "reversed"),
                benchmark=["arena-hard", "mt-bench"][i % 2],
                instruction_id=str(i % 7),
                model_a=["model-a", "model-c"][i % 3 == 0],
                model_b=None if pointwise else ["model-b", "model-a", "model-d"][i % 3],
                judge=["judge-1", "judge-2"][i % 4 == 0],
                run_id=f"run-{i % 3}",
                created_by=["alice", "bob"][i % 2],
                created_at=T0 + timedelta(hours=i),
            )
        )
    return rows


def expected(rows: list[Any], flt: RowFilter) -> list[Any]:
    """The filter's meaning, spelled out in Python (RowFilter's docstring)."""

    def keep(r: Any) -> bool:
        for name in ("benchmark", "instruction_id", "model_a", "model_b", "judge", "orientation", "run_id",
                     "created_by"):  # fmt: skip
            if getattr(flt, name) is not None and getattr(r, name, None) != getattr(flt, name):
                return False
        if flt.model is not None:
            models = {r.model} if isinstance(r, CompletionRecord) else {r.model_a, r.model_b}
            if flt.model not in models:
                return False
        if flt.pointwise is not None and (r.model_b is None) != flt.pointwise:
            return False
        if flt.created_after is not None and r.created_at < flt.created_after:
            return False
        if flt.created_before is not None and r.created_at >= flt.created_before:
            return False
        return flt.input_hashes is None or r.input_hash in flt.input_hashes

    return sorted((r for r in rows if keep(r)), key=lambda r: (r.created_at, r.input_hash))


JUDGEMENT_FILTERS = [
    RowFilter(benchmark="mt-bench"),
    RowFilter(instruction_id="3"),
    RowFilter(model="model-a"),  # model_a OR model_b
    RowFilter(model="model-d"),
    RowFilter(model_a="model-c"),
    RowFilter(model_b="model-a"),
    RowFilter(judge="judge-2"),
    RowFilter(orientation="reversed"),
    RowFilter(pointwise=True),
    RowFilter(pointwise=False),
    RowFilter(run_id="run-1"),
    RowFilter(created_by="bob"),
    RowFilter(created_after=T0 + timedelta(hours=10)),  # inclusive
    RowFilter(created_before=T0 + timedelta(hours=10)),  # exclusive
    RowFilter(created_after=T0 + timedelta(hours=5), created_before=T0 + timedelta(hours=25)),
    RowFilter(benchmark="arena-hard", model="model-a", judge="judge-1", orientation="direct"),
    RowFilter(model="nobody"),
]


@pytest.fixture
def arena(judgements: Database) -> list[JudgementRecord]:
    rows = judgement_rows()
    judgements.put_many(rows)
    return rows


@pytest.mark.parametrize("flt", JUDGEMENT_FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.as_dict().items()))
def test_query_and_count_select_what_the_filter_says(
    flt: RowFilter, judgements: Database, arena: list[JudgementRecord]
) -> None:
    want = expected(arena, flt)
    assert 0 <= len(want) < len(arena)
    assert list(judgements.query(flt)) == want
    assert judgements.count(flt) == len(want)


def test_query_without_filter_returns_everything_in_creation_order(
    judgements: Database, arena: list[JudgementRecord]
) -> None:
    assert list(judgements.query()) == expected(arena, RowFilter())
    assert judgements.count() == 60


def test_query_limit(judgements: Database, arena: list[JudgementRecord]) -> None:
    assert (
        list(judgements.query(RowFilter(benchmark="mt-bench"), limit=4))
        == expected(arena, RowFilter(benchmark="mt-bench"))[:4]
    )
    assert list(judgements.query(limit=0)) == []


def test_query_by_input_hashes(judgements: Database, arena: list[JudgementRecord]) -> None:
    hashes = tuple(r.input_hash for r in arena[::9])
    assert list(judgements.query(RowFilter(input_hashes=hashes))) == expected(arena, RowFilter(input_hashes=hashes))


def test_completion_filters(completions: Database) -> None:
    rows = [completion_record(i, model=["m1", "m2"][i % 2], created_at=T0 + timedelta(minutes=i)) for i in range(20)]
    completions.put_many(rows)
    for flt in [RowFilter(model="m2"), RowFilter(benchmark="mt-bench", instruction_id="4"), RowFilter(run_id="x")]:
        assert list(completions.query(flt)) == expected(rows, flt)
    for judgement_only in [RowFilter(judge="j"), RowFilter(model_b="m"), RowFilter(pointwise=True)]:
        with pytest.raises(InvalidInputError, match="other role"):
            list(completions.query(judgement_only))


def test_what_went_wrong_is_selectable(completions: Database) -> None:
    """Truncated, empty and error rows: "delete every truncated completion, then rerun" is one filter."""
    shapes = [("stop", "fine"), ("length", "cut sho"), ("abort", ""), (None, "legacy"), ("length", " \n\t"),
              ("content_filter", "no"), ("error", "x"), ("stop", "")]  # fmt: skip
    rows = [completion_record(i, finish_reason=reason, completion=text) for i, (reason, text) in enumerate(shapes)]
    completions.put_many(rows)

    def ids(flt: RowFilter) -> list[int]:
        return sorted(int(r.instruction_id or -1) for r in completions.query(flt))

    assert ids(RowFilter(finish_reasons=("length",))) == [1, 4]
    assert ids(RowFilter(finish_reasons=("length", "stop"))) == [0, 1, 4, 7]
    assert ids(RowFilter(empty=True)) == [2, 4, 7]
    assert ids(RowFilter(empty=False)) == [0, 1, 3, 5, 6]
    assert ids(RowFilter(error=True)) == [2, 5, 6]
    assert ids(RowFilter(error=False)) == [0, 1, 3, 4, 7]  # a NULL finish reason is no error
    assert ids(RowFilter(finish_reasons=("length",), empty=False)) == [1]
    assert completions.count(RowFilter(finish_reasons=("length",))) == 2
    assert completions.delete(RowFilter(finish_reasons=("length",))) == 2
    assert completions.count() == len(shapes) - 2
    with pytest.raises(InvalidInputError, match="tuple of strings"):
        RowFilter(finish_reasons="length")  # type: ignore[arg-type]


def test_query_streams_in_partitions(
    judgements: Database, arena: list[JudgementRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.repository, "STREAM_SLICE", 7)
    partitions: list[int] = []
    real = Repository._records

    def counting(self: Repository, rows: Any) -> Any:
        partitions.append(len(rows))
        return real(self, rows)

    monkeypatch.setattr(Repository, "_records", counting)
    assert list(judgements.query()) == expected(arena, RowFilter())
    assert partitions == [7] * 8 + [4]  # never more than one partition of rows built at once


def test_a_read_without_locks_gathers_wide_rows_by_bytes_even_after_narrow_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check of a file read without locks gathers a batch before it gives it: a thousand rows of per-token
    logprobs (300 KB each once parsed) held a GB (was), and a size guessed from narrow rows before them as much."""
    import store.backends.sqlite.database as sqlite_database

    positions = [{"candidates": [{"id": k, "logprob": -1.0, "rank": k, "text": "t"} for k in range(5)]}] * 200
    wide = {"format": "judgestore-logprobs/v1", "positions": positions}
    early, late = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    rows = [judgement_record(i, created_at=early) for i in range(1100)]  # narrow ones first, in the read's order
    rows += [judgement_record(i, top_logprobs=wide, created_at=late) for i in range(1100, 1400)]
    root = tmp_path / "store"
    with Store(Settings(), root=root) as writable:
        writable.database("judgements", "t", ModelDescriptor(provider="vllm", model="m")).put_many(rows)
    monkeypatch.setattr(sqlite_database, "PARTITION_BYTES", 20 << 20)
    batches: list[tuple[int, int]] = []
    real = sqlite_database._next_batch

    def weighed(read: Any) -> Any:
        batch = real(read)
        batches.append((len(batch), store.repository.records_bytes(batch) >> 20))
        return batch

    monkeypatch.setattr(sqlite_database, "_next_batch", weighed)
    with Store(Settings(), root=root, readonly=True) as reader:
        (location,) = reader.locations()
        assert sum(1 for _ in reader.open(location).query()) == 1400
    assert batches[0][0] == 1000  # narrow rows: a whole batch, as before
    assert all(mb < 20 + 70 for _, mb in batches) and max(n for n, _ in batches[2:-1]) < 300  # wide ones: fewer


def test_a_query_abandoned_half_way_releases_its_connection(judgements: Database, arena: list[JudgementRecord]) -> None:
    rows = judgements.query()
    first = list(itertools.islice(rows, 5))
    rows.close()
    assert first == expected(arena, RowFilter())[:5]
    judgements.put_many([judgement_record(1000)])  # a write is not blocked by the abandoned read
    assert judgements.count() == 61


def test_delete_returns_the_count_and_removes_only_matching_rows(
    judgements: Database, arena: list[JudgementRecord]
) -> None:
    flt = RowFilter(run_id="run-1", judge="judge-1")
    doomed = expected(arena, flt)
    assert judgements.delete(flt) == len(doomed) > 0
    assert judgements.count(flt) == 0
    remaining = [r for r in arena if r not in doomed]
    assert list(judgements.query()) == expected(remaining, RowFilter())
    assert judgements.delete(flt) == 0


def test_delete_by_model_removes_both_sides_of_the_pair(judgements: Database, arena: list[JudgementRecord]) -> None:
    assert judgements.delete(RowFilter(model="model-a")) == len(expected(arena, RowFilter(model="model-a")))
    assert all("model-a" not in (r.model_a, r.model_b) for r in judgements.query())


def test_delete_with_an_empty_filter_is_refused_and_changes_nothing(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    with Store(root=store_root) as s:
        s.database("judgements", "arena-hard", descriptor).put_many(judgement_rows())
    before = file_digests(store_root)
    with Store(root=store_root) as s:
        database = s.database("judgements", "arena-hard", descriptor)
        with pytest.raises(EmptyFilterError, match="empty filter"):
            database.delete(RowFilter())
        with pytest.raises(EmptyFilterError):
            database.delete(RowFilter(pointwise=None))
        with pytest.raises(EmptyFilterError):  # no filter at all (delete takes several): was 0, silently
            database.delete()
        with pytest.raises(EmptyFilterError):  # one empty among them: the transaction deletes nothing
            database.delete(RowFilter(model="model-a"), RowFilter())
        assert database.count() == 60
    assert file_digests(store_root) == before


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: RowFilter(created_after=datetime(2026, 1, 1)), id="naive-datetime"),
        pytest.param(lambda: RowFilter(orientation="sideways"), id="bad-orientation"),  # type: ignore[arg-type]
        # a lone surrogate (a command line's bytes that are not UTF-8): no stored text holds one
        pytest.param(lambda: RowFilter(instruction_id="caf\udce9"), id="surrogate-in-a-text-filter"),
        pytest.param(lambda: RowFilter(pair=("a", "\ud800")), id="surrogate-in-a-pair"),
        pytest.param(lambda: RowFilter(finish_reasons=("stop", "\udfff")), id="surrogate-in-finish-reasons"),
        pytest.param(lambda: RowFilter(input_hashes=("\udce9",)), id="surrogate-in-input-hashes"),
        # what matches no stored key, ever: a prefix (as tables print), capitals, not hex (was: nothing matched)
        pytest.param(lambda: RowFilter(input_hashes=("009cea4153d8e2fa",)), id="input-hash-prefix"),
        pytest.param(lambda: RowFilter(input_hashes=("A" * 64,)), id="input-hash-in-capitals"),
        pytest.param(lambda: RowFilter(input_hashes=("g" * 64,)), id="input-hash-not-hex"),
    ],
)
def test_bad_filters_are_refused(make: Any) -> None:
    with pytest.raises(InvalidInputError):
        make()


def test_records_cross_the_boundary_not_orm_objects(completions: Database) -> None:
    completions.put_many([completion_record(1)])
    (record,) = completions.get_many([completion_record(1).input_hash]).values()
    assert dataclasses.is_dataclass(record) and type(record) is CompletionRecord
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.completion = "x"  # type: ignore[misc]


def test_chat_inputs_round_trip(judgements: Database) -> None:
    rendered = render_messages([{"role": "user", "content": "Which is better?\n\n[A] ...\n[B] ..."}])
    record = judgement_record(1, input_text=rendered, input_hash=input_hash(rendered))
    judgements.put_many([record])
    assert judgements.get_many([record.input_hash]) == {record.input_hash: record}


# ---------------------------------------------------------------- SQLite's fast paths against SQLAlchemy's own


def odd_completions() -> list[CompletionRecord]:
    """Rows that exercise every column processor: NaN and infinities, None fields, times in other zones."""
    paris = timezone(timedelta(hours=2))
    return [
        completion_record(1, usage={"prompt_tokens": 1, "engine_seconds": math.inf}, top_logprobs=None),
        completion_record(2, top_logprobs={"content": [{"token": "A", "logprob": -math.inf}], "x": math.nan}),
        completion_record(
            3,
            usage=None,
            top_logprobs=None,
            benchmark=None,
            instruction_id=None,
            model=None,
            finish_reason=None,
            run_id=None,
            created_by=None,
        ),
        completion_record(4, created_at=datetime(2026, 6, 1, 14, 30, 15, tzinfo=paris)),  # no microseconds
        completion_record(5, created_at=datetime(1, 1, 1, 2, 0, 0, 1, tzinfo=paris), adopted_from="ab" * 32),
        completion_record(6, usage={"nested": {"list": [1, 2.5, None, "¿"]}}, completion=""),
    ]


def odd_judgements() -> list[JudgementRecord]:
    return [
        judgement_record(1, pointwise=True),  # model_b and orientation NULL
        judgement_record(2, orientation="reversed", top_logprobs={"A": math.nan, "B": -math.inf}),
        judgement_record(3, model_a=None, judge=None, top_logprobs=None, usage={"completion_tokens": 0}),
    ]


def same_records(a: Any, b: Any) -> bool:
    """Equal field by field, a NaN equal to a NaN (JSON values compared as the canonical text that is stored)."""
    if type(a) is not type(b):
        return False
    for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True):
        if isinstance(x, dict) or isinstance(y, dict):
            if x is None or y is None or store.jsonvalues.dumps(x) != store.jsonvalues.dumps(y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("role", ["completions", "judgements"])
def test_get_many_reads_what_sqlalchemy_reads(role: str, store: Store, descriptor: ModelDescriptor) -> None:
    """get_many reads on the driver's connection: its records equal what SQLAlchemy's processors and the ORM give."""
    database = store.database(role, "t", descriptor)
    rows: list[Any] = odd_completions() if role == "completions" else odd_judgements()
    database.put_many(rows)
    fast = database.get_many(r.input_hash for r in rows)
    with database.reading() as repo:
        through_sqlalchemy = {r.input_hash: r for r in repo.query()}  # Core select, SQLAlchemy's result processing
    model = MODEL_OF_ROLE[role]
    with Session(database.engine) as session:
        orm = {o.input_hash: o for o in session.scalars(select(model))}
    assert fast.keys() == through_sqlalchemy.keys() == orm.keys() == {r.input_hash for r in rows}
    for row in rows:
        got = fast[row.input_hash]
        assert same_records(got, row) and same_records(got, through_sqlalchemy[row.input_hash])
        assert same_records(
            got, type(got)(**{name: getattr(orm[row.input_hash], name) for name in record_fields(type(got))})
        )
        assert got.created_at.tzinfo is UTC and got.created_at == row.created_at
    if role == "completions":
        nan = fast[rows[1].input_hash].top_logprobs
        assert nan is not None and math.isnan(nan["x"]) and nan["content"][0]["logprob"] == -math.inf


@pytest.mark.parametrize("role", ["completions", "judgements"])
def test_put_many_writes_the_bytes_sqlalchemy_writes(role: str, store: Store, descriptor: ModelDescriptor) -> None:
    """put_many binds through the columns' own processors: the stored values (and their types) are SQLAlchemy's."""
    rows: list[Any] = odd_completions() if role == "completions" else odd_judgements()
    ours = store.database(role, "ours", descriptor)
    ours.put_many(rows)
    theirs = store.database(role, "theirs", descriptor)
    table = MODEL_OF_ROLE[role].__table__
    with theirs.engine.begin() as conn:
        conn.execute(insert(table), [dataclasses.asdict(r) for r in rows])

    def stored(database: Database) -> list[tuple[Any, ...]]:
        names = [c.name for c in table.columns]
        columns = ", ".join(f"{n}, typeof({n})" for n in names)
        with database.reading() as repo:
            return [tuple(r) for r in repo.conn.exec_driver_sql(f"SELECT {columns} FROM {role} ORDER BY input_hash")]

    assert stored(ours) == stored(theirs)


def test_created_at_is_bound_and_read_as_the_column_type_does() -> None:
    """The fast created_at conversions give what UTCDateTime's own processors give, for every shape of value."""
    dialect = sqlite_dialect()
    column_type = UTCDateTime()
    bind_own = column_type.dialect_impl(dialect).bind_processor(dialect)
    read_own = column_type.dialect_impl(dialect).result_processor(dialect, None)
    assert bind_own is not None and read_own is not None
    bind, read = store.backends.sqlite.rows._utc_to_text(bind_own), store.backends.sqlite.rows._utc_from_text(read_own)
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-11)), UTC]
    moments = [datetime(2026, 3, 29, 1, 59, 59, 999999), datetime(1, 1, 2), datetime(9999, 12, 30, 23, 0, 0, 1)]
    for zone, moment in itertools.product(zones, moments):
        value = moment.replace(tzinfo=zone)
        assert bind(value) == bind_own(value) and bind(value) == bind(value)  # the second: the kept text
    for naive in (datetime(2026, 1, 1), None):
        if naive is None:
            assert bind(naive) is None and bind_own(naive) is None
        else:
            with pytest.raises(ValueError, match="timezone-aware"):
                bind(naive)
    texts = ["2026-01-01 12:00:00.000001", "2026-01-01 12:00:00", "2026-01-01", "2026-01-01T12:00:00.5",
             "2026-01-01 12:00:00+02:00", "0001-01-01 00:00:00.000000"]  # fmt: skip
    for text in texts:
        assert read(text) == read_own(text) and read(text).tzinfo is UTC


def test_a_failed_write_leaves_the_database_usable(completions: Database) -> None:
    with pytest.raises(InvalidInputError, match="hash"):
        completions.put_many([completion_record(1), completion_record(2, input_hash="0" * 64)])
    assert completions.count() == 0
    assert completions.put_many([completion_record(1), completion_record(2)]) == 2
    assert set(completions.get_many([completion_record(1).input_hash, completion_record(2).input_hash])) == {
        completion_record(1).input_hash,
        completion_record(2).input_hash,
    }


def test_threads_read_and_write_one_database_at_once(completions: Database) -> None:
    """The connection a database keeps serves one call at a time; a thread that finds it busy gets its own."""

    def work(t: int) -> int:
        mine = [completion_record(1000 * t + i) for i in range(40)]
        for start in range(0, 40, 10):
            assert completions.put_many(mine[start : start + 10]) == 10
            assert set(completions.get_many(r.input_hash for r in mine[: start + 10])) == {
                r.input_hash for r in mine[: start + 10]
            }
        return len(mine)

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert sum(pool.map(work, range(4))) == 160
    assert completions.count() == 160


def test_a_read_that_fails_on_damaged_text_holds_no_snapshot(store_root: Path, descriptor: ModelDescriptor) -> None:
    """The statement a failed read leaves running is ended: writers, checkpoints and closing go on as usual."""
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(i) for i in range(3)])
    key = damage_text(db_path)
    with Store(root=store_root) as s:
        database = s.database("completions", "t", descriptor)
        with pytest.raises(DamagedTextError):
            database.get_many([key], deferred=False)
        lean = database.get_many([key])  # the damaged prompt is not read: it fails where it is read
        with pytest.raises(DamagedTextError):
            _ = lean[key].input_text
        assert database.put_many([completion_record(7)]) == 1
        with closing(sqlite3.connect(db_path)) as other:
            assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # 1: a reader held it
    assert not Path(f"{db_path}-wal").exists()  # the last connection closed and checkpointed it
