"""Adopted rows in the store: copied marked, recorded, counted apart, selectable, and removable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from store.adoption import adopt_rows, adoptions, plan_adoption
from store.backends.sqlite.verify import verify_database
from store.cli.app import build_app
from store.errors import InvalidInputError
from store.stats import store_stats
from store.store import Database, Store
from store.tables.filters import RowFilter
from store.tables.records import AdoptionRecord
from tests.factories import QWEN, completion_record, file_digests

OLD = QWEN.model_copy(update={"backend_version": "0.10.0"})
NEW = QWEN.model_copy(update={"backend_version": "0.11.0"})


def evidence(**overrides: Any) -> AdoptionRecord:
    values: dict[str, Any] = {
        "source_descriptor": OLD.sha256(),
        "source_task": "mt-bench",
        "source_rows": 0,
        "details": {"across": ["backend_version"], "changes": [["backend_version", "0.10.0", "0.11.0"]]},
        "sampled": 3,
        "exact": 3,
        "max_abs_logprob_delta": None,
        "top_tokens_changed": 0,
        "sample_seed": 7,
        "min_exact": 1.0,
        "max_logprob_delta": None,
    }
    return AdoptionRecord(**(values | overrides))


@pytest.fixture
def source(store: Store) -> Database:
    database = store.database("completions", "mt-bench", OLD)
    database.put_many([completion_record(i) for i in range(5)])
    return database


def test_rows_are_copied_marked_with_their_source_and_the_adoption_is_recorded(store: Store, source: Database) -> None:
    target = store.database("completions", "mt-bench", NEW)
    target.put_many([completion_record(0, model="generated-here")])
    left_out = completion_record(4).input_hash
    planned = plan_adoption(source, target, exclude=[left_out])
    record = adopt_rows(source, target, evidence(), exclude=[left_out])
    assert (planned.source_rows, planned.adopted, planned.present, planned.excluded) == (5, 3, 1, 1)
    assert (record.source_rows, record.rows_adopted, record.rows_present, record.rows_excluded) == (5, 3, 1, 1)
    assert record.id is not None and record.run_id == "test-run" and record.created_by == "tester"
    rows = {r.input_hash: r for r in target.query()}
    assert left_out not in rows and rows[completion_record(0).input_hash].model == "generated-here"  # kept
    adopted = [r for r in rows.values() if r.adopted_from is not None]
    assert {r.adopted_from for r in adopted} == {OLD.sha256()} and len(adopted) == 3
    originals = {r.input_hash: r for r in source.query()}
    assert all(replace(r, adopted_from=None) == originals[r.input_hash] for r in adopted)  # nothing else changed
    (stored,) = adoptions(target)
    assert stored == record and stored.details["across"] == ["backend_version"]
    assert stored.adopted_at is not None and stored.adopted_at.tzinfo is not None


def test_adopting_the_same_source_again_copies_nothing_new(store: Store, source: Database) -> None:
    target = store.database("completions", "mt-bench", NEW)
    adopt_rows(source, target, evidence())
    assert plan_adoption(source, target).adopted == 0
    again = adopt_rows(source, target, evidence())
    assert (again.rows_adopted, again.rows_present) == (0, 5)
    assert [a.rows_adopted for a in adoptions(target)] == [0, 5]  # newest first


def test_planning_writes_nothing_and_counts_a_target_that_does_not_exist_yet(store: Store, source: Database) -> None:
    store.close()
    before = file_digests(store.root)
    with Store(store.settings, root=store.root, readonly=True) as readonly:
        old = readonly.find("completions", "mt-bench", OLD)
        assert old is not None
        counts = plan_adoption(old, None)
    assert (counts.source_rows, counts.adopted, counts.present) == (5, 5, 0)
    assert file_digests(store.root) == before


def test_rows_are_never_adopted_into_their_own_database_or_the_other_role(store: Store, source: Database) -> None:
    with pytest.raises(InvalidInputError, match="another descriptor of the same role"):
        adopt_rows(source, source, evidence())
    judgements = store.database("judgements", "mt-bench", NEW)
    with pytest.raises(InvalidInputError):
        plan_adoption(source, judgements)


def test_filters_select_adopted_rows_by_source_prefix_and_stats_and_verify_count_them(
    store: Store, source: Database
) -> None:
    target = store.database("completions", "mt-bench", NEW)
    target.put_many([completion_record(9)])
    adopt_rows(source, target, evidence())
    assert target.count(RowFilter(adopted_from=OLD.hash16())) == 5
    assert target.count(RowFilter(adopted_from=OLD.sha256())) == 5
    other = next(c for c in "0123456789abcdef" if not OLD.sha256().startswith(c))
    assert target.count(RowFilter(adopted_from=other)) == 0
    assert (target.count(RowFilter(adopted=True)), target.count(RowFilter(adopted=False))) == (5, 1)
    with pytest.raises(InvalidInputError, match="adopted_from"):
        RowFilter(adopted_from="ABC")
    by_descriptor = {s.location.descriptor_hash16: s.adopted_rows for s in store_stats(store)}
    assert by_descriptor == {OLD.hash16(): 0, NEW.hash16(): 5}
    verified = verify_database(store.root, target.location, store.settings)
    assert verified.ok and (verified.rows_checked, verified.rows_adopted) == (6, 5)


def run(root: Path, *args: str) -> Any:
    result = CliRunner().invoke(build_app(), [*args, "--store-root", str(root)], env={"COLUMNS": "200"})
    return result


def test_the_commands_show_and_take_back_adopted_rows(store: Store, source: Database) -> None:
    target = store.database("completions", "mt-bench", NEW)
    target.put_many([completion_record(9)])
    adopt_rows(source, target, evidence())
    store.close()
    root = store.root
    queried = [orjson.loads(line) for line in run(root, "query", "--adopted", "--format", "jsonl").stdout.splitlines()]
    assert len(queried) == 5 and {row["adopted_from"] for row in queried} == {OLD.sha256()}
    verify = orjson.loads(run(root, "verify", "--json").stdout)
    assert verify["ok"] and verify["rows_adopted"] == 5
    assert "(5 adopted from older descriptors)" in run(root, "verify").stdout
    stats_text = run(root, "stats").stdout
    assert "adopted: 5 of the rows" in stats_text
    assert f"5 rows into {NEW.model} ({NEW.hash16()}) from {OLD.hash16()} (task mt-bench) across backend_version; " \
        "audit 3/3 exact" in stats_text  # fmt: skip
    (recorded,) = [d for d in orjson.loads(run(root, "stats", "--json").stdout)["databases"] if d["adoptions"]]
    (adoption,) = recorded["adoptions"]
    assert (recorded["descriptor"], adoption["source_descriptor"]) == (NEW.hash16(), OLD.sha256())
    assert (adoption["rows_adopted"], adoption["exact"], adoption["sampled"]) == (5, 3, 3)
    dry = orjson.loads(run(root, "delete", "--adopted-from", OLD.hash16(), "--dry-run", "--json").stdout)
    assert dry["matched"] == 5 and dry["deleted"] == 0
    done = orjson.loads(run(root, "delete", "--adopted-from", OLD.hash16(), "--yes", "--json").stdout)
    assert done["deleted"] == 5
    with Store(root=root, readonly=True) as readonly:
        left = readonly.find("completions", "mt-bench", NEW)
        assert left is not None and [r.input_hash for r in left.query()] == [completion_record(9).input_hash]
        assert len(adoptions(left)) == 1  # the history stays
        old = readonly.find("completions", "mt-bench", OLD)
        assert old is not None and old.count() == 5  # the source is never touched


def test_adoption_works_on_a_server_store_and_refuses_the_same_schema(pg_url: str) -> None:
    """A server's databases have no file path: the pair is told apart by location (None == None is no refusal)."""
    with Store(url=pg_url) as server:
        old = server.database("completions", "mt-bench", OLD)
        old.put_many([completion_record(i) for i in range(3)])
        new = server.database("completions", "mt-bench", NEW)
        record = adopt_rows(old, new, evidence())
        assert record.rows_adopted == 3 and adoptions(new)[0].source_descriptor == OLD.sha256()
        assert {r.adopted_from for r in new.query()} == {OLD.sha256()}
        with pytest.raises(InvalidInputError, match="adopted into another descriptor"):
            adopt_rows(old, old, evidence())
