"""What an import did, per source file: every row accounted for.

Contract: for each source, ``rows`` (outputs read, or known to be there when
the whole source was skipped or failed) equals ``imported + already_present
+ conflicts + sum(skipped) + sum(failed)``; :meth:`SourceReport.balanced`
checks it. Reasons are short sentences; each keeps up to
:data:`EXAMPLES_PER_REASON` row locators so a user can find the rows. A
conflict is a row whose recomputed key is already taken (in the store, or by
an earlier row of this import) by a *different* output: the row already
there is kept and the conflict is listed, never merged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.legacy.detect import LegacyVariant

EXAMPLES_PER_REASON = 5
LOCATOR_CHARS = 160  # the most of one example's locator a report keeps
CONFLICTS_LISTED = 50


@dataclass
class SourceReport:
    """The outcome of one source file."""

    path: Path
    variant: LegacyVariant | None
    state: str  # the detection state
    rows: int = 0
    imported: int = 0
    already_present: int = 0
    conflicts: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    conflict_list: list[dict[str, Any]] = field(default_factory=list)
    rekeyed: int = 0  # rows whose judgestore key differs from the legacy stored hash (S2, non-canonical inputs)
    targets: list[str] = field(default_factory=list)  # descriptor folders written (relative to the store root)
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # why the whole source was skipped or failed
    source_failed: bool = False  # the file itself is bad (its rows, if any are known, are counted in failed)
    unattributed: int = 0  # rows skipped because no descriptor could be named for them (counted in skipped too)

    def skip(self, reason: str, locator: str | None = None, count: int = 1) -> None:
        self.skipped[reason] += count
        self._example(reason, locator)

    def fail(self, reason: str, locator: str | None = None, count: int = 1) -> None:
        self.failed[reason] += count
        self._example(reason, locator)

    def fail_source(self, error: str, *, reason: str | None = None, count: int | None = None) -> None:
        """The source failed (``error``): ``count`` rows (default: all) fail with ``reason`` (default: ``error``)."""
        self.source_failed = True
        self.error = error
        self.fail(error if reason is None else reason, count=self.rows if count is None else count)

    def skip_source(self, reason: str, *, unattributed: bool) -> None:
        """Skip every row of the source; ``unattributed``: because no descriptor could be named for them."""
        self.error = reason
        self.skip(reason, count=self.rows)
        if unattributed:
            self.unattributed = self.rows

    def conflict(self, key: str, locator: str, kept: str, dropped: str) -> None:
        self.conflicts += 1
        if len(self.conflict_list) < CONFLICTS_LISTED:
            self.conflict_list.append({"input_hash": key, "row": locator, "kept": kept, "not_imported": dropped})

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def _example(self, reason: str, locator: str | None) -> None:
        if locator is None:
            return
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:  # a locator naming a row by its ids: an id may be a whole question
            shown.append(locator if len(locator) <= LOCATOR_CHARS else f"{locator[: LOCATOR_CHARS - 1]}…")

    @property
    def has_failures(self) -> bool:
        return self.source_failed or any(self.failed.values())

    @property
    def status(self) -> str:
        if self.has_failures:
            return "failed" if not (self.imported or self.already_present) else "partial"
        if self.imported or self.already_present:
            return "imported"
        if self.conflicts:  # every row differs from the one stored (kept): nothing of it was imported (was "imported")
            return "conflicts"
        return "skipped"

    def accounted(self) -> int:
        """Rows with an outcome so far."""
        outcomes = self.imported + self.already_present + self.conflicts
        return outcomes + sum(self.skipped.values()) + sum(self.failed.values())

    def balanced(self) -> bool:
        return self.rows == self.accounted()

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "variant": self.variant,
            "state": self.state,
            "status": self.status,
            "rows": self.rows,
            "imported": self.imported,
            "already_present": self.already_present,
            "conflicts": self.conflicts,
            "skipped": dict(self.skipped),
            "failed": dict(self.failed),
            "examples": self.examples,
            "conflict_list": self.conflict_list,
            "unattributed": self.unattributed,
            "rekeyed": self.rekeyed,
            "targets": self.targets,
            "assumptions": self.assumptions,
            "notes": self.notes,
            "error": self.error,
        }


@dataclass
class ImportReport:
    """Every source's report, and the totals."""

    store_root: str  # the store, as messages name it: its root folder, or its URL without the password
    dry_run: bool
    sources: list[SourceReport] = field(default_factory=list)
    ignored_files: int = 0

    def totals(self) -> dict[str, int]:
        return {
            "sources": len(self.sources),
            "rows": sum(s.rows for s in self.sources),
            "imported": sum(s.imported for s in self.sources),
            "already_present": sum(s.already_present for s in self.sources),
            "conflicts": sum(s.conflicts for s in self.sources),
            "skipped": sum(sum(s.skipped.values()) for s in self.sources),
            "unattributed": sum(s.unattributed for s in self.sources),
            "failed": sum(sum(s.failed.values()) for s in self.sources),
            # sources that failed with nothing imported: a file whose rows cannot be read adds none to "failed"
            "failed_sources": sum(s.status == "failed" for s in self.sources),
        }

    @property
    def ok(self) -> bool:
        """False when anything failed (a file, or a row) or rows were left out for want of a descriptor.

        Rows skipped for what they are (empty outputs, inputs that were never
        stored) and conflicts are reported and do not make an import fail.
        """
        return not any(s.has_failures or s.unattributed for s in self.sources)

    def as_dict(self) -> dict[str, Any]:
        return {
            "store_root": self.store_root,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "totals": self.totals(),
            "ignored_files": self.ignored_files,
            "sources": [s.as_dict() for s in self.sources],
        }
