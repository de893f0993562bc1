"""Row filters: the one way to pick rows by their typed columns, for queries and targeted deletes alike.

Contract: :class:`RowFilter` selects rows whose typed metadata columns equal
every field that is set (AND of the set fields), plus what went wrong
(truncated rows, empty completions, error rows: :data:`ERROR_FINISH_REASONS`)
and adopted rows (``judgestore adopt``). Filters that exist only on
judgements (:data:`JUDGEMENT_ONLY_FILTERS`) restrict a query to judgement
databases (:func:`roles_for`), and combined with ``role="completions"`` they
are an error. It is the vocabulary of the command line's row options, not a
copy of a table: ``pair``, ``pointwise``, ``empty`` and the date range are
not columns. Repositories turn it into SQL (:meth:`store.repository.Repository.clauses`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from store.errors import FilterValueError, InvalidInputError
from store.roles import ROLES, Role
from store.tables.models import ORIENTATIONS, Orientation

JUDGEMENT_ONLY_FILTERS = ("model_a", "model_b", "judge", "orientation", "pair", "pointwise")


# Finish reasons that mean the engine or API did not produce a real answer (vLLM: abort; hosted APIs: error,
# content_filter). "stop" and "length" are answers; "length" is selected on its own as truncation.
ERROR_FINISH_REASONS = ("error", "abort", "content_filter")


TEXT_FILTERS = ("benchmark", "instruction_id", "model", "model_a", "model_b", "judge", "run_id", "created_by")


@dataclass(frozen=True, slots=True, kw_only=True)
class RowFilter:
    """Rows whose typed columns equal every field that is set (AND of the set fields).

    ``model`` selects completions of that model, and judgements where the
    model is ``model_a`` or ``model_b``. ``pair=(X, Y)`` selects the
    judgements of that pair in both orientations (slots ``(X, Y)`` or
    ``(Y, X)``). ``created_after`` is inclusive,
    ``created_before`` exclusive. ``pointwise=True`` keeps judgements whose
    ``model_b`` is NULL, ``False`` the pairwise ones. ``finish_reasons``
    keeps rows whose finish reason is any of them; ``empty=True`` rows whose
    completion is empty or only whitespace (``False``: the others);
    ``error=True`` rows whose finish reason is one of
    :data:`ERROR_FINISH_REASONS` (``False``: the others, NULL included).
    ``adopted_from`` keeps rows adopted from the descriptor whose hash starts
    with it; ``adopted=True`` every adopted row (``False``: the others).
    """

    benchmark: str | None = None
    instruction_id: str | None = None
    model: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    judge: str | None = None
    orientation: Orientation | None = None
    pair: tuple[str, str] | None = None
    pointwise: bool | None = None
    run_id: str | None = None
    created_by: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    input_hashes: tuple[str, ...] | None = field(default=None)
    finish_reasons: tuple[str, ...] | None = None
    empty: bool | None = None
    error: bool | None = None
    adopted_from: str | None = None
    adopted: bool | None = None

    def __post_init__(self) -> None:
        for name in TEXT_FILTERS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(f"{name} filters on one text value, got {value!r}")
        for name in ("created_after", "created_before"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidInputError(f"{name} must be timezone-aware (e.g. 2026-01-01T00:00:00+00:00)")
        if self.pair is not None and (len(self.pair) != 2 or not all(isinstance(m, str) for m in self.pair)):
            raise InvalidInputError(f"pair must be two model names, got {self.pair!r}")
        if self.orientation is not None and self.orientation not in ORIENTATIONS:
            raise InvalidInputError(f"orientation must be 'direct' or 'reversed', got {self.orientation!r}")
        if self.finish_reasons is not None and (
            isinstance(self.finish_reasons, str) or not all(isinstance(r, str) for r in self.finish_reasons)
        ):
            raise InvalidInputError(f"finish_reasons must be a tuple of strings, got {self.finish_reasons!r}")
        texts = [(name, getattr(self, name)) for name in TEXT_FILTERS]
        texts += [
            (name, value) for name in ("pair", "finish_reasons", "input_hashes") for value in getattr(self, name) or ()
        ]
        for name, value in texts:
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError as e:  # e.g. a command line's bytes that are not UTF-8
                    raise FilterValueError(name, f"{name} is not valid Unicode text: {value!r}") from e
        for key in self.input_hashes or ():
            if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
                raise FilterValueError(
                    "input_hashes",
                    f"an input hash is a whole hash (64 hex digits), got {key!r}; `judgestore query --json "
                    "--columns input_hash` prints them whole",
                )
        if self.adopted_from is not None and not (
            0 < len(self.adopted_from) <= 64 and all(c in "0123456789abcdef" for c in self.adopted_from)
        ):
            raise FilterValueError(
                "adopted_from",
                f"adopted_from must be a descriptor hash or a prefix of it, got {self.adopted_from!r}",
            )

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in dataclasses.fields(self))

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, for messages and ``--json`` output."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def roles_for(flt: RowFilter, role: Role | None = None) -> tuple[Role, ...]:
    """The roles whose tables have every column ``flt`` names (see the module docstring)."""
    judgement_only = [name for name in JUDGEMENT_ONLY_FILTERS if getattr(flt, name) is not None]
    if not judgement_only:
        return (role,) if role is not None else ROLES
    if role == "completions":
        named = [("pointwise/pairwise" if name == "pointwise" else name) for name in judgement_only]  # one switch
        raise InvalidInputError(f"filters on {', '.join(named)} apply to judgements only, not completions")
    return ("judgements",)


def parse_timestamp(value: str) -> datetime:
    """An ISO-8601 date or date-time; a value without a UTC offset is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as e:
        raise InvalidInputError(
            f"{value!r} is not an ISO-8601 date or date-time (e.g. 2026-01-31 or 2026-01-31T12:00:00+02:00)"
        ) from e
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
    try:
        parsed.astimezone(UTC)  # what the stores compare (an offset at the calendar's ends reaches beyond it)
    except OverflowError as e:
        raise InvalidInputError(f"{value!r} is outside the years 1 to 9999 in UTC") from e
    return parsed


