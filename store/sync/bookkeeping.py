"""What this store root has shared: the shards pushed to and fetched from each remote, and their keys.

Contract:

* One small SQLite file per store root, ``{root}/.judgestore-sync/sync.db``,
  beside the descriptor databases and never inside them: their schema (and
  Alembic's view of it) stays exactly the models', and a descriptor folder can
  be copied, upgraded or deleted without sync state riding along.
* Its tables are the SQLAlchemy Core tables of :data:`metadata`. Its format is
  the number in ``PRAGMA user_version`` (0: a new, empty file). Opening applies
  the steps of :data:`MIGRATIONS` that the file lacks, in order, in one
  ``BEGIN IMMEDIATE`` transaction: a file is upgraded completely or not at
  all, and two processes opening it at once upgrade it once. A file of a newer
  format, or a non-empty file with no format (not ours), is refused with a
  :class:`~store.errors.BookkeepingError` and left untouched. Format 1 is
  the schema the first sharing release wrote, frozen in its step; format 2
  adds ``shards.on_default``.
* The file is opened by :func:`store.backends.sqlite.connections.create_sqlite_engine`, always
  with SQLite's rollback journal (safe on network filesystems, where store
  roots of clusters often live), the store's busy timeout, and
  ``BEGIN IMMEDIATE`` writes. A transaction that stays locked past the busy
  timeout is retried by :func:`store.backends.sqlite.errors.retry_while_locked`, the same
  retry the descriptor databases use.
* Every SQLite error is raised as a :class:`~store.errors.BookkeepingError`
  naming the file and what to do.
* A shard is recorded per (remote, descriptor folder, shard name) with a
  state: ``pending`` (built and about to be committed by a push), ``pushed``
  (the remote confirmed it), ``fetched`` (validated; its rows are being
  imported) or ``imported``. Its keys (input hashes) are recorded with it.
* ``on_default`` says whether the shard is known to be on the repository's
  default branch (``main``; a folder has no other): 1 once a push to that
  branch confirmed it, a fetch from that branch took it, or that branch's
  listing showed it; 0 for a shard fetched at another branch, tag or commit,
  pushed to another branch, or pending. It only ever goes from 0 to 1 (a
  branch is append-only). Files of format 1 did not record where a shard was
  fetched: their fetched Hub shards start at 0, and the first push to
  ``main`` that needs them asks ``main``'s listing, which settles them.
* A key is *known to a remote* once it is in a pushed, fetched or imported
  shard of that remote. Push sends only keys not known to the remote, so a
  fetched row is never echoed back, and a row another pusher sent is never
  sent again by whoever fetched it. Knowledge is per remote: a row fetched
  from one remote can still be pushed to another (mirroring). Whichever
  branch, tag or commit a fetch took a shard at, it is recorded under the
  repository (a later fetch of the same shard at another revision skips it);
  a push to the default branch counts a key as held there only through a
  shard with ``on_default`` (``unknown_keys(..., on_default=True)``) and asks
  the branch's listing about the rest (:func:`store.sync.push.push`). A push to a
  branch that is not the repository's default records under
  ``{repository}@{branch}`` and lets a recorded shard of the repository or the
  branch vouch for its keys only if the branch lists it
  (:func:`store.sync.push.push`). A remote is recorded (``remotes``) with the
  first shard shared with it, never by a push or fetch that failed or a dry
  run: :meth:`Bookkeeping.find_remote` only reads. Keys are looked
  up as the repository looks them up: ``json_each`` over batches of
  :data:`~store.backends.sqlite.rows.LOOKUP_BATCH`.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
from sqlalchemy import (
    CheckConstraint,
    Column,
    Connection,
    ForeignKey,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    delete,
    exists,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from store.backends.sqlite.connections import apply_journal_mode, create_sqlite_engine
from store.backends.sqlite.errors import retry_while_locked, translated
from store.backends.sqlite.rows import LOOKUP_BATCH, json_each_keys
from store.errors import (
    UPGRADE_JUDGESTORE,
    BookkeepingError,
    DatabaseBusyError,
    StoreFullError,
    StoreNotWritableError,
)
from store.settings import Settings, from_environment
from store.sync.workspace import workspace
from store.tables.models import NAMING_CONVENTION

T = TypeVar("T")
BOOKKEEPING_FILE = "sync.db"
_START_AFRESH = (
    "move it away and fetch again (a fetch re-imports idempotently; a push may then re-send rows, which is harmless)"
)


class ShardState(enum.StrEnum):
    PENDING = "pending"
    PUSHED = "pushed"
    FETCHED = "fetched"
    IMPORTED = "imported"


KNOWN_STATES = (ShardState.PUSHED, ShardState.FETCHED, ShardState.IMPORTED)

# ------------------------------------------------------------ tables

# Indexes are named by the store's convention (format 1's one index already follows it); its
# constraints are unnamed in format 1, so the other conventions are left out and the tables
# describe the file as it lies on disk.
metadata = MetaData(naming_convention={"ix": NAMING_CONVENTION["ix"]})

remotes_table = Table(
    "remotes",
    metadata,
    Column("id", Integer, primary_key=True, nullable=True),  # a rowid alias, declared as format 1 declares it
    Column("url", Text, nullable=False, unique=True),
)

shards_table = Table(
    "shards",
    metadata,
    Column("id", Integer, primary_key=True, nullable=True),
    Column("remote_id", Integer, ForeignKey("remotes.id"), nullable=False),
    Column("folder", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("rows", Integer, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("revision", Text),
    Column("updated_at", Text, nullable=False),  # ISO 8601 with its UTC offset, as format 1 stores it
    # Format 2: whether the default branch is known to hold the shard (see the module docstring).
    Column("on_default", Integer, nullable=False, server_default=text("0")),
    CheckConstraint(f"state IN ({', '.join(repr(s.value) for s in ShardState)})"),
    UniqueConstraint("remote_id", "folder", "name"),
    CheckConstraint("on_default IN (0, 1)"),
)

shard_keys_table = Table(
    "shard_keys",
    metadata,
    Column("input_hash", Text, primary_key=True),
    Column("shard_id", Integer, ForeignKey("shards.id", ondelete="CASCADE"), primary_key=True, index=True),
    sqlite_with_rowid=False,
)

# ------------------------------------------------------------ formats

_FORMAT_1_DDL = (
    """CREATE TABLE remotes (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE
)""",
    """CREATE TABLE shards (
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
)""",
    """CREATE TABLE shard_keys (
    input_hash TEXT NOT NULL,
    shard_id INTEGER NOT NULL REFERENCES shards (id) ON DELETE CASCADE,
    PRIMARY KEY (input_hash, shard_id)
) WITHOUT ROWID""",
    "CREATE INDEX ix_shard_keys_shard_id ON shard_keys (shard_id)",
)


def _format_1(conn: Connection) -> None:
    """Format 1: remotes, shards and their keys (the first sharing release).

    What changes: creates the three tables and the index of shard_keys by shard on a new file.
    Why: the bookkeeping's first schema. Data impact: none, the file is empty. Cost: instant.
    The statements are those that release wrote (its files hold exactly this schema); never
    edit them: a change to the tables is a new step.
    """
    for statement in _FORMAT_1_DDL:
        conn.exec_driver_sql(statement)


def _format_2(conn: Connection) -> None:
    """Format 2: ``shards.on_default``, whether the repository's default branch is known to hold the shard.

    What changes: adds the column (0 by default) and sets it to 1 where format 1's rows tell: every shard of a
    folder remote (it has no other branch) and every shard confirmed by a push recorded under a repository's own
    name (pushes to another branch are recorded under ``{repository}@{branch}``). Why: format 1 recorded a fetch
    under the repository whichever branch, tag or commit it was made at, so a row fetched from a branch was
    never pushed to ``main``. Data impact: the fetched shards of a Hub repository start at 0 (unknown): the first
    push to ``main`` that needs one asks ``main``'s listing and sets what it shows, so no row is dropped and a
    folder is asked about again only while it holds rows no shard on ``main`` holds. Cost: one pass over the
    shards (no keys are touched). Never edit it: a change is a new step.
    """
    conn.exec_driver_sql(
        "ALTER TABLE shards ADD COLUMN on_default INTEGER NOT NULL DEFAULT 0 CHECK (on_default IN (0, 1))"
    )
    conn.exec_driver_sql(
        "UPDATE shards SET on_default = 1 WHERE remote_id IN (SELECT id FROM remotes WHERE url LIKE 'dir:%')"
        " OR (state = 'pushed' AND remote_id IN (SELECT id FROM remotes WHERE instr(url, '@') = 0))"
    )


Migration = Callable[[Connection], None]
MIGRATIONS: tuple[Migration, ...] = (_format_1, _format_2)
"""``MIGRATIONS[n - 1]`` takes a file from format ``n - 1`` to ``n``; the last format is this library's."""

