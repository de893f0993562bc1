"""The store on a PostgreSQL server: one schema per descriptor database, a registry, engines, locks and errors.

Contract:

* A store URL (``postgresql+psycopg://user@host/db``) names one database on
  a server. Each descriptor database of the SQLite layout is a PostgreSQL
  *schema* there holding the same ``completions``/``judgements`` tables and
  its own Alembic version table; the models are mapped onto it with
  SQLAlchemy's ``schema_translate_map`` (:func:`schema_options`).
* :func:`schema_name` derives the schema's name from the location alone:
  ``js_`` plus the role's initial and 32 hex characters of a hash of role,
  task, provider, model and descriptor hash. It is deterministic, 37
  characters (PostgreSQL's limit is 63 bytes), and never carries a user's
  text, so no model name can inject anything; it is quoted anyway.
* The registry table (schema ``judgestore``, table ``registry``) is what the
  folder tree and ``metadata.json`` are for SQLite: one row per descriptor
  schema with its role, task, provider, model, descriptor hash and the exact
  metadata.json bytes. A row whose metadata does not hash to its descriptor
  is refused, as a folder whose metadata.json does not match its name is.
* Every schema is created, and every upgrade runs, inside one transaction
  under a transaction-level advisory lock on the schema's name
  (:func:`advisory_lock`): two processes creating or upgrading the same
  schema at once serialise, and the second finds the work done.
* :func:`translated` turns everything the driver raises into a typed error
  (server down, wrong password, no such database, no permission, busy,
  full, a refused value, an edited schema, damage; the rest an
  :class:`~store.errors.UnexpectedServerError` with the driver's words) that
  names the server and the next step.
* A URL is read as the server will be asked (:func:`parse_store_url`: a
  password may hold an unencoded ``@``) and printed without any password,
  whether in the user part or a query parameter (:func:`display_url`); a
  driver message quoting one has it replaced.
* Text columns, the registry's names included, and JSON strings are stored
  escaped (:mod:`store.pgtext`), so U+0000 fits.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import quote, unquote

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    func,
    select,
    text,
    type_coerce,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
)

from store import pgtext
from store.errors import (
    InvalidInputError,
    JudgestoreError,
    ServerAuthError,
    ServerBusyError,
    ServerDamagedError,
    ServerError,
    ServerFullError,
    ServerPermissionError,
    ServerSchemaError,
    ServerUnavailableError,
    ServerValueError,
    UnexpectedServerError,
    install_hint,
)
from store.layout import Location, check_role
from store.models import NAMING_CONVENTION
from store.settings import Settings

REGISTRY_SCHEMA = "judgestore"
SCHEMA_PREFIX = "js_"
POSTGRES_DRIVERS = ("postgresql", "postgresql+psycopg")

registry_metadata = MetaData(naming_convention=NAMING_CONVENTION, schema=REGISTRY_SCHEMA)
registry = Table(
    "registry",
    registry_metadata,
    Column("schema_name", String(63), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("task", pgtext.server_safe(Text()), nullable=False),  # escaped: see registered()
    Column("provider", pgtext.server_safe(Text()), nullable=False),
    Column("model", pgtext.server_safe(Text()), nullable=False),
    Column("descriptor_hash16", String(16), nullable=False),
    Column("descriptor_sha256", String(64), nullable=False),
    Column("metadata_json", Text, nullable=False),  # the exact bytes a metadata.json would hold
    Column("created_at", DateTime, nullable=False),
    UniqueConstraint("role", "task", "provider", "model", "descriptor_hash16"),
)


def is_store_url(value: str) -> bool:
    return value.split("://", 1)[0] in POSTGRES_DRIVERS


def parse_store_url(url: str) -> URL:
    """A store URL parsed as the server will be asked: a password may hold an unencoded ``@``.

    SQLAlchemy's parser ends the password at its first ``@``, so
    ``eval:p@ss@host/db`` would mean the password ``p`` on the host
    ``ss@host`` (and the message about that host would print the password's
    tail). Here the user part ends at the last ``@`` before the path (or
    before the query, when the part before its ``?`` holds an ``@``), as
    browsers and :mod:`urllib` read it; the user and the password are
    percent-encoded again before SQLAlchemy parses the URL.
    """
    scheme, separator, rest = url.partition("://")
    head, slash, path = rest.partition("/")
    tail = slash + path
    before, question, after = head.partition("?")
    if question and "@" in before:  # no path, and a query that may hold an @ (?password=p@ss) follows the host
        head, tail = before, question + after + tail
    if separator and "@" in head:
        user_part, _, host = head.rpartition("@")
        user, colon, password = user_part.partition(":")
        encoded = quote(unquote(user), safe="") + (colon + quote(unquote(password), safe="") if colon else "")
        path, question, query = tail.partition("?")
        # An @ left in the query would make SQLAlchemy's user part run on to it; the query is unquoted again.
        url = f"{scheme}://{encoded}@{host}{path}{question}{query.replace('@', '%40')}"
    return make_url(url)


def _is_secret(name: str) -> bool:
    return "password" in name.lower()  # password, sslpassword: libpq's parameters that hold a secret


def display_url(url: str) -> str:
    """The URL as it may be printed: never with its password, whether in the user part or a query parameter."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError):
        return "<an invalid store URL>"
    hidden = {k: "***" for k in parsed.query if _is_secret(k)}
    shown = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return shown.replace("=%2A%2A%2A", "=***")  # as the user part's password is shown


