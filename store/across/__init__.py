"""Queries across databases: one SQLAlchemy 2 ``select()`` over every database a :class:`~store.layout.Selector` picks.

Contract:

* :func:`scalars` (``Store.scalars``) runs ``select(Entity)`` of
  :class:`~store.tables.models.Completion`, :class:`~store.tables.models.Judgement`,
  :class:`~store.tables.models.Run` or :class:`~store.tables.models.Adoption` and yields a
  :class:`Found` per row: ``(location, descriptor, row)``, the ORM object
  with the :class:`~store.layout.Location` and the full
  :class:`~store.descriptor.ModelDescriptor` of the database it came from.
  The objects are detached (the database's transaction is over), every
  column loaded: read them, never change them through this call. Loader
  options (``defer``, ``load_only``, ``undefer``, ``raiseload``) are refused
  with a :class:`~store.errors.StatementError` before any database is
  opened, on both backends: a column left out of a detached row could never
  be loaded later. To read only some columns, name them in :func:`execute`.
* :func:`execute` (``Store.execute``) runs column selects and the aggregates
  that combine exactly (``count``, ``sum``, ``min``, ``max``, each with a
  ``FILTER (WHERE ...)`` or not, arithmetic over them such as a ratio
  ``sum(x) * 1.0 / count()``, ``group_by``)
  and returns a SQLAlchemy ``Result`` (``.all()``, ``.scalars()``,
  ``.mappings()``, iteration).
* ``where``, ``order_by`` and ``limit``/``offset`` hold across
  databases exactly as on one table holding every row of the selected
  databases (ties of ``order_by`` come in any order, as on one table).
  Text is ordered by code point on both backends, whatever the server's
  locale (SQLite's ``BINARY``, PostgreSQL's ``"C"`` collation). A
  join (to ``runs``, an ``aliased()`` self-join) or a subquery runs inside
  each database: rows of different databases never meet, so a subquery
  that reduces its rows (an aggregate, ``LIMIT``; read as a table,
  ``DISTINCT``, ``GROUP BY``, ``UNION``) would give each database's answer
  and is refused.
  Without a selector, every database of the entity's role
  (completions or judgements; both for runs and adoptions). Databases without
  tables are skipped.
* A JSON value (``top_logprobs``, ``usage``, an element of them) is never
  ordered, grouped, or taken ``sum``/``min``/``max`` of: PostgreSQL's json
  has neither order nor equality, so both backends refuse it with a
  :class:`~store.errors.StatementError`; a typed element compares
  (``Judgement.top_logprobs["A"].as_float()``).
* A column or table that is none of judgestore's (a typo, a column a user
  added by hand) and that a database cannot read is a
  :class:`~store.errors.StatementError` naming it, never a damaged database;
  one of judgestore's own that a database lacks is damage
  (:func:`store.schema.foreign_name_error`). A SQLite database reads the
  columns added to it; a server store reads judgestore's columns only
  across schemas (a session on one database reads the others).
* Everything that cannot be answered exactly is refused, with a typed error,
  before any database is opened (:mod:`store.across.plan`), or, for a
  ``group_by`` of terms that are not selected, once the databases are
  known and before any row is read (exact over one database only); these
  calls only read.
* Memory stays flat: rows are streamed, a few batches per database
  (:mod:`store.across.merge`); how each backend reads is its own
  (:meth:`store.backend.Storage.read_across`: SQLite merges per-file
  streams, PostgreSQL sends one ``UNION ALL`` statement where it can).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from sqlalchemy import Select
from sqlalchemy.engine import IteratorResult, Result
from sqlalchemy.engine.result import SimpleResultMetaData

from store.across.plan import Plan
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, StatementError
from store.layout import Location, Selector

if TYPE_CHECKING:
    from store.backend import Database, Storage

E = TypeVar("E")


class Store(Protocol):
    """What the queries use of a :class:`store.store.Store` (which calls them, so this module never imports it)."""

    @property
    def storage(self) -> Storage: ...
    def select(self, selector: Selector | None = None) -> list[Location]: ...


class Found(NamedTuple, Generic[E]):
    """One row of ``Store.scalars``: where it is stored, the descriptor that produced it, and the ORM object."""

    location: Location
    descriptor: ModelDescriptor
    row: E


def scalars(store: Store, statement: Select[E], selector: Selector | None = None) -> Iterator[Found[E]]:
    """Every row of ``select(Entity)...`` over the selected databases, as on one table (module docstring)."""
    plan = Plan.of(statement, entity_only=True)
    databases = _databases(store, plan, selector)
    return _found(store, databases, plan)


def _found(store: Store, databases: list[Database], plan: Plan) -> Iterator[Found[Any]]:
    # Read before the rows: a server's reads then hold one connection at a time.
    descriptors = [database.metadata().descriptor for database in databases]
    for index, values in store.storage.read_across(databases, plan):
        assert index is not None  # an entity's row always comes from one database
        yield Found(databases[index].location, descriptors[index], values[0])


def execute(
    store: Store, statement: Select[*tuple[Any, ...]], selector: Selector | None = None
) -> Result[*tuple[Any, ...]]:
    """The rows of a column select or a combinable aggregate over the selected databases (module docstring)."""
    plan = Plan.of(statement)
    databases = _databases(store, plan, selector)
    plan.check_databases(len(databases))
    names = [d["name"] or f"column_{i}" for i, d in enumerate(statement.column_descriptions)]
    rows = (values for _, values in store.storage.read_across(databases, plan))
    return IteratorResult(SimpleResultMetaData(names), rows)


def _databases(store: Store, plan: Plan, selector: Selector | None) -> list[Database]:
    """The selected databases that hold the statement's tables, opened (those without tables skipped)."""
    if selector is not None and not isinstance(selector, Selector):  # a role's name: an AttributeError (was)
        raise InvalidInputError(
            f"selector must be a Selector, e.g. Selector(role='completions', task='mt-bench'), got "
            f"{type(selector).__name__} {selector!r:.40}"
        )
    selector = selector or Selector()
    role = plan.role
    if role is not None and selector.role not in (None, role):
        raise StatementError(f"the statement reads {role} but the selector picks {selector.role} databases")
    databases = []
    for location in store.select(selector):
        if role is None or location.role == role:
            database = store.storage.open_existing(location)  # not Store's: a read never upgrades
            if database is not None:
                databases.append(database)
    return databases
