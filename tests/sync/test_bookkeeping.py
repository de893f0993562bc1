"""The bookkeeping: which keys each remote is known to have, per store root, in a file of its own."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine

from store.errors import BookkeepingError
from store.settings import Settings
from store.sync import bookkeeping
from store.sync.bookkeeping import Bookkeeping, NewShard, ShardState, bookkeeping_path
from tests.sync.helpers import FORMAT_1_SCHEMA

HUB = "hf:hub/datasets/org/a"


def write_format_1_file(root: Path) -> Path:
    """A bookkeeping file as the first release wrote it: its schema, user_version 1, then a push's rows."""
    path = bookkeeping_path(root)
    path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        for statement in FORMAT_1_SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("COMMIT")
        conn.execute("INSERT INTO remotes (url) VALUES (?)", (HUB,))
        conn.executemany(
            "INSERT INTO shards (remote_id, folder, name, state, rows, bytes, revision, updated_at)"
            " VALUES (1, 'f', ?, ?, ?, ?, ?, '2026-01-02T03:04:05.000006+00:00')",
            [("s1", "pushed", 2, 10, "commit-1"), ("s2", "pending", 1, 5, None)],
        )
        conn.executemany(
            "INSERT INTO shard_keys (input_hash, shard_id) VALUES (?, ?)", [("k1", 1), ("k2", 1), ("k3", 2)]
        )
    return path


def schema_of(path: Path) -> list[tuple[Any, ...]]:
    """Every table and index of a file with the SQL that created it, and its format."""
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()
        return [*rows, ("user_version", conn.execute("PRAGMA user_version").fetchone()[0])]


def structure_of(path: Path) -> dict[str, Any]:
    """What SQLite reports about each table: columns, foreign keys, indexes and their columns, rowid or not."""
    with closing(sqlite3.connect(path)) as conn:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
        return {
            name: {
                "columns": conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                "foreign_keys": conn.execute(f"PRAGMA foreign_key_list({name})").fetchall(),
                "indexes": sorted(
                    (index, unique, origin, partial, conn.execute(f"PRAGMA index_xinfo({index})").fetchall())
                    for _, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({name})")
                ),
                "without_rowid": sql.rstrip().endswith("WITHOUT ROWID"),
            }
            for name, sql in tables
        }


def test_keys_are_known_once_pushed_or_fetched_and_only_to_that_remote(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path) as books:
        hub, folder = books.remote_id("hf:hub/datasets/org/a"), books.remote_id("dir:/shared")
        assert books.remote_id("hf:hub/datasets/org/a") == hub
        books.record(hub, ShardState.PENDING, [NewShard("f", "s1", 2, 10, ["k1", "k2"])])
        assert books.unknown_keys([hub], "f", ["k1", "k2", "k3"]) == ["k1", "k2", "k3"]  # pending is not known

        books.set_state(hub, [("f", "s1")], ShardState.PUSHED, "commit-1")
        books.record(hub, ShardState.FETCHED, [NewShard("f", "s2", 1, 5, ["k3"])])
        assert books.unknown_keys([hub], "f", ["k1", "k2", "k3", "k4"]) == ["k4"]
        assert books.unknown_keys([hub], "other-folder", ["k1"]) == ["k1"]
        assert books.unknown_keys([folder], "f", ["k1"]) == ["k1"]  # a mirror may still receive it

        books.forget(hub, [("f", "s2")])
        assert books.states(hub, "f") == {"s1": ShardState.PUSHED}
        assert books.unknown_keys([hub], "f", ["k3"]) == ["k3"]


def test_recording_a_known_shard_again_moves_its_state(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path) as books:
        remote = books.remote_id("dir:/x")
        books.record(remote, ShardState.FETCHED, [NewShard("f", "s", 1, 1, ["k"])])
        books.record(remote, ShardState.IMPORTED, [NewShard("f", "s", 1, 1, ["k"])])
        assert [e.state for e in books.shards(remote)] == [ShardState.IMPORTED]


