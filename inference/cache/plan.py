"""What the cache boundary decides for a batch, and what failed.

Contract:

* :func:`batch_keys` renders and hashes a batch: each request's sample keys
  (sample ``k`` has its own key), and the distinct keys in first-seen order.
  :func:`plan_batch` turns them and the hits a lookup found into a
  :class:`Plan`; only the misses' inputs are rendered again (a hit never
  needs its rendered input).
* A :class:`Plan` counts a batch over its (request, sample) slots and its
  distinct keys: hits (adopted ones apart), misses, duplicates, and, when
  there are misses, whether they were expected (rows the descriptor's
  database holds, other descriptors of the model). Its ``missing`` inputs
  are what the engine will be asked for, in first-seen order.
* A :class:`Failure` is one input of a call that failed (refused by the
  engine or server, or its row by the store); never stored.
* :data:`Mode` names how a call uses the store (see :mod:`inference.cache.model`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from inference.requests import CompletionRequest, JudgementRequest, Request, request_named
from store.descriptor import InputMode, input_hash
from store.errors import InvalidInputError, JudgestoreError
from store.roles import Role
from store.tables.records import Record
from store.tables.row_checks import gc_paused

Mode = Literal["use", "refresh", "off", "replay", "readonly"]
MODES: tuple[Mode, ...] = get_args(Mode)
Slot = tuple[int, int]  # a distinct key's (sample index, index of the first request that asked for it)


@dataclass(frozen=True, slots=True)
class PlannedInput:
    """One distinct (rendered input, sample) a plan found missing: what the engine is asked for."""

    key: str
    rendered: bytes  # UTF-8 canonical JSON; decoded to text only for a row that is written
    sample_index: int
    request_index: int  # the first request that asked for it: its metadata labels the row


@dataclass(frozen=True)
class Plan:
    """What a batch needs: counted over (request, sample) slots and distinct keys."""

    role: Role
    requested: int  # (request, sample) slots
    distinct: int
    hits: int
    misses: int
    duplicates: int  # slots that share a key with an earlier slot
    mode: Mode
    missing: tuple[PlannedInput, ...] = field(default=(), repr=False)
    seconds: float = 0.0  # render + hash + lookup
    stored_rows: int | None = None  # with misses: rows the descriptor's database holds (None: no database)
    other_descriptors: int = 0  # with misses and no database: stored descriptors of this role, task and model
    adopted_hits: int = 0  # hits on rows adopted from an older descriptor (the others were generated or imported)

    def summary(self) -> str:
        adopted = f" ({self.adopted_hits} adopted)" if self.adopted_hits else ""
        return (
            f"{self.role}: {self.requested} requested, {self.distinct} distinct, "
            f"{self.hits} hits{adopted}, {self.misses} {'missing' if self.mode == 'replay' else 'to generate'}, "
            f"{self.duplicates} duplicates (mode {self.mode})"  # replay generates nothing: "2 to generate" (was)
        )

    @property
    def unexpected_misses(self) -> bool:
        """Misses although the store holds rows of this descriptor, or of another descriptor of this model."""
        return self.misses > 0 and bool(self.stored_rows or self.other_descriptors)

    def miss_note(self) -> str | None:
        """Why the misses are surprising, for a hint to run ``judgestore explain``; None when they are not."""
        if not self.unexpected_misses:
            return None
        if self.stored_rows:  # new inputs, a run that stopped early, or inputs that changed: explain tells which
            return f"{self.misses} misses although this descriptor's database holds {self.stored_rows} rows"
        others = "descriptor" if self.other_descriptors == 1 else "descriptors"
        verb = "is" if self.other_descriptors == 1 else "are"  # "1 other descriptor ... are" (was)
        return (
            f"{self.misses} misses: nothing is stored under this descriptor, but {self.other_descriptors} other "
            f"{others} of this model and task {verb}"
        )


@dataclass(frozen=True, slots=True)
class Failure:
    """One input of a call that failed: refused by the engine or server, or its row by the store. Never stored."""

    request_index: int  # the first request that asked for it
    request: str  # that request, named for people (benchmark/instruction, or the start of its prompt)
    sample_index: int
    input_hash: str
    error: JudgestoreError
    source: str | None = None  # where that request was read from (``prompts.jsonl:5``), if from a file

    @classmethod
    def of(cls, index: int, request: Request, inp: PlannedInput, error: JudgestoreError) -> Failure:
        """The failure of ``inp``, first asked for by ``request``, the ``index``-th of its call."""
        return cls(index, request.describe(), inp.sample_index, inp.key, error, request.source)

    @property
    def message(self) -> str:
        """The error's message on one line."""
        return " ".join(str(self.error).split())

    def line(self) -> str:
        """``prompts.jsonl:5 (bench/id), sample 1: Type: message`` (``request 3`` for a request not read from a
        file; a blank line or a pair's two orientations make a line number no index)."""
        where = request_named(self.source, self.request_index)
        sample = f", sample {self.sample_index}" if self.sample_index else ""
        return f"{where} ({self.request}){sample}: {type(self.error).__name__}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "request_index": self.request_index,
            "source": self.source,
            "request": self.request,
            "sample_index": self.sample_index,
            "input_hash": self.input_hash,
            "type": type(self.error).__name__,
            "error": self.message,
        }


