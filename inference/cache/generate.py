"""Generating a call's misses and writing them as they come.

Contract:

* :func:`generate_into` hands the engine the misses of one call and writes
  what comes back through a :class:`Writer`. A
  :class:`~inference.backends.base.StreamingBackend` (the local vLLM engine, a
  hosted API) gets every miss at once, so the engine holds as many of them as
  it can schedule; its generations are written as they finish, every
  ``chunk_size`` of them or every :data:`STREAM_FLUSH_SECONDS`, whichever
  comes first; the backend's heartbeats keep that clock going while nothing
  finishes (a long generation, a slow server). ``chunk_size`` is the write
  interval, never the engine's batch.
  A backend that only generates whole batches gets them ``chunk_size`` at a
  time, each written before the next starts, under the caller's engine lock.
  A call that bounds its requests in flight (``max_concurrency``) streams
  under that bound from a
  :class:`~inference.backends.base.BoundedStreamingBackend`; any other
  streaming backend (the local vLLM engine) gets one stream per group of at
  most that bound, each written as it finishes like an unbounded stream (an
  engine closed between two groups stops the call as one closed during a
  group does: a :class:`~store.errors.BackendError` with ``rows_kept``); a
  backend that only generates whole batches gets batches of at most it.
* The database the rows go to is opened (a new one created) by a stream's
  first write of answers (:meth:`Writer.write`), as patiently as a write: a
  call none of whose requests is answered (a model the server does not
  serve, a server not there, every request refused) creates none, and so
  records no run either (the store was checked writable before the engine
  was prepared). An engine core in its own process (vLLM's default)
  computes while it is created. A backend without streaming has it opened
  before its first batch. A call that writes nothing (modes off, readonly)
  opens none.
* A crash loses at most what finished since the last write (and what was in
  flight); a rerun generates only what is still missing. On a failure or an
  interrupt the stream is closed first (the local engine aborts what is
  unfinished and is free for the next call), then what finished is written,
  then the error propagates. A write an interrupt cuts short is done again
  (what reached the store is not written twice), with what the stream had
  finished meanwhile (the interrupt is thrown into it: it hands that over).
  A :class:`KeyboardInterrupt`, and a :class:`~store.errors.ModelError` (the
  engine or server failed: a :class:`~store.errors.BackendError`, a hosted
  API's error; ``rows_kept`` set), carry a note saying how many rows this
  call wrote.
* :class:`Writer` turns each batch of outcomes into the call's state: each
  generation gets its share of the batch's engine time
  (:func:`~inference.cache.accounting.priced`), its row is written (policy
  ``replace`` in mode ``refresh``, else ``ignore``), and its sample is kept
  (``results``, by input hash). A :class:`~inference.backends.base.Refusal`
  and a row the store refuses (:class:`InvalidInputError`, split from its
  batch until alone) fail alone, in ``run.failed``; any other write failure
  raises with ``rows_kept``, the rows this call stored before it. A row
  another job (or a concurrent call) stored first under a key is what the
  call returns for it (``cached`` False): the answer of record, which every
  later run gets back, not this call's own generation, which nothing kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Literal

from inference.backends.base import (
    Arrival,
    Backend,
    BoundedStreamingBackend,
    EngineRequest,
    Generation,
    Refusal,
    StreamingBackend,
)
from inference.cache.accounting import CallStats, priced, usage_totals
from inference.cache.patience import patiently
from inference.cache.plan import Failure, PlannedInput
from inference.cache.rows import generated_record, generated_sample, stored_sample
from inference.requests import Request, Sample
from store import Database, Settings
from store.errors import BackendError, InvalidInputError, JudgestoreError, ModelError
from store.tables.records import Record
from store.tables.row_checks import NOTHING_WRITTEN

# Finished generations are written at least this often, so a slow run killed half-way loses seconds of work
# (or of paid requests) rather than a whole write interval's worth.
STREAM_FLUSH_SECONDS = 2.0

ProgressCallback = Callable[[int, int], None]  # (generated so far, to generate)
Outcomes = Sequence[tuple[PlannedInput, Generation | Refusal]]


class Writer:
    """One call's generations: rows written to ``database`` (if any), samples and failures kept for the call."""

    def __init__(
        self,
        requests: Sequence[Request],
        run: CallStats,
        *,
        total: int,
        label: str,
        settings: Settings,
        refresh: bool = False,
        on_progress: ProgressCallback | None = None,
        open_database: Callable[[], Database] | None = None,
        write_patience: float = 0.0,
    ) -> None:
        self.requests = requests
        # How long a write waits for a store that stopped answering, past the store's own retries (a shared
        # batch's: inference.cache.patience); 0: it fails, with the rows written before it kept.
        self.write_patience = write_patience
        self.run = run
        self.total = total  # misses of the call, refused ones included: what progress counts to
        self.label = label
        self.settings = settings
        self.policy: Literal["ignore", "replace"] = "replace" if refresh else "ignore"
        self.on_progress = on_progress
        self._open_database = open_database  # None: the call writes nothing (mode off, readonly, replay)
        self.database: Database | None = None  # opened by open() (see the module docstring)
        self.results: dict[str, Sample] = {}  # by input hash: each outcome kept (its row written, or its failure)
        self._paid: set[str] = set()  # the outcomes whose cost (or refusal) is counted in run
        self.done = 0

    def open(self) -> None:
        """Open (or create) the database the rows go to, once; a call that writes nothing opens nothing.

        :meth:`write` calls it for a stream's first answers, so that a call whose requests all fail leaves no
        database: a typo in a hosted model's name left an empty one, and its failed run, for good (was).
        """
        if self.database is None and self._open_database is not None:
            # as patient as a write: a shared batch's block whose first answers came as the server restarted
            self.database = patiently(self._open_database, self.write_patience)

    def fail(self, inp: PlannedInput, error: JudgestoreError, gen: Generation | None = None) -> None:
        request = self.requests[inp.request_index]
        self.run.failed.append(Failure.of(inp.request_index, request, inp, error))
        self.results[inp.key] = generated_sample(inp, gen, error)

    def left_note(self) -> str:
        """What a failure or an interrupt leaves of this call, and what running it again does, in its mode."""
        run = self.run
        if self._open_database is None:
            return (
                f"this mode writes no rows, so the {run.generated} generated are not kept: running it again "
                "generates them again"
            )
        if self.policy == "replace":
            left = self.total - run.written - len(run.failed)
            return (
                f"they are kept; the other {left} inputs of this refresh still hold their old rows, if they had any "
                "(mode use would return those): run it again with --mode refresh to refresh them"
            )
        if run.written == 0:  # "they are kept" would speak of rows that are not there
            return "nothing of it is kept: running it again generates them again"
        return "they are kept, and running it again in mode use generates only the rest"

    def progress(self, count: int) -> None:
        self.done += count
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)

    def write(self, done: Outcomes, seconds: float) -> None:
        """Keep and write ``done``, whose generations took ``seconds`` of engine time together.

        Done again after an interrupt cut it short (see :func:`_stream`), it counts each outcome once: what it
        paid and refused is counted before the rows are written (a write that fails still leaves them in the
        run), and an outcome is kept (``results``) only once its row is written, so the redo writes and counts
        what the first attempt did not. An interrupt that lands after the first attempt's commit, before its
        count, leaves rows the redo's insert ignores: in a redo, the rows stored just as generated are counted
        as this call's (so ``rows_kept`` says what the store holds).
        """
        if any(isinstance(outcome, Generation) for _, outcome in done):
            self.open()  # before anything is counted: an open that fails (or is interrupted) leaves the redo all
        done = _priced([(inp, outcome) for inp, outcome in done if inp.key not in self.results], seconds)
        redone = any(inp.key in self._paid for inp, _ in done)
        run = self.run
        uncounted = [gen for inp, gen in done if isinstance(gen, Generation) and inp.key not in self._paid]
        run.spent += usage_totals(gen.usage for gen in uncounted)
        self._paid.update(inp.key for inp, _ in done)
        for inp, outcome in done:
            if isinstance(outcome, Refusal):
                self.fail(inp, outcome.error)
        answered = [(inp, gen) for inp, gen in done if isinstance(gen, Generation)]
        now = datetime.now(UTC)
        records = [
            generated_record(self.requests[inp.request_index], inp, gen, now, label=self.label, settings=self.settings)
            for inp, gen in answered
        ]
        not_kept: dict[str, InvalidInputError] = {}
        stored_first: dict[str, Record] = {}
        if self.database is not None and records:
            written, not_kept = self._put(self.database, records)
            if written < len(records) - len(not_kept) and self.policy == "ignore":
                found = self._stored(self.database, answered, not_kept)
                stored_first = {key: record for key, (record, differs) in found.items() if differs}
                if redone:
                    written = sum(not differs for _, differs in found.values())
            run.written += written
        for inp, gen in answered:
            if inp.key in not_kept:
                self.fail(inp, not_kept[inp.key], gen)
            elif inp.key in stored_first:
                self.results[inp.key] = stored_sample(stored_first[inp.key], cached=False)
            else:
                self.results[inp.key] = generated_sample(inp, gen)
        run.generated += len(answered)
        # What is kept and not yet counted: a redo also counts the refusals its cut-short first attempt kept.
        if len(self.results) > self.done:
            self.progress(len(self.results) - self.done)

    @staticmethod
    def _stored(
        database: Database, answered: list[tuple[PlannedInput, Generation]], not_kept: dict[str, InvalidInputError]
    ) -> dict[str, tuple[Record, bool]]:
        """The rows stored under keys of ``answered`` (after a write that ignored some), by key, each with whether
        it differs from this call's generation.

        One that differs was stored first by another job, or a concurrent call of this process, that planned the
        same miss and wrote it while this one generated: the stored row is the answer of record (every later run
        gets it back), so the call returns it too, not its own generation (at a temperature above 0, another text
        that nothing kept).
        """
        keys = [inp.key for inp, _ in answered if inp.key not in not_kept]
        found = database.get_many(keys)
        return {inp.key: (found[inp.key], _differs(found[inp.key], gen)) for inp, gen in answered if inp.key in found}

    def _put(self, database: Database, records: list[Record]) -> tuple[int, dict[str, InvalidInputError]]:
        """Write one batch: the rows written, and the rows the store refused (by input hash) with its reason.

        A row the store refuses (:class:`InvalidInputError`: a value it cannot hold) fails alone: the batch is
        split until that row is alone, and every other row is written. Any other failure (a full disk...) says
        how many rows this call stored before it, and raises.
        """
        refused: dict[str, InvalidInputError] = {}
        written = 0  # by the parts of a split batch that stand, should a later part fail

        def put(batch: list[Record]) -> None:
            nonlocal written
            try:
                written += patiently(lambda: database.put_many(batch, self.policy), self.write_patience)
            except InvalidInputError as e:  # the store refused a value before writing anything of the batch
                if len(batch) == 1:  # alone: every other row is written (its batch was this row only)
                    said = str(e).removesuffix(NOTHING_WRITTEN)
                    refused[batch[0].input_hash] = e if said == str(e) else InvalidInputError(f"{said}; not stored")
                    return
                half = len(batch) // 2
                put(batch[:half])
                put(batch[half:])

        try:
            put(records)
            return written, refused
        except JudgestoreError as e:
            self.run.written += written  # the parts written before the failure stand (each its own transaction)
            e.rows_kept = self.run.written
            e.add_note(
                f"This run stored {self.run.written} rows before the failure ({self.run.generated + len(records)} "
                f"generated, this batch's included); {self.left_note()}."
            )
            raise


