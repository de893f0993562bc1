"""Configuration through the environment (``JUDGESTORE_*``) or arguments.

Contract: nothing is read at import time. Build a :class:`Settings` where it is
needed (``Settings()`` reads the environment then); every field has a default
a new user can live with.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from store.caller import warn_the_caller
from store.errors import InvalidInputError
from store.spelling import meant

JournalPolicy = Literal["auto", "refuse-network", "rollback", "wal"]


def _default_user() -> str:
    try:
        user = getpass.getuser()
        user.encode()  # a $LOGNAME or $USER that is not UTF-8 (surrogates) could not be stored
        return user
    except (KeyError, OSError, UnicodeEncodeError):  # no passwd entry (containers) and no $USER
        return f"uid-{os.getuid()}"


def home_expanded(path: Path) -> Path:
    """``path`` with a leading ``~`` or ``~/`` made the home folder (a shell leaves it in ``VAR='~/x'`` and
    ``--opt=~/x``, and a literal ``./~`` folder would be made); ``~name`` is a folder of that name, as it was,
    never another user's home."""
    text = str(path)
    if text == "~" or text.startswith("~/"):
        return Path.home() / text[2:]
    return path


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/")
_URL_SCHEMES = frozenset({"postgresql", "postgres", "http", "https", "hf", "s3", "gs", "file", "sqlite", "mysql"})


def no_url(folder: str, named: str) -> None:
    """Refuse a folder setting that is a URL: a server's (``postgresql+psycopg://user:password@host/db``) became a
    local folder of that name, the password in it, and the job's rows went there, not to the server (was). The value
    is not shown: it may hold a password. A ``Path`` made of one has ``:/`` for ``://``: a known scheme, or a
    driver's (``postgresql+psycopg:/``), is read as one then."""
    scheme = _SCHEME.match(folder)
    if "://" in folder or (scheme and (scheme[1].lower() in _URL_SCHEMES or "+" in scheme[1])):
        raise InvalidInputError(
            f"{named} is a URL, not a folder (not shown: it may hold a password); a PostgreSQL store is given as "
            "--store-url or JUDGESTORE_STORE_URL"
        )


def _url_refused(value: object) -> object:
    """The ``store_root`` check before it becomes a path (which would fold ``://`` into ``:/``)."""
    if isinstance(value, str | Path):
        try:
            no_url(str(value), "the store's folder")
        except InvalidInputError as e:
            raise ValueError(str(e)) from None
    return value


def _blank_refused(what: str) -> Callable[[object], object]:
    """A check, before the value is converted, that refuses a blank ``what`` setting: ``Settings(store_root="")``
    became ``Path(".")``, the databases written into the working directory, and ``store_url=""`` the folder
    store (was)."""

    def check(value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"is blank: give {what}, or leave it unset")
        return value

    return check


_A_FOLDER = "a folder ('.' for the working directory)"


def _folder(value: Path | None) -> Path | None:
    """A folder setting, home-expanded (:func:`home_expanded`)."""
    return None if value is None else home_expanded(value)


def _text(value: str) -> str:
    """A text recorded on every row: it must be UTF-8 (a value with surrogates failed only when the rows were
    written, after the requests were sent)."""
    try:
        value.encode()
    except UnicodeEncodeError as e:
        raise ValueError("is not valid UTF-8 text") from e
    return value


@functools.cache
def _process_run_id() -> str:
    """One id per process: UTC start time, pid and a random suffix."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}-{secrets.token_hex(3)}"


def default_run_id() -> str:
    """The SLURM job (and array task) id when running under SLURM, else a per-process id."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return _process_run_id()
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"slurm-{array_job}_{array_task}"
    return f"slurm-{job}"


