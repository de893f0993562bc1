"""Helpers of the sync tests: the remote as a test sees it, stores filled with rows, rows read back."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from store.descriptor import ModelDescriptor
from store.layout import Location, walk
from store.store import Store
from store.sync.bookkeeping import bookkeeping_path
from store.sync.hub import HubRemote, RetryPolicy
from store.sync.remote import DirectoryRemote, Remote
from store.tables.records import Record
from tests.factories import completion_record, judgement_record
from tests.fake_hub import FakeHub

WRITE_TOKEN = "hf_test_write_token"
READ_TOKEN = "hf_test_read_token"
REPO = "org/judge-cache"
FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.004)
QWEN = ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0})
JUDGE = ModelDescriptor(provider="vllm", model="judge-1", sampling={"temperature": 0.0, "max_tokens": 8})
QWEN_FOLDER = Location.of("completions", "mt-bench", QWEN).relative_folder().as_posix()
JUDGE_FOLDER = Location.of("judgements", "arena-hard", JUDGE).relative_folder().as_posix()

# Format 1 as the first sharing release wrote it, copied from that release's store/sync/bookkeeping.py.
# Frozen here, never imported from store: these tests check that files written by that code keep working.
FORMAT_1_SCHEMA = """
CREATE TABLE IF NOT EXISTS remotes (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS shards (
    id INTEGER PRIMARY KEY,
    remote_id INTEGER NOT NULL REFERENCES remotes (id),
    folder TEXT NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'pushed', 'fetched', 'imported')),
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    revision TEXT,
    updated_at TEXT NOT NULL,
    UNIQUE (remote_id, folder, name)
);
CREATE TABLE IF NOT EXISTS shard_keys (
    input_hash TEXT NOT NULL,
    shard_id INTEGER NOT NULL REFERENCES shards (id) ON DELETE CASCADE,
    PRIMARY KEY (input_hash, shard_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_shard_keys_shard_id ON shard_keys (shard_id);
"""


class Sleeps(list[float]):
    """A sleep function that records how long it was asked to wait, and does not wait."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def hub_remote(hub: FakeHub, sleep: Callable[[float], None] | None = None, **kwargs: Any) -> HubRemote:
    kwargs.setdefault("token", WRITE_TOKEN)
    kwargs.setdefault("retry", FAST)
    return HubRemote(REPO, endpoint=hub.endpoint, sleep=(lambda _: None) if sleep is None else sleep, **kwargs)


class RemoteSide:
    """The remote as a test sees it: fresh clients for it, its files, and a way to edit them behind its back."""

    def __init__(self, kind: str, folder: Path, hub: FakeHub | None) -> None:
        self.kind, self.folder, self.hub = kind, folder, hub

    def new(self, **kwargs: Any) -> Remote:
        """A fresh client; ``kwargs`` configure a Hub remote (retry policy, sleep) and are ignored for a folder."""
        if self.hub is not None:
            return hub_remote(self.hub, **kwargs)
        return DirectoryRemote(self.folder)

    def files(self) -> dict[str, bytes]:
        if self.hub is not None:
            return {p: d for p, d in self.hub.files(REPO).items() if p != ".gitattributes"}
        return {
            p.relative_to(self.folder).as_posix(): p.read_bytes()
            for p in sorted(self.folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }

    def shard_paths(self, folder: str) -> list[str]:
        return sorted(p for p in self.files() if p.startswith(f"{folder}/shards/"))

    def write_raw(self, path: str, data: bytes | None) -> None:
        """Put (or with None remove) bytes at ``path``, bypassing every check."""
        if self.hub is not None:
            self.hub.put_raw(REPO, {path: data})
            return
        target = self.folder / path
        if data is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def commits(self) -> int | None:
        return None if self.hub is None else len(self.hub.commits(REPO))


def fill(store: Store, completions: Sequence[Record] = (), judgements: Sequence[Record] = ()) -> None:
    """Completions of QWEN on mt-bench and judgements of JUDGE on arena-hard."""
    if completions:
        store.database("completions", "mt-bench", QWEN).put_many(completions)
    if judgements:
        store.database("judgements", "arena-hard", JUDGE).put_many(judgements)


def rows(store: Store) -> dict[tuple[Location, str], Record]:
    """Every row of every database of a store, by (location, key)."""
    found: dict[tuple[Location, str], Record] = {}
    for location in walk(store.root):
        for record in store.open(location).query():
            found[(location, record.input_hash)] = record
    return found


def completions(ids: range | list[int], **overrides: Any) -> list[Record]:
    return [completion_record(i, **overrides) for i in ids]


def judgements(ids: range | list[int], **overrides: Any) -> list[Record]:
    return [judgement_record(i, **overrides) for i in ids]


def sync_state(store: Store) -> tuple[bytes, list[tuple[object, ...]]]:
    """The bookkeeping file's bytes and every row of its tables."""
    path = bookkeeping_path(store.root)
    with closing(sqlite3.connect(path)) as conn:
        tables = ("remotes", "shards", "shard_keys")
        content = [row for table in tables for row in conn.execute(f"SELECT '{table}', * FROM {table} ORDER BY 2, 3")]
    return path.read_bytes(), content
