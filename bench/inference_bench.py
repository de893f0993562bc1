"""The cache boundary beside the floor of the same work: full hits (issue 3, "Benchmark") and cold misses (issue 22).

Usage::

    python bench/inference_bench.py [--quick] [--reps N] [--json out.json] [--only plan,cli,engine]

Three parts, each measured beside its floor in the same run:

* plan: a store holds N completion rows (~9 KB each, shaped like real
  traffic: rendered prompt 2-8 KB with some non-ASCII, completion 1-4 KB,
  ``top_logprobs`` ~1 KB of JSON in half the rows) whose input hashes really
  are ``input_hash(render_messages(messages))``; a batch of the same N chat
  requests is then planned, every one a hit.

  - ours, ``plan``: ``CachedModel(store, descriptor, ...).plan("completions",
    requests)``: render, hash and look up the batch (the store's engine is
    already open; the first, warm-up call opens it).
  - ours, ``complete``: ``CachedModel.complete(requests)``: the full-hit run a
    user makes, which also builds the Responses (kept by the caller).
  - floor, the same work with orjson, hashlib and stdlib sqlite3 only: per
    request ``orjson.dumps({"messages": messages, "type": "messages"},
    option=OPT_SORT_KEYS)`` then ``hashlib.sha256(...).hexdigest()``; the keys
    deduplicated; then ``SELECT <the 8 columns a hit returns> FROM
    completions WHERE input_hash IN (SELECT value FROM json_each(?))`` (the
    columns the lookup reads: the prompt and the row's bookkeeping,
    ``store.tables.deferred.DEFERRED_COLUMNS``, stay on disk) in batches of
    ``store.backends.sqlite.rows.LOOKUP_BATCH`` keys in one read transaction,
    ``fetchall``, and a ``dict[key, row tuple]`` with ``usage`` and
    ``top_logprobs`` decoded by ``orjson.loads``, built with the cyclic GC
    paused; the number of hits is returned and the rows dropped, as ``plan``
    drops its records. Same file, same pragmas (WAL, synchronous=NORMAL). Not
    included: validating the messages, ``CompletionRecord`` objects, the Plan.
  - floor + records: the floor reading every column, the prompt included, and
    building whole ``CompletionRecord`` objects (``created_at`` parsed), what
    ``Database.get_many(deferred=False)`` returns, as
    ``bench/store_bench.py``'s raw ``get_many`` does: more work than a hit
    does, shown beside for scale (ours under it is expected).

  - ours, hosted spec (10k requests): the same rows stored under a hosted
    model's descriptor (``HostedSpec(provider="vllm-server", ...)``), planned
    and completed through ``HostedSpec.cached()`` (issue 11). The plan is the
    same code, so the figures match the lines above; the check before timing
    also asserts that no client was made and ``openai`` was never imported.

  Every variant drops its result inside its own timing (``complete``'s
  Responses too, which is charged to ours).
  - The split, measured in a second interleaved series: render + hash (ours:
    ``inference.cache.plan.batch_keys``; floor: the dumps + sha256 loop) and lookup (ours:
    ``CachedModel._lookup`` of the rendered keys, i.e. ``Store.find`` +
    ``Database.get_many``; floor: the query loop above, with and without
    records).

  Before timing, every key and every row of ours is checked against the floor.

* cli: the tiny model is built into a temporary folder, 16 chat prompts are
  written as JSONL, and ``judgestore generate --model DIR --task bench -i
  prompts -o out --json --temperature 0 --max-tokens 16`` (the engine args of
  ``tests/inference/conftest.py`` as ``--engine-arg k=v``, its ``VLLM_ENV`` in
  the environment) runs in a fresh store: once with nothing stored (vLLM
  import, engine build, generation), then nine times full-hit (five with
  ``--quick``). Beside them:
  ``judgestore --help`` (the interpreter plus the command line's imports: the
  floor of any run) and ``python -c pass``. Wall time is measured around the
  subprocess; ``wall_seconds`` is the command's own summary (from the start of
  its work, after its imports). One more full-hit run under ``python -X
  importtime`` gives where its import time goes, by package, and checks that
  vLLM, torch, transformers, pandas, pyarrow, the Hub client, Alembic,
  psycopg and ``openai`` are never imported.

* engine: the tiny model in one vLLM engine (the engine kwargs of
  ``tests/inference/conftest.py`` with ``max_num_seqs=256``), greedy, 16
  tokens; 512 chat prompts; measured twice, with the engine core in this
  process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the tests' setting) and in
  a process of its own (vLLM's default: it computes while this process plans
  and writes; its CPU time and scheduler are then out of sight, so that table
  has no CPU ratio nor peaks). Interleaved, on each engine:

  - ours, cold: ``CachedModel(Store(fresh folder), ...).complete(prompts)``:
    every prompt a miss; plan, every miss added to the engine at once, the
    database created, rows written every ``chunk_size`` (64) as they finish,
    the ``runs`` row.
  - floor, plain: ``LLM.chat(the same rendered chats, one SamplingParams
    per sample index)`` over the whole batch, as a script without a cache
    would.
  - beside them: ours with the database already created (untimed; the batch
    still all misses), ours without a store (mode ``off``: the plan and the
    stream, nothing written; a cold run's time over this one is the
    store's), and ours through a backend without
    streaming, which the cache sends 64 misses at a time (judgestore before
    issue 22).

  One more untimed call of each runs under a wrapped
  ``Scheduler.schedule`` and, on the engine in this process, records the
  most requests vLLM's scheduler held (running + waiting) and ran at once;
  the texts of all of them must be equal.

Targets: the plan within 1.2x of the floor; a full-hit CLI run under 0.6 s,
never loading the engine nor importing vLLM (nor the other packages above);
a cold run of the engine part within 1.05x of the plain ``LLM.chat``.
PASS/MISS is printed; the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/inference_bench.py` from anywhere

from bench.common import (  # noqa: E402
    RAW_FIELDS,
    Timing,
    Variant,
    completion_records,
    environment,
    file_of,
    format_seconds,
    gc_paused,
    mean_row_bytes,
    measure,
    print_table,
    raw_connect,
    raw_get_many,
    write_json,
)
from inference.backends.base import Backend  # noqa: E402
from inference.cache.model import CachedModel, Responses  # noqa: E402
from inference.cache.plan import batch_keys  # noqa: E402
from inference.requests import CompletionRequest  # noqa: E402
from inference.spec import HostedSpec  # noqa: E402
from store import Settings, Store  # noqa: E402
from store.backends.sqlite.rows import LOOKUP_BATCH  # noqa: E402
from store.descriptor import ModelDescriptor  # noqa: E402
from store.roles import Role  # noqa: E402
from store.tables.deferred import DEFERRED_COLUMNS  # noqa: E402
from store.tables.records import CompletionRecord  # noqa: E402

TARGET = 1.2
ROLE: Role = "completions"
TASK = "bench"
CLI_PROMPTS = 16
CLI_HIT_RUNS = 9
CLI_TARGET_S = 0.6  # a full-hit `judgestore generate`, whole process, on the 2-core machine (issue 13)
# Top-level packages shown on their own in the import breakdown; the rest is "other".
IMPORT_GROUPS = {
    "sqlalchemy": ("sqlalchemy",),
    "pydantic": ("pydantic", "pydantic_core", "pydantic_settings", "annotated_types", "typing_inspection", "dotenv"),
    "typer": ("typer", "click", "shellingham"),
    "rich": ("rich", "markdown_it", "mdurl", "pygments"),
    "judgestore (store, inference)": ("store", "inference"),
}
HOSTED_MAX_REQUESTS = 10_000  # the hosted spec's full hit is measured at this size (its rows are stored twice)
ENGINE_PROMPTS = 512
ENGINE_MAX_NUM_SEQS = 256
ENGINE_SAMPLING = {"temperature": 0, "max_tokens": 16}
ENGINE_TARGET = 1.05  # a cold generate of ENGINE_PROMPTS beside a plain LLM.chat of the whole batch (issue 22)
COLD, PLAIN = "judgestore, cold (whole batch)", "plain LLM.chat"
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"  # 1 (vLLM's default): the engine core runs in its own process


@dataclass
class Sizes:
    plan: tuple[tuple[int, int, int], ...]  # (requests, repetitions, calls per repetition)
    cli_hit_runs: int
    engine_reps: int


FULL = Sizes(plan=((10_000, 5, 3), (100_000, 3, 1)), cli_hit_runs=CLI_HIT_RUNS, engine_reps=10)
QUICK = Sizes(plan=((10_000, 3, 1),), cli_hit_runs=5, engine_reps=3)


@dataclass
class Result:
    case: str
    ours: Timing
    floor: Timing
    requests: int
    targeted: bool  # the 1.2x target applies to this line
    records_floor: Timing  # the floor building what get_many builds (records, parsed created_at)

    @property
    def ratio(self) -> float:
        return self.ours.median / self.floor.median

    @property
    def cpu_ratio(self) -> float:
        return self.ours.cpu_median / self.floor.cpu_median

    @property
    def records_ratio(self) -> float:
        return self.ours.median / self.records_floor.median

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "requests": self.requests,
            "ours": self.ours.as_dict(),
            "floor": self.floor.as_dict(),
            "floor_with_records": self.records_floor.as_dict(),
            "ratio": self.ratio,
            "ratio_to_floor_with_records": self.records_ratio,
            "cpu_ratio": self.cpu_ratio,
            "target": TARGET if self.targeted else None,
            "pass": self.ratio <= TARGET if self.targeted else None,
        }


@dataclass
class CliRun:
    name: str
    walls: list[float] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    def summary_median(self, key: str) -> float | None:
        values = [s[key] for s in self.summaries if key in s]
        return statistics.median(values) if values else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "median_wall_s": self.wall, "walls_s": self.walls, "summaries": self.summaries}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def floor_keys(batch: Sequence[list[dict[str, str]]]) -> list[str]:
    """Render and hash every request: canonical JSON by orjson, SHA-256 by hashlib."""
    dumps, sha256, sort_keys = orjson.dumps, hashlib.sha256, orjson.OPT_SORT_KEYS
    return [sha256(dumps({"messages": m, "type": "messages"}, option=sort_keys)).hexdigest() for m in batch]


# What a hit returns: the columns the lookup reads (the prompt and the row's bookkeeping stay on disk until asked for)
HIT_FIELDS = tuple(name for name in RAW_FIELDS if name not in DEFERRED_COLUMNS)
SELECT_HITS = f"SELECT {', '.join(HIT_FIELDS)} FROM completions WHERE input_hash IN (SELECT value FROM json_each(?))"
JSON_AT = tuple(HIT_FIELDS.index(name) for name in ("usage", "top_logprobs"))


def floor_rows(conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """Look the keys up in batches of LOOKUP_BATCH; the columns a hit returns (HIT_FIELDS), JSON decoded."""
    unique = list(dict.fromkeys(keys))
    found: dict[str, tuple[Any, ...]] = {}
    loads = orjson.loads
    with gc_paused():
        conn.execute("BEGIN")
        try:
            for start in range(0, len(unique), LOOKUP_BATCH):
                chunk = orjson.dumps(unique[start : start + LOOKUP_BATCH]).decode()
                for row in conn.execute(SELECT_HITS, (chunk,)).fetchall():
                    values = list(row)
                    for at in JSON_AT:
                        if values[at] is not None:
                            values[at] = loads(values[at])
                    found[row[0]] = tuple(values)
        finally:
            conn.execute("COMMIT")
    return found


def floor_plan(conn: sqlite3.Connection, batch: Sequence[list[dict[str, str]]]) -> int:
    """The floor of ``plan``: keys, lookup, the number of hits (the rows are dropped, as plan drops its records)."""
    return len(floor_rows(conn, floor_keys(batch)))


def floor_plan_records(conn: sqlite3.Connection, batch: Sequence[list[dict[str, str]]]) -> int:
    """:func:`floor_plan` building what ``get_many`` builds (records, parsed ``created_at``)."""
    return len(raw_get_many(conn, floor_keys(batch)))


# ---------------------------------------------------------------- plan


class EngineCalled(AssertionError):
    pass


def no_engine() -> Backend:
    raise EngineCalled("a full-hit batch asked for the engine")


def messages_of(record: CompletionRecord) -> list[dict[str, str]]:
    """The chat a caller would pass: role first, as users write it (the rendered form sorts keys)."""
    return [{"role": m["role"], "content": m["content"]} for m in orjson.loads(record.input_text)["messages"]]


class PlanBench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.settings = Settings(store_root=workdir / "unused", run_id="bench-run", created_by="bench")
        self.descriptor = ModelDescriptor(provider="bench", model="bench/model-1")
        self.results: list[Result] = []
        self.notes: list[str] = []

    def run(self, n: int, reps: int, inner: int) -> None:
        t0 = time.perf_counter()
        records = completion_records(n)
        if not self.results:
            self.notes.append(
                f"rows: {mean_row_bytes(records[:5_000]) / 1e3:.1f} KB on average (rendered prompt 2-8 KB, "
                "completion 1-4 KB, top_logprobs ~1.2 KB JSON in half the rows)"
            )
        root = self.workdir / f"store-{n}"
        store = Store(self.settings, root=root)
        db = store.database(ROLE, TASK, self.descriptor)
        path = file_of(db)
        for start in range(0, n, 10_000):
            db.put_many(records[start : start + 10_000])
        with closing(sqlite3.connect(path, isolation_level=None)) as checkpoint:  # outside any transaction
            checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        batch = [messages_of(r) for r in records]
        requests = [
            CompletionRequest(messages=m, benchmark=r.benchmark, instruction_id=r.instruction_id)
            for m, r in zip(batch, records, strict=True)
        ]
        log(
            f"plan {n:,}: store of {n:,} rows ({path.stat().st_size / 1e6:,.0f} MB) built in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        cached = CachedModel(store, self.descriptor, task=TASK, backend_factory=no_engine)
        # The same rows under a hosted model's descriptor, planned through HostedSpec.cached():
        # the plan is the same code, so a full hit costs the same and never makes a client.
        hosted = None
        if n <= HOSTED_MAX_REQUESTS:
            spec = HostedSpec(model="bench-judge", provider="vllm-server", base_url="http://judge.invalid:8000/v1")
            hosted_db = store.database(ROLE, TASK, spec.descriptor)
            for start in range(0, n, 10_000):
                hosted_db.put_many(records[start : start + 10_000])
            hosted = spec.cached(store, task=TASK)
        raw = raw_connect(path, self.settings)
        try:
            inputs = self._check(cached, raw, requests, batch, records)
            if hosted is not None:
                self._check_hosted(hosted, requests, records)
            del records
            gc.collect()
            keys = list(inputs)
            log(f"  timing {n:,} requests: {reps} interleaved repetitions of {inner} calls, then the split")
            hosted_variants = []
            if hosted is not None:
                model = hosted
                hosted_variants = [
                    Variant("hosted plan", lambda _s: model.plan(ROLE, requests).hits),
                    Variant("hosted complete", lambda _s: len(model.complete(requests))),
                ]
            whole = measure(
                [
                    Variant("ours plan", lambda _s: cached.plan(ROLE, requests).hits),
                    Variant("ours complete", lambda _s: len(cached.complete(requests))),
                    *hosted_variants,
                    Variant("floor", lambda _s: floor_plan(raw, batch)),
                    Variant("floor + records", lambda _s: floor_plan_records(raw, batch)),
                ],
                reps,
                inner=inner,
            )
            split = measure(
                [
                    Variant(
                        "ours render+hash", lambda _s: len(batch_keys(ROLE, requests, cached.descriptor.input_mode)[1])
                    ),
                    Variant("floor render+hash", lambda _s: len(floor_keys(batch))),
                    Variant("ours lookup", lambda _s: len(cached._lookup(ROLE, inputs))),
                    Variant("floor lookup", lambda _s: len(floor_rows(raw, keys))),
                    Variant("floor lookup + records", lambda _s: len(raw_get_many(raw, keys))),
                ],
                reps,
                inner=inner,
            )
        finally:
            raw.close()
            store.close()
            shutil.rmtree(root, ignore_errors=True)
        floor, records_floor = whole["floor"], whole["floor + records"]
        self.results += [
            Result(f"plan, {n:,} requests", whole["ours plan"], floor, n, True, records_floor),
            Result(f"complete, {n:,} requests", whole["ours complete"], floor, n, False, records_floor),
        ]
        if hosted is not None:
            self.results += [
                Result(f"plan, hosted spec, {n:,}", whole["hosted plan"], floor, n, True, records_floor),
                Result(f"complete, hosted spec, {n:,}", whole["hosted complete"], floor, n, False, records_floor),
            ]
        self.results += [
            Result(
                "  render + hash",
                split["ours render+hash"],
                split["floor render+hash"],
                n,
                False,
                split["floor render+hash"],
            ),
            Result("  lookup", split["ours lookup"], split["floor lookup"], n, False, split["floor lookup + records"]),
        ]

    def _check_hosted(self, hosted: CachedModel, requests: list[CompletionRequest], records: list[Any]) -> None:
        """A full hit through HostedSpec.cached(): every request from the store, no client made, openai not imported."""
        responses = hosted.complete(requests)
        if not all(r.cached for r in responses) or hosted.engine_loaded or "openai" in sys.modules:
            raise AssertionError("a full-hit batch of the hosted spec did not come only from the store")
        if [r.text for r in responses] != [r.completion for r in records]:
            raise AssertionError("the hosted spec returned other texts than the stored ones")

    def _check(
        self,
        cached: CachedModel,
        raw: sqlite3.Connection,
        requests: list[CompletionRequest],
        batch: list[list[dict[str, str]]],
        records: list[CompletionRecord],
    ) -> dict[str, Any]:
        """Ours and the floor compute the same keys and rows, every request is a hit, no engine is asked for."""
        n = len(requests)
        plan = cached.plan(ROLE, requests)
        if (plan.hits, plan.misses, plan.duplicates, plan.requested) != (n, 0, 0, n):
            raise AssertionError(f"not a full hit: {plan.summary()}")
        responses = cached.complete(requests)
        if not all(r.cached for r in responses) or cached.engine_loaded or cached.last.engine_loaded:
            raise AssertionError("complete() of a full-hit batch did not come only from the store")
        if [r.text for r in responses] != [r.completion for r in records]:
            raise AssertionError("complete() returned other texts than the stored ones")
        _, inputs = batch_keys(ROLE, requests, cached.descriptor.input_mode)
        keys = floor_keys(batch)
        if keys != list(inputs) or keys != [r.input_hash for r in records]:
            raise AssertionError("the floor's keys differ from judgestore's input hashes")
        ours, rows = cached._lookup(ROLE, inputs), floor_rows(raw, keys)
        if ours.keys() != rows.keys() or len(rows) != n:
            raise AssertionError("the floor found other rows than judgestore")
        for key, record in ours.items():
            row = rows[key]
            if tuple(getattr(record, name) for name in HIT_FIELDS) != row:
                raise AssertionError(f"the floor's row {key[:16]} differs from judgestore's record")
        del ours, rows, responses
        return inputs


# ---------------------------------------------------------------- cli


def judgestore_command() -> list[str]:
    script = Path(sys.executable).parent / "judgestore"
    if not script.exists():
        script = REPO_ROOT / ".venv" / "bin" / "judgestore"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from inference.cli import main; main()"]


def cli_prompts(path: Path, n: int) -> None:
    topics = ("a joke", "a fact", "a story", "the weather", "a poem", "naïve Größe", "日本語", "a riddle")
    rows = [
        {
            "benchmark": "bench",
            "instruction_id": str(i),
            "messages": [{"role": "user", "content": f"Tell me {topics[i % len(topics)]}, number {i}."}],
        }
        for i in range(n)
    ]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


@dataclass
class ImportBreakdown:
    """Where a full-hit command's import time goes: ``python -X importtime`` self times summed by package."""

    groups: dict[str, float]  # seconds per group, largest first; "stdlib" and "other" last
    modules: int
    kept_out: dict[str, bool]  # each package tests/test_cli_start.py keeps out of a start: True if not imported

    @property
    def total(self) -> float:
        return sum(self.groups.values())

    def as_dict(self) -> dict[str, Any]:
        return {"seconds_by_group": self.groups, "modules": self.modules, "not_imported": self.kept_out}