class _SettingsOfJudgestore(BaseSettings):
    """Settings whose arguments spelt almost like a field's get a :class:`SettingsKeyWarning` (an unknown one is
    ignored, as a newer judgestore's variable is: ``Settings(store_rot=...)`` put the store in the default folder
    without a word, was), and whose ``store_root`` given as an argument outranks the environment's ``store_url``."""

    model_config = SettingsConfigDict(
        env_prefix="JUDGESTORE_",
        extra="ignore",
        env_ignore_empty=True,
        hide_input_in_errors=True,  # a URL holds a password
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = _arguments(init_settings)
        for name in given:
            if name not in settings_cls.model_fields and (likely := meant(name, settings_cls.model_fields)):
                warn_the_caller(
                    f"{settings_cls.__name__}({name}=...) names no setting and is ignored; did you mean {likely}?",
                    SettingsKeyWarning,
                )
        # A folder given as an argument means that folder even when JUDGESTORE_STORE_URL is exported (or in a dotenv
        # file), as --store-root and Store(root=...) do: a script's Settings(store_root="scratch") wrote to the
        # team's server (was)
        if "store_root" in given and "store_url" not in given and "store_url" in settings_cls.model_fields:
            env_settings = _Without(settings_cls, env_settings, "store_url")
            dotenv_settings = _Without(settings_cls, dotenv_settings, "store_url")
        return init_settings, env_settings, dotenv_settings, file_secret_settings


def _arguments(init_settings: PydanticBaseSettingsSource) -> dict[str, Any]:
    """The keyword arguments a settings object was built with."""
    return init_settings.init_kwargs if isinstance(init_settings, InitSettingsSource) else {}


class Settings(_SettingsOfJudgestore):
    """Every knob of judgestore; environment variables use the ``JUDGESTORE_`` prefix."""

    store_root: Path = Field(default=Path("judgestore-data"), description="Folder holding every descriptor database.")
    store_url: str | None = Field(
        default=None,
        description="A PostgreSQL store (postgresql+psycopg://user@host/db) instead of the folder; see the README.",
    )
    auto_upgrade: bool = Field(
        default=False,
        description="Upgrade a database that is behind when a command that writes opens it (a reading one never does).",
    )
    journal_policy: JournalPolicy = Field(
        default="auto",
        description=(
            "auto: WAL on local disks, rollback journal plus a warning on a network filesystem; "
            "refuse-network: WAL locally, refuse network filesystems; rollback / wal: always that mode."
        ),
    )
    busy_timeout_ms: int = Field(
        default=30_000, ge=0, le=2**31 - 1, description="How long SQLite waits for a lock (a 32-bit count of ms)."
    )
    lock_retries: int = Field(default=8, ge=0, description="Retries of a write transaction after the busy timeout.")
    max_open_databases: int = Field(default=64, ge=1, description="Engines kept open at once (LRU).")
    pool_size: int = Field(default=2, ge=1, description="PostgreSQL: connections kept open per process.")
    pool_overflow: int = Field(default=2, ge=0, description="PostgreSQL: extra connections a burst may open.")
    connect_timeout_s: int = Field(default=10, ge=1, description="PostgreSQL: seconds to wait for the server.")
    prepared_statements: bool = Field(
        default=True,
        description="PostgreSQL: let psycopg prepare statements it runs often; false behind a PgBouncer in "
        "transaction mode that does not track them (before 1.21, or max_prepared_statements = 0).",
    )
    created_by: str = Field(default_factory=_default_user, description="Recorded on every row written.")
    run_id: str = Field(default_factory=default_run_id, description="Recorded on every row written.")
    record_runs: bool = Field(
        default=True, description="Append each run's accounting (hits, tokens and engine time saved) to `runs`."
    )
    max_concurrency: int = Field(
        default=8,
        ge=1,
        description="Hosted and served models: requests in flight at once, per model, unless the model sets its own.",
    )
    lease_seconds: float = Field(
        default=120.0,
        gt=0,
        le=7 * 24 * 3600,  # a week; a date past year 9999 failed mid-run
        allow_inf_nan=False,  # a lease that never lapses would leave a dead job's work unclaimed for good
        description="Shared batches: how long a job's claim on a block lasts unless renewed (renewed every third of "
        "it); a dead job's work is taken over after it.",
    )

    _no_url = field_validator("store_root", mode="before")(_url_refused)
    _blank_folder = field_validator("store_root", mode="before")(_blank_refused(_A_FOLDER))
    _blank_url = field_validator("store_url", mode="before")(
        _blank_refused("the server's URL (postgresql+psycopg://...)")
    )
    _checked_folder = field_validator("store_root")(_folder)
    _checked_text = field_validator("created_by", "run_id")(_text)


class _Without(PydanticBaseSettingsSource):
    """A settings source with one field left out."""

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource, field: str) -> None:
        super().__init__(settings_cls)
        self._source, self._field = source, field

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)  # unused: __call__ reads the whole source

    def __call__(self) -> dict[str, Any]:
        return {name: value for name, value in self._source().items() if name != self._field}


