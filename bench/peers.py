"""judgestore beside the caches LLM tools use, each driven the way its users drive it, and the bare sqlite3 floor.

Contract:

* Usage::

      python bench/peers.py [--quick] [--reps N] [--json out.json] [--workdir DIR] [--keep] [--only a,b]

* Seven contenders do the same operations on the same deterministic chat
  prompts (``bench/common.py``'s generator: a system and a user message,
  rendered 2-4 KB, completions 1-2 KB, ``usage`` in every row, no logprobs):
  write N new prompts into an empty store, then look N prompts up at 100 %,
  0 % and 50 % hits, for N = 1,000 and 10,000 (``--quick``: 1,000 only).
* Every contender gets its native input, built before timing (chat messages,
  LangChain message objects, lm-eval's request arguments, DSPy's request
  dict). Inside the timing is everything its cache does with it: computing
  the key (serialising and hashing), building what is stored, the store's own
  work and, on lookups, decoding what comes back.

  - floor: stdlib ``sqlite3`` on one table keyed by the input hash
    (``key TEXT PRIMARY KEY`` and the columns judgestore stores, no secondary
    index), judgestore's pragmas (WAL, ``synchronous=NORMAL``). Key: SHA-256 of
    orjson's sorted-keys rendering of the messages (judgestore's hash). Writes:
    one ``executemany`` of ``INSERT OR IGNORE`` in one transaction. Lookups:
    one ``SELECT key, finish_reason, usage, top_logprobs, completion ...
    WHERE key IN (SELECT value FROM json_each(?))`` query for the whole
    batch (what a hit returns, not the prompt), ``fetchall``, a
    ``dict[key, tuple]`` with ``usage`` and ``top_logprobs`` decoded by
    orjson, cyclic GC paused.
  - floor, no prompt: the floor with ``input_text`` left NULL, i.e. a cache
    that keeps only the answer behind the hash, as diskcache and sqlitedict
    do here. Not a peer: the fastest such a cache can be, which bounds how
    far ahead of them a store that keeps the prompt can get.
  - floor, indexes: the floor with judgestore's secondary indexes on
    ``completions`` (those over the floor's columns). Not a peer: the fastest
    a store that keeps the prompt and those indexes can write, checking
    nothing, which bounds how far ahead of a peer such a store can get there.
  - LangChain ``SQLiteCache``, as ``BaseChatModel._generate_with_cache`` calls
    it: per prompt ``lookup(dumps(messages), llm_string)`` and, for a miss,
    ``update(dumps(messages), llm_string, [ChatGeneration(AIMessage(...))])``.
  - sqlitedict, as lm-evaluation-harness's ``CachingLM`` uses it:
    ``SqliteDict(path, autocommit=True)``; per request the key is
    ``hash_args("generate_until", (context, gen_kwargs))`` (SHA-256 of
    ``json.dumps``), then ``hsh in db`` and ``db[hsh]``; writes are
    ``db[hsh] = completion`` per request, then ``db.commit()``.
  - diskcache, as DSPy's ``Cache`` uses it (memory layer off):
    ``FanoutCache(shards=16, timeout=10, size_limit=3e10)``; the key is
    SHA-256 of orjson's sorted-keys dump of the request; ``get(key, miss)``
    and ``cache[key] = response`` per request, the response an
    OpenAI-shaped dict (pickled by diskcache).
  - judgestore: ``Database.put_many(records)`` with each ``CompletionRecord``
    built from ``input_hash(render_messages_bytes(messages))``, and
    ``Database.get_many(hashes)`` over the hashes of the batch.

* Where a peer's framework does more around its cache (LangChain computing
  ``llm_string`` per call and converting cached generations, DSPy deep-copying
  requests and responses and transforming request values, lm-eval's progress
  bar), that work is left out: the peers are measured at their fastest.
* Repetitions are interleaved (:func:`bench.common.measure`: one call of each
  contender per sample, a full ``gc.collect()`` before each sample, a timed
  ``gc.collect(0)`` after each call); every write gets a fresh empty store
  (untimed setup). The orders of the samples form a Williams design
  (:func:`bench.common.sample_orders`): by default one whole cycle of it (14
  samples for 7 contenders), in which each contender follows each other one
  equally often. A call is slowed by a heavy one just before it: when each
  contender had the same one or two predecessors in every sample, "floor,
  indexes", whose lookup is the floor's, came out at 0.85x-1.09x of it
  depending on the order of the list. Medians of ``--reps`` samples; ratios
  are to the floor measured in the same run.
* Every call is checked, untimed, after it returns: a write must leave exactly
  N entries; a lookup must give back, for each prompt, the completion stored
  for it, and nothing for a prompt never stored. A failed check stops the
  bench with exit status 1; otherwise it exits 0 whatever the figures. A peer
  whose package is missing is left out with a note (install ``.[bench]``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from itertools import count
from pathlib import Path
from typing import Any, ClassVar

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/peers.py` from anywhere

from bench.common import (
    Timing,
    Variant,
    completion_records,
    environment,
    format_seconds,
    gc_paused,
    measure,
    print_table,
    raw_connect,
    sample_orders,
    write_json,
)
from store import Database, Settings, Store
from store.descriptor import ModelDescriptor, input_hash, render_messages_bytes
from store.tables.models import Completion
from store.tables.records import CompletionRecord

MODEL = "bench/model-1"
RUN_ID = "bench-run"
CREATED_BY = "bench"
TASK = "bench"
PROMPT_CHARS = (2000, 4000)
COMPLETION_CHARS = (1000, 2000)
SIZES = (1_000, 10_000)
HIT_RATES = (1.0, 0.0, 0.5)


class CheckFailed(Exception):
    """A contender gave back something other than what was stored (the figures would compare different work)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One chat prompt and what the model answered: the same for every contender."""

    messages: list[dict[str, str]]
    completion: str
    finish_reason: str
    usage: dict[str, int]
    benchmark: str
    instruction_id: str


def make_calls(n: int) -> list[Call]:
    """``n`` distinct deterministic chat calls (2-4 KB rendered prompt, 1-2 KB completion)."""
    calls = []
    for r in completion_records(n, prompt_chars=PROMPT_CHARS, completion_chars=COMPLETION_CHARS, logprobs=False):
        assert r.finish_reason is not None and r.usage is not None and r.benchmark and r.instruction_id
        calls.append(
            Call(
                orjson.loads(r.input_text)["messages"],
                r.completion,
                r.finish_reason,
                r.usage,
                r.benchmark,
                r.instruction_id,
            )
        )
    return calls


# ---------------------------------------------------------------- the contenders


class Contender(ABC):
    """One cache in one folder, used as its users use it.

    ``native`` builds, untimed, the input the contender's users hold anyway;
    ``write`` and ``lookup`` are timed; ``answers`` (untimed) reads a lookup's
    result back as one completion or None per prompt, for the check.
    """

    name: ClassVar[str]
    slug: ClassVar[str]
    packages: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def __init__(self, folder: Path) -> None: ...

    @staticmethod
    @abstractmethod
    def native(call: Call) -> Any: ...

    @abstractmethod
    def write(self, inputs: Sequence[Any], calls: Sequence[Call]) -> None: ...

    @abstractmethod
    def lookup(self, inputs: Sequence[Any]) -> Any: ...

    @abstractmethod
    def answers(self, result: Any, inputs: Sequence[Any]) -> list[str | None]: ...

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...


def _floor_key(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(
        orjson.dumps({"messages": messages, "type": "messages"}, option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


FLOOR_DDL = """CREATE TABLE completions (
    key TEXT PRIMARY KEY, sample_index INTEGER NOT NULL, benchmark TEXT, instruction_id TEXT, model TEXT,
    finish_reason TEXT, run_id TEXT, created_by TEXT, created_at TEXT NOT NULL, usage TEXT, top_logprobs TEXT,
    input_text TEXT{prompt_constraint}, completion TEXT NOT NULL)"""
FLOOR_INSERT = "INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# What a hit returns (the answer and what the cache reports about it); the prompt stays on disk.
FLOOR_SELECT = (
    "SELECT key, finish_reason, usage, top_logprobs, completion FROM completions"
    " WHERE key IN (SELECT value FROM json_each(?))"
)


class Floor(Contender):
    name = "floor (sqlite3)"
    slug = "floor"
    keeps_prompt: ClassVar[bool] = True

    def __init__(self, folder: Path) -> None:
        path = folder / "floor.db"
        fresh = not path.exists()
        self.conn = raw_connect(path, SETTINGS)
        if fresh:
            self.conn.execute(FLOOR_DDL.format(prompt_constraint=" NOT NULL" if self.keeps_prompt else ""))

    @staticmethod
    def native(call: Call) -> list[dict[str, str]]:
        return call.messages

    def write(self, inputs: Sequence[list[dict[str, str]]], calls: Sequence[Call]) -> None:
        dumps, sort, sha256 = orjson.dumps, orjson.OPT_SORT_KEYS, hashlib.sha256
        now = datetime.now(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
        rows = []
        keeps_prompt = self.keeps_prompt
        for messages, call in zip(inputs, calls, strict=True):
            rendered = dumps({"messages": messages, "type": "messages"}, option=sort)
            rows.append(
                (
                    sha256(rendered).hexdigest(),
                    0,
                    call.benchmark,
                    call.instruction_id,
                    MODEL,
                    call.finish_reason,
                    RUN_ID,
                    CREATED_BY,
                    now,
                    dumps(call.usage, option=sort).decode(),
                    None,
                    rendered.decode() if keeps_prompt else None,
                    call.completion,
                )
            )
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.executemany(FLOOR_INSERT, rows)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def lookup(self, inputs: Sequence[list[dict[str, str]]]) -> dict[str, tuple[Any, ...]]:
        keys = [_floor_key(messages) for messages in inputs]
        loads = orjson.loads
        found = {}
        with gc_paused():
            for k, fr, us, tl, co in self.conn.execute(FLOOR_SELECT, (orjson.dumps(keys).decode(),)).fetchall():
                found[k] = (fr, None if us is None else loads(us), None if tl is None else loads(tl), co)
        return found

    def answers(self, result: dict[str, tuple[Any, ...]], inputs: Sequence[list[dict[str, str]]]) -> list[str | None]:
        rows = [result.get(_floor_key(messages)) for messages in inputs]
        return [None if row is None else row[-1] for row in rows]

    def count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM completions").fetchone()[0])

    def close(self) -> None:
        self.conn.close()


class FloorNoPrompt(Floor):
    """The floor without the prompt (``input_text`` NULL): as fast as a cache that keeps only answers can be here.

    Not a peer: the reference that says how far a store keeping the prompt
    can get ahead of a peer that does not (diskcache and sqlitedict keep the
    answer behind a hash).
    """

    name = "floor, no prompt (sqlite3)"
    slug = "floor-no-prompt"
    keeps_prompt = False


class FloorIndexes(Floor):
    """The floor with judgestore's secondary indexes: as fast as a store keeping the prompt and those indexes writes.

    Not a peer: the reference that says how far ahead of a peer such a store
    can get on writes when it checks nothing. The indexes are read from
    judgestore's own ``completions`` table, so they follow its schema; one over
    a column the floor lacks (``adopted_from``, partial, empty here) is left out.
    """

    name = "floor, indexes (sqlite3)"
    slug = "floor-indexes"

    def __init__(self, folder: Path) -> None:
        fresh = not (folder / "floor.db").exists()
        super().__init__(folder)
        if fresh:
            floor_columns = {row[1] for row in self.conn.execute("PRAGMA table_info(completions)")}
            for index in sorted(
                Completion.metadata.tables[Completion.__tablename__].indexes, key=lambda index: str(index.name)
            ):
                columns = [column.name for column in index.columns]
                if set(columns) <= floor_columns:
                    self.conn.execute(f"CREATE INDEX {index.name} ON completions ({', '.join(columns)})")


# What ChatOpenAI(model=..., temperature=0)._get_llm_string() looks like: computed once here, per call in LangChain.
LLM_STRING = (
    json.dumps(
        {
            "id": ["langchain", "chat_models", "openai", "ChatOpenAI"],
            "kwargs": {
                "model_name": MODEL,
                "openai_api_key": {"id": ["OPENAI_API_KEY"], "lc": 1, "type": "secret"},
                "temperature": 0.0,
            },
            "lc": 1,
            "name": "ChatOpenAI",
            "type": "constructor",
        },
        sort_keys=True,
    )
    + "---[('stop', None)]"
)


class LangChain(Contender):
    name = "LangChain SQLiteCache"
    slug = "langchain"
    packages = ("langchain_community", "langchain_core")

    def __init__(self, folder: Path) -> None:
        from langchain_community.cache import SQLiteCache

        self.path = folder / ".langchain.db"
        self.cache = SQLiteCache(str(self.path))

    @staticmethod
    def native(call: Call) -> list[Any]:
        from langchain_core.messages import HumanMessage, SystemMessage

        kinds = {"system": SystemMessage, "user": HumanMessage}
        return [kinds[m["role"]](content=m["content"]) for m in call.messages]

    def write(self, inputs: Sequence[list[Any]], calls: Sequence[Call]) -> None:
        from langchain_core.load import dumps
        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration

        update = self.cache.update
        for messages, call in zip(inputs, calls, strict=True):
            usage = call.usage
            message = AIMessage(
                content=call.completion,
                response_metadata={"token_usage": usage, "model_name": MODEL, "finish_reason": call.finish_reason},
                usage_metadata={
                    "input_tokens": usage["prompt_tokens"],
                    "output_tokens": usage["completion_tokens"],
                    "total_tokens": usage["total_tokens"],
                },
            )
            generation = ChatGeneration(message=message, generation_info={"finish_reason": call.finish_reason})
            update(dumps(messages), LLM_STRING, [generation])

    def lookup(self, inputs: Sequence[list[Any]]) -> list[Any]:
        from langchain_core.load import dumps

        lookup = self.cache.lookup
        return [lookup(dumps(messages), LLM_STRING) for messages in inputs]

    def answers(self, result: list[Any], inputs: Sequence[Any]) -> list[str | None]:
        return [None if generations is None else generations[0].message.content for generations in result]

    def count(self) -> int:
        return _count_rows(self.path, "full_llm_cache")

    def close(self) -> None:
        self.cache.engine.dispose()


def hash_args(attr: str, args: Sequence[Any]) -> str:
    """lm-evaluation-harness's cache key (``lm_eval.api.model.hash_args``)."""
    dat = json.dumps([attr, *args])
    return hashlib.sha256(dat.encode("utf-8")).hexdigest()


