"""Reading many descriptor schemas of a PostgreSQL store as one: one statement wherever the SQL allows it.

Contract:

* A statement that reads one of the store's tables once, under its own name
  (:attr:`~store.across.plan.Plan.single_table`), entities of that table or
  columns or aggregates, runs as **one** statement: the table's name is
  bound, for that statement only, to a common table expression that is the
  ``UNION ALL`` of the table in every selected schema::

      WITH judgements AS (SELECT ..., 0 AS _judgestore_db FROM js_j_1.judgements
                          UNION ALL SELECT ..., 1 FROM js_j_2.judgements ...)
      SELECT ... FROM judgements WHERE ... ORDER BY ... LIMIT ...

  so ``where``, ``order_by``, ``limit``, ``offset`` and the aggregates are
  the server's own over every row (PostgreSQL pushes the conditions into
  each branch and merges ordered branches), in one round trip, streamed
  through a server-side cursor.
* Entities read that way are built from their columns as detached objects
  (:func:`_detached`): the same primary key may be in two schemas, and one
  ``Session``'s identity map would fold them into one object. Every column
  is loaded, as on SQLite (the plan refuses loader options such as
  ``load_only``).
* Any other statement (a join, an alias, a subquery, entities among columns) runs in
  each schema on **one** connection (``schema_translate_map`` per
  execution, a ``Session`` per schema so equal keys stay distinct objects),
  and the rows are merged in Python (:mod:`store.across.merge`), NULLs
  ordered as PostgreSQL orders them. Never a connection per schema.
  Arithmetic over aggregates is computed on the same connection from the
  combined aggregates, bound as PostgreSQL types those aggregates
  (:func:`_server_types`, asked of the server: ``count`` a bigint, and
  ``type_coerce(length(x), Float)`` still integers), so its integer
  division, overflow and division by zero are the server's over one table.
* A statement PostgreSQL refuses for what is written in it (a function it
  has not for those types, ``round(double precision, integer)``, which
  SQLite runs; arithmetic out of its type's range) is a
  :class:`~store.errors.StatementError` that says what to cast
  (:func:`_statement_errors`), not an error of the server or its schema.
* Both ways, text (a ``String`` term of ``order_by``, the argument of a
  ``min``/``max``, both sides of a ``<``, ``<=``, ``>``, ``>=`` or
  ``between`` anywhere in the statement, tuples' included:
  :func:`_code_point_compared`) is compared in the ``"C"``
  collation, by code point,
  whatever the server's locale: as SQLite compares it (``BINARY``) and as
  the merge does. Under the server's own collation (``en_US``: ``a < B``)
  the merged streams of two schemas would not even be in order. Text is
  stored escaped (U+0000 as U+FDD0 ``"0"``,
  :mod:`store.backends.postgres.text`), so what is compared is a key of the
  stored text that orders as the read value does (:func:`_code_point_key`).
  An aggregate ordered by its text ``min``/``max`` column is ordered by that
  column as computed, never by the server's own ``min(x)``, another value.
  Text of a function SQLAlchemy leaves untyped (``lower(x)``, ``trim(x)``)
  is read back unescaped, as a text column is: the values returned, and
  those the merge compares, are SQLite's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    REAL,
    BigInteger,
    Double,
    Integer,
    MetaData,
    Numeric,
    Row,
    Select,
    SmallInteger,
    String,
    Text,
    cast,
    false,
    func,
    inspect,
    literal,
    literal_column,
    select,
    tuple_,
    type_coerce,
    union_all,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql import ClauseElement, operators, visitors
from sqlalchemy.sql.elements import BinaryExpression, ColumnElement, FunctionFilter, Grouping, Label, Tuple
from sqlalchemy.sql.sqltypes import NullType
from sqlalchemy.sql.visitors import replacement_traverse

from store.across.merge import Evaluator, read_each
from store.across.plan import AcrossRows, Kind, Plan, aggregate_of, compares_as_text
from store.backends.postgres.registry import quoted, schema_name
from store.backends.postgres.text import ESCAPE, server_safe
from store.errors import StatementError
from store.tables.models import Base

if TYPE_CHECKING:
    from store.backend import Database
    from store.backends.postgres.database import Server

DATABASE_COLUMN = "_judgestore_db"  # the index of the schema a row of the union came from
ROWS_PER_FETCH = 2_000
C = TypeVar("C", bound=ClauseElement)
_UNESCAPED = server_safe(Text())  # text read as the models' text columns are: unescaped (still a String, as text)


def read_across(server: Server, databases: Sequence[Database], plan: Plan) -> AcrossRows:
    """The rows of ``plan`` over ``databases`` (see the module docstring)."""
    schemas = [schema_name(database.location) for database in databases]
    plan = _codepoint_ordered(plan)
    if not schemas or not plan.single_table or (plan.kind is Kind.ROWS and plan.has_entities):
        yield from _each_schema(server, schemas, plan)
        return
    (name,) = plan.tables
    table = Base.metadata.tables[name]
    branches = [
        select(*table.to_metadata(MetaData(), schema=schema).c, literal_column(str(i), Integer).label(DATABASE_COLUMN))
        for i, schema in enumerate(schemas)
    ]
    statement: Select[Any] = plan.statement
    if plan.kind is Kind.ENTITY:
        statement = statement.with_only_columns(*table.c, literal_column(f"{quoted(name)}.{DATABASE_COLUMN}", Integer))
    statement = statement.add_cte(union_all(*branches).cte(name))
    with server.connection() as conn, _statement_errors():
        rows = conn.execution_options(yield_per=ROWS_PER_FETCH).execute(statement)
        if plan.kind is not Kind.ENTITY:
            for row in rows:
                yield None, tuple(row)
            return
        build = _builder(plan.entity, table.c.keys())
        for row in rows:
            yield row[-1], (build(row),)


# What PostgreSQL refuses in the statement itself (SQLite may run it), and how to change the statement.
_REFUSED = {
    "42883": "it has no such function or operator for those types (give the arguments the types it takes: "
    "func.round(cast(x, Numeric), 2)); if the statement is right, a column has another type than the schema's "
    "revision declares (another tool altered it): run `judgestore verify`",
    "42804": "a value has another type than its place takes (cast it); if the statement is right, a column has "
    "another type than the schema's revision declares (another tool altered it): run `judgestore verify`",
    "22003": "its arithmetic is out of the range of its type (cast a term to a wider type: cast(x, BigInteger), "
    "cast(x, Numeric) or cast(x, Float))",
    # SQLAlchemy binds each literal of an expression written twice as a parameter of its own, so PostgreSQL sees
    # two expressions (SQLite compares them by value)
    "22P02": "a value cannot be read as the type the statement casts it to (a JSON element's as_float() of a "
    '-inf, inf or NaN logprob, which the store keeps as {"$float": "-Infinity"}: read those rows and filter '
    "them in Python)",
    "42803": "a selected expression is not the one grouped by (one holding a literal, written twice, is two "
    "expressions to the server): build it once and use that object in both places, e = func.coalesce(x, 'none'); "
    "select(e, func.count()).group_by(e), or group_by its label",
}


@contextmanager
def _statement_errors() -> Iterator[None]:
    """A statement PostgreSQL refuses for what it says (:data:`_REFUSED`) as a
    :class:`~store.errors.StatementError` naming what to change in it: the statement is the caller's, so it
    is neither a server value error nor, first, a schema another tool altered."""
    try:
        yield
    except DBAPIError as e:
        state = getattr(e.orig, "sqlstate", None)
        if state not in _REFUSED:
            raise
        said = str(e.orig).strip().splitlines()[0] if str(e.orig).strip() else type(e.orig).__name__
        raise StatementError(f"PostgreSQL cannot run the statement ({said}): {_REFUSED[state]}") from e


def _codepoint_ordered(plan: Plan) -> Plan:
    """``plan`` comparing text by code point (its ordering, its ``min``/``max``), as SQLite and the merge compare
    it: in the "C" collation, over :func:`_code_point_key` of the stored (escaped) text; and reading text that
    SQLAlchemy leaves untyped (``lower(x)``...) unescaped (:func:`_read_unescaped`)."""
    statement = plan.statement
    texts = [i for i, how in enumerate(plan.combine) if how in ("min", "max") and _is_text(_arguments(statement, i))]
    columns: list[Any] = [d["expr"] for d in statement.column_descriptions]  # an entity stays an entity
    compared: dict[int, Any] = {}  # a text min/max column: what is compared, min(key(x)), before it is read back
    for i, column in enumerate(columns):
        if i in texts:
            (argument,) = _arguments(statement, i)
            compared[i] = getattr(func, plan.combine[i])(_code_point_key(argument))
            inner = column.element if isinstance(column, Label) else column
            if isinstance(inner, FunctionFilter):  # min(x) FILTER (WHERE c): the key's min over the same rows
                compared[i] = compared[i].filter(inner.criterion)
            read = type_coerce(_stored_text(compared[i]), _read_type(argument))  # read back (unescaped) as x is
            columns[i] = read.label(column.name) if isinstance(column, Label) else read
        elif isinstance(column, ColumnElement):
            columns[i] = _read_unescaped(column)
    if any(new is not d["expr"] for new, d in zip(columns, statement.column_descriptions, strict=True)):
        statement = statement.with_only_columns(*columns)
    # The ordering's values that each schema adds as trailing columns, which the merge compares: unescaped too.
    # Their comparisons of text by code point, as the statement's own ordering (each schema's) is, below.
    order = tuple(
        dataclasses.replace(key, expression=_code_point_compared(_read_unescaped(key.expression))) for key in plan.order
    )
    plan = dataclasses.replace(plan, order=order)
    if any(_is_text([key.expression]) for key in plan.order):
        terms = []
        for k, key in enumerate(plan.order):
            if plan.order_columns and plan.order_columns[k] in texts:
                # An ordering by a text min/max is by the value compared: min(x) of the server's collation is
                # another value, in another order.
                term = compared[plan.order_columns[k]]
            else:
                term = _code_point_key(key.expression) if _is_text([key.expression]) else key.expression
            term = term.desc() if key.descending else term.asc()
            terms.append(
                term if key.nulls_first is None else term.nulls_first() if key.nulls_first else term.nulls_last()
            )
        statement = statement.order_by(None).order_by(*terms)
    statement = _code_point_compared(statement)  # last: the whole statement copied at once, see there
    return plan if statement is plan.statement else dataclasses.replace(plan, statement=statement)


_ORDERING = frozenset({operators.lt, operators.le, operators.gt, operators.ge})
_BETWEEN = frozenset({operators.between_op, operators.not_between_op})


def _code_point_compared(clause: C) -> C:
    """``clause`` (a statement, or a term of one) with each ordering comparison of text (``<``, ``<=``, ``>``,
    ``>=``, ``between``, and those of tuples holding text; anywhere: ``where``, a column's FILTER or CASE, a
    subquery, a CTE, and inside the compared terms themselves) made over :func:`_code_point_key` of the compared
    text, as SQLite compares it and as this module orders it: under the server's collation (``en_US``: ``'_z' <
    'B'``), ``where(x > last)`` over an ``order_by(x)`` by code point skipped rows a folder store returned (was).
    Equality is the same either way.

    Copied whole, in one traversal, only when it holds such a comparison; a term used twice (grouped and ordered
    by, a condition selected and grouped by) is copied, or replaced, once: its bound values keep one name, and the
    server sees one expression.
    """
    if not any(_keyed(element, _as_it_is) is not None for element in visitors.iterate(clause)):
        return clause
    replaced: dict[int, Any] = {}

    def once(element: Any, **_: Any) -> Any:
        if id(element) not in replaced:  # the compared terms are traversed too: a comparison may hold another
            replaced[id(element)] = _keyed(element, lambda term: replacement_traverse(term, {}, once))
        return replaced[id(element)]

    compared: Any = replacement_traverse(clause, {}, once)  # a copy of the same kind as clause
    return compared


def _as_it_is(term: Any) -> Any:
    return term


def _keyed(element: Any, inner: Callable[[Any], Any]) -> Any:
    """:func:`_code_point_compared`'s comparison in place of ``element`` (its terms first given to ``inner``), or
    None where it is none."""
    if not isinstance(element, BinaryExpression):
        return None
    if element.operator in _ORDERING:
        left, right = element.left, element.right
        if isinstance(left, Tuple) and isinstance(right, Tuple) and len(left.clauses) == len(right.clauses):
            pairs = list(zip(left.clauses, right.clauses, strict=True))
            if not any(compares_as_text(a) or compares_as_text(b) for a, b in pairs):
                return None
            keyed = [
                (_code_point_key(inner(a)), _code_point_key(inner(b)))
                if compares_as_text(a) or compares_as_text(b)
                else (inner(a), inner(b))
                for a, b in pairs
            ]
            return element.operator(tuple_(*(a for a, _ in keyed)), tuple_(*(b for _, b in keyed)))
        if compares_as_text(left) or compares_as_text(right):
            return element.operator(_code_point_key(inner(left)), _code_point_key(inner(right)))
    if element.operator in _BETWEEN and compares_as_text(element.left):
        low, high = element.right.clauses
        # in parentheses: the server's grammar takes no COLLATE between BETWEEN and AND
        bounds = Grouping(_code_point_key(inner(low))), Grouping(_code_point_key(inner(high)))
        symmetric = bool(element.modifiers.get("symmetric"))
        return element.operator(_code_point_key(inner(element.left)), *bounds, symmetric=symmetric)
    return None


def _read_type(term: Any) -> Any:
    """The type ``term``'s text is read back with: its own, or unescaping where SQLAlchemy gave it none."""
    return _UNESCAPED if isinstance(term.type, NullType) else term.type


