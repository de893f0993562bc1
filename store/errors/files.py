"""The store's files: a folder tree that is not what judgestore wrote, a descriptor database it cannot use.

Contract:

* Errors about a descriptor database say ``where`` it is: a file's path, or
  a PostgreSQL server's schema (then ``path`` is None); ``path`` is always a
  :class:`~pathlib.Path` on this machine, or None.
* Every SQLite, driver or filesystem failure on a store file reaches the
  caller as a :class:`DatabaseFileError` (``store.backends.sqlite.errors.translated``
  chooses which): damaged, full, not writable, busy, I/O... never as a raw
  ``sqlite3``, SQLAlchemy or ``OSError`` exception.
* A schema revision that does not match says which way: behind (run
  ``judgestore db upgrade``) or ahead (upgrade the library); a file another
  tool made is refused untouched.
* A file written for the user, not part of the store (an export, a results
  file), that cannot be opened or written is an :class:`OutputWriteError`
  naming it: never blamed on the store.
"""

from __future__ import annotations

from pathlib import Path

from store.errors.base import UPGRADE_HOW, JudgestoreError
from store.errors.inputs import InvalidInputError

__all__ = [
    "ChangedUnderReadError",
    "CorruptDatabaseError",
    "DamagedTextError",
    "DamagedValueError",
    "DatabaseBusyError",
    "DatabaseFileError",
    "DatabaseIOError",
    "DatabaseMissingError",
    "ForeignDatabaseError",
    "InterruptedWriteError",
    "LayoutError",
    "MatchedMeanwhileError",
    "MetadataMismatchError",
    "MetadataMissingError",
    "MigrationScriptsError",
    "NetworkFilesystemError",
    "NotADatabaseError",
    "OutputWriteError",
    "RefusedValueError",
    "RowGoneError",
    "SchemaAheadError",
    "SchemaBehindError",
    "SchemaError",
    "SchemaMismatchError",
    "StoreFullError",
    "StoreMissingError",
    "StoreNotWritableError",
    "UnexpectedDatabaseError",
    "UpgradeFailedError",
]


def _place(where: Path | str) -> tuple[str, Path | None]:
    """How a message names a place, and its path when it is a file (a server's schema has none)."""
    if isinstance(where, Path) or "://" not in where:
        path = Path(where)
        return str(path), path
    return where, None


class LayoutError(JudgestoreError):
    """The folder tree of a store (or a server's registry) is not what judgestore wrote."""

    def __init__(self, where: Path | str, message: str) -> None:
        self.where, self.path = _place(where)
        super().__init__(f"{self.where}: {message}")


class MetadataMismatchError(LayoutError):
    """A descriptor folder's name does not match the hash of its metadata.json."""


class MetadataMissingError(LayoutError):
    """A descriptor folder has no readable metadata.json."""


class StoreMissingError(LayoutError):
    """A store that must exist (a copy's source) is not there: no such folder, or no registry on the server."""


class DatabaseFileError(JudgestoreError):
    """A descriptor database (a file, or a server's schema) cannot be used as it is."""

    def __init__(self, where: Path | str, message: str) -> None:
        self.where, self.path = _place(where)
        super().__init__(f"{self.where}: {message}")


class RefusedValueError(DatabaseFileError, InvalidInputError):
    """A file's constraint (CHECK, NOT NULL, UNIQUE) refused a value of a statement; nothing of it was kept. The
    rows judgestore writes are checked before they are written: a statement of the caller's meets this."""


class MatchedMeanwhileError(DatabaseFileError):
    """A delete met another number of matching rows than was counted and confirmed (a run committed rows it had
    dated before the count; another process deleted some): nothing was deleted from that database."""

    def __init__(self, where: Path | str, *, counted: int, matching: int) -> None:
        self.counted, self.matching = counted, matching
        why = (
            "a run committed rows dated before the count"
            if matching > counted
            else "another process deleted some of them (and may have written others)"
        )
        super().__init__(
            where,
            f"{matching:,} rows match now, {counted:,} were counted: {why} while the delete waited, so nothing was "
            "deleted from it. Run the command again, which counts again",
        )


class RowGoneError(DatabaseFileError):
    """A row a lookup found was deleted before its deferred ``input_text`` was read (:mod:`store.tables.deferred`)."""


class DatabaseMissingError(DatabaseFileError):
    """A read-only open of a database that does not exist."""


class NotADatabaseError(DatabaseFileError):
    """The file is not an SQLite database at all."""


class CorruptDatabaseError(DatabaseFileError):
    """The file is SQLite but damaged (truncated, malformed pages)."""


class SchemaError(DatabaseFileError):
    """The database's schema revision does not match this library."""


