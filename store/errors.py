"""One exception hierarchy for judgestore.

Every error is a :class:`JudgestoreError`. Messages name the file or object
at fault, say what is wrong, and, where there is one, the next command to
run. Callers chain the original exception (``raise ... from e``).
"""

from __future__ import annotations

from pathlib import Path


class JudgestoreError(Exception):
    """Base class of every error judgestore raises on purpose."""


class InvalidInputError(JudgestoreError, ValueError):
    """A value given to judgestore cannot be used (bad message, bad segment...)."""


class LayoutError(JudgestoreError):
    """The folder tree of a store is not what judgestore wrote."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: {message}")


class MetadataMismatchError(LayoutError):
    """A descriptor folder's name does not match the hash of its metadata.json."""


class MetadataMissingError(LayoutError):
    """A descriptor folder has no readable metadata.json."""


class DatabaseError(JudgestoreError):
    """A database file cannot be used as it is."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: {message}")


class DatabaseMissingError(DatabaseError):
    """A read-only open of a database that does not exist."""


class NotADatabaseError(DatabaseError):
    """The file is not an SQLite database at all."""


class CorruptDatabaseError(DatabaseError):
    """The file is SQLite but damaged (truncated, malformed pages)."""


class SchemaError(DatabaseError):
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
            "library (`pip install -U judgestore`); the file was not touched.",
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


class NetworkFilesystemError(DatabaseError):
    """The database lies on a network filesystem and the policy refuses it."""


class DatabaseBusyError(DatabaseError):
    """Another process kept the database locked longer than the retry budget."""


class EmptyFilterError(JudgestoreError, ValueError):
    """A delete without any filter: it would empty the table, so it is refused."""

    def __init__(self) -> None:
        super().__init__(
            "refusing to delete with an empty filter (it would delete every row); "
            "name at least one of benchmark, instruction_id, model, model_a, "
            "model_b, judge, orientation, pair, run_id, created_after, created_before"
        )


class HostedAPIError(JudgestoreError):
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


class HostedRequestError(HostedAPIError):
    """The server rejected the request itself (400, 422): a setting it does not accept."""


class HostedResponseError(HostedAPIError):
    """The server answered 200 with a body that is not a completion (malformed JSON, no choices)."""


class HostedUnavailableError(HostedAPIError):
    """429 / 5xx / timeouts / connection errors that outlasted every retry, or a Retry-After too long to wait."""