# ------------------------------------------------------------ records


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


# ------------------------------------------------------------ statements (built once)


def _names_in(param: str) -> Any:
    """Shards whose name is in the JSON array bound to ``param``."""
    names = func.json_each(bindparam(param, type_=String)).table_valued("value")
    return shards_table.c.name.in_(select(names.c.value))


def _unknown_keys_statement(*, among_names: bool = False, on_default: bool = False) -> Select[Any]:
    """Keys (the JSON array ``keys``) in no known shard of the remotes ``remote_ids`` in ``folder``; with
    ``among_names``, only the shards named in the JSON array ``names`` count as known; with ``on_default``, only
    the shards known to be on the default branch."""
    keys = json_each_keys()
    # ``+remote_id`` keeps SQLite off the (remote_id, folder, name) index: with it, the planner walked every shard of
    # the folder for each key (keys x shards); without, each key is found by shard_keys' primary key first.
    remote_id = UnaryExpression(shards_table.c.remote_id, operator=operators.custom_op("+"), type_=Integer)
    known = [
        shard_keys_table.c.input_hash == keys.c.value,
        shards_table.c.id == shard_keys_table.c.shard_id,
        remote_id.in_(bindparam("remote_ids", expanding=True)),
        shards_table.c.folder == bindparam("folder"),
        shards_table.c.state.in_([s.value for s in KNOWN_STATES]),
    ]
    if among_names:
        known.append(_names_in("names"))
    if on_default:
        known.append(shards_table.c.on_default == 1)
    return select(keys.c.value).where(~exists().where(*known)).order_by(keys.c.key)


