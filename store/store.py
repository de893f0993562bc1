"""The store: descriptor databases on demand, in a folder (SQLite) or on a PostgreSQL server.

Contract:

* ``Store(settings, root=...)`` is a folder of SQLite files
  (:class:`~store.backends.sqlite.storage.SqliteStorage`); ``Store(settings,
  url="postgresql+psycopg://...")`` is a database on a server, one schema per
  descriptor (:class:`~store.backends.postgres.storage.PostgresStorage`). Without
  either, the settings decide (``JUDGESTORE_STORE_URL``, else
  ``JUDGESTORE_STORE_ROOT``, default ``./judgestore-data``). Everything below
  works the same on both.
* :meth:`Store.database` opens (and, read-write, creates) the database of a
  descriptor, verifying what its folder's metadata.json (or the server's
  registry) records and its schema revision; anything but a current database
  is refused with a typed error (a database that is behind is upgraded first
  when ``auto_upgrade`` is set, with an :class:`AutoUpgradeWarning` naming
  it and its backup; one another process upgraded meanwhile is
  simply opened). :meth:`Store.find` never creates anything. The reads
  across databases (:meth:`Store.query_rows`, :meth:`Store.scalars`,
  :meth:`Store.execute`) never upgrade, whatever ``auto_upgrade`` says: a
  database that is behind is refused with its typed error, as the commands
  that only read refuse it.
* A :class:`~store.backend.Database` gives transactions over one database;
  see :mod:`store.backend`.
* A read-only store never creates or changes anything.
* Across databases: :meth:`Store.query_rows` streams the rows a
  :class:`~store.tables.filters.RowFilter` matches in the databases a
  :class:`~store.layout.Selector` picks (databases in layout order, rows of
  one database by ``created_at``); :meth:`Store.plan_delete` counts them
  (rows written before the plan was made) and :meth:`Store.delete_rows`
  deletes those, one write transaction per database.
  Both refuse an empty row filter (:class:`~store.errors.EmptyFilterError`)
  before opening anything. Databases without tables are skipped; any other
  database that cannot be opened raises its typed error.
* :meth:`Store.scalars` and :meth:`Store.execute` run one SQLAlchemy
  ``select()`` over every database a selector picks, as on one table holding
  all their rows (:mod:`store.across`); read-only.
* Commands open only the databases that can matter: those the selector
  picks whose role has the filter's columns and which may hold a row the
  filter matches (:meth:`~store.backend.Storage.narrowed`: a folder store
  by its catalog, a server store in a few statements).
* :meth:`Store.infos`, :meth:`Store.upgrade`, :meth:`Store.verify` and
  :meth:`Store.strays` look at, upgrade and check the databases, whatever
  holds them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Generator, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from store.backend import Database, Storage, checked_limit
from store.backends import open_storage
from store.caller import warn_the_caller
from store.descriptor import HASH16_LENGTH, ModelDescriptor
from store.errors import (
    EmptyFilterError,
    InvalidInputError,
    JudgestoreError,
    SchemaBehindError,
    StoreMissingError,
    UpgradeFailedError,
)
from store.layout import Location, Selector, StoredMetadata, metadata_bytes
from store.reports import DatabaseInfo, DatabaseVerification, Problem, UpgradeOutcome, UpgradeResult, VacuumResult
from store.rows import DeletePlan, FoundRow, RowCount
from store.settings import Settings, from_environment
from store.tables.filters import RowFilter, roles_for

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory
    from sqlalchemy import Result, Select

    from store.across import Found

T = TypeVar("T")
E = TypeVar("E")


class AutoUpgradeWarning(UserWarning):
    """A database that was behind was upgraded as it was opened (``auto_upgrade``), its backup kept beside it."""


class Store:
    """The descriptor databases of a store root or a store URL; see the module docstring."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        root: Path | str | None = None,
        url: str | None = None,
        readonly: bool = False,
    ) -> None:
        if settings is not None and not isinstance(settings, Settings):  # Store("path"): the first thing one types
            raise TypeError(
                f"Store's first argument is the Settings, got {type(settings).__name__} {settings!r:.80}; "
                "name a folder with Store(root=...) or a server with Store(url=...)"
            )
        self.settings = settings or from_environment(Settings)
        self.readonly = readonly
        self.storage: Storage = open_storage(self.settings, root=root, url=url, readonly=readonly)

    @property
    def where(self) -> str:
        """The store as messages name it: the root folder, or the URL without its password."""
        return self.storage.where

    @property
    def root(self) -> Path:
        """Where the store keeps files of this machine (sharing's workspace): the root, or a folder for a server."""
        return self.storage.local_root

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        """A store pickles (and copies) as what opens it again: its settings, its folder or server, read-only or not.
        The copy opens its own connections (a worker process cannot share this one's); pickled after a database was
        opened, a store failed on a local function of the SQLite connector (was)."""
        url = getattr(self.storage, "url", None)
        root = None if url is not None else getattr(self.storage, "root", None)
        return _reopened, (self.settings, root, url, self.readonly)

    def close(self) -> None:
        """Release every connection and open file. A store used again afterwards opens what it needs again
        (databases are opened lazily, and closed as the least recently used when many are open): close it again
        once done, or keep the work inside ``with Store(...) as store:``."""
        self.storage.close()

    def locations(self) -> list[Location]:
        """Every descriptor database of the store, in layout order."""
        return self.storage.locations()

    def select(self, selector: Selector | None = None) -> list[Location]:
        """The descriptor databases ``selector`` picks, in layout order.

        A ``descriptor`` prefix longer than a folder name (16 characters) is compared whole, with the descriptor
        hash the folder's metadata records: a wrong character past the 16th selects nothing.
        """
        selector = selector or Selector()
        prefix = selector.descriptor or ""
        return [
            location
            for location in self.storage.locations(selector)
            if selector.matches(location) and (len(prefix) <= HASH16_LENGTH or self._hashed(location, prefix))
        ]

    def _hashed(self, location: Location, prefix: str) -> bool:
        """Whether the descriptor hash the location's metadata records starts with ``prefix``; True when it cannot
        be read (such a location is kept: opening it says what is wrong)."""
        try:
            return self.storage.open(location).metadata().descriptor_sha256.startswith(prefix)
        except JudgestoreError:
            return True

    # ------------------------------------------------------------ rows across databases

    def _selected(self, selector: Selector, flt: RowFilter, *, reading: bool = False) -> Iterator[Database]:
        """The databases ``selector`` picks whose role has every column ``flt`` names, skipping empty ones; for
        ``reading``, a database that is behind is refused, whatever ``auto_upgrade`` says (a read never writes)."""
        roles = roles_for(flt, selector.role)
        candidates = self.storage.narrowed((loc for loc in self.select(selector) if loc.role in roles), flt)
        open_it = self._read_existing if reading else self.open_existing
        for location in candidates:
            if (database := open_it(location)) is not None:
                yield database

    def databases(self, selector: Selector, flt: RowFilter | None = None) -> Iterator[Database]:
        """The databases ``selector`` picks whose role has every column ``flt`` names, skipping table-less ones."""
        return self._selected(selector, flt or RowFilter())

    def query_rows(
        self, selector: Selector, flt: RowFilter, *, limit: int | None = None
    ) -> Generator[FoundRow, None, None]:
        """Stream the rows matching ``flt`` from every selected database (see the module docstring).

        A reader that stops before the end closes the generator (``contextlib.closing``) while the store is open:
        that ends the read transaction it holds (a generator closed by the garbage collector after the store was
        closed fails there, and Python reports that on stderr).
        """
        remaining = checked_limit(limit)
        if remaining == 0:
            return
        for database in self._selected(selector, flt, reading=True):
            for record in database.query(flt, limit=remaining):
                yield FoundRow(database.location, record)
                if remaining is not None:
                    remaining -= 1
            if remaining == 0:  # before the next database is opened: one that cannot be, no longer matters
                return

    def scalars(self, statement: Select[E], selector: Selector | None = None) -> Iterator[Found[E]]:
        """``select(Entity)`` over the selected databases, a ``Found(location, descriptor, row)`` per row."""
        from store.across import scalars

        return scalars(self, statement, selector)

    def execute(
        self, statement: Select[*tuple[Any, ...]], selector: Selector | None = None
    ) -> Result[*tuple[Any, ...]]:
        """Columns, or ``count``/``sum``/``min``/``max`` (FILTER or not, and arithmetic over them) by group, over the
        selected databases (:mod:`store.across`)."""
        from store.across import execute

        return execute(self, statement, selector)

    def plan_delete(self, selector: Selector, flt: RowFilter, *, now: datetime | None = None) -> DeletePlan:
        """Count the rows ``flt`` matches in each selected database (databases with none are left out); reads only.

        The plan's filter is ``flt`` bounded by ``now`` (the current time by
        default) as ``created_before``: rows a run writes while the caller
        asks to confirm are neither counted nor deleted (one dated before the
        bound and committed after the count makes :meth:`delete_rows` refuse
        its database). The plan counts the
        rows the bound leaves out (:attr:`DeletePlan.later`: dated after
        ``now`` by a clock ahead of this one, or by a time no clock gives).
        A filter naming keys (``input_hashes``) is not bounded: the rows of
        the keys named are the ones asked for, whenever they were written.
        """
        if flt.is_empty():  # before the bound below, which would make any filter one
            raise EmptyFilterError()
        now = now or datetime.now(UTC)
        bounded = flt.input_hashes is None
        planned = dataclasses.replace(flt, created_before=min(now, flt.created_before or now)) if bounded else flt
        counts, later = [], 0
        for database in self._selected(selector, planned):
            rows, after = database.count_around(flt, now) if bounded else (database.count(flt), 0)
            later += after
            if rows:
                counts.append(RowCount(database.location, database.where, rows))
        return DeletePlan((planned,), tuple(counts), later)

    def delete_rows(self, plan: DeletePlan) -> list[RowCount]:
        """Delete the rows matching any of ``plan``'s filters from its databases; returns the rows actually deleted
        per database.

        Each database is one write transaction, whatever the number of filters
        (a prune gives one per run). A database that fails
        (locked, damaged) raises its error, with ``rows_deleted`` and a note
        saying what was deleted before it, from which databases; the databases
        after it are left as they were. So does a database where more rows
        match than the plan counted there, or fewer but some (a run committed
        rows it had dated before the count, another process deleted some:
        :class:`~store.errors.MatchedMeanwhileError`, nothing deleted from it);
        one where none match is passed (the same plan run again after a
        failure meets the databases it finished). A ``KeyboardInterrupt`` (Ctrl-C) gets
        the same attribute and note: the database it stopped in is rolled
        back, unless the interrupt came during its commit (then its delete
        stands and is counted, as planned). A plan without filters, or with an
        empty one, is an :class:`EmptyFilterError`.
        """
        filters = plan.filters
        if not filters or any(flt.is_empty() for flt in filters):
            raise EmptyFilterError()
        deleted: list[RowCount] = []
        for entry in plan.counts:
            try:
                database = self.open(entry.location)
                try:
                    rows = database.delete(*filters, at_most=entry.rows)
                except KeyboardInterrupt:
                    # Ctrl-C during the commit lets it finish and is raised just after: with no matching row left,
                    # the delete stands, and counts as planned
                    if entry.rows and not sum(database.count(flt) for flt in filters):
                        deleted.append(RowCount(entry.location, database.where, entry.rows))
                    raise
                deleted.append(RowCount(entry.location, database.where, rows))
            except (JudgestoreError, KeyboardInterrupt) as e:
                if deleted:
                    rows = sum(d.rows for d in deleted)
                    e.rows_deleted = rows  # type: ignore[union-attr]  # KeyboardInterrupt: set here, for the CLI
                    places = ", ".join(d.where for d in deleted[:3]) + (", ..." if len(deleted) > 3 else "")
                    e.add_note(
                        f"Before it, {rows:,} {'row was' if rows == 1 else 'rows were'} deleted from "
                        f"{len(deleted)} database{'' if len(deleted) == 1 else 's'} ({places}); "
                        "no other database was changed: run the same command again to finish."
                    )
                raise
        return deleted

    # ------------------------------------------------------------ one database

    def database(
        self, role: str, task: str, descriptor: ModelDescriptor, *, assumptions: tuple[str, ...] = ()
    ) -> Database:
        """The database of ``descriptor``; a read-write store creates it if needed."""
        location = Location.of(role, task, descriptor)
        metadata = functools.partial(metadata_bytes, location.role, task, descriptor, assumptions)
        return self._upgraded_if_behind(location, lambda: self.storage.database(location, metadata))

    def check_writable(self, role: str, task: str, descriptor: ModelDescriptor, *, as_a_writer: bool = False) -> None:
        """Raise what writing this descriptor's database would meet, where that is known without writing anything.

        A name the layout refuses, a read-only store (a read-only filesystem,
        no permission, a server's grants). A full disk shows only when a write
        fails. ``as_a_writer``: what a read-write open of the same store would
        meet, this handle's being read-only aside (a dry run's question).
        """
        self.storage.check_writable(Location.of(role, task, descriptor), as_a_writer=as_a_writer)

    def find(self, role: str, task: str, descriptor: ModelDescriptor) -> Database | None:
        """The database of ``descriptor`` if it has anything to read (:meth:`open_existing`); creates nothing."""
        return self.open_existing(Location.of(role, task, descriptor))

    def open_existing(self, location: Location) -> Database | None:
        """:meth:`open`, or None when there is nothing to read (no database, or no tables yet)."""
        _check_location(location, "open_existing")
        return self._upgraded_if_behind(location, lambda: self.storage.open_existing(location))

    def open(self, location: Location) -> Database:
        """Open an existing descriptor database (verifying its metadata and its schema)."""
        _check_location(location, "open")
        return self._upgraded_if_behind(location, lambda: self.storage.open(location))

    def stored_metadata(self, location: Location) -> StoredMetadata:
        """``location``'s metadata verified, without opening its database (whatever its schema's state)."""
        _check_location(location, "stored_metadata")
        return self.storage.stored_metadata(location)

    def _read_existing(self, location: Location) -> Database | None:
        """:meth:`Storage.open_existing` for a read, which never upgrades: one that is behind says so."""
        return self._upgraded_if_behind(location, lambda: self.storage.open_existing(location), reading=True)

    def _upgraded_if_behind(self, location: Location, open_it: Callable[[], T], *, reading: bool = False) -> T:
        """``open_it()``; a database that is behind is upgraded first when ``auto_upgrade`` is set, unless this is a
        ``reading`` (or the store read-only): a read never upgrades, and says so.

        ``up-to-date`` is success too: another process (a job started at the
        same time) upgraded it between the check and the upgrade, which takes
        the file's lock and checks again. A ``failed`` upgrade was restored, a
        ``refused`` one wrote nothing: both raise :class:`UpgradeFailedError`
        saying which.
        """
        try:
            return open_it()
        except SchemaBehindError as behind:
            read = reading or self.readonly  # never upgrades
            if read and self.settings.auto_upgrade:  # its message would offer what is set already
                raise SchemaBehindError(behind.where, behind.found, behind.expected, read_only=True) from None
            if not self.settings.auto_upgrade:
                raise
            (result,) = self.storage.upgrade([location])
            if result.outcome is UpgradeOutcome.FAILED:
                raise UpgradeFailedError(
                    result.where,
                    f"automatic upgrade from {behind.found} failed ({result.error}); the database was restored",
                ) from behind
            if result.outcome is UpgradeOutcome.REFUSED:
                raise UpgradeFailedError(
                    result.where,
                    f"automatic upgrade from {behind.found} was refused ({result.error}); nothing was written",
                ) from behind
            if result.outcome is UpgradeOutcome.UPGRADED:  # a file doubled in size, without a word (was)
                kept = f"; its backup: {result.backup}" if result.backup is not None else ""
                warn_the_caller(
                    f"{result.where}: upgraded from revision {result.from_revision} to {result.to_revision} as it was "
                    f"opened (JUDGESTORE_AUTO_UPGRADE){kept}",
                    AutoUpgradeWarning,
                )
        return open_it()

    def discard_if_empty(self, location: Location) -> bool:
        """Remove a server's descriptor schema that holds no row (a failed copy's); a folder's are kept."""
        if self.readonly:
            raise InvalidInputError(f"{self.where} was opened read-only: nothing is removed")
        return self.storage.discard_if_empty(location)

    # ------------------------------------------------------------ looking at the whole store

    def infos(self, locations: Iterable[Location], *, count_rows: bool = True) -> Iterator[DatabaseInfo]:
        """Each database's state (and rows), read-only; a bad database is a state, never an error."""
        return self.storage.infos(locations, count_rows=count_rows)

    def upgrade(
        self,
        locations: Iterable[Location],
        *,
        keep_backup: bool = True,
        script: ScriptDirectory | None = None,
        dry_run: bool = False,
    ) -> Iterator[UpgradeResult]:
        """Upgrade every database among ``locations`` that is behind; report the others (as the backend does it).
        ``dry_run`` (a read-only store will do): the checks an upgrade makes before it writes, nothing written."""
        return self.storage.upgrade(locations, keep_backup=keep_backup, script=script, dry_run=dry_run)

    def verify(self, location: Location) -> DatabaseVerification:
        return self.storage.verify(location)

    def vacuum(self, locations: Iterable[Location], *, dry_run: bool = False) -> Iterator[VacuumResult]:
        """Give back the space of deleted rows (a folder store; a server store refuses, saying why); with
        ``dry_run``, the same checks and an estimate of the space, nothing changed (see
        :mod:`store.backends.sqlite.vacuum`)."""
        return self.storage.vacuum(locations, dry_run=dry_run)

    def shown(self, where: str) -> str:
        """A database's ``where`` as tables show it (under the root for a folder store)."""
        return self.storage.shown(where)

    def require_present(
        self,
        purpose: str,
        options: str = "--store-root or --store-url (or JUDGESTORE_STORE_ROOT, JUDGESTORE_STORE_URL)",
    ) -> None:
        """Raise :class:`StoreMissingError` unless a store is here (a folder; a server with a registry): a command
        ``purpose`` names ("to verify") must not take a mistyped root for an empty store. Creates nothing."""
        if (why := self.storage.absence()) is not None:
            raise StoreMissingError(self.where, f"{why}: there is no store {purpose}; check {options}")

    def strays(self, selector: Selector | None = None) -> list[Problem]:
        """What is not part of the layout: files and folders of a folder store, a server's unregistered schemas and
        unreadable registry rows; with a non-empty ``selector``, only what lies where the databases it picks
        belong (a folder store's descriptor folder whose database is missing)."""
        return self.storage.strays(selector or Selector())

    def unlisted(self, selector: Selector | None = None) -> list[Problem]:
        """Databases the listing leaves out (:meth:`Storage.unlisted`); none a non-empty ``selector`` could pick."""
        return [] if selector is not None and not selector.is_empty() else self.storage.unlisted()


def _reopened(settings: Settings, root: Path | None, url: str | None, readonly: bool) -> Store:
    """The store :meth:`Store.__reduce__` describes, opened again."""
    return Store(settings, root=root, url=url, readonly=readonly)


def _check_location(location: object, method: str) -> None:
    """Refuse what is no :class:`Location` (a path, a role, None): it failed deep inside as a bare AttributeError."""
    if not isinstance(location, Location):
        raise InvalidInputError(
            f"Store.{method} takes a Location (from store.locations() or store.select(...)), not "
            f"{type(location).__name__} {location!r:.60}; by role, task and descriptor: store.find(role, task, "
            "descriptor)"
        )
