"""Schema revisions of descriptor databases: classify on open, create at head, and the state of a database.

Contract:

* :func:`classify` tells, with one SELECT on the happy path, whether a database
  is ``empty``, ``current``, ``behind`` (an older revision of ours), ``ahead``
  (a revision this library does not know) or ``foreign`` (tables, but no
  ``judgestore_alembic_version``). :func:`is_current` is that SELECT on a raw
  sqlite3 connection, for opening without building an engine.
* The shipped revisions are read once per process, from the scripts' text
  (:func:`revisions`); Alembic itself is imported only when a migration
  actually runs.
  :func:`migrate` runs the scripts on a connection the caller holds (the
  steps come from Alembic's ``ScriptDirectory._upgrade_revs``, what ``alembic
  upgrade`` itself runs; a test pins that private API).
* :func:`create_at_head` builds an empty database at head inside the caller's
  transaction: from the models, stamped (:func:`head_statements`), when the
  scripts' head is the revision they declare; else by the scripts. Upgrades are
  :mod:`store.backends.sqlite.upgrade`'s and
  :mod:`store.backends.postgres.upgrade`'s.
* :func:`database_info` classifies one database of a store read-only, file
  and metadata.json included, into one :class:`DatabaseState`; it never raises
  for a bad file: what is wrong becomes a state and a message naming the file.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Column, Connection, Dialect, MetaData, PrimaryKeyConstraint, String, Table, create_mock_engine
from sqlalchemy.sql.ddl import ExecutableDDLElement

from store.errors import (
    CorruptDatabaseError,
    ForeignDatabaseError,
    JudgestoreError,
    MigrationScriptsError,
    NotADatabaseError,
    SchemaAheadError,
    SchemaBehindError,
    StatementError,
)
from store.tables.models import SCHEMA_REVISION, Base, UTCDateTime

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

VERSION_TABLE = "judgestore_alembic_version"
# Every table and column name of a descriptor database: the only names judgestore's own statements use there.
STORE_NAMES = frozenset(
    {VERSION_TABLE, *Base.metadata.tables, *(c.name for t in Base.metadata.tables.values() for c in t.c)}
)
MIGRATION_OPTIONS: dict[str, Any] = {
    "version_table": VERSION_TABLE,
    "render_as_batch": True,  # SQLite cannot ALTER most things: copy-and-move tables instead
    "compare_type": True,
    "compare_server_default": True,
    "target_metadata": Base.metadata,
    "render_item": lambda kind, obj, _ctx: _rendered_type(obj) if kind == "type" else False,
}


def _rendered_type(column_type: Any) -> str | Literal[False]:
    """How a revision script spells one of the models' column types: the type the database has.

    A UTC datetime is a plain ``DateTime``; a text column's PostgreSQL variant
    (:func:`store.backends.postgres.text.server_safe`) escapes values in Python and has the
    same DDL as its base type, so scripts name the base type alone. Anything
    else is rendered by Alembic.
    """
    if isinstance(column_type, UTCDateTime):
        return "sa.DateTime()"
    if getattr(column_type, "_variant_mapping", None):
        return f"sa.{column_type!r}".split(".with_variant(")[0]
    return False


class DatabaseState(enum.StrEnum):
    """What a database file is, from the store's point of view (:func:`classify` gives the first five)."""

    EMPTY = "empty"
    CURRENT = "current"
    BEHIND = "behind"
    AHEAD = "ahead"
    FOREIGN = "foreign"
    NOT_A_DATABASE = "not-a-database"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    METADATA_MISSING = "metadata-missing"
    METADATA_MISMATCH = "metadata-mismatch"


USABLE_STATES = frozenset({DatabaseState.CURRENT, DatabaseState.EMPTY})


def failed_state(error: BaseException) -> DatabaseState:
    """The state of a database whose reading raised ``error``: not a database, corrupt, or else unreadable."""
    if isinstance(error, NotADatabaseError):
        return DatabaseState.NOT_A_DATABASE
    if isinstance(error, CorruptDatabaseError):
        return DatabaseState.CORRUPT
    return DatabaseState.UNREADABLE


@dataclass(frozen=True, slots=True)
class Revisions:
    """What this library's migration scripts know: the head and every revision."""

    head: str
    known: frozenset[str]


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    state: DatabaseState
    revision: str | None  # what the file records (None: no version table or no row)
    head: str
    tables: tuple[str, ...] = ()  # filled for empty/foreign only