def _read_unescaped(term: Any) -> Any:
    """``term``, its values unescaped when they are text of a function SQLAlchemy leaves untyped.

    ``lower(x)``, ``trim(x)``, ``replace(x, ...)`` of a stored value return the stored (escaped) text
    (:mod:`store.backends.postgres.text`): untyped, it would come back as stored (U+0000 as U+FDD0 "0"), and
    the merge would compare those spellings while each schema ordered by code point (rows out of order, a
    wrong ``min``). Typed as the columns are, it is read as SQLite reads it. The SQL is unchanged.
    """
    inner = term.element if isinstance(term, Label) else term
    if not isinstance(inner, ColumnElement) or not isinstance(inner.type, NullType) or not compares_as_text(inner):
        return term
    read = type_coerce(inner, _UNESCAPED)
    return read.label(term.name) if isinstance(term, Label) else read


def _text(value: str) -> Any:
    """``value`` bound as it is (the text columns escape what they bind: :mod:`store.backends.postgres.text`)."""
    return literal(value, String())


def _code_point_key(term: Any) -> Any:
    """Stored text that the "C" collation orders as its read value is ordered by code point.

    A stored value is escaped (:mod:`store.backends.postgres.text`): U+0000 is ``ESCAPE "0"``, which the "C"
    collation would put after almost every character, and U+FDD0 is ``ESCAPE "1"``. Here U+0000 becomes
    ``"\\x01\\x01"`` and U+0001 ``"\\x01\\x02"``, below every other character (PostgreSQL text holds none lower
    than U+0001) and in their order, a prefix-free code: strings compare as their unescaped values do.
    """
    key = func.replace(term, _text("\x01"), _text("\x01\x02"))
    key = func.replace(key, _text(ESCAPE + "0"), _text("\x01\x01"))
    return func.replace(key, _text(ESCAPE + "1"), _text(ESCAPE)).collate("C")


