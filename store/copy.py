"""Moving a store between backends: every selected descriptor database, row for row, verified.

Contract:

* :func:`copy_store` copies the descriptor databases a selector picks from
  one :class:`~store.store.Store` to another, whatever their backends (a
  folder to a PostgreSQL server, back, or folder to folder). The target
  database is created under the same descriptor and the same recorded
  assumptions. Rows are streamed from the source in chunks of
  ``chunk_size``; each chunk is written in one transaction that ignores rows
  already there. So a copy is idempotent (a second run writes nothing), and
  a copy killed half-way is finished by running it again: every chunk that
  committed is found, the others are written. A ``KeyboardInterrupt``
  (Ctrl-C) gets ``copy_report``, the report so far: its ``written`` counts
  are the rows committed before it (the chunk it stopped in is rolled back).
* What travels: every row with every column, ``adopted_from`` included (an
  adopted row stays adopted, from the same source descriptor), and the two
  bookkeeping tables, ``runs`` (what each call cost and saved: ``judgestore
  stats``) and ``adoptions`` (the audit behind adopted rows). Bookkeeping
  rows have no key of their own: a source row is copied unless the target
  already holds an identical one (every column but the id; counted as a
  multiset), so copying again adds nothing, and the target gives them new ids.
  What does not travel: backups, locks, sharing's workspace, and rows written
  to the source after its rows were read.
* Rows already in the target are never overwritten. A key the target holds
  with a different row (any column) is a *conflict*: the target's row is
  kept, the key is reported, and the database is not verified. One that
  differs only in its provenance (``run_id``, ``created_by``, ``created_at``,
  ``usage``, ``adopted_from``: the same answer, made by another run) is said
  to be so, with the delete that would let the source's row in.
* The copy is verified as it goes and per database: each chunk is read back
  from the target, and each row's digest (SHA-256 of its canonical JSON,
  every column, so NaN and -inf compare exactly) must equal the source's.
  A database is verified when every source row is in the target with the
  same digest and the order-independent sum of the digests (the database
  digest) is the same on both sides; anything else is reported per database,
  never silently accepted.
* Before anything is written: a source and a target that are the same store
  (or folders one inside the other), a source that does not exist (no
  folder; a server database without a judgestore registry) and a server that
  cannot be used (wrong URL, down, wrong password) are typed errors; so is a server that becomes unreachable
  or refuses the user during the copy (every database would fail alike). The
  source is only read (open it read-only). Any other failure ends the copy of
  that database alone: it is reported per database, naming the side where it
  happened (the source that could not be read, or the target that failed or
  refused a source row, with the row and what to do), and the others go on.
  A source a writer changed under a read that takes no lock (a folder
  store's read-only read, while a short job opened the file) is sound: its
  copy is made again from the start, a few times at most.
  A source that its backend's own check finds damaged
  (:meth:`~store.backend.Database.damage`: a damaged page or index hides
  rows from what is streamed) is such a failure, before any row is copied.
  A server target's database that the failed (or interrupted) copy had
  created and left without a row is removed again
  (:meth:`~store.store.Store.discard_if_empty`),
  so no empty database stays listed; a folder's empty file is kept (another
  process may hold it open) and a rerun fills it.
* A dry run (``dry_run=True``) reads both stores and writes to neither: it
  is the same copy with each write taken as done, so its report says what a
  copy would write (``written``, the bookkeeping), what the target already
  holds and which keys conflict, and ``verified`` is whether the database
  would verify. A target database that is not there yet holds nothing.
  Its JSON form says so in its own keys (``rows_to_write``, ``to_write``,
  ``would_verify``), its ``rows_written`` and ``written`` being 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, insert, select

from store import jsonvalues
from store.adoption import ADOPTIONS
from store.backends.postgres.connections import is_store_url
from store.descriptor import canonical_json
from store.errors import (
    STORE_UNUSABLE,
    ChangedUnderReadError,
    CorruptDatabaseError,
    DatabaseFileError,
    ForeignSchemaError,
    InvalidInputError,
    JudgestoreError,
    LayoutError,
    SchemaBehindError,
)
from store.interrupts import carrying
from store.layout import Location, Selector
from store.rows import batched
from store.runs import RUNS
from store.store import Database, Store
from store.tables.records import Record, record_fields
from store.tables.row_checks import check_row

DEFAULT_CHUNK_SIZE = 2_000
_DIGEST_MODULUS = 1 << 256
MAX_LISTED_KEYS = 10  # conflicting or unverified keys named per database (the counts are whole)
BOOKKEEPING: tuple[Table, ...] = (RUNS, ADOPTIONS)

# What makes one database impossible to copy while the others can go on (a server that is down stops the copy).
_DATABASE_ERRORS = (DatabaseFileError, LayoutError, ForeignSchemaError)
# What stops the whole copy: a server that cannot be reached or refuses the user would fail every database alike.
Progress = Callable[[str, int, int], None]  # (phase, done, total), as store.cli.common.progress_bars draws it


@dataclass
class CopiedDatabase:
    """What copying one descriptor database did, and whether the target now holds every source row."""

    location: Location
    source: str  # the source database, as messages name it
    target: str | None = None  # the target database (None: it could not be opened)
    source_rows: int = 0  # rows read from the source: all of them unless the copy of this database failed
    matched: int = 0  # source rows the target now holds, identical (digests equal)
    written: int = 0  # rows this copy inserted
    already_there: int = 0  # identical rows the target held before (or another writer wrote meanwhile)
    conflicts: int = 0  # keys the target holds with a different row: kept, reported
    missing: int = 0  # rows written that could not be read back
    source_digest: int = 0
    target_digest: int = 0
    bookkeeping: dict[str, int] = field(default_factory=dict)  # table -> rows copied
    conflicting_keys: list[str] = field(default_factory=list)
    same_answer_keys: list[str] = field(default_factory=list)  # listed conflicts that differ only in provenance
    problems: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Every source row is in the target, the same, and the database digests agree."""
        return (
            self.target is not None
            and not self.problems
            and self.matched == self.source_rows
            and not self.conflicts
            and not self.missing
            and self.source_digest == self.target_digest
        )

    def as_dict(self, *, dry_run: bool = False) -> dict[str, Any]:
        """The JSON form; a dry run's wrote and verified nothing: what it would is ``to_write`` and ``would_verify``."""
        return {
            **self.location.as_dict(),
            "source": self.source,
            "target": self.target,
            "source_rows": self.source_rows,
            "matched": self.matched,
            "written": 0 if dry_run else self.written,
            **({"to_write": self.written} if dry_run else {}),
            "already_there": self.already_there,
            "conflicts": self.conflicts,
            "missing": self.missing,
            "verified": self.verified and not dry_run,
            **({"would_verify": self.verified} if dry_run else {}),
            "source_digest": f"{self.source_digest:064x}",
            "target_digest": f"{self.target_digest:064x}",
            "bookkeeping": dict(self.bookkeeping),
            "conflicting_keys": list(self.conflicting_keys),
            "problems": list(self.problems),
        }