def _without_secrets(message: str, url: str) -> str:
    """``message`` with every password the URL holds replaced by ``***`` (a driver may quote a URL's parts)."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError):
        return message
    secrets = [parsed.password, *(v for k, v in parsed.query.items() if _is_secret(k))]
    for secret in secrets:
        for value in secret if isinstance(secret, tuple) else (secret,):
            if value:
                message = message.replace(str(value), "***")
    return message


def schema_name(location: Location) -> str:
    """The schema of one descriptor database (see the module docstring)."""
    key = "\0".join((location.role, location.task, location.provider, location.model, location.descriptor_hash16))
    return f"{SCHEMA_PREFIX}{location.role[0]}_{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def schema_options(location: Location) -> dict[str, Any]:
    """The execution options that map the models onto a location's schema."""
    return {"schema_translate_map": {None: schema_name(location)}}


def quoted(identifier: str) -> str:
    if not identifier.replace("_", "").isalnum() or '"' in identifier:
        raise InvalidInputError(f"refusing an unexpected PostgreSQL identifier {identifier!r}")
    return f'"{identifier}"'


def create_postgres_engine(url: str, settings: Settings) -> Engine:
    """One pooled engine for every schema of the server's database (see the module docstring)."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError) as e:
        raise InvalidInputError(
            f"{display_url(url)} is not a store URL ({e}); expected postgresql+psycopg://..."
        ) from e
    if parsed.drivername not in POSTGRES_DRIVERS:
        raise InvalidInputError(f"store URL driver {parsed.drivername!r} is not supported; use postgresql+psycopg")
    try:
        return create_engine(
            parsed.set(drivername="postgresql+psycopg"),
            pool_size=settings.pool_size,
            max_overflow=settings.pool_overflow,
            pool_pre_ping=True,  # a connection the server dropped is replaced, not handed out
            connect_args={
                "connect_timeout": settings.connect_timeout_s,
                "application_name": "judgestore",
                **({} if settings.prepared_statements else {"prepare_threshold": None}),
            },
            json_serializer=pgtext.dumps_json,
            json_deserializer=pgtext.loads_json,
        )
    except (NoSuchModuleError, ModuleNotFoundError) as e:
        raise InvalidInputError(
            "a PostgreSQL store needs the psycopg driver: " + install_hint("postgresql", "'psycopg[binary]>=3.2'")
        ) from e


def advisory_lock(conn: Connection, name: str) -> None:
    """Hold a transaction-level advisory lock on ``name`` until the caller's transaction ends."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    conn.execute(select(func.pg_advisory_xact_lock(key)))


def ensure_registry(conn: Connection) -> None:
    """Create the registry schema and table if they are missing (inside the caller's transaction)."""
    advisory_lock(conn, REGISTRY_SCHEMA)
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted(REGISTRY_SCHEMA)}"))
    registry_metadata.create_all(conn, checkfirst=True)


def registered(conn: Connection) -> list[tuple[Location, str]]:
    """Every registered descriptor schema, as (location, metadata.json text), in layout order.

    The names are stored escaped (:mod:`store.pgtext`), as every text column
    is; a row registered before names were escaped holds them as they were,
    and a name of that age holding U+FDD0 would read back changed. The
    schema's name (a hash of the location) tells which reading is the row's:
    the escaped one unless only the verbatim one hashes to it.
    """
    if not conn.dialect.has_table(conn, registry.name, schema=REGISTRY_SCHEMA):
        return []
    c = registry.c
    names = [type_coerce(column, Text()) for column in (c.task, c.provider, c.model)]  # verbatim: no escaping
    query = select(c.schema_name, c.role, *names, c.descriptor_hash16, c.metadata_json)
    rows = conn.execute(query.order_by(c.role, c.task, c.provider, c.model, c.descriptor_hash16)).all()
    found = []
    for name, role, task, provider, model, hash16, metadata_json in rows:
        location = Location(check_role(role), pgtext.unescape(task), pgtext.unescape(provider),
                            pgtext.unescape(model), hash16)  # fmt: skip
        if schema_name(location) != name:
            verbatim = Location(location.role, task, provider, model, hash16)
            location = verbatim if schema_name(verbatim) == name else location
        found.append((location, metadata_json))
    return found