def import_breakdown(generate: list[str], out: Path, env: dict[str, str], cwd: Path) -> ImportBreakdown:
    """Run the full-hit ``generate`` once more under ``-X importtime`` and add up its modules' self times.

    Self times add up without counting a module twice (a cumulative time
    includes the children that other lines show too). The import time it
    prints includes its own overhead, so the total is a little above the
    imports' share of a timed run.
    """
    script = [sys.executable, "-X", "importtime", "-c", "from inference.cli import main; main()"]
    args = generate[generate.index("generate") :]
    result = subprocess.run([*script, *args, "-o", str(out)], cwd=cwd, env=env, capture_output=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"the -X importtime run failed ({result.returncode}): {result.stderr.decode()[-3000:]}")
    from tests.test_cli_start import HEAVY  # one list of what starting the command line never imports

    group_of = {package: name for name, packages in IMPORT_GROUPS.items() for package in packages}
    seconds: dict[str, float] = {}
    imported: list[str] = []  # the top-level package of every module imported
    for line in result.stderr.decode().splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        top = name.split(".")[0]
        imported.append(top)
        group = group_of.get(top) or ("stdlib" if top in sys.stdlib_module_names or top.startswith("_") else "other")
        seconds[group] = seconds.get(group, 0.0) + int(self_us) / 1e6
    tail = {k: seconds.pop(k) for k in ("stdlib", "other") if k in seconds}
    groups = dict(sorted(seconds.items(), key=lambda kv: -kv[1])) | tail
    return ImportBreakdown(groups, len(imported), {p: p not in imported for p in HEAVY})