@dataclass
class CopyReport:
    source: str
    target: str
    databases: list[CopiedDatabase] = field(default_factory=list)
    dry_run: bool = False  # nothing was written: the counts are what a copy would write

    @property
    def ok(self) -> bool:
        return all(d.verified for d in self.databases)

    @property
    def rows_written(self) -> int:
        return sum(d.written for d in self.databases)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form. A dry run copied and wrote nothing (``databases_copied`` and ``rows_written`` 0): what a
        copy would is ``databases_to_copy`` and ``rows_to_write``; ``databases_failed`` counts those that would fail."""
        dry = self.dry_run
        verified = sum(d.verified for d in self.databases)  # whole in the target, checked (a dry run: would be)
        return {
            "source": self.source,
            "target": self.target,
            "ok": self.ok,
            "dry_run": dry,
            "databases_copied": 0 if dry else verified,
            **({"databases_to_copy": verified} if dry else {}),
            "databases_failed": len(self.databases) - verified,
            "source_rows": sum(d.source_rows for d in self.databases),
            "rows_written": 0 if dry else self.rows_written,
            **({"rows_to_write": self.rows_written} if dry else {}),
            "already_there": sum(d.already_there for d in self.databases),
            "conflicts": sum(d.conflicts for d in self.databases),
            "databases": [d.as_dict(dry_run=dry) for d in self.databases],
        }


# ---------------------------------------------------------------- digests


def _plain(value: Any) -> Any:
    """A column value as it is compared: JSON values as their canonical text (NaN kept), times in UTC."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict | list):
        return jsonvalues.dumps(value)
    return value


