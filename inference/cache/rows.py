"""What crosses the cache boundary: engine requests, the rows generations are stored as, the samples returned.

Contract: :func:`engine_request` is what the engine is asked for a planned
input; :func:`generated_record` the row a generation is written as (the
request's metadata, the run's id and author, the model's label where the
request names no model or judge); :func:`generated_sample` and
:func:`stored_sample` what the caller gets back for a miss (``cached``
False; with ``error`` when it failed) and for a hit (``cached`` True).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from inference.backends.base import EngineRequest, Generation
from inference.cache.plan import PlannedInput
from inference.requests import JudgementRequest, Request, Sample
from store import Settings
from store.errors import JudgestoreError
from store.tables.records import CompletionRecord, JudgementRecord, Record


def engine_request(inp: PlannedInput) -> EngineRequest:
    """What the engine is asked for a planned input: its rendered input, parsed, and its sample index."""
    return EngineRequest(orjson.loads(inp.rendered), inp.sample_index)


def generated_sample(inp: PlannedInput, gen: Generation | None, error: JudgestoreError | None = None) -> Sample:
    """A generated sample; with ``error``, a failed one (``gen`` is its generation when only the store refused it)."""
    if gen is None:
        return Sample(inp.key, inp.sample_index, "", None, None, None, cached=False, error=error)
    return Sample(
        inp.key,
        inp.sample_index,
        gen.text,
        gen.finish_reason,
        gen.usage or None,
        gen.top_logprobs,
        cached=False,
        error=error,
    )


def stored_sample(record: Record, *, cached: bool = True) -> Sample:
    """The stored row as the caller gets it back: a hit (``cached``), or a miss of this call that a job of its
    shared batch generated and stored (read back from the store, ``cached=False``)."""
    return Sample(
        record.input_hash,
        record.sample_index,
        record.completion,
        record.finish_reason,
        record.usage,
        record.top_logprobs,
        cached=cached,
    )


def generated_record(
    request: Request, inp: PlannedInput, gen: Generation, now: datetime, *, label: str, settings: Settings
) -> Record:
    """The row ``gen`` is stored as: the request's metadata, the run's id and author, ``label`` as model or judge."""
    common: dict[str, Any] = {
        "input_hash": inp.key,
        "sample_index": inp.sample_index,
        "input_text": inp.rendered.decode(),
        "completion": gen.text,
        "benchmark": request.benchmark,
        "instruction_id": request.instruction_id,
        "finish_reason": gen.finish_reason,
        "usage": gen.usage or None,
        "top_logprobs": gen.top_logprobs,
        "run_id": settings.run_id,
        "created_by": settings.created_by,
        "created_at": now,
    }
    if isinstance(request, JudgementRequest):
        return JudgementRecord(
            model_a=request.model_a,
            model_b=request.model_b,
            judge=request.judge or label,
            orientation=request.orientation,
            **common,
        )
    return CompletionRecord(model=request.model or label, **common)