def test_a_bookkeeping_file_from_a_newer_judgestore_is_refused_and_left_untouched(tmp_path: Path) -> None:
    Bookkeeping(tmp_path).close()
    path = bookkeeping_path(tmp_path)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 99")
    before = path.read_bytes()
    with pytest.raises(BookkeepingError, match="newer than this library") as caught:
        Bookkeeping(tmp_path)
    assert str(path) in str(caught.value) and "git pull && pip install -e ." in str(caught.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["sync.db"]  # no journal left behind either


def test_a_damaged_bookkeeping_file_says_what_to_do(tmp_path: Path) -> None:
    path = bookkeeping_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BookkeepingError, match="move it away"):
        Bookkeeping(tmp_path)


def test_a_file_with_tables_but_no_format_is_not_ours_and_is_left_untouched(tmp_path: Path) -> None:
    path = bookkeeping_path(tmp_path)
    path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    before = path.read_bytes()
    with pytest.raises(BookkeepingError, match=r"not a judgestore sync bookkeeping database.*move it away"):
        Bookkeeping(tmp_path)
    assert path.read_bytes() == before


# ---------------------------------------------------------------- formats


def test_a_format_1_file_written_by_the_first_release_is_upgraded_and_keeps_working(tmp_path: Path) -> None:
    path = write_format_1_file(tmp_path)
    Bookkeeping(tmp_path / "new").close()
    with Bookkeeping(tmp_path) as books:
        hub = books.remote_id(HUB)
        assert hub == 1
        assert books.states(hub, "f") == {"s1": ShardState.PUSHED, "s2": ShardState.PENDING}
        assert books.unknown_keys([hub], "f", ["k1", "k2", "k3", "k4"]) == ["k3", "k4"]  # k3 is only pending
        books.set_state(hub, [("f", "s2")], ShardState.PUSHED, "commit-2")
        books.record(hub, ShardState.FETCHED, [NewShard("f", "s3", 1, 7, ["k5"])])
        assert books.unknown_keys([hub], "f", ["k3", "k4", "k5"]) == ["k4"]
    assert schema_of(path) == schema_of(bookkeeping_path(tmp_path / "new"))  # exactly what a new file holds


def test_a_new_file_is_format_1_upgraded_by_the_later_steps(tmp_path: Path) -> None:
    """Format 1's statements are frozen: a new file runs them, then every later step, as an old file does."""
    Bookkeeping(tmp_path / "new").close()
    old = write_format_1_file(tmp_path / "old")
    with closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    Bookkeeping(tmp_path / "old").close()
    assert schema_of(bookkeeping_path(tmp_path / "new")) == schema_of(old)
    assert schema_of(old)[-1] == ("user_version", len(bookkeeping.MIGRATIONS))


def test_format_2_knows_what_format_1_says_is_on_the_default_branch_and_nothing_more(tmp_path: Path) -> None:
    """Format 1 recorded a fetch under the repository whatever revision it was made at: its fetched Hub shards
    are not taken as on main (a push to main asks main's listing about them); shards a push confirmed under the
    repository's own name are, and so is every shard of a folder remote (it has no other branch)."""
    path = write_format_1_file(tmp_path)  # HUB: s1 pushed (k1, k2), s2 pending (k3)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executemany("INSERT INTO remotes (id, url) VALUES (?, ?)", [(2, "dir:/shared"), (3, f"{HUB}@exp")])
        conn.executemany(
            "INSERT INTO shards (remote_id, folder, name, state, rows, bytes, revision, updated_at)"
            " VALUES (?, 'f', ?, ?, 1, 5, 'c', '2026-01-02T03:04:05+00:00')",
            [
                (1, "s3", "imported"),
                (1, "s4", "fetched"),
                (2, "d1", "imported"),
                (2, "d2", "pushed"),
                (3, "b1", "pushed"),
            ],
        )
        conn.executemany(
            "INSERT INTO shard_keys (input_hash, shard_id) VALUES (?, ?)",
            [("k4", 3), ("k5", 4), ("k6", 5), ("k7", 6), ("k8", 7)],
        )
    before = {row[:2] for row in _shard_rows(path)}

    with Bookkeeping(tmp_path) as books:
        assert books.unknown_keys([1], "f", ["k1", "k3", "k4", "k5"]) == ["k3"]  # known to the repository
        assert books.unknown_keys([1], "f", ["k1", "k3", "k4", "k5"], on_default=True) == ["k3", "k4", "k5"]
        assert books.unknown_keys([2], "f", ["k6", "k7", "k9"], on_default=True) == ["k9"]

    on_default = {(remote, name): flag for remote, name, flag in _shard_rows(path)}
    assert on_default == {
        (1, "s1"): 1, (1, "s2"): 0, (1, "s3"): 0, (1, "s4"): 0, (2, "d1"): 1, (2, "d2"): 1, (3, "b1"): 0,
    }  # fmt: skip
    assert set(on_default) == before  # no shard lost or added