def as_batch(requests: Iterable[Request]) -> Sequence[Request]:
    """``requests`` as the sequence a call reads twice (keys, then the misses): a generator becomes a list, and
    what is no iterable of requests is refused by name."""
    if isinstance(requests, Sequence) and not isinstance(requests, str | bytes):
        return requests
    if isinstance(requests, str | bytes | Mapping) or not isinstance(requests, Iterable):
        raise InvalidInputError(f"requests must be a list of requests, got {type(requests).__name__} {requests!r:.60}")
    return list(requests)


def batch_keys(
    role: Role, requests: Sequence[Request], input_mode: InputMode, *, sample_repeats: bool = False
) -> tuple[list[list[str]], dict[str, Slot]]:
    """Keys of each request's samples, and the distinct keys in first-seen order.

    Requests of one input share its keys (generated once), unless ``sample_repeats``: then each request of an
    input takes that input's next samples (the k-th request asking one sample gets sample k), so that repeats are
    answered as an engine without a cache answers them at a random sampling, each on its own.

    The rendered inputs are not kept: a hit never needs them, and holding a whole batch of
    them (a few KB each) costs more than rendering the misses again in :func:`plan_batch`.
    """
    expected = CompletionRequest if role == "completions" else JudgementRequest
    keys_per_request: list[list[str]] = []
    inputs: dict[str, Slot] = {}
    taken: dict[str, int] = {}  # with sample_repeats: an input's sample-0 key -> the samples its requests took
    with gc_paused():  # a batch's worth of small containers that outlive the loop: the GC would rescan them
        for i, request in enumerate(requests):
            if not isinstance(request, expected):
                raise InvalidInputError(  # named by index: it is no request, and has no line of its own
                    f"request {i} is a {type(request).__name__}; {role} take {expected.__name__}"
                )
            try:  # free in Python 3.11 when nothing is raised: this loop is the misses' hot path
                rendered = request.render_bytes(input_mode)
            except InvalidInputError as e:  # say which request: a batch holds thousands
                raise InvalidInputError(f"{request.named(i)}: {e}") from e
            first = 0
            if request.n == 1:  # the usual request: one sample, no list built to hold its keys
                key = input_hash(rendered)
                if sample_repeats:
                    first = taken.get(key, 0)
                    taken[key] = first + 1
                if first == 0:
                    keys_per_request.append([key])
                    if key not in inputs:
                        inputs[key] = (0, i)
                    continue
            elif sample_repeats:
                key = input_hash(rendered)
                first = taken.get(key, 0)
                taken[key] = first + request.n
            keys = [input_hash(rendered, k) for k in range(first, first + request.n)]
            keys_per_request.append(keys)
            for k, key in enumerate(keys, first):
                if key not in inputs:
                    inputs[key] = (k, i)
    return keys_per_request, inputs


def plan_batch(
    role: Role,
    mode: Mode,
    requests: Sequence[Request],
    keys: list[list[str]],
    inputs: dict[str, Slot],
    hits: Mapping[str, Record],
    input_mode: InputMode,
    seconds: float = 0.0,
) -> Plan:
    """The plan of a batch :func:`batch_keys` keyed, given the ``hits`` a lookup found (misses rendered again).

    ``seconds`` is what keying and looking up took.
    """
    requested = sum(map(len, keys))
    rendered: dict[int, bytes] = {}  # request index -> its rendered input, for the misses only
    missing = []
    for key, (k, i) in inputs.items():
        if key not in hits:
            if i not in rendered:
                rendered[i] = requests[i].render_bytes(input_mode)
            missing.append(PlannedInput(key, rendered[i], k, i))
    return Plan(
        role,
        requested,
        len(inputs),
        len(inputs) - len(missing),
        len(missing),
        requested - len(inputs),
        mode,
        tuple(missing),
        seconds,
        adopted_hits=sum(1 for record in hits.values() if record.adopted_from is not None),
    )
