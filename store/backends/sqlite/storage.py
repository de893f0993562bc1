"""A store root on disk: one SQLite file per descriptor folder, opened on demand and kept open in an LRU.

Contract:

* :meth:`SqliteStorage.database` creates a descriptor's folder, its
  metadata.json (atomically) and its database at head, under a file lock so
  that two processes starting at once cannot race; :meth:`~SqliteStorage.open`
  verifies metadata.json against the folder, classifies the schema with one
  SELECT and refuses anything but a current database with a typed error (a
  database that is behind is upgraded first when ``auto_upgrade`` is set).
  The journal is switched to WAL only once the file is known to be ours.
  A current database is recognised on a plain sqlite3 connection, which the
  database then keeps for its reads and writes: opening builds no SQLAlchemy
  engine (only creating, upgrading or refusing a file does).
* Open databases are cached, at most ``max_open_databases`` of them (least
  recently used are closed).
* A read-only store never creates or changes a file; a database without
  tables (zero bytes: another process is creating it) means one thing there:
  empty (:meth:`~SqliteStorage.open_existing` returns None).
* :meth:`~SqliteStorage.read_across` reads each file in a read transaction
  of its own and merges their rows in Python (:mod:`store.across.merge`);
  arithmetic over aggregates is computed from the combined aggregates on an
  in-memory database of the same SQLite library (what fails there, SQLAlchemy's
  floor() of a NULL, is a :class:`~store.errors.StatementError`).
* Inspecting, upgrading, verifying and vacuuming are
  :mod:`~store.backends.sqlite.info`, :mod:`~store.backends.sqlite.upgrade`,
  :mod:`~store.backends.sqlite.verify` and :mod:`~store.backends.sqlite.vacuum`'s,
  on this root.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.exc import DBAPIError

from store.backends.sqlite.catalog import catalog_path, stamp
from store.backends.sqlite.connections import is_current, open_file, open_readonly, read_checked
from store.backends.sqlite.database import SqliteDatabase
from store.backends.sqlite.errors import raise_translated, write_refusal
from store.backends.sqlite.filesystems import Filesystems
from store.backends.sqlite.info import database_info as sqlite_database_info
from store.backends.sqlite.upgrade import upgrade_store
from store.backends.sqlite.vacuum import vacuum_store
from store.backends.sqlite.verify import stray_paths, verify_database
from store.catalog import Catalog
from store.errors import DatabaseFileError, DatabaseMissingError, JudgestoreError, StatementError, StoreMissingError
from store.layout import (
    Location,
    Selector,
    StoredMetadata,
    database_name,
    enclosing_store,
    prepared_folder,
    read_metadata,
    walk,
)
from store.reports import (
    DatabaseInfo,
    DatabaseVerification,
    Problem,
    UpgradeResult,
    VacuumResult,
    info_json,
    info_lasting,
    info_of,
)
from store.schema import Revisions
from store.settings import Settings
from store.tables.filters import (
    CATALOGUED_FILTERS,
    DISTINCT_LIMIT,
    VALUE_COLUMNS,
    ColumnValues,
    RowFilter,
    may_match,
)

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

    from store.across.plan import AcrossRows, Plan
    from store.backend import Database, Storage

T = TypeVar("T")


class SqliteStorage:
    """The descriptor databases under one store root (see the module docstring)."""

    def __init__(self, root: Path, settings: Settings, *, readonly: bool = False) -> None:
        """A root that does not exist is an empty store (created by the first write); one that is a file is
        :class:`StoreMissingError` (a mistyped root must not read as an empty store). A relative root is taken
        against the working directory of this call, once."""
        given = root
        if root.exists() and not root.is_dir():
            raise StoreMissingError(
                root,
                "it is a file, not a folder: there is no store here; check --store-root (or JUDGESTORE_STORE_ROOT)",
            )
        # Fixed when the store opens: a relative root followed the working directory, so a job that changed it
        # (Hydra's job.chdir) wrote the next databases into another folder and missed the rows it had. The store is
        # named as given (where); its databases' paths are absolute.
        root = root.absolute()  # not abspath: a ".." after a link is the link's parent, as the system reads it
        if (store := enclosing_store(root)) is not None:  # read as no databases; a write made a store inside it
            raise StoreMissingError(
                given,
                f"it is a folder inside the store {store}, not a store: name that store's folder instead (a "
                "selector, such as --role, --task or --model-id, picks its databases)",
            )
        self.root = root
        self.local_root = root
        self._prefix = os.path.join(str(root), "")
        self.where = str(given)
        self.settings = settings
        self.readonly = readonly
        self._open: OrderedDict[tuple[str, ...], SqliteDatabase] = OrderedDict()  # by folder names (segments)
        self._filesystems: Filesystems | None = None  # the mount table, read at the first open
        self._catalog: Catalog | None = None  # read at first use (store.backends.sqlite.catalog)

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()
        if self._catalog is not None:
            self._catalog.save()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(catalog_path(self.root), str(self.root))
        return self._catalog

    def absence(self) -> str | None:
        return None if self.root.is_dir() else "the folder does not exist"

    def overlaps(self, other: Storage) -> bool:
        if not isinstance(other, SqliteStorage):
            return False
        mine, theirs = self.root.resolve(), other.root.resolve()
        return mine == theirs or mine.is_relative_to(theirs) or theirs.is_relative_to(mine)

    def shown(self, where: str) -> str:
        try:
            return str(Path(where).relative_to(self.root))
        except ValueError:
            return where

    def locations(self, selector: Selector | None = None) -> list[Location]:
        if selector is not None and not selector.is_empty():  # what it picks: the catalog keeps the others
            return list(walk(self.root, selector))
        found = list(walk(self.root))
        self.catalog.keep_only(self._key(location.db_path(self.root)) for location in found)
        return found

    def _key(self, db_path: Path) -> str:
        return str(db_path)[len(self._prefix) :]  # the path under the root (the layout's names hold no separator)

    def remembered(
        self,
        locations: Iterable[Location],
        kind: str,
        compute: Callable[[Location], T],
        *,
        lasting: Callable[[T], bool] | None = None,
    ) -> Iterator[tuple[Location, T]]:
        """``compute(location)`` (a JSON value) of each location, or what it gave while the database's files are as
        they were then (never a value ``lasting`` refuses)."""
        for location in locations:
            yield location, self._remembered(location, kind, functools.partial(compute, location), lasting=lasting)

    def _remembered(
        self, location: Location, kind: str, compute: Callable[[], T], *, lasting: Callable[[T], bool] | None = None
    ) -> T:
        path = location.db_path(self.root)
        now = stamp(path)  # before the file is read (store.catalog)
        value: T = self.catalog.remembered(self._key(path), now, kind, compute, lasting=lasting)
        return value

    def narrowed(self, locations: Iterable[Location], flt: RowFilter) -> list[Location]:
        """The ``locations`` whose databases may hold a row ``flt`` matches, by their catalogued distinct values
        (a database that cannot be read for them is kept: opening it says what is wrong)."""
        chosen = list(locations)
        if not any(getattr(flt, name) is not None for name in CATALOGUED_FILTERS):
            return chosen
        values = self.column_values(chosen)
        return [loc for loc in chosen if (v := values[loc]) is None or may_match(loc.role, v, flt)]

    def column_values(self, locations: Iterable[Location]) -> dict[Location, ColumnValues | None]:
        return {loc: self._remembered(loc, "values", functools.partial(self._values, loc)) for loc in locations}

    def _values(self, location: Location) -> ColumnValues | None:
        """The distinct values of the role's :data:`~store.tables.filters.VALUE_COLUMNS` (None: unknown; a column with
        more than :data:`DISTINCT_LIMIT` values: None for it)."""
        path = location.db_path(self.root)
        try:
            conn = open_readonly(path)
        except sqlite3.Error:
            return None
        try:
            with read_checked(conn, path), conn:  # values read as a writer changed the file: unknown
                if not is_current(conn, path):
                    return None
                values: dict[str, list[str | None] | None] = {}
                conn.execute("BEGIN")  # one snapshot for every column
                for column in VALUE_COLUMNS[location.role]:
                    sql = f"SELECT DISTINCT {column} FROM {location.role} LIMIT {DISTINCT_LIMIT + 1}"
                    found = [value for (value,) in conn.execute(sql)]
                    values[column] = found if len(found) <= DISTINCT_LIMIT else None
            return values
        except (sqlite3.Error, JudgestoreError):
            return None
        finally:
            conn.close()

    # ------------------------------------------------------------ one database

    def database(self, location: Location, metadata: Callable[[], bytes]) -> SqliteDatabase:
        """The database of ``location``; a read-write store creates it (and metadata.json: ``metadata()``) if needed."""
        return self._cached(location) or self._open_at(location, None if self.readonly else metadata)

    def check_writable(self, location: Location, *, as_a_writer: bool = False) -> None:
        path = location.db_path(self.root)
        if self.readonly and not as_a_writer:
            refusal: JudgestoreError | None = DatabaseFileError(path, "the store was opened read-only")
        else:
            refusal = write_refusal(path)
        if refusal is not None:
            raise refusal

    def discard_if_empty(self, location: Location) -> bool:
        """Never removes anything: an empty database file lists 0 rows and a rerun fills it (see PostgresStorage's).

        Another process may hold the file open (a run that found it meanwhile); removing it under that process
        would lose what it writes next. A server's schema can be dropped under its tables' locks instead.
        """
        return False

    def open_existing(self, location: Location) -> SqliteDatabase | None:
        """:meth:`open`, or None when there is nothing to read: no file, or (read-only) no tables yet."""
        if not location.db_path(self.root).exists():
            return None
        try:
            return self.open(location)
        except DatabaseMissingError:  # read-only, and no tables yet (or removed meanwhile)
            return None

    def open(self, location: Location) -> SqliteDatabase:
        """Open an existing descriptor folder (verifying metadata.json and the schema)."""
        return self._cached(location) or self._open_at(location)

    def stored_metadata(self, location: Location) -> StoredMetadata:
        try:
            return read_metadata(location.folder(self.root))
        except OSError as e:  # an unreadable metadata.json: typed, naming it
            raise_translated(location.metadata_path(self.root), e)

    def _open_at(self, location: Location, metadata: Callable[[], bytes] | None = None) -> SqliteDatabase:
        """Open (given ``metadata``: create if needed) the database of ``location``; it is then cached."""
        if self.readonly and not location.db_path(self.root).exists():
            raise DatabaseMissingError(location.db_path(self.root), "does not exist (read-only open creates nothing)")
        try:
            path = prepared_folder(self.root, location, metadata) / database_name(location.role)
        except OSError as e:  # a full, read-only or unreadable disk: typed, naming the folder or its metadata.json
            raise_translated(location.folder(self.root) if metadata else location.metadata_path(self.root), e)
        if self._filesystems is None:
            self._filesystems = Filesystems()
        opened = open_file(path, self.settings, readonly=self.readonly, filesystems=self._filesystems)
        database = SqliteDatabase(location, path, opened.connect, self.settings, self.readonly,
                                  connection=opened.connection, engine=opened.engine)  # fmt: skip
        self._open[location.segments()] = database
        while len(self._open) > self.settings.max_open_databases:
            self._open.popitem(last=False)[1].close()
        return database

    def _cached(self, location: Location) -> SqliteDatabase | None:
        """The database opened before, unless its file left this library's revision since (another process
        upgraded it, or copied a backup over it): then None, and the caller's open says what it is now, as a
        server's open does each time."""
        key = location.segments()
        database = self._open.get(key)
        if database is None:
            return None
        if not database.still_current():
            self._open.pop(key).close()
            return None
        self._open.move_to_end(key)
        return database

    # ------------------------------------------------------------ the whole root

    def info(self, location: Location, *, known: Revisions | None = None, count_rows: bool = True) -> DatabaseInfo:
        if known is not None:  # another line of scripts (tests, upgrades): read afresh
            return sqlite_database_info(self.root, location, self.settings, known=known, count_rows=count_rows)

        def compute() -> dict[str, Any]:
            return info_json(sqlite_database_info(self.root, location, self.settings))

        info = info_of(location, self._remembered(location, "info", compute, lasting=info_lasting))
        return info if count_rows else dataclasses.replace(info, rows=None)

    def infos(self, locations: Iterable[Location], *, count_rows: bool = True) -> Iterator[DatabaseInfo]:
        for location in locations:
            yield self.info(location, count_rows=count_rows)

    def upgrade(
        self,
        locations: Iterable[Location],
        *,
        keep_backup: bool = True,
        script: ScriptDirectory | None = None,
        dry_run: bool = False,
    ) -> Iterator[UpgradeResult]:
        return upgrade_store(
            self.root, locations, self.settings, keep_backup=keep_backup, script=script, dry_run=dry_run
        )

    def verify(self, location: Location) -> DatabaseVerification:
        return verify_database(self.root, location, self.settings)

    def strays(self, selector: Selector) -> list[Problem]:
        return stray_paths(self.root, selector)

    def unlisted(self) -> list[Problem]:
        return []  # the walk lists every database file, one without its metadata.json too

    def vacuum(self, locations: Iterable[Location], *, dry_run: bool = False) -> Iterator[VacuumResult]:
        return vacuum_store(self.root, locations, self.settings, dry_run=dry_run)

    def read_across(self, databases: Sequence[Database], plan: Plan) -> AcrossRows:
        """Each file read in a transaction of its own, its rows merged (:func:`store.across.merge.read_each`)."""
        from store.across.merge import Evaluator, read_each

        evaluator = Evaluator(_in_memory)
        return read_each([database.stream for database in databases], plan, nulls_smallest=True, evaluator=evaluator)


def _in_memory(statement: Any) -> list[Any]:
    """The rows of a statement that reads no table, on an in-memory database of the same SQLite library and
    dialect as the files (what arithmetic over aggregates is computed on: :class:`store.across.merge.Evaluator`)."""
    from store.backends.sqlite.connections import sqlite_engine

    engine = sqlite_engine(lambda: sqlite3.connect(":memory:"), None, pooled=False)
    try:
        with engine.connect() as conn:
            return list(conn.execute(statement).all())
    except DBAPIError as e:  # the statement's own expression (no file is read here): typed, as a file's errors are
        said = str(e.orig).strip() or type(e.orig).__name__
        raise StatementError(
            f"SQLite cannot compute the statement's arithmetic over the combined aggregates ({said}), as over one "
            "table; SQLAlchemy's floor() (of // of a value that is not a whole number) fails on NULL: coalesce it"
        ) from e
    finally:
        engine.dispose()
