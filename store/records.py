"""Records: the plain values that cross module boundaries instead of ORM objects.

Contract: a record's fields are exactly its table's columns (same names, same
types, ``top_logprobs`` and ``usage`` decoded), so a record can be written
and read back unchanged. :class:`RowFilter` is the one way to select rows by
their typed metadata columns, for queries and targeted deletes alike; filters
that exist only on judgements (:data:`JUDGEMENT_ONLY_FILTERS`) restrict a
query to judgement databases (:func:`roles_for`), and combined with
``role="completions"`` they are an error. What went wrong is selectable
too: rows by finish reason (``"length"``: truncated at ``max_tokens``),
empty completions, and error rows (:data:`ERROR_FINISH_REASONS`). So are
adopted rows (``judgestore adopt``): all of them, or those of one source
descriptor (a prefix of its hash). :class:`FoundRow` and
:class:`RowCount` are a row, or a count of rows, with the location of the
database it came from, as the store's queries across databases return them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from store.errors import InvalidInputError
from store.layout import ROLES, Location, Role

Orientation = Literal["direct", "reversed"]  # relative to the source pair (see store.models.Judgement)
ORIENTATIONS: tuple[Orientation, ...] = get_args(Orientation)
JUDGEMENT_ONLY_FILTERS = ("model_a", "model_b", "judge", "orientation", "pair", "pointwise")
# Finish reasons that mean the engine or API did not produce a real answer (vLLM: abort; hosted APIs: error,
# content_filter). "stop" and "length" are answers; "length" is selected on its own as truncation.
ERROR_FINISH_REASONS = ("error", "abort", "content_filter")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRecord:
    """One row of ``completions``."""

    input_hash: str
    sample_index: int = 0
    input_text: str
    completion: str
    benchmark: str | None = None
    instruction_id: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    top_logprobs: dict[str, Any] | None = None
    run_id: str | None = None
    created_by: str | None = None
    created_at: datetime
    adopted_from: str | None = None  # the source descriptor's SHA-256 of an adopted row


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgementRecord:
    """One row of ``judgements``; ``model_b`` is None for a pointwise judgement.

    ``model_a``/``model_b`` are the positional slots of the judge prompt (see
    :class:`store.models.Judgement`).
    """

    input_hash: str
    sample_index: int = 0
    input_text: str
    completion: str
    benchmark: str | None = None
    instruction_id: str | None = None
    model_a: str | None = None
    model_b: str | None = None
    judge: str | None = None
    orientation: Orientation | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    top_logprobs: dict[str, Any] | None = None
    run_id: str | None = None
    created_by: str | None = None
    created_at: datetime
    adopted_from: str | None = None  # the source descriptor's SHA-256 of an adopted row


def _init_through_slots(cls: type[Any]) -> None:
    """Give a frozen slots dataclass an ``__init__`` that stores each field straight into its slot.

    Same signature, same instances: the one :mod:`dataclasses` generates gets
    past ``frozen`` with ``object.__setattr__`` per field, this one calls each
    slot's descriptor, which is what that ends in (1.1 us per record instead
    of 1.8; a batch builds thousands).
    """
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not dataclasses.MISSING or not f.kw_only or not f.init for f in fields):
        raise AssertionError(f"{cls.__name__}: only keyword fields with plain defaults are built this way")
    namespace: dict[str, Any] = {}
    parameters = []
    for f in fields:
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        if f.default is dataclasses.MISSING:
            parameters.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            parameters.append(f"{f.name}=_default_{f.name}")
    source = f"def __init__(self, *, {', '.join(parameters)}) -> None:\n" + "".join(
        f"    _set_{f.name}(self, {f.name})\n" for f in fields
    )
    exec(source, namespace)  # the source: this class's own field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = cls.__init__.__annotations__
    cls.__init__ = init


_init_through_slots(CompletionRecord)
_init_through_slots(JudgementRecord)

Record = CompletionRecord | JudgementRecord
RECORD_OF_ROLE: dict[str, type[CompletionRecord] | type[JudgementRecord]] = {
    "completions": CompletionRecord,
    "judgements": JudgementRecord,
}


def record_fields(record_type: type[Record]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(record_type))


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
        if self.adopted_from is not None and not (
            0 < len(self.adopted_from) <= 64 and all(c in "0123456789abcdef" for c in self.adopted_from)
        ):
            raise InvalidInputError(
                f"adopted_from must be a descriptor hash or a prefix of it, got {self.adopted_from!r}"
            )

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in dataclasses.fields(self))

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, for messages and ``--json`` output."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True, slots=True)
class RowTotals:
    """Rows of one table added up: how many, their data bytes, and the token counts and engine time in ``usage``.

    ``data_bytes`` is what the row's values take (rendered input, completion,
    ``usage`` and ``top_logprobs`` as stored), without the index and page
    overhead of the file. ``rows_with_cost`` counts rows whose ``usage``
    records ``engine_seconds``.
    """

    rows: int = 0
    data_bytes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0
    rows_with_cost: int = 0

    def __add__(self, other: RowTotals) -> RowTotals:
        return RowTotals(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class RowGroup:
    """The rows sharing one value of a column: how many, their data bytes, and when the newest was written."""

    key: Any
    rows: int
    data_bytes: int
    newest: datetime


def roles_for(flt: RowFilter, role: Role | None = None) -> tuple[Role, ...]:
    """The roles whose tables have every column ``flt`` names (see the module docstring)."""
    judgement_only = [name for name in JUDGEMENT_ONLY_FILTERS if getattr(flt, name) is not None]
    if not judgement_only:
        return (role,) if role is not None else ROLES
    if role == "completions":
        raise InvalidInputError(f"filters on {', '.join(judgement_only)} apply to judgements only, not completions")
    return ("judgements",)


def parse_timestamp(value: str) -> datetime:
    """An ISO-8601 date or date-time; a value without a UTC offset is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as e:
        raise InvalidInputError(
            f"{value!r} is not an ISO-8601 date or date-time (e.g. 2026-01-31 or 2026-01-31T12:00:00+02:00)"
        ) from e
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


# ---------------------------------------------------------------- rows across databases

LOCATION_COLUMNS = ("role", "task", "provider", "descriptor_model", "descriptor")


def row_columns(roles: Iterable[Role] = ROLES) -> tuple[str, ...]:
    """Column names of :meth:`FoundRow.as_dict` for rows of ``roles``: location first, then the record's fields."""
    chosen = set(roles)
    columns: list[str] = list(LOCATION_COLUMNS)
    for role in ROLES:
        if role in chosen:
            columns += [name for name in record_fields(RECORD_OF_ROLE[role]) if name not in columns]
    return tuple(columns)


@dataclass(frozen=True, slots=True)
class FoundRow:
    """A row and the database it came from."""

    location: Location
    record: Record

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = self.location.as_dict(model_key="descriptor_model")
        for name in record_fields(type(self.record)):
            values[name] = getattr(self.record, name)
        return values


@dataclass(frozen=True, slots=True)
class RowCount:
    """How many rows of one database a filter matched (or deleted)."""

    location: Location
    where: str  # the database, as messages name it (a file, or a server's schema)
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {**self.location.as_dict(), "path": self.where, "rows": self.rows}


def batched(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    """``records`` in lists of ``size`` (the last one shorter), read lazily: one list is held at a time."""
    batch: list[Record] = []
    for record in records:
        batch.append(record)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