def row_digest(record: Record) -> int:
    """SHA-256 of the row's canonical JSON, every column (see the module docstring), as an integer."""
    values = {name: _plain(getattr(record, name)) for name in record_fields(type(record))}
    return int.from_bytes(hashlib.sha256(canonical_json(values)).digest(), "big")


# Where, when, by whom and at what cost a row was made: two rows differing only there hold the same answer.
_PROVENANCE = frozenset({"run_id", "created_by", "created_at", "usage", "adopted_from"})


def _differing_fields(ours: Record, theirs: Record) -> list[str]:
    names = record_fields(type(ours))
    return [name for name in names if _plain(getattr(ours, name)) != _plain(getattr(theirs, name))]


# ---------------------------------------------------------------- rows


class _SourceFailed(Exception):
    """A failure reading the source database, told apart from the target's while rows stream between them."""

    def __init__(self, error: JudgestoreError) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def _source_side() -> Iterator[None]:
    """Mark what fails inside as the source's (a server that cannot be reached still stops the copy)."""
    try:
        yield
    except STORE_UNUSABLE:
        raise
    except JudgestoreError as e:
        raise _SourceFailed(e) from e


def _read(records: Iterable[Record]) -> Iterator[Record]:
    with _source_side():
        yield from records


def _copy_chunk(chunk: Sequence[Record], target: Database | None, result: CopiedDatabase, dry_run: bool) -> None:
    """Write the rows of ``chunk`` the target lacks (one transaction), then read them back and compare; a dry run
    takes them as written and read back (``target`` None: a dry run's database that is not there yet)."""
    result.source_rows += len(chunk)  # read, whatever the target makes of them
    before = target.get_many((r.input_hash for r in chunk), deferred=False) if target is not None else {}
    fresh = [r for r in chunk if r.input_hash not in before]
    if dry_run or target is None:
        for record in fresh:  # what the write would refuse (nothing of the chunk written), a dry run says too
            check_row(result.location.role, record)
        written, after = len(fresh), {r.input_hash: r for r in fresh}
        result.written += written
    else:
        try:
            written = target.put_many(fresh) if fresh else 0
        except KeyboardInterrupt:
            # Ctrl-C during the commit lets it finish and is raised just after: the chunk (one transaction) may stand
            result.written += len(target.get_many(r.input_hash for r in fresh))
            raise
        result.written += written  # committed: counted at once, so that an interrupt from here on still counts them
        after = target.get_many((r.input_hash for r in fresh), deferred=False) if fresh else {}
    matched = matched_before = 0
    for record in chunk:
        want = row_digest(record)
        result.source_digest = (result.source_digest + want) % _DIGEST_MODULUS
        held = before.get(record.input_hash) or after.get(record.input_hash)
        if held is None:
            result.missing += 1
            continue
        got = row_digest(held)
        result.target_digest = (result.target_digest + got) % _DIGEST_MODULUS
        if got == want:
            matched += 1
            matched_before += record.input_hash in before
            continue
        result.conflicts += 1  # the target held it, or another writer wrote it between our lookup and our insert
        if len(result.conflicting_keys) < MAX_LISTED_KEYS:
            result.conflicting_keys.append(record.input_hash)
            differing = _differing_fields(record, held)
            fields = ", ".join(differing)
            if record.input_hash in before and differing and set(differing) <= _PROVENANCE:
                result.same_answer_keys.append(record.input_hash)
                said = (
                    f"the target holds the same answer under this key, made by another run (differs only in "
                    f"{fields}); the target's row was kept"
                )
            elif record.input_hash in before:
                said = f"the target holds another row under this key (differs in {fields}); the target's row was kept"
            else:  # it was not there a moment before: this copy wrote it, or another writer did meanwhile
                said = (
                    f"the target gives this row back changed (differs in {fields}): its table may have been altered "
                    "(run `judgestore verify` on the target), or another writer stored another row under this key "
                    "meanwhile"
                )
            result.problems.append(f"row {record.input_hash}: {said}")
    result.matched += matched
    result.already_there += matched_before + max(0, matched - matched_before - written)


