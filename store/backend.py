"""The seam between the store and what holds its databases: a :class:`Storage` of :class:`Database` s.

Contract:

* A :class:`Storage` is the descriptor databases of one store: a folder of
  SQLite files (:class:`~store.backends.sqlite.storage.SqliteStorage`) or a
  database on a PostgreSQL server, one schema per descriptor
  (:class:`~store.backends.postgres.storage.PostgresStorage`). Both do
  everything below with the same typed errors and the same reports
  (:mod:`store.reports`); what is above the seam (:class:`~store.store.Store`,
  copy, stats, prune, export, adoption, the command line) never branches on
  a dialect and never touches a root folder or a URL.
* A :class:`Database` is one descriptor database:
  :meth:`~Database.get_many` (``input_text`` deferred, :mod:`store.tables.deferred`),
  :meth:`~Database.put_many`,
  :meth:`~Database.delete`, :meth:`~Database.count` and
  :meth:`~Database.query`, each in a transaction of its own, the writes
  retried as a whole unit when the backend says the attempt may simply run
  again (a lock held too long, a serialisation failure, a dropped
  connection); or :meth:`~Database.transaction` / :meth:`~Database.reading`
  for several statements in one transaction, through the backend's
  :class:`~store.repository.Repository`; or :meth:`~Database.session`, an
  ORM ``Session`` on this database alone (the full ORM: a migration
  script's updates, or reads of one database). Every failure is raised as a typed
  error naming the database (``where``) and the next step. A read-only
  database refuses every write before touching anything.
* :meth:`Storage.read_across` is each backend's one read path across
  databases (``Store.scalars``/``Store.execute``, :mod:`store.across`): the
  rows of a planned statement over several databases as on one table
  holding all their rows, each with the index of the database it came from.
* :meth:`Database.claims` runs the statements of the shared batches' work
  queue (:mod:`store.claims`) in one transaction, a write retried as a
  whole like the writes above.
* A backend's :class:`Database` says how to connect, retry, translate a
  failure and build its repository (whose two hot statements, the bulk
  lookup and the insert, are the backend's own) and its claims table (its
  clock, key lists and row locking); the transactions above are written
  once, here.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import Connection, Row, Select
from sqlalchemy.orm import Session

from store import schema
from store.errors import (
    DamagedValueError,
    DatabaseFileError,
    EmptyFilterError,
    InvalidInputError,
    MatchedMeanwhileError,
    SchemaError,
)
from store.layout import Location, Selector, StoredMetadata
from store.reports import DatabaseInfo, DatabaseVerification, Problem, UpgradeResult, VacuumResult
from store.repository import Repository
from store.role_session import OneRoleSession
from store.settings import Settings
from store.tables.deferred import DeferredColumns
from store.tables.filters import ColumnValues, RowFilter
from store.tables.records import Record
from store.tables.row_checks import OnConflict, gc_paused, journaled_bytes, listed_records, lookup_keys

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

    from store.across.plan import AcrossRows, Plan
    from store.claim_table import ClaimTable

T = TypeVar("T")
RECHECK_SECONDS = 1.0  # how often a database kept open asks whether it left this library's revision


def changed_under(where: str, how: str) -> SchemaError:
    """The error of a write refused because another process moved its database to another revision (``how``)
    since this handle opened it (:meth:`Database._left_behind`)."""
    return SchemaError(
        where,
        f"changed under this process since it was opened: {how}; nothing was written. Open the store again (a "
        "newer revision needs a newer judgestore)",
    )


class Database(ABC):
    """One descriptor database (see the module docstring); built by its storage, never directly."""

    location: Location
    where: str  # how messages name it: a file's path, or a server's schema
    settings: Settings
    readonly: bool

    @property
    def role(self) -> str:
        return self.location.role

    # ------------------------------------------------------------ what a backend says

    @abstractmethod
    def _connect(self, *, write: bool) -> AbstractContextManager[Connection]:
        """A connection inside a transaction that commits on success (a writer's when ``write``)."""

    @abstractmethod
    def _repository(self, conn: Connection) -> Repository:
        """The backend's repository of this database's table on ``conn``."""

    @abstractmethod
    def _claim_table(self, conn: Connection) -> ClaimTable:
        """The backend's claims statements (:mod:`store.claims`) on ``conn``."""

    @abstractmethod
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> AbstractContextManager[None]:
        """Raise every driver or filesystem failure as its typed error (``needed_bytes()`` sizes a full disk's)."""

    @abstractmethod
    def _retry(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` again after a failure that a second attempt may not meet."""

    def _stable(self, attempt: Callable[[], T]) -> T:
        """Run a read; a backend may run it again if what it read changed under it."""
        return attempt()

    @abstractmethod
    def metadata(self) -> StoredMetadata:
        """What the descriptor folder's metadata.json (or a server's registry) records."""

    @abstractmethod
    def size_bytes(self) -> int:
        """Bytes it takes on disk (or on the server)."""

    def stamp(self) -> object | None:
        """A value equal between two calls while nothing was written in between, or None when the backend cannot
        tell that cheaply (callers then keep what they derived for a while instead)."""
        return None

    def damage(self) -> str | None:
        """What the backend's own consistency check finds wrong with the stored data, or None.

        Reads every page (a copy's source is checked with it: a damaged index would hide rows from the rows it
        streams). None on a server, which keeps its own files consistent.
        """
        return None

    def close(self) -> None:  # noqa: B027 (a backend with nothing to release keeps this one)
        """Release what this database holds open."""

    # ------------------------------------------------------------ transactions

    def _check_writable(self) -> None:
        """Refuse a write this handle cannot make: a read-only handle's, or one to a database that left this
        library's revision since it was opened (:meth:`_left_behind`)."""
        if self.readonly:
            raise DatabaseFileError(
                self.where, "was opened read-only: writes are refused (open the store without readonly)"
            )
        if (how := self._left_behind()) is not None:
            raise changed_under(self.where, how)

    def _left_behind(self) -> str | None:
        """How this handle's database is no longer the one it opened (None: it is). A long run keeps its handle:
        another process's upgrade by a newer judgestore would have it write rows the file's new revision may
        read otherwise. Asked before the write's transaction (SQLite: at most every :data:`RECHECK_SECONDS`); each
        backend asks again inside it, under the write lock an upgrade holds."""
        return None

    def _refuse_revision(self, found: list[str]) -> None:
        """Refuse a write whose database, read inside the write's transaction under the write lock an upgrade
        holds, is at revision(s) ``found``, not this library's head (each backend reads ``found`` its way)."""
        if found != [schema.revisions().head]:  # looked up when asked: a test may stand in other scripts
            raise changed_under(self.where, f"its revision is now {', '.join(found) or 'none'}")

    @contextmanager
    def transaction(self) -> Iterator[Repository]:
        """A write transaction: commits on success, rolls back on error."""
        self._check_writable()
        with self._translated(), self._connect(write=True) as conn:
            yield self._repository(conn)

    @contextmanager
    def reading(self) -> Iterator[Repository]:
        """A read transaction: one consistent snapshot for everything done inside it."""
        with self._translated(), self._connect(write=False) as conn:
            yield self._repository(conn)

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """An ORM ``Session`` on this database alone, in one transaction (read-only unless ``write``).

        For the full ORM on one database: relationships, ``session.get``,
        updates in a migration script (``write=True``: flushed and committed
        when the block ends, rolled back if it raises; a row of the other
        role's model is refused, :class:`InvalidInputError`). To read many
        databases at once, use ``Store.scalars``/``Store.execute``.
        """
        if write:
            self._check_writable()
        with self._translated(), self._connect(write=write) as conn:
            opened = (
                OneRoleSession(role=self.role, where=self.where, bind=conn)
                if write
                else Session(bind=conn, autoflush=False)
            )
            with opened as session:
                yield session
                if write:
                    session.flush()

    def stream(self, statement: Select[Any], batch: int) -> Iterator[Row[Any]]:
        """The rows of ``statement`` on this database, read ``batch`` at a time in one read transaction."""

        def rows(conn: Connection) -> Iterator[Row[Any]]:
            with Session(bind=conn, autoflush=False) as session:
                result = session.execute(statement, execution_options={"yield_per": batch})
                while True:
                    with gc_paused():  # a batch of ORM objects: the cyclic GC would rescan them (1.7x slower)
                        fetched = result.fetchmany(batch)
                    if not fetched:
                        return
                    yield from fetched

        return self._one_read(rows)

    def _one_read(self, rows: Callable[[Connection], Iterator[T]]) -> Iterator[T]:
        """What ``rows`` reads on a connection, streamed from one read transaction (one snapshot).

        A backend whose reads may take no locks re-reads or refuses what a writer changed under them (SQLite's
        read-only reads: :mod:`store.backends.sqlite.connections`).
        """
        with self._translated(), values_read(self.where), self._connect(write=False) as conn:
            yield from rows(conn)

    def _write(self, work: Callable[[Repository], T], needed_bytes: Callable[[], int] | None = None) -> T:
        self._check_writable()

        def attempt() -> T:
            with self._connect(write=True) as conn:
                return work(self._repository(conn))

        with self._translated(needed_bytes):
            return self._retry(attempt)

    def read(self, work: Callable[[Repository], T]) -> T:
        """``work`` in one read transaction (:meth:`reading`), run again whole if what it read changed under it (a
        folder store's read-only reads take no lock: a writer may start meanwhile): a read that returns whole, as a
        count or a database's statistics do, never fails for a writer's work."""

        def attempt() -> T:
            with self.reading() as repo:
                return work(repo)

        return self._stable(attempt)

    # ------------------------------------------------------------ rows

    def get_many(self, hashes: Iterable[str], *, deferred: bool = True) -> dict[str, Record]:
        """The rows stored under any of ``hashes``, keyed by input hash (missing keys are absent).

        ``deferred`` (the default, a cache's lookup): ``input_text`` and the row's bookkeeping are left out of the
        statement and each record reads them on first access, for every record of this call in one statement
        (:mod:`store.tables.deferred`); pass False where every record's prompt is wanted at once. A key that is
        not an input hash (64 lowercase hex characters) is an :class:`~store.errors.InvalidInputError`, before
        anything is read.
        """
        keys = lookup_keys(hashes)  # checked once, before a connection is opened
        lean = self._deferred_columns() if deferred else None
        with values_read(self.where):
            return self.read(lambda repo: repo._get_many(keys, lean))

    def _deferred_columns(self) -> DeferredColumns:
        """What a deferred lookup's records read their deferred columns through: this database, whole rows, later."""

        def load(keys: Sequence[str]) -> dict[str, Record]:
            return self.get_many(keys, deferred=False)

        return DeferredColumns(load, self.where)

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        rows = listed_records(records)
        return self._write(lambda repo: repo.put_many(rows, on_conflict), needed_bytes=lambda: journaled_bytes(rows))

    def delete(self, *filters: RowFilter, at_most: int | None = None) -> int:
        """Delete the rows matching any of ``filters`` in one write transaction; returns how many. No filter, or an
        empty one among them, is an :class:`EmptyFilterError`, and nothing is deleted. With ``at_most`` (what the
        caller counted and confirmed), more rows, or fewer but some, is a :class:`MatchedMeanwhileError`, and
        nothing is deleted: rows another process deleted meanwhile would hide as many it committed, which the
        caller never counted. None matching deletes nothing (a plan run again after it failed on a later database
        meets the ones it finished)."""
        if not filters or any(flt.is_empty() for flt in filters):  # before the transaction: nothing is written
            raise EmptyFilterError()

        def delete(repo: Repository) -> int:
            deleted = sum(repo.delete(flt) for flt in filters)
            if at_most is not None and deleted not in (0, at_most):  # raised inside the transaction: rolled back
                raise MatchedMeanwhileError(self.where, counted=at_most, matching=deleted)
            return deleted

        return self._write(delete)

    def count(self, flt: RowFilter | None = None) -> int:
        return self.read(lambda repo: repo.count(flt))

    def count_around(self, flt: RowFilter, moment: datetime) -> tuple[int, int]:
        """The rows ``flt`` matches dated before ``moment``, and at or after it (:meth:`Repository.count_around`)."""
        return self.read(lambda repo: repo.count_around(flt, moment))

    def query(self, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        """Stream matching rows; the read transaction stays open until the iterator is exhausted or closed.

        ``limit`` is a whole number >= 0 or None (every row), refused otherwise on both backends alike.
        """
        checked_limit(limit)
        return self._one_read(lambda conn: self._repository(conn).query(flt, limit=limit))

    # ------------------------------------------------------------ claims

    def claims(self, work: Callable[[ClaimTable], T], *, write: bool = True) -> T:
        """``work`` on the claims table (:mod:`store.claims`) in one transaction (a write, unless ``write=False``)."""
        if write:
            return self._write(lambda repo: work(self._claim_table(repo.conn)))
        return self.read(lambda repo: work(self._claim_table(repo.conn)))


@contextmanager
def values_read(where: str) -> Iterator[None]:
    """Rows decoded inside: a stored value its column's type cannot read (another tool wrote it: JSON that does not
    decode, a time that is none) is a :class:`~store.errors.DamagedValueError` naming the database, never a bare
    ``ValueError``; nothing was changed. Only those decoding errors: any other error (a bug) passes as it is."""
    try:
        yield
    except (ValueError, TypeError) as e:  # orjson's JSONDecodeError is json's, a ValueError
        if not unreadable_value(e):
            raise
        raise DamagedValueError.read(where, f"{type(e).__name__}: {e}") from e


def unreadable_value(error: Exception) -> bool:
    """Whether ``error`` is a column reader refusing a stored value (JSON that does not decode, a time that is none:
    text, or a number or bytes another tool wrote), not a bug."""
    return isinstance(error, json.JSONDecodeError) or str(error).startswith(_UNREADABLE_TIMES)


# What a time column's reader says of a value that is no time (datetime.fromisoformat, SQLAlchemy's SQLite DATETIME):
# text that does not parse, or a number or bytes (an integer Unix time another tool wrote: was a bare TypeError)
_UNREADABLE_TIMES = (
    "Invalid isoformat string",
    "Couldn't parse datetime string",
    "fromisoformat: argument must be str",
)


def checked_limit(limit: int | None) -> int | None:
    """A row limit as given, or :class:`InvalidInputError`: SQLite took -1 for "no limit" and 2.7 for 2, while
    PostgreSQL refused both."""
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidInputError(f"limit must be a whole number >= 0 (or None: every row), got {limit!r}")
    return limit


class Storage(Protocol):
    """The descriptor databases of one store (see the module docstring)."""

    where: str  # the store as messages name it: the root folder, or the URL without its password
    settings: Settings
    readonly: bool

    @property
    def local_root(self) -> Path:
        """Where this machine keeps the store's side files (sharing's workspace)."""

    def close(self) -> None:
        """Release every connection and open database."""

    def absence(self) -> str | None:
        """Why there is no store here at all (no such folder, no registry on the server), or None; creates nothing."""

    def overlaps(self, other: Storage) -> bool:
        """Whether ``other`` is this very store (the same database of the same server), or a folder store whose root
        is this one's or lies inside it or around it: writing one would write into the other."""

    def shown(self, where: str) -> str:
        """A database's ``where`` as a table shows it: under its root, or as it is."""

    def locations(self, selector: Selector | None = None) -> list[Location]:
        """Every descriptor database, in layout order; with ``selector``, at least those it picks (a folder store
        looks into no other folder)."""

    def narrowed(self, locations: Iterable[Location], flt: RowFilter) -> list[Location]:
        """The ``locations`` (in their order) whose databases may hold a row ``flt`` matches; never leaves out
        one that does, nor one it cannot tell about (opening it then says what is wrong)."""

    def column_values(self, locations: Iterable[Location]) -> dict[Location, ColumnValues | None]:
        """The distinct values of each database's :data:`~store.tables.filters.VALUE_COLUMNS`, as :meth:`narrowed`
        reads them (None: not known, for a database or a column)."""

    def remembered(
        self,
        locations: Iterable[Location],
        kind: str,
        compute: Callable[[Location], T],
        *,
        lasting: Callable[[T], bool] | None = None,
    ) -> Iterator[tuple[Location, T]]:
        """Each location with ``compute(location)``, a JSON value derived from its database, in their order; a
        backend that can tell cheaply that a database has not changed since it last computed ``kind`` gives back
        what it gave then (:mod:`store.catalog`), unless ``lasting(value)`` said that the value changes with the
        clock alone (a lease that passes its deadline). ``compute`` should not raise: an error ends the iteration."""

    def database(self, location: Location, metadata: Callable[[], bytes]) -> Database:
        """The database of ``location``; a read-write store creates it (recording ``metadata()``) if needed."""

    def check_writable(self, location: Location, *, as_a_writer: bool = False) -> None:
        """Raise what writing ``location`` would meet, where that is known without writing anything
        (``as_a_writer``: through a read-write open, this handle's being read-only aside)."""

    def open(self, location: Location) -> Database:
        """Open an existing database, verifying its metadata and its schema."""

    def stored_metadata(self, location: Location) -> StoredMetadata:
        """``location``'s metadata (its descriptor) verified, without opening its database: what it was written
        for, readable whatever state its schema is in (behind, ahead)."""

    def open_existing(self, location: Location) -> Database | None:
        """:meth:`open`, or None when there is nothing to read (no database, or no tables yet)."""

    def discard_if_empty(self, location: Location) -> bool:
        """Remove ``location``'s database if it holds no row and nobody can be using it; whether it did."""

    def info(self, location: Location, *, count_rows: bool = True) -> DatabaseInfo:
        """The database's state (and rows), read-only; a bad database is a state, never an error."""

    def infos(self, locations: Iterable[Location], *, count_rows: bool = True) -> Iterator[DatabaseInfo]:
        """:meth:`info` of each of ``locations``, in their order (a backend may read them together)."""

    def upgrade(
        self,
        locations: Iterable[Location],
        *,
        keep_backup: bool = True,
        script: ScriptDirectory | None = None,
        dry_run: bool = False,
    ) -> Iterator[UpgradeResult]:
        """Upgrade each database that is behind; report the others untouched. ``dry_run``: the checks a real
        upgrade makes before it writes, and ``would_upgrade`` where they pass; nothing written."""

    def verify(self, location: Location) -> DatabaseVerification:
        """Check one database read-only: its metadata, schema and every row's key."""

    def strays(self, selector: Selector) -> list[Problem]:
        """What lies in the store that is not part of its layout; with a non-empty ``selector``, what lies where
        a database it picks belongs (a descriptor folder whose database is missing)."""

    def unlisted(self) -> list[Problem]:
        """Databases the store holds that its listing leaves out, as it cannot tell which descriptor they are (a
        server's schema with no registry row; a registry row that names none): ``ls``, ``db status`` and ``db
        upgrade`` say so. A folder store's walk lists every database file, so it has none."""

    def vacuum(self, locations: Iterable[Location], *, dry_run: bool = False) -> Iterator[VacuumResult]:
        """Give back the space deleted rows left, or with ``dry_run`` say how much it would, changing nothing; a
        backend that cannot refuses with a typed error saying why."""

    def read_across(self, databases: Sequence[Database], plan: Plan) -> AcrossRows:
        """The rows of ``plan`` over ``databases`` as over one table holding all their rows (:mod:`store.across`).

        Each is ``(index of its database in databases, the row's values)``; an
        aggregate's rows have no database (None). Read-only; streamed.
        """
