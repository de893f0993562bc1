"""A write interrupted in the rollback journal (a writer killed mid-transaction leaves a hot ``-journal``).

Read-only commands cannot roll it back: they say so (never "not writable"), verify does not call the journal a
stray file to delete (deleting it would keep the half-written pages), and ``db upgrade`` rolls it back.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from store.backends.sqlite.errors import translated
from store.errors import InterruptedWriteError
from store.layout import Location
from store.reports import ProblemKind, UpgradeOutcome
from store.settings import Settings
from store.store import Store
from tests.factories import QWEN, completion_record
from tests.faults import judgestore

ROLE, TASK, ROWS = "completions", "t", 400
ROLLBACK = Settings(journal_policy="rollback")

# A writer that updates every row in one transaction with a page cache too small to hold the change, so that
# SQLite writes changed pages into the database file (their originals in the -journal) before the commit; it
# says so, then waits to be killed.
_INTERRUPTED_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 2")
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE completions SET completion = upper(completion)")
print("written", flush=True)
time.sleep(60)
"""


@pytest.fixture
def interrupted(tmp_path: Path) -> tuple[Path, Path]:
    """A store in rollback mode whose one database has a write interrupted mid-transaction: (root, database)."""
    root = tmp_path / "store"
    with Store(ROLLBACK, root=root) as s:
        database = s.database(ROLE, TASK, QWEN)
        database.put_many([completion_record(i, completion="answer " + "x" * 2000) for i in range(ROWS)])
        db_path = Path(database.where)
    assert db_path.read_bytes()[18:20] == b"\x01\x01"  # the rollback journal
    writer = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_WRITER, str(db_path)], stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    journal = Path(f"{db_path}-journal")
    assert journal.stat().st_size > 0  # hot: the database file holds half-written pages
    return root, db_path


def _rows_in(db_path: Path) -> tuple[int, int]:
    """(rows, rows upper-cased by the interrupted write), read by a connection that may roll the journal back."""
    with closing(sqlite3.connect(db_path)) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM completions").fetchone()
        (upper,) = conn.execute("SELECT count(*) FROM completions WHERE completion GLOB 'ANSWER*'").fetchone()
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return rows, upper


def test_a_read_only_open_names_the_interrupted_write_not_a_read_only_filesystem(
    interrupted: tuple[Path, Path],
) -> None:
    root, db_path = interrupted
    with Store(ROLLBACK, root=root, readonly=True) as s, pytest.raises(InterruptedWriteError) as caught:
        s.database(ROLE, TASK, QWEN)
    message = str(caught.value)
    assert "interrupted" in message and "judgestore db upgrade" in message and "Never delete the -journal" in message
    assert "read-only filesystem" not in message
    # SQLite's code for it (SQLITE_READONLY_ROLLBACK) is never "cannot be written"
    rollback = sqlite3.OperationalError("attempt to write a readonly database")
    rollback.sqlite_errorcode = 8 | (3 << 8)  # type: ignore[attr-defined]
    assert isinstance(translated(db_path, rollback), InterruptedWriteError)


def test_verify_does_not_call_the_journal_a_stray_file(interrupted: tuple[Path, Path]) -> None:
    root, db_path = interrupted
    result = judgestore("verify", "--store-root", str(root), "--json")
    problems = json.loads(result.stdout)["problems"]
    assert not [p for p in problems if p["kind"] == ProblemKind.STRAY], problems  # deleting it damages the file
    assert [p["kind"] for p in problems] == [ProblemKind.FILE]
    assert "interrupted" in problems[0]["message"] and "Never delete the -journal" in problems[0]["message"]
    assert Path(f"{db_path}-journal").stat().st_size > 0  # a read-only command left it as it was


def test_db_upgrade_rolls_the_interrupted_write_back(interrupted: tuple[Path, Path]) -> None:
    root, db_path = interrupted
    with Store(ROLLBACK, root=root) as s:  # a read-write store: what `judgestore db upgrade` opens
        (result,) = s.upgrade([Location.of(ROLE, TASK, QWEN)])
    assert result.outcome is UpgradeOutcome.UP_TO_DATE, result
    assert not Path(f"{db_path}-journal").exists()
    assert _rows_in(db_path) == (ROWS, 0)  # every row as it was committed, none of the interrupted write
    with Store(ROLLBACK, root=root, readonly=True) as s:
        assert s.database(ROLE, TASK, QWEN).count() == ROWS
    verified = judgestore("verify", "--store-root", str(root))
    assert verified.exit_code == 0, verified.output


def test_db_upgrade_dry_run_says_the_interrupted_write_is_rolled_back_first_and_leaves_it(
    interrupted: tuple[Path, Path],
) -> None:
    root, db_path = interrupted
    with Store(ROLLBACK, root=root, readonly=True) as s:  # what `judgestore db upgrade --dry-run` opens
        (result,) = s.upgrade([Location.of(ROLE, TASK, QWEN)], dry_run=True)
    assert result.outcome is UpgradeOutcome.WOULD_UPGRADE and "rolls that write back" in (result.error or "")
    assert Path(f"{db_path}-journal").exists()  # still there: the dry run wrote nothing