def _differs(record: Record, gen: Generation) -> bool:
    """Whether the stored ``record`` says something else than ``gen`` (another generation of the same input)."""
    return (record.completion, record.finish_reason, record.top_logprobs) != (
        gen.text,
        gen.finish_reason,
        gen.top_logprobs,
    )


def generate_into(
    writer: Writer,
    backend: Backend,
    missing: Sequence[PlannedInput],
    engine_requests: Sequence[EngineRequest],
    *,
    chunk_size: int,
    engine_lock: threading.Lock,
    max_concurrency: int | None = None,
) -> None:
    """Generate ``missing`` (asked as ``engine_requests``) on ``backend`` and write them (see the module docstring).

    ``max_concurrency`` (None: the backend's own) bounds this call's requests in flight.
    """
    try:
        if isinstance(backend, BoundedStreamingBackend) and max_concurrency is not None:
            _stream(writer, backend.generate_stream_bounded(engine_requests, max_concurrency), missing, chunk_size)
            return
        if isinstance(backend, StreamingBackend):
            if max_concurrency is None:
                _stream(writer, backend.generate_stream(engine_requests), missing, chunk_size)
                return
            # A stream cannot be bounded from outside: one stream per group of at most the bound, each written as
            # it finishes (on time, and what finished before Ctrl-C or a failure is kept), as an unbounded one is.
            for start in range(0, len(missing), max_concurrency):
                group = slice(start, start + max_concurrency)
                try:
                    stream = backend.generate_stream(engine_requests[group])
                except JudgestoreError as e:
                    if start == 0 or isinstance(e, BackendError):
                        raise
                    # The engine served the groups before: it went away in between (the model was closed). Typed as
                    # the engine stopping mid-call, which says what this call kept, as a close during a group does.
                    raise BackendError(
                        f"the engine stopped between this call's groups ({e}); {len(missing) - start} of "
                        f"{len(missing)} requests were left ungenerated"
                    ) from e
                _stream(writer, stream, missing[group], chunk_size)
            return
        # Whole batches, at most the call's bound when it sets one.
        writer.open()
        size = chunk_size if max_concurrency is None else min(chunk_size, max_concurrency)
        for start in range(0, len(missing), size):
            chunk = slice(start, start + size)
            with engine_lock:  # a backend without streaming serves one caller's chunk at a time
                generating = time.perf_counter()
                outcomes = backend.generate(engine_requests[chunk])
            if len(outcomes) != len(missing[chunk]):
                raise BackendError(f"backend returned {len(outcomes)} generations for {len(missing[chunk])} requests")
            writer.write(list(zip(missing[chunk], outcomes, strict=True)), time.perf_counter() - generating)
    except ModelError as e:  # the engine or server failed (not the store: its errors say what was kept themselves)
        if e.rows_kept is not None:
            raise
        e.rows_kept = writer.run.written
        if isinstance(e, BackendError) or writer.run.generated:  # a server refusing from the start: nothing to say
            e.add_note(
                f"This call stored {writer.run.written} rows before the failure ({writer.run.generated} generated); "
                f"{writer.left_note()}."
            )
        raise
    except KeyboardInterrupt as e:
        e.add_note(
            f"judgestore: interrupted; the engine was stopped and what had finished was written: this call stored "
            f"{writer.run.written} rows ({writer.run.generated} generated); {writer.left_note()}"
        )
        raise


