"""Moving a store between backends: every selected descriptor database, row for row, verified.

Contract:

* :func:`copy_store` copies the descriptor databases a selector picks from
  one :class:`~store.store.Store` to another, whatever their backends (a
  folder to a PostgreSQL server and back): the target database is created
  under the same descriptor (and the same recorded assumptions), and rows
  are streamed in chunks of ``chunk_size``, each written in one transaction
  ignoring rows already there. So a copy is idempotent, and a copy killed
  half-way is finished by running it again.
* Rows already in the target are never overwritten; a key the target holds
  with a different output is counted as a conflict (the target's row is kept).
* The copy is verified as it goes: each chunk is read back from the target,
  and an order-independent digest of (key, sample, output) over the source's
  rows must equal the digest of what the target holds under those keys. A
  mismatch is reported per database, never silently accepted.
* The source store is only read (open it read-only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from store.layout import Location, Selector
from store.records import Record
from store.store import Database, Store

DEFAULT_CHUNK_SIZE = 2_000
_DIGEST_MODULUS = 1 << 256


@dataclass
class CopiedDatabase:
    """What copying one descriptor database did."""

    location: Location
    source_rows: int = 0
    written: int = 0
    already_there: int = 0
    conflicts: int = 0
    verified: bool = False
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**self.location.as_dict(), "source_rows": self.source_rows, "written": self.written,
                "already_there": self.already_there, "conflicts": self.conflicts, "verified": self.verified,
                "problem": self.problem}  # fmt: skip


@dataclass
class CopyReport:
    source: str
    target: str
    databases: list[CopiedDatabase] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(d.verified and not d.conflicts for d in self.databases)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "ok": self.ok,
            "rows_written": sum(d.written for d in self.databases),
            "databases": [d.as_dict() for d in self.databases],
        }


def _chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _digest(records: Iterable[Record]) -> int:
    """An order-independent digest of (key, sample, output): the sum of each row's SHA-256."""
    total = 0
    for r in records:
        row = f"{r.input_hash}\0{r.sample_index}\0{r.completion}".encode()
        total = (total + int.from_bytes(hashlib.sha256(row).digest(), "big")) % _DIGEST_MODULUS
    return total


def copy_database(
    source: Database, target: Database, result: CopiedDatabase, chunk_size: int, on_rows: Callable[[int], None]
) -> None:
    """Copy one database's rows chunk by chunk, reading each chunk back from the target to verify it."""
    expected = found = 0
    for chunk in _chunks(source.query(), chunk_size):
        keys = [r.input_hash for r in chunk]
        result.source_rows += len(chunk)
        present = target.get_many(keys)
        result.already_there += sum(1 for r in chunk if present.get(r.input_hash) == r)
        result.conflicts += sum(1 for r in chunk if r.input_hash in present and present[r.input_hash] != r)
        fresh = [r for r in chunk if r.input_hash not in present]
        if fresh:
            result.written += target.put_many(fresh)
        expected = (expected + _digest(chunk)) % _DIGEST_MODULUS
        found = (found + _digest(target.get_many(keys).values())) % _DIGEST_MODULUS
        on_rows(len(chunk))
    if found == expected:
        result.verified = True
    else:
        result.problem = "the target does not hold every source row with the same output (see conflicts)"


@dataclass
class _Progress:
    phase: str
    total: int
    report: Callable[[str, int, int], None] | None
    done: int = 0

    def advance(self, rows: int) -> None:
        self.done += rows
        if self.report is not None:
            self.report(self.phase, self.done, self.total)


def copy_store(
    source: Store,
    target: Store,
    selector: Selector | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> CopyReport:
    """Copy the databases ``selector`` picks from ``source`` into ``target``; see the module docstring."""
    report = CopyReport(source.where, target.where)
    for location in source.select(selector):
        database = source.open_existing(location)
        if database is None:
            continue  # no tables yet: nothing to copy
        metadata = database.metadata()
        result = CopiedDatabase(location)
        report.databases.append(result)
        progress = _Progress(str(location.relative_folder()), database.count(), on_progress)

        destination = target.database(
            location.role, location.task, metadata.descriptor, assumptions=metadata.assumptions
        )
        copy_database(database, destination, result, chunk_size, progress.advance)
    return report
