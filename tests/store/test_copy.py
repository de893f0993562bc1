"""Copying a store between a folder and a PostgreSQL server: every row and column, verified, idempotent, resumable."""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from store import logprobs
from store.adoption import adopt_rows, adoptions
from store.backends.postgres.registry import schema_name
from store.backends.postgres.text import ESCAPE
from store.backends.sqlite.database import SqliteDatabase
from store.cli.app import build_app
from store.copy import copy_store, row_digest
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, ServerAuthError, ServerUnavailableError, StoreMissingError
from store.layout import Location, Selector
from store.logprobs import PositionLogprobs, TokenLogprob
from store.runs import recent_runs, record_run
from store.settings import Settings
from store.store import Store
from store.tables.records import AdoptionRecord, RunRecord
from tests.factories import (
    JUDGE,
    QWEN,
    completion_record,
    file_digests,
    fill_small_store,
    hide_a_row_from_an_index,
    hide_a_row_in_a_page,
    judgement_record,
)
from tests.faults import remount, small_filesystem
from tests.interrupts import ctrl_c_on_call
from tests.pg_server import Cluster
from tests.store.test_runs import run

REPO = Path(__file__).resolve().parents[2]
OLD_QWEN = QWEN.model_copy(update={"backend_version": "0.10.0"})


def full_store(root: Path) -> Path:
    """The small store, plus rows with NaN and -inf, adopted rows with their adoption record, and runs."""
    fill_small_store(root)
    with Store(Settings(), root=root) as store:
        odd = store.database("completions", "mt-bench", QWEN)
        odd.put_many([completion_record(40, usage={"x": math.nan, "y": -math.inf}, top_logprobs={"A": -math.inf})])
        record_run(odd, run(1))
        record_run(odd, run(2))
        old = store.database("completions", "mt-bench", OLD_QWEN)
        old.put_many([completion_record(i, model="qwen-old") for i in range(50, 54)])
        evidence = AdoptionRecord(source_descriptor=OLD_QWEN.sha256(), source_task="mt-bench", source_rows=0,
                                  details={"across": ["backend_version"], "nan": "no\0", "\0": "x"}, sampled=2, exact=2,
                                  max_abs_logprob_delta=None, top_tokens_changed=0, sample_seed=7, min_exact=1.0,
                                  max_logprob_delta=0.5)  # fmt: skip
        adopt_rows(old, odd, evidence)
    return root


def snapshot(store: Store) -> dict[Location, Any]:
    """Everything a copy must carry, per database: each row's digest, runs and adoptions without their ids."""
    found: dict[Location, Any] = {}
    for location in store.locations():
        database = store.open(location)
        rows = {r.input_hash: row_digest(r) for r in database.query()}
        runs = sorted((replace(r, id=None) for r in recent_runs(database, 1000)), key=lambda r: r.started_at)
        adopted = [replace(a, id=None) for a in adoptions(database)]
        found[location] = (rows, runs, adopted, database.metadata())
    return found