class CliBench:
    def __init__(self, workdir: Path, hit_runs: int) -> None:
        self.workdir = workdir
        self.hit_runs = hit_runs
        self.runs: dict[str, CliRun] = {}
        self.imports: ImportBreakdown | None = None
        self.notes: list[str] = []

    def run(self) -> None:
        from inference.backends.vllm.tiny_model import build_tiny_model
        from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV

        model = build_tiny_model(self.workdir / "tiny-llama", seed=0)
        prompts = self.workdir / "prompts.jsonl"
        cli_prompts(prompts, CLI_PROMPTS)
        root = self.workdir / "cli-store"
        engine_args = [
            a for k, v in TINY_ENGINE_KWARGS.items() for a in ("--engine-arg", f"{k}={orjson.dumps(v).decode()}")
        ]
        env = {**os.environ, **VLLM_ENV}
        env.pop("JUDGESTORE_STORE_ROOT", None)
        command = judgestore_command()
        generate = [
            *command, "generate", "--model", str(model), "--task", "bench", "-i", str(prompts),
            "--json", "--temperature", "0", "--max-tokens", "16", "--store-root", str(root), *engine_args,
        ]  # fmt: skip
        self.notes.append(f"cli: {CLI_PROMPTS} prompts; command: {' '.join(generate[: len(command) + 1])} ...")
        outputs: list[bytes] = []

        def timed(name: str, args: list[str], out: Path | None = None) -> None:
            t0 = time.perf_counter()
            result = subprocess.run(
                [*args, *(("-o", str(out)) if out else ())],
                cwd=self.workdir,
                env=env,
                capture_output=True,
                timeout=1800,
            )
            wall = time.perf_counter() - t0
            if result.returncode != 0:
                raise RuntimeError(f"{name} failed ({result.returncode}): {result.stderr.decode()[-3000:]}")
            run = self.runs.setdefault(name, CliRun(name))
            run.walls.append(wall)
            if out is not None:
                run.summaries.append(orjson.loads(result.stdout))
                outputs.append(out.read_bytes())
            log(f"  {name}: {wall:.2f} s")

        log("cli: first run (nothing stored: vLLM import, engine build, generation)")
        timed("generate, first run (miss)", generate, self.workdir / "out-0.jsonl")
        for k in range(self.hit_runs):
            timed("generate, full hit", generate, self.workdir / f"out-{k + 1}.jsonl")
            timed("judgestore --help", [*command, "--help"])
            timed("python -c pass", [sys.executable, "-c", "pass"])
        self.imports = import_breakdown(generate, self.workdir / "out-importtime.jsonl", env, self.workdir)
        first = [orjson.loads(line) for line in outputs[0].splitlines()]
        for later in outputs[1:]:
            lines = [orjson.loads(line) for line in later.splitlines()]
            if [x.get("text") for x in lines] != [x.get("text") for x in first]:
                raise AssertionError("a full-hit run returned other texts than the first run")
        self._check()

    def _check(self) -> None:
        miss = self.runs["generate, first run (miss)"].summaries[0]
        if (miss["misses"], miss["engine_loaded"], miss["vllm_imported"]) != (CLI_PROMPTS, True, True):
            raise AssertionError(f"the first run was not a miss that loaded the engine: {miss}")
        for s in self.runs["generate, full hit"].summaries:
            if (s["hits"], s["misses"], s["engine_loaded"], s["vllm_imported"]) != (CLI_PROMPTS, 0, False, False):
                raise AssertionError(f"a full-hit run was not served from the store alone: {s}")


