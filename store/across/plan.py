"""What a statement asks of a query across databases, and whether the answer can be combined exactly.

Contract:

* :meth:`Plan.of` reads a SQLAlchemy 2 ``select()`` once, before any
  database is opened, and refuses what cannot be answered exactly from each
  database's own answer with a typed error (:class:`~store.errors.StatementError`,
  :class:`~store.errors.NotCombinableError`): anything but a ``select()``
  (these calls only read; a top-level ``UNION``/``EXCEPT``/``INTERSECT``
  is refused as what it is), ``FOR UPDATE``, ``DISTINCT`` (of the statement,
  or ``distinct(x)``/``func.distinct(x)`` in a column), ``HAVING``, a
  subquery that reduces its rows (an aggregate, ``LIMIT``/``OFFSET``/
  ``FETCH``; read as a table, ``FROM`` or a CTE, also ``DISTINCT``,
  ``GROUP BY`` or a ``UNION`` other than ``UNION ALL``: it runs inside each
  database, so its rows would be each database's top rows or distinct
  values, not one table's), window functions, aggregates other than
  ``count``/``sum``/``min``/``max`` (each with a ``FILTER (WHERE ...)`` or
  not: the filtered ones combine as the others do; an aggregate inside a
  FILTER is refused, as a database refuses it), ``count(DISTINCT x)``, an
  aggregate inside another or in a subquery, an aggregate called in SQL
  text (``literal_column("count(*)")``, ``text("DISTINCT x")`` inside
  one: the plan cannot see it; quoted text and comments call nothing, nor
  does SQLite's two-argument ``min(a, b)``/``max(a, b)``, a row's value),
  arithmetic over aggregates
  (:class:`Computed`) that also reads a column or a subquery outside them
  (``sum(x) / y``) or takes an aggregate of values other than whole numbers
  and floats, a column of an aggregate that is not grouped by (a constant,
  one reading no column, is computed once per group: a :class:`Computed`
  without parts), an ordering by
  text (``order_by("n")``/``desc("n")`` naming a labelled column, or a
  column of the FROM clause, is that column, as SQLAlchemy resolves the
  name), a ``COLLATE`` in an ordering, a limit or offset that is not a number,
  a statement that reads none of the store's tables or both completions and
  judgements (no database holds both), one that reads them only in a
  subquery (``select(exists(...))``, a scalar subquery alone: with no FROM
  of its own, each database would answer it once), a loader option (``defer``,
  ``load_only``...: the rows come back detached, so a column left out could
  never be loaded), a JSON value in an ordering, a grouping or a
  ``sum``/``min``/``max`` (PostgreSQL's json has neither order nor equality),
  a ``fetch()`` with ``percent`` or ``with_ties`` (a plain ``fetch(n)`` is
  ``limit(n)``),
  and an ordering or a ``min``/``max`` of a value whose type is unknown (a
  function SQLAlchemy does not type, other than those of
  :data:`TEXT_FUNCTIONS` and :data:`NUMBER_FUNCTIONS`; ``literal_column``):
  whether PostgreSQL must compare it as text by code point cannot be told,
  so the error says how to give it a type.
* A ``group_by`` term that is not a column of the result
  (:attr:`Plan.ungrouped`) leaves nothing to tell two databases' groups
  apart: :meth:`Plan.check_databases` refuses it over more than one
  database (select every ``group_by`` column), before any row is read; over
  one database that database's own groups are the answer, exactly.
* A plan is one of three kinds: :attr:`Kind.ENTITY` (``select(Entity)`` of
  one of :data:`ENTITIES`, what ``Store.scalars`` takes), :attr:`Kind.ROWS`
  (columns, entities among them) and :attr:`Kind.AGGREGATE` (``count``,
  ``sum``, ``min``, ``max``, ``FILTER`` or not, arithmetic over them,
  ``group_by``). It says how each database is asked
  (:meth:`Plan.per_database`: the global ``limit + offset`` rows in the
  global order, the ordering's values added as trailing columns; a computed
  column's aggregates in its place) and how the answers combine
  (:attr:`Plan.combine`, :attr:`Plan.asked`); :mod:`store.across.merge`
  does the combining.
* A column of arithmetic over aggregates (``count().filter(c) * 100.0 /
  count()``, ``max(a) - min(a)``, functions of them) is a :class:`Computed`:
  each database returns each of its aggregates as a column (read as the
  driver gives it, whatever a ``type_coerce`` says), those combine as such
  columns do, and the backend then computes the expression itself from the
  combined values, bound as the types it gives those aggregates: its
  integer division, NULLs and division by zero (SQLite: NULL; PostgreSQL:
  an error) are what one table would give.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Alias, CompoundSelect, Float, Integer, Select, String, Table, type_coerce
from sqlalchemy.orm.interfaces import LoaderOption
from sqlalchemy.sql import ClauseElement, ColumnElement, operators, visitors
from sqlalchemy.sql.elements import (
    BindParameter,
    ClauseList,
    CollationClause,
    ColumnClause,
    FunctionFilter,
    Label,
    Over,
    TextClause,
    UnaryExpression,
    WithinGroup,
    _label_reference,
    _textual_label_reference,
)
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import (
    AliasedReturnsRows,
    ReturnsRows,
    ScalarSelect,
    _CompoundSelectKeyword,
    _select_iterables,
)
from sqlalchemy.sql.sqltypes import NullType
from sqlalchemy.sql.util import find_tables

from store.errors import InvalidInputError, NotCombinableError, StatementError
from store.roles import Role
from store.tables.models import Adoption, Base, Completion, Judgement, Run, UTCDateTime

ENTITIES: tuple[type[Base], ...] = (Completion, Judgement, Run, Adoption)
ROLE_OF_TABLE: dict[str, Role] = {"completions": "completions", "judgements": "judgements"}
COMBINABLE = ("count", "sum", "min", "max")
# Aggregate functions of SQLite and PostgreSQL that cannot be combined from per-database results.
OTHER_AGGREGATES = frozenset({
    "avg", "total", "group_concat", "string_agg", "array_agg", "json_group_array", "json_group_object",
    "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "stddev", "stddev_pop", "stddev_samp",
    "variance", "var_pop", "var_samp", "median", "mode", "percentile_cont", "percentile_disc", "every",
    "bool_and", "bool_or", "bit_and", "bit_or", "bit_xor", "corr", "covar_pop", "covar_samp", "regr_slope",
    "regr_intercept", "regr_count", "regr_r2", "regr_avgx", "regr_avgy", "regr_sxx", "regr_sxy", "regr_syy",
    "xmlagg", "range_agg", "range_intersect_agg", "any_value", "json_objectagg", "json_arrayagg",
    "jsonb_object_agg_strict", "json_object_agg_strict", "jsonb_object_agg_unique", "json_object_agg_unique",
    "jsonb_object_agg_unique_strict", "json_object_agg_unique_strict", "jsonb_group_array",
    "jsonb_group_object",
})  # fmt: skip
# An aggregate called in SQL text (literal_column("count(*)"), text(...), "count"(*) quoted): the plan cannot see
# it. What is quoted or a comment is no call (_SQL_NOT_CALLS, removed first).
AGGREGATE_IN_TEXT = re.compile(rf'"?\b({"|".join(sorted({*COMBINABLE, *OTHER_AGGREGATES}))})\b"?\s*\(', re.IGNORECASE)
_SQL_NOT_CALLS = re.compile(r"'(?:[^']|'')*'|/\*.*?\*/|--[^\n]*", re.DOTALL)
_DISTINCT_TEXT = re.compile(r"\s*distinct\b", re.IGNORECASE)
# Functions SQLAlchemy leaves untyped that return text on both backends: ordered (and min/max) as text, by code
# point; and those that return a number. Any other untyped value is refused where it is compared (see above).
TEXT_FUNCTIONS = frozenset({
    "lower", "upper", "trim", "ltrim", "rtrim", "replace", "substr", "substring", "ifnull", "nullif", "printf",
    "format", "quote", "hex", "char", "lpad", "rpad", "left", "right", "reverse", "initcap", "translate", "btrim",
})  # fmt: skip
NUMBER_FUNCTIONS = frozenset({
    "abs", "round", "length", "octet_length", "ceil", "ceiling", "floor", "sign", "mod", "instr", "unicode",
    "trunc", "power", "sqrt", "exp", "ln", "log", "random",
})  # fmt: skip
AcrossRows = Iterator[tuple[int | None, tuple[Any, ...]]]  # (index of the database or None, values)
KEY_LABEL = "_judgestore_key_{}"  # an ordering's value, added as a trailing column of each database's statement
PART_LABEL = "_judgestore_part_{}_{}"  # an aggregate of a computed column, asked of each database as a column
COMPUTED = "computed"  # how a column of arithmetic over aggregates combines (Plan.combine): see Computed


class Kind(enum.Enum):
    ENTITY = "entity"
    ROWS = "rows"
    AGGREGATE = "aggregate"


@dataclass(frozen=True, slots=True)
class OrderKey:
    """One term of ``order_by``: its expression, direction, and where NULLs go (None: the backend's default)."""

    expression: ColumnElement[Any]
    descending: bool
    nulls_first: bool | None


@dataclass(frozen=True, slots=True)
class Computed:
    """A result column computed from aggregates (``sum(x) * 1.0 / count()``, ``max(a) - min(a)``).

    Each database is asked for its ``parts`` (each ``count``/``sum``/``min``/``max``, FILTER or not, of whole
    numbers or floats) as columns of their own; those combine as such columns do; then the backend computes
    ``expression`` from the combined values, bound as the types it gives those aggregates
    (:mod:`store.across.merge`): integer division, NULLs and a division by zero as over one table.
    """

    expression: ColumnElement[Any]  # the column, without its label
    parts: tuple[ColumnElement[Any], ...]  # the aggregates in it, each once, in the order each database returns them


@dataclass(frozen=True, slots=True)
class Plan:
    """A statement read for a query across databases (see the module docstring)."""

    statement: Select[Any]
    kind: Kind
    tables: frozenset[str]  # the store's tables it reads
    single_table: bool  # it reads one table, once, and nothing else (a backend may read all databases as one)
    order: tuple[OrderKey, ...]
    limit: int | None
    offset: int
    width: int  # columns of the result
    combine: tuple[str, ...]  # AGGREGATE: per column, "group", one of COMBINABLE, or COMPUTED
    order_columns: tuple[int, ...]  # AGGREGATE: the result column each OrderKey orders by
    ungrouped: tuple[str, ...] = ()  # AGGREGATE: the group_by terms that are not columns of the result
    computed: tuple[Computed | None, ...] = ()  # AGGREGATE: per column, how a COMPUTED column is computed

    @property
    def asked(self) -> tuple[str, ...]:
        """AGGREGATE: how each column of :meth:`per_database` combines (a computed column's parts in its place)."""
        how: list[str] = []
        for i, combine in enumerate(self.combine):
            computed = self.computed[i] if self.computed else None
            if computed is None:
                how.append(combine)
            else:
                how.extend(_function_name(aggregate_of(part)) or "" for part in computed.parts)
        return tuple(how)

    @property
    def role(self) -> Role | None:
        """The role of every database the statement can read (None: both hold its tables)."""
        roles = {ROLE_OF_TABLE[name] for name in self.tables if name in ROLE_OF_TABLE}
        return roles.pop() if roles else None

    @property
    def entity(self) -> type[Base]:
        return self.statement.column_descriptions[0]["entity"]  # type: ignore[no-any-return]

    @property
    def has_entities(self) -> bool:
        """Whether a result column is an entity (or an ``aliased()`` one) rather than a column."""
        return any(d["entity"] is not None and d["expr"] is d["entity"] for d in self.statement.column_descriptions)

    def check_databases(self, count: int) -> None:
        """Refuse, before anything is read, what cannot be combined over ``count`` databases (module docstring)."""
        if self.ungrouped and count > 1:
            raise NotCombinableError(
                f"group_by({', '.join(self.ungrouped)}), a grouping by terms that are not selected (select every "
                "group_by column: without them two databases' groups cannot be told apart),"
            )

    def per_database(self) -> Select[Any]:
        """What each database runs: every row the global window may need, the ordering's values trailing."""
        if self.kind is Kind.AGGREGATE:
            statement = self.statement.order_by(None).limit(None).offset(None)
            if not any(self.computed):
                return statement
            columns: list[Any] = []
            for i, (column, computed) in enumerate(zip(statement.selected_columns, self.computed, strict=True)):
                if computed is None:
                    columns.append(column)
                else:
                    # Read as the driver gives them, not as the type a type_coerce() gave them: the backend
                    # computes the expression from the values one table would have had (merge.bound).
                    raw = (type_coerce(part, NullType()) for part in computed.parts)
                    columns.extend(part.label(PART_LABEL.format(i, j)) for j, part in enumerate(raw))
            return statement.with_only_columns(*columns, maintain_column_froms=True)
        needed = None if self.limit is None else self.limit + self.offset
        keys = [key.expression.label(KEY_LABEL.format(i)) for i, key in enumerate(self.order)]
        return self.statement.limit(needed).offset(None).add_columns(*keys)

    @classmethod
    def of(cls, statement: object, *, entity_only: bool = False) -> Plan:
        """Read ``statement``; refuse what cannot be combined exactly (see the module docstring)."""
        if isinstance(statement, CompoundSelect):  # it reads, but is no select(): not told to use a writing session
            raise StatementError(
                f"a {statement.keyword.value} of select() statements is not run across databases; run each select() "
                "and combine their rows"
            )
        if not isinstance(statement, Select):
            raise StatementError(
                f"expected a select() statement, got {type(statement).__name__}: queries across databases only "
                "read. To change one database, use `with store.open(location).session(write=True) as session:`"
            )
        if statement._for_update_arg is not None:
            raise StatementError("FOR UPDATE locks rows for a write; queries across databases only read")
        if statement._distinct or statement._distinct_on:
            raise NotCombinableError("DISTINCT")
        if statement._having_criteria:
            raise NotCombinableError("HAVING")
        if any(isinstance(option, LoaderOption) for option in statement._with_options):
            raise StatementError(
                "loader options (defer, load_only, undefer, raiseload...) are refused across databases: the rows "
                "come back detached (each database's transaction is over), so a column left out could never be "
                "loaded later. select(Entity) reads every column; to read only some, name them: "
                "Store.execute(select(Judgement.judge, ...))"
            )
        _refuse_naive_datetimes(statement)
        tables = _tables(statement)
        descriptions = statement.column_descriptions
        is_entity = len(descriptions) == 1 and any(descriptions[0]["expr"] is e for e in ENTITIES)
        if entity_only and not is_entity:
            names = ", ".join(e.__name__ for e in ENTITIES)
            raise StatementError(
                f"Store.scalars takes select() of one of {names} (got {_shown(statement)}); "
                "use Store.execute for columns and aggregates"
            )
        limit, offset = _limit(statement), _number(statement, "offset") or 0
        order = tuple(_order_key(term, statement) for term in statement._order_by_clauses)
        combination = _combination(statement)
        _refuse_reducing(statement)
        if not statement.get_final_froms():  # select(exists(...)), a scalar subquery alone: no FROM of its own
            raise StatementError(
                f"{_shown(statement)} reads the store's tables only in a subquery (EXISTS, a scalar subquery), so "
                "each database would answer it once, one row each: select from the table itself (for "
                "exists: select(Entity.input_hash).where(...).limit(1))"
            )
        if combination is None:
            return cls(statement, Kind.ENTITY if is_entity else Kind.ROWS, tables, _single(statement, tables),
                       order, limit, offset, len(descriptions), (), ())  # fmt: skip
        combine, computed = combination
        return cls(statement, Kind.AGGREGATE, tables, _single(statement, tables), order, limit, offset,
                   len(descriptions), combine, _order_columns(statement, order), _ungrouped(statement),
                   computed if any(computed) else ())  # fmt: skip


def _refuse_naive_datetimes(statement: Select[Any]) -> None:
    """A naive datetime compared with a stored time (``created_at > datetime(2026, 1, 1)``), refused before
    anything is read: the column's type refused it as the statement ran, in SQLAlchemy's error holding the whole
    SQL (a ``UNION ALL`` over every schema of a server, 7,500 characters for nine: was)."""
    for element in visitors.iterate(statement):
        if isinstance(element, BindParameter) and isinstance(element.type, UTCDateTime):
            values = element.value if isinstance(element.value, list | tuple) else [element.value]
            for value in values:
                if isinstance(value, datetime) and value.tzinfo is None:
                    raise InvalidInputError(
                        "a time compared with a stored one (created_at...) must be timezone-aware (e.g. "
                        f"datetime(2026, 1, 1, tzinfo=UTC)), got naive {value!r}"
                    )


def _shown(statement: Select[Any]) -> str:
    names = [str(d["name"]) for d in statement.column_descriptions]
    return f"select({', '.join(names)})"


def _number(statement: Select[Any], which: str) -> int | None:
    clause = getattr(statement, f"_{which}_clause")
    if clause is None:
        return None
    value = getattr(clause, "value", None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        given = clause if value is None else repr(value)  # a bound number shows itself, not its ":param_1"
        raise StatementError(f"{which} must be a whole number >= 0 written into the statement, got {given}")
    return value


def _limit(statement: Select[Any]) -> int | None:
    """The statement's limit: ``limit(n)``, or ``fetch(n)`` (``FETCH FIRST n ROWS ONLY``: the same rows).

    Each database is asked with ``limit()`` (:meth:`Plan.per_database`), which drops a ``FETCH``: read here, it
    is applied after the merge like a limit, never lost.
    """
    if statement._fetch_clause is None:
        return _number(statement, "limit")
    options = statement._fetch_clause_options or {}
    if options.get("percent") or options.get("with_ties"):
        raise StatementError(
            f"fetch({statement._fetch_clause}, percent=..., with_ties=...) cannot be applied across databases; "
            "use limit(n)"
        )
    return _number(statement, "fetch")


def _refuse_reducing(statement: Select[Any]) -> None:
    """Refuse DISTINCT in a column, and a subquery (or CTE) whose rows depend on other rows.

    ``distinct(x)`` and ``func.distinct(x)`` in a column make the statement's own ``SELECT DISTINCT`` (or a
    ``count(DISTINCT x)``). A subquery runs inside each database, so the rows of one with LIMIT/OFFSET/FETCH
    are each database's top k (``IN (... LIMIT 1)``: the latest row of each), and those of a subquery read
    as a table (``FROM``, a CTE) with DISTINCT, GROUP BY or a UNION that is not ``UNION ALL`` each database's
    distinct values, which ``count()`` would add up. (DISTINCT in an ``IN (...)`` changes nothing: kept.)
    Aggregates in a subquery are refused by :func:`_combination` for the same reason.
    """
    elements = list(visitors.iterate(statement))
    read_as_tables = {id(e.element) for e in elements if isinstance(e, AliasedReturnsRows)}
    for element in elements:
        if isinstance(element, UnaryExpression) and element.operator is operators.distinct_op:
            raise NotCombinableError(f"DISTINCT {element.element}")  # (str(element) warns outside an aggregate)
        if isinstance(element, FunctionElement) and _function_name(element) == "distinct":
            raise NotCombinableError(f"DISTINCT {element.clauses}")
        if element is statement or not isinstance(element, Select | CompoundSelect):
            continue
        reduces = element._limit_clause is not None or element._offset_clause is not None
        reduces = reduces or element._fetch_clause is not None
        if id(element) in read_as_tables:
            if isinstance(element, CompoundSelect):
                reduces = reduces or element.keyword is not _CompoundSelectKeyword.UNION_ALL
            else:
                reduces = reduces or bool(element._distinct or element._distinct_on or element._group_by_clauses)
        if reduces:
            raise NotCombinableError(
                "a subquery with LIMIT or OFFSET, or read as a table with DISTINCT, GROUP BY or UNION (it runs "
                "inside each database, so its rows would be each database's, not those of one table),"
            )


def _tables(statement: Select[Any]) -> frozenset[str]:
    """The store's tables ``statement`` reads (through aliases and subqueries too)."""
    ours = {table.name for table in Base.metadata.sorted_tables}
    found = frozenset(
        table.name for table in find_tables(statement, include_joins=True) if isinstance(table, Table)
    ) | frozenset(
        e.original.name  # an aliased(Entity): the alias of one of our tables
        for e in find_tables(statement, include_aliases=True)
        if isinstance(e, Alias) and isinstance(e.original, Table)
    )
    found = found & ours
    if not found:
        raise StatementError(f"{_shown(statement)} reads none of the store's tables ({', '.join(sorted(ours))})")
    if {"completions", "judgements"} <= found:
        raise StatementError("a statement cannot read completions and judgements together: no database holds both")
    return found


def _single(statement: Select[Any], tables: frozenset[str]) -> bool:
    """Whether ``statement`` reads one of the store's tables, once, under its own name.

    No alias, no join, no subquery: those run inside each database (rows of two databases never meet), so a
    backend may read every database as one table only when nothing else is read.
    """
    if len(tables) != 1 or len(statement.get_final_froms()) != 1:
        return False
    if any(isinstance(t, Alias) for t in find_tables(statement, include_aliases=True)):
        return False
    return not any(isinstance(e, Select) and e is not statement for e in visitors.iterate(statement))


def _order_key(term: ClauseElement, statement: Select[Any]) -> OrderKey:
    descending, nulls_first = False, None
    while True:
        if isinstance(term, _label_reference):  # order_by(a_label) or order_by(a_label.desc())
            term = term.element
        elif isinstance(term, _textual_label_reference):  # order_by("name"), desc("name"): a column of the result
            named = _named_column(statement, term.element)
            if named is None:
                break
            term = named
        elif isinstance(term, UnaryExpression) and term.modifier in (
            operators.desc_op, operators.asc_op, operators.nulls_first_op, operators.nulls_last_op,
        ):  # fmt: skip
            if term.modifier is operators.desc_op:
                descending = True
            elif term.modifier is operators.nulls_first_op:
                nulls_first = True
            elif term.modifier is operators.nulls_last_op:
                nulls_first = False
            term = term.element
        else:
            break
    if isinstance(term, Label):
        term = term.element
    if not isinstance(term, ColumnElement) or type(term).__name__.startswith("_textual"):
        raise StatementError(
            f"order_by({term}) is text that names no column of the statement (or two labelled columns); order by a "
            "column, an expression of columns, or the name of a labelled column or of a column of the FROM clause"
        )
    _refuse_json(term, f"order_by({term})")
    _refuse_untyped(term, f"order_by({term})")
    _refuse_collation(term, f"order_by({term})", "rows are ordered by value")
    return OrderKey(term, descending, nulls_first)


def _refuse_collation(term: ClauseElement, said: str, instead: str) -> None:
    """A collation (``x.collate("NOCASE")``) in a term the databases' answers are combined by: each database
    would apply it, and the merge compares values exactly (``'STOP'`` and ``'stop'`` one group in each
    database, two across them: was)."""
    if any(isinstance(e, CollationClause) for e in visitors.iterate(term)):
        raise StatementError(f"{said} names a collation; across databases {instead}")


def _named_column(statement: Select[Any], name: str) -> ColumnElement[Any] | None:
    """What ``order_by("name")`` (or ``group_by("name")``) names, resolved as SQLAlchemy resolves it when it
    compiles the statement (``SelectState._label_resolve_dict``), so that the databases order by what the merge
    compares: the selected column labelled ``name``, else the column ``name`` of the FROM clause, selected or
    not (of the last table holding one: in a self-join, the ``aliased()`` table's). None: no such column, or
    two selected columns labelled ``name`` (a database would pick one, or refuse).
    """
    selected = [c for c in statement._all_selected_columns if isinstance(c, ColumnElement) and c._allow_label_resolve]
    labelled = [c for c in selected if (c._tq_label or c.key) == name]
    if labelled:
        return labelled[0] if len(labelled) == 1 else None
    bare = statement.order_by(None).group_by(None)  # (computing the froms resolves their names: one may be unknown)
    froms = [c for c in _select_iterables(bare.get_final_froms()) if isinstance(c, ColumnElement)]
    return {c.key: c for c in froms if c._allow_label_resolve}.get(name)  # the last of a name, as SQLAlchemy's


def compares_as_text(term: ColumnElement[Any]) -> bool:
    """Whether ``term``'s values are text, compared by code point across databases (its type, or the function)."""
    return _value_kind(term) == "text"


def _value_kind(term: Any) -> str | None:
    """``"text"``, ``"number"`` or ``"other"`` for what ``term``'s values are; None when that is unknown."""
    if not isinstance(term.type, NullType):
        return "text" if isinstance(term.type, String) else "other"
    if isinstance(term, FunctionFilter):  # min(x) FILTER (...) is a value of min(x)
        return _value_kind(term.func)
    name = _function_name(term)
    if name in TEXT_FUNCTIONS:
        return "text"
    if name in NUMBER_FUNCTIONS:
        return "number"
    arguments = list(term.clauses) if isinstance(term, FunctionElement) else []
    if name in ("min", "max", "sum") and len(arguments) == 1:  # the type of what they add up or pick
        return _value_kind(arguments[0])
    return None


def _refuse_untyped(term: ClauseElement, shown: str) -> None:
    """Refuse comparing a value of unknown type: PostgreSQL would order it in the server's collation if it is
    text, and the databases' answers would then not merge in order."""
    if isinstance(term, ColumnElement) and _value_kind(term) is None:
        raise StatementError(
            f"{shown}: the type of {term} is unknown, so it cannot be compared alike in every database; give it "
            "one: func.f(..., type_=String) or type_coerce(expression, Integer)"
        )


def _refuse_json(term: ClauseElement, shown: str) -> None:
    """Refuse ordering, grouping or ``sum``/``min``/``max`` of a JSON value: neither backend can compare two."""
    if isinstance(getattr(term, "type", None), JSON):
        raise StatementError(
            f"{shown}: JSON values cannot be compared (PostgreSQL's json has neither order nor equality); use a "
            "typed element, e.g. the logprob of the first token sampled: "
            "Judgement.top_logprobs['positions'][0]['sampled']['logprob'].as_float()"
        )


def _function_name(element: object) -> str | None:
    return element.name.lower() if isinstance(element, FunctionElement) and hasattr(element, "name") else None


def _aggregate_name(element: object) -> str | None:
    """The name of the aggregate function ``element`` is; None for anything else, SQLite's ``min(a, b)`` and
    ``max(a, b)`` of a row's values among it."""
    name = _function_name(element)
    if name not in COMBINABLE and name not in OTHER_AGGREGATES:
        return None
    if name in ("min", "max") and len(list(element.clauses)) > 1:  # type: ignore[attr-defined]
        return None
    return name


def _sql_text(element: object) -> str | None:
    """The SQL text ``element`` is (``text()``, ``literal_column()``); None for anything else."""
    if isinstance(element, TextClause):
        return element.text
    if isinstance(element, ColumnClause) and element.is_literal:
        return element.name
    return None


def _text_aggregate(sql: str) -> str | None:
    """The first aggregate function SQL text calls (outside quotes and comments); None where it calls none
    (SQLite's ``min(a, b)``/``max(a, b)`` are a row's values)."""
    bare = _SQL_NOT_CALLS.sub(" ", sql)
    for match in AGGREGATE_IN_TEXT.finditer(bare):
        name = match.group(1).lower()
        if name not in ("min", "max") or not _more_than_one_argument(bare, match.end()):
            return name
    return None


def _more_than_one_argument(sql: str, start: int) -> bool:
    """Whether the call whose arguments begin at ``sql[start]`` has a comma outside inner parentheses."""
    depth = 0
    for char in sql[start:]:
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return False
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False


def aggregate_of(term: ClauseElement) -> FunctionElement[Any] | None:
    """The ``count``/``sum``/``min``/``max`` that ``term`` is (a label, a ``FILTER`` around it), without
    DISTINCT: what combines across databases as a column of its own. None: anything else."""
    if isinstance(term, Label):
        term = term.element
    function = term.func if isinstance(term, FunctionFilter) else term
    if not isinstance(function, FunctionElement) or _aggregate_name(function) not in COMBINABLE:
        return None
    for element in visitors.iterate(function):  # DISTINCT, or "DISTINCT x" as text: not combinable
        text = _sql_text(element)
        if (isinstance(element, UnaryExpression) and element.operator is operators.distinct_op) or (
            text is not None and _DISTINCT_TEXT.match(text)
        ):
            return None
    return function


def _computed(column: ColumnElement[Any]) -> Computed | None:
    """``column`` as arithmetic over aggregates that combine (:class:`Computed`); None when it holds none.

    Refused: such a column that also reads a column or a subquery outside its aggregates (``sum(x) / y``:
    ``y`` has no one value per group across databases), and an aggregate in it of values that are not whole
    numbers or floats (the backend computes the expression from values bound as numbers of its own types).
    Other aggregates in it (``avg``, ``count(DISTINCT x)``, one inside another) are left to
    :func:`_combination`, which refuses them.
    """
    parts: dict[int, ColumnElement[Any]] = {}
    outside: list[ClauseElement] = []

    def walk(element: ClauseElement) -> None:
        if aggregate_of(element) is not None:
            parts.setdefault(id(element), element)  # type: ignore[arg-type]
        elif _aggregate_name(element) is not None:
            return  # refused by _combination, as what it is
        elif _reads_rows(element):
            outside.append(element)
        else:
            for child in element.get_children():
                walk(child)

    walk(column)
    if not parts:
        return None
    if outside:
        raise NotCombinableError(
            f"{column}, arithmetic over aggregates and {outside[0]} outside them (select that column, grouped by, "
            "beside the aggregates, and compute the expression from the rows),"
        )
    for part in parts.values():
        function = aggregate_of(part)
        assert function is not None
        arguments = list(function.clauses)
        if _function_name(function) == "count" or not arguments:
            continue
        _refuse_json(arguments[0], str(part))
        if not isinstance(arguments[0].type, Integer | Float):
            raise StatementError(
                f"{part} in {column}: arithmetic over aggregates across databases takes those of whole numbers or "
                f"floats, and the type of {arguments[0]} is {arguments[0].type!r}; give it one: "
                "type_coerce(x, Float) or type_coerce(x, Integer)"
            )
    return Computed(column, tuple(parts.values()))


def _reads_rows(element: ClauseElement) -> bool:
    """Whether ``element`` is a column of a table or a subquery (not a literal, nor a function: SQLAlchemy makes
    every function something rows can be selected from)."""
    if isinstance(element, ColumnClause):
        return not element.is_literal
    return isinstance(element, ScalarSelect | ReturnsRows) and not isinstance(element, FunctionElement)


def _combination(statement: Select[Any]) -> tuple[tuple[str, ...], tuple[Computed | None, ...]] | None:
    """How each result column combines across databases, and how each computed one is computed (None for the
    others); None when the statement aggregates nothing."""
    _refuse_text_aggregates(statement)
    columns = [c.element if isinstance(c, Label) else c for c in statement.selected_columns]
    how: list[str] = []
    computed: list[Computed | None] = []
    allowed: set[int] = set()  # the aggregates that combine: each a column of its own or a computed one's part
    for column in columns:
        function = aggregate_of(column)
        computed.append(None if function is not None else _computed(column))
        if function is not None:
            how.append(_function_name(function))  # type: ignore[arg-type]
            allowed |= {id(column), id(function)}
        elif computed[-1] is not None:
            how.append(COMPUTED)
            for part in computed[-1].parts:
                allowed |= {id(part), id(aggregate_of(part))}
        else:
            how.append("group")
    top = {id(c) for c, h in zip(columns, how, strict=True) if h != "group"}
    for element in visitors.iterate(statement.order_by(None)):  # an ordering names the result's own columns
        if isinstance(element, Over | WithinGroup):
            raise NotCombinableError("a window function (OVER) or an ordered-set aggregate")
        name = _aggregate_name(element)
        # (An aggregate's FILTER holds no aggregate: a database refuses one there, so it is refused here too.)
        if name is not None and id(element) not in allowed:
            where = " with DISTINCT, inside another aggregate or in a subquery" if name in COMBINABLE else ""
            raise NotCombinableError(f"{name}(...){where}")
    groups = _groups(statement)
    for column, h in zip(columns, how, strict=True):
        if h in ("sum", "min", "max"):
            _refuse_json(column, str(column))
        if h in ("min", "max"):
            _refuse_untyped(column, str(column))
            _refuse_collation(column, str(column), "min and max compare values exactly")
    for group in groups:
        _refuse_json(group, f"group_by({group})")
        _refuse_collation(group, f"group_by({group})", "rows are grouped by their exact values")
    if not top and not groups:
        for term in statement._order_by_clauses:
            if any(_aggregate_name(e) is not None for e in visitors.iterate(term)):
                raise NotCombinableError(f"order_by({term}), an aggregate of a statement that aggregates nothing,")
        return None
    for i, column in enumerate(columns):
        if how[i] == "group" and not any(_same(column, g) for g in groups):
            if not _constant(column):
                raise NotCombinableError(f"the column {column} of an aggregate, not in its group_by,")
            # One value per group, as over one table: the backend computes it once per combined group.
            how[i], computed[i] = COMPUTED, Computed(column, ())
    return tuple(how), tuple(computed)


def _refuse_text_aggregates(statement: Select[Any]) -> None:
    """Refuse an aggregate called in SQL text anywhere in ``statement``: the plan cannot see it to combine it
    (over a folder store each database's count came back as a row of its own)."""
    for element in visitors.iterate(statement):
        text = _sql_text(element)
        name = None if text is None else _text_aggregate(text)
        if name is not None:
            raise NotCombinableError(
                f"the SQL text {text!r}, which calls {name}() where the plan cannot see it (write it with "
                "func.count(), func.sum(...)),"
            )


def _constant(column: ColumnElement[Any]) -> bool:
    """Whether ``column`` reads nothing of a row: only bound values and functions and operators over them
    (``literal(2)``, ``func.random()``), no column, no subquery, no aggregate, no text SQL (``literal_column``
    and ``text()`` could name a column)."""
    for element in visitors.iterate(column):
        if isinstance(element, ColumnClause | TextClause) or _aggregate_name(element) is not None:
            return False
        if isinstance(element, ScalarSelect | ReturnsRows) and not isinstance(element, FunctionElement):
            return False
    return True


def _ungrouped(statement: Select[Any]) -> tuple[str, ...]:
    """The ``group_by`` terms that are not columns of the result."""
    columns = [c.element if isinstance(c, Label) else c for c in statement.selected_columns]
    return tuple(str(g) for g in _groups(statement) if not any(_same(c, g) for c in columns))


def _groups(statement: Select[Any]) -> tuple[ClauseElement, ...]:
    """The ``group_by`` terms, ``group_by("name")`` read as the column it names (:func:`_named_column`)."""
    groups = []
    for group in statement._group_by_clauses:
        named = _named_column(statement, group.element) if isinstance(group, _textual_label_reference) else None
        groups.append(group if named is None else named)
    return tuple(groups)


def _same(a: ClauseElement, b: ClauseElement) -> bool:
    return _bare(a).compare(_bare(b))


def _bare(term: ClauseElement) -> ClauseElement:
    """``term`` without what SQLAlchemy wraps it in: a label, or the one-term list ``group_by(func.f(x))`` makes
    of a function (an anonymous label inside), so that a grouping names the same expression as a column."""
    while True:
        if isinstance(term, Label):
            term = term.element
        elif isinstance(term, ClauseList) and len(term.clauses) == 1:
            term = term.clauses[0]
        else:
            return term


def _order_columns(statement: Select[Any], order: tuple[OrderKey, ...]) -> tuple[int, ...]:
    """For an aggregate: the result column each ordering term names (an aggregate is ordered by its own columns)."""
    columns = list(statement.selected_columns)
    positions = []
    for key in order:
        for i, column in enumerate(columns):
            element = column.element if isinstance(column, Label) else column
            if key.expression.compare(element) or key.expression.compare(column):
                positions.append(i)
                break
        else:
            raise StatementError(
                f"order_by({key.expression}) is not a column of the aggregate; across databases an aggregate is "
                "ordered by its own columns"
            )
    return tuple(positions)
