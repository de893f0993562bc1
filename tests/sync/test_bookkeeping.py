"""The bookkeeping: which keys each remote is known to have, per store root, in a file of its own."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from store.errors import BookkeepingError
from store.sync.bookkeeping import Bookkeeping, NewShard, ShardState, bookkeeping_path


def test_keys_are_known_once_pushed_or_fetched_and_only_to_that_remote(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path) as books:
        hub, folder = books.remote_id("hf:hub/datasets/org/a"), books.remote_id("dir:/shared")
        assert books.remote_id("hf:hub/datasets/org/a") == hub
        books.record(hub, ShardState.PENDING, [NewShard("f", "s1", 2, 10, ["k1", "k2"])])
        assert books.unknown_keys(hub, "f", ["k1", "k2", "k3"]) == ["k1", "k2", "k3"]  # pending is not known

        books.set_state(hub, [("f", "s1")], ShardState.PUSHED, "commit-1")
        books.record(hub, ShardState.FETCHED, [NewShard("f", "s2", 1, 5, ["k3"])])
        assert books.unknown_keys(hub, "f", ["k1", "k2", "k3", "k4"]) == ["k4"]
        assert books.unknown_keys(hub, "other-folder", ["k1"]) == ["k1"]
        assert books.unknown_keys(folder, "f", ["k1"]) == ["k1"]  # a mirror may still receive it

        books.forget(hub, [("f", "s2")])
        assert books.states(hub, "f") == {"s1": ShardState.PUSHED}
        assert books.unknown_keys(hub, "f", ["k3"]) == ["k3"]


def test_recording_a_known_shard_again_moves_its_state(tmp_path: Path) -> None:
    with Bookkeeping(tmp_path) as books:
        remote = books.remote_id("dir:/x")
        books.record(remote, ShardState.FETCHED, [NewShard("f", "s", 1, 1, ["k"])])
        books.record(remote, ShardState.IMPORTED, [NewShard("f", "s", 1, 1, ["k"])])
        assert [e.state for e in books.shards(remote)] == [ShardState.IMPORTED]


def test_a_bookkeeping_file_from_a_newer_judgestore_is_refused(tmp_path: Path) -> None:
    Bookkeeping(tmp_path).close()
    with closing(sqlite3.connect(bookkeeping_path(tmp_path))) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(BookkeepingError, match="newer than this library"):
        Bookkeeping(tmp_path)


def test_a_damaged_bookkeeping_file_says_what_to_do(tmp_path: Path) -> None:
    path = bookkeeping_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BookkeepingError, match="move it away"):
        Bookkeeping(tmp_path)
