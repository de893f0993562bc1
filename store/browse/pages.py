"""What each page of the browser shows: plain frozen values for the templates, built by :mod:`store.browse.browser`.

Contract: a page's values hold no ORM object or connection, only records,
locations and numbers; a database is named by its folder in the layout
(:func:`database_name`), the same for a folder and a server store.
:class:`NotFoundError` is a page that names what does not exist (a 404).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from store.browse.queries import Key, Listed, Order, RunLine
from store.browse.render import Turn
from store.browse.verdicts import JudgeFigures, Preference, Slot
from store.errors import JudgestoreError
from store.layout import Location, Selector
from store.logprobs import PositionLogprobs
from store.tables.filters import RowFilter
from store.tables.records import AdoptionRecord, Record, RunTotals


def database_name(location: Location) -> str:
    """How the browser names a database: its folder in the layout (the same on a server)."""
    return location.relative_folder().as_posix()


class NotFoundError(JudgestoreError):
    """What a page asked for is not in the store."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """A database a page could not read, and why."""

    name: str
    error: str


@dataclass(frozen=True, slots=True)
class DatabaseSummary:
    name: str
    location: Location
    state: str
    rows: int | None
    size_bytes: int
    finish_reasons: dict[str, int] | None  # None: not counted (a large table; the overview links to the count)
    runs: RunTotals | None
    error: str | None


@dataclass(frozen=True, slots=True)
class RowsQuery:
    """A rows page: which databases, which rows, in which order, from where."""

    selector: Selector = field(default_factory=Selector)
    flt: RowFilter = field(default_factory=RowFilter)
    database: str | None = None
    search: str | None = None
    order: Order = "newest"
    after: Key | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class RowsPage:
    rows: list[Listed]
    next: Key | None  # the cursor of the next page, None on the last one
    scanned_to: Key | None  # set when the page ends where a scan window did (fewer rows than a page)
    databases: int
    skipped: list[Skipped]


@dataclass(frozen=True, slots=True)
class Answer:
    """One model's answers to an instruction, turn by turn (``row``: the completion row of its last turn)."""

    model: str
    turns: list[str]
    row: tuple[str, str] | None  # (database, input hash)
    finish_reason: str | None
    inputs: list[Turn] = field(default_factory=list)  # the messages of its last turn's input
    elsewhere: int = 0  # other databases (other settings) holding an answer of the model to this instruction
    judged: bool = False  # a judgement of the model quotes this answer


@dataclass(frozen=True, slots=True)
class Round:
    """One turn of the conversation: what was asked, and each model's answer (None: none stored)."""

    asked: list[Turn]
    answers: list[str | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement of the pair (``first``, ``second``), mapped back from slots to models."""

    row: tuple[str, str]
    judge: str | None
    orientation: str | None
    model_a: str | None
    model_b: str | None
    text: str
    slot: Slot | None
    favoured: str | None  # the model in the favoured slot
    preference: Preference | None  # None: the verdict was read from the text, or none was found
    p_first: float | None  # P(first model's slot) at the verdict token
    p_second: float | None
    share_first: float | None  # P(first) / (P(first) + P(second)): where the bar splits
    sample_index: int
    logprobs_error: str | None = None  # why the stored top_logprobs could not be read (the verdict is the text's)


@dataclass(frozen=True, slots=True)
class JudgeVerdicts:
    """One judge's verdicts of a pair, in both orientations; ``disagree`` when they favour different models.

    ``judge`` is None for verdicts recorded without a judge's name (shown as such, with no judge page to link).
    """

    judge: str | None
    direct: list[Verdict]
    reversed: list[Verdict]
    other: list[Verdict]

    @property
    def disagree(self) -> bool:
        firsts = self._first_verdicts()
        return len(firsts) == 2 and firsts[0] != firsts[1]

    @property
    def agree(self) -> bool:
        """Both orientations' first verdicts were found and favour the same model (no verdict agrees with nothing)."""
        firsts = self._first_verdicts()
        return len(firsts) == 2 and firsts[0] == firsts[1]

    def _first_verdicts(self) -> list[str]:
        return [v.favoured for v in (self.direct[:1] + self.reversed[:1]) if v.favoured is not None]


@dataclass(frozen=True, slots=True)
class Battle:
    benchmark: str | None
    instruction_id: str
    models: list[str]  # the pair judged (first, second), or the models that answered
    pairs: list[tuple[str, str]]  # every pair judged on this instruction
    system: list[Turn]
    rounds: list[Round]
    answers: list[Answer]
    judges: list[JudgeVerdicts]
    pointwise: list[Verdict]
    skipped: list[Skipped]


@dataclass(frozen=True, slots=True)
class JudgeList:
    """Every judge with its rows in the store, and the databases that could not be read."""

    totals: dict[str, int]
    skipped: list[Skipped]


@dataclass(frozen=True, slots=True)
class JudgeView:
    judge: str
    figures: JudgeFigures
    read: int  # rows read (the newest JUDGE_ROWS at most)
    total: int  # rows of this judge in the store (0: none in the databases read, and some were skipped)
    skipped: list[Skipped]


@dataclass(frozen=True, slots=True)
class RowView:
    name: str
    location: Location
    record: Record
    turns: list[Turn]
    positions: list[PositionLogprobs]
    metadata_json: str
    wrote: list[RunLine]
    hit: list[RunLine]
    adopted_from: tuple[str | None, AdoptionRecord | None] | None  # (the source database's name, its record)
    verdict: Verdict | None
    logprobs_error: str | None = None  # why the stored top_logprobs could not be read (no positions shown)