def copy_database(
    source: Database,
    target: Database | None,
    result: CopiedDatabase,
    chunk_size: int,
    on_rows: Callable[[int], None],
    *,
    dry_run: bool = False,
) -> None:
    """Copy one database's rows chunk by chunk, then its bookkeeping (see the module docstring; ``target`` None:
    a dry run's database that is not there yet)."""
    if chunk_size < 1:
        raise InvalidInputError(f"chunk size must be at least 1, got {chunk_size}")
    for chunk in batched(_read(source.query()), chunk_size):
        _copy_chunk(chunk, target, result, dry_run)
        on_rows(len(chunk))
    if result.missing:
        result.problems.append(f"{result.missing} rows written to the target could not be read back from it")
    for table in BOOKKEEPING:
        name = str(table.name)  # added to an earlier attempt's (_copy_while_changed)
        result.bookkeeping[name] = result.bookkeeping.get(name, 0) + copy_bookkeeping(
            source, target, table, dry_run=dry_run
        )


# ---------------------------------------------------------------- bookkeeping


def _comparable(row: Sequence[Any]) -> tuple[Any, ...]:
    """A bookkeeping row as a hashable value that compares the same on both backends (JSON canonical)."""
    return tuple(_plain(v) for v in row)


def copy_bookkeeping(source: Database, target: Database | None, table: Table, *, dry_run: bool = False) -> int:
    """Copy ``table``'s rows the target lacks (identical rows compared without the id); returns rows copied (a dry
    run: rows it would copy; ``target`` None: a dry run's database that is not there yet)."""
    columns = [c for c in table.c if c.name != "id"]
    query = select(*columns).order_by(table.c.id)
    with _source_side(), source.reading() as repo:
        rows = repo.conn.execute(query).all()
    if not rows:
        return 0
    if target is None:
        return len(rows)
    if dry_run:
        with target.reading() as repo:
            return len(_lacking(rows, repo.conn.execute(query).all(), columns))
    with target.transaction() as repo:
        lacking = _lacking(rows, repo.conn.execute(query).all(), columns)
        if lacking:
            repo.conn.execute(insert(table), lacking)
    return len(lacking)


def _lacking(rows: Sequence[Any], held_rows: Sequence[Any], columns: Sequence[Any]) -> list[dict[str, Any]]:
    """The ``rows`` ``held_rows`` lacks, as a multiset (an identical row held twice covers two), as insert values."""
    held = Counter(_comparable(row) for row in held_rows)
    lacking = []
    for row in rows:
        key = _comparable(row)
        if held[key]:
            held[key] -= 1
        else:
            lacking.append({c.name: value for c, value in zip(columns, row, strict=True)})
    return lacking


# ---------------------------------------------------------------- stores


def overlapping(a: Store, b: Store) -> bool:
    """Whether two stores are the same database of the same server (as far as URLs tell), or the same folder or one
    folder inside the other (a copy would put the target's folders in the source, or the source's in the target)."""
    return a.storage.overlaps(b.storage)


def check_source(source: Store) -> None:
    """Raise :class:`StoreMissingError` unless ``source`` holds a store (a folder; a server with a registry)."""
    source.require_present("to copy", "--from-root or --from-url")


def check_target(target: Store) -> None:
    """Reach the target before anything is written (a wrong URL, a server down, a wrong password)."""
    target.locations()


