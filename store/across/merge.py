"""Combining each database's answer to one statement into the answer of one table holding every row.

Contract:

* :func:`read_each` asks every database (a :data:`Reader` each, which a
  backend supplies) for :meth:`~store.across.plan.Plan.per_database` and
  yields ``(database index, values)`` in the global order: a k-way merge
  (:func:`heapq.merge`) of the per-database ordered streams, each read
  ``batch_size`` rows at a time, so memory holds a few batches whatever the
  row count; ``offset`` rows are skipped and ``limit`` kept after the merge.
  Without ``order_by`` the databases follow each other in the order given.
* Aggregates (``count``, ``sum``, ``min``, ``max``, each with a ``FILTER`` or
  not, and ``group_by``) are combined per group (the index is None): counts and sums add up, NULLs are
  ignored as SQL does, and a statement without ``group_by`` gives one row
  even over no database (``count`` 0, the rest NULL), as on an empty table.
  A column of arithmetic over aggregates (:class:`~store.across.plan.Computed`)
  is then computed by the backend (an :class:`Evaluator`: SQLite in memory,
  PostgreSQL on the connection that read the schemas) from its aggregates'
  combined values, a hundred groups per statement (a ``UNION ALL`` of one
  ``SELECT`` per group), never one round trip per group.
  A ``group_by`` of terms that are not selected is read from one database
  only (:meth:`~store.across.plan.Plan.check_databases`): its rows are its
  groups, kept as they come.
  Groups are then ordered, offset and limited as the statement says.
* NULLs order where the backend puts them (``nulls_smallest``: SQLite's
  NULLs come first ascending, PostgreSQL's last) unless ``nulls_first()`` /
  ``nulls_last()`` say otherwise. JSON values are refused by the plan; any
  other values that Python cannot compare are a typed error too.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CompoundSelect, Integer, Row, Select, literal, select, type_coerce, union_all
from sqlalchemy.sql import ColumnElement, visitors
from sqlalchemy.sql.elements import Grouping
from sqlalchemy.sql.sqltypes import NullType

from store.across.plan import AcrossRows, Computed, Kind, OrderKey, Plan
from store.errors import StatementError

Reader = Callable[[Select[Any], int], Iterable[Row[Any]]]  # (statement, rows per batch) -> one database's rows
# Groups computed by one statement: SQLite allows 500 selects in a UNION ALL and 32,766 bound values.
GROUPS_PER_STATEMENT = 100
ROW_KEY = "_judgestore_group"


def bound(part: ColumnElement[Any], value: Any) -> ColumnElement[Any]:
    """A combined aggregate's value as a parameter that keeps its own type (SQLite's: an int stays an int), in an
    expression of the aggregate's type, so that the statement compiles as its own does (its ``/``).

    Bound as the aggregate's type, the value would be converted as that type binds (``type_coerce(x, Float)``
    of whole numbers: an int made a float, so ``max(x) * 2`` a float where one table gives an int). The
    grouping keeps ``type_coerce`` from retyping the parameter itself.
    """
    return type_coerce(Grouping(literal(value, NullType())), part.type)


@dataclass(frozen=True, slots=True)
class Evaluator:
    """How a backend computes the columns of arithmetic over aggregates (:class:`~store.across.plan.Computed`).

    ``run`` executes one statement that reads no table on a connection of the backend (its SQL, its
    arithmetic); ``bind`` is a combined aggregate's value as that backend types the aggregate.
    """

    run: Callable[[Select[Any] | CompoundSelect], Iterable[Row[Any]]]
    bind: Callable[[ColumnElement[Any], Any], ColumnElement[Any]] = bound


ROWS_IN_MEMORY = 5_000  # rows buffered across every database's batch at once (a row may be ~10 KB)
MIN_BATCH = 50


def batch_size(plan: Plan, databases: int) -> int:
    """Rows each database reads at a time: the merge holds one batch of each."""
    size = max(MIN_BATCH, ROWS_IN_MEMORY // max(databases, 1))
    return size if plan.limit is None else max(1, min(size, plan.limit + plan.offset))


class _Descending:
    """An ordering value whose order is reversed (``order_by(x.desc())`` next to ascending terms)."""

    __slots__ = ("item",)

    def __init__(self, item: tuple[Any, ...]) -> None:
        self.item = item

    def __lt__(self, other: _Descending) -> bool:
        return other.item < self.item

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.item == other.item

    __hash__ = None  # type: ignore[assignment]


def sort_key(order: Sequence[OrderKey], *, nulls_smallest: bool) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A key over the ordering's values that sorts ascending as the statement's ORDER BY does."""
    # NULL ranks below every value (0) or above (2); a descending term is then reversed as a whole.
    null_rank = []
    for key in order:
        nulls_first = key.nulls_first if key.nulls_first is not None else nulls_smallest != key.descending
        null_rank.append(0 if nulls_first != key.descending else 2)
    terms = list(zip(null_rank, (key.descending for key in order), strict=True))

    def key_of(values: Sequence[Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for (rank, descending), value in zip(terms, values, strict=True):
            item = (rank,) if value is None else (1, value)
            parts.append(_Descending(item) if descending else item)
        return tuple(parts)

    return key_of


def read_each(
    readers: Sequence[Reader], plan: Plan, *, nulls_smallest: bool, evaluator: Evaluator | None = None
) -> AcrossRows:
    """The statement's rows over every database, as on one table (see the module docstring).

    ``evaluator`` computes the columns of arithmetic over aggregates; a plan with such columns needs one.
    """
    plan.check_databases(len(readers))
    if plan.kind is Kind.AGGREGATE:
        rows = _aggregated(readers, plan, nulls_smallest=nulls_smallest, evaluator=evaluator)
        yield from ((None, row) for row in rows)
        return
    statement, size, width = plan.per_database(), batch_size(plan, len(readers)), plan.width

    def stream(index: int, reader: Reader) -> Iterator[tuple[int, tuple[Any, ...]]]:
        for row in reader(statement, size):
            yield index, tuple(row)

    streams = [stream(i, reader) for i, reader in enumerate(readers)]
    if plan.order:
        key_of = sort_key(plan.order, nulls_smallest=nulls_smallest)
        merged: Iterator[tuple[int, tuple[Any, ...]]] = heapq.merge(*streams, key=lambda item: key_of(item[1][width:]))
    else:
        merged = itertools.chain.from_iterable(streams)
    stop = None if plan.limit is None else plan.offset + plan.limit
    try:
        for index, values in itertools.islice(merged, plan.offset, stop):
            yield index, values[:width]
    except TypeError as e:  # two ordering values Python cannot compare
        raise StatementError(f"order_by {_terms(plan)}: values of different databases cannot be compared ({e})") from e


def _terms(plan: Plan) -> str:
    return ", ".join(str(key.expression) for key in plan.order)


def _aggregated(
    readers: Sequence[Reader], plan: Plan, *, nulls_smallest: bool, evaluator: Evaluator | None
) -> list[tuple[Any, ...]]:
    statement, asked = plan.per_database(), plan.asked
    groups_at = [i for i, how in enumerate(asked) if how == "group"]
    combined: dict[tuple[Any, ...], list[Any]] = {}
    for reader in readers:
        for row in reader(statement, batch_size(plan, len(readers))):
            values = tuple(row)
            if plan.ungrouped:  # one database (Plan.check_databases): each row is a group of its own
                combined[(len(combined),)] = list(values)
                continue
            group = tuple(values[i] for i in groups_at)
            found = combined.get(group)
            if found is None:
                combined[group] = list(values)
                continue
            for i, how in enumerate(asked):
                found[i] = _combined(how, found[i], values[i])
    if not combined and not plan.statement._group_by_clauses:  # no group_by: one row, as an empty table gives
        combined[()] = [0 if how == "count" else None for how in asked]
    rows = [tuple(values) for values in combined.values()]
    if plan.computed:
        assert evaluator is not None, "a backend reading a computed column gives an evaluator"
        rows = _computed(plan, rows, evaluator)
    if plan.order:
        key_of = sort_key(plan.order, nulls_smallest=nulls_smallest)
        try:
            rows.sort(key=lambda row: key_of([row[i] for i in plan.order_columns]))
        except TypeError as e:
            raise StatementError(f"order_by {_terms(plan)}: the values cannot be compared ({e})") from e
    stop = None if plan.limit is None else plan.offset + plan.limit
    return rows[plan.offset : stop]


def _combined(how: str, a: Any, b: Any) -> Any:
    if how == "group":
        return a
    if a is None:
        return b
    if b is None:
        return a
    if how in ("count", "sum"):
        return a + b
    return min(a, b) if how == "min" else max(a, b)


def _computed(plan: Plan, rows: list[tuple[Any, ...]], evaluator: Evaluator) -> list[tuple[Any, ...]]:
    """``rows`` of combined parts (:attr:`Plan.asked`) as the statement's columns: each computed column computed
    by the backend from its parts, every group in one statement (a few hundred groups in each).

    The expression is the statement's own, its aggregates replaced by their combined values bound as the
    backend types those aggregates, so the backend's arithmetic (integer division, NULLs, a division by zero)
    is what one table would give.
    """
    spans: list[tuple[int, int]] = []  # per result column: its values in a row of parts
    at = 0
    for computed in plan.computed:
        width = 1 if computed is None else len(computed.parts)
        spans.append((at, at + width))
        at += width
    computed_at = [i for i, computed in enumerate(plan.computed) if computed is not None]
    results: dict[int, tuple[Any, ...]] = {}
    for start in range(0, len(rows), GROUPS_PER_STATEMENT):
        selects = []
        for k in range(start, min(start + GROUPS_PER_STATEMENT, len(rows))):
            columns = [_bound_expression(plan.computed[i], rows[k][slice(*spans[i])], evaluator) for i in computed_at]
            selects.append(
                select(literal(k, Integer).label(ROW_KEY), *(c.label(f"c{i}") for i, c in enumerate(columns)))
            )
        statement = selects[0] if len(selects) == 1 else union_all(*selects)
        for found in evaluator.run(statement):
            results[found[0]] = tuple(found[1:])
    answer = []
    for k, row in enumerate(rows):
        values = [row[start] if start < end else None for start, end in spans]  # (a constant has no parts)
        for i, value in zip(computed_at, results[k], strict=True):
            values[i] = value
        answer.append(tuple(values))
    return answer


def _bound_expression(computed: Computed | None, values: Sequence[Any], evaluator: Evaluator) -> ColumnElement[Any]:
    """``computed``'s expression, each of its aggregates replaced by that aggregate's combined value, bound."""
    assert computed is not None
    bound_parts = {id(part): evaluator.bind(part, value) for part, value in zip(computed.parts, values, strict=True)}

    def replace(element: Any, **kw: Any) -> ColumnElement[Any] | None:
        return bound_parts.get(id(element))

    return visitors.replacement_traverse(computed.expression, {}, replace)