def _stored_text(key: Any) -> Any:
    """The stored (escaped) text whose :func:`_code_point_key` is ``key``."""
    text = func.replace(key, _text(ESCAPE), _text(ESCAPE + "1"))
    text = func.replace(text, _text("\x01\x01"), _text(ESCAPE + "0"))
    return func.replace(text, _text("\x01\x02"), _text("\x01"))


def _arguments(statement: Select[Any], i: int) -> list[Any]:
    """The arguments of the aggregate that is the statement's column ``i``."""
    function = aggregate_of(statement.selected_columns[i])
    assert function is not None  # the plan combines column i as a min or max
    return list(function.clauses)


def _is_text(terms: list[Any]) -> bool:
    return len(terms) == 1 and compares_as_text(terms[0])


def _each_schema(server: Server, schemas: Sequence[str], plan: Plan) -> AcrossRows:
    with server.connection() as conn, _statement_errors(), ExitStack() as sessions:
        readers = [partial(_read_schema, sessions.enter_context(Session(bind=conn)), schema) for schema in schemas]
        types = _server_types(conn, schemas[0], plan) if schemas and plan.computed else {}
        evaluator = Evaluator(lambda statement: conn.execute(statement).all(), partial(_bound, types))
        yield from read_each(readers, plan, nulls_smallest=False, evaluator=evaluator)