def test_a_folder_goes_to_a_server_and_back_with_every_row_and_its_bookkeeping(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        original = snapshot(source)
        report = copy_store(source, server, chunk_size=2)
        assert report.ok, report.as_dict()
        assert report.rows_written == sum(len(rows) for rows, *_ in original.values()) == 19
        assert snapshot(server) == original
        qwen = next(d for d in report.databases if d.location == Location.of("completions", "mt-bench", QWEN))
        assert qwen.bookkeeping == {"runs": 2, "adoptions": 1} and qwen.source_digest == qwen.target_digest
        adopted = [r for r in server.open(qwen.location).query() if r.adopted_from is not None]
        assert len(adopted) == 4 and {r.adopted_from for r in adopted} == {OLD_QWEN.sha256()}
        nan_row = server.open(qwen.location).get_many([completion_record(40).input_hash])
        assert math.isnan(next(iter(nan_row.values())).usage["x"])  # type: ignore[index]

    with Store(url=pg_url, readonly=True) as server, Store(root=tmp_path / "back") as back:
        report = copy_store(server, back)
        assert report.ok and snapshot(back) == original
    assert not [p for p in (tmp_path / "back").rglob("*") if p.name.endswith(".lock") and p.stat().st_size]


TINY = ModelDescriptor(provider="vllm", model="tiny-b", sampling={"temperature": 0.0})
SPECIAL = (
    "\0 NUL, \U0001f600 4-byte, \u05e9\u05dc\u05d5\u05dd right-to-left, \u202econtrols\u202c, " + ESCAPE + "0 escape"
)


def text_store(root: Path) -> Path:
    """The full store, and a database like the demo's (completions holding U+0000) with every kind of text."""
    full_store(root)
    with Store(Settings(), root=root) as store:
        demo = store.database("completions", "demo\0task", TINY)
        demo.put_many(
            [
                completion_record(100, completion="\0"),  # what the tiny model answered in the demo
                completion_record(101, completion=f"before\0after {SPECIAL}", benchmark=f"b\0{ESCAPE}",
                                  model="tiny\0b", run_id="r\0", created_by=SPECIAL, finish_reason="stop\0"),
                completion_record(102, usage={"k\0": "v\0", SPECIAL: [SPECIAL, -math.inf]},
                                  top_logprobs=logprobs.encode([PositionLogprobs(
                                      (TokenLogprob("\0", -0.1, 0, 1), TokenLogprob(SPECIAL, -math.inf, 7, 2)),
                                      TokenLogprob("\0", -0.1, 0, 1))])),
                completion_record(103, completion=SPECIAL * 50_000),  # 4.6 MB
            ]
        )  # fmt: skip
        record_run(demo, replace(run(3), run_id="run\0x", created_by=SPECIAL))
    return root


@pytest.mark.postgres
def test_rows_holding_nul_and_every_kind_of_text_go_to_a_server_and_back_identical(tmp_path: Path, pg_url: str) -> None:
    root = text_store(tmp_path / "folder")
    with Store(root=root, readonly=True) as source:
        original = snapshot(source)
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        there = copy_store(source, server, chunk_size=3)
        assert there.ok and there.rows_written == 23, there.as_dict()
        assert snapshot(server) == original
        assert all(server.verify(location).ok for location in server.locations())
    with Store(url=pg_url, readonly=True) as server, Store(root=tmp_path / "back") as back:
        again = copy_store(server, back)
        assert again.ok and snapshot(back) == original
        assert all(back.verify(location).ok for location in back.locations())
    digests = [{d.location: (d.source_digest, d.target_digest) for d in r.databases} for r in (there, again)]
    assert digests[0] == digests[1] and all(a == b for a, b in digests[0].values())
    with Store(root=root, readonly=True) as source:
        assert all(source.verify(location).ok for location in source.locations())


def old_row_the_server_refuses(root: Path, location: Location) -> str:
    """A judgement as an older judgestore let SQLite keep it: a benchmark too long for PostgreSQL's index."""
    row = judgement_record(50, benchmark="\U0001f600" * 2_000)
    with closing(sqlite3.connect(location.db_path(root))) as conn, conn:
        conn.execute(
            "INSERT INTO judgements (input_hash, sample_index, benchmark, created_at, input_text, completion) "
            "VALUES (?, 0, ?, '2099-01-01 00:00:00.000000', ?, ?)",  # the newest row: read last
            (row.input_hash, row.benchmark, row.input_text, row.completion),
        )
    return row.input_hash


@pytest.mark.postgres
def test_a_database_the_target_refuses_is_reported_as_the_targets_and_leaves_no_empty_schema(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    root = full_store(tmp_path / "folder")
    location = Location.of("judgements", "arena-hard", JUDGE)
    key = old_row_the_server_refuses(root, location)
    before = file_digests(root)
    for attempt in range(2):  # a rerun meets the same row, and the others are there already
        with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
            report = copy_store(source, server, chunk_size=100)
            (bad,) = [d for d in report.databases if not d.verified]
            problem = " ".join(bad.problems)
            assert bad.location == location and bad.written == 0 and bad.target is None
            assert problem.startswith(f"the target {server.where} schema {schema_name(location)} refused a source row")
            assert key in problem and "benchmark" in problem and f"judgestore delete --store-root {root} " in problem
            assert "--input-hash HASH`" in problem
            assert "removed" in problem and "recompute" not in problem and "SQLite" not in problem
            assert [d.verified for d in report.databases].count(True) == 3
            assert sum(d.written for d in report.databases) == (14 if attempt == 0 else 0)
            assert location not in server.locations()
    database = make_url(pg_url).database
    assert database is not None
    assert pg_cluster.sql(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{schema_name(location)}'", database) == [
        (0,)
    ]
    assert file_digests(root) == before  # the source was only read


@pytest.mark.postgres
def test_a_database_that_fails_half_way_keeps_what_it_copied_and_a_rerun_finds_it(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    location = Location.of("judgements", "arena-hard", JUDGE)
    old_row_the_server_refuses(root, location)
    for written, already_there in ((5, 0), (0, 5)):
        with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
            report = copy_store(source, server, chunk_size=1)
            (bad,) = [d for d in report.databases if not d.verified]
            assert (bad.written, bad.already_there, bad.target) == (written, already_there, server.open(location).where)
            assert "removed" not in " ".join(bad.problems) and server.open(location).count() == 5


def test_a_second_copy_writes_nothing_and_still_verifies(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        first = copy_store(source, server)
        again = copy_store(source, server)
    assert first.ok and again.ok
    assert again.rows_written == 0 and again.as_dict()["already_there"] == first.rows_written
    assert all(d.bookkeeping == {"runs": 0, "adoptions": 0} for d in again.databases)


def test_folder_to_folder_with_a_selection(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        report = copy_store(source, target, Selector(role="judgements"))
        assert report.ok and [d.location.role for d in report.databases] == ["judgements"]
        assert target.locations() == [Location.of("judgements", "arena-hard", JUDGE)]
        assert snapshot(target) == {k: v for k, v in snapshot(source).items() if k.role == "judgements"}


def _counts(report: Any) -> dict[Location, tuple[Any, ...]]:
    return {d.location: (d.source_rows, d.written, d.already_there, d.conflicts, d.bookkeeping, d.verified)
            for d in report.databases}  # fmt: skip


@pytest.mark.parametrize("to", ["folder", "server"])
def test_a_dry_run_counts_what_the_copy_then_writes_and_writes_nothing(
    tmp_path: Path, to: str, request: pytest.FixtureRequest
) -> None:
    root = full_store(tmp_path / "a")
    target = {"root": tmp_path / "b"} if to == "folder" else {"url": request.getfixturevalue("pg_url")}
    with Store(root=root, readonly=True) as source:
        with Store(readonly=True, **target) as empty:  # type: ignore[arg-type]
            preview = copy_store(source, empty, dry_run=True)
            assert empty.locations() == []
        assert not (tmp_path / "b").exists()
        with Store(**target) as writable:  # type: ignore[arg-type]
            report = copy_store(source, writable)
            assert preview.dry_run and not report.dry_run and preview.as_dict()["dry_run"]
            assert _counts(preview) == _counts(report) and preview.rows_written == 19 and preview.ok
            again = copy_store(source, writable, dry_run=True)
        assert again.ok and again.rows_written == 0 and again.as_dict()["already_there"] == 19
        assert all(d.bookkeeping == {"runs": 0, "adoptions": 0} for d in again.databases)


@pytest.mark.postgres
def test_a_dry_run_says_a_target_whose_grants_refuse_the_write_would_not_verify(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    """A user who may connect but not create schemas: the dry run said every database would verify, and the copy
    then failed on each (was)."""
    root = full_store(tmp_path / "folder")
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE visitor LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    database = make_url(pg_url).database
    assert database is not None
    visitor = pg_cluster.url(database, "visitor", "pw")
    with Store(root=root, readonly=True) as source, Store(url=visitor, readonly=True) as target:
        preview = copy_store(source, target, dry_run=True)
    with Store(root=root, readonly=True) as source, Store(url=visitor) as target:
        copied = copy_store(source, target)
    assert not any(d.verified for d in copied.databases)  # what the preview must foresee
    assert preview.databases and not any(d.verified for d in preview.databases)
    for said in (" ".join(d.problems) for d in preview.databases):
        assert said.startswith("the copy would fail at the target") and "lacks CREATE on the database" in said
    assert "js_" not in str(pg_cluster.sql("SELECT nspname FROM pg_namespace", database))  # nothing created


def test_a_dry_run_into_a_read_only_folder_says_it_would_not_verify(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    with small_filesystem(tmp_path / "disk") as disk:
        remount(disk, "ro")
        with Store(root=root, readonly=True) as source, Store(root=disk / "b", readonly=True) as target:
            preview = copy_store(source, target, dry_run=True)
    assert preview.databases and not any(d.verified for d in preview.databases)
    assert all("a read-only filesystem" in " ".join(d.problems) for d in preview.databases)


def test_a_dry_run_names_the_conflicts_and_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    with Store(root=tmp_path / "b") as target:
        target.database("judgements", "arena-hard", JUDGE).put_many([judgement_record(0, completion="[[B]]")])
    before = file_digests(tmp_path / "b")
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b", readonly=True) as target:
        preview = copy_store(source, target, dry_run=True)
    (bad,) = [d for d in preview.databases if not d.verified]
    assert (bad.location.role, bad.conflicts, bad.already_there) == ("judgements", 1, 0)
    assert bad.conflicting_keys == [judgement_record(0).input_hash] and "differs in completion" in bad.problems[0]
    assert file_digests(tmp_path / "b") == before


def test_a_source_that_is_behind_is_told_to_be_upgraded_itself_and_is_left_as_it_was(tmp_path: Path) -> None:
    """Its refusal advised JUDGESTORE_AUTO_UPGRADE=1, "with which a command that writes upgrades it first": copy
    writes, but only to its target, and the same copy failed the same way (was)."""
    root = full_store(tmp_path / "a")
    location = Location.of("completions", "mt-bench", QWEN)
    with closing(sqlite3.connect(location.db_path(root))) as db, db:
        db.execute("DROP TABLE claims")  # as revision 0005 left it
        db.execute("UPDATE judgestore_alembic_version SET version_num = '0005'")
    before = file_digests(root)
    with Store(Settings(auto_upgrade=True), root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        report = copy_store(source, target)
    (behind,) = [d for d in report.databases if not d.verified]
    (said,) = behind.problems
    assert behind.location == location and "schema revision 0005" in said and "AUTO_UPGRADE" not in said
    assert (
        "copy only reads it: upgrade it first (`judgestore db upgrade --store-root` or `--store-url` naming it)" in said
    )
    assert file_digests(root) == before


@pytest.mark.parametrize("damage", ["page", "index"])
def test_a_damaged_source_is_reported_and_nothing_of_it_is_copied(tmp_path: Path, damage: str) -> None:
    """A damaged index or page hides rows from what a copy streams: it must not say "verified" without them."""
    root = full_store(tmp_path / "a")
    location = Location.of("completions", "mt-bench", QWEN)
    if damage == "page":
        hide_a_row_in_a_page(location.db_path(root), "completions")
    else:
        hide_a_row_from_an_index(location.db_path(root), "completions", "ix_completions_created_at")
    before = file_digests(root)
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        report = copy_store(source, target)
        (bad,) = [d for d in report.databases if not d.verified]
        assert not report.ok and bad.location == location and bad.written == 0
        assert "cannot be read" in bad.problems[0] and "judgestore verify" in bad.problems[0]
        assert ("SQLite found damage" if damage == "page" else "ix_completions_created_at holds") in bad.problems[0]
        assert sum(d.verified for d in report.databases) == len(report.databases) - 1  # the others are copied
        listed = report.as_dict()  # --json's: it counted the damaged database as copied (was)
        assert (listed["databases_copied"], listed["databases_failed"]) == (len(report.databases) - 1, 1)
    assert file_digests(root) == before


def test_a_row_the_target_does_not_give_back_is_a_problem_and_the_copy_does_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a copy wrote is read back from the target: a row it cannot find there (another writer deleted it
    between the write and the read) fails the verification, named and counted."""
    root = full_store(tmp_path / "a")
    real = SqliteDatabase.get_many
    calls: list[int] = []

    def losing_one_on_read_back(self: SqliteDatabase, hashes: Any, *, deferred: bool = True) -> Any:
        found = real(self, hashes, deferred=deferred)
        calls.append(len(found))
        if len(calls) == 2 and found:  # the first database's read back, after its write
            found.pop(next(iter(found)))
        return found

    monkeypatch.setattr(SqliteDatabase, "get_many", losing_one_on_read_back)
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        report = copy_store(source, target, chunk_size=10_000)
    (bad,) = [d for d in report.databases if not d.verified]
    assert bad.missing == 1 and "1 rows written to the target could not be read back from it" in bad.problems
    assert not report.ok and sum(d.verified for d in report.databases) == len(report.databases) - 1


def test_a_conflicting_row_in_the_target_is_reported_and_kept(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    theirs = completion_record(1, model="qwen", completion="another answer")
    with Store(url=pg_url) as server:
        server.database("completions", "mt-bench", QWEN).put_many([theirs])
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        report = copy_store(source, server)
        (bad,) = [d for d in report.databases if not d.verified]
        assert not report.ok and bad.conflicts == 1 and bad.conflicting_keys == [theirs.input_hash]
        assert "differs in completion" in bad.problems[0]
        assert bad.matched == bad.source_rows - 1 and bad.source_digest != bad.target_digest
        kept = server.open(bad.location).get_many([theirs.input_hash])
        assert kept == {theirs.input_hash: theirs}
        assert all(d.verified for d in report.databases if d is not bad)  # the other databases went on


def test_a_source_row_not_stored_under_its_hash_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    location = Location.of("judgements", "arena-hard", JUDGE)
    with sqlite3.connect(location.db_path(root)) as conn:
        conn.execute("UPDATE judgements SET input_text = 'edited' WHERE instruction_id = '7'")
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        report = copy_store(source, target, chunk_size=100)
    (bad,) = [d for d in report.databases if not d.verified]
    assert bad.location == location and "judgestore verify" in bad.problems[0]
    assert len([d for d in report.databases if d.verified]) == 3


def test_a_target_database_at_a_newer_revision_is_reported_untouched_and_the_others_go_on(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    root = full_store(tmp_path / "folder")
    location = Location.of("judgements", "arena-hard", JUDGE)
    with Store(url=pg_url) as server:
        server.database("judgements", "arena-hard", JUDGE)
    name, database = schema_name(location), make_url(pg_url).database
    pg_cluster.sql(f"UPDATE \"{name}\".judgestore_alembic_version SET version_num = 'f00d'", database)
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        report = copy_store(source, server)
    (bad,) = [d for d in report.databases if not d.verified]
    assert bad.location == location and "f00d" in bad.problems[0] and bad.target is None
    assert sum(d.written for d in report.databases) == 14
    assert pg_cluster.sql(f'SELECT count(*) FROM "{name}".judgements', database) == [(0,)]


def test_the_same_store_on_both_sides_is_refused(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "a")
    before = file_digests(root)
    with (
        Store(root=root, readonly=True) as source,
        Store(root=tmp_path / "." / "a") as target,
        pytest.raises(InvalidInputError, match="same store"),
    ):
        copy_store(source, target)
    assert file_digests(root) == before
    other_spelling = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    tuned = f"{pg_url}&application_name=job-17&connect_timeout=3"  # a job's own URL: still the same database
    for spelling in (other_spelling, tuned):
        with (
            Store(url=pg_url, readonly=True) as source,
            Store(url=spelling) as target,
            pytest.raises(InvalidInputError, match="same store"),
        ):
            copy_store(source, target)
    with Store(url=pg_url, readonly=True) as source, Store(url=f"{pg_url}&port=1") as elsewhere:
        assert not source.storage.overlaps(elsewhere.storage)  # another port is another server


@pytest.mark.parametrize("nesting", ["target inside the source", "source inside the target"])
def test_folders_one_inside_the_other_are_refused_and_nothing_is_written(tmp_path: Path, nesting: str) -> None:
    # A target under the source's root would leave the copy's folders in the source as strays (and the other way).
    outer = tmp_path / "outer"
    root = full_store(outer / "inner") if nesting == "source inside the target" else full_store(outer)
    # (a role folder of the source, outer/completions, is no store at all: Store refuses it, naming the store)
    target_root = outer if nesting == "source inside the target" else outer / "copies"
    before = file_digests(outer)
    with (
        Store(root=root, readonly=True) as source,
        Store(root=target_root) as target,
        pytest.raises(InvalidInputError, match="one folder lies inside the other"),
    ):
        copy_store(source, target)
    assert file_digests(outer) == before


def test_a_missing_source_is_a_typed_error_and_creates_nothing(tmp_path: Path, pg_url: str) -> None:
    with (
        Store(root=tmp_path / "nowhere", readonly=True) as source,
        Store(root=tmp_path / "target") as target,
        pytest.raises(StoreMissingError, match="the folder does not exist"),
    ):
        copy_store(source, target)
    assert not (tmp_path / "target").exists()
    with (
        Store(url=pg_url, readonly=True) as source,  # an empty database: no registry, no store
        Store(root=tmp_path / "target") as target,
        pytest.raises(StoreMissingError, match="no registry"),
    ):
        copy_store(source, target)
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_server_that_cannot_be_used_is_a_typed_error_and_nothing_changes(
    side: str, tmp_path: Path, pg_cluster: Cluster
) -> None:
    root = full_store(tmp_path / "folder")
    before = file_digests(root)
    down = f"postgresql+psycopg://postgres@/x?host={tmp_path}"  # no server listens there
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE judge LOGIN PASSWORD 'right'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    wrong_password = pg_cluster.url("postgres", "judge", "wrong")
    for url, error in ((down, ServerUnavailableError), (wrong_password, ServerAuthError)):
        if side == "target":
            stores = (Store(root=root, readonly=True), Store(url=url))
        else:
            stores = (Store(url=url, readonly=True), Store(root=tmp_path / "target"))
        with stores[0] as source, stores[1] as target, pytest.raises(error):
            copy_store(source, target)
    assert file_digests(root) == before and not (tmp_path / "target").exists()


# ---------------------------------------------------------------- the command


def invoke(*args: str) -> Any:
    return CliRunner().invoke(build_app(), ["copy", *args])


def test_judgestore_copy_reports_json_and_exits_0_when_everything_verified(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    result = invoke("--from-root", str(root), "--to-url", pg_url, "--json")
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert report["ok"] and report["rows_written"] == 19 and report["databases_copied"] == 4
    assert "@" in report["target"] and "password" not in report["target"]
    again = invoke("--from-url", pg_url, "--to-root", str(tmp_path / "back"), "--role", "completions")
    assert again.exit_code == 0, again.output
    assert "3 databases, 14 rows written" in again.stdout


def test_judgestore_copy_exits_1_when_a_row_conflicts(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    with Store(root=tmp_path / "b") as target:
        target.database("judgements", "arena-hard", JUDGE).put_many([judgement_record(0, completion="[[B]]")])
    result = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"))
    assert result.exit_code == 1
    assert "differs in completion" in result.stderr and "did not verify" in result.stderr


def test_a_row_the_target_holds_from_another_run_with_the_same_answer_is_said_to_be_so(tmp_path: Path) -> None:
    """The same prompts generated in both stores: every row listed as "another row under this key", exit 1, and
    nothing said of what to do (was)."""
    root, target_root = full_store(tmp_path / "a"), tmp_path / "their store"  # a space: the command quotes it
    with Store(root=target_root) as target:
        other_run = judgement_record(0, run_id="their-run", created_at=datetime(2026, 3, 1, tzinfo=UTC))
        target.database("judgements", "arena-hard", JUDGE).put_many(
            [other_run, judgement_record(1, completion="[[B]]")]
        )
    result = invoke("--from-root", str(root), "--to-root", str(target_root))
    assert result.exit_code == 1  # still not this source's rows: not verified
    said = " ".join(result.stderr.split())
    assert "the same answer under this key, made by another run (differs only in run_id, created_at)" in said
    hash16 = Location.of("judgements", "arena-hard", JUDGE).descriptor_hash16
    command = re.search(r"`(judgestore delete [^`]*)`", said)
    assert command is not None, said
    assert shlex.split(command.group(1)) == [
        "judgestore", "delete", "--store-root", str(target_root), "--role", "judgements", "--task", "arena-hard",
        "--descriptor", hash16, "--input-hash", other_run.input_hash,
    ]  # fmt: skip
    assert "another row under this key (differs in completion)" in said  # a different answer is a conflict


def test_the_delete_copy_suggests_says_when_it_names_only_the_listed_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conflicts past the listed ones were left out of the suggested delete without a word: it took a round of
    delete and copy for each list (was)."""
    monkeypatch.setattr("store.copy.MAX_LISTED_KEYS", 1)
    root, target_root = full_store(tmp_path / "a"), tmp_path / "b"
    with Store(root=target_root) as target:
        target.database("judgements", "arena-hard", JUDGE).put_many(
            [judgement_record(i, run_id="their-run", created_at=datetime(2026, 3, 1, tzinfo=UTC)) for i in (0, 1)]
        )
    result = invoke("--from-root", str(root), "--to-root", str(target_root))
    said = " ".join(result.stderr.split())
    assert result.exit_code == 1 and said.count("--input-hash") == 1
    assert "(the 1 listed; 1 more conflicts are not listed: the next copy lists them)" in said


def test_judgestore_copy_dry_run_shows_what_it_would_write_and_exits_1_on_a_conflict(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    preview = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), "--dry-run", "--json")
    assert preview.exit_code == 0, preview.output
    report = orjson.loads(preview.stdout)
    assert (report["dry_run"], report["rows_written"], report["databases_copied"]) == (True, 0, 0)  # none done
    assert (report["rows_to_write"], report["databases_to_copy"], report["databases_failed"]) == (19, 4, 0)
    assert {(d["written"], d["verified"], d["would_verify"]) for d in report["databases"]} == {(0, False, True)}
    assert sum(d["to_write"] for d in report["databases"]) == 19
    assert not (tmp_path / "b").exists()
    with Store(root=tmp_path / "b") as target:
        target.database("judgements", "arena-hard", JUDGE).put_many([judgement_record(0, completion="[[B]]")])
    before = file_digests(tmp_path / "b")
    human = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), "--dry-run")
    assert human.exit_code == 1
    said = " ".join(human.stdout.split())
    assert "(dry run: nothing written)" in said and "4 databases, 18 rows to write" in said
    assert "differs in completion" in human.stderr and "1 of 4 databases would not verify" in human.stderr
    assert file_digests(tmp_path / "b") == before


def test_a_dry_run_refuses_the_row_the_copy_would_refuse_and_counts_what_it_read(tmp_path: Path) -> None:
    """A row whose input was edited by hand: the dry run said 'would verify' and exit 0, where the copy refuses
    it; and both said 'Read 0' of a database whose rows they had read (was)."""
    root = full_store(tmp_path / "a")
    location = Location.of("judgements", "arena-hard", JUDGE)
    with closing(sqlite3.connect(location.db_path(root))) as conn, conn:
        (key,) = conn.execute("SELECT input_hash FROM judgements ORDER BY input_hash LIMIT 1").fetchone()
        conn.execute("UPDATE judgements SET input_text = input_text || ' ' WHERE input_hash = ?", (key,))
    before = file_digests(root)
    reports = []
    for dry_run in (["--dry-run"], []):
        result = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), *dry_run, "--json")
        assert result.exit_code == 1, result.output
        report = orjson.loads(result.stdout)
        (bad,) = [d for d in report["databases"] if d["role"] == "judgements"]
        assert not bad.get("would_verify", bad["verified"]) and bad["source_rows"] == 5, bad
        refused = "would refuse a source row" if dry_run else "refused a source row"  # was: "were not written"
        assert refused in bad["problems"][0] and f"{key!r}" in bad["problems"][0]
        # the delete names the source store: pasted as it was, it acted on the default one (was)
        delete = f"judgestore delete --store-root {root} --role judgements --task arena-hard --descriptor "
        assert f"in the source (`{delete}" in bad["problems"][0], bad["problems"][0]
        said = [(d["role"], d["source_rows"], [p.partition(" written: ")[2].partition(". The source")[0]
                for p in d["problems"]]) for d in report["databases"]]  # fmt: skip
        reports.append(said)  # the target named as the database it would be, or is
    assert reports[0] == reports[1]  # the dry run says what the copy then did
    assert file_digests(root) == before


@pytest.mark.postgres
def test_judgestore_copy_names_the_failing_target_goes_on_and_exits_1(tmp_path: Path, pg_url: str) -> None:
    root = full_store(tmp_path / "folder")
    location = Location.of("judgements", "arena-hard", JUDGE)
    old_row_the_server_refuses(root, location)
    result = invoke("--from-root", str(root), "--to-url", pg_url)
    assert result.exit_code == 1
    assert f"the target {Store(url=pg_url).where} schema {schema_name(location)} refused a source row" in result.stderr
    assert "1 of 4 databases did not verify" in result.stderr and "3 databases" not in result.stderr
    assert "14 rows written" in result.stdout and "Traceback" not in result.output
    as_json = invoke("--from-root", str(root), "--to-url", pg_url, "--json")
    assert as_json.exit_code == 1
    report = orjson.loads(as_json.stdout)
    (bad,) = [d for d in report["databases"] if not d["verified"]]
    assert bad["role"] == "judgements" and bad["target"] is None and "refused a source row" in bad["problems"][0]
    listed = CliRunner().invoke(build_app(), ["ls", "--json", "--store-url", pg_url])
    assert {d["role"] for d in orjson.loads(listed.stdout)} == {"completions"}  # no empty judgements database


@pytest.mark.postgres
def test_a_row_the_target_changes_as_it_stores_it_is_not_called_the_targets_own(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    """A column narrowed by hand on the server: the copy's own rows came back changed, and were reported as rows
    the target held before and kept (a second writer to look for, and no word of verify) (was)."""
    root = tmp_path / "folder"
    location = Location.of("completions", "mt-bench", QWEN)
    with Store(root=root) as source:
        precise = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
        rows = [completion_record(i, created_at=precise) for i in range(2)]
        source.database("completions", "mt-bench", QWEN).put_many(rows)
    with Store(url=pg_url) as server:
        server.database("completions", "mt-bench", QWEN)
    database = make_url(pg_url).database
    assert database is not None
    narrowed = "ALTER COLUMN created_at TYPE timestamp(0)"  # a second's precision: microseconds dropped on write
    pg_cluster.sql(f'ALTER TABLE "{schema_name(location)}".completions {narrowed}', database)
    with Store(root=root, readonly=True) as source, Store(url=pg_url) as server:
        (copied,) = copy_store(source, server).databases
    assert (copied.written, copied.conflicts, copied.verified) == (2, 2, False)
    assert all("gives this row back changed (differs in created_at)" in p for p in copied.problems), copied.problems
    assert all("judgestore verify" in p and "holds another row" not in p for p in copied.problems)


@pytest.mark.postgres
def test_a_copy_the_server_refuses_to_write_keeps_stderr_json_with_json(
    tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    """A role that may read the schemas but not insert: each database's refusal is in the report, and stderr holds
    JSON objects only (a review saw psycopg's own "error ignored terminating <Pipeline ...>" log line there)."""
    root = full_store(tmp_path / "folder")
    assert invoke("--from-root", str(root), "--to-url", pg_url).exit_code == 0
    database = make_url(pg_url).database
    assert database is not None
    schemas = [name for (name,) in pg_cluster.sql("SELECT nspname FROM pg_namespace", database) if "js_" in name]
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE reader LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    for schema in [*schemas, "judgestore"]:
        pg_cluster.sql(f'GRANT USAGE ON SCHEMA "{schema}" TO reader', database)
        pg_cluster.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO reader', database)
    for schema in schemas:
        if schema.startswith("js_j"):
            pg_cluster.sql(f'DELETE FROM "{schema}".judgements', database)  # rows the copy must write
    reader = pg_cluster.url(database, "reader", "pw")
    argv = ["copy", "--from-root", str(root), "--to-url", reader, "--json"]
    code = "from inference.cli import main; main()"  # its own process: pytest's log handlers take no line there
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert not orjson.loads(result.stdout)["ok"]
    for line in result.stderr.splitlines():
        assert line.startswith("{") and isinstance(orjson.loads(line), dict), result.stderr


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_a_copy_says_how_many_rows_were_copied_and_a_rerun_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Ctrl-C lands while the second chunk written is read back: after it committed. (Was: exit 130, nothing said;
    and a count kept after the read-back would have missed that chunk.)"""
    root = full_store(tmp_path / "a")
    before = file_digests(root)
    reads = ctrl_c_on_call(monkeypatch, SqliteDatabase, "get_many", 4)  # chunk 1: before, after; chunk 2: before, ...
    args = ["--from-root", str(root), "--to-root", str(tmp_path / "b"), "--chunk-size", "2"]
    result = invoke(*args, *(["--json"] if json_output else []))
    assert result.exit_code == 130 and len(reads) == 4 and result.stdout == ""
    with Store(root=tmp_path / "b", readonly=True) as target:
        copied = sum(target.open(location).count() for location in target.locations())
    assert copied == 4  # two chunks of 2, both committed
    said = f"interrupted; {copied} rows had been copied into {tmp_path / 'b'} (1 database), committed and kept"
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert (error["rows_written"], error["databases"], error["target"]) == (copied, 1, str(tmp_path / "b"))
    else:
        assert said in " ".join(result.stderr.split()) and "run the same copy again" in result.stderr
    monkeypatch.undo()
    again = invoke(*args, "--json")
    assert again.exit_code == 0, again.output
    assert orjson.loads(again.stdout)["rows_written"] == 19 - copied  # the rows copied before were skipped
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b", readonly=True) as target:
        assert snapshot(target) == snapshot(source)
    assert file_digests(root) == before  # the source was only read


def test_ctrl_c_before_a_server_database_got_a_row_removes_the_empty_database_it_created(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failed copy does: an interrupt left it listed with 0 rows until a rerun (was)."""
    from store.backends.postgres.database import PostgresDatabase

    root = full_store(tmp_path / "a")
    writes = ctrl_c_on_call(monkeypatch, PostgresDatabase, "put_many", 1)  # the first database's first chunk
    result = invoke("--from-root", str(root), "--to-url", pg_url, "--chunk-size", "2")
    assert result.exit_code == 130 and len(writes) == 1
    assert "interrupted; 0 rows had been copied" in " ".join(result.stderr.split())
    listed = CliRunner().invoke(build_app(), ["ls", "--json", "--store-url", pg_url])
    assert orjson.loads(listed.stdout) == []  # nothing empty stays listed
    monkeypatch.undo()
    assert invoke("--from-root", str(root), "--to-url", pg_url).exit_code == 0


def test_ctrl_c_in_a_dry_run_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "4 rows had been copied ..., committed and kept" of a dry run, which writes nothing (was)."""
    root = full_store(tmp_path / "a")
    counts = ctrl_c_on_call(monkeypatch, SqliteDatabase, "count", 2)  # the second source database's count
    result = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), "--chunk-size", "2", "--dry-run")
    assert result.exit_code == 130 and len(counts) == 2
    assert "a dry run: nothing was written" in result.stderr and "copied" not in result.stderr
    assert not (tmp_path / "b").exists()


def test_ctrl_c_as_the_stores_close_after_the_copy_says_what_it_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal landed as the stores closed, every row copied: "interrupted before any row was copied; nothing
    was written", rows_written 0 (was)."""
    root = full_store(tmp_path / "a")
    real_close = Store.close

    def close_then_ctrl_c(self: Store) -> None:
        real_close(self)
        if not self.readonly:  # the target
            raise KeyboardInterrupt

    monkeypatch.setattr(Store, "close", close_then_ctrl_c)
    result = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), "--json")
    assert result.exit_code == 130, result.output
    error = orjson.loads(result.stderr)
    assert error["rows_written"] == 19 and "19 rows had been copied" in error["error"], error


def test_ctrl_c_during_a_chunks_commit_counts_the_chunk_if_it_stands(tmp_path: Path) -> None:
    """SIGINT while SQLite commits is raised once the commit returned: the chunk is in the target, and the count
    says so. (Was: 2 rows said, 4 there; a real run: '38,000 rows had been copied' with 40,000 in the target.)"""
    root = full_store(tmp_path / "a")
    with pytest.MonkeyPatch.context() as interrupting:
        ctrl_c_on_call(interrupting, SqliteDatabase, "put_many", 2, after=True)
        result = invoke("--from-root", str(root), "--to-root", str(tmp_path / "b"), "--chunk-size", "2", "--json")
    assert result.exit_code == 130
    with Store(root=tmp_path / "b", readonly=True) as target:
        copied = sum(target.open(location).count() for location in target.locations())
    assert copied == 4 and orjson.loads(result.stderr)["rows_written"] == copied


@pytest.mark.parametrize(
    "args",
    [
        ["--to-root", "b"],
        ["--from-root", "a", "--from-url", "postgresql+psycopg://u@h/d", "--to-root", "b"],
        ["--from-root", "a"],
        ["--from-root", "a", "--to-root", "b", "--to-url", "postgresql+psycopg://u@h/d"],
    ],
)
def test_judgestore_copy_needs_exactly_one_source_and_one_target(args: list[str], tmp_path: Path) -> None:
    result = invoke(*args, "--json")
    assert result.exit_code == 2  # a usage error, before any store is opened
    assert "Invalid value: give exactly one of --" in " ".join(result.stderr.split()), result.stderr


def test_judgestore_copy_with_a_wrong_url_is_a_typed_error(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    before = file_digests(root)
    result = invoke("--from-root", str(root), "--to-url", "mysql://user@host/db", "--json")
    assert result.exit_code == 2  # a value wrong wherever it runs: a usage error
    assert "'--to-url': store URL driver 'mysql' is not supported" in " ".join(result.stderr.split())
    swapped = invoke("--from-root", "postgresql+psycopg://u:secret@h/db", "--to-root", str(tmp_path / "b"))
    said = " ".join(swapped.stderr.split())
    assert swapped.exit_code == 2 and "a PostgreSQL store is given as --from-url" in said and "secret" not in said
    assert file_digests(root) == before


@pytest.mark.parametrize("option", ["--from-root", "--to-root"])
def test_judgestore_copy_names_its_own_option_for_a_file_given_as_a_store(tmp_path: Path, option: str) -> None:
    """The error said 'check --store-root', an option copy does not have (was)."""
    root = full_store(tmp_path / "a")
    (tmp_path / "file").write_text("kept")
    paths = {"--from-root": str(root), "--to-root": str(tmp_path / "b")} | {option: str(tmp_path / "file")}
    result = invoke(*(part for item in paths.items() for part in item))
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"there is no store here; check {option}" in said and "--store-root" not in said
    assert (tmp_path / "file").read_text() == "kept" and not (tmp_path / "b").exists()


def kill_midway(
    argv: list[str],
    env: dict[str, str],
    copied: Callable[[], int],
    rows: int,
    settled: Callable[[], None] = lambda: None,
) -> int:
    """Start the copy ``argv``, SIGKILL it once a tenth of ``rows`` arrived; the rows it left (checked mid-way,
    once ``settled`` returns: a server may still be committing what the killed copy sent)."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while copied() < rows // 10 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    _, stderr = child.communicate()
    settled()
    partial = copied()
    assert 0 < partial < rows, f"the copy was not killed mid-way (make it longer): {stderr.decode()}"
    return partial


def test_a_killed_copy_finishes_when_run_again(tmp_path: Path, pg_url: str, pg_cluster: Cluster) -> None:
    rows = 6_000
    root = tmp_path / "big"
    with Store(root=root) as store:
        store.database("completions", "mt-bench", QWEN).put_many([completion_record(i) for i in range(rows)])
    argv = [sys.executable, "-m", "store", "copy", "--from-root", str(root), "--to-url", pg_url, "--chunk-size", "25"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    table = f'"{schema_name(Location.of("completions", "mt-bench", QWEN))}".completions'
    database = make_url(pg_url).database

    def copied() -> int:
        try:
            return int(pg_cluster.sql(f"SELECT count(*) FROM {table}", database)[0][0])  # type: ignore[arg-type]
        except Exception:  # the schema does not exist yet
            return 0

    def settled() -> None:  # the killed copy's server session has ended: a commit it sent has landed or not
        others = (
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            f"AND datname = '{database}' AND pid <> pg_backend_pid()"
        )
        deadline = time.monotonic() + 30
        while pg_cluster.sql(others, database)[0][0]:
            assert time.monotonic() < deadline, "the killed copy's session never ended"
            time.sleep(0.05)

    partial = kill_midway(argv, env, copied, rows, settled)

    again = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    report = orjson.loads(again.stdout)
    (result,) = report["databases"]
    assert result["verified"] and result["source_rows"] == rows
    assert result["written"] == rows - partial and result["already_there"] == partial
    assert copied() == rows
    with Store(url=pg_url, readonly=True) as server:
        held = server.open(Location.of("completions", "mt-bench", QWEN))
        assert held.count() == rows
        expected = {r.input_hash: row_digest(r) for r in (completion_record(i) for i in range(rows))}
        assert {r.input_hash: row_digest(r) for r in held.query()} == expected


def test_a_killed_copy_from_a_server_finishes_when_run_again(tmp_path: Path, pg_url: str) -> None:
    rows = 6_000
    location = Location.of("completions", "mt-bench", QWEN)
    with Store(url=pg_url) as server:
        server.database("completions", "mt-bench", QWEN).put_many([completion_record(i) for i in range(rows)])
    root = tmp_path / "folder"
    argv = [sys.executable, "-m", "store", "copy", "--from-url", pg_url, "--to-root", str(root), "--chunk-size", "25"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def copied() -> int:
        try:
            with closing(sqlite3.connect(f"{location.db_path(root).as_uri()}?mode=ro", uri=True)) as conn:
                return int(conn.execute("SELECT count(*) FROM completions").fetchone()[0])
        except sqlite3.Error:  # not created yet, or its tables not yet
            return 0

    partial = kill_midway(argv, env, copied, rows)

    again = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    (result,) = orjson.loads(again.stdout)["databases"]
    assert result["verified"] and result["source_rows"] == rows
    assert result["written"] == rows - partial and result["already_there"] == partial
    with Store(root=root, readonly=True) as folder:
        expected = {r.input_hash: row_digest(r) for r in (completion_record(i) for i in range(rows))}
        assert {r.input_hash: row_digest(r) for r in folder.open(location).query()} == expected


def test_runs_the_target_holds_are_kept_and_copied_runs_get_new_ids(tmp_path: Path) -> None:
    root = full_store(tmp_path / "a")
    with Store(root=tmp_path / "b") as target:
        record_run(target.database("completions", "mt-bench", QWEN), run(9))
    with Store(root=root, readonly=True) as source, Store(root=tmp_path / "b") as target:
        assert copy_store(source, target).ok
        runs: list[RunRecord] = recent_runs(target.open(Location.of("completions", "mt-bench", QWEN)))
    assert [r.run_id for r in runs] == ["run-9", "run-2", "run-1"] and len({r.id for r in runs}) == 3