# lm-eval's generate_until arguments for a greedy chat request
GEN_KWARGS = {"until": ["<|im_end|>"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 2048}


class SqliteDictLmEval(Contender):
    name = "sqlitedict (lm-eval)"
    slug = "sqlitedict"
    packages = ("sqlitedict",)

    def __init__(self, folder: Path) -> None:
        from sqlitedict import SqliteDict

        self.db = SqliteDict(str(folder / "lm_cache_rank0.db"), autocommit=True)

    @staticmethod
    def native(call: Call) -> tuple[str, dict[str, Any]]:
        # lm-eval's request arguments for a chat model: the chat history as a JSON string, and the gen_kwargs
        return json.dumps(call.messages, ensure_ascii=False), GEN_KWARGS

    def write(self, inputs: Sequence[tuple[str, dict[str, Any]]], calls: Sequence[Call]) -> None:
        db = self.db
        for args, call in zip(inputs, calls, strict=True):
            db[hash_args("generate_until", args)] = call.completion
        db.commit()

    def lookup(self, inputs: Sequence[tuple[str, dict[str, Any]]]) -> list[str | None]:
        db = self.db
        res: list[str | None] = []
        for args in inputs:
            hsh = hash_args("generate_until", args)
            if hsh in db:
                res.append(db[hsh])
            else:
                res.append(None)
        return res

    def answers(self, result: list[str | None], inputs: Sequence[Any]) -> list[str | None]:
        return result

    def count(self) -> int:
        return len(self.db)

    def close(self) -> None:
        self.db.close()


DSPY_SIZE_LIMIT = int(3e10)  # DSPy's default DSPY_CACHE_LIMIT
DSPY_FN = "dspy.clients.lm.litellm_completion"


def _dspy_key(request: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()


class DiskcacheDSPy(Contender):
    name = "diskcache (DSPy)"
    slug = "diskcache"
    packages = ("diskcache",)

    def __init__(self, folder: Path) -> None:
        from diskcache import FanoutCache

        self.cache = FanoutCache(
            directory=str(folder / "dspy_cache"), shards=16, timeout=10, size_limit=DSPY_SIZE_LIMIT
        )

    @staticmethod
    def native(call: Call) -> dict[str, Any]:
        # LM.forward's request, as request_cache(cache_arg_name="request") sees it
        return {
            "model": f"openai/{MODEL}",
            "messages": call.messages,
            "temperature": 0.0,
            "max_tokens": 2048,
            "_fn_identifier": DSPY_FN,
        }

    def write(self, inputs: Sequence[dict[str, Any]], calls: Sequence[Call]) -> None:
        cache = self.cache
        for request, call in zip(inputs, calls, strict=True):
            response = {
                "id": f"chatcmpl-{call.instruction_id}",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": call.finish_reason,
                        "message": {"role": "assistant", "content": call.completion},
                    }
                ],
                "usage": call.usage,
            }
            cache[_dspy_key(request)] = response

    def lookup(self, inputs: Sequence[dict[str, Any]]) -> list[Any]:
        get = self.cache.get
        return [get(_dspy_key(request), None) for request in inputs]

    def answers(self, result: list[Any], inputs: Sequence[Any]) -> list[str | None]:
        return [None if response is None else response["choices"][0]["message"]["content"] for response in result]

    def count(self) -> int:
        return len(self.cache)

    def close(self) -> None:
        self.cache.close()


