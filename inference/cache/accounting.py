"""What a call did, what it cost and what the cache saved it: engine time per row, token totals, the ``runs`` row.

Contract:

* :class:`CallStats` is what one call of :class:`~inference.cache.model.CachedModel`
  did: its plan, what was fetched, generated and written, the inputs that
  failed (:class:`~inference.cache.plan.Failure`), and what the misses cost
  and the hits saved. :meth:`CallStats.run_record` is the row
  :func:`store.runs.record_run` appends to the database's ``runs`` table.
* :func:`priced` gives each generation of a batch its share of the batch's
  engine wall time, in its ``usage`` as ``engine_seconds`` (beside the token
  counts the engine reported). Shares are proportional to completion tokens
  (decoding dominates), or equal when token counts are missing; they add up
  to the batch's time. That ``usage`` is what the row stores, so a row
  records what producing it cost.
* :func:`usage_totals` adds up ``usage`` values (stored rows or fresh
  generations): tokens in and out, engine seconds, and how many carried no
  engine time (rows written before revision 0003, imported rows).
* Savings are counted over the distinct inputs the store answered (hits):
  what those rows had cost when they were generated. Duplicates inside a
  batch are not savings of the cache and are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inference.backends.base import Generation
from inference.cache.plan import Failure, Plan
from store.repository import MAX_ENGINE_SECONDS, MAX_TOKENS
from store.tables.records import RunRecord

ENGINE_SECONDS = "engine_seconds"  # the usage key of a row's share of its batch's engine time


def priced(generations: Sequence[Generation], seconds: float) -> list[Generation]:
    """``generations`` with ``usage["engine_seconds"]``: their shares of ``seconds`` (see the module docstring)."""
    if not generations:
        return []
    tokens = [g.usage.get("completion_tokens") for g in generations]
    known = all(isinstance(t, int) and t >= 0 for t in tokens) and sum(tokens) > 0  # type: ignore[arg-type]
    weights = [float(t) for t in tokens] if known else [1.0] * len(generations)  # type: ignore[arg-type]
    total = sum(weights)
    # Built field by field: dataclasses.replace checks its fields by name, 3 us a generation of a cold run's write.
    return [
        Generation(g.text, g.finish_reason, {**g.usage, ENGINE_SECONDS: round(seconds * w / total, 6)}, g.top_logprobs)
        for g, w in zip(generations, weights, strict=True)
    ]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """``usage`` values added up: rows counted, tokens in and out, engine seconds, rows without engine time."""

    rows: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0
    without_cost: int = 0

    def __add__(self, other: UsageTotals) -> UsageTotals:
        # Field by field (dataclasses.astuple deep-copies: a total over thousands of databases felt it).
        return UsageTotals(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def usage_totals(usages: Iterable[Mapping[str, Any] | None]) -> UsageTotals:
    """Add up ``usage`` values; missing or non-numeric entries count as nothing.

    Called on every hit of a run, so the common case (plain ints and a float)
    takes a fast path: 10k rows add up in about 2 ms.
    """
    rows = prompt = completion = without = 0
    seconds = 0.0
    for usage in usages:
        rows += 1
        if not usage:
            without += 1
            continue
        p, c, s = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get(ENGINE_SECONDS)
        prompt += p if type(p) is int else _tokens(p)
        completion += c if type(c) is int else _tokens(c)
        if type(s) is float and -MAX_ENGINE_SECONDS < s < MAX_ENGINE_SECONDS:  # NaN fails both comparisons
            seconds += s
        elif (spent := _number(s)) is not None and abs(spent) < MAX_ENGINE_SECONDS:
            seconds += spent
        else:  # none, not a number, or none a call takes (as stats adds them up: two of 1e308 summed to inf)
            without += 1
    return UsageTotals(rows, prompt, completion, round(seconds, 6), without)


def _tokens(value: Any) -> int:
    """A token count that is not a plain int, as stats adds it up: none past :data:`MAX_TOKENS` (a float of 1e308)."""
    number = _number(value)
    return int(number) if number is not None and abs(number) < MAX_TOKENS else 0


_SHOWN_FAILURES = 3  # in the failure message; every one is in ``failed``


@dataclass
class CallStats:
    """What one call of a :class:`~inference.cache.model.CachedModel` did (its ``last``), for summaries and tests."""

    plan: Plan | None = None
    fetched_rows: int = 0
    generated: int = 0
    written: int = 0
    truncated: int = 0  # samples returned that stopped at max_tokens (finish_reason "length"), hits included
    engine_loaded: bool = False
    seconds: float = 0.0
    spent: UsageTotals = field(default_factory=UsageTotals)  # what the generated samples cost
    saved: UsageTotals = field(default_factory=UsageTotals)  # what the hit rows had cost when generated
    failed: list[Failure] = field(default_factory=list)  # inputs refused (by the engine, a server or the store)
    from_other_jobs: int = 0  # a shared batch: the misses other jobs generated (inference.cache.shared)

    def run_record(
        self, *, run_id: str | None, created_by: str | None, started_at: datetime, finished_at: datetime
    ) -> RunRecord:
        """The ``runs`` row of this call (see :class:`store.tables.models.Run`)."""
        plan, spent, saved = self.plan, self.spent, self.saved
        assert plan is not None, "a call is recorded after it planned"
        return RunRecord(
            role=plan.role,
            run_id=run_id,
            created_by=created_by,
            started_at=started_at,
            finished_at=finished_at,
            mode=plan.mode,
            requested=plan.requested,
            distinct_inputs=plan.distinct,
            hits=plan.hits,
            misses=plan.misses - self.from_other_jobs,  # a shared batch's job counts its own share
            duplicates=plan.duplicates,
            generated=self.generated,
            rows_written=self.written,
            truncated=self.truncated,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            engine_seconds=spent.engine_seconds,
            saved_prompt_tokens=saved.prompt_tokens,
            saved_completion_tokens=saved.completion_tokens,
            saved_engine_seconds=saved.engine_seconds,
            hits_without_cost=saved.without_cost,
            wall_seconds=round(self.seconds, 6),
        )

    def failed_message(self) -> str:
        """What failed, for :class:`~store.errors.RequestsFailedError`: how many, the first few, what to do."""
        plan, failed = self.plan, self.failed
        assert plan is not None, "inputs fail after the call planned"
        shown = "; ".join(f.line() for f in failed[:_SHOWN_FAILURES])
        more = f"; and {len(failed) - _SHOWN_FAILURES} more" if len(failed) > _SHOWN_FAILURES else ""
        kept = f", {self.written} rows written" if self.written else ""
        return (
            f"{len(failed)} of {plan.misses} inputs to generate failed and were not stored "
            f"({plan.misses - len(failed)} answered{kept}, {plan.hits} hits): {shown}{more}. "
            "Every response is in the error's .responses, the failed ones with their .error; a rerun asks only for "
            "those"
        )