class SchemaBehindError(SchemaError):
    """The database was written by an older judgestore: it needs an upgrade."""

    def __init__(self, path: Path | str, found: str, expected: str, *, read_only: bool = False) -> None:
        """``read_only``: met by a read (a read-only store's, or a read across a store) with JUDGESTORE_AUTO_UPGRADE
        set, which the message would offer again; it says instead that a read never upgrades."""
        self.found, self.expected = found, expected
        head = f"schema revision {found} is older than this library's {expected}"
        if read_only:
            message = (
                f"{head}; it was met by a read (a command, a mode or a dry run that only reads, such as query, "
                "generate --mode replay or import --dry-run), which never upgrades, though JUDGESTORE_AUTO_UPGRADE "
                "is set (a command that writes, without --dry-run, would): run `judgestore db upgrade` (a folder "
                "store's keeps a backup of each file; for a server's, pg_dump first), then the command again."
            )
        else:
            message = (
                f"{head}. Take a backup if you want one (a folder store's upgrade also keeps one beside each file; a "
                "server's keeps none: use pg_dump), then run `judgestore db upgrade` (or set "
                "JUDGESTORE_AUTO_UPGRADE=1, with which a command that writes upgrades it first; one that only reads, "
                "such as ls, stats or query, never does, nor does a dry run)."
            )
        super().__init__(path, message)

    def for_a_reader(self, command: str, what: str = "database") -> str:
        """What to say where ``command`` only reads the database (``what``: copy's source, a push's): setting
        JUDGESTORE_AUTO_UPGRADE, which the message above offers, changes nothing for a command that never writes."""
        return (
            f"the {what} {self.where} is at schema revision {self.found}, older than this library's "
            f"{self.expected}, and {command} only reads it: upgrade it first (`judgestore db upgrade --store-root` "
            f"or `--store-url` naming it), then {command} again"
        )


class SchemaAheadError(SchemaError):
    """The database was written by a newer judgestore than this one."""

    def __init__(self, path: Path | str, found: str, expected: str) -> None:
        self.found, self.expected = found, expected
        it = "the file" if _place(path)[1] is not None else "the schema"  # a server's schema is no file
        super().__init__(
            path,
            f"schema revision {found} is unknown to this library (its newest is "
            f"{expected}): a newer judgestore wrote {it}, or one with migrations of "
            f"its own. Upgrade the library ({UPGRADE_HOW}); {it} was not touched.",
        )


class ForeignDatabaseError(SchemaError):
    """An SQLite file that judgestore did not create (another tool's tables)."""

    def __init__(self, path: Path | str, tables: list[str]) -> None:
        self.tables = tables
        shown = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
        on_file = _place(path)[1] is not None
        backup = "a backup (`*.bak-*` beside it after an upgrade)" if on_file else "a backup (pg_dump)"
        if "judgestore_alembic_version" in tables:  # ours, but its revision was emptied or doubled by hand
            message = (
                "its judgestore_alembic_version table does not hold exactly one revision (emptied or edited by "
                f"hand), so its schema is unknown; refusing to touch it. Restore it from {backup} or delete it to "
                "recompute its rows."
            )
        elif {"completions", "judgements"} & set(tables) and "runs" in tables:  # ours, its version table dropped
            message = (
                f"it has judgestore's tables ({shown}) but no judgestore_alembic_version table (dropped by hand?), "
                f"so its schema revision is unknown; refusing to touch it. Restore it from {backup} or delete it to "
                "recompute its rows."
            )
        else:
            message = (
                f"not a judgestore database (it has tables {shown} and no judgestore_alembic_version table); "
                "refusing to touch it. Old judgestore-era caches are imported with `judgestore import`."
            )
        super().__init__(path, message)


class UpgradeFailedError(SchemaError):
    """An upgrade did not happen: a migration failed (the database was restored to its state before the
    upgrade), or the upgrade was refused before anything was written; the message says which."""


class MigrationScriptsError(JudgestoreError):
    """The shipped migration scripts are not one line of revisions (a packaging error)."""


class NetworkFilesystemError(DatabaseFileError):
    """The database lies on a network filesystem and the policy refuses it."""


class DatabaseBusyError(DatabaseFileError):
    """Another process kept the database locked longer than the retry budget."""


