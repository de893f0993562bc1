"""One whole run, as ``judgestore generate`` / ``judge`` do it: plan, generate what is missing, summarise.

Contract:

* :func:`run_requests` opens what a run needs and closes it again: the store
  (none in mode ``off``; read-only in mode ``readonly``, and in mode
  ``replay`` unless a remote is fetched from, since replay writes no row of
  its own but imports the fetched ones), the shared remote (``fetch=None``
  follows ``JUDGESTORE_FETCH_BEFORE_RUN``), and the model behind the cache
  boundary (:meth:`~inference.spec.Spec.cached`). It returns the
  responses in request order and a :class:`RunSummary`.
* vLLM logs to stderr during the run (``VLLM_LOGGING_STREAM``, unless the
  caller set it), so that stdout can carry results.
* ``shared=True`` (``--shared-batch``): the jobs started on the same
  requests share their misses through the store, each generating only what
  it claims (:mod:`inference.cache.shared`); every job returns every answer.
* The command line only renders what this returns; a Python caller gets the
  same behaviour and the same summary.
* Requests that failed (refused by the engine or server, or their rows by
  the store) do not stop the run: it returns every response, the failed ones
  marked with their ``error``, and the summary lists them (``failures``);
  the command line writes them with an ``error`` field and exits 1.
* A run a server's model stopped (a spent quota, the server gone) raises
  its typed error with a note saying how many HTTP requests it had sent
  (the rows it kept are in the error's ``rows_kept`` and its own note).
* The summary says what the cache saved (the tokens and engine seconds the
  hit rows had cost when they were generated), how many hits were adopted
  rows (:mod:`inference.drift.adopt`), and what the misses cost; the
  same accounting is appended to the database's ``runs`` table
  (:mod:`inference.cache.accounting`).
* A :class:`RunSummary` holds the call's
  :class:`~inference.cache.accounting.CallStats` (its plan, counts, spent and
  saved totals) rather than a copy of each number, and adds what only the run
  knows; :meth:`RunSummary.as_dict` spells out the ``--json`` keys, in the
  order scripts have always read them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference.cache.accounting import CallStats
from inference.cache.model import ProgressCallback
from inference.cache.plan import Failure, Mode, Plan
from inference.requests import Request, Response
from store import Settings, Store, SyncSettings
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, JudgestoreError, RequestsFailedError
from store.roles import Role, check_role
from store.runs import hit_rate
from store.settings import from_environment

if TYPE_CHECKING:
    from inference.spec import Spec


@dataclass(frozen=True)
class RunSummary:
    """What one run did: the call's own stats, and what only the run knows.

    ``call`` is what the model's call did (its plan; what it fetched,
    generated and wrote; what the misses cost and the hits saved; what
    failed). The run adds the request count, its wall time, whether vLLM was
    imported, the remote it fetched from, what was sent to a server, and how
    many outputs the context window stopped. :meth:`as_dict` is the ``--json``
    summary of ``generate``/``judge``.
    """

    task: str
    model: str  # the name recorded in rows (the spec's display name)
    descriptor: ModelDescriptor
    requests: int
    call: CallStats
    wall_seconds: float
    vllm_imported: bool
    remote: str | None = None  # the remote fetched from, by its url
    sent: dict[str, int] | None = None  # a server's model: requests sent, retries, tokens used
    context_limited: int = 0  # of ``truncated``: outputs that stopped before max_tokens (the context window)

    @property
    def plan(self) -> Plan:
        assert self.call.plan is not None, "a run is summarised after its call planned"
        return self.call.plan

    @property
    def hits(self) -> int:
        return self.plan.hits

    @property
    def misses(self) -> int:
        return self.plan.misses

    @property
    def truncated(self) -> int:
        return self.call.truncated

    @property
    def failures(self) -> tuple[Failure, ...]:
        """Inputs that failed: refused by the engine, a server or the store."""
        return tuple(self.call.failed)

    @property
    def failed(self) -> int:
        return len(self.call.failed)

    @property
    def max_tokens(self) -> int | None:
        return self.descriptor.sampling.max_tokens

    @property
    def max_model_len(self) -> int | None:
        """The engine's context window (prompt and answer together), when set."""
        return _int_or_none(self.descriptor.engine.get("max_model_len"))

    def as_dict(self) -> dict[str, Any]:
        plan, call, saved, spent = self.plan, self.call, self.call.saved, self.call.spent
        sent = self.sent or {}
        return {
            "role": plan.role,
            "task": self.task,
            "model": self.model,
            "descriptor": self.descriptor.hash16(),
            "mode": plan.mode,
            "requests": self.requests,
            "requested": plan.requested,
            "hits": plan.hits,
            "misses": plan.misses,
            "duplicates": plan.duplicates,
            "fetched_rows": call.fetched_rows,
            "generated": call.generated,
            "rows_written": call.written,
            "truncated": call.truncated,
            "engine_loaded": call.engine_loaded,
            "vllm_imported": self.vllm_imported,
            "wall_seconds": self.wall_seconds,
            "saved_prompt_tokens": saved.prompt_tokens,
            "saved_completion_tokens": saved.completion_tokens,
            "saved_engine_seconds": saved.engine_seconds,
            "hits_without_cost": saved.without_cost,
            "prompt_tokens": spent.prompt_tokens,
            "completion_tokens": spent.completion_tokens,
            "engine_seconds": spent.engine_seconds,
            "stored_rows": plan.stored_rows,
            "other_descriptors": plan.other_descriptors,
            "adopted_hits": plan.adopted_hits,
            "failures": [failure.as_dict() for failure in call.failed],
            "failed": self.failed,
            "from_other_jobs": call.from_other_jobs,
        } | {name: sent[name] for name in ("requests_sent", "retries") if name in sent}

    def savings_line(self) -> str | None:
        """What the cache saved this run, if anything was a hit."""
        if not self.hits:
            return None
        saved = self.call.saved
        unknown = (
            f"; {saved.without_cost} hit rows record no engine time (written before revision 0003, or imported)"
            if saved.without_cost
            else ""
        )
        return (
            f"saved: {self.hits} requests not sent, {saved.prompt_tokens:,} tokens in and "
            f"{saved.completion_tokens:,} out, ~{saved.engine_seconds:.2f} s of engine time{unknown}"
        )

    def line(self) -> str:
        """The one-line human summary."""
        plan, call = self.plan, self.call
        distinct = plan.hits + plan.misses
        adopted = f"; {plan.adopted_hits} adopted" if plan.adopted_hits else ""
        rate = f" ({hit_rate(plan.hits, distinct)}{adopted})" if distinct else ""  # no inputs: no rate (was 100 %)
        loaded = "engine loaded" if self.sent is None else "client opened"
        failed = f", {self.failed} failed" if call.failed else ""
        if call.from_other_jobs:
            failed += f", {call.from_other_jobs} generated by other jobs"
        line = (
            f"done: {plan.hits} hits{rate}, {plan.misses} misses{failed}, "
            f"{call.written} rows written, "
            f"{self.wall_seconds} s, {loaded}: {'yes' if call.engine_loaded else 'no'}"
            + (f", {call.fetched_rows} rows fetched from {self.remote}" if self.remote is not None else "")
        )
        if self.sent is not None:
            tokens = self.sent["prompt_tokens"] + self.sent["completion_tokens"]
            return (
                line + f"; sent {self.sent['requests_sent']} requests ({self.sent['retries']} retries), {tokens} tokens"
            )
        return line + ("" if self.vllm_imported else " (vLLM never imported)")

    def failure_lines(self, limit: int = 10) -> list[str]:
        """What failed, for people: a heading, one line per failed input (``limit`` at most), and what to do."""
        if not self.failures:
            return []
        lines = [
            f"failed: {self.failed} of the {self.misses} inputs to generate were not answered or not stored (each "
            "has an `error` in its output line):"
        ]
        lines += [f"  {failure.line()}" for failure in self.failures[:limit]]
        if self.failed > limit:
            lines.append(f"  ... and {self.failed - limit} more (every one is in --json's failures)")
        if self.failed >= self.plan.distinct:  # nothing else was asked: "the others are stored" would be untrue
            lines.append("fix or drop them and run again")
        elif self.plan.mode == "use":
            lines.append("fix or drop them and run again: only they are asked for (the others are stored)")
        elif self.plan.mode == "refresh":  # a rerun refreshes every input again; mode use would keep their old rows
            lines.append(
                "fix them and refresh them alone (--mode refresh on a file of only them): the others are refreshed "
                "and stored, and these still hold their old rows, if they had any"
            )
        else:
            lines.append(f"fix or drop them and run again (mode {self.plan.mode} stores nothing it generates)")
        return lines

    def truncation_note(self) -> str | None:
        """What to do about outputs that stopped at a length limit (finish_reason=length), naming the limit."""
        if not self.truncated:
            return None
        if not self.context_limited:
            return (
                f"note: {self.truncated} outputs stopped at max_tokens ({self.max_tokens}; finish_reason=length): "
                "raise --max-tokens to let them finish"
            )
        window = (f"the engine's max_model_len ({self.max_model_len} tokens for prompt and answer together; raise "
                  "--engine-arg max_model_len)" if self.max_model_len else "the model's context length")  # fmt: skip
        parts = [f"{self.context_limited} at {window}, before max_tokens ({self.max_tokens})"]
        if self.truncated > self.context_limited:
            parts.append(f"{self.truncated - self.context_limited} at max_tokens (raise --max-tokens)")
        head = f"note: {self.truncated} outputs stopped before they finished (finish_reason=length): "
        return head + "; ".join(parts)


