"""`vacuum`: deleted rows give their space back; rows, busy files and foreign files are left alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.backends.sqlite.vacuum import vacuum_database
from store.layout import lock_path, walk
from store.reports import VacuumOutcome
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import QWEN, completion_record, fill_small_store, foreign_database, hide_a_row_in_a_page
from tests.faults import lock_held_elsewhere


def big_store(root: Path) -> Path:
    with Store(Settings(), root=root) as store:
        database = store.database("completions", "mt-bench", QWEN)
        database.put_many([completion_record(i, completion="x" * 4000, run_id=f"run-{i % 2}") for i in range(200)])
        database.delete(RowFilter(run_id="run-0"))
        return database.path


def test_vacuum_gives_the_space_of_deleted_rows_back_and_keeps_every_row(store_root: Path) -> None:
    path = big_store(store_root)
    (location,) = walk(store_root)
    with Store(Settings(), root=store_root, readonly=True) as store:
        before = sorted(r.input_hash for r in store.open(location).query())
    result = vacuum_database(store_root, location, Settings())
    assert result.outcome is VacuumOutcome.VACUUMED and result.error is None
    assert result.bytes_after < result.bytes_before / 1.5 and result.freed > 300_000
    assert not (path.parent / "completions.db-wal").exists() or (path.parent / "completions.db-wal").stat().st_size == 0
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert sorted(r.input_hash for r in store.open(location).query()) == before
    assert vacuum_database(store_root, location, Settings()).freed == 0  # a second time has nothing to give


def test_a_database_held_by_a_writer_is_reported_busy_and_left_as_it_was(store_root: Path) -> None:
    path = big_store(store_root)
    (location,) = walk(store_root)
    holder = sqlite3.connect(path, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("DELETE FROM completions WHERE instruction_id = '1'")
        result = vacuum_database(store_root, location, Settings(busy_timeout_ms=100))
    finally:
        holder.rollback()
        holder.close()
    assert result.outcome is VacuumOutcome.BUSY and "try again" in str(result.error)
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert store.open(location).count() == 100


def test_a_reader_that_keeps_the_file_from_shrinking_is_reported_busy_with_every_row_kept(store_root: Path) -> None:
    """A reader inside its snapshot kept the last checkpoint from writing the compacted pages back: the file was no
    smaller and its WAL grew, and vacuum said "vacuumed", exit 0 (was)."""
    path = big_store(store_root)
    (location,) = walk(store_root)
    size = path.stat().st_size
    reader = sqlite3.connect(path)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM completions").fetchone() == (100,)
        result = vacuum_database(store_root, location, Settings(busy_timeout_ms=100))
        assert path.stat().st_size == size  # what the report says: not smaller yet
    finally:
        reader.close()
    assert result.outcome is VacuumOutcome.BUSY and "run judgestore vacuum again" in str(result.error)
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert store.open(location).count() == 100
    assert vacuum_database(store_root, location, Settings()).outcome is VacuumOutcome.VACUUMED
    assert path.stat().st_size < size / 1.5


def test_a_lock_another_process_holds_past_the_busy_timeout_is_reported_busy(store_root: Path) -> None:
    """Another upgrade or vacuum of the file holds its lock: the vacuum waited for it without a bound (was)."""
    fill_small_store(store_root)
    location = next(loc for loc in walk(store_root) if loc.role == "completions")
    path = location.db_path(store_root)
    before = path.read_bytes()
    with lock_held_elsewhere(lock_path(path)):
        result = vacuum_database(store_root, location, Settings(busy_timeout_ms=200))
    assert result.outcome is VacuumOutcome.BUSY and "held its lock file" in str(result.error)
    assert path.read_bytes() == before


def test_a_foreign_file_is_refused_untouched(store_root: Path) -> None:
    big_store(store_root)
    (location,) = walk(store_root)
    path = location.db_path(store_root)
    for side in path.parent.glob("completions.db*"):
        side.unlink()
    foreign_database(path)
    original = path.read_bytes()
    result = vacuum_database(store_root, location, Settings())
    assert result.outcome is VacuumOutcome.REFUSED and "alembic_version" in str(result.error)
    assert path.read_bytes() == original


def test_a_folder_whose_metadata_was_edited_is_refused_untouched(store_root: Path) -> None:
    """Free pages of a deleted batch are there to give back, but not in a folder that is no longer its descriptor's."""
    big_store(store_root)
    (location,) = walk(store_root)
    path = location.db_path(store_root)
    metadata = location.metadata_path(store_root)
    doc = orjson.loads(metadata.read_bytes())
    doc["descriptor"]["sampling"]["temperature"] = 0.5  # no longer the descriptor the folder is named after
    metadata.write_bytes(orjson.dumps(doc))
    original = path.read_bytes()
    result = vacuum_database(store_root, location, Settings())
    assert result.outcome is VacuumOutcome.REFUSED and "metadata.json" in str(result.error)
    assert path.read_bytes() == original


def test_an_empty_database_has_nothing_to_give_back_and_is_left_as_it_was(store_root: Path) -> None:
    big_store(store_root)
    (location,) = walk(store_root)
    path = location.db_path(store_root)
    for side in path.parent.glob("completions.db*"):
        side.unlink()
    path.write_bytes(b"")  # a zero-byte database: empty, as every command reads it
    result = vacuum_database(store_root, location, Settings())
    assert result.outcome is VacuumOutcome.EMPTY and result.error is None
    files = sorted(p.name for p in path.parent.iterdir() if p.suffix != ".lock")  # the lock file is the store's
    assert path.read_bytes() == b"" and files == ["completions.db", "metadata.json"]  # no -wal, no -shm


def test_a_damaged_file_is_refused_untouched_with_the_rows_its_damage_hides(store_root: Path) -> None:
    """VACUUM copies what the b-trees lead to: on a damaged page it would drop the hidden row for good."""
    fill_small_store(store_root)
    location = next(loc for loc in walk(store_root) if loc.role == "completions")
    path = location.db_path(store_root)
    hide_a_row_in_a_page(path, "completions")
    before = path.read_bytes()
    result = vacuum_database(store_root, location, Settings())
    assert result.outcome is VacuumOutcome.REFUSED and "SQLite found damage" in str(result.error)
    assert "nothing was changed" in str(result.error)
    assert path.read_bytes() == before and all(f"answer {i}".encode() in before for i in range(3))