SHARD_TARGET_BYTES = 32 * 1024 * 1024  # uncompressed bytes per shard a push aims for
MAX_SHARD_BYTES = 512 * 1024 * 1024  # the most a fetch decompresses (or downloads) for one shard


class SyncSettings(_SettingsOfJudgestore):
    """Where and how caches are shared (:mod:`store.sync`); environment variables use the ``JUDGESTORE_`` prefix."""

    hub_repo: str | None = Field(default=None, description="Dataset repository (ORG/NAME) pushed to and fetched from.")
    hub_revision: str = Field(default="main", description="Branch to push to; branch, tag or commit to fetch.")
    sync_dir: Path | None = Field(default=None, description="A shared folder to use as the remote instead of the Hub.")
    shard_target_bytes: int = Field(default=SHARD_TARGET_BYTES, ge=1, description="Uncompressed bytes per shard.")
    max_shard_bytes: int = Field(default=MAX_SHARD_BYTES, ge=1, description="Largest shard a fetch accepts.")
    fetch_before_run: bool = Field(
        default=False, description="`judgestore generate/judge` fetch their descriptor folder from the remote first."
    )

    _blank_folder = field_validator("sync_dir", mode="before")(_blank_refused(_A_FOLDER))
    _checked_folder = field_validator("sync_dir")(_folder)


SettingsKind = TypeVar("SettingsKind", bound=BaseSettings)


class SettingsKeyWarning(UserWarning):
    """A ``JUDGESTORE_*`` variable, or an argument, that is no setting, spelt almost like one
    (``JUDGESTORE_STORE_ROOTT``, ``Settings(store_rot=...)``)."""


_warned_variables: set[str] = set()  # said once per process: settings are read by every command and call


def _warn_of_misspelt_variables() -> None:
    """Warn of each ``JUDGESTORE_*`` variable that is no setting but is spelt almost like one: it is ignored (a
    newer judgestore's variable must not break this one), so its value would be lost silently."""
    known = {name for kind in (Settings, SyncSettings) for name in kind.model_fields}
    for name in sorted(os.environ):  # the settings read names in any case: so is a misspelt one looked at
        prefixed = name.upper().startswith("JUDGESTORE_")
        setting = name[len("JUDGESTORE_") :].lower()  # the names alone: the common prefix would match any
        if prefixed and setting not in known and name not in _warned_variables:
            likely = meant(setting, known)
            if likely is not None:
                _warned_variables.add(name)
                warn_the_caller(
                    f"{name} is not a judgestore setting and is ignored; did you mean JUDGESTORE_{likely.upper()}?",
                    SettingsKeyWarning,
                )


def from_environment(kind: type[SettingsKind], **given: Any) -> SettingsKind:
    """``kind`` (:class:`Settings`, :class:`SyncSettings`) read from the environment, where an empty variable is
    unset; a bad ``JUDGESTORE_*`` value is an :class:`InvalidInputError` naming the variable, and one spelt almost
    like a setting's gets a :class:`SettingsKeyWarning`. ``given`` (values a caller checked already, such as a
    command's ``--store-root``) win over the environment, whose variables for them are then not read at all: a
    bad one does not stop a command that names its own."""
    _warn_of_misspelt_variables()
    try:
        return kind(**given)
    except ValidationError as e:
        wrong = "; ".join(
            f"JUDGESTORE_{'_'.join(map(str, err['loc'])).upper()}: {err['msg'].removeprefix('Value error, ')}"
            # a stray space shows; a URL may hold a password: not shown
            + (f", got {err['input']!r:.60}" if isinstance(err.get("input"), str) and "://" not in err["input"] else "")
            for err in e.errors()
        )
        raise InvalidInputError(f"invalid setting in the environment: {wrong}") from e