# The types PostgreSQL gives an aggregate of numbers (pg_typeof), as SQLAlchemy names them.
_NUMBER_TYPES: dict[str, Any] = {"smallint": SmallInteger(), "integer": Integer(), "bigint": BigInteger(),
                                 "numeric": Numeric(), "real": REAL(), "double precision": Double()}  # fmt: skip


def _server_types(conn: Any, schema: str, plan: Plan) -> dict[int, Any]:
    """The type PostgreSQL gives each aggregate of a computed column (by ``id`` of the part), asked of one
    schema (every schema has the same tables): what one table's arithmetic would have computed with.

    SQLAlchemy's type of an aggregate is what the statement says, which ``type_coerce`` may have changed
    (``type_coerce(length(x), Float)``: integers on the server, whose ``%`` and ``*`` are the integers').
    """
    parts = [part for computed in plan.computed if computed is not None for part in computed.parts]
    if not parts:  # only constants (select(literal(2), count())): nothing to ask
        return {}
    probe = (
        plan.per_database()
        .group_by(None)
        .with_only_columns(*(cast(func.pg_typeof(part), Text) for part in parts), maintain_column_froms=True)
        .where(false())  # no row read; an aggregate without group_by still gives its one row
    )
    names = conn.execute(probe, execution_options={"schema_translate_map": {None: schema}}).one()
    types = {}
    for part, name in zip(parts, names, strict=True):
        if name not in _NUMBER_TYPES:
            raise StatementError(
                f"{part}: its values are {name} on the server, not numbers; arithmetic over aggregates across "
                "databases takes aggregates of whole numbers and floats"
            )
        types[id(part)] = _NUMBER_TYPES[name]
    return types