# ---------------------------------------------------------------- engine


@contextmanager
def environment_set(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` inside the block; each variable as it was after it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Chunked:
    """The engine without streaming: the cache sends it ``chunk_size`` misses at a time (judgestore before issue 22)."""

    def __init__(self, view: Any) -> None:
        self.view = view

    def generate(self, requests: Sequence[Any]) -> Any:
        return self.view.generate(requests)

    def close(self) -> None:
        pass


@dataclass
class Peaks:
    held: int = 0  # running + waiting in vLLM's scheduler
    running: int = 0


@dataclass(frozen=True)
class EngineCase:
    """What the engine part runs: the engine kwargs, the sampling and the prompts (the model is given apart)."""

    engine_kwargs: dict[str, Any]
    sampling: dict[str, Any]
    requests: list[CompletionRequest]
    env: dict[str, str]  # set before vLLM is imported: it reads some of them once
    # Raise unless every variant generated the same texts. On this CPU (float32) they are bit-identical; on a GPU
    # in half precision a batch of other shape may round one logit the other way, so there they are only counted.
    same_texts: bool = True
    beside: bool = True  # also time the variants beside (the database already created, 64 at a time)


def tiny_case() -> EngineCase:
    """The tiny model's case: ENGINE_PROMPTS short chats, 16 greedy tokens, the tests' engine kwargs."""
    from tests.inference.conftest import TINY_ENGINE_KWARGS, VLLM_ENV

    requests = [
        CompletionRequest(messages=[{"role": "user", "content": f"Tell me about {i % 13}, number {i}."}])
        for i in range(ENGINE_PROMPTS)
    ]
    return EngineCase({**TINY_ENGINE_KWARGS, "max_num_seqs": ENGINE_MAX_NUM_SEQS}, ENGINE_SAMPLING, requests, VLLM_ENV)


class EngineBench:
    """A cold ``complete`` of a case's misses beside a plain ``LLM.chat`` of the same batch on the same engine.

    Without ``model_dir`` the tiny model is built and :func:`tiny_case` runs; ``bench/gpu_bench.py`` gives a
    larger model and its own case. ``warmup=False`` lets the untimed check calls stand as the warm-up;
    ``budget_s`` (seconds from the first check call) lowers the repetitions, to one at least, so that they fit
    by the check calls' durations.
    """

    def __init__(
        self,
        workdir: Path,
        reps: int,
        *,
        model_dir: Path | None = None,
        case: EngineCase | None = None,
        warmup: bool = True,
        budget_s: float | None = None,
        own_process: bool = False,
    ) -> None:
        self.workdir = workdir
        self.reps = reps
        # The engine core in a process of its own (vLLM's default), not in this one (the tests' setting): the
        # scheduler is then out of sight (no peaks) and this process's CPU time leaves the engine's out.
        self.own_process = own_process
        self.model_dir = model_dir
        self.case = case
        self.warmup = warmup
        self.budget_s = budget_s  # fewer repetitions if the check calls say ``reps`` would not fit in it
        self.check_seconds: dict[str, float] = {}  # each variant's untimed check call
        self.timings: dict[str, Timing] = {}
        self.peaks: dict[str, Peaks] = {}
        self.tokens: dict[str, int] = {}  # tokens generated by each variant's check call
        self.same_texts: dict[str, int] = {}  # each variant's texts equal to the plain call's, in its check call
        self.build_seconds = 0.0
        self.notes: list[str] = []

    def run(self) -> None:
        case = self.case or tiny_case()
        os.environ.update(case.env)
        from inference.backends.vllm.backend import create_vllm_backend
        from inference.backends.vllm.descriptor import descriptor_from_vllm
        from inference.backends.vllm.tiny_model import build_tiny_model

        model_dir = self.model_dir or build_tiny_model(self.workdir / "engine-tiny-llama", seed=0)
        descriptor = descriptor_from_vllm(str(model_dir), engine_kwargs=case.engine_kwargs, sampling=case.sampling)
        self.notes.append(
            f"engine ({self.placement}): {len(case.requests)} chat prompts, the model in {model_dir}, sampling "
            f"{case.sampling}, engine kwargs {case.engine_kwargs}; each judgestore call is cold (a fresh store); "
            "plain = LLM.chat(all prompts, one SamplingParams per sample index) on the same engine; every call "
            "starts with vLLM's prefix cache emptied"
        )
        t0 = time.perf_counter()
        # vLLM reads the variable when it builds an engine: set for this one only.
        with environment_set({MULTIPROCESSING: "1" if self.own_process else "0"}):
            backend = create_vllm_backend(descriptor, case.engine_kwargs, model=str(model_dir))
        self.build_seconds = time.perf_counter() - t0
        log(f"engine ({self.placement}): built in {self.build_seconds:.1f} s; {len(case.requests)} prompts")
        try:
            self._measure(backend, descriptor, case)
        finally:
            backend.close()

    @property
    def placement(self) -> str:
        return "engine core in its own process" if self.own_process else "engine core in this process"

    def _measure(self, backend: Any, descriptor: ModelDescriptor, case: EngineCase) -> None:
        from inference.cache.rows import engine_request

        requests = case.requests
        stores: list[Path] = []

        def empty_prefix_cache(_state: Any = None) -> None:
            """Every call starts without the prompts in vLLM's prefix cache (on by default): the variants share
            one engine and one batch, so a call would otherwise find the prompts the call before it computed."""
            if not backend._llm.reset_prefix_cache():
                raise AssertionError("vLLM did not empty its prefix cache between calls")

        def views(chunked: bool = False) -> Callable[[], Backend]:
            def factory() -> Backend:
                view = backend.with_descriptor(descriptor)
                return Chunked(view) if chunked else view

            return factory

        def cold(chunked: bool = False, database: bool = False) -> Callable[[], CachedModel]:
            """A fresh store (every prompt a miss); with ``database``, its database already created (untimed)."""

            def setup() -> CachedModel:
                root = self.workdir / f"engine-store-{len(stores)}"
                stores.append(root)
                settings = Settings(store_root=root, run_id="bench-run", created_by="bench")
                store = Store(settings, root=root)
                if database:
                    store.database(ROLE, TASK, descriptor)
                return CachedModel(store, descriptor, task=TASK, backend_factory=views(chunked))

            return setup

        def teardown(model: CachedModel, _result: Any) -> None:
            if model.store is not None:
                model.store.close()

        missing = (
            CachedModel(None, descriptor, task=TASK, mode="off", backend_factory=no_engine).plan(ROLE, requests).missing
        )
        engine_requests = [engine_request(inp) for inp in missing]
        messages = [r.rendered["messages"] for r in engine_requests]

        def plain(_state: Any) -> list[Any]:
            params = backend._batch_params(engine_requests)  # built per call, as ours is: one per sample index
            return backend._llm.chat(messages, params, use_tqdm=False)  # type: ignore[no-any-return]

        def check(model: CachedModel, result: Any) -> None:
            run = model.last
            written = len(requests) if model.store is not None else 0
            if (run.generated, run.written, len(result)) != (len(requests), written, len(requests)):
                raise AssertionError(f"a cold run did not generate (and write) every prompt: {run.generated}")

        def storeless() -> CachedModel:
            return CachedModel(None, descriptor, task=TASK, mode="off", backend_factory=views())

        def complete(model: CachedModel) -> Responses:
            return model.complete(requests)

        variants = [
            Variant(COLD, complete, cold(), teardown, check, empty_prefix_cache),
            Variant(PLAIN, plain, before=empty_prefix_cache),
        ]
        if case.beside:
            variants += [
                Variant(name, complete, setup, teardown, check, empty_prefix_cache)
                for name, setup in (
                    ("  the database already created", cold(database=True)),
                    ("  no store (mode off)", storeless),
                    ("  64 at a time (before)", cold(chunked=True)),
                )
            ]
        started = time.perf_counter()
        self._check(variants, case.same_texts)
        if self.budget_s is not None:
            round_s = sum(self.check_seconds.values())
            left = self.budget_s - (time.perf_counter() - started) - (round_s if self.warmup else 0.0)
            self.reps = max(1, min(self.reps, int(left / round_s)))
        self.timings = measure(variants, self.reps, warmup=self.warmup)
        for root in stores:
            shutil.rmtree(root, ignore_errors=True)

    def _check(self, variants: list[Variant], same_texts: bool) -> None:
        """Untimed: one call of each under a recording scheduler (peaks, tokens), and the texts compared."""
        from vllm.v1.core.sched.scheduler import Scheduler

        schedule = Scheduler.schedule
        texts: dict[str, list[str]] = {}
        for variant in variants:
            peaks = self.peaks[variant.name] = Peaks()

            def recording(sched: Any, *args: Any, _peaks: Peaks = peaks, **kwargs: Any) -> Any:
                _peaks.held = max(_peaks.held, len(sched.running) + len(sched.waiting))
                output = schedule(sched, *args, **kwargs)
                _peaks.running = max(_peaks.running, len(sched.running))
                return output

            Scheduler.schedule = recording  # type: ignore[method-assign,assignment]
            try:
                state = variant.setup()
                if variant.before is not None:
                    variant.before(state)
                t0 = time.perf_counter()
                result = variant.run(state)
                self.check_seconds[variant.name] = time.perf_counter() - t0
                if isinstance(result, Responses):
                    texts[variant.name] = [r.text for r in result]
                    self.tokens[variant.name] = state.last.spent.completion_tokens
                else:  # the plain call's RequestOutputs, in request order
                    texts[variant.name] = [o.outputs[0].text for o in result]
                    self.tokens[variant.name] = sum(len(o.outputs[0].token_ids) for o in result)
                variant.teardown(state, result)
            finally:
                Scheduler.schedule = schedule  # type: ignore[method-assign]
        reference = texts[PLAIN]
        for name, other in texts.items():
            self.same_texts[name] = sum(a == b for a, b in zip(reference, other, strict=True))
        if same_texts and any(count != len(reference) for count in self.same_texts.values()):
            raise AssertionError("judgestore and the plain LLM.chat generated other texts")


# ---------------------------------------------------------------- report


def report_plan(results: Sequence[Result]) -> None:
    headers = [
        "case",
        "judgestore",
        "floor",
        "ratio",
        "1.2x",
        "CPU ratio",
        "per request (ours / floor)",
        "floor + records",
        "ratio to it",
    ]
    rows = []
    for r in results:
        per = f"{format_seconds(r.ours.median / r.requests)} / {format_seconds(r.floor.median / r.requests)}"
        verdict = ("PASS" if r.ratio <= TARGET else "MISS") if r.targeted else ""
        same = r.records_floor is r.floor
        rows.append(
            [
                r.case,
                format_seconds(r.ours.median),
                format_seconds(r.floor.median),
                f"{r.ratio:.2f}x",
                verdict,
                f"{r.cpu_ratio:.2f}x",
                per,
                "" if same else format_seconds(r.records_floor.median),
                "" if same else f"{r.records_ratio:.2f}x",
            ]
        )
    print()
    print_table(headers, rows, right=(1, 2, 3, 5, 7, 8))


def report_cli(runs: dict[str, CliRun], imports: ImportBreakdown | None) -> None:
    miss = runs["generate, first run (miss)"]
    headers = ["run", "wall (median)", "summary wall_seconds", "engine_loaded", "vllm_imported", "vs first run"]
    rows = []
    for run in runs.values():
        inner = run.summary_median("wall_seconds")
        flags = {k: sorted({str(s[k]) for s in run.summaries}) for k in ("engine_loaded", "vllm_imported")}
        rows.append(
            [
                f"{run.name} (x{len(run.walls)})",
                format_seconds(run.wall),
                "" if inner is None else format_seconds(inner),
                ",".join(flags["engine_loaded"]) or "-",
                ",".join(flags["vllm_imported"]) or "-",
                f"{run.wall / miss.wall:.3f}x",
            ]
        )
    print()
    print_table(headers, rows, right=(1, 2, 5))
    hit, help_ = runs["generate, full hit"], runs["judgestore --help"]
    loaded = any(s["engine_loaded"] or s["vllm_imported"] for s in hit.summaries)
    print(
        f"\nfull hit: {hit.wall / miss.wall:.3f}x of the first run; {hit.wall - help_.wall:+.2f} s beside "
        f"`judgestore --help` ({hit.wall / help_.wall:.2f}x); engine start paid by a full hit: "
        f"{'YES (MISS)' if loaded else 'never (PASS)'}; under {CLI_TARGET_S} s: "
        f"{'PASS' if hit.wall < CLI_TARGET_S else 'MISS'} ({format_seconds(hit.wall)})"
    )
    if imports is None:
        return
    print(f"\nimports of one full-hit run (python -X importtime, self times by package; {imports.modules} modules):\n")
    rows = [[name, format_seconds(s), f"{s / imports.total:.0%}"] for name, s in imports.groups.items()]
    rows.append(["all", format_seconds(imports.total), "100%"])
    print_table(["package", "import time", "share"], rows, right=(1, 2))
    leaked = [p for p, out in imports.kept_out.items() if not out]
    print(
        f"\nnever imported by a full hit: {', '.join(imports.kept_out)}: "
        f"{'PASS' if not leaked else 'MISS (imported: ' + ', '.join(leaked) + ')'}"
    )


def report_engine(bench: EngineBench) -> None:
    """The engine part's table; with the engine in its own process, its CPU time and scheduler are not seen."""
    plain = bench.timings[PLAIN]
    headers = ["run", "median", "vs plain", "1.05x", "CPU ratio", "peak held", "peak running"]
    rows = []
    for name, timing in bench.timings.items():
        ratio = timing.median / plain.median
        verdict = ("PASS" if ratio <= ENGINE_TARGET else "MISS") if name == COLD else ""
        peaks = bench.peaks[name]
        seen = [f"{timing.cpu_median / plain.cpu_median:.3f}x", str(peaks.held), str(peaks.running)]
        rows.append(
            [name, format_seconds(timing.median), f"{ratio:.3f}x", verdict, *(["-"] * 3 if bench.own_process else seen)]
        )
    print(f"\nengine: {bench.placement}")
    print_table(headers, rows, right=(1, 2, 4, 5, 6))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k requests only, 3 repetitions")
    parser.add_argument(
        "--reps",
        type=int,
        help="samples of every plan size and of the engine part (default 5 for 10k, 3 for 100k, 10 for the engine)",
    )
    parser.add_argument("--json", type=Path, help="also write every timing to this file")
    parser.add_argument("--only", default="plan,cli,engine", help="comma-separated subset of plan,cli,engine")
    parser.add_argument("--workdir", type=Path, help="where stores and the tiny model go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(","))
    if not only <= {"plan", "cli", "engine"}:
        parser.error(f"--only: unknown parts {sorted(only - {'plan', 'cli', 'engine'})}")
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    # A folder of its own, even inside --workdir: removing it at the end removes nothing that was there before.
    workdir = Path(tempfile.mkdtemp(prefix="judgestore-inference-bench-", dir=args.workdir))
    env = environment()
    log(f"judgestore inference bench: {'quick' if args.quick else 'full'}, work folder {workdir}")
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    plan_bench = PlanBench(workdir)
    cli_bench = CliBench(workdir, sizes.cli_hit_runs)
    engine_benches = [EngineBench(workdir, args.reps or sizes.engine_reps, own_process=own) for own in (False, True)]
    try:
        if "plan" in only:
            for n, reps, inner in sizes.plan:
                plan_bench.run(n, args.reps or reps, inner)
        if "cli" in only:
            cli_bench.run()
        if "engine" in only:
            for engine_bench in engine_benches:
                engine_bench.run()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    planned = bool(plan_bench.results)  # the plan's notes only where the plan ran (--only cli said them, was)
    plan_notes = [
        *plan_bench.notes,
        "floor = per request orjson.dumps({'messages', 'type'}, OPT_SORT_KEYS) + hashlib.sha256 hex; keys "
        f"deduplicated; raw sqlite3 json_each lookup of the {len(HIT_FIELDS)} columns a hit returns "
        f"({', '.join(HIT_FIELDS)}; the prompt stays on disk, as the lookup leaves it) in batches of "
        f"{LOOKUP_BATCH:,} in one read transaction, fetchall, dict key -> row tuple with usage/top_logprobs decoded "
        "by orjson (GC paused), hits counted, rows dropped. Not in the floor: message validation, CompletionRecord "
        "objects, the Plan. 'floor + records' reads every column, the prompt too, and builds whole records "
        "(created_at parsed), what get_many(deferred=False) returns, as bench/store_bench.py's raw get_many does: "
        "more than a hit reads, for scale. 'complete' also builds the Samples and Responses; every variant drops "
        "its result inside its timing",
        "split: render + hash = batch_keys vs the dumps+sha256 loop; lookup = CachedModel._lookup "
        "(Store.find + Database.get_many) vs the raw query loop",
    ]
    notes = [
        *(plan_notes if planned else []),
        *cli_bench.notes,
        *(note for engine_bench in engine_benches for note in engine_bench.notes),
        (
            "plan: medians of interleaved repetitions ("
            + ", ".join(f"{n:,}: {args.reps or r} x {i} calls" for n, r, i in sizes.plan)
            + "); ratio = wall clock, CPU ratio = process CPU time; "
            if planned
            else ""
        )
        + f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; python {env['python']}, "
        f"sqlite {env['sqlite']}, sqlalchemy {env['sqlalchemy']}, orjson {env['orjson']}, {env['cpus']} CPUs; "
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    if plan_bench.results:
        report_plan(plan_bench.results)
    if cli_bench.runs:
        report_cli(cli_bench.runs, cli_bench.imports)
    for engine_bench in engine_benches:
        if engine_bench.timings:
            report_engine(engine_bench)
    print()
    for note in notes:
        print(f"* {note}")
    if args.json:
        write_json(
            args.json,
            {
                "environment": env,
                "quick": args.quick,
                "notes": notes,
                "plan": [r.as_dict() for r in plan_bench.results],
                "cli": [r.as_dict() for r in cli_bench.runs.values()],
                "cli_imports": None if cli_bench.imports is None else cli_bench.imports.as_dict(),
                "engine": [
                    {
                        "placement": engine_bench.placement,
                        "timings": [t.as_dict() for t in engine_bench.timings.values()],
                        "peaks": None
                        if engine_bench.own_process
                        else {name: dataclasses.asdict(p) for name, p in engine_bench.peaks.items()},
                        "target": ENGINE_TARGET,
                    }
                    for engine_bench in engine_benches
                    if engine_bench.timings
                ],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
