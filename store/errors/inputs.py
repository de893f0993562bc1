"""Bad input: a value, a message, a filter or a statement judgestore cannot use as given.

Contract: :class:`InvalidInputError` (also a ``ValueError``) is the base of
every refusal of what a caller passed; other families derive from it where
their error is one (a value the server refuses, a legacy descriptor the live
rules cannot reproduce, a model that does not exist, a request the engine
refuses). Nothing is changed by a call refused with one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from store.errors.base import JudgestoreError

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "EmptyFilterError",
    "FilterValueError",
    "InvalidInputError",
    "NotCombinableError",
    "ReadTransactionWriteError",
    "RowValueError",
    "RunValueError",
    "StatementError",
    "UnsupportedMessageError",
    "invalid_values",
]


def invalid_values(error: ValidationError) -> str:
    """A pydantic error as one line: each wrong value's place, what was wrong and the value given
    (``temperature: Input should be a valid number ... (got 'abc')``), never pydantic's own several lines and
    link."""
    parts = []
    for err in error.errors():
        place = ".".join(map(str, err["loc"]))
        given = err.get("input")
        got = f" (got {given!r})" if isinstance(given, str | int | float) and not isinstance(given, bool) else ""
        parts.append(f"{place + ': ' if place else ''}{err['msg']}{got}")
    return "; ".join(parts)


class InvalidInputError(JudgestoreError, ValueError):
    """A value given to judgestore cannot be used (bad message, bad segment...)."""


class FilterValueError(InvalidInputError):
    """A row filter's value no row can hold; ``field`` names the filter (the command line names its option)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class RowValueError(InvalidInputError):
    """A row holds a value a store would refuse or change. ``column`` names it, and ``rule`` says what the value
    breaks without the value itself (the same words for every row that breaks it: a report groups them)."""

    def __init__(self, message: str, *, column: str, rule: str) -> None:
        self.column, self.rule = column, rule
        super().__init__(message)


class RunValueError(InvalidInputError):
    """A run's count past what the ``runs`` table's 64-bit integers hold (a row's usage of 2^63 tokens)."""


class UnsupportedMessageError(InvalidInputError):
    """A chat message judgestore cannot key as it stands: a tool message, a tool call, a name, content blocks."""


class EmptyFilterError(JudgestoreError, ValueError):
    """A delete without any filter: it would empty the table, so it is refused."""

    REFUSAL = "refusing to delete with an empty filter (it would delete every row)"  # the CLI names its options

    def __init__(self) -> None:
        super().__init__(f"{self.REFUSAL}; set at least one field of the RowFilter")


class StatementError(InvalidInputError):
    """A SQLAlchemy statement that ``Store.scalars``/``Store.execute`` cannot run across databases as asked."""


class ReadTransactionWriteError(InvalidInputError):
    """A write inside a read transaction (``Database.reading()``, ``Database.session()``): refused on both
    backends, and nothing of it is kept."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"{where}: a read transaction takes no writes (nothing of it was kept); write with put_many or delete, "
            "or in Database.session(write=True)"
        )


class NotCombinableError(StatementError):
    """A statement whose result across databases cannot be combined exactly from each database's own result."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} cannot be combined exactly across databases (only count, sum, min and max, FILTER or not, "
            "grouped or not, and arithmetic over them, can). Read the rows instead: `judgestore export` or "
            "store.export.to_pandas, then aggregate there"
        )