SETTINGS = Settings(
    store_root=Path(tempfile.gettempdir()) / "judgestore-peers-unused", run_id=RUN_ID, created_by=CREATED_BY
)
DESCRIPTOR = ModelDescriptor(provider="bench", model=MODEL)


class Judgestore(Contender):
    name = "judgestore"
    slug = "judgestore"

    def __init__(self, folder: Path) -> None:
        self.store = Store(SETTINGS, root=folder / "store")
        self.db: Database = self.store.database("completions", TASK, DESCRIPTOR)

    @staticmethod
    def native(call: Call) -> list[dict[str, str]]:
        return call.messages

    def write(self, inputs: Sequence[list[dict[str, str]]], calls: Sequence[Call]) -> None:
        now = datetime.now(UTC)
        records = []
        for messages, call in zip(inputs, calls, strict=True):
            rendered = render_messages_bytes(messages)
            records.append(
                CompletionRecord(
                    input_hash=input_hash(rendered),
                    input_text=rendered.decode(),
                    completion=call.completion,
                    benchmark=call.benchmark,
                    instruction_id=call.instruction_id,
                    model=MODEL,
                    finish_reason=call.finish_reason,
                    usage=call.usage,
                    run_id=RUN_ID,
                    created_by=CREATED_BY,
                    created_at=now,
                )
            )
        self.db.put_many(records)

    def lookup(self, inputs: Sequence[list[dict[str, str]]]) -> dict[str, Any]:
        return self.db.get_many([input_hash(render_messages_bytes(messages)) for messages in inputs])

    def answers(self, result: dict[str, Any], inputs: Sequence[list[dict[str, str]]]) -> list[str | None]:
        records = [result.get(input_hash(render_messages_bytes(messages))) for messages in inputs]
        return [None if r is None else r.completion for r in records]

    def count(self) -> int:
        return self.db.count()

    def close(self) -> None:
        self.store.close()