def copy_store(
    source: Store,
    target: Store,
    selector: Selector | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    on_progress: Progress | None = None,
    dry_run: bool = False,
) -> CopyReport:
    """Copy the databases ``selector`` picks from ``source`` into ``target``; see the module docstring (a dry run
    writes nothing: ``target`` may be opened read-only)."""
    if chunk_size < 1:
        raise InvalidInputError(f"chunk size must be at least 1, got {chunk_size}")
    if overlapping(source, target):
        raise InvalidInputError(
            f"the source ({source.where}) and the target ({target.where}) are the same store, or one folder lies "
            "inside the other; nothing to copy: give a target outside the source"
        )
    check_source(source)
    check_target(target)
    report = CopyReport(source.where, target.where, dry_run=dry_run)
    with carrying("copy_report", report):  # what was copied (committed) before a Ctrl-C, for the CLI
        for location in source.select(selector):
            try:
                database = source.open_existing(location)
            except _DATABASE_ERRORS as e:  # behind or ahead of this library, not ours, edited metadata
                where = f"{source.where}: {location.relative_folder()}"
                report.databases.append(CopiedDatabase(location, where, problems=[_unreadable_source(e)]))
                continue
            if database is None:
                continue  # no tables yet: nothing to copy
            _copy_while_changed(database, target, report, chunk_size, on_progress, dry_run)
    return report


_READ_AGAIN = 3  # copies of one database, each reading its source from the start, while writers change it


def _copy_while_changed(
    database: Database,
    target: Store,
    report: CopyReport,
    chunk_size: int,
    on_progress: Progress | None,
    dry_run: bool,
) -> None:
    """:func:`_copy_one`, made again from the start (:data:`_READ_AGAIN` times at most) while a writer changes the
    source under a read that takes no lock; what an earlier attempt wrote counts as this copy's writing (found in
    the target since, it is no row the target held before). A dry run wrote nothing: it starts afresh."""
    result = CopiedDatabase(database.location, database.where)
    report.databases.append(result)  # in the report from the start: a Ctrl-C's report counts what it wrote
    for attempt in range(_READ_AGAIN):
        earlier = result.written
        changed_under = _copy_one(database, target, result, chunk_size, on_progress, dry_run, report.source)
        if attempt and not dry_run:
            result.already_there = max(0, result.already_there - earlier)
        if not changed_under or attempt == _READ_AGAIN - 1:
            return
        result = (
            CopiedDatabase(database.location, database.where)
            if dry_run
            else CopiedDatabase(database.location, database.where, written=result.written,
                                bookkeeping=dict(result.bookkeeping))
        )  # fmt: skip
        report.databases[-1] = result


def _letting_the_source_in(target: Store, location: Location, keys: list[str], unlisted: int) -> str:
    """What to run for the source's rows to take the place of the target's that hold the same answers: a delete
    naming the target store and the database (the default store may be the source: its rows would go), of the
    listed keys; ``unlisted`` conflicts past the list may be more such (said: the delete read as all of them)."""
    store = _store_option(str(target.where))
    hashes = " ".join(f"--input-hash {key}" for key in keys)
    return (
        "the answers agree; to hold the source's rows there instead, delete the target's and copy again: "
        f"`judgestore delete {store} {location.selector_options()} {hashes}`"
        + (
            f" (the {len(keys)} listed; {unlisted:,} more conflicts are not listed: the next copy lists them)"
            if unlisted
            else ""
        )
    )


def _store_option(where: str) -> str:
    """The option naming the store at ``where`` in a command to paste, quoted for a shell (a URL's "?host=..." is
    a pattern to zsh, a folder may hold a space)."""
    quoted = shlex.quote(where)
    return f"--store-url {quoted}" if is_store_url(where) else f"--store-root {quoted}"


def _unreadable_source(error: JudgestoreError) -> str:
    """Why a source database cannot be copied; a behind one's own advice (set JUDGESTORE_AUTO_UPGRADE=1, with which
    a command that writes upgrades it) is no way out here: copy writes only to its target."""
    if isinstance(error, SchemaBehindError):
        return error.for_a_reader("copy", what="source database")
    return f"the source database cannot be read: {error}"


