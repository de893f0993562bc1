"""Helpers shared by the benchmarks: deterministic rows, interleaved timing, tables.

Contract:

* :func:`completion_records` gives the same rows for the same seed, shaped by
  default like real evaluation traffic: rendered prompt 2-8 KB,
  completion 1-4 KB, an OpenAI-style ``top_logprobs`` object of about 1 KB in
  half the rows (nested small dicts, which is what makes decoding GC-heavy),
  ``usage`` in every row; the sizes and the logprobs can be changed. Input
  hashes really are the hashes of the rendered inputs.
* :func:`measure` runs the variants of one case interleaved call by call (A B,
  B A, ...), each sample preceded by untimed ``setup`` and a full
  ``gc.collect()`` and followed by untimed ``teardown``; the variant that
  opens a sample (the first call after that collection runs 10-20 % slower)
  takes turns, and where no variant has a state (lookups) one untimed call
  of it comes first; every call ends with
  a timed ``gc.collect(0)`` (what pausing the GC deferred is charged to whoever
  paused it), then an untimed ``check`` of its result where one is given. It
  keeps every sample, wall clock and process CPU time, per call.
* :func:`print_table` / :func:`environment` / :func:`write_json` print and save
  results (plain aligned text, or a Markdown table); ratios are always taken
  between variants measured in the same run.
"""

from __future__ import annotations

import gc
import os
import platform
import random
import re
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from store import Database, Settings
from store.backends.sqlite.rows import LOOKUP_BATCH
from store.descriptor import input_hash, render_messages
from store.tables.records import CompletionRecord, record_fields
from store.tables.row_checks import gc_paused

# ---------------------------------------------------------------- deterministic content

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sta", "ter", "vin", "or", "el", "qua", "dis", "pen", "tro", "ax")
_NON_ASCII = ("¿qué", "naïve", "Größe", "façade", "日本語", "データ", "🙂", "→", "ε", "Ω")


class TextPool:
    """A long deterministic pseudo-text; rows take slices of it at random offsets.

    About 1 word in 200 is non-ASCII (accents, CJK, an emoji), so most rows of
    a few KB hold some, as real prompts and completions do.
    """

    def __init__(self, seed: int, size: int = 1 << 21) -> None:
        rng = random.Random(seed)
        vocab = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(3000)]
        words: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(_NON_ASCII) if rng.random() < 0.005 else rng.choice(vocab)
            if rng.random() < 0.08:
                word += "." if rng.random() < 0.7 else ",\n"
            words.append(word)
            length += len(word) + 1
        self.text = " ".join(words)

    def take(self, rng: random.Random, length: int) -> str:
        start = rng.randrange(0, len(self.text) - length)
        return self.text[start : start + length]


def _top_logprobs(rng: random.Random, pool: TextPool, positions: int = 5) -> dict[str, Any]:
    """OpenAI-shaped logprobs, about 1 KB of JSON."""
    content = []
    for _ in range(positions):
        alternatives = [
            {"token": pool.take(rng, rng.randint(1, 6)), "logprob": round(-rng.expovariate(1.0), 6)} for _ in range(5)
        ]
        chosen = alternatives[0]
        content.append({"token": chosen["token"], "logprob": chosen["logprob"], "top_logprobs": alternatives})
    return {"content": content}