def _bound(types: dict[int, Any], part: ColumnElement[Any], value: Any) -> ColumnElement[Any]:
    """A combined aggregate's value as PostgreSQL types that aggregate (``types``: :func:`_server_types`; over
    no schema, as it types the aggregate SQLAlchemy sees: ``count`` a bigint, ``sum`` of integers a bigint, of
    bigints a numeric, ``sum`` of floats, ``min`` and ``max`` their argument's type). SQLAlchemy still sees the
    aggregate's own type, so the expression compiles as the statement's does (its ``/`` and ``//``); the server
    then computes with the values it would have had.
    """
    server_type = types.get(id(part))
    if server_type is None:
        function = aggregate_of(part)
        assert function is not None
        arguments = list(function.clauses)
        server_type = arguments[0].type if arguments else BigInteger()
        if function.name.lower() == "count":
            server_type = BigInteger()
        elif function.name.lower() == "sum" and isinstance(server_type, Integer):
            server_type = Numeric() if isinstance(server_type, BigInteger) else BigInteger()
    return type_coerce(cast(literal(value, server_type), server_type), part.type)


def _read_schema(session: Session, schema: str, statement: Select[Any], batch: int) -> Iterator[Row[Any]]:
    options = {"yield_per": batch, "schema_translate_map": {None: schema}}
    yield from session.execute(statement, execution_options=options)


def _builder(entity: type[Base], columns: list[str]) -> Any:
    """Build detached ``entity`` objects from rows of its table's columns (in ``columns`` order)."""
    mapper = inspect(entity)
    positions = [(prop.key, columns.index(prop.columns[0].name)) for prop in mapper.column_attrs]

    def build(row: Row[Any]) -> Base:
        instance = mapper.class_manager.new_instance()
        for key, position in positions:
            set_committed_value(instance, key, row[position])
        make_transient_to_detached(instance)
        return instance  # type: ignore[no-any-return]

    return build