def _stream(writer: Writer, stream: Iterator[Arrival], missing: Sequence[PlannedInput], chunk_size: int) -> None:
    """Write a streaming backend's generations as they finish (see the module docstring).

    ``stream`` is the backend's, just returned: a local engine is taken, and every request added, when
    ``generate_stream`` returns, so the clock starts here and a call that waited for another's batch does not
    charge the wait to its rows.
    """
    pending: list[tuple[PlannedInput, Generation | Refusal]] = []
    seen: set[int] = set()
    last_write = time.monotonic()

    def take(arrival: Arrival) -> None:
        if arrival is not None:  # None: a heartbeat, nothing more finished yet
            index, outcome = arrival
            if index in seen or not 0 <= index < len(missing):
                raise BackendError(f"backend returned request index {index} twice or out of range")
            seen.add(index)
            pending.append((missing[index], outcome))

    try:
        try:
            for arrival in stream:
                take(arrival)
                if pending and (len(pending) >= chunk_size or time.monotonic() - last_write >= STREAM_FLUSH_SECONDS):
                    try:
                        writer.write(pending, time.monotonic() - last_write)
                    except JudgestoreError:
                        pending = []  # the store refused the write (full, locked): trying again would meet it too
                        raise
                    pending = []  # only once written: a write an interrupt cut short is done again below
                    last_write = time.monotonic()
        except KeyboardInterrupt:
            for arrival in _handed_over(stream):  # Ctrl-C outside the stream (a write): what it already holds
                take(arrival)
            raise
        finally:
            close = getattr(stream, "close", None)
            if callable(close):  # stops the engine's unfinished requests before the last write
                close()
    finally:
        # What finished before a failure or an interrupt was generated (or paid for): keep it. Rows of a write
        # cut short that reached the store are not written twice (policy ignore; replace rewrites the same rows).
        if pending:
            writer.write(pending, time.monotonic() - last_write)
    if len(seen) != len(missing):
        raise BackendError(f"backend returned {len(seen)} generations for {len(missing)} requests")


def _handed_over(stream: Iterator[Arrival]) -> Iterator[Arrival]:
    """What a stream the caller's Ctrl-C reached from outside it already holds (finished, not yet handed over).

    The interrupt is thrown into it at the point it waits, so it stops as it does for one that reaches it while it
    waits: no new request starts and it hands over what it holds, then raises it again. A stream the interrupt
    ended already (it reached it inside), or one that is no generator, hands over nothing.
    """
    throw = getattr(stream, "throw", None)
    if not callable(throw):
        return
    try:
        arrival = throw(KeyboardInterrupt())
        while True:
            yield arrival
            arrival = next(stream)
    except (KeyboardInterrupt, StopIteration):
        return


def _priced(done: Outcomes, seconds: float) -> list[tuple[PlannedInput, Generation | Refusal]]:
    """The generations of ``done`` with their shares of ``seconds`` (refusals cost nothing)."""
    answered = {i: outcome for i, (_, outcome) in enumerate(done) if isinstance(outcome, Generation)}
    result = list(done)
    for i, generation in zip(answered, priced(list(answered.values()), seconds), strict=True):
        result[i] = (done[i][0], generation)
    return result