def _count_rows(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


CONTENDERS: tuple[type[Contender], ...] = (
    Floor,
    FloorNoPrompt,
    FloorIndexes,
    LangChain,
    SqliteDictLmEval,
    DiskcacheDSPy,
    Judgestore,
)
PEERS = ("langchain", "sqlitedict", "diskcache")


def available(kind: type[Contender]) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in kind.packages)


# ---------------------------------------------------------------- the cases


@dataclass
class Case:
    operation: str
    n: int
    timings: dict[str, Timing]  # by contender slug

    def as_dict(self) -> dict[str, Any]:
        floor = self.timings["floor"]
        return {
            "operation": self.operation,
            "n": self.n,
            "contenders": {
                slug: {
                    **t.as_dict(),
                    "ratio_to_floor": t.median / floor.median,
                    "cpu_ratio_to_floor": t.cpu_median / floor.cpu_median,
                }
                for slug, t in self.timings.items()
            },
        }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check(what: str, got: Sequence[str | None], expected: Sequence[str | None]) -> None:
    if len(got) != len(expected):
        raise CheckFailed(f"{what}: {len(got)} answers for {len(expected)} prompts")
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g == e:
            continue
        if e is None:
            raise CheckFailed(f"{what}: prompt {i} was never stored but gave back {str(g)[:60]!r}")
        if g is None:
            raise CheckFailed(f"{what}: prompt {i} was stored but gave back nothing")
        raise CheckFailed(f"{what}: prompt {i} gave back {str(g)[:60]!r}..., not the completion stored for it")


