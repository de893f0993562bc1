"""One exception hierarchy for judgestore: every error it raises on purpose is defined here.

Contract:

* Every error is a :class:`JudgestoreError`; the command line prints one as
  a single line (or a JSON object) and exits 1.
* Messages name the file or object at fault, say what is wrong, and, where
  there is one, the next command to run. Callers chain the original
  exception (``raise ... from e``).
* ``path`` is always a :class:`~pathlib.Path` on this machine, or None; a
  path inside a remote is ``remote_path`` (a POSIX string). Errors about a
  descriptor database say ``where`` it is: a file's path, or a PostgreSQL
  server's schema (then ``path`` is None).
* Every SQLite, driver or filesystem failure on a store file reaches the
  caller as a :class:`DatabaseFileError` (``store.backends.sqlite.errors.translated``
  chooses which): damaged, full, not writable, busy, I/O... never as a raw
  ``sqlite3``, SQLAlchemy or ``OSError`` exception.
* Families: the store's files (:class:`DatabaseFileError`, :class:`LayoutError`),
  bad input (:class:`InvalidInputError`), sharing (:class:`SyncError`),
  legacy imports (:class:`LegacyError`), models and engines
  (:class:`ModelError`; one request the engine or server refuses is a
  :class:`RequestRefusedError`, which fails alone), and the cache boundary
  (:class:`CacheMissError`, :class:`AdoptionError`, and
  :class:`RequestsFailedError`, raised at the end of a call some of whose
  requests failed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# judgestore is installed from its clone or from a wheel built there, not from the package index: a message
# that asks for an upgrade or an optional package says how it is done for such an install.
UPGRADE_HOW = "in its clone: `git pull && pip install -e .`; or install a newer wheel"
UPGRADE_JUDGESTORE = f"upgrade judgestore ({UPGRADE_HOW})"


def install_hint(extra: str, packages: str) -> str:
    """How to install what an optional feature needs: the packages, or judgestore's extra from its clone."""
    return f"`pip install {packages}` (judgestore's {extra} extra: `pip install -e '.[{extra}]'` in its clone)"


class JudgestoreError(Exception):
    """Base class of every error judgestore raises on purpose.

    ``rows_kept`` is set by a command that stored rows before it failed (a
    run that met a full disk): they are intact, and a rerun does not compute
    them again. Notes added with :meth:`add_note` are part of the message the
    command line prints.
    """

    rows_kept: int | None = None


class InvalidInputError(JudgestoreError, ValueError):
    """A value given to judgestore cannot be used (bad message, bad segment...)."""


class UnsupportedMessageError(InvalidInputError):
    """A chat message judgestore cannot key as it stands: a tool message, a tool call, a name, content blocks."""


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


class RowGoneError(DatabaseFileError):
    """A row a lookup found was deleted before its deferred ``input_text`` was read (:mod:`store.deferred`)."""


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

    def __init__(self, path: Path | str, found: str, expected: str) -> None:
        self.found, self.expected = found, expected
        super().__init__(
            path,
            f"schema revision {found} is older than this library's {expected}. "
            "Take a backup if you want one (the upgrade also keeps one), then run "
            "`judgestore db upgrade` (or set JUDGESTORE_AUTO_UPGRADE=1).",
        )


class SchemaAheadError(SchemaError):
    """The database was written by a newer judgestore than this one."""

    def __init__(self, path: Path | str, found: str, expected: str) -> None:
        self.found, self.expected = found, expected
        super().__init__(
            path,
            f"schema revision {found} is unknown to this library (its newest is "
            f"{expected}): the file was written by a newer judgestore. Upgrade the "
            f"library ({UPGRADE_HOW}); the file was not touched.",
        )


class ForeignDatabaseError(SchemaError):
    """An SQLite file that judgestore did not create (another tool's tables)."""

    def __init__(self, path: Path | str, tables: list[str]) -> None:
        self.tables = tables
        shown = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
        super().__init__(
            path,
            f"not a judgestore database (it has tables {shown} and no "
            "judgestore_alembic_version table); refusing to touch it. "
            "Old judgestore-era caches are imported with `judgestore import`.",
        )


class UpgradeFailedError(SchemaError):
    """A migration failed; the database was restored to its state before the upgrade."""


class MigrationScriptsError(JudgestoreError):
    """The shipped migration scripts are not one line of revisions (a packaging error)."""


class NetworkFilesystemError(DatabaseFileError):
    """The database lies on a network filesystem and the policy refuses it."""


class DatabaseBusyError(DatabaseFileError):
    """Another process kept the database locked longer than the retry budget."""


class ServerError(JudgestoreError):
    """A PostgreSQL store's server cannot be used as asked (``url`` is shown without its password)."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        super().__init__(f"{url}: {message}")


class ServerUnavailableError(ServerError):
    """The server cannot be reached, or dropped the connection and stayed away past every retry."""


class ServerAuthError(ServerError):
    """The server refused the credentials."""


class ServerPermissionError(ServerError):
    """The store's user may not do what the store needs (create schemas, write rows)."""