@dataclass(frozen=True)
class RunResult:
    responses: list[Response]
    summary: RunSummary


def run_requests(
    spec: Spec,
    requests: Sequence[Request],
    *,
    role: Role,
    task: str,
    settings: Settings | None = None,
    mode: Mode = "use",
    chunk_size: int | None = None,
    fetch: bool | None = None,
    on_plan: Callable[[Plan], None] | None = None,
    on_progress: ProgressCallback | None = None,
    shared: bool = False,
) -> RunResult:
    """Run ``requests`` through ``spec`` behind the store of ``settings``; see the module docstring."""

    started = time.perf_counter()
    role = check_role(role)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    settings = settings or from_environment(Settings)
    sync_settings = from_environment(SyncSettings)
    remote = None
    if sync_settings.fetch_before_run if fetch is None else fetch:
        from store.sync import open_remote  # sharing's code is imported by the runs that fetch

        if sync_settings.sync_dir is None and sync_settings.hub_repo is None:  # a run takes no --repo or --dir
            raise InvalidInputError(
                "fetching before the run (--fetch, JUDGESTORE_FETCH_BEFORE_RUN) needs a remote: set "
                "JUDGESTORE_HUB_REPO=ORG/NAME (a Hugging Face dataset repository) or JUDGESTORE_SYNC_DIR=PATH "
                "(a shared folder)"
            )
        remote = open_remote(settings=sync_settings)
    readonly = mode == "readonly" or (mode == "replay" and remote is None)
    store = None if mode == "off" else Store(settings, readonly=readonly)
    options: dict[str, Any] = {"mode": mode, "remote": remote, "shared": shared}
    if chunk_size is not None:
        options["chunk_size"] = chunk_size
    cached = spec.cached(store, task=task, settings=settings, **options)
    before = spec.sent()  # a spec counts what all its backends sent: this run's is what it adds
    responses: list[Response]
    with cached, store if store is not None else nullcontext():
        if store is not None and readonly:  # a mistyped --store-root is no empty store: every input a miss (was)
            store.require_present(f"to read in --mode {mode}")
        try:
            if role == "completions":
                responses = cached.complete(requests, on_plan=on_plan, on_progress=on_progress)  # type: ignore[arg-type]
            else:
                responses = cached.judge(requests, on_plan=on_plan, on_progress=on_progress)  # type: ignore[arg-type]
        except RequestsFailedError as e:  # the summary lists them; every response is kept
            responses = e.responses
        except JudgestoreError as e:  # a stopped run (a spent quota, a server gone): what it cost, beside what it kept
            if (sent := _sent_since(before, spec.sent())) is not None and sent["requests_sent"]:
                requests_sent, retries = sent["requests_sent"], sent["retries"]
                e.add_note(
                    f"It sent {requests_sent} request{'s' * (requests_sent != 1)} to the server before it stopped "
                    f"({retries} retr{'ies' if retries != 1 else 'y'})"
                )
            raise
    summary = RunSummary(
        task=task,
        model=spec.display_name,
        descriptor=spec.descriptor,
        requests=len(requests),
        call=cached.last,
        wall_seconds=round(time.perf_counter() - started, 3),
        vllm_imported="vllm" in sys.modules,
        remote=None if remote is None else remote.url,
        sent=_sent_since(before, spec.sent()),
        context_limited=_context_limited(responses, spec.descriptor.sampling.max_tokens),
    )
    return RunResult(responses, summary)


def _sent_since(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """What was sent between two readings of :meth:`~inference.spec.Spec.sent` (None: an in-process engine)."""
    if after is None:
        return None
    return {key: value - (before or {}).get(key, 0) for key, value in after.items()}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _context_limited(responses: Sequence[Response], max_tokens: int | None) -> int:
    """Outputs that stopped at the length limit with fewer tokens than max_tokens: the context window stopped them."""
    if max_tokens is None:
        return 0
    return sum(
        1
        for response in responses
        for sample in response.samples
        if sample.finish_reason == "length" and _int_or_none((sample.usage or {}).get("completion_tokens")) is not None
        and (sample.usage or {})["completion_tokens"] < max_tokens
    )  # fmt: skip
