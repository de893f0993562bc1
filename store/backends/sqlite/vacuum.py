"""Giving space back: ``VACUUM`` and a truncating WAL checkpoint of each descriptor database.

Contract:

* :func:`vacuum_database` compacts one SQLite file in place: under the
  file's lock (the one creation and upgrades take, so neither runs at the
  same time), it checks that the file is ours (its folder's metadata.json
  matches the location, its schema is current or behind, SQLite's
  ``quick_check`` finds nothing; ahead, foreign and damaged files, and
  edited or moved folders, are refused untouched), checkpoints the WAL
  (``wal_checkpoint(TRUNCATE)``), runs ``VACUUM`` (which rewrites the file
  without its free pages, in one transaction of SQLite's own), and
  checkpoints again so the WAL is emptied. Writers and readers of other
  processes, and the file's lock, are waited for up to the busy timeout; a
  database that stays busy is reported (``busy``) and left as it was. A
  reader still inside its snapshot after the VACUUM keeps the last
  checkpoint from writing the compacted pages back (the file no smaller,
  its WAL grown): that is ``busy`` too, with what to do.
* :func:`vacuum_store` does that for many databases, one bad or busy file
  never stopping the others. Rows are never changed; only free pages go.
* A dry run makes the same checks on a read-only connection, without the
  lock, and changes nothing: a database that passes them is reported
  ``would_vacuum``, its ``bytes_after`` the pages in use (SQLite's
  ``page_count`` less its ``freelist_count``), what VACUUM leaves at most
  (it may also pack half-empty pages) once the checkpoint empties the WAL.
* A PostgreSQL store is not compacted here: autovacuum makes the space of
  deleted rows reusable, and giving it back to the disk (``VACUUM FULL``)
  locks each table and needs its owner, so ``judgestore vacuum`` says that
  instead of doing it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DatabaseError

from store.backends.sqlite.connections import classify, create_sqlite_engine
from store.backends.sqlite.errors import file_locked, translated
from store.backends.sqlite.verify import DAMAGE_ADVICE, integrity_damage
from store.errors import DatabaseBusyError, JudgestoreError
from store.layout import Location, check_location_metadata, database_size
from store.reports import VacuumOutcome, VacuumResult
from store.schema import DatabaseState, status_error
from store.settings import Settings


def _is_busy(error: BaseException) -> bool:
    message = str(getattr(error, "orig", error)).lower()
    return "locked" in message or "busy" in message


def vacuum_database(root: Path, location: Location, settings: Settings, *, dry_run: bool = False) -> VacuumResult:
    """Compact one database, or with ``dry_run`` say what compacting it would give back (see the module
    docstring); never raises for a bad or busy file."""
    path = location.db_path(root)
    before = database_size(path)

    def result(outcome: VacuumOutcome, error: str | None = None, after: int | None = None) -> VacuumResult:
        return VacuumResult(location, path, outcome, before, database_size(path) if after is None else after, error)

    if not path.exists():
        return result(VacuumOutcome.REFUSED, f"{path}: does not exist")
    try:  # a folder whose metadata.json is not its descriptor's (edited, moved) is not ours to rewrite
        check_location_metadata(root, location)
    except JudgestoreError as e:
        return result(VacuumOutcome.REFUSED, str(e))
    except OSError as e:
        return result(VacuumOutcome.REFUSED, f"{location.metadata_path(root)}: cannot be read ({e.strerror or e})")
    with ExitStack() as held:
        try:  # a dry run only reads, as any reader does beside a writer: it waits for no lock
            if not dry_run:
                held.enter_context(file_locked(path, settings))
        except DatabaseBusyError as e:  # another upgrade or vacuum of it, past the busy timeout
            return result(VacuumOutcome.BUSY, str(e))
        except JudgestoreError as e:  # a lock file the disk cannot hold
            return result(VacuumOutcome.REFUSED, str(e))
        engine = create_sqlite_engine(path, settings, readonly=dry_run, pooled=False)
        try:
            with engine.connect() as conn:
                status = classify(conn, path)
                conn.rollback()
            if status.state is DatabaseState.EMPTY:
                return result(VacuumOutcome.EMPTY)
            if status.state not in (DatabaseState.CURRENT, DatabaseState.BEHIND):
                return result(VacuumOutcome.REFUSED, status_error(status, path) or f"{path}: {status.state.value}")
            raw = engine.raw_connection()
            try:
                driver: Any = raw.driver_connection
                # VACUUM copies what the tables' b-trees lead to (and builds the indexes again from it): on a
                # damaged page, the rows the damage hides would be gone for good
                damage = integrity_damage(driver.execute("PRAGMA quick_check").fetchall())
                if damage is not None:
                    return result(
                        VacuumOutcome.REFUSED,
                        f"{path}: {damage}. Not vacuumed (it would drop the rows the damage hides); nothing was "
                        f"changed. {DAMAGE_ADVICE}",
                    )
                if dry_run:
                    return result(VacuumOutcome.WOULD_VACUUM, after=_pages_in_use(driver))
                driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                driver.execute("VACUUM")
                (busy, *_) = driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:  # a reader's snapshot still needs the old pages: the compacted file waits in the WAL
                    return result(VacuumOutcome.BUSY, f"{path}: {READ_MEANWHILE.format(settings.busy_timeout_ms)}")
            finally:
                raw.close()
        except DatabaseError as e:
            if _is_busy(e):
                return result(
                    VacuumOutcome.BUSY, f"{path}: still in use after {settings.busy_timeout_ms} ms; try again"
                )
            return result(VacuumOutcome.REFUSED, str(translated(path, e)))
        except JudgestoreError as e:
            return result(VacuumOutcome.REFUSED, str(e))
        except sqlite3.Error as e:  # the driver's own errors: VACUUM runs on the raw connection
            if _is_busy(e):
                return result(
                    VacuumOutcome.BUSY, f"{path}: still in use after {settings.busy_timeout_ms} ms; try again"
                )
            return result(VacuumOutcome.REFUSED, str(translated(path, e)))  # a full disk, in the store's words
        finally:
            engine.dispose()
    return result(VacuumOutcome.VACUUMED)


READ_MEANWHILE = (
    "compacted, but another process kept reading it for {} ms, so the file could not take the compacted pages back "
    "from its write-ahead log (-wal) and is no smaller yet; run judgestore vacuum again once that process is done"
)


def _pages_in_use(connection: sqlite3.Connection) -> int:
    """Bytes of the pages holding something: what the file keeps after VACUUM, at most."""
    (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    (pages,) = connection.execute("PRAGMA page_count").fetchone()
    (free,) = connection.execute("PRAGMA freelist_count").fetchone()
    return int(page_size) * (int(pages) - int(free))


def vacuum_store(
    root: Path, locations: Iterable[Location], settings: Settings, *, dry_run: bool = False
) -> Iterator[VacuumResult]:
    for location in locations:
        yield vacuum_database(root, location, settings, dry_run=dry_run)
