"""A hit reads only what a hit returns: the lookup leaves input_text and the row's bookkeeping out, the record reads
them on access."""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy import event

from store.backend import Database
from store.descriptor import ModelDescriptor
from store.errors import RowGoneError
from store.export import write_text
from store.layout import Selector
from store.rows import row_columns
from store.settings import Settings
from store.store import Store
from store.tables.codegen import ROW_TABLES, deferred_columns
from store.tables.deferred import DEFERRED_COLUMNS
from store.tables.filters import RowFilter
from tests.factories import completion_record, judgement_record


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, store_root: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        with Store(Settings(), root=store_root) as s:
            yield s
    else:
        with Store(Settings(), url=request.getfixturevalue("pg_url")) as s:
            yield s


def test_the_models_and_the_records_agree_on_what_is_deferred() -> None:
    for model in ROW_TABLES.values():
        assert deferred_columns(model) == DEFERRED_COLUMNS


@pytest.mark.parametrize("role", ["completions", "judgements"])
def test_a_lookup_leaves_the_prompt_unread_until_it_is_asked_for(
    any_store: Store, descriptor: ModelDescriptor, role: str
) -> None:
    make = completion_record if role == "completions" else judgement_record
    rows = [make(i) for i in range(6)]
    database = any_store.database(role, "t", descriptor)
    database.put_many(rows)
    found = database.get_many([r.input_hash for r in rows] + ["0" * 64])
    assert set(found) == {r.input_hash for r in rows}
    assert all(record.is_deferred("input_text") for record in found.values())
    first = found[rows[0].input_hash]
    assert (first.completion, first.usage, first.finish_reason) == (
        rows[0].completion,
        rows[0].usage,
        rows[0].finish_reason,
    )
    assert first.input_text == rows[0].input_text  # read now, for the whole lookup in one statement
    assert not first.is_deferred("input_text")
    # The others are the same as the rows written: equal, the same class, asdict and pickle whole.
    for row in rows:
        record = found[row.input_hash]
        assert type(record) is type(row) and record == row
    second = database.get_many([rows[1].input_hash])[rows[1].input_hash]
    assert dataclasses.asdict(second) == dataclasses.asdict(rows[1])
    third = database.get_many([rows[2].input_hash])[rows[2].input_hash]
    assert pickle.loads(pickle.dumps(third)) == rows[2]
    whole = database.get_many([r.input_hash for r in rows], deferred=False)
    assert not any(record.is_deferred("input_text") for record in whole.values())
    assert whole == {r.input_hash: r for r in rows}


def test_the_deferred_prompts_are_read_in_one_statement(store: Store, descriptor: ModelDescriptor) -> None:
    database = store.database("completions", "t", descriptor)
    rows = [completion_record(i) for i in range(50)]
    database.put_many(rows)
    found = database.get_many(r.input_hash for r in rows)
    statements = _traced(database)
    assert [found[r.input_hash].input_text for r in rows] == [r.input_text for r in rows]
    assert len(statements) == 1 and "input_text" in statements[0]
    assert database.get_many([rows[0].input_hash])  # the lean statement itself names no input_text
    assert "input_text" not in statements[-1] and "completion" in statements[-1]


@pytest.mark.parametrize("role", ["completions", "judgements"])
def test_the_bookkeeping_is_deferred_with_the_prompt_and_read_with_it(
    store: Store, descriptor: ModelDescriptor, role: str
) -> None:
    make = completion_record if role == "completions" else judgement_record
    rows = [make(i, benchmark=f"b-{i}", run_id=f"run-{i}") for i in range(20)]
    database = store.database(role, "t", descriptor)
    database.put_many(rows)
    found = database.get_many(r.input_hash for r in rows)
    statements = _traced(database)
    assert database.get_many([rows[0].input_hash])  # the lean statement names none of the deferred columns
    lean = statements.pop()
    assert not any(f".{column}" in lean for column in DEFERRED_COLUMNS) and ".completion" in lean
    assert all(record.is_deferred(column) for record in found.values() for column in DEFERRED_COLUMNS)
    first, last = found[rows[0].input_hash], found[rows[-1].input_hash]
    assert (first.run_id, first.benchmark, first.created_at) == (rows[0].run_id, "b-0", rows[0].created_at)
    assert not any(first.is_deferred(column) for column in DEFERRED_COLUMNS)  # the whole record at once
    assert last.is_deferred("run_id") and last.input_text == rows[-1].input_text
    assert [found[r.input_hash] for r in rows] == rows
    assert len(statements) == 1  # every record of the lookup, in one statement


def _traced(database: Database) -> list[str]:
    """The SQL of every statement the SQLite database's driver connections run from now on."""
    seen: list[str] = []
    connect = database._connect_fn  # type: ignore[attr-defined]

    def traced() -> object:
        conn = connect()
        conn.set_trace_callback(lambda sql: seen.append(sql) if sql.lstrip().upper().startswith("SELECT") else None)
        return conn

    database._connect_fn = traced  # type: ignore[attr-defined]
    database.close()  # the kept connection was made untraced
    return seen


def test_the_postgres_lookup_selects_no_prompt(pg_url: str, descriptor: ModelDescriptor) -> None:
    with Store(Settings(), url=pg_url) as s:
        database = s.database("completions", "t", descriptor)
        rows = [completion_record(i) for i in range(3)]
        database.put_many(rows)
        seen: list[str] = []
        engine = database.storage.engine  # type: ignore[attr-defined]
        event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
        found = database.get_many(r.input_hash for r in rows)
        assert len(seen) == 1 and "input_text" not in seen[0] and "completion" in seen[0]
        assert found[rows[0].input_hash].input_text == rows[0].input_text
        assert len(seen) == 2 and "input_text" in seen[1]


def test_a_row_deleted_before_its_prompt_is_read_says_so(any_store: Store, descriptor: ModelDescriptor) -> None:
    database = any_store.database("completions", "t", descriptor)
    rows = [completion_record(i) for i in range(2)]
    database.put_many(rows)
    found = database.get_many(r.input_hash for r in rows)
    database.delete(RowFilter(input_hashes=(rows[0].input_hash,)))
    with pytest.raises(RowGoneError, match="deleted after it was looked up"):
        _ = found[rows[0].input_hash].input_text
    assert found[rows[1].input_hash].input_text == rows[1].input_text  # the row still there reads as ever


def test_export_verify_and_query_still_read_the_prompt(any_store: Store, descriptor: ModelDescriptor) -> None:
    database = any_store.database("completions", "t", descriptor)
    rows = [completion_record(i) for i in range(3)]
    database.put_many(rows)
    queried = list(database.query())
    assert not any(r.is_deferred("input_text") for r in queried) and sorted(queried, key=str) == sorted(rows, key=str)
    assert any_store.verify(database.location).ok
    out = io.StringIO()
    assert write_text(any_store.query_rows(Selector(), RowFilter()), out, "jsonl", row_columns(["completions"])) == 3
    assert {orjson.loads(line)["input_text"] for line in out.getvalue().splitlines()} == {r.input_text for r in rows}
