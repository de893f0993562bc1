"""The store: one SQLite database per (role, task, descriptor), opened on demand.

Contract:

* :meth:`Store.database` opens (and, read-write, creates) the database of a
  descriptor: it verifies the folder's metadata.json, classifies the schema
  with one SELECT and refuses anything but a current database with a typed
  error (a database that is behind is upgraded first when ``auto_upgrade`` is
  set). An empty database is created at head under a file lock, so two
  processes starting at once cannot race.
* Engines are cached per database, at most ``max_open_databases`` of them
  (least recently used are disposed).
* :meth:`Database.transaction` is one ``BEGIN IMMEDIATE`` write transaction
  (the lock is retried with backoff after the busy timeout); the convenience
  methods on :class:`Database` each run in a transaction of their own and
  retry the whole unit if the database stays locked.
* A read-only store never creates or changes a file. Without a writer's WAL
  it reads the file as immutable, so a read that raced a writer appearing
  meanwhile (the file changed under it) is run again rather than trusted.
* A file found damaged while it is used raises the same typed errors as on
  open (:class:`~store.errors.CorruptDatabaseError`, ...).
* Across databases: :meth:`Store.query_rows` streams the rows a
  :class:`~store.records.RowFilter` matches in the databases a
  :class:`~store.layout.Selector` picks (databases in walk order, rows of one
  database by ``created_at``); :meth:`Store.plan_delete` counts them and
  :meth:`Store.delete_rows` deletes them, one write transaction per database.
  Both refuse an empty row filter (:class:`~store.errors.EmptyFilterError`)
  before opening anything. Databases without tables are skipped; any other
  database that cannot be opened raises its typed error.
* A database without tables (zero bytes: another process is creating it)
  means one thing: empty. Read-only, :meth:`Store.find` and
  :meth:`Store.open_existing` return None for it; queries and pushes skip it.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from filelock import FileLock
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from store.descriptor import ModelDescriptor
from store.engine import (
    apply_journal_mode,
    create_sqlite_engine,
    file_stamp,
    raise_translated,
    translated,
    write_refusal,
)
from store.errors import (
    CorruptDatabaseError,
    DatabaseBusyError,
    DatabaseFileError,
    DatabaseMissingError,
    EmptyFilterError,
    InvalidInputError,
    NotADatabaseError,
    StoreFullError,
    UpgradeFailedError,
)
from store.layout import (
    Location,
    Selector,
    StoredMetadata,
    lock_path,
    metadata_bytes,
    read_location_metadata,
    read_metadata,
    select,
    walk,
    write_metadata,
)
from store.records import FoundRow, Record, RowCount, RowFilter, roles_for
from store.repository import OnConflict, Repository, journaled_bytes
from store.schema import DatabaseState, SchemaStatus, classify, create_at_head, raise_for_status
from store.settings import Settings
from store.upgrade import UpgradeOutcome, upgrade_database

T = TypeVar("T")
READONLY_READ_ATTEMPTS = 5


def _stable_read(path: Path, read: Callable[[], T]) -> T:
    """Run a read-only ``read``; run it again if the file changed under it (see the module docstring)."""
    for _ in range(READONLY_READ_ATTEMPTS):
        before = file_stamp(path)
        try:
            result = read()
        except (CorruptDatabaseError, NotADatabaseError):
            if file_stamp(path) == before:
                raise
            continue
        after = file_stamp(path)
        if after == before or (before.wal_exists and after.wal_exists):  # with a WAL, SQLite's locks held
            return result
    raise DatabaseBusyError(
        path, f"changed under {READONLY_READ_ATTEMPTS} read-only reads in a row (writers are busy); try again"
    )


class Database:
    """One descriptor database: its location, its engine, and transactions over it."""

    def __init__(self, location: Location, path: Path, engine: Engine, settings: Settings, readonly: bool) -> None:
        self.location = location
        self.path = path
        self.engine = engine
        self.settings = settings
        self.readonly = readonly

    @property
    def role(self) -> str:
        return self.location.role

    def _retry(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt``; if the database stays locked past the busy timeout, back off and retry."""
        from store.engine import retry_while_locked

        return retry_while_locked(attempt, self.path, self.settings)

    @contextmanager
    def transaction(self) -> Iterator[Repository]:
        """A write transaction (``BEGIN IMMEDIATE``): commits on success, rolls back on error."""
        with self._translated(), self._write_transaction() as repo:
            yield repo

    @contextmanager
    def _write_transaction(self) -> Iterator[Repository]:
        """:meth:`transaction` without the translation of errors (so that :meth:`_retry` sees a lock)."""
        if self.readonly:
            raise DatabaseFileError(
                self.path, "was opened read-only: writes are refused (open the store without readonly)"
            )
        conn = self.engine.connect().execution_options(write=True)
        try:
            self._retry(conn.begin)
            yield Repository(conn, self.location.role)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    @contextmanager
    def reading(self) -> Iterator[Repository]:
        """A read transaction: one consistent snapshot for everything done inside it."""
        with self._translated(), self.engine.connect() as conn, conn.begin():
            yield Repository(conn, self.location.role)

    @contextmanager
    def _translated(self, needed_bytes: Callable[[], int] | None = None) -> Iterator[None]:
        """Any SQLite, driver or OS failure raises its typed error; ``needed_bytes()`` sizes a full disk's."""
        try:
            yield
        except (DBAPIError, sqlite3.Error, OSError) as e:
            typed = translated(self.path, e)
            if isinstance(typed, StoreFullError) and needed_bytes is not None:
                typed = StoreFullError(typed.path, free_bytes=typed.free_bytes, needed_bytes=needed_bytes())
            raise typed from e

    def _write(self, work: Callable[[Repository], T], needed_bytes: Callable[[], int] | None = None) -> T:
        def attempt() -> T:
            with self._write_transaction() as repo:
                return work(repo)

        with self._translated(needed_bytes):
            return self._retry(attempt)

    def _read(self, work: Callable[[Repository], T]) -> T:
        def attempt() -> T:
            with self.reading() as repo:
                return work(repo)

        return _stable_read(self.path, attempt) if self.readonly else attempt()

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

    def metadata(self) -> StoredMetadata:
        return read_metadata(self.path.parent)

    def close(self) -> None:
        self.engine.dispose()


