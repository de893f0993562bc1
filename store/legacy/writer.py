"""Imported records written into their descriptor databases, a chunk at a time, every outcome counted.

Contract:

* :class:`ChunkedWriter` keeps one pending chunk per destination (role, task,
  descriptor) and writes it when it holds ``chunk_size`` records, or on
  :meth:`ChunkedWriter.flush`. Each chunk is one ``BEGIN IMMEDIATE``
  transaction: the chunk's keys are looked up, new rows inserted (``INSERT ..
  ON CONFLICT DO NOTHING``), rows already there with the same output counted
  as already present, and rows already there with a different output
  reported as conflicts (the stored row is kept: local rows win). A killed
  import leaves whole chunks only, and a rerun imports exactly what is
  missing.
* A destination database is created (with the source's assumptions in its
  ``metadata.json``) the first time a record goes to it.
* ``dry_run`` (on a read-only store) writes nothing and creates nothing; it
  counts what a real run would, keys seen earlier in the same dry run
  included. Those keys are kept in a temporary SQLite file (:class:`_Seen`,
  deleted when the writer closes), so a dry run's memory stays flat however
  many rows the cache holds.
* Outcomes go into the :class:`~store.legacy.report.SourceReport` passed
  along; a chunk the store refuses fails its rows and marks the source failed.
  A server that cannot be reached, refuses the login or has no such database
  (:data:`~store.errors.STORE_UNUSABLE`) is no fault of the source: it is raised, and the
  import stops there.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import orjson

from store.descriptor import ModelDescriptor, sha256_hex
from store.errors import STORE_UNUSABLE, JudgestoreError
from store.layout import Location
from store.legacy.report import SourceReport
from store.roles import Role
from store.store import Database, Store
from store.tables.records import Record

Outcome = Literal["imported", "present", "conflict"]


def _preview(text: str) -> str:
    digest = sha256_hex(text.encode())[:12]
    shown = text if len(text) <= 40 else text[:39] + "…"
    return f"{shown!r} (sha256 {digest})"


class _Seen:
    """The rows a dry run would have written, by destination and key: each completion's SHA-256 and preview.

    Kept in a temporary SQLite database (``sqlite3.connect("")``: a private file that SQLite deletes when it is
    closed, with a page cache of a few MB), not in memory: a dry run over a cache of millions of rows held a few
    hundred MB of them. The digest compares two completions exactly, as a real run compares the stored text.
    """

    def __init__(self) -> None:
        self._conn = sqlite3.connect("")
        # Nothing to keep after a crash: no journal, no syncs; a page cache of 16 MB (SQLite's default is 2 MB)
        # holds about 100,000 rows before the file is read back, which costs a dry run of 200,000 rows 15 %.
        for pragma in ("journal_mode = OFF", "synchronous = OFF", "cache_size = -16000"):
            self._conn.execute(f"PRAGMA {pragma}")
        self._conn.execute(
            "CREATE TABLE seen (target INTEGER, key TEXT, digest BLOB, preview TEXT, PRIMARY KEY (target, key))"
            " WITHOUT ROWID"
        )

    def kept(self, target: int, keys: Iterable[str]) -> dict[str, tuple[bytes, str]]:
        """The (digest, preview) kept for each of ``keys`` this run saw before in ``target``."""
        found = self._conn.execute(
            "SELECT key, digest, preview FROM seen WHERE target = ? AND key IN (SELECT value FROM json_each(?))",
            (target, orjson.dumps(list(keys)).decode()),
        )
        return {key: (digest, preview) for key, digest, preview in found}

    def keep(self, target: int, rows: dict[str, tuple[bytes, str]]) -> None:
        with self._conn:
            self._conn.executemany(
                "INSERT INTO seen VALUES (?, ?, ?, ?)", ((target, k, d, p) for k, (d, p) in rows.items())
            )

    def close(self) -> None:
        self._conn.close()


@dataclass
class _Target:
    """One destination database, its number (a dry run's :class:`_Seen` keeps its keys under it), its pending
    chunk."""

    location: Location
    database: Database | None  # None: a dry run into a database that does not exist yet
    number: int
    pending: list[tuple[Record, str]] = field(default_factory=list)  # (record, row locator)


class ChunkedWriter:
    """Writes records to their databases in chunks; see the module docstring."""

    def __init__(self, store: Store, *, dry_run: bool, chunk_size: int) -> None:
        self.store = store
        self.dry_run = dry_run
        self.chunk_size = chunk_size
        self._targets: dict[tuple[Role, str, str], _Target] = {}
        self._seen = _Seen() if dry_run else None

    def close(self) -> None:
        """Delete what a dry run kept of the rows it saw (the writer writes nothing after this)."""
        if self._seen is not None:
            self._seen.close()

    def add(
        self,
        record: Record,
        locator: str,
        *,
        role: Role,
        task: str,
        descriptor: ModelDescriptor,
        assumptions: tuple[str, ...],
        report: SourceReport,
    ) -> None:
        """Queue ``record`` (``locator`` names its legacy row) for its database; a full chunk is written now."""
        target = self._target(role, task, descriptor, assumptions, report)
        target.pending.append((record, locator))
        if len(target.pending) >= self.chunk_size:
            self._write(target, report)

    def flush(self, report: SourceReport) -> None:
        """Write every pending chunk; outcomes are counted in ``report``."""
        for target in self._targets.values():
            self._write(target, report)

    def _target(
        self, role: Role, task: str, descriptor: ModelDescriptor, assumptions: tuple[str, ...], report: SourceReport
    ) -> _Target:
        key = (role, task, descriptor.sha256())
        target = self._targets.get(key)
        if target is None:
            if self.dry_run:
                database = self.store.find(role, task, descriptor)
            else:
                database = self.store.database(role, task, descriptor, assumptions=assumptions)
            location = Location.of(role, task, descriptor)
            target = self._targets[key] = _Target(location, database, len(self._targets))
        where = str(target.location.relative_folder())
        if where not in report.targets:
            report.targets.append(where)
        return target

    def _write(self, target: _Target, report: SourceReport) -> None:
        batch, target.pending = target.pending, []
        if not batch:
            return
        keys = [record.input_hash for record, _ in batch]
        try:
            if self._seen is not None:
                outcomes = _outcomes_dry(target, batch, keys, self._seen)
            else:
                outcomes = _outcomes_written(target, batch, keys)
        except STORE_UNUSABLE:
            raise
        except JudgestoreError as e:
            report.fail_source(
                f"{target.location.relative_folder()}: {e}", reason=f"not written: {e}", count=len(batch)
            )
            return
        except KeyboardInterrupt as e:  # counted if the chunk stands (see _outcomes_written), for the CLI's line
            if (landed := getattr(e, "landed_outcomes", None)) is not None:
                _count(batch, landed, report)
            raise
        _count(batch, outcomes, report)


def _count(batch: list[tuple[Record, str]], outcomes: list[tuple[Outcome, str | None]], report: SourceReport) -> None:
    """Account for a written chunk's rows in ``report``: imported, already present, or in conflict."""
    for (record, locator), (outcome, kept) in zip(batch, outcomes, strict=True):
        if outcome == "imported":
            report.imported += 1
        elif outcome == "present":
            report.already_present += 1
        else:
            assert kept is not None
            report.conflict(record.input_hash, locator, kept, _preview(record.completion))


def _outcomes_written(
    target: _Target, batch: list[tuple[Record, str]], keys: list[str]
) -> list[tuple[Outcome, str | None]]:
    assert target.database is not None
    outcomes: list[tuple[Outcome, str | None]] = []
    new: list[Record] = []
    try:
        with target.database.transaction() as repo:
            existing = {key: record.completion for key, record in repo.get_many(keys).items()}
            outcomes, new = _classify(batch, existing)
            written = repo.put_many(new, "ignore")
    except KeyboardInterrupt as e:
        # Ctrl-C during the commit lets it finish and is raised just after: the chunk (one transaction) may stand
        if outcomes and len(target.database.get_many(r.input_hash for r in new)) == len(new):
            e.landed_outcomes = outcomes  # type: ignore[attr-defined]
        raise
    if written != len(new):  # cannot happen under the write lock; say so rather than miscount
        raise JudgestoreError(f"expected to insert {len(new)} rows, inserted {written}")
    return outcomes


def _outcomes_dry(
    target: _Target, batch: list[tuple[Record, str]], keys: list[str], seen: _Seen
) -> list[tuple[Outcome, str | None]]:
    """A dry run's outcomes: against the rows stored, and those this run would have written before (``seen``)."""
    stored: dict[str, str] = {}
    if target.database is not None:
        stored = {key: record.completion for key, record in target.database.get_many(keys).items()}
    kept = seen.kept(target.number, (key for key in keys if key not in stored))
    new: dict[str, tuple[bytes, str]] = {}
    outcomes: list[tuple[Outcome, str | None]] = []
    for record, _ in batch:
        key = record.input_hash
        if key in stored:  # what the store holds is read whole: compared whole, as a real run does
            same = stored[key] == record.completion
            outcomes.append(("present", None) if same else ("conflict", _preview(stored[key])))
            continue
        digest = hashlib.sha256(record.completion.encode()).digest()
        before = kept.get(key) or new.get(key)
        if before is None:
            new[key] = (digest, _preview(record.completion))
            outcomes.append(("imported", None))
        else:
            outcomes.append(("present", None) if before[0] == digest else ("conflict", before[1]))
    seen.keep(target.number, new)
    return outcomes


def _classify(
    batch: list[tuple[Record, str]], existing: dict[str, str]
) -> tuple[list[tuple[Outcome, str | None]], list[Record]]:
    """Per row: imported (new), present (same output stored) or conflict (another output stored, kept)."""
    outcomes: list[tuple[Outcome, str | None]] = []
    new: list[Record] = []
    for record, _ in batch:
        kept = existing.get(record.input_hash)
        if kept is None:
            existing[record.input_hash] = record.completion
            new.append(record)
            outcomes.append(("imported", None))
        elif kept == record.completion:
            outcomes.append(("present", None))
        else:
            outcomes.append(("conflict", _preview(kept)))
    return outcomes, new
