"""SQLite's generated row code is readable: one named reader and binder per table, whose source prints and traces."""

from __future__ import annotations

import subprocess
import sys
import traceback
from datetime import datetime
from pathlib import Path

import pytest

from store.backends.sqlite import rows
from store.errors import InvalidInputError
from tests.factories import completion_record

REPO = Path(__file__).resolve().parents[2]


def test_every_table_has_a_named_reader_and_binder_whose_source_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "store.backends.sqlite.rows"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    for name in ("read_completions", "read_judgements", "bind_completions", "bind_judgements"):
        assert f"def {name}(" in printed
    assert "set_created_at(record, None if created_at is None else process_created_at(created_at))" in printed


def test_a_failure_inside_a_binder_shows_its_generated_line() -> None:
    naive = completion_record(1)
    object.__setattr__(naive, "created_at", datetime(2026, 1, 1))  # naive: refused by the column's processor
    with pytest.raises(InvalidInputError) as caught:
        rows.sqlite_insert("completions", "ignore").rows([naive])
    shown = "".join(traceback.format_exception(caught.value.__context__ or caught.value))
    assert "bind_completions" in shown and "process_created_at(created_at)" in shown