_UNKNOWN_KEYS = _unknown_keys_statement()
_UNKNOWN_KEYS_AMONG = _unknown_keys_statement(among_names=True)
_UNKNOWN_KEYS_ON_DEFAULT = _unknown_keys_statement(on_default=True)
_INSERT_REMOTE = insert(remotes_table).on_conflict_do_nothing()
_INSERT_SHARD = insert(shards_table).on_conflict_do_nothing()
_INSERT_KEY = insert(shard_keys_table).on_conflict_do_nothing()
_THIS_SHARD = (
    shards_table.c.remote_id == bindparam("b_remote_id"),
    shards_table.c.folder == bindparam("b_folder"),
    shards_table.c.name == bindparam("b_name"),
)
_SET_STATE = (
    update(shards_table)
    .where(*_THIS_SHARD)
    .values(
        state=bindparam("b_state"),
        revision=func.coalesce(bindparam("b_revision", type_=Text), shards_table.c.revision),
        # Only ever from 0 to 1: what the default branch held, it holds (a fetch at a tag does not undo a push).
        on_default=func.max(shards_table.c.on_default, bindparam("b_on_default", type_=Integer)),
        updated_at=bindparam("b_updated_at"),
    )
)
_FORGET = delete(shards_table).where(*_THIS_SHARD)
_OFF_DEFAULT = (
    shards_table.c.remote_id == bindparam("b_remote_id"),
    shards_table.c.folder == bindparam("b_folder"),
    shards_table.c.on_default == 0,
    _names_in("b_names"),
)
_COUNT_OFF_DEFAULT = select(func.count()).select_from(shards_table).where(*_OFF_DEFAULT)
_MARK_ON_DEFAULT = update(shards_table).where(*_OFF_DEFAULT).values(on_default=1)


