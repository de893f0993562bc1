"""Auditing determinism: regenerate a random sample of stored rows with the current engine and compare.

Contract:

* :func:`sample_rows` picks up to ``n`` rows of a descriptor database at
  random (seeded, through the primary key: see
  :meth:`store.repository.Repository.sample`), optionally among the rows a
  :class:`~store.tables.filters.RowFilter` selects.
* :func:`regenerate` asks a model for those rows' inputs again **without
  the store** (a :class:`~inference.cache.model.CachedModel` in mode ``off``):
  nothing is read from or written to any database, and a row's sample ``k``
  is regenerated as sample ``k`` (its own seed). The model is whatever
  :meth:`~inference.spec.Spec.cached` gives (vLLM, or a hosted API),
  so the same audit checks a row against another engine or descriptor.
* :func:`compare` puts each stored row beside its regeneration: exact match
  (the same text and, where both are known, the same finish reason: a hit
  serves the stored one), the first differing character, finish reasons,
  and, when both carry top
  logprobs, the change of each first-token candidate's logprob (JudgeArena's
  ``{text: logprob}`` view, so ``"A"``/``"B"`` verdict tokens compare
  directly; a candidate that left or joined the top k moved at least as far
  as that edge: :func:`logprob_deltas`) and whether the most likely first
  token changed.
* :func:`audit_database` does all three and returns an :class:`AuditReport`
  (exact-match rate, mismatches, the largest logprob change). It writes
  nothing; the caller decides what to do with the report.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from inference.cache.model import CachedModel
from inference.requests import CompletionRequest, JudgementRequest, Response, Sample
from store import Database
from store.errors import InvalidInputError
from store.logprobs import text_logprobs
from store.tables.filters import RowFilter
from store.tables.records import JudgementRecord, Record

if TYPE_CHECKING:
    from inference.spec import Spec

EXCERPT = 40


@dataclass(frozen=True, slots=True)
class RowAudit:
    """One stored row beside its regeneration."""

    input_hash: str
    sample_index: int
    benchmark: str | None
    instruction_id: str | None
    exact: bool
    first_difference: int | None  # character index of the first difference (None: equal)
    stored: str  # excerpts around the first difference (whole texts when short)
    regenerated: str
    finish_reason_stored: str | None
    finish_reason_regenerated: str | None
    logprob_deltas: dict[str, float] = field(default_factory=dict)  # first token: regenerated - stored, per text
    top_token_stored: str | None = None
    top_token_regenerated: str | None = None

    @property
    def max_abs_delta(self) -> float | None:
        return max((abs(d) for d in self.logprob_deltas.values()), default=None)

    @property
    def top_token_changed(self) -> bool:
        return self.top_token_stored != self.top_token_regenerated

    @property
    def label(self) -> str:
        """The row as a report names it: its key's prefix, where it came from, its sample."""
        where = f"{self.benchmark or '?'}/{self.instruction_id or '?'}"
        return f"{self.input_hash[:16]} ({where}, sample {self.sample_index})"

    def largest_move(self) -> tuple[str, float] | None:
        """The first-token candidate whose logprob moved most, and by how much (regenerated - stored)."""
        return max(self.logprob_deltas.items(), key=lambda item: abs(item[1]), default=None)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_abs_delta": self.max_abs_delta, "top_token_changed": self.top_token_changed}


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit_database` found; :attr:`exact_rate` is 1.0 when every sampled row came out the same."""

    role: str
    task: str
    model: str
    descriptor: str
    rows_in_database: int
    rows: tuple[RowAudit, ...]
    seed: int | None
    seconds: float

    @property
    def sampled(self) -> int:
        return len(self.rows)

    @property
    def exact(self) -> int:
        return sum(r.exact for r in self.rows)

    @property
    def exact_rate(self) -> float:
        return self.exact / self.sampled if self.rows else 1.0

    @property
    def mismatches(self) -> tuple[RowAudit, ...]:
        return tuple(r for r in self.rows if not r.exact)

    @property
    def max_abs_logprob_delta(self) -> float | None:
        return max((d for r in self.rows if (d := r.max_abs_delta) is not None), default=None)

    @property
    def top_tokens_changed(self) -> int:
        return sum(r.top_token_changed for r in self.rows if r.logprob_deltas or r.top_token_stored)

    def lines(self) -> list[str]:
        """The human report: the exact-match rate, the logprob change, each mismatch and where it starts."""
        lines = [
            f"audit of {self.model} ({self.role}/{self.task}, descriptor {self.descriptor}): "
            f"{self.exact} of {self.sampled} sampled rows regenerated exactly ({self.exact_rate:.1%}); "
            f"{self.rows_in_database:,} rows stored, {self.seconds:.1f} s"
            + ("" if self.seed is None else f"; --sample-seed {self.seed} picks the same rows")
        ]
        if self.max_abs_logprob_delta is not None:
            lines.append(
                f"first-token logprobs: largest change {self.max_abs_logprob_delta:.3g}, "
                f"{self.top_tokens_changed} rows with another most likely first token"
            )
        for row in self.mismatches:
            lines.append(
                f"  {row.label} differs at character {row.first_difference}: {row.stored!r} -> {row.regenerated!r}"
                if row.first_difference is not None
                else f"  {row.label} ends otherwise: finish reason {row.finish_reason_stored!r} -> "
                f"{row.finish_reason_regenerated!r}"
            )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "task": self.task,
            "model": self.model,
            "descriptor": self.descriptor,
            "rows_in_database": self.rows_in_database,
            "sampled": self.sampled,
            "exact": self.exact,
            "exact_rate": self.exact_rate,
            "max_abs_logprob_delta": self.max_abs_logprob_delta,
            "top_tokens_changed": self.top_tokens_changed,
            "seed": self.seed,
            "seconds": round(self.seconds, 3),
            "mismatches": [r.as_dict() for r in self.mismatches],
            "rows": [r.as_dict() for r in self.rows],
        }


def sample_rows(database: Database, n: int, *, seed: int | None = None, flt: RowFilter | None = None) -> list[Record]:
    """Up to ``n`` rows of ``database`` at random (``seed`` makes the choice repeatable)."""
    if n < 0:
        raise InvalidInputError(f"the sample size must be >= 0, got {n}")
    start = f"{random.Random(seed).getrandbits(256):064x}"
    with database.reading() as repo:
        return repo.sample(n, start, flt)


def _content(record: Record) -> dict[str, Any]:
    """What a request needs to render ``record``'s input again: its messages or its text."""
    rendered = orjson.loads(record.input_text)
    return {"messages": rendered["messages"]} if rendered.get("type") == "messages" else {"text": rendered["text"]}


def regenerate(model: CachedModel, rows: Sequence[Record]) -> list[Sample]:
    """Each row's input generated again by ``model`` (mode ``off``: no store), the row's sample index included."""
    if model.mode != "off":
        raise InvalidInputError(
            f"an audit regenerates without the store: use a model in mode 'off', not {model.mode!r}"
        )
    needed: dict[str, tuple[Record, int]] = {}  # rendered input -> a row of it, samples needed (highest index + 1)
    for row in rows:
        count = needed.get(row.input_text, (row, 0))[1]
        needed[row.input_text] = (row, max(count, row.sample_index + 1))
    texts = {role: [t for t, (row, _) in needed.items() if isinstance(row, JudgementRecord) == (role == "judgements")]
             for role in ("completions", "judgements")}  # fmt: skip
    by_input: dict[str, Response] = {}
    if texts["completions"]:
        completions = [CompletionRequest(**_content(needed[t][0]), n=needed[t][1]) for t in texts["completions"]]
        by_input.update(zip(texts["completions"], model.complete(completions), strict=True))
    if texts["judgements"]:
        judgements = [JudgementRequest(**_content(needed[t][0]), n=needed[t][1]) for t in texts["judgements"]]
        by_input.update(zip(texts["judgements"], model.judge(judgements), strict=True))
    regenerated = []
    for row in rows:
        sample = by_input[row.input_text].samples[row.sample_index]
        if sample.input_hash != row.input_hash:
            raise InvalidInputError(
                f"row {row.input_hash[:16]}: its input_text hashes to {sample.input_hash[:16]}; the row was edited "
                "(`judgestore verify` finds every such row)"
            )
        regenerated.append(sample)
    return regenerated


def _excerpt(text: str, position: int) -> str:
    start = max(position - EXCERPT, 0)
    return ("…" if start else "") + text[start : position + EXCERPT] + ("…" if position + EXCERPT < len(text) else "")


def _delta(now: float, before: float) -> float:
    if now == before:
        return 0.0
    if math.isfinite(now) and math.isfinite(before):
        return now - before
    return math.inf


def _top(view: dict[str, float]) -> str | None:
    finite = {text: lp for text, lp in view.items() if not math.isnan(lp)}
    return max(finite, key=lambda text: (finite[text], text)) if finite else None


def compare(row: Record, sample: Sample) -> RowAudit:
    """``row`` beside ``sample``, its regeneration (see the module docstring)."""
    stored, now = row.completion, sample.text
    # The finish reason is part of what a hit serves: a row whose text agreed but whose end did not was "exact",
    # and adopt carried the old one over (was). Unknown on either side (a legacy row's) says nothing either way.
    ends = (row.finish_reason, sample.finish_reason)
    exact = stored == now and (None in ends or ends[0] == ends[1])
    position = None
    if stored != now:
        position = next(
            (i for i, (a, b) in enumerate(zip(stored, now, strict=False)) if a != b), min(len(stored), len(now))
        )
    before, after = text_logprobs(row.top_logprobs, 0), text_logprobs(sample.top_logprobs, 0)
    return RowAudit(
        row.input_hash,
        row.sample_index,
        row.benchmark,
        row.instruction_id,
        exact,
        position,
        stored if position is None else _excerpt(stored, position),
        now if position is None else _excerpt(now, position),
        row.finish_reason,
        sample.finish_reason,
        logprob_deltas(before, after),
        _top(before),
        _top(after),
    )


def logprob_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each first-token candidate's change, regenerated - stored, when both views list candidates.

    A candidate only one view lists moved across the top k's edge: one that left it now ranks below every
    candidate listed (at most the lowest of them), one that joined it ranked below every candidate listed
    before. Its change is the least that implies (0 where the edge is on the far side of its own value), so a
    verdict token that dropped out counts as the move it is (was: not counted at all).
    """
    if not before or not after:
        return {}
    deltas = {text: _delta(after[text], lp) for text, lp in before.items() if text in after}
    edge_after, edge_before = _lowest(after), _lowest(before)
    for text, lp in before.items():
        if text not in after:  # now at most edge_after: down by lp - edge_after at least
            deltas[text] = -gap if (gap := lp - edge_after) > 0 else 0.0  # inf - inf is NaN: no bound, 0
    for text, lp in after.items():
        if text not in before:  # was at most edge_before: up by lp - edge_before at least
            deltas[text] = gap if (gap := lp - edge_before) > 0 else 0.0
    return deltas


def _lowest(view: dict[str, float]) -> float:
    """The lowest logprob a view lists (NaN left out; -inf where none is a number)."""
    return min((lp for lp in view.values() if not math.isnan(lp)), default=-math.inf)


def audit_database(
    database: Database,
    spec: Spec,
    *,
    sample: int = 20,
    seed: int | None = None,
    flt: RowFilter | None = None,
    chunk_size: int | None = None,
) -> AuditReport:
    """Regenerate ``sample`` random rows of ``database`` with ``spec``'s model and compare (see the module docstring).

    ``spec`` is usually the model that wrote the rows (its descriptor is the
    database's); any other model auditing the same rows answers "would this
    engine give the same answers?".
    """
    started = time.perf_counter()
    if seed is None:  # a new choice, under a seed the report gives: --sample-seed picks the same rows again
        seed = random.SystemRandom().getrandbits(32)
    rows = sample_rows(database, sample, seed=seed, flt=flt)
    location = database.location
    options: dict[str, Any] = {"mode": "off"} | ({} if chunk_size is None else {"chunk_size": chunk_size})
    audited: tuple[RowAudit, ...] = ()
    if rows:
        with spec.cached(None, task=location.task, **options) as model:
            audited = tuple(compare(row, s) for row, s in zip(rows, regenerate(model, rows), strict=True))
    return AuditReport(
        location.role,
        location.task,
        spec.display_name,
        location.descriptor_hash16,
        database.count(flt),
        audited,
        seed,
        time.perf_counter() - started,
    )