class Store:
    """A store root holding descriptor databases; see the module docstring."""

    def __init__(self, settings: Settings | None = None, *, root: Path | str | None = None, readonly: bool = False):
        self.settings = settings or Settings()
        self.root = Path(root) if root is not None else self.settings.store_root
        self.readonly = readonly
        self._open: OrderedDict[Path, Database] = OrderedDict()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()

    def locations(self) -> list[Location]:
        """Every descriptor database under the root."""
        return list(walk(self.root))

    # ------------------------------------------------------------ rows across databases

    def _selected(self, selector: Selector, flt: RowFilter) -> Iterator[Database]:
        """The databases ``selector`` picks whose role has every column ``flt`` names, skipping empty ones."""
        roles = roles_for(flt, selector.role)
        for location in select(self.root, selector):
            if location.role in roles and (database := self.open_existing(location)) is not None:
                yield database

    def databases(self, selector: Selector, flt: RowFilter | None = None) -> Iterator[Database]:
        """The databases ``selector`` picks whose role has every column ``flt`` names, skipping table-less ones."""
        return self._selected(selector, flt or RowFilter())

    def query_rows(self, selector: Selector, flt: RowFilter, *, limit: int | None = None) -> Iterator[FoundRow]:
        """Stream the rows matching ``flt`` from every selected database (see the module docstring)."""
        if limit is not None and limit < 0:
            raise InvalidInputError(f"limit must be >= 0, got {limit}")
        remaining = limit
        for database in self._selected(selector, flt):
            if remaining == 0:
                return
            for record in database.query(flt, limit=remaining):
                yield FoundRow(database.location, record)
                if remaining is not None:
                    remaining -= 1

    def plan_delete(self, selector: Selector, flt: RowFilter) -> list[RowCount]:
        """Count the rows ``flt`` matches in each selected database; databases with none are left out."""
        if flt.is_empty():
            raise EmptyFilterError()
        plan = []
        for database in self._selected(selector, flt):
            rows = database.count(flt)
            if rows:
                plan.append(RowCount(database.location, database.path, rows))
        return plan

    def delete_rows(self, plan: Iterable[RowCount], flt: RowFilter) -> list[RowCount]:
        """Delete the rows matching ``flt`` from the databases of ``plan``; returns the rows actually deleted.

        Each database is one write transaction; rows written after the plan was
        made that match ``flt`` are deleted too (the counts say so).
        """
        if flt.is_empty():
            raise EmptyFilterError()
        deleted = []
        for entry in plan:
            database = self.open(entry.location)
            deleted.append(RowCount(entry.location, database.path, database.delete(flt)))
        return deleted

    # ------------------------------------------------------------ one database

    def database(
        self, role: str, task: str, descriptor: ModelDescriptor, *, assumptions: tuple[str, ...] = ()
    ) -> Database:
        """The database of ``descriptor``; read-write stores create it (and its metadata.json) if needed."""
        location = Location.of(role, task, descriptor)
        cached = self._cached(location.db_path(self.root))
        if cached is not None:
            return cached
        folder = location.folder(self.root)
        if not self.readonly and not location.metadata_path(self.root).exists():
            try:
                write_metadata(folder, metadata_bytes(location.role, task, descriptor, assumptions))
            except OSError as e:  # a full or read-only disk: typed, naming the folder
                raise_translated(folder, e)
        return self.open(location)

    def check_writable(self, role: str, task: str, descriptor: ModelDescriptor) -> None:
        """Raise what writing this descriptor's database would meet, where that is known without writing anything.

        A name the layout refuses, a read-only store (:func:`store.engine.write_refusal`: a read-only
        filesystem, no permission). A full disk shows only when a write fails.
        """
        path = Location.of(role, task, descriptor).db_path(self.root)
        refusal = DatabaseFileError(path, "the store was opened read-only") if self.readonly else write_refusal(path)
        if refusal is not None:
            raise refusal

    def find(self, role: str, task: str, descriptor: ModelDescriptor) -> Database | None:
        """The database of ``descriptor`` if it has anything to read (:meth:`open_existing`); creates no file."""
        return self.open_existing(Location.of(role, task, descriptor))

    def open_existing(self, location: Location) -> Database | None:
        """:meth:`open`, or None when there is nothing to read: no file, or (read-only) no tables yet.

        A zero-byte file is what another process creating the database leaves for an instant.
        """
        if not location.db_path(self.root).exists():
            return None
        try:
            return self.open(location)
        except DatabaseMissingError:  # read-only, and no tables yet (or removed meanwhile)
            return None

    def open(self, location: Location) -> Database:
        """Open an existing descriptor folder (verifying metadata.json and the schema)."""
        path = location.db_path(self.root)
        cached = self._cached(path)
        if cached is not None:
            return cached
        if self.readonly and not path.exists():
            raise DatabaseMissingError(path, "does not exist (read-only open creates nothing)")
        try:
            read_location_metadata(self.root, location)
        except OSError as e:  # unreadable (permissions, I/O): typed, naming the file
            raise_translated(location.metadata_path(self.root), e)
        engine = create_sqlite_engine(path, self.settings, readonly=self.readonly)
        try:
            self._check_schema(engine, path)
        except (DBAPIError, sqlite3.Error, OSError) as e:  # creating, switching the journal: full, read-only...
            engine.dispose()
            raise_translated(path, e)
        except BaseException:
            engine.dispose()
            raise
        database = Database(location, path, engine, self.settings, self.readonly)
        self._open[path] = database
        while len(self._open) > self.settings.max_open_databases:
            self._open.popitem(last=False)[1].close()
        return database

    def _cached(self, path: Path) -> Database | None:
        database = self._open.get(path)
        if database is not None:
            self._open.move_to_end(path)
        return database

    def _status(self, engine: Engine, path: Path) -> SchemaStatus:
        def attempt() -> SchemaStatus:
            try:
                with engine.connect() as conn:
                    return classify(conn, path)
            except DBAPIError as e:  # connecting can fail too (a file that is not a database)
                raise_translated(path, e)

        return _stable_read(path, attempt) if self.readonly else attempt()

    def _check_schema(self, engine: Engine, path: Path) -> None:
        """Refuse anything but a current database; the journal is switched only once the file is ours."""
        status = self._status(engine, path)
        if status.state is DatabaseState.CURRENT:
            apply_journal_mode(engine)
            return
        if status.state is DatabaseState.EMPTY and not self.readonly:
            self._create(engine, path)
            apply_journal_mode(engine)
            return
        if status.state is DatabaseState.BEHIND and self.settings.auto_upgrade and not self.readonly:
            engine.dispose()
            result = upgrade_database(path, self.settings)
            if result.outcome is not UpgradeOutcome.UPGRADED:
                raise UpgradeFailedError(
                    path, f"automatic upgrade from {status.revision} failed ({result.error}); the file was restored"
                )
            apply_journal_mode(engine)
            return
        if status.state is DatabaseState.EMPTY:
            raise DatabaseMissingError(path, "has no tables yet (read-only open creates nothing)")
        raise_for_status(status, path)

    def _create(self, engine: Engine, path: Path) -> None:
        """Create the schema at head, once, even when many processes try at the same moment."""
        with FileLock(lock_path(path)):
            conn: Connection
            with engine.connect().execution_options(write=True) as conn, conn.begin():
                status = classify(conn, path)  # another process may have won the race
                if status.state is DatabaseState.EMPTY:
                    create_at_head(conn)
                else:
                    raise_for_status(status, path)