def migrations_dir() -> Path:
    """The Alembic script directory installed beside the ``store`` package (a wheel and an editable install alike).

    Found by path, not by importing ``migrations``: a project's own
    ``migrations`` package in the working folder (first on the import path
    under ``python -c``, ``python -m`` or Jupyter) must never stand in for
    judgestore's scripts.
    """
    return Path(__file__).resolve().parent.parent / "migrations"


def read_script_directory(*extra_versions: Path) -> ScriptDirectory:
    """Read the shipped revision scripts, plus those in ``extra_versions`` folders (imports Alembic).

    The extra folders hold revisions that build on the shipped ones (the
    tests' synthetic revisions). Cached callers: :func:`script_directory`.
    """
    from alembic.script import ScriptDirectory

    locations = [migrations_dir() / "versions", *extra_versions]
    return ScriptDirectory(str(migrations_dir()), version_locations=[str(p) for p in locations])


@functools.cache
def script_directory() -> ScriptDirectory:
    return read_script_directory()


# A script's identity as Alembic's template writes it: `revision: str = "0004"`, `down_revision: ... = "0003"`.
_IDENTITY_LINE = re.compile(r'^(revision|down_revision)\b[^=\n]*=\s*(?:"([^"\n]*)"|None)\s*$', re.MULTILINE)


@functools.cache
def revisions() -> Revisions:
    """Head and known revisions of the shipped scripts, read once per process.

    Read from each script's ``revision`` / ``down_revision`` lines as text:
    Alembic's own reading imports Alembic and every script, about 100 ms of
    every command's start (a full-hit run is all start). A script those lines
    do not describe (a merge, a computed id) falls back to Alembic's reading;
    tests/store/test_migrations.py checks that both agree.
    """
    down_of: dict[str, str | None] = {}
    for script in sorted((migrations_dir() / "versions").glob("[!_]*.py")):
        found = dict((name, value or None) for name, value in _IDENTITY_LINE.findall(script.read_text("utf-8")))
        if "revision" not in found or "down_revision" not in found or found["revision"] is None:
            return revisions_of(script_directory())
        down_of[found["revision"]] = found["down_revision"]
    heads = set(down_of) - set(down_of.values())
    if len(heads) != 1 or any(down is not None and down not in down_of for down in down_of.values()):
        return revisions_of(script_directory())  # Alembic names what is wrong
    return Revisions(head=heads.pop(), known=frozenset(down_of))


def revisions_of(script: ScriptDirectory) -> Revisions:
    heads = script.get_heads()
    if len(heads) != 1:
        raise MigrationScriptsError(f"migrations must have exactly one head, found {heads}")
    return Revisions(head=heads[0], known=frozenset(s.revision for s in script.walk_revisions()))


def raise_for_status(status: SchemaStatus, path: Path | str) -> None:
    """The typed error that refuses to open a database in ``status``, if any."""
    if status.state is DatabaseState.BEHIND:
        raise SchemaBehindError(path, str(status.revision), status.head)
    if status.state is DatabaseState.AHEAD:
        raise SchemaAheadError(path, str(status.revision), status.head)
    if status.state is DatabaseState.FOREIGN:
        raise ForeignDatabaseError(path, list(status.tables))