def _shard_rows(path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(shards)")}
        flag = "on_default" if "on_default" in columns else "NULL"
        return conn.execute(f"SELECT remote_id, name, {flag} FROM shards ORDER BY remote_id, name").fetchall()


def test_a_shard_once_on_the_default_branch_stays_there_and_a_listing_marks_only_recorded_shards(
    tmp_path: Path,
) -> None:
    with Bookkeeping(tmp_path) as books:
        hub = books.remote_id(HUB)
        books.record(hub, ShardState.FETCHED, [NewShard("f", "s1", 1, 1, ["k1"])], "c1", on_default=True)
        books.record(hub, ShardState.FETCHED, [NewShard("f", "s1", 1, 1, ["k1"])], "c2")  # then at a tag
        books.record(hub, ShardState.IMPORTED, [NewShard("f", "s2", 1, 1, ["k2"])], "c2")  # at a branch
        assert books.unknown_keys([hub], "f", ["k1", "k2"], on_default=True) == ["k2"]

        assert books.mark_on_default(hub, "g", ["s2"]) == 0  # another folder's listing
        assert books.mark_on_default(hub, "f", ["s1", "stray", "s9"]) == 0  # nothing recorded there changes
        assert books.unknown_keys([hub], "f", ["k1", "k2"], on_default=True) == ["k2"]
        assert books.mark_on_default(hub, "f", ["s1", "s2"]) == 1
        assert books.unknown_keys([hub], "f", ["k1", "k2"], on_default=True) == []
        assert books.shards(hub, ShardState.IMPORTED)[0].name == "s2"  # its state is untouched
        with pytest.raises(ValueError, match="not both"):
            books.unknown_keys([hub], "f", ["k1"], among=["s1"], on_default=True)


def test_the_tables_describe_the_file_the_migrations_write(tmp_path: Path) -> None:
    Bookkeeping(tmp_path).close()
    migrated = bookkeeping_path(tmp_path)
    created = tmp_path / "create_all.db"
    engine = create_engine(f"sqlite:///{created}")
    bookkeeping.metadata.create_all(engine)
    engine.dispose()
    assert structure_of(created) == structure_of(migrated), (
        "store.sync.bookkeeping's tables and MIGRATIONS disagree: add a migration step for the change"
    )
    shards_sql = next(sql for _, name, _, sql in schema_of(migrated)[:-1] if name == "shards")
    for check in bookkeeping.shards_table.constraints:  # CHECKs are not reported by any PRAGMA
        if hasattr(check, "sqltext"):
            assert f"CHECK ({check.sqltext})" in shards_sql


def _format_next(conn: Connection) -> None:
    """A synthetic next format: shards get a note, filled in for the rows already there."""
    conn.exec_driver_sql("ALTER TABLE shards ADD COLUMN note TEXT")
    conn.exec_driver_sql("UPDATE shards SET note = 'from format 1'")


def test_a_format_1_file_is_upgraded_by_the_steps_it_lacks_and_keeps_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_format_1_file(tmp_path)
    monkeypatch.setattr(bookkeeping, "MIGRATIONS", (*bookkeeping.MIGRATIONS, _format_next))
    with Bookkeeping(tmp_path) as books:
        hub = books.remote_id(HUB)
        assert books.states(hub, "f") == {"s1": ShardState.PUSHED, "s2": ShardState.PENDING}
        assert books.unknown_keys([hub], "f", ["k1", "k2", "k3"]) == ["k3"]
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(bookkeeping.MIGRATIONS)  # with the next
        assert conn.execute("SELECT name, note FROM shards ORDER BY name").fetchall() == [
            ("s1", "from format 1"),
            ("s2", "from format 1"),
        ]
        assert conn.execute("SELECT count(*) FROM shard_keys").fetchone()[0] == 3
    with Bookkeeping(tmp_path) as books:  # a second open has nothing left to do
        assert books.unknown_keys([1], "f", ["k1"]) == []


def test_an_upgrade_that_fails_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_format_1_file(tmp_path)
    before = path.read_bytes()

    def broken_step(conn: Connection) -> None:
        _format_next(conn)
        conn.exec_driver_sql("SELECT * FROM no_such_table")

    monkeypatch.setattr(bookkeeping, "MIGRATIONS", (*bookkeeping.MIGRATIONS, broken_step))
    with pytest.raises(BookkeepingError, match=r"no such table: no_such_table.*move it away") as caught:
        Bookkeeping(tmp_path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == before  # one transaction: the first half of the step was rolled back too


# ---------------------------------------------------------------- locks and errors


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_a_lock_held_too_long_gives_a_bookkeeping_error_naming_the_file(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path, settings=Settings(busy_timeout_ms=50, lock_retries=1)) as books:
        holder = _hold_write_lock(books.path)
        try:
            with pytest.raises(BookkeepingError, match="still locked after 2 tries") as caught:
                books.remote_id(HUB)
        finally:
            holder.close()
        assert str(books.path) in str(caught.value) and "JUDGESTORE_BUSY_TIMEOUT_MS" in str(caught.value)
        assert books.remote_id(HUB) == 1  # once the lock is free, the write goes through


def test_a_short_lock_is_waited_out_instead_of_failing(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path, settings=Settings(busy_timeout_ms=10, lock_retries=8)) as books:
        holder = _hold_write_lock(books.path)
        threading.Timer(0.3, holder.close).start()
        started = time.monotonic()
        assert books.remote_id(HUB) == 1  # retried with backoff past the busy timeout
        assert time.monotonic() - started >= 0.25, "the write cannot have gone through while the lock was held"


def test_a_file_damaged_after_it_was_opened_names_the_file_and_what_to_do(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path) as books:
        with closing(sqlite3.connect(books.path)) as conn:
            conn.execute("DROP TABLE shard_keys")
        with pytest.raises(BookkeepingError, match=r"no such table: shard_keys.*move it away") as caught:
            books.unknown_keys([books.remote_id(HUB)], "f", ["k1"])
        assert str(books.path) in str(caught.value)


@pytest.mark.parametrize("statement", ["_UNKNOWN_KEYS", "_UNKNOWN_KEYS_AMONG", "_UNKNOWN_KEYS_ON_DEFAULT"])
def test_a_key_is_looked_up_by_its_hash_not_by_walking_the_folders_shards(tmp_path: Path, statement: str) -> None:
    """The plan finds each key through shard_keys' primary key: walking the folder's shards for every key made a
    push cost keys x shards (minutes for a folder of a few thousand shards)."""
    with Bookkeeping(tmp_path) as books:
        hub = books.remote_id("hf:hub/datasets/org/a")
        books.record(hub, ShardState.PUSHED, [NewShard("f", f"s{i}", 2, 10, [f"k{i}a", f"k{i}b"]) for i in range(50)])
        assert books.unknown_keys([hub], "f", ["k1a", "k9", "k2b"], among=["s1", "s2"]) == ["k9"]
        assert books.unknown_keys([hub], "f", ["k1a", "k9", "k3b"], among=["s1"]) == ["k9", "k3b"]
    params = {"keys": '["k1a"]', "remote_ids": [hub], "folder": "f", "names": '["s1"]'}
    sql = getattr(bookkeeping, statement).params(params).compile(compile_kwargs={"literal_binds": True})
    with closing(sqlite3.connect(bookkeeping_path(tmp_path))) as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    searches = [step for step in plan if step.startswith(("SEARCH", "SCAN"))]
    assert searches[1] == "SEARCH shard_keys USING PRIMARY KEY (input_hash=?)", plan