class ForeignSchemaError(ServerError):
    """A schema judgestore would use exists but belongs to something else; it is never touched."""


class ServerBusyError(ServerError):
    """The server kept aborting the transaction (serialisation failures, deadlocks, lock or statement timeouts)
    past every retry; it was rolled back."""


class ServerFullError(ServerError):
    """The server ran out of a resource (disk, memory, connection slots); the transaction was rolled back."""


class ServerValueError(ServerError, InvalidInputError):
    """The server, or its driver, refused a value judgestore sent; nothing of the statement was kept.

    :func:`store.row_checks.check_values` refuses such values on both
    backends before anything is sent: this is what a value that passed it
    meets."""


class ServerSchemaError(ServerError):
    """A table or column the schema's revision promises is missing on the server: another tool edited it."""


class ServerDamagedError(ServerError):
    """The server reports damaged data (an index or a page): its administrator must repair it."""


class UnexpectedServerError(ServerError):
    """PostgreSQL or its driver failed in a way judgestore has no name for; the message carries their words."""


class StoreFullError(DatabaseFileError):
    """The filesystem holding a store file is full (or the user's quota is): the write was rolled back."""

    def __init__(self, path: Path | str, *, free_bytes: int | None, needed_bytes: int | None = None) -> None:
        self.free_bytes, self.needed_bytes = free_bytes, needed_bytes
        free = "" if free_bytes is None else f" ({_size(free_bytes)} free on its filesystem)"
        needed = (
            "Free some space"
            if needed_bytes is None
            else f"Free at least {_size(needed_bytes)} (about twice the rows being written: SQLite journals them)"
        )
        super().__init__(
            path,
            f"the disk is full{free}: nothing of the failed write was kept, and rows stored before it are intact. "
            f"{needed} or move the store (--store-root), then run the command again: "
            "rows already stored are not computed again.",
        )


class StoreNotWritableError(DatabaseFileError):
    """The filesystem refused a write: a read-only mount, or permissions. Nothing was changed."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(
            path,
            f"cannot be written ({reason}); nothing was changed. Read-only commands (ls, query, "
            "verify, db status, generate --mode readonly) work here; to write, remount it read-write, "
            "fix its permissions, or copy the store to a writable --store-root.",
        )


class DatabaseIOError(DatabaseFileError):
    """The operating system failed to read or write the file (an I/O error, a file it cannot open)."""


class DamagedTextError(CorruptDatabaseError):
    """A text value in the file is not valid UTF-8: the page holding it was damaged."""


class SchemaMismatchError(DatabaseFileError):
    """A table or column that the file's schema revision promises is missing: another tool edited the file."""


class UnexpectedDatabaseError(DatabaseFileError):
    """SQLite failed in a way judgestore has no name for; the message carries SQLite's own words."""


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


class EmptyFilterError(JudgestoreError, ValueError):
    """A delete without any filter: it would empty the table, so it is refused."""

    def __init__(self) -> None:
        super().__init__(
            "refusing to delete with an empty filter (it would delete every row); "
            "name at least one of benchmark, instruction_id, model, model_a, "
            "model_b, judge, orientation, pair, run_id, created_after, created_before"
        )


class StatementError(InvalidInputError):
    """A SQLAlchemy statement that ``Store.scalars``/``Store.execute`` cannot run across databases as asked."""


class NotCombinableError(StatementError):
    """A statement whose result across databases cannot be combined exactly from each database's own result."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} cannot be combined exactly across databases (only count, sum, min and max, grouped or not, "
            "can). Read the rows instead: `judgestore export` or store.export.to_pandas, then aggregate there"
        )


# ---------------------------------------------------------------- sharing (push / fetch)


class SyncError(JudgestoreError):
    """Base class of every push/fetch error.

    Two families: :class:`RemoteError` (the remote cannot be used right now;
    nothing was half-done: a push records nothing it could not confirm, a
    fetch imports nothing it did not validate) and :class:`UntrustedContentError`
    (something on the remote is not what judgestore writes; fetch reports it
    per file and carries on; nothing of it is imported).
    """


class RemoteError(SyncError):
    """The remote refused or failed a request."""

    def __init__(self, remote: str, message: str) -> None:
        self.remote = remote
        super().__init__(f"{remote}: {message}")


class RemoteAuthError(RemoteError):
    """401/403: the token is missing, invalid, or lacks the permission (never retried)."""


class RemoteNotFoundError(RemoteError):
    """404: no such repository or revision (never retried)."""


class RemoteUnavailableError(RemoteError):
    """A transient failure (409, 429, 5xx, timeouts) that outlasted every retry."""


class UntrustedContentError(SyncError):
    """A file on the remote is not what judgestore writes; nothing of it is used."""

    def __init__(self, remote_path: str, message: str) -> None:
        self.remote_path = remote_path
        self.reason = message
        super().__init__(f"{remote_path}: {message}")


class UnsafeRemotePathError(UntrustedContentError):
    """A remote path that is absolute, climbs out with ``..``, or is not canonically encoded."""


class ShardError(UntrustedContentError):
    """A shard failed validation (size, gzip, SHA-256, header, a row)."""


class RemoteMetadataError(UntrustedContentError):
    """A remote metadata.json that does not match its folder or this library's bytes."""


