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
  escaped (:mod:`store.backends.postgres.text`), so U+0000 fits.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    func,
    or_,
    select,
    text,
    type_coerce,
)

from store.backends.postgres import text as pgtext
from store.errors import InvalidInputError, MetadataMismatchError
from store.layout import Location, StoredMetadata, parse_metadata
from store.roles import ROLES, check_role
from store.schema import VERSION_TABLE
from store.tables.models import NAMING_CONVENTION

REGISTRY_SCHEMA = "judgestore"
SCHEMA_PREFIX = "js_"

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
# Each descriptor schema's generation, raised by its tables' triggers (store.backends.postgres.generations).
generations = Table(
    "generations",
    registry_metadata,
    Column("schema_name", String(63), primary_key=True),
    Column("generation", BigInteger, nullable=False),
)
TOUCH = f"{REGISTRY_SCHEMA}.touch"  # the triggers' function


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


def advisory_lock(conn: Connection, name: str, *, wait_ms: int | None = None) -> None:
    """Hold a transaction-level advisory lock on ``name`` until the caller's transaction ends.

    ``wait_ms``: how long to wait while another session holds it, after which the statement fails with 55P03
    (lock_not_available: a :class:`~store.errors.ServerBusyError`, as a SQLite file locked past its busy timeout
    is a busy error), and so every other lock wait of the transaction (a table another tool holds: a ``LOCK
    TABLE`` in psql, an ``ALTER``); None waits as the session's ``lock_timeout`` says (0, the default: until it is
    free). A free lock is taken, and the bound set, in one statement. The bound is this transaction's, and only
    where the session has none of its own: a ``lock_timeout`` other than 0 of the URL's ``options`` or the role's
    settings wins (an explicit 0 cannot be told from the default: ``JUDGESTORE_BUSY_TIMEOUT_MS`` bounds it).
    """
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    if wait_ms is not None:
        # The bound too, not only on a wait: with the advisory lock free, a write then waited on a table another
        # tool held for as long as it held it (was)
        taken = conn.execute(
            text(
                "SELECT pg_try_advisory_xact_lock(:key), CASE WHEN current_setting('lock_timeout') = '0' "
                "THEN set_config('lock_timeout', :wait, true) END"
            ),
            {"key": key, "wait": f"{max(1, wait_ms)}ms"},  # 0 would be PostgreSQL's "wait forever"
        ).first()
        if taken is not None and taken[0]:
            return
    conn.execute(select(func.pg_advisory_xact_lock(key)))


def ensure_registry(conn: Connection) -> None:
    """Create the registry schema and tables if they are missing (inside the caller's transaction)."""
    advisory_lock(conn, REGISTRY_SCHEMA)
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted(REGISTRY_SCHEMA)}"))
    registry_metadata.create_all(conn, checkfirst=True)


def unregistered(conn: Connection) -> list[tuple[str, int | None]]:
    """Descriptor schemas that hold judgestore's tables but no registry row (one deleted by hand, a partial
    restore), with their rows (None: this role may not read them): every command leaves them out, as it cannot
    tell which descriptor they are."""
    prefix = f"^{SCHEMA_PREFIX}[cj]_[0-9a-f]{{32}}$"
    orphans = conn.execute(
        text(
            "SELECT n.nspname FROM pg_namespace AS n WHERE n.nspname ~ :prefix AND EXISTS (SELECT 1 FROM pg_class "
            "AS t WHERE t.relnamespace = n.oid AND t.relname = :version) ORDER BY n.nspname"
        ),
        {"prefix": prefix, "version": VERSION_TABLE},
    ).scalars()
    known = set(conn.execute(select(registry.c.schema_name)).scalars()) if has_registry(conn) else set()
    found: list[tuple[str, int | None]] = []
    for name in orphans:
        if name not in known:
            table = "completions" if name[len(SCHEMA_PREFIX)] == "c" else "judgements"
            if not conn.dialect.has_table(conn, table, schema=name):
                found.append((name, 0))
                continue
            # ls and db status say them too: a role that may read only some schemas failed on the others (was)
            readable = conn.execute(
                text(
                    "SELECT has_schema_privilege(CAST(:s AS text), 'USAGE') "
                    "AND has_table_privilege(format('%I.%I', CAST(:s AS text), CAST(:t AS text)), 'SELECT')"
                ),
                {"s": name, "t": table},
            ).scalar_one()
            rows = conn.execute(text(f"SELECT count(*) FROM {quoted(name)}.{table}")).scalar_one() if readable else None
            found.append((name, None if rows is None else int(rows)))
    return found