class ChangedUnderReadError(DatabaseBusyError):
    """A writer changed the file under a read that takes no locks (a read-only read of a database no process had
    open: ``store.backends.sqlite.connections``); what it read may be torn. ``rows_given``: the rows a stream had
    given before, all read before the change (the rest were not given)."""

    def __init__(self, path: Path | str, *, rows_given: int = 0) -> None:
        self.rows_given = rows_given
        given = (
            f" The {rows_given:,} rows given before it were read before the change and are whole; the rest were not "
            "given."
            if rows_given
            else ""
        )
        super().__init__(
            path,
            "a writer changed it while it was read read-only (no process had it open when the read started, so "
            f"the read took no locks: it creates no file).{given} Run the command again: while a writer has the "
            "database open, read-only reads take SQLite's locks and see one snapshot.",
        )


class InterruptedWriteError(DatabaseFileError):
    """A write in the rollback journal was interrupted (its process killed mid-transaction): the ``-journal``
    beside the file holds the pages that undo it, and a read-only open cannot put them back."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(
            path,
            "a write to it was interrupted (its process ended mid-transaction): its rollback journal (the "
            "-journal file beside it) holds the pages that undo that write, and a read-only open cannot put them "
            "back; nothing was changed. Run `judgestore db upgrade` (or any command that writes to this store) "
            "where the store can be written: opening it for writing rolls the interrupted write back, and the rows "
            "committed before it are intact. Never delete the -journal file: the database would keep the "
            "half-written pages (damaged).",
        )


class StoreFullError(DatabaseFileError):
    """The filesystem holding a store file is full (or the user's quota is): the write was rolled back."""

    def __init__(
        self,
        path: Path | str,
        *,
        free_bytes: int | None,
        needed_bytes: int | None = None,
        needed_for: str = "",
        then: str = "run the command again: rows already stored are not computed again",
    ) -> None:
        """``needed_for`` names what the room was needed for when the write was refused before it began (an
        upgrade's backup); without it, a write met the full disk and was rolled back. ``then`` is what to do
        once there is room."""
        self.free_bytes, self.needed_bytes = free_bytes, needed_bytes
        free = "" if free_bytes is None else f" ({_size(free_bytes)} free on its filesystem)"
        if needed_for:
            needs = "" if needed_bytes is None else f" needs {_size(needed_bytes)}"
            message = f"the disk is full{free}: {needed_for}{needs}; nothing was changed. Free some space"
        else:
            needed = (
                "Free some space"
                if needed_bytes is None
                else f"Free at least {_size(needed_bytes)} (about twice the rows being written: SQLite journals them)"
            )
            message = (
                f"the disk is full{free}: nothing of the failed write was kept, and rows stored before it are intact. "
                f"{needed}"
            )
        super().__init__(path, f"{message} or move the store (--store-root), then {then}.")


class StoreNotWritableError(DatabaseFileError):
    """The filesystem refused a write: a read-only mount, or permissions. Nothing was changed."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(
            path,
            f"cannot be written ({reason}); nothing was changed. Read-only commands (ls, query, "
            "verify, db status, generate --mode readonly) work here; to write, remount it read-write, "
            "fix its permissions, or copy the store to a writable folder (`judgestore copy --from-root STORE "
            "--to-root DIR`) and use that.",
        )


def _size(n: int) -> str:
    """``n`` bytes for people: ``812 bytes``, ``3.4 MB``."""
    if n < 1000:
        return f"{n} bytes"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000:
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.1f} TB"


class DatabaseIOError(DatabaseFileError):
    """The operating system failed to read or write the file (an I/O error, a file it cannot open)."""


class DamagedTextError(CorruptDatabaseError):
    """A text value in the file is not valid UTF-8: the page holding it was damaged."""


class DamagedValueError(DatabaseFileError):
    """A stored value its column's type cannot read (JSON that does not decode, a time that is none): another tool
    wrote it."""

    @classmethod
    def read(cls, where: Path | str, detail: str) -> DamagedValueError:
        """The error of a read that met such a value; ``detail`` is the decoder's own words."""
        return cls(
            where,
            f"holds a value its column's type cannot read ({detail}); nothing was changed. `judgestore verify` "
            "names each such row and the `judgestore delete` that removes it from this database alone, so that "
            "it is recomputed; or restore the database from a backup",
        )


class SchemaMismatchError(DatabaseFileError):
    """A table or column that the file's schema revision promises is missing: another tool edited the file."""


class UnexpectedDatabaseError(DatabaseFileError):
    """SQLite failed in a way judgestore has no name for; the message carries SQLite's own words."""


class OutputWriteError(JudgestoreError):
    """An output file (``--output``, an export's destination, stdout) could not be opened or written; ``path``
    names it, not the store."""

    def __init__(self, path: Path | str, what: str, error: OSError, after: str = "") -> None:
        reason = error.strerror or str(error)
        super().__init__(f"{path}: could not write {what}: {reason}{'; ' + after if after else ''}")
        self.path = Path(path) if isinstance(path, Path) else None