class Bookkeeping:
    """The bookkeeping database of one store root (see the module docstring).

    ``settings`` gives the busy timeout and lock retries (default: read from the environment);
    its journal policy is not used, the bookkeeping always uses the rollback journal.
    """

    def __init__(self, root: Path, *, settings: Settings | None = None) -> None:
        self.path = bookkeeping_path(root)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.settings = (settings or from_environment(Settings)).model_copy(update={"journal_policy": "rollback"})
        self._engine = create_sqlite_engine(self.path, self.settings)
        try:
            self._run(self._upgrade, write=True)
            with self._translated():
                apply_journal_mode(self._engine)  # only now: a refused file is left as it was
        except BaseException:
            self._engine.dispose()
            raise

    def __enter__(self) -> Bookkeeping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    def _run(self, work: Callable[[Connection], T], *, write: bool = False) -> T:
        """``work`` in one transaction (``BEGIN IMMEDIATE`` if ``write``), retried while the file stays locked."""

        def attempt() -> T:
            with self._engine.connect() as conn, conn.execution_options(write=write).begin():
                return work(conn)

        with self._translated():
            return retry_while_locked(attempt, self.path, self.settings)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except DatabaseBusyError as e:
            raise BookkeepingError(str(e)) from e  # it names the file and the settings to raise
        except (DBAPIError, sqlite3.Error) as e:
            typed = translated(self.path, e)
            if isinstance(typed, StoreFullError | StoreNotWritableError):  # the disk, not the file: keep the file
                raise typed from e
            cause = e.orig if isinstance(e, DBAPIError) else e
            raise BookkeepingError(
                f"{self.path}: the sync bookkeeping database cannot be used ({cause}); {_START_AFRESH}"
            ) from e

    def _upgrade(self, conn: Connection) -> None:
        """Bring the file to this library's format (see the module docstring); runs in the open's write transaction."""
        found = int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
        latest = len(MIGRATIONS)
        if found == latest:
            return
        if found > latest:
            raise BookkeepingError(
                f"{self.path}: sync bookkeeping format {found} is newer than this library's "
                f"{latest}; {UPGRADE_JUDGESTORE}"
            )
        if found == 0 and conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar_one():
            raise BookkeepingError(
                f"{self.path}: not a judgestore sync bookkeeping database (it holds tables but no "
                f"bookkeeping format); {_START_AFRESH}"
            )
        for migration in MIGRATIONS[found:]:
            migration(conn)
        conn.exec_driver_sql(f"PRAGMA user_version = {latest}")

    # ------------------------------------------------------------ reads

    def find_remote(self, url: str) -> int | None:
        """The id of ``url`` if the remote is recorded here, else None; records nothing."""
        stmt = select(remotes_table.c.id).where(remotes_table.c.url == url)
        found = self._run(lambda conn: conn.execute(stmt).scalar_one_or_none())
        return None if found is None else int(found)

    def remote_id(self, url: str) -> int:
        """The id of ``url``, recording the remote if it is new: call it only to record what was shared with it
        (a remote that failed, a 404, a dry run must leave no trace here)."""

        def work(conn: Connection) -> int:
            conn.execute(_INSERT_REMOTE, {"url": url})
            return int(conn.execute(select(remotes_table.c.id).where(remotes_table.c.url == url)).scalar_one())

        return self._run(work, write=True)

    def unknown_keys(
        self,
        remote_ids: Sequence[int],
        folder: str,
        keys: Sequence[str],
        *,
        among: Collection[str] | None = None,
        on_default: bool = False,
    ) -> list[str]:
        """The keys among ``keys`` that none of the remotes ``remote_ids`` is known to have (order kept).

        With ``among`` (shard names), a key is known only through a recorded shard of that name: the caller
        listed which shards the remote really holds, and a recorded shard that is not among them proves nothing.
        With ``on_default``, a key is known only through a shard known to be on the default branch (pushed
        there, fetched from it, or seen in its listing): a shard fetched at another revision proves nothing.
        """
        if among is not None and on_default:
            raise ValueError("unknown_keys: give a listing (among) or on_default, not both")
        statement = (
            _UNKNOWN_KEYS_AMONG if among is not None else _UNKNOWN_KEYS_ON_DEFAULT if on_default else _UNKNOWN_KEYS
        )
        names = {} if among is None else {"names": orjson.dumps(sorted(among)).decode()}

        def work(conn: Connection) -> list[str]:
            unknown: list[str] = []
            for start in range(0, len(keys), LOOKUP_BATCH):
                chunk = orjson.dumps(list(keys[start : start + LOOKUP_BATCH])).decode()
                params = {"keys": chunk, "remote_ids": list(remote_ids), "folder": folder, **names}
                unknown += conn.execute(statement, params).scalars().all()
            return unknown

        return self._run(work)

    def states(self, remote_id: int, folder: str) -> dict[str, ShardState]:
        """Every recorded shard of a folder and its state."""
        c = shards_table.c
        stmt = select(c.name, c.state).where(c.remote_id == remote_id, c.folder == folder)
        rows = self._run(lambda conn: conn.execute(stmt).all())
        return {name: ShardState(state) for name, state in rows}

    def shards(self, remote_id: int, state: ShardState | None = None) -> list[ShardEntry]:
        c = shards_table.c
        stmt = select(c.folder, c.name, c.state, c.rows, c.bytes).where(c.remote_id == remote_id)
        if state is not None:
            stmt = stmt.where(c.state == state.value)
        rows = self._run(lambda conn: conn.execute(stmt.order_by(c.folder, c.name)).all())
        return [ShardEntry(folder, name, ShardState(s), n, size) for folder, name, s, n, size in rows]

    # ------------------------------------------------------------ writes

    def record(
        self,
        remote_id: int,
        state: ShardState,
        shards: Iterable[NewShard],
        revision: str | None = None,
        *,
        on_default: bool = False,
    ) -> None:
        """Record shards with their keys in one transaction; a shard already recorded moves to ``state``.

        ``on_default``: the default branch holds them (fetched from it); a shard already known to be there stays so.
        """
        entries = list(shards)  # a retry runs the transaction again, so an iterator must not be spent by the first

        def work(conn: Connection) -> None:
            for shard in entries:
                row = {
                    "remote_id": remote_id,
                    "folder": shard.folder,
                    "name": shard.name,
                    "state": state.value,
                    "rows": shard.rows,
                    "bytes": shard.size,
                    "revision": revision,
                    "updated_at": _now(),
                    "on_default": int(on_default),
                }
                result = conn.execute(_INSERT_SHARD, row)
                if result.rowcount:
                    shard_id = result.lastrowid
                    if shard.keys:
                        conn.execute(_INSERT_KEY, [{"input_hash": key, "shard_id": shard_id} for key in shard.keys])
                else:
                    self._set_state(conn, remote_id, [(shard.folder, shard.name)], state, revision, on_default)

        self._run(work, write=True)

    def set_state(
        self,
        remote_id: int,
        shards: Iterable[tuple[str, str]],
        state: ShardState,
        revision: str | None = None,
        *,
        on_default: bool = False,
    ) -> None:
        """Move recorded shards, given as (folder, name), to ``state`` in one transaction; with ``on_default``,
        record that the default branch holds them (a push to it confirmed them)."""
        names = list(shards)
        self._run(lambda conn: self._set_state(conn, remote_id, names, state, revision, on_default), write=True)

    @staticmethod
    def _set_state(
        conn: Connection,
        remote_id: int,
        shards: Sequence[tuple[str, str]],
        state: ShardState,
        revision: str | None,
        on_default: bool = False,
    ) -> None:
        now = _now()
        params = [
            {
                "b_remote_id": remote_id,
                "b_folder": folder,
                "b_name": name,
                "b_state": state.value,
                "b_revision": revision,
                "b_on_default": int(on_default),
                "b_updated_at": now,
            }
            for folder, name in shards
        ]
        if params:
            conn.execute(_SET_STATE, params)

    def forget(self, remote_id: int, shards: Iterable[tuple[str, str]]) -> None:
        """Drop shards, given as (folder, name), and their keys: pending ones that never reached the remote."""
        params: list[dict[str, Any]] = [
            {"b_remote_id": remote_id, "b_folder": folder, "b_name": name} for folder, name in shards
        ]
        if params:
            self._run(lambda conn: conn.execute(_FORGET, params), write=True)

    def mark_on_default(self, remote_id: int, folder: str, names: Collection[str]) -> int:
        """Record that the default branch holds the recorded shards of ``folder`` named in ``names`` (its listing
        showed them); returns how many were not known to be there. Names that are not recorded are ignored, so an
        untrusted listing cannot add anything. Reads first: it writes only when something changes."""
        params = {"b_remote_id": remote_id, "b_folder": folder, "b_names": orjson.dumps(sorted(names)).decode()}
        if not names or not self._run(lambda conn: int(conn.execute(_COUNT_OFF_DEFAULT, params).scalar_one())):
            return 0
        return self._run(lambda conn: int(conn.execute(_MARK_ON_DEFAULT, params).rowcount), write=True)