class Bench:
    def __init__(self, kinds: Sequence[type[Contender]], workdir: Path, reps: int) -> None:
        self.kinds = kinds
        self.workdir = workdir
        self.reps = reps
        self.cases: list[Case] = []
        self.calls: list[Call] = []
        self.inputs: dict[str, list[Any]] = {}
        self._folders = count()

    def prepare(self, n: int) -> None:
        """``2 n`` calls: the first ``n`` are written and then hit, the rest are the misses."""
        t0 = time.perf_counter()
        self.calls = make_calls(2 * n)
        self.inputs = {kind.slug: [kind.native(c) for c in self.calls] for kind in self.kinds}
        log(f"  {2 * n:,} calls generated in {time.perf_counter() - t0:.1f} s")

    def folder(self, slug: str) -> Path:
        path = self.workdir / f"{slug}-{next(self._folders)}"
        path.mkdir(parents=True)
        return path

    def run(self, n: int) -> None:
        log(f"N = {n:,}")
        self.prepare(n)
        keys = [_floor_key(c.messages) for c in self.calls[:20]]
        if keys != [input_hash(render_messages_bytes(c.messages)) for c in self.calls[:20]]:
            raise CheckFailed("the floor's keys are not judgestore's input hashes")
        self.bench_write(n)
        self.bench_lookups(n)

    def bench_write(self, n: int) -> None:
        calls = self.calls[:n]
        variants = [self._write_variant(kind, self.inputs[kind.slug][:n], calls) for kind in self.kinds]
        log(f"  write {n:,}: {self.reps} samples")
        self.cases.append(Case(f"write {n:,}", n, measure(variants, self.reps, warmup=n <= 1_000)))

    def _write_variant(self, kind: type[Contender], inputs: list[Any], calls: list[Call]) -> Variant:
        def setup() -> tuple[Contender, Path]:
            folder = self.folder(f"write-{kind.slug}")
            return kind(folder), folder

        def run(state: tuple[Contender, Path]) -> None:
            state[0].write(inputs, calls)

        def teardown(state: tuple[Contender, Path], _result: None) -> None:
            contender, folder = state
            stored = contender.count()
            contender.close()
            shutil.rmtree(folder)
            if stored != len(calls):
                raise CheckFailed(f"{kind.name}: write {len(calls):,} left {stored:,} entries")

        return Variant(kind.slug, run, setup, teardown)

    def bench_lookups(self, n: int) -> None:
        stores: dict[str, Contender] = {}
        folders: list[Path] = []
        try:
            for kind in self.kinds:
                t0 = time.perf_counter()
                folders.append(self.folder(f"lookup-{kind.slug}"))
                stores[kind.slug] = contender = kind(folders[-1])
                contender.write(self.inputs[kind.slug][:n], self.calls[:n])
                log(f"  {kind.name}: {n:,} entries written for the lookups in {time.perf_counter() - t0:.1f} s")
            for rate in HIT_RATES:
                hits = round(n * rate)
                picked = list(range(hits)) + list(range(n, 2 * n - hits))
                random.Random(n * 1_000 + hits).shuffle(picked)
                expected = [self.calls[i].completion if i < n else None for i in picked]
                operation = f"lookup {n:,}, {rate:.0%} hits"
                variants = [
                    self._lookup_variant(
                        operation, stores[kind.slug], [self.inputs[kind.slug][i] for i in picked], expected
                    )
                    for kind in self.kinds
                ]
                log(f"  {operation}: {self.reps} samples")
                self.cases.append(Case(operation, n, measure(variants, self.reps)))
        finally:
            for contender in stores.values():
                contender.close()
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)

    def _lookup_variant(
        self, operation: str, contender: Contender, inputs: list[Any], expected: list[str | None]
    ) -> Variant:
        def run(_state: None) -> Any:
            return contender.lookup(inputs)

        def check_answers(_state: None, result: Any) -> None:
            check(f"{contender.name}, {operation}", contender.answers(result, inputs), expected)

        return Variant(contender.slug, run, check=check_answers)