def completion_records(
    n: int,
    *,
    seed: int = 1,
    start: int = 0,
    model: str = "bench/model-1",
    benchmark_names: Sequence[str] = (),
    prompt_chars: tuple[int, int] = (2000, 8000),
    completion_chars: tuple[int, int] = (1000, 4000),
    logprobs: bool = True,
) -> list[CompletionRecord]:
    """``n`` distinct completion rows (row ``i`` is the same for a given seed and shape, whatever ``n``).

    By default each row is ~9 KB on average: rendered prompt 2-8 KB, completion
    1-4 KB, ``top_logprobs`` (~1 KB JSON) in odd rows, ``usage`` in every row.
    ``prompt_chars`` / ``completion_chars`` bound the rendered prompt and the
    completion (in characters, a few non-ASCII among them); ``logprobs=False``
    leaves ``top_logprobs`` out of every row.
    """
    pool = _pool(seed)
    benchmarks = tuple(benchmark_names) or ("mt-bench", "arena-hard", "alpaca-eval", "ifeval")
    base = datetime(2026, 1, 1, tzinfo=UTC)
    records = []
    for i in range(start, start + n):
        rng = random.Random(seed * 1_000_003 + i)
        system = pool.take(rng, rng.randint(40, 200))
        prompt_len = rng.randint(*prompt_chars) - len(system) - 60
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"#{i} " + pool.take(rng, max(prompt_len, 100))},
        ]
        rendered = render_messages(messages)
        completion = pool.take(rng, rng.randint(*completion_chars))
        prompt_tokens, completion_tokens = len(rendered) // 4, len(completion) // 4
        records.append(
            CompletionRecord(
                input_hash=input_hash(rendered),
                input_text=rendered,
                completion=completion,
                benchmark=benchmarks[i % len(benchmarks)],
                instruction_id=str(i),
                model=model,
                finish_reason="stop" if rng.random() < 0.9 else "length",
                usage={
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
                top_logprobs=_top_logprobs(rng, pool) if logprobs and i % 2 else None,
                run_id="bench-run",
                created_by="bench",
                created_at=base + timedelta(seconds=i, microseconds=rng.randrange(1_000_000)),
            )
        )
    return records


_POOLS: dict[int, TextPool] = {}


def _pool(seed: int) -> TextPool:
    if seed not in _POOLS:
        _POOLS[seed] = TextPool(seed)
    return _POOLS[seed]


def miss_hashes(n: int, *, salt: str = "miss") -> list[str]:
    """``n`` well-formed input hashes that no generated row has."""
    return [input_hash(f"{salt}-{i}") for i in range(n)]


def mean_row_bytes(records: Sequence[CompletionRecord]) -> float:
    """Average stored size of a row's text and JSON columns, in bytes."""
    total = 0
    for r in records:
        total += len(r.input_text.encode()) + len(r.completion.encode())
        for value in (r.usage, r.top_logprobs):
            if value is not None:
                total += len(orjson.dumps(value))
    return total / max(len(records), 1)


# ---------------------------------------------------------------- timing


@dataclass
class Variant:
    """One way of doing a case's work: ``run(setup())`` is timed, nothing else is.

    ``check(state, result)``, when given, runs untimed right after every call;
    the result is then dropped instead of being kept for ``teardown``, so a
    large result never stays alive (and in the way) during the other variants'
    calls. ``before(state)``, when given, runs untimed right before every call
    (``setup`` runs once a sample, before any variant's first call: what each
    call must start from, an emptied cache, belongs here).
    """

    name: str
    run: Callable[[Any], Any]
    setup: Callable[[], Any] = lambda: None
    teardown: Callable[[Any, Any], None] = lambda _state, _result: None
    check: Callable[[Any, Any], None] | None = None
    before: Callable[[Any], None] | None = None


@dataclass
class Timing:
    """Seconds per call of one variant: wall clock (the figure) and process CPU time (less sensitive to load)."""

    name: str
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_times)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "median_s": self.median,
            "cpu_median_s": self.cpu_median,
            "times_s": self.times,
            "cpu_times_s": self.cpu_times,
        }


def discard(_state: Any, _result: Any) -> None:
    """A ``check`` that checks nothing: the result is dropped right after its call, not kept until ``teardown``
    (a large result kept alive slows the calls of the variants after it)."""


def _call(variant: Variant, state: Any) -> tuple[float, float, Any]:
    """One timed call, wall and CPU seconds.

    The call ends with ``gc.collect(0)``: code that pauses the cyclic GC leaves
    its young objects to the next collection, and that work belongs to the
    variant that deferred it, not to whoever allocates next.
    """
    w0, c0 = time.perf_counter(), time.process_time()
    result = variant.run(state)
    gc.collect(0)
    return time.perf_counter() - w0, time.process_time() - c0, result


def _sample(variants: Sequence[Variant], inner: int) -> list[tuple[float, float]]:
    """One sample of every variant: ``inner`` calls each, interleaved call by call (A B, B A, ...).

    Interleaving single calls, not whole samples, puts the same background load
    on every variant, which matters on a small shared machine.
    """
    states = [v.setup() for v in variants]
    gc.collect()
    if all(state is None for state in states):
        # The first call after a full collection runs 10-20 % slower. Calls without a state (lookups) can be
        # repeated: one untimed call takes that on, so the variant opening the sample is timed as the others are.
        variants[0].run(None)
        gc.collect(0)
    totals = [[0.0, 0.0] for _ in variants]
    results: list[Any] = [None] * len(variants)
    for k in range(inner):
        order = range(len(variants)) if k % 2 == 0 else reversed(range(len(variants)))
        for i in order:
            before = variants[i].before
            if before is not None:
                before(states[i])
            wall, cpu, result = _call(variants[i], states[i])
            check = variants[i].check
            if check is not None:
                check(states[i], result)
                result = None
            results[i] = result
            del result
            totals[i][0] += wall
            totals[i][1] += cpu
    for v, state, result in zip(variants, states, results, strict=True):
        v.teardown(state, result)
    return [(wall / inner, cpu / inner) for wall, cpu in totals]


def sample_orders(k: int) -> list[list[int]]:
    """A Williams design over ``k`` variants: orders in which each opens equally often and each follows each
    other exactly once (``k`` orders for an even ``k``, ``2 k`` for an odd one).

    A call is slowed or sped up by the one before it (caches, the allocator, the GC's generations: a heavy peer
    made the next variant 10-15 % slower in bench/peers.py). Turning one order round left each variant with the
    same one or two predecessors in every sample, a bias of its own; this balances it over a full cycle.
    """
    first = [0]
    low, high = 1, k - 1
    while len(first) < k:  # 0, 1, k-1, 2, k-2, ...: every difference between neighbours occurs once
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    orders = [[(i + shift) % k for i in first] for shift in range(k)]
    if k % 2:  # an odd square balances only with its mirror
        orders += [order[::-1] for order in orders]
    return orders