def migrate(conn: Connection, destination: str = "heads", script: ScriptDirectory | None = None) -> None:
    """Run the upgrade scripts on ``conn`` inside the caller's transaction."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    script = script or script_directory()

    def steps(current: Any, _context: Any) -> Any:
        return script._upgrade_revs(destination, current)  # what `alembic upgrade` itself calls

    context = MigrationContext.configure(connection=conn, opts={**MIGRATION_OPTIONS, "fn": steps})
    with Operations.context(context):
        context.run_migrations()


def create_at_head(conn: Connection) -> None:
    """Build the schema of an empty database at head (caller holds the write transaction and the database's lock).

    :func:`head_statements` when the scripts' head is the revision the models
    declare, else the scripts run (:func:`migrate`).
    """
    statements = head_statements(conn.dialect)
    if statements is None:
        migrate(conn)
        return
    for statement in statements:
        conn.exec_driver_sql(statement)


def head_statements(dialect: Dialect) -> tuple[str, ...] | None:
    """The statements that build an empty database at head, compiled by ``dialect``; None against other scripts.

    When the head of the scripts is the revision the models declare
    (:data:`~store.tables.models.SCHEMA_REVISION`), the tables are created
    from the models and the version table stamped, as Alembic's cookbook
    builds an up-to-date database from scratch: the schema the scripts build
    (a test holds the two equal), without importing Alembic and running every
    script (0.3 s of CPU here, most of what a cold run costs beyond the
    engine's). The statements are what ``create_all`` emits, then the version
    row, compiled once per dialect: compiling them again for every new
    database was about a third of creating one (10 ms here, 7 ms without).
    They need no parameters, so a raw driver connection runs them as well
    (:mod:`store.backends.sqlite.connections` creates a file without an
    engine). Against other scripts (a test's own) None: the scripts must run.
    """
    return _head_statements(dialect) if revisions().head == SCHEMA_REVISION else None


# Alembic's own version table (alembic.ddl.impl.DefaultImpl.version_table_impl).
_VERSION = Table(
    VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
)


# A folder store's files share one dialect (store.backends.sqlite.connections); each PostgreSQL storage's engine
# has its own, so a process that opens many server stores compiles once per store (only a cost).
@functools.lru_cache(maxsize=8)
def _head_statements(dialect: Dialect) -> tuple[str, ...]:
    """The DDL of the models' tables and indexes and of the version table, as ``create_all`` emits it for an
    empty database (``checkfirst=False``: the caller found no table), then the version row, compiled by
    ``dialect`` with the revision inlined."""
    statements: list[str] = []

    def collect(ddl: ExecutableDDLElement, *_args: Any, **_kwargs: Any) -> None:
        statements.append(str(ddl.compile(dialect=dialect)))

    recorder = create_mock_engine(f"{dialect.name}://", collect)
    _declared(dialect).create_all(recorder, checkfirst=False)
    _VERSION.create(recorder, checkfirst=False)
    stamp = _VERSION.insert().values(version_num=SCHEMA_REVISION)
    statements.append(str(stamp.compile(dialect=dialect, compile_kwargs={"literal_binds": True})))
    return tuple(statements)


def _declared(dialect: Dialect) -> MetaData:
    """The models' tables as ``dialect`` builds them: on PostgreSQL a copy whose partial indexes keep their WHERE.

    The models name it for SQLite only (``sqlite_where``): naming
    ``postgresql_where`` there would load PostgreSQL's dialect in every
    process, about 40 ms of every command's start. Revision 0004 builds both;
    a test holds a schema built from these statements equal to one the
    scripts build, on each backend.
    """
    if dialect.name != "postgresql":
        return Base.metadata
    copy = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(copy)
    for table in copy.tables.values():
        for index in table.indexes:
            where = index.dialect_options["sqlite"]["where"]
            if where is not None:
                index.dialect_kwargs["postgresql_where"] = where
    return copy


# ---------------------------------------------------------------- the state of a database in a store


def missing_parts(held: Mapping[str, Collection[str]]) -> str | None:
    """What a database at the models' revision lacks of the tables and columns they declare, as one message (None:
    nothing); ``held`` gives the database's column names by table name (the version table aside)."""
    missing = [
        part
        for table in Base.metadata.sorted_tables
        for part in (
            [f"table {table.name}"]
            if table.name not in held
            else [f"column {table.name}.{c.name}" for c in table.c if c.name not in held[table.name]]
        )
    ]
    if not missing:
        return None
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (
        f"lacks {shown}, which its schema revision {SCHEMA_REVISION} has: another tool edited it. Restore it from "
        "a backup, or delete it to recompute its rows"
    )


def foreign_name_error(
    where: Path | str, kind: str, name: str, said: str, hint: str, *, whole: Callable[[], bool] | None = None
) -> StatementError | None:
    """The error of a statement naming a ``kind`` (table or column) ``name`` that is none of judgestore's and that
    ``where`` cannot read (a typo, or a column a user added by hand; ``hint`` says what the backend reads); None for
    one of judgestore's own names (:data:`STORE_NAMES`), whose absence is damage, not the statement's fault, unless
    ``whole()`` says the database holds every table and column of its revision (a name of another of its tables:
    ``judge`` in a statement on completions)."""
    if name in STORE_NAMES:
        if whole is None or not whole():
            return None
        return StatementError(f"{where}: {said}: the statement names a {kind} of another of judgestore's tables "
                              "than the one it reads there (the database is whole); nothing was changed")  # fmt: skip
    return StatementError(f"{where}: {said}: the statement names a {kind} that is not judgestore's ({hint}); "
                          "nothing was changed")  # fmt: skip


def status_error(status: SchemaStatus, path: Path | str) -> str | None:
    """The message of the error :func:`raise_for_status` would raise, or None for a usable database."""
    try:
        raise_for_status(status, path)
    except JudgestoreError as e:
        return str(e)
    return None
