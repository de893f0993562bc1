"""Upgrades: keep every row and a byte-exact backup, restore on failure, refuse untouched, upgrade many."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

import store.backends.sqlite.upgrade
from store.backends.sqlite.rows import sqlite_insert
from store.backends.sqlite.upgrade import upgrade_database, upgrade_databases, upgrade_store
from store.backends.sqlite.verify import stray_paths
from store.descriptor import ModelDescriptor
from store.errors import SchemaBehindError, StoreNotWritableError, UpgradeFailedError
from store.layout import Selector, is_backup_of, lock_path, select, shm_path, wal_path
from store.reports import UpgradeOutcome, UpgradeResult
from store.schema import read_script_directory
from store.settings import Settings
from store.store import AutoUpgradeWarning, Store
from store.tables.filters import RowFilter
from store.tables.models import Judgement
from tests.factories import (
    JUDGE,
    LLAMA,
    QWEN,
    SHIPPED_HEAD,
    SYNTHETIC_HEAD,
    SYNTHETIC_REVISIONS,
    completion_record,
    current_database,
    file_digests,
    foreign_database,
    hide_a_row_in_a_page,
    stamp,
)
from tests.faults import immutable, judgestore, lock_held_elsewhere
from tests.store.conftest import location_of
from tests.store.schema_helpers import (
    UNKNOWN_REVISION,
    at_synthetic_head,
    judgement_columns,
    pretend_shipped_scripts_are,
    rows_of,
    sample_rows,
    version_of,
)

REVISIONS = SYNTHETIC_REVISIONS


def test_upgrade_keeps_every_row_and_a_byte_exact_backup(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    original, rows = db_path.read_bytes(), rows_of(db_path)
    result = upgrade_database(db_path, Settings(), script=synthetic)
    assert (result.outcome, result.from_revision, result.to_revision) == (
        UpgradeOutcome.UPGRADED,
        SHIPPED_HEAD,
        SYNTHETIC_HEAD,
    )
    assert result.rows == {"completions": 6, "judgements": 3, "runs": 0, "adoptions": 0, "claims": 0}
    assert result.backup is not None and result.backup.read_bytes() == original
    assert rows_of(db_path) == rows
    assert version_of(db_path) == SYNTHETIC_HEAD and "reviewer_note" in judgement_columns(db_path)


def test_upgrade_without_keeping_the_backup_leaves_none(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    result = upgrade_database(db_path, Settings(), script=synthetic, keep_backup=False)
    assert result.outcome is UpgradeOutcome.UPGRADED and result.backup is None
    assert not [p for p in db_path.parent.iterdir() if ".bak-" in p.name]


def test_a_damaged_file_is_refused_untouched_with_no_backup(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    """A migration copies what the b-trees lead to (and counts the same way): on a damaged page the rows the
    damage hides would be gone from the upgraded file, and its backup would be as damaged."""
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    hide_a_row_in_a_page(db_path, "completions")
    files = file_digests(db_path.parent)
    result = upgrade_database(db_path, Settings(), script=synthetic)
    assert (result.outcome, result.from_revision, result.to_revision) == (UpgradeOutcome.REFUSED, SHIPPED_HEAD, None)
    assert "SQLite found damage" in str(result.error) and "nothing was changed" in str(result.error)
    assert result.backup is None and file_digests(db_path.parent) == files  # not a byte, no backup beside it
    assert version_of(db_path) == SHIPPED_HEAD


def test_a_file_that_cannot_be_written_is_refused_before_its_backup(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    """The folder may be written, the file may not (immutable: even root may not): the upgrade copied the backup,
    met SQLite's "attempt to write a readonly database" in the migration, reported it raw (statement and all) and
    left the backup unmentioned. It is now refused first, typed, and nothing is added beside the file."""
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    files = file_digests(db_path.parent)
    with immutable(db_path):
        result = upgrade_database(db_path, Settings(), script=synthetic)
    assert (result.outcome, result.backup) == (UpgradeOutcome.REFUSED, None)
    assert result.error == str(StoreNotWritableError(db_path, "this user may not write it: permission denied"))
    assert file_digests(db_path.parent) == files and version_of(db_path) == SHIPPED_HEAD


def test_a_lock_another_process_holds_past_the_busy_timeout_refuses_the_upgrade_untouched(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    """Another upgrade or vacuum of the file holds its lock: the upgrade waited for it without a bound (was)."""
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, sample_rows("one"))
    files = file_digests(db_path.parent)
    with lock_held_elsewhere(lock_path(db_path)):
        result = upgrade_database(db_path, Settings(busy_timeout_ms=200), script=synthetic)
    assert (result.outcome, result.backup) == (UpgradeOutcome.REFUSED, None)
    assert "held its lock file" in str(result.error) and "(200 ms); nothing was changed" in str(result.error)
    assert file_digests(db_path.parent) == files and version_of(db_path) == SHIPPED_HEAD
    assert upgrade_database(db_path, Settings(), script=synthetic).outcome is UpgradeOutcome.UPGRADED  # once free


def test_a_process_killed_while_copying_the_backup_leaves_no_file_under_a_backup_name(
    tmp_path: Path, store_root: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    db_path = current_database(store_root, "judgements", "t", descriptor, sample_rows("killed", 200))
    original, rows = db_path.read_bytes(), rows_of(db_path)
    code = f"""