def has_registry(conn: Connection) -> bool:
    return bool(conn.dialect.has_table(conn, registry.name, schema=REGISTRY_SCHEMA))


def registered(conn: Connection, unreadable: list[tuple[str, str]] | None = None) -> list[Location]:
    """Every registered descriptor schema's location, in layout order.

    The names are stored escaped (:mod:`store.backends.postgres.text`), as every text column
    is; a row registered before names were escaped holds them as they were,
    and a name of that age holding U+FDD0 would read back changed. The
    schema's name (a hash of the location) tells which reading is the row's:
    the escaped one unless only the verbatim one hashes to it.

    A row that names no location (edited by hand: an unknown role, a name the layout refuses) is left out, as a
    folder store's walk leaves out a folder of the wrong shape; with ``unreadable``, each is appended there as
    ``(schema name, why)`` (``verify`` reports them).
    """
    if not has_registry(conn):
        return []
    c = registry.c
    names = [type_coerce(column, Text()) for column in (c.task, c.provider, c.model)]  # verbatim: no escaping
    rows = conn.execute(select(c.schema_name, c.role, *names, c.descriptor_hash16)).all()
    found = []
    for name, role, task, provider, model, hash16 in rows:
        try:
            location = Location(check_role(role), pgtext.unescape(task), pgtext.unescape(provider),
                                pgtext.unescape(model), hash16)  # fmt: skip
        except InvalidInputError as e:
            if unreadable is not None:
                unreadable.append((name, str(e)))
            continue
        if schema_name(location) != name:
            verbatim = Location(location.role, task, provider, model, hash16)
            location = verbatim if schema_name(verbatim) == name else location
        found.append(location)
    found.sort(key=lambda location: (ROLES.index(location.role), location.segments()[1:]))
    return found


def misregistered(conn: Connection, location: Location) -> str | None:
    """The schema of a registry row whose columns name ``location`` though ``location``'s schema is another (its
    task, provider or model edited by hand: :func:`registered` lists it as ``location``), or None."""
    c = registry.c
    names = (c.task, c.provider, c.model)
    given = (location.task, location.provider, location.model)
    pairs = list(zip(names, given, strict=True))
    readings = [and_(*(column == value for column, value in pairs))]  # escaped
    if not any("\0" in value for value in given):  # a row of before 0005 held its names verbatim, and no U+0000
        readings.append(and_(*(type_coerce(column, Text()) == value for column, value in pairs)))
    found = conn.execute(
        select(c.schema_name).where(
            c.role == location.role,
            c.descriptor_hash16 == location.descriptor_hash16,
            c.schema_name != schema_name(location),
            or_(*readings),
        )
    )
    return found.scalars().first()


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


def verified_metadata(location: Location, row: str, where: str) -> StoredMetadata:
    """A registry row's ``metadata_json``, verified like a metadata.json: it must hash to its descriptor and name
    the schema's role, task, provider, model and descriptor hash (else :class:`MetadataMismatchError`)."""
    stored, recorded_hash = parse_metadata(row.encode(), where)
    actual = stored.descriptor_sha256
    recorded = (stored.role, stored.task, stored.descriptor.provider, stored.descriptor.model, actual[:16])
    expected = (location.role, location.task, location.provider, location.model, location.descriptor_hash16)
    if recorded_hash != actual or recorded != expected:
        raise MetadataMismatchError(
            where, f"records {'/'.join(recorded)} but is registered as {'/'.join(expected)}; it was edited"
        )
    return stored