def measure(variants: Sequence[Variant], reps: int, *, inner: int = 1, warmup: bool = True) -> dict[str, Timing]:
    """Time each variant in ``reps`` samples of ``inner`` calls (seconds per call), interleaved.

    Within a sample the calls alternate between variants. Sample ``r`` runs them in order ``r`` of
    :func:`sample_orders`, cycling: with ``reps`` a multiple of that design's length, every variant opens as
    many samples as the others and follows each other variant equally often (for 2 variants: A B, B A; for
    3: six orders). With ``inner == 1`` and a ``setup``, each call gets a fresh state (e.g. an empty database).
    """
    timings = {v.name: Timing(v.name) for v in variants}
    if warmup:
        _sample(variants, 1)
    orders = sample_orders(len(variants))
    for rep in range(reps):
        order = [variants[i] for i in orders[rep % len(orders)]]
        for v, (wall, cpu) in zip(order, _sample(order, inner), strict=True):
            timings[v.name].times.append(wall)
            timings[v.name].cpu_times.append(cpu)
    return timings


# ---------------------------------------------------------------- reporting


def _without_password(arg: str) -> str:
    """A command-line argument as a results file may keep it: a URL's ``user:password@`` shown ``user:***@``, its
    ``password=`` parameters ``password=***``."""
    if "://" not in arg or not arg.split("://", 1)[0].lower().startswith("postgres"):  # a store URL, the only kind
        return arg
    arg = re.sub(r"(://[^/?#:@]*):.*@", r"\1:***@", arg)  # to the last @: a password may hold / and @
    return re.sub(r"(password=)[^&]*", r"\1***", arg, flags=re.IGNORECASE)


def environment() -> dict[str, Any]:
    """Versions and machine facts worth printing beside any figure."""
    import sqlalchemy

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "orjson": orjson.__version__,
        "platform": platform.platform(),
        "cpus": cpus,
        "argv": [_without_password(arg) for arg in sys.argv[1:]],  # a --url's password never in a results file
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), markdown: bool = False
) -> None:
    """Plain aligned text, or a Markdown table with ``markdown`` (columns in ``right`` are right-aligned)."""
    if markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|")
        for row in rows:
            print("| " + " | ".join(str(c) for c in row) + " |")
        return
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


# ---------------------------------------------------------------- raw sqlite3: the physical limit

FIELDS = record_fields(CompletionRecord)
# The columns the raw code reads and writes, in its order (not the records' field order, which is the table's).
RAW_FIELDS = (
    "input_hash", "sample_index", "input_text", "completion", "benchmark", "instruction_id", "model", "finish_reason",
    "usage", "top_logprobs", "run_id", "created_by", "created_at", "adopted_from",
)  # fmt: skip
RAW_COLUMNS = ", ".join(RAW_FIELDS)
SELECT_BY_KEYS = f"SELECT {RAW_COLUMNS} FROM completions WHERE input_hash IN (SELECT value FROM json_each(?))"


def file_of(database: Database) -> Path:
    """The SQLite file of ``database`` (these benches use folder stores; a server's database has no file)."""
    from store.backends.sqlite.database import SqliteDatabase

    if not isinstance(database, SqliteDatabase):
        raise AssertionError(f"{database.location} is not an SQLite file")
    return database.path


def raw_connect(path: Path, settings: Settings) -> sqlite3.Connection:
    """A connection with judgestore's pragmas (WAL, synchronous=NORMAL, busy timeout, foreign keys)."""
    uri = f"file:{quote(str(path.resolve()))}?mode=rwc"
    conn = sqlite3.connect(uri, uri=True, timeout=settings.busy_timeout_ms / 1000, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(settings.busy_timeout_ms)}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_mode = wal")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def raw_get_many(conn: sqlite3.Connection, hashes: Sequence[str]) -> dict[str, CompletionRecord]:
    """The same result as ``Database.get_many``, with stdlib sqlite3 and orjson only."""
    keys = list(dict.fromkeys(hashes))
    found: dict[str, CompletionRecord] = {}
    loads, fromiso, utc, make = orjson.loads, datetime.fromisoformat, UTC, CompletionRecord
    with gc_paused():
        conn.execute("BEGIN")
        try:
            for start in range(0, len(keys), LOOKUP_BATCH):
                chunk = orjson.dumps(keys[start : start + LOOKUP_BATCH]).decode()
                for h, si, it, co, bm, ii, mo, fr, us, tl, ri, cb, ca, af in conn.execute(
                    SELECT_BY_KEYS, (chunk,)
                ).fetchall():
                    found[h] = make(
                        input_hash=h,
                        sample_index=si,
                        input_text=it,
                        completion=co,
                        benchmark=bm,
                        instruction_id=ii,
                        model=mo,
                        finish_reason=fr,
                        usage=None if us is None else loads(us),
                        top_logprobs=None if tl is None else loads(tl),
                        run_id=ri,
                        created_by=cb,
                        created_at=fromiso(ca).replace(tzinfo=utc),
                        adopted_from=af,
                    )
        finally:
            conn.execute("COMMIT")
    return found
