"""What this store root has shared: the shards pushed to and fetched from each remote, and their keys.

Contract:

* One small SQLite file per store root, ``{root}/.judgestore-sync/sync.db``,
  beside the descriptor databases and never inside them: their schema (and
  Alembic's view of it) stays exactly the models', and a descriptor folder can
  be copied, upgraded or deleted without sync state riding along. Its own
  tiny schema is created with ``CREATE TABLE IF NOT EXISTS`` and versioned by
  ``PRAGMA user_version``; a file from a newer judgestore is refused.
* A shard is recorded per (remote, descriptor folder, shard name) with a
  state: ``pending`` (built and about to be committed by a push), ``pushed``
  (the remote confirmed it), ``fetched`` (validated; its rows are being
  imported) or ``imported``. Its keys (input hashes) are recorded with it.
* A key is *known to a remote* once it is in a pushed, fetched or imported
  shard of that remote. Push sends only keys not known to the remote, so a
  fetched row is never echoed back, and a row another pusher sent is never
  sent again by whoever fetched it. Knowledge is per remote: a row fetched
  from one remote can still be pushed to another (mirroring).
* The file uses SQLite's rollback journal (safe on network filesystems, where
  store roots of clusters often live) and ``BEGIN IMMEDIATE`` writes.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from store.errors import BookkeepingError
from store.sync.workspace import workspace

BOOKKEEPING_FILE = "sync.db"
FORMAT_VERSION = 1
LOOKUP_BATCH = 20_000
BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
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


class ShardState(enum.StrEnum):
    PENDING = "pending"
    PUSHED = "pushed"
    FETCHED = "fetched"
    IMPORTED = "imported"


KNOWN_STATES = (ShardState.PUSHED, ShardState.FETCHED, ShardState.IMPORTED)


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One recorded shard."""

    folder: str
    name: str
    state: ShardState
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class NewShard:
    """A shard to record: where it lies, its name, size and keys."""

    folder: str
    name: str
    rows: int
    size: int
    keys: Sequence[str]


def bookkeeping_path(root: Path) -> Path:
    return workspace(root) / BOOKKEEPING_FILE


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Bookkeeping:
    """The bookkeeping database of one store root (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.path = bookkeeping_path(root)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.execute("PRAGMA foreign_keys = ON")
        try:
            self._ensure_schema()
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> Bookkeeping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _ensure_schema(self) -> None:
        try:
            with self._write() as conn:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > FORMAT_VERSION:
                    raise BookkeepingError(
                        f"{self.path}: sync bookkeeping format {version} is newer than this library's "
                        f"{FORMAT_VERSION}; upgrade judgestore (`pip install -U judgestore`)"
                    )
                if version < FORMAT_VERSION:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
        except sqlite3.DatabaseError as e:
            raise BookkeepingError(
                f"{self.path}: the sync bookkeeping database cannot be used ({e}); move it away and fetch again "
                "(a fetch re-imports idempotently; a push may then re-send rows, which is harmless)"
            ) from e

    # ------------------------------------------------------------ reads

    def remote_id(self, url: str) -> int:
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO remotes (url) VALUES (?)", (url,))
            return int(conn.execute("SELECT id FROM remotes WHERE url = ?", (url,)).fetchone()[0])

    def unknown_keys(self, remote_id: int, folder: str, keys: Sequence[str]) -> list[str]:
        """The keys among ``keys`` that the remote is not known to have (order kept)."""
        unknown: list[str] = []
        states = ",".join(f"'{s.value}'" for s in KNOWN_STATES)
        sql = (
            "SELECT j.value FROM json_each(?) AS j WHERE NOT EXISTS ("
            " SELECT 1 FROM shard_keys AS k JOIN shards AS s ON s.id = k.shard_id"
            f" WHERE k.input_hash = j.value AND s.remote_id = ? AND s.folder = ? AND s.state IN ({states}))"
            " ORDER BY j.key"
        )
        for start in range(0, len(keys), LOOKUP_BATCH):
            chunk = orjson.dumps(list(keys[start : start + LOOKUP_BATCH])).decode()
            unknown += [row[0] for row in self._conn.execute(sql, (chunk, remote_id, folder))]
        return unknown

    def states(self, remote_id: int, folder: str) -> dict[str, ShardState]:
        """Every recorded shard of a folder and its state."""
        rows = self._conn.execute(
            "SELECT name, state FROM shards WHERE remote_id = ? AND folder = ?", (remote_id, folder)
        )
        return {name: ShardState(state) for name, state in rows}

    def shards(self, remote_id: int, state: ShardState | None = None) -> list[ShardEntry]:
        sql = "SELECT folder, name, state, rows, bytes FROM shards WHERE remote_id = ?"
        params: tuple[object, ...] = (remote_id,)
        if state is not None:
            sql += " AND state = ?"
            params += (state.value,)
        rows = self._conn.execute(sql + " ORDER BY folder, name", params)
        return [ShardEntry(folder, name, ShardState(s), n, size) for folder, name, s, n, size in rows]

    # ------------------------------------------------------------ writes

    def record(
        self, remote_id: int, state: ShardState, shards: Iterable[NewShard], revision: str | None = None
    ) -> None:
        """Record shards with their keys in one transaction; a shard already recorded moves to ``state``."""
        with self._write() as conn:
            for shard in shards:
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO shards (remote_id, folder, name, state, rows, bytes, revision, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (remote_id, shard.folder, shard.name, state.value, shard.rows, shard.size, revision, _now()),
                )
                if cursor.rowcount:
                    shard_id = cursor.lastrowid
                    conn.executemany(
                        "INSERT OR IGNORE INTO shard_keys (input_hash, shard_id) VALUES (?, ?)",
                        ((key, shard_id) for key in shard.keys),
                    )
                else:
                    self._set_state(conn, remote_id, [(shard.folder, shard.name)], state, revision)

    def set_state(
        self,
        remote_id: int,
        shards: Iterable[tuple[str, str]],
        state: ShardState,
        revision: str | None = None,
    ) -> None:
        """Move recorded shards, given as (folder, name), to ``state`` in one transaction."""
        with self._write() as conn:
            self._set_state(conn, remote_id, shards, state, revision)

    @staticmethod
    def _set_state(
        conn: sqlite3.Connection,
        remote_id: int,
        shards: Iterable[tuple[str, str]],
        state: ShardState,
        revision: str | None,
    ) -> None:
        conn.executemany(
            "UPDATE shards SET state = ?, revision = coalesce(?, revision), updated_at = ?"
            " WHERE remote_id = ? AND folder = ? AND name = ?",
            ((state.value, revision, _now(), remote_id, folder, name) for folder, name in shards),
        )

    def forget(self, remote_id: int, shards: Iterable[tuple[str, str]]) -> None:
        """Drop shards, given as (folder, name), and their keys: pending ones that never reached the remote."""
        with self._write() as conn:
            conn.executemany(
                "DELETE FROM shards WHERE remote_id = ? AND folder = ? AND name = ?",
                ((remote_id, folder, name) for folder, name in shards),
            )