# The columns whose distinct values say, per database, which text filters can match there (each indexed, so
# listing them reads an index, not the rows): what a store may keep to open only the databases a filter can match.
VALUE_COLUMNS: dict[Role, tuple[str, ...]] = {
    "completions": ("benchmark", "model", "run_id"),
    "judgements": ("benchmark", "model_a", "model_b", "judge", "run_id"),
}


DISTINCT_LIMIT = 1_000  # distinct values a column keeps in a catalog; beyond, it says nothing about a filter
ColumnValues = dict[str, list[str | None] | None]  # a table's VALUE_COLUMNS: each one's distinct values, or None
CATALOGUED_FILTERS = ("benchmark", "model", "model_a", "model_b", "judge", "pair", "run_id")  # what may_match reads


def may_match(role: Role, values: ColumnValues, flt: RowFilter) -> bool:
    """Whether a table of ``role`` whose :data:`VALUE_COLUMNS` hold ``values`` (each column's distinct values,
    or None where they are not known) can hold a row ``flt`` matches; True whenever that cannot be ruled out."""

    def absent(value: str, *columns: str) -> bool:
        known = [values.get(column) for column in columns]
        return all(k is not None for k in known) and not any(value in k for k in known if k is not None)

    if flt.benchmark is not None and absent(flt.benchmark, "benchmark"):
        return False
    if flt.run_id is not None and absent(flt.run_id, "run_id"):
        return False
    model_columns = ("model",) if role == "completions" else ("model_a", "model_b")
    if flt.model is not None and absent(flt.model, *model_columns):
        return False
    if role == "judgements":
        for name in ("model_a", "model_b", "judge"):
            value = getattr(flt, name)
            if value is not None and absent(value, name):
                return False
        if flt.pair is not None and any(absent(m, "model_a", "model_b") for m in flt.pair):
            return False
    return True