def _copy_one(
    database: Database,
    target: Store,
    result: CopiedDatabase,
    chunk_size: int,
    on_progress: Progress | None,
    dry_run: bool,
    source: str,
) -> bool:
    """Copy one database (of the store at ``source``); a failure is reported in ``result``, naming the side where
    it happened (module docstring).

    True when the failure was a writer changing the source under a read-only read that takes no lock (a folder
    store's, while short jobs open the file): the file is sound, and reading it again from the start copies it.
    """
    location = result.location
    phase = f"{location.role}/{location.task}/{location.model}/{location.descriptor_hash16}"
    total = done = 0
    created = changed_under = False

    def advance(rows: int) -> None:
        nonlocal done
        done += rows
        if on_progress is not None:
            on_progress(phase, done, total)

    try:
        with _source_side():
            total = database.count()
            metadata = database.metadata()
            if (damage := database.damage()) is not None:  # a damaged index hides rows from what is streamed
                raise CorruptDatabaseError(
                    database.where, f"{damage}. Nothing was copied from it; run `judgestore verify` on the source"
                )
        destination = target.open_existing(location)
        created = destination is None and not dry_run
        if created:
            destination = target.database(
                location.role, location.task, metadata.descriptor, assumptions=metadata.assumptions
            )
        result.target = f"{target.where}: {location.relative_folder()}" if destination is None else destination.where
        held = metadata if destination is None else destination.metadata()
        if held.assumptions != metadata.assumptions:
            result.problems.append(
                f"the target records the assumptions {list(held.assumptions)}, the source {list(metadata.assumptions)}"
            )
        copy_database(database, destination, result, chunk_size, advance, dry_run=dry_run)
        if result.same_answer_keys:
            unlisted = result.conflicts - len(result.conflicting_keys)
            result.problems.append(_letting_the_source_in(target, location, result.same_answer_keys, unlisted))
        if dry_run and (destination is None or result.written or any(result.bookkeeping.values())):
            try:  # what the copy would meet writing there, asked without writing: grants, a read-only disk
                target.check_writable(location.role, location.task, metadata.descriptor, as_a_writer=True)
            except JudgestoreError as e:
                result.problems.append(f"the copy would fail at the target {result.target}: {e}")
    except _SourceFailed as e:
        if isinstance(e.error, ChangedUnderReadError):
            changed_under = True
            result.problems.append(f"the source {database.where} changed while it was read: {e.error}")
        else:
            result.problems.append(f"the source {database.where} cannot be read: {e.error}")
    except STORE_UNUSABLE:
        raise
    except KeyboardInterrupt:  # as a failure does: an empty database it created stays listed until a rerun (was)
        if created and not result.written and not any(result.bookkeeping.values()):
            with contextlib.suppress(JudgestoreError):
                target.discard_if_empty(location)
        raise
    except InvalidInputError as e:  # a source row the target refuses: its key, or a value no store keeps now
        refused = (  # the copy of this database stops at its first refused row: the chunks after it are not read
            "would refuse a source row, and the copy of this database would stop there: its chunk and the rows "
            "after it would not be written"
            if dry_run
            else "refused a source row, and the copy of this database stopped there: its chunk and the rows after "
            "it were not written"
        )
        delete = (  # of the source, named: the default store may be the target (was: no store named)
            f"judgestore delete {_store_option(source)} {location.selector_options()} --input-hash HASH"
        )
        result.problems.append(
            f"the target {result.target or target.where} {refused}: {e}. The source was only read: delete or "
            f"rewrite that row in the source (`{delete}`; `judgestore verify` checks every row's key), then copy "
            "again" + ("" if dry_run else "; rows already copied are kept")
        )
    except JudgestoreError as e:  # the target's database is behind, ahead, not ours, full, refused a write...
        result.problems.append(f"the target {result.target or target.where} failed: {e}")
    finally:
        if on_progress is not None and done < total:
            on_progress(phase, total, total)  # the bar goes, whatever happened
    if created and result.problems and not result.written and not any(result.bookkeeping.values()):
        _discard(target, location, result)
    return changed_under


def _discard(target: Store, location: Location, result: CopiedDatabase) -> None:
    """Remove the empty database a failed copy created in a server target, so that nothing empty stays listed."""
    try:
        if target.discard_if_empty(location):
            result.problems.append("the empty database this copy had created in the target was removed")
            result.target = None
    except JudgestoreError as e:
        result.problems.append(f"the empty database this copy created in the target could not be removed: {e}")