# ---------------------------------------------------------------- report


def report(cases: Sequence[Case], kinds: Sequence[type[Contender]]) -> None:
    names = {kind.slug: kind.name for kind in kinds}
    peers = [slug for slug in PEERS if slug in names]
    headers = ["operation", *(names[k.slug] for k in kinds)]
    if "judgestore" in names and peers:
        headers.append("judgestore vs best peer")
    rows = []
    for case in cases:
        floor = case.timings["floor"].median
        row = [case.operation]
        for kind in kinds:
            t = case.timings[kind.slug].median
            row.append(f"{format_seconds(t)} ({t / floor:.2f}x)")
        if len(headers) > len(row):
            best = min(peers, key=lambda slug: case.timings[slug].median)
            speedup = case.timings[best].median / case.timings["judgestore"].median
            row.append(
                f"{speedup:.2f}x faster than {names[best]}"
                if speedup >= 1
                else f"{1 / speedup:.2f}x slower than {names[best]}"
            )
        rows.append(row)
    print()
    print_table(headers, rows, right=tuple(range(1, len(headers))), markdown=True)
    if peers and FloorNoPrompt.slug in names:
        _over_half_best_peer(
            "The floor without the prompt over half the best peer's time (above 1.00x: even a store that keeps "
            "only answers cannot be 2x faster than the best peer there):",
            FloorNoPrompt.slug,
            cases,
            peers,
        )
    writes = [case for case in cases if case.operation.startswith("write")]
    if peers and FloorIndexes.slug in names and writes:
        _over_half_best_peer(
            "The floor with judgestore's indexes over half the best peer's time on writes (above 1.00x: a store "
            "that keeps the prompt and those indexes cannot be 2x faster than the best peer there, even checking "
            "nothing):",
            FloorIndexes.slug,
            writes,
            peers,
        )


