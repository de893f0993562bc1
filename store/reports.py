"""What a backend reports about its databases: their state, upgrades, verification and vacuuming.

Contract: these are the result types both backends (:mod:`store.backends`)
return through the seam (:mod:`store.backend`), so that what is above it
(the store, the command line) reads one shape whatever holds the databases.
Each names its database as messages do (``where``: a file's path, or a
server's schema) and never raises: what is wrong is a state, an outcome or a
:class:`Problem` with its message.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from store.claim_table import ClaimsSummary
from store.descriptor import input_hash
from store.errors import JudgestoreError
from store.layout import Location
from store.schema import USABLE_STATES, DatabaseState


@dataclass(frozen=True, slots=True)
class DatabaseInfo:
    """One database as :func:`database_info` found it.

    ``state`` is the most serious thing found: a file that cannot be read
    first, then a metadata.json that does not match, then the schema state.
    ``rows`` is counted for current databases only; ``error`` explains every
    state but current and empty.
    """

    location: Location
    where: str  # the database, as messages name it (a file, or a server's schema)
    state: DatabaseState
    revision: str | None
    head: str
    rows: int | None
    size_bytes: int
    error: str | None = None
    claims: ClaimsSummary | None = None  # shared batches' work queue, for current databases (store.claims)

    @property
    def ok(self) -> bool:
        """Whether the store opens this database as it is (empty ones are created at head)."""
        return self.state in USABLE_STATES

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.location.as_dict(),
            "path": self.where,
            "state": self.state.value,
            "ok": self.ok,
            "revision": self.revision,
            "head": self.head,
            "rows": self.rows,
            "size_bytes": self.size_bytes,
            "error": self.error,
            "claims": None if self.claims is None else self.claims.as_dict(),
        }


def info_json(info: DatabaseInfo) -> dict[str, Any]:
    """What :func:`info_of` reads back (the location aside: the caller knows it)."""
    return {k: v for k, v in dataclasses.asdict(info).items() if k != "location"} | {"state": info.state.value}


def info_lasting(data: dict[str, Any]) -> bool:
    """Whether an :func:`info_json` may be kept (:mod:`store.catalog`): not while its claims change with the clock,
    nor when the file could not be read (a lock or a permission, which come and go without changing the file)."""
    return data.get("state") != DatabaseState.UNREADABLE.value and ClaimsSummary.lasting(data.get("claims"))


def info_of(location: Location, data: dict[str, Any]) -> DatabaseInfo:
    """The :class:`DatabaseInfo` of ``location`` that :func:`info_json` gave ``data`` (through JSON, claims too)."""
    claims = data.get("claims")
    if isinstance(claims, dict):
        deadline = claims.get("oldest_deadline")
        if isinstance(deadline, str):
            deadline = datetime.fromisoformat(deadline)
        claims = ClaimsSummary(**(claims | {"oldest_deadline": deadline}))
    return DatabaseInfo(location, **(data | {"state": DatabaseState(data["state"]), "claims": claims}))


class UpgradeOutcome(enum.StrEnum):
    UPGRADED = "upgraded"
    UP_TO_DATE = "up-to-date"
    REFUSED = "refused"  # ahead, foreign, not a database, corrupt: never touched
    FAILED = "failed"  # the migration failed and the backup was restored
    WOULD_UPGRADE = "would_upgrade"  # a dry run: behind, and every check a real run makes first passed


@dataclass(frozen=True, slots=True)
class UpgradeResult:
    where: str  # the database, as messages name it (a file, or a server's schema)
    outcome: UpgradeOutcome
    from_revision: str | None
    to_revision: str | None
    backup: Path | None = None
    rows: dict[str, int] | None = None
    error: str | None = None


MAX_LISTED_BAD_ROWS = 10


class ProblemKind(enum.StrEnum):
    FILE = "file"  # not SQLite, damaged, unreadable
    INTEGRITY = "integrity"  # PRAGMA integrity_check found something
    METADATA = "metadata"  # metadata.json missing or not matching its folder
    SCHEMA = "schema"  # behind, ahead or foreign
    INPUT_HASH = "input-hash"  # a row's input_text does not hash to its input_hash
    TEXT = "text"  # a row holds text that is not valid UTF-8 (a damaged page)
    VALUE = "value"  # a row holds a value its column's type cannot read (JSON that does not decode, a bad time)
    STRAY = "stray"  # a file or folder that is not part of the layout


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # the file or folder at fault, or a server's schema
    kind: ProblemKind
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.where, "kind": self.kind.value, "message": self.message}


@dataclass(frozen=True, slots=True)
class DatabaseVerification:
    location: Location
    where: str
    rows_checked: int
    problems: tuple[Problem, ...]
    rows_adopted: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class RowChecks:
    """Problems found row by row: rows whose input does not hash to their key, rows whose text is damaged.

    ``where`` names the database in each problem (a file, or a server's schema), and each row named comes with
    the delete that removes it from ``location``'s database alone; at most :data:`MAX_LISTED_BAD_ROWS` rows are
    listed, then one problem counts them all.
    """

    def __init__(self, where: Path | str, location: Location) -> None:
        self.where = str(where)
        self.location = location
        self.checked = 0
        self.bad = 0
        self.problems: list[Problem] = []
        self._named: set[str] = set()  # keys of the rows named already (edited, damaged): not named again

    def _delete(self, key: str) -> str:
        """The command that deletes row ``key`` of this database, and no other database's row of the same input."""
        return f"judgestore delete {self.location.selector_options()} --input-hash {key}"

    def _add(self, kind: ProblemKind, message: str) -> None:
        self.bad += 1
        if self.bad <= MAX_LISTED_BAD_ROWS:
            self.problems.append(Problem(self.where, kind, message))

    def hashed(self, key: str, sample_index: int, rendered: str | bytes) -> None:
        self.checked += 1
        try:
            actual = input_hash(rendered, sample_index)
        except (JudgestoreError, ValueError) as e:
            actual = f"<unhashable: {e}>"
        if actual != key:
            self._named.add(key)
            self._add(
                ProblemKind.INPUT_HASH,
                f"row {key} (sample {sample_index}): its input_text hashes to {actual[:16]}..., not to its "
                f"input_hash; the row was edited. Delete it with `{self._delete(key)}` so that it is "
                "recomputed",
            )

    def damaged(self, key: str | None, place: str, undecodable: list[str], unreadable: list[str]) -> None:
        """A row with text that is not UTF-8 (``undecodable`` columns) or values its columns' types cannot read;
        ``place`` says where the row is when its key cannot (``rowid 7``, a server's ``ctid (0,7)``)."""
        self.checked += 1
        if key is not None:
            self._named.add(key)
        fix = (
            f"Delete it with `{self._delete(key)}` so that it is recomputed"
            if key is not None
            else "Its key is damaged too: restore the file from a backup, or delete the file to recompute its rows"
        )
        faults = [
            f"{', '.join(columns)} {'is' if len(columns) == 1 else 'are'} {what}"
            for columns, what in (
                (undecodable, "not valid UTF-8 (a damaged page)"),
                (unreadable, "not a value of its type (another tool wrote it?)"),
            )
            if columns
        ]
        self._add(
            ProblemKind.TEXT if undecodable else ProblemKind.VALUE,
            f"row {key or '?'} ({place}): {'; '.join(faults)}. {fix}",
        )

    def odd_time(self, key: str, place: str, stored: str) -> None:
        """A row whose ``created_at`` is text in another form than the store writes (another tool wrote it): it
        reads as a time, but the time filters compare the stored text. Counted among the bad rows, not the checked
        ones (its row is checked already); a row named already (edited, damaged) is not named again."""
        if key in self._named:
            return
        self._add(
            ProblemKind.VALUE,
            f"row {key} ({place}): created_at is {stored[:40]!r}, not in the form the store writes (UTC, "
            "'YYYY-MM-DD HH:MM:SS.ffffff'; another tool wrote it?): it reads without any offset it gives, and "
            "--since, --until and prune compare the stored text, so it may fall outside them. Rewrite it in that "
            f"form, or delete it with `{self._delete(key)}` so that it is recomputed",
        )

    def result(self) -> tuple[int, list[Problem]]:
        if self.bad > MAX_LISTED_BAD_ROWS:
            self.problems.append(Problem(self.where, ProblemKind.INPUT_HASH, f"{self.bad} rows in all have problems"))
        return self.checked, self.problems


class VacuumOutcome(enum.StrEnum):
    VACUUMED = "vacuumed"
    WOULD_VACUUM = "would_vacuum"  # a dry run's: every check passed, and bytes_after is the estimate
    EMPTY = "empty"  # a zero-byte database (what a store may hold, see store.schema): nothing to give back
    BUSY = "busy"  # another process held the database past the busy timeout: left as it was
    REFUSED = "refused"  # not ours, newer, damaged, or missing: never touched


@dataclass(frozen=True, slots=True)
class VacuumResult:
    location: Location
    path: Path
    outcome: VacuumOutcome
    bytes_before: int
    bytes_after: int
    error: str | None = None

    @property
    def freed(self) -> int:
        return max(self.bytes_before - self.bytes_after, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.location.as_dict(),
            "path": str(self.path),
            "outcome": self.outcome.value,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "freed": self.freed,
            "error": self.error,
        }