import os, signal
from pathlib import Path
import store.backends.sqlite.upgrade as up
from store.schema import read_script_directory
from store.settings import Settings

def dying_copy(src, dst):  # the process is killed half-way through the copy
    Path(dst).write_bytes(Path(src).read_bytes()[: os.path.getsize(src) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

up.shutil.copy2 = dying_copy
up.upgrade_database(Path({str(db_path)!r}), Settings(), script=read_script_directory(Path({str(REVISIONS)!r})))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    killed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert not [p for p in db_path.parent.iterdir() if is_backup_of(p.name, db_path.name)], "a truncated backup"
    [stray] = stray_paths(store_root)
    assert Path(stray.where).parent == db_path.parent and "interrupted while copying its backup" in stray.message
    assert rows_of(db_path) == rows and version_of(db_path) == SHIPPED_HEAD
    again = upgrade_database(db_path, Settings(), script=synthetic)
    assert again.outcome is UpgradeOutcome.UPGRADED
    assert again.backup is not None and again.backup.read_bytes() == original


def test_the_backup_is_one_file_holding_the_rows_a_killed_writer_left_in_the_wal(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    records = sample_rows("wal")
    expected = rows_of(current_database(tmp_path / "whole", "judgements", "t", descriptor, records))
    db_path = current_database(tmp_path / "root", "judgements", "t", descriptor, records[:-1])
    wal, saved = wal_path(db_path), tmp_path / "saved"
    saved.mkdir()
    with closing(sqlite3.connect(db_path, isolation_level=None)) as writer:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        sqlite_insert("judgements", "ignore").execute(writer, sqlite_insert("judgements", "ignore").rows(records[-1:]))
        shutil.copy2(db_path, saved / "db")  # the files as a writer killed now leaves them
        shutil.copy2(wal, saved / "wal")
    shutil.copy2(saved / "db", db_path)
    shutil.copy2(saved / "wal", wal)
    shm_path(db_path).unlink(missing_ok=True)
    assert rows_of(db_path) != expected, "the last row must live only in the -wal"

    result = upgrade_database(db_path, Settings(), script=synthetic)

    assert result.outcome is UpgradeOutcome.UPGRADED and result.backup is not None
    assert result.rows is not None and result.rows["judgements"] == 3
    assert [p.name for p in db_path.parent.iterdir() if ".bak-" in p.name] == [result.backup.name]
    assert not wal_path(result.backup).exists()
    shutil.copy2(result.backup, db_path)  # going back as docs/schema-evolution.md says: the one file
    for leftover in (wal, shm_path(db_path)):
        leftover.unlink(missing_ok=True)
    assert rows_of(db_path) == expected and version_of(db_path) == SHIPPED_HEAD


_FAILING_REVISION = '''"""Synthetic failing revision: {how}.

What changes: a nullable column, then an injected failure on databases marked 'explode'.
Why: tests of the runner's restore. Data impact: none once restored. Expected cost: milliseconds.

Revision ID: 9001
Revises: {shipped}
"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{shipped}"
branch_labels = None
depends_on = None


def upgrade():
    bind = op.get_bind()
    marked = bind.execute(sa.text("SELECT count(*) FROM completions WHERE benchmark = 'explode'")).scalar()
    with op.batch_alter_table("judgements") as batch_op:
        batch_op.add_column(sa.Column("reviewer_note", sa.String(), nullable=True))
    if not marked:
        return
{body}


def downgrade():
    raise NotImplementedError
'''

FAILURES = {
    "raises": (
        "the migration raises after changing the schema",
        '    raise RuntimeError("injected failure")',
        "RuntimeError: injected failure",
    ),
    "commits-then-raises": (
        "the migration commits part of its work, writes more, then raises (rollback cannot undo it)",
        '    op.execute("COMMIT")\n'
        "    op.execute(\"UPDATE completions SET completion = 'clobbered'\")\n"
        '    op.execute("DELETE FROM judgements")\n'
        '    raise RuntimeError("injected failure after a partial commit")',
        "after a partial commit",
    ),
    "the-server-refuses": (
        "a statement of the migration fails in the database (a table of that name is there already)",
        '    op.execute("CREATE TABLE completions (x INTEGER)")',
        "already exists",
    ),
    "loses-rows": (
        "the migration silently drops rows (the row-count check must catch it)",
        "    op.execute(\"DELETE FROM completions WHERE instruction_id = '1'\")",
        "row counts changed",
    ),
}


def failing_script(tmp_path: Path, kind: str) -> Any:
    folder = tmp_path / f"failing-{kind}"
    folder.mkdir()
    how, body, _ = FAILURES[kind]
    (folder / "9001_fails.py").write_text(_FAILING_REVISION.format(how=how, body=body, shipped=SHIPPED_HEAD))
    return read_script_directory(folder)


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_failed_upgrade_restores_the_file_byte_for_byte_and_the_others_go_on(
    kind: str, tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = failing_script(tmp_path, kind)
    paths = []
    for name in ("good-1", "bad", "good-2"):
        rows = sample_rows(name)
        if name == "bad":
            rows[0] = completion_record(0, benchmark="explode")
        paths.append(current_database(tmp_path / name, "judgements", "t", descriptor, rows))
    bad = paths[1]
    original, rows, files = bad.read_bytes(), rows_of(bad), sorted(p.name for p in bad.parent.iterdir())
    restored: list[Path] = []  # copies back onto the live file: only a partial commit should need one
    real_copy = shutil.copy2
    monkeypatch.setattr(
        store.backends.sqlite.upgrade.shutil,
        "copy2",
        lambda src, dst: restored.append(Path(dst)) or real_copy(src, dst),
    )
    seen: list[UpgradeResult] = []
    results = list(upgrade_databases(paths, Settings(), script=script, on_result=seen.append))
    assert results == seen
    assert [r.outcome for r in results] == [UpgradeOutcome.UPGRADED, UpgradeOutcome.FAILED, UpgradeOutcome.UPGRADED]
    failed = results[1]
    assert failed.where == str(bad) and failed.from_revision == SHIPPED_HEAD and failed.to_revision is None
    assert FAILURES[kind][2] in str(failed.error)
    assert bad.read_bytes() == original, "the database must be restored byte for byte"
    assert rows_of(bad) == rows and version_of(bad) == SHIPPED_HEAD
    left = sorted(p.name for p in bad.parent.iterdir() if ".bak-" not in p.name)
    assert left == files, "the restore must not leave new files beside the database"
    assert failed.backup is not None and failed.backup.read_bytes() == original
    assert (bad in restored) == (kind == "commits-then-raises"), "a rolled-back migration needs no copy"
    for good in (paths[0], paths[2]):
        assert version_of(good) == SYNTHETIC_HEAD


def test_a_failed_upgrade_leaves_the_wal_of_a_process_that_has_the_file_open(
    tmp_path: Path, descriptor: ModelDescriptor
) -> None:
    """The restore deleted the -wal and -shm whatever it found (was): a job still holding the file committed into
    a deleted WAL, and every other connection met a disk I/O error or lost those commits."""
    db_path = current_database(tmp_path, "judgements", "t", descriptor, [completion_record(0, benchmark="explode")])
    with closing(sqlite3.connect(db_path, isolation_level=None)) as job:
        assert job.execute("SELECT count(*) FROM completions").fetchone() == (1,)  # the job has the file open
        result = upgrade_database(db_path, Settings(), script=failing_script(tmp_path, "raises"))
        assert result.outcome is UpgradeOutcome.FAILED and "injected failure" in str(result.error)
        job.execute("UPDATE completions SET completion = 'written after the failed upgrade'")
        with closing(sqlite3.connect(db_path)) as other:
            assert other.execute("SELECT completion FROM completions").fetchall() == [
                ("written after the failed upgrade",)
            ]
    assert [row[-1] for row in rows_of(db_path)["completions"]] == ["written after the failed upgrade"]
    assert version_of(db_path) == SHIPPED_HEAD


def test_a_failed_upgrade_keeps_what_a_job_committed_just_after_its_rollback(
    tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's writer waiting on the migration's lock commits as soon as it is rolled back: the file's bytes then
    differ from the backup, which was copied back over that commit, the WAL deleted under the job (was)."""
    db_path = current_database(tmp_path, "judgements", "t", descriptor, [completion_record(0, benchmark="explode")])
    restore = store.backends.sqlite.upgrade._restore
    with closing(sqlite3.connect(db_path, isolation_level=None)) as job:

        def the_job_commits_first(*args: Any) -> None:
            job.execute("UPDATE completions SET completion = 'committed just after the rollback'")
            restore(*args)

        monkeypatch.setattr(store.backends.sqlite.upgrade, "_restore", the_job_commits_first)
        result = upgrade_database(db_path, Settings(), script=failing_script(tmp_path, "raises"))
        assert result.outcome is UpgradeOutcome.FAILED
        with closing(sqlite3.connect(db_path)) as other:
            assert other.execute("SELECT completion FROM completions").fetchall() == [
                ("committed just after the rollback",)
            ]
    assert version_of(db_path) == SHIPPED_HEAD


def test_db_upgrade_names_the_backup_a_failed_upgrade_leaves_beside_the_restored_file(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table showed the failure alone; the backup it made stays (the file was restored from it)."""
    db_path = current_database(store_root, "judgements", "t", descriptor, [completion_record(0, benchmark="explode")])
    pretend_shipped_scripts_are(failing_script(tmp_path, "raises"), monkeypatch)
    monkeypatch.setenv("JUDGESTORE_STORE_ROOT", str(store_root))
    result = judgestore("db", "upgrade")
    assert result.exit_code == 1, result.output
    [backup] = [p for p in db_path.parent.iterdir() if ".bak-" in p.name]
    said = " ".join(result.stdout.split())  # the table wraps its last column
    assert "failed" in said and "injected failure" in said
    assert f"restored from its backup, kept at {backup.relative_to(store_root)}" in said, said


def test_a_failed_automatic_upgrade_on_open_restores_the_file(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = failing_script(tmp_path, "commits-then-raises")
    rows = [completion_record(0, benchmark="explode"), *sample_rows("x")[1:]]
    db_path = current_database(store_root, "judgements", "t", descriptor, rows)
    original = db_path.read_bytes()
    pretend_shipped_scripts_are(script, monkeypatch)
    with Store(Settings(auto_upgrade=True), root=store_root) as s, pytest.raises(UpgradeFailedError) as caught:
        s.database("judgements", "t", descriptor)
    assert str(db_path) in str(caught.value) and "restored" in str(caught.value)
    assert db_path.read_bytes() == original


def test_auto_upgrade_opens_a_database_another_process_upgraded_first(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs started together on a behind database: the one that loses the race finds it up to date, and opens it."""
    db_path = current_database(store_root, "judgements", "t", descriptor, sample_rows("race"))
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with Store(Settings(auto_upgrade=True), root=store_root) as s:
        real_upgrade = s.storage.upgrade

        def upgraded_by_another_job_first(locations: Any, **kwargs: Any) -> Any:
            # the other job upgrades between this job's check (behind) and its upgrade
            assert upgrade_database(db_path, Settings(), script=synthetic).outcome is UpgradeOutcome.UPGRADED
            results = list(real_upgrade(locations, **kwargs))
            assert [r.outcome for r in results] == [UpgradeOutcome.UP_TO_DATE]
            return iter(results)

        monkeypatch.setattr(s.storage, "upgrade", upgraded_by_another_job_first)
        assert s.database("judgements", "t", descriptor).count() == 3
    assert version_of(db_path) == SYNTHETIC_HEAD


def test_a_refused_automatic_upgrade_says_nothing_was_written(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = current_database(store_root, "judgements", "t", descriptor, sample_rows("full"))
    before = file_digests(db_path.parent)
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    monkeypatch.setattr(store.backends.sqlite.upgrade, "free_bytes", lambda path: 0)  # no room for the backup
    with Store(Settings(auto_upgrade=True), root=store_root) as s, pytest.raises(UpgradeFailedError) as caught:
        s.database("judgements", "t", descriptor)
    message = str(caught.value)
    assert "refused" in message and "nothing was written" in message and "restored" not in message
    assert file_digests(db_path.parent) == before


def test_auto_upgrade_opens_a_database_that_is_behind(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = sample_rows("auto")
    db_path = current_database(store_root, "judgements", "t", descriptor, rows)
    before = rows_of(db_path)
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with Store(Settings(), root=store_root) as s, pytest.raises(SchemaBehindError):
        s.database("judgements", "t", descriptor)
    with Store(Settings(auto_upgrade=True), root=store_root) as s:
        with pytest.warns(AutoUpgradeWarning, match=r"upgraded from revision \S+ to 9001 as it was opened") as said:
            database = s.database("judgements", "t", descriptor)
        (backup,) = [p for p in db_path.parent.iterdir() if is_backup_of(p.name, db_path.name)]
        assert f"its backup: {backup}" in str(said[0].message)
        assert database.count() == 3
        assert database.get_many([r.input_hash for r in rows if r.completion.startswith("auto verdict")])
    assert version_of(db_path) == SYNTHETIC_HEAD and rows_of(db_path) == before
    assert db_path.read_bytes()[18:20] == b"\x02\x02"


def test_a_read_only_store_under_auto_upgrade_says_it_is_never_upgraded(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generate --mode replay` with JUDGESTORE_AUTO_UPGRADE=1 set: told to set JUDGESTORE_AUTO_UPGRADE=1 (was)."""
    db_path = current_database(store_root, "judgements", "t", descriptor, sample_rows("replay"))
    before = file_digests(store_root)
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with (
        Store(Settings(auto_upgrade=True), root=store_root, readonly=True) as s,
        pytest.raises(SchemaBehindError) as caught,
    ):
        s.database("judgements", "t", descriptor)
    message = str(caught.value)
    assert message.startswith(f"{db_path}: schema revision ") and "met by a read" in message
    assert "set JUDGESTORE_AUTO_UPGRADE" not in message and "judgestore db upgrade" in message
    assert file_digests(store_root) == before


def test_reads_across_databases_never_upgrade_under_auto_upgrade(
    store_root: Path, descriptor: ModelDescriptor, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the commands that only read: a query of the whole store through the API refuses a database that is
    behind and writes nothing (it upgraded it, and left a backup a colleague's older judgestore would not need)."""
    db_path = current_database(store_root, "judgements", "t", descriptor, sample_rows("read"))
    before = file_digests(store_root)
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with Store(Settings(auto_upgrade=True), root=store_root) as s:
        for read in (
            lambda: list(s.scalars(sqlalchemy.select(Judgement))),
            lambda: s.execute(sqlalchemy.select(Judgement.judge)).all(),
            lambda: list(s.query_rows(Selector(), RowFilter(benchmark="arena"))),
        ):
            with pytest.raises(SchemaBehindError):
                read()
        assert file_digests(store_root) == before
        with pytest.warns(AutoUpgradeWarning):
            assert s.database("judgements", "t", descriptor).count() == 3  # a writer's open upgrades it
    assert version_of(db_path) == SYNTHETIC_HEAD


def test_upgrading_200_databases_at_mixed_revisions(
    tmp_path: Path, descriptor: ModelDescriptor, synthetic: Any
) -> None:
    template = current_database(tmp_path / "template", "judgements", "t", descriptor, sample_rows("template", 20))
    template_synthetic = tmp_path / "template-synthetic.db"
    shutil.copyfile(template, template_synthetic)
    at_synthetic_head(template_synthetic, synthetic)
    folder = tmp_path / "many"
    folder.mkdir()
    paths, kinds = [], []
    for i in range(200):
        path = folder / f"db-{i:03d}.db"
        kind = (
            "foreign"
            if i == 17
            else "ahead"
            if i == 42
            else "not-sqlite"
            if i == 99
            else SYNTHETIC_HEAD
            if i % 4 == 0
            else SHIPPED_HEAD
        )
        if kind == "foreign":
            foreign_database(path)
        elif kind == "not-sqlite":
            path.write_text("id,answer\n1,yes\n")
        else:
            shutil.copyfile(template_synthetic if kind == SYNTHETIC_HEAD else template, path)
            with closing(sqlite3.connect(path)) as conn, conn:  # distinct content in every file
                conn.execute("UPDATE completions SET completion = completion || ?", (f" (file {i})",))
                conn.execute("DELETE FROM judgements WHERE rowid % 5 = ?", (i % 5,))
            if kind == "ahead":
                stamp(path, UNKNOWN_REVISION)
        paths.append(path)
        kinds.append(kind)
    rows = {p: rows_of(p) for p, k in zip(paths, kinds, strict=True) if k in (SHIPPED_HEAD, SYNTHETIC_HEAD)}
    untouched = {p: p.read_bytes() for p, k in zip(paths, kinds, strict=True) if k != SHIPPED_HEAD}

    results = list(upgrade_databases(paths, Settings(), script=synthetic, keep_backup=False))

    assert [r.where for r in results] == [str(p) for p in paths]  # one report per file, in order
    expected = {
        SHIPPED_HEAD: UpgradeOutcome.UPGRADED,
        SYNTHETIC_HEAD: UpgradeOutcome.UP_TO_DATE,
        "foreign": UpgradeOutcome.REFUSED,
        "ahead": UpgradeOutcome.REFUSED,
        "not-sqlite": UpgradeOutcome.REFUSED,
    }
    assert [r.outcome for r in results] == [expected[k] for k in kinds]
    by_path = {Path(r.where): r for r in results}
    assert "not a judgestore database" in str(by_path[paths[17]].error)
    assert UNKNOWN_REVISION in str(by_path[paths[42]].error)
    assert "not an SQLite database" in str(by_path[paths[99]].error)
    assert sum(r.outcome is UpgradeOutcome.UPGRADED for r in results) == kinds.count(SHIPPED_HEAD) == 147
    for path, before in rows.items():
        assert rows_of(path) == before, f"{path.name}: rows changed"
        assert version_of(path) == SYNTHETIC_HEAD and "reviewer_note" in judgement_columns(path)
    for path, data in untouched.items():
        assert path.read_bytes() == data, f"{path.name} was written although it needed no upgrade"

    snapshot = file_digests(folder)
    again = list(upgrade_databases(paths, Settings(), script=synthetic))
    assert not [r for r in again if r.outcome is UpgradeOutcome.UPGRADED]
    assert file_digests(folder) == snapshot, "a second run must do nothing"


# ---------------------------------------------------------------- a whole store


def test_upgrade_store_upgrades_behind_databases_once(filled: Path, settings: Settings) -> None:
    script = read_script_directory(REVISIONS)
    results = list(upgrade_store(filled, select(filled), settings, script=script))
    assert [(r.outcome, r.from_revision, r.to_revision) for r in results] == [
        (UpgradeOutcome.UPGRADED, SHIPPED_HEAD, SYNTHETIC_HEAD)
    ] * 3
    assert all(r.backup is not None and r.backup.exists() for r in results)
    again = list(upgrade_store(filled, select(filled), settings, script=script))
    assert [r.outcome for r in again] == [UpgradeOutcome.UP_TO_DATE] * 3


def test_upgrade_store_never_writes_to_files_it_refuses(filled: Path, settings: Settings) -> None:
    qwen, llama = location_of(filled, QWEN), location_of(filled, LLAMA)
    qwen.db_path(filled).write_bytes(b"garbage" * 1000)
    llama.db_path(filled).unlink()
    with sqlite3.connect(llama.db_path(filled)) as conn:  # rollback journal: a WAL switch would show
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
    conn.close()
    before = file_digests(filled)
    results = {Path(r.where): r for r in upgrade_store(filled, select(filled), settings)}
    assert results[qwen.db_path(filled)].outcome is UpgradeOutcome.REFUSED
    assert "not an SQLite database" in str(results[qwen.db_path(filled)].error)
    assert results[llama.db_path(filled)].outcome is UpgradeOutcome.REFUSED
    assert "not a judgestore database" in str(results[llama.db_path(filled)].error)
    assert results[location_of(filled, JUDGE).db_path(filled)].outcome is UpgradeOutcome.UP_TO_DATE
    assert file_digests(filled) == before  # not a byte changed, no lock file created
