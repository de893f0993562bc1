"""One descriptor database and the transactions over it, whatever holds it: an SQLite file or a PostgreSQL schema.

Contract:

* :class:`Database` is what callers get from :class:`~store.store.Store`:
  :meth:`~Database.get_many`, :meth:`~Database.put_many`,
  :meth:`~Database.delete`, :meth:`~Database.count` and
  :meth:`~Database.query`, each in a transaction of its own, the writes
  retried as a whole unit when the backend says the attempt may simply run
  again (a lock held too long, a serialisation failure, a dropped
  connection); or :meth:`~Database.transaction` / :meth:`~Database.reading`
  for several statements in one transaction. Every failure is raised as a
  typed error naming the database (``where``) and the next step.
* A read-only database refuses every write before touching anything.
* Subclasses say how to connect, retry and translate: :class:`SqliteDatabase`
  here (``BEGIN IMMEDIATE`` writers; a read-only file read as immutable is
  read again if a writer changed it meanwhile),
  :class:`store.backends.postgres.database.PostgresDatabase` for a server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection

from store.errors import (
    DatabaseFileError,
)
from store.layout import Location, StoredMetadata
from store.records import Record, RowFilter
from store.repository import Repository
from store.row_checks import OnConflict, journaled_bytes
from store.settings import Settings

T = TypeVar("T")


class Database:
    """One descriptor database (see the module docstring); built by the store, never directly."""

    location: Location
    where: str  # how messages name it: a file's path, or a server's schema
    path: Path | None  # the SQLite file, for what only a file has (size, VACUUM); None on a server
    settings: Settings
    readonly: bool

    @property
    def role(self) -> str:
        return self.location.role

    # ------------------------------------------------------------ what a backend says

    def _connect(self, *, write: bool) -> AbstractContextManager[Connection]:
        """A connection inside a transaction that commits on success (a writer's when ``write``)."""
        raise NotImplementedError

    @contextmanager
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> Iterator[None]:
        """Raise every driver or filesystem failure as its typed error (``needed_bytes()`` sizes a full disk's)."""
        raise NotImplementedError
        yield

    def _retry(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` again after a failure that a second attempt may not meet."""
        raise NotImplementedError

    def _stable(self, attempt: Callable[[], T]) -> T:
        """Run a read; a backend may run it again if what it read changed under it."""
        return attempt()

    def metadata(self) -> StoredMetadata:
        """What the descriptor folder's metadata.json (or a server's registry) records."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this database holds open."""

    def size_bytes(self) -> int:
        """Bytes it takes on disk (or on the server)."""
        raise NotImplementedError

    # ------------------------------------------------------------ transactions

    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise DatabaseFileError(
                self.where, "was opened read-only: writes are refused (open the store without readonly)"
            )

    @contextmanager
    def transaction(self) -> Iterator[Repository]:
        """A write transaction: commits on success, rolls back on error."""
        self._refuse_if_readonly()
        with self._translated(), self._connect(write=True) as conn:
            yield Repository(conn, self.location.role)

    @contextmanager
    def reading(self) -> Iterator[Repository]:
        """A read transaction: one consistent snapshot for everything done inside it."""
        with self._translated(), self._connect(write=False) as conn:
            yield Repository(conn, self.location.role)

    def _write(self, work: Callable[[Repository], T], needed_bytes: Callable[[], int] | None = None) -> T:
        self._refuse_if_readonly()

        def attempt() -> T:
            with self._connect(write=True) as conn:
                return work(Repository(conn, self.location.role))

        with self._translated(needed_bytes):
            return self._retry(attempt)

    def _read(self, work: Callable[[Repository], T]) -> T:
        def attempt() -> T:
            with self.reading() as repo:
                return work(repo)

        return self._stable(attempt)

    # ------------------------------------------------------------ rows

    def get_many(self, hashes: Iterable[str]) -> dict[str, Record]:
        keys = list(hashes)
        return self._read(lambda repo: repo.get_many(keys))

    def put_many(self, records: Iterable[Record], on_conflict: OnConflict = "ignore") -> int:
        rows = list(records)
        return self._write(lambda repo: repo.put_many(rows, on_conflict), needed_bytes=lambda: journaled_bytes(rows))

    def delete(self, flt: RowFilter) -> int:
        return self._write(lambda repo: repo.delete(flt))

    def count(self, flt: RowFilter | None = None) -> int:
        return self._read(lambda repo: repo.count(flt))

    def query(self, flt: RowFilter | None = None, *, limit: int | None = None) -> Iterator[Record]:
        """Stream matching rows; the read transaction stays open until the iterator is exhausted or closed."""
        with self.reading() as repo:
            yield from repo.query(flt, limit=limit)