class BookkeepingError(SyncError):
    """The sync bookkeeping database cannot be used (e.g. written by a newer judgestore)."""


# ---------------------------------------------------------------- legacy imports


class LegacyError(JudgestoreError):
    """Base class of the errors of reading legacy caches."""


class DataFrameError(LegacyError):
    """A DataFrame cache (CSV, zipped CSV, parquet) cannot be read, or lacks a column."""


class LegacyMappingError(LegacyError, InvalidInputError):
    """A legacy descriptor that the live rules cannot reproduce (the message says why)."""


# ---------------------------------------------------------------- models and engines


class ModelError(JudgestoreError):
    """Base class of the errors about the model a run names and the engine that serves it."""


class UnpinnedModelError(ModelError):
    """A Hub model that can be pinned to a commit neither from the local cache nor through the Hub."""


class ModelNotFoundError(ModelError, InvalidInputError):
    """The Hub does not know this model, this revision, or refuses access to it."""


class ModelFolderNotFoundError(ModelError, InvalidInputError):
    """A model named by a path (``./m``, ``../m``, ``/m``, ``~/m``, or ``d/m`` with ``d`` an existing folder) that is
    not a folder."""


class EngineMismatchError(ModelError):
    """The engine vLLM loaded (commit, folder, chat template) is not what the descriptor names."""


class RequestRefusedError(ModelError, InvalidInputError):
    """The engine or server refused one request of a batch (a value it rejects, a prompt too long for it).

    That request fails alone: nothing of it is stored, and the rest of the batch is generated and stored.
    """


class PromptTooLongError(RequestRefusedError):
    """A prompt leaves no room for one generated token within the engine's context (``max_model_len``).

    Found with the model's own tokenizer and chat template before the engine loads.
    """


class BackendError(ModelError):
    """An engine or server broke the backend contract (e.g. returned the wrong number of generations)."""


class MissingDependencyError(JudgestoreError):
    """An optional package a feature needs is not installed; the message names what to install."""


# ---------------------------------------------------------------- the cache boundary


class CacheMissError(JudgestoreError):
    """``replay`` mode met an input that the store does not hold."""


class RequestsFailedError(JudgestoreError):
    """Some requests of a ``complete``/``judge`` call failed; every other one was answered (and stored).

    Raised at the end of the call. ``failures`` lists each failed input (an
    :class:`inference.cache.plan.Failure`: its request, sample and typed error);
    ``responses`` holds every response in request order, the failed ones
    marked with their ``error``, so nothing answered is lost by raising.
    """

    def __init__(self, message: str, *, failures: Sequence[Any], responses: Sequence[Any]) -> None:
        self.failures = list(failures)
        # A list is kept as given: the cache boundary's carries what its call did (``responses.run``).
        self.responses = responses if isinstance(responses, list) else list(responses)
        super().__init__(message)


class AdoptionError(JudgestoreError, ValueError):
    """``judgestore adopt`` has no single source descriptor it may adopt from: none, several, or one that differs
    in a field the caller did not allow. Raised before any engine is loaded; nothing is written."""


# ---------------------------------------------------------------- hosted models (OpenAI-compatible servers)


class HostedAPIError(ModelError):
    """A hosted API or served model (OpenAI-compatible endpoint) could not be used.

    ``endpoint`` is the base URL (never a secret); ``status`` the HTTP status
    when there was one. Messages never include an API key.
    """

    def __init__(self, endpoint: str, message: str, *, status: int | None = None) -> None:
        self.endpoint, self.status = endpoint, status
        super().__init__(f"{endpoint}: {message}")


class MissingAPIKeyError(HostedAPIError):
    """The environment variable that should hold the API key is not set."""


class HostedAuthError(HostedAPIError):
    """401 / 403: the server refused the API key, or the key may not use this model."""


class HostedNotFoundError(HostedAPIError):
    """404 for something other than the model: usually a base URL without its ``/v1``."""


class HostedModelNotFoundError(HostedNotFoundError):
    """The server does not serve the model the descriptor names."""


class HostedRequestError(HostedAPIError, RequestRefusedError):
    """The server rejected a request itself (400, 413, 422): a prompt too long for it, a value or setting it refuses.

    Like every :class:`RequestRefusedError`, it fails that request alone.
    """


class HostedResponseError(HostedAPIError):
    """The server answered 200 with a body that is not a completion (malformed JSON, no choices)."""


class HostedUnavailableError(HostedAPIError):
    """429 / 5xx / timeouts / connection errors that outlasted every retry, or a Retry-After too long to wait."""