def _over_half_best_peer(title: str, slug: str, cases: Sequence[Case], peers: Sequence[str]) -> None:
    """Print, per case, a reference floor's time over half the fastest peer's: above 1.00x, 2x is out of reach."""
    print(f"\n{title}\n")
    for case in cases:
        fastest_peer = min(case.timings[peer].median for peer in peers)
        print(f"- {case.operation}: {case.timings[slug].median / (fastest_peer / 2):.2f}x")


def peer_versions() -> dict[str, str]:
    found = {}
    for package in ("langchain-community", "langchain-core", "sqlitedict", "diskcache"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1,000 only (full: 1,000 and 10,000)")
    parser.add_argument(
        "--reps",
        type=int,
        help="interleaved samples per operation (default: one cycle of the sampling order, 14 for all 7 contenders)",
    )
    parser.add_argument("--json", type=Path, help="also write every timing to this file")
    parser.add_argument("--workdir", type=Path, help="where the stores go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--only",
        help="comma-separated contenders besides the floor (" + ",".join(k.slug for k in CONTENDERS[1:]) + ")",
    )
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    kinds = [kind for kind in CONTENDERS if available(kind)]
    if args.only:
        chosen = {"floor", *args.only.split(",")}
        if unknown := chosen - {k.slug for k in CONTENDERS}:
            parser.error(f"unknown contenders {', '.join(sorted(unknown))}")
        kinds = [kind for kind in kinds if kind.slug in chosen]
    # One whole cycle of the order design: every contender follows every other as often (bench.common.measure).
    args.reps = args.reps or len(sample_orders(len(kinds)))
    if LangChain in kinds:
        # Imported first because it installs its own warning filters; then its sunset notice and the
        # warning that loads() (inside SQLiteCache.lookup) gives on every hit are silenced, not printed.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        import langchain_community.cache  # noqa: F401

        warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
    missing = [kind.name for kind in CONTENDERS if not available(kind)]
    sizes = SIZES[:1] if args.quick else SIZES
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    # A folder of its own, even inside --workdir: removing it at the end removes nothing that was there before.
    workdir = Path(tempfile.mkdtemp(prefix="judgestore-peers-", dir=args.workdir))
    env = {**environment(), "peers": peer_versions()}
    log(f"peers bench: N = {', '.join(f'{n:,}' for n in sizes)}, {args.reps} samples, work folder {workdir}")
    if missing:
        log(f"left out (not installed; pip install -e '.[bench]'): {', '.join(missing)}")
    bench = Bench(kinds, workdir, args.reps)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    try:
        for n in sizes:
            bench.run(n)
    except CheckFailed as e:
        print(f"correctness check failed, stopping: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report(bench.cases, kinds)
    notes = [
        f"chat prompts rendered {PROMPT_CHARS[0]:,}-{PROMPT_CHARS[1]:,} chars, completions "
        f"{COMPLETION_CHARS[0]:,}-{COMPLETION_CHARS[1]:,} chars, usage in every row, no logprobs",
        f"medians of {args.reps} interleaved samples, wall clock; (x) = time / floor in the same run; "
        "every answer checked against what was stored",
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; python {env['python']}, "
        f"sqlite {env['sqlite']}, {env['cpus']} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in env["peers"].items())
        + f"; {time.perf_counter() - started:.0f} s in all",
    ]
    if missing:
        notes.append(f"left out, not installed: {', '.join(missing)} (pip install -e '.[bench]')")
    print()
    for note in notes:
        print(f"* {note}")
    if args.json:
        write_json(
            args.json,
            {
                "environment": env,
                "quick": args.quick,
                "reps": args.reps,
                "sizes": list(sizes),
                "notes": notes,
                "cases": [case.as_dict() for case in bench.cases],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