def register(conn: Connection, location: Location, descriptor_sha256: str, metadata_json: str) -> None:
    """Record a descriptor schema in the registry (the caller holds the schema's advisory lock)."""
    conn.execute(
        registry.insert().values(
            schema_name=schema_name(location),
            role=location.role,
            task=location.task,
            provider=location.provider,
            model=location.model,
            descriptor_hash16=location.descriptor_hash16,
            descriptor_sha256=descriptor_sha256,
            metadata_json=metadata_json,
            created_at=datetime.now(UTC).replace(tzinfo=None),
        )
    )


def _sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


# SQLSTATE classes and codes (PostgreSQL's appendix A) -> what they mean for a store
_BUSY_STATES = {"40001": "a serialisation failure", "40P01": "a deadlock", "55P03": "a lock it could not get",
                "55006": "an object another session was using", "57014": "a statement cancelled (statement_timeout?)",
                "57P04": "a statement cancelled (the database is being dropped?)"}  # fmt: skip
_GONE_STATES = {"57P01", "57P02", "57P03", "53300"}  # shut down, crashed, starting; no connection slot free
_MISSING_STATES = {"42P01", "42703", "3F000"}  # undefined table, column, schema


def translated(url: str, error: DBAPIError) -> JudgestoreError:
    """The typed error a driver failure stands for: every one has a class (see the module docstring).

    The message names the server (password hidden: :func:`display_url`), says
    what happened in the driver's words (any password in them hidden too),
    and the next step.
    """
    shown = display_url(url)
    state = _sqlstate(error) or ""
    orig = error.orig if error.orig is not None else error
    message = _without_secrets(str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__, url)
    kind = type(orig).__name__
    if state == "28P01" or "password authentication failed" in message:
        return ServerAuthError(shown, f"the server refused the credentials ({message}); check the user and password")
    if state.startswith("28"):
        return ServerAuthError(shown, f"the server refused the connection ({message})")
    if state == "3D000":
        return ServerError(shown, f"{message}; create it (createdb) or fix the URL")
    if state == "42501":
        return ServerPermissionError(
            shown,
            f"{message}. The store's user needs CREATE on the database (GRANT CREATE ON DATABASE ... TO ...) to "
            "create schemas, and USAGE/CREATE on the judgestore schemas",
        )
    if state == "25006":
        return ServerPermissionError(
            shown, f"{message}: the server takes no writes (a standby, or default_transaction_read_only); "
            "write to the primary, or open the store read-only"
        )  # fmt: skip
    if state in _BUSY_STATES:
        return ServerBusyError(
            shown, f"the transaction was rolled back after {_BUSY_STATES[state]} ({message}), past every retry; "
            "nothing of it was kept. Run the command again (rows already stored are kept)"
        )  # fmt: skip
    if state.startswith("53") and state not in _GONE_STATES:
        return ServerFullError(
            shown, f"the server ran out of a resource ({message}); the transaction was rolled back. Free disk or "
            "memory on the server (its administrator), then run the command again"
        )  # fmt: skip
    if kind == "PipelineAborted":  # psycopg's: an earlier statement of the pipelined batch failed
        return UnexpectedServerError(
            shown, f"a statement of the same batch failed before this one ({message}); the transaction was rolled "
            "back and nothing of it was kept. Run the command again; if it fails the same way, report this message"
        )  # fmt: skip
    if (
        state.startswith("08")
        or state in _GONE_STATES
        or error.connection_invalidated
        or (not state and isinstance(error, OperationalError | InterfaceError))  # the client lost the connection
    ):
        return ServerUnavailableError(
            shown, f"cannot reach the server ({message}); is it running, and is the URL right?"
        )
    if state in _MISSING_STATES:
        return ServerSchemaError(
            shown, f"{message}: a table or column the schema's revision promises is missing (another tool edited "
            "it). Run `judgestore verify`"
        )  # fmt: skip
    if state.startswith(("22", "23", "54")) or isinstance(error, DataError | IntegrityError):
        return ServerValueError(
            shown, f"the server refused a value ({kind}: {message}); nothing of the statement was kept. judgestore "
            "checks values before it sends them: please report this value"
        )  # fmt: skip
    if state.startswith(("XX", "58")):
        return ServerDamagedError(
            shown, f"the server reports damaged data or a failing disk ({message}); ask its administrator to check "
            "it (REINDEX, amcheck, its logs), then run `judgestore verify`"
        )  # fmt: skip
    return UnexpectedServerError(
        shown, f"PostgreSQL failed in a way judgestore has no name for ({kind}: {message}); the transaction was "
        "rolled back and nothing of it was kept. Run the command again; if it fails the same way, report this message"
    )  # fmt: skip


def raise_translated(url: str, error: DBAPIError) -> NoReturn:
    raise translated(url, error) from error
