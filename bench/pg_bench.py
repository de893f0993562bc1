"""judgestore's hot paths on PostgreSQL beside raw psycopg doing the same work on the same server, in one run.

Usage::

    python bench/store_bench.py --backend postgresql [--url URL] [--quick] [--reps N] [--json out.json]
                                [--only get,put] [--db-rows N]

Without ``--url`` a throwaway server is started the way the tests start one
(``tests/pg_server.py``: ``initdb`` and ``pg_ctl`` on a Unix socket in a
temporary folder, ``fsync=off``) and stopped at the end; with ``--url`` the
bench creates its schemas in that database and drops them again.

Cases (same method as ``store_bench.py``: calls interleaved, medians, each
raw variant checked to produce exactly what judgestore produces before
anything is timed):

* get_many: ``Database.get_many(hashes, deferred=False)`` (whole records, as
  raw builds them) against a schema of ``--db-rows``
  rows at 0 %, 50 % and 100 % hits (100 %: the lookup of a full-hit run).
  Raw, two ways: ``WHERE input_hash = ANY(%s::varchar[])`` with one array
  parameter, and a join against ``unnest(%s::varchar[])``, each in batches of
  the repository's size, building the same ``dict[hash, CompletionRecord]``
  (JSON decoded by orjson in psycopg's loader, ``created_at`` made aware, GC
  paused). "fetch only" is the ``= ANY`` query and ``fetchall`` alone.
* put_many: ``Database.put_many(records)`` of new rows into a fresh schema.
  Raw, three ways, each into a fresh table made ``LIKE`` judgestore's
  (indexes and constraints included): ``INSERT ... VALUES (...), (...) ...
  ON CONFLICT DO NOTHING RETURNING`` in batches of 1,000 rows (what
  SQLAlchemy's insertmanyvalues sends), psycopg's ``executemany`` of ``INSERT
  ... ON CONFLICT DO NOTHING`` (pipeline mode), and ``COPY`` into a
  temporary table then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. The
  ratio is to the fastest raw way.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # imported by bench/store_bench.py, run from anywhere

from bench.common import (
    FIELDS,
    RAW_COLUMNS,
    RAW_FIELDS,
    Timing,
    Variant,
    completion_records,
    discard,
    environment,
    format_seconds,
    gc_paused,
    mean_row_bytes,
    measure,
    miss_hashes,
    print_table,
    write_json,
)
from store import Database, Settings, Store
from store.backends.postgres.registry import REGISTRY_SCHEMA, schema_name
from store.backends.postgres.rows import ARRAY_BATCH
from store.descriptor import ModelDescriptor
from store.layout import Location
from store.roles import Role
from store.tables.records import CompletionRecord

TARGET = 1.3
ROLE: Role = "completions"
TASK = "bench"
COLUMNS = RAW_COLUMNS  # raw_row's order
INSERT_BATCH = 1_000  # rows per multi-row VALUES statement (SQLAlchemy's insertmanyvalues default)


@dataclass
class Sizes:
    db_rows: int
    lookups: tuple[int, ...]
    hit_rates: tuple[float, ...]
    puts: tuple[int, ...]
    reps: int


# put_many sizes: 1,000 is the order of what the library writes at once (a run's chunks of 64, an import's 1,000,
# a copy's 2,000); 100,000 is a bulk load.
FULL = Sizes(db_rows=100_000, lookups=(1_000, 10_000, 100_000), hit_rates=(0.0, 0.5, 1.0),
             puts=(1_000, 10_000, 100_000), reps=5)  # fmt: skip
QUICK = Sizes(db_rows=10_000, lookups=(1_000, 10_000), hit_rates=(0.0, 0.5, 1.0), puts=(1_000, 10_000), reps=3)


@dataclass
class Result:
    group: str
    case: str
    ours: Timing
    raw: dict[str, Timing]  # every raw way; the ratio is to the fastest
    unit: int
    unit_name: str
    extra: dict[str, Timing] = field(default_factory=dict)

    @property
    def best_raw(self) -> Timing:
        return min(self.raw.values(), key=lambda t: t.median)

    @property
    def ratio(self) -> float:
        return self.ours.median / self.best_raw.median

    @property
    def cpu_ratio(self) -> float:
        return self.ours.cpu_median / self.best_raw.cpu_median

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "case": self.case,
            "unit": self.unit,
            "unit_name": self.unit_name,
            "ours": self.ours.as_dict(),
            "raw": {k: v.as_dict() for k, v in self.raw.items()},
            "best_raw": self.best_raw.name,
            "ratio": self.ratio,
            "cpu_ratio": self.cpu_ratio,
            "target": TARGET,
            "pass": self.ratio <= TARGET,
            "extra": {k: v.as_dict() for k, v in self.extra.items()},
        }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ignore_state(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args[:-1])


# ---------------------------------------------------------------- the server


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The store URL to bench on: ``url``, or a fresh database on a throwaway cluster stopped at the end."""
    if url is not None:
        yield url
        return
    from tests.pg_server import running_cluster

    with running_cluster() as cluster:
        yield cluster.url(cluster.new_database())


def raw_connect(url: str) -> Any:
    """A psycopg connection to the store URL's database, decoding JSON with orjson (as judgestore does)."""
    import psycopg
    from psycopg.types.json import set_json_loads
    from sqlalchemy.engine import make_url

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg.connect(conninfo)
    set_json_loads(orjson.loads, conn)
    return conn


# ---------------------------------------------------------------- raw psycopg: the same work


def _build(rows: Sequence[tuple[Any, ...]], found: dict[str, CompletionRecord]) -> None:
    utc, make = UTC, CompletionRecord
    for h, si, it, co, bm, ii, mo, fr, us, tl, ri, cb, ca, af in rows:
        found[h] = make(input_hash=h, sample_index=si, input_text=it, completion=co, benchmark=bm,
                        instruction_id=ii, model=mo, finish_reason=fr, usage=us, top_logprobs=tl, run_id=ri,
                        created_by=cb, created_at=ca.replace(tzinfo=utc), adopted_from=af)  # fmt: skip


def lookup_sql(schema: str, how: str) -> str:
    table = f'"{schema}".completions'
    if how == "any":
        return f"SELECT {COLUMNS} FROM {table} WHERE input_hash = ANY(%s::varchar[])"
    columns = ", ".join(f"t.{c}" for c in RAW_FIELDS)
    return f"SELECT {columns} FROM {table} AS t JOIN unnest(%s::varchar[]) AS k(h) ON t.input_hash = k.h"


def raw_get_many(conn: Any, sql: str, hashes: Sequence[str]) -> dict[str, CompletionRecord]:
    """The same result as ``Database.get_many``, with psycopg and orjson only."""
    keys = list(dict.fromkeys(hashes))
    found: dict[str, CompletionRecord] = {}
    with gc_paused():
        try:
            with conn.cursor() as cur:
                for start in range(0, len(keys), ARRAY_BATCH):
                    _build(cur.execute(sql, (keys[start : start + ARRAY_BATCH],)).fetchall(), found)
        finally:
            conn.rollback()  # a read: nothing to commit
    return found


def raw_fetch_only(conn: Any, sql: str, hashes: Sequence[str]) -> int:
    keys = list(dict.fromkeys(hashes))
    n = 0
    with gc_paused():
        try:
            with conn.cursor() as cur:
                for start in range(0, len(keys), ARRAY_BATCH):
                    n += len(cur.execute(sql, (keys[start : start + ARRAY_BATCH],)).fetchall())
        finally:
            conn.rollback()
    return n


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def raw_row(r: CompletionRecord) -> tuple[Any, ...]:
    """A record as judgestore stores it on PostgreSQL, in :data:`~bench.common.RAW_FIELDS` order."""
    return (r.input_hash, r.sample_index, r.input_text, r.completion, r.benchmark, r.instruction_id, r.model,
            r.finish_reason, _json_text(r.usage), _json_text(r.top_logprobs), r.run_id, r.created_by,
            r.created_at.astimezone(UTC).replace(tzinfo=None), r.adopted_from)  # fmt: skip


def _values_sql(table: str, n: int) -> str:
    row = "(" + ", ".join(["%s"] * len(FIELDS)) + ")"
    return f"INSERT INTO {table} ({COLUMNS}) VALUES {', '.join([row] * n)} ON CONFLICT DO NOTHING RETURNING input_hash"


def raw_put_values(conn: Any, table: str, records: Sequence[CompletionRecord]) -> int:
    """Multi-row VALUES in batches of :data:`INSERT_BATCH`, RETURNING the keys written (SQLAlchemy's way)."""
    rows = [raw_row(r) for r in records]
    written = 0
    with conn.cursor() as cur:
        for start in range(0, len(rows), INSERT_BATCH):
            batch = rows[start : start + INSERT_BATCH]
            cur.execute(_values_sql(table, len(batch)), [v for row in batch for v in row])
            written += len(cur.fetchall())
    conn.commit()
    return written


def raw_put_executemany(conn: Any, table: str, records: Sequence[CompletionRecord]) -> int:
    """psycopg's executemany of one-row inserts: pipeline mode, one round trip for the whole batch."""
    sql = f"INSERT INTO {table} ({COLUMNS}) VALUES ({', '.join(['%s'] * len(FIELDS))}) ON CONFLICT DO NOTHING"
    with conn.cursor() as cur:
        cur.executemany(sql, [raw_row(r) for r in records])
        written = int(cur.rowcount)
    conn.commit()
    return written


def raw_put_copy(conn: Any, table: str, records: Sequence[CompletionRecord]) -> int:
    """COPY into a temporary table, then one INSERT ... SELECT ... ON CONFLICT DO NOTHING."""
    with conn.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE bench_incoming (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DROP")
        with cur.copy(f"COPY bench_incoming ({COLUMNS}) FROM STDIN") as copy:
            for r in records:
                copy.write_row(raw_row(r))
        cur.execute(f"INSERT INTO {table} ({COLUMNS}) SELECT {COLUMNS} FROM bench_incoming ON CONFLICT DO NOTHING")
        written = int(cur.rowcount)
    conn.commit()
    return written


RAW_PUTS: dict[str, Callable[[Any, str, Sequence[CompletionRecord]], int]] = {
    "raw VALUES": raw_put_values,
    "raw executemany (pipeline)": raw_put_executemany,
    "raw COPY": raw_put_copy,
}


# ---------------------------------------------------------------- the cases


class Bench:
    def __init__(self, sizes: Sizes, url: str, reps: int) -> None:
        self.sizes = sizes
        self.url = url
        self.reps = reps
        self.settings = Settings(run_id="bench-run", created_by="bench", pool_size=2)
        self.store = Store(self.settings, url=url)
        self.raw = raw_connect(url)
        self.results: list[Result] = []
        self.notes: list[str] = []
        self._records: list[CompletionRecord] = []
        self._schemas = iter(range(10**9))

    def close(self) -> None:
        self.raw.close()
        self.store.close()

    def records(self, n: int) -> list[CompletionRecord]:
        if len(self._records) < n:
            t0 = time.perf_counter()
            self._records += completion_records(n - len(self._records), start=len(self._records))
            log(f"  generated {n:,} rows in {time.perf_counter() - t0:.1f} s")
        return self._records[:n]

    def sql(self, statement: str) -> Any:
        with self.raw.cursor() as cur:
            cur.execute(statement)
            rows = cur.fetchall() if cur.description else None
        self.raw.commit()
        return rows

    def fresh_database(self) -> tuple[Database, str]:
        descriptor = ModelDescriptor(provider="bench", model=f"bench/put-{next(self._schemas)}")
        database = self.store.database(ROLE, TASK, descriptor)
        return database, schema_name(Location.of(ROLE, TASK, descriptor))

    def drop(self, schema: str) -> None:
        self.sql(f'DROP SCHEMA "{schema}" CASCADE')
        self.sql(f"DELETE FROM {REGISTRY_SCHEMA}.registry WHERE schema_name = '{schema}'")

    # ------------------------------------------------------------ get_many

    def bench_get_many(self) -> None:
        s = self.sizes
        records = self.records(s.db_rows)
        log(f"get_many: building a {s.db_rows:,}-row schema")
        db, schema = self.fresh_database()
        for start in range(0, len(records), 10_000):
            db.put_many(records[start : start + 10_000])
        self.raw.autocommit = True  # VACUUM runs outside a transaction
        self.sql(f'VACUUM ANALYZE "{schema}".completions')
        size = self.sql(f"SELECT pg_total_relation_size('\"{schema}\".completions')")[0][0]
        self.notes.append(f"lookup schema: {s.db_rows:,} rows, {size / 1e6:,.0f} MB (table, TOAST and indexes)")
        self.raw.autocommit = False
        any_sql, unnest_sql = lookup_sql(schema, "any"), lookup_sql(schema, "unnest")
        misses = miss_hashes(max(s.lookups))
        try:
            check = [r.input_hash for r in records[:500]] + misses[:500]
            whole = partial(db.get_many, deferred=False)  # every column read, as raw_get_many reads them
            ours = whole(check)
            for sql in (any_sql, unnest_sql):
                if raw_get_many(self.raw, sql, check) != ours or ours != {r.input_hash: r for r in records[:500]}:
                    raise AssertionError("raw get_many does not build the same result as Database.get_many")
            for n in s.lookups:
                for hit_rate in s.hit_rates:
                    hits = round(n * hit_rate)
                    if hits > len(records):
                        continue
                    stride = max(len(records) // max(hits, 1), 1)
                    keys = [r.input_hash for r in records[::stride][:hits]] + misses[: n - hits]
                    random.Random(n).shuffle(keys)
                    inner = max(1, min(20, round(0.25 / (n * (hit_rate * 60e-6 + (1 - hit_rate) * 4e-6)))))
                    log(f"  get_many {n:,} keys, {hit_rate:.0%} hits: {self.reps} x {inner} calls")
                    timings = measure(
                        [
                            Variant("ours", partial(_ignore_state, whole, keys), check=discard),
                            Variant(
                                "raw = ANY",
                                partial(_ignore_state, raw_get_many, self.raw, any_sql, keys),
                                check=discard,
                            ),
                            Variant(
                                "raw unnest",
                                partial(_ignore_state, raw_get_many, self.raw, unnest_sql, keys),
                                check=discard,
                            ),
                            Variant(
                                "fetch", partial(_ignore_state, raw_fetch_only, self.raw, any_sql, keys), check=discard
                            ),
                        ],
                        self.reps,
                        inner=inner,
                    )
                    raw = {name: timings[name] for name in ("raw = ANY", "raw unnest")}
                    self.results.append(Result("get_many", f"{n:,} keys, {hit_rate:.0%} hits", timings["ours"], raw,
                                               n, "key", {"fetch only": timings["fetch"]}))  # fmt: skip
        finally:
            self.drop(schema)

    # ------------------------------------------------------------ put_many

    def bench_put_many(self) -> None:
        template, template_schema = self.fresh_database()
        counter = iter(range(10**9))

        def raw_setup() -> str:
            schema = f"bench_raw_{next(counter)}"
            self.sql(f'CREATE SCHEMA "{schema}"')
            self.sql(f'CREATE TABLE "{schema}".completions (LIKE "{template_schema}".completions INCLUDING ALL)')
            return f'"{schema}".completions'

        def raw_teardown(table: str, _result: Any) -> None:
            self.sql(f"DROP SCHEMA {table.split('.')[0]} CASCADE")

        def ours_setup() -> tuple[Database, str]:
            return self.fresh_database()

        def ours_teardown(state: tuple[Database, str], _result: Any) -> None:
            self.drop(state[1])

        def ours_put(records: list[CompletionRecord], state: tuple[Database, str]) -> int:
            return state[0].put_many(records)

        def raw_put(way: Callable[..., int], records: list[CompletionRecord], table: str) -> int:
            return way(self.raw, table, records)

        self._check_put_many(template, template_schema, raw_setup, raw_teardown)
        try:
            for n in self.sizes.puts:
                records = self.records(n)
                variants = [Variant("ours", partial(ours_put, records), ours_setup, ours_teardown)]
                variants += [Variant(name, partial(raw_put, way, records), raw_setup, raw_teardown)
                             for name, way in RAW_PUTS.items()]  # fmt: skip
                reps = self.reps * 3 if n <= 1_000 else self.reps  # short calls: more samples against the noise
                log(f"  put_many {n:,} new rows x{reps}")
                timings = measure(variants, reps, warmup=n <= 10_000)
                raw = {name: timings[name] for name in RAW_PUTS}
                self.results.append(Result("put_many", f"{n:,} new rows", timings["ours"], raw, n, "row"))
        finally:
            self.drop(template_schema)

    def _check_put_many(self, template: Database, template_schema: str, raw_setup: Any, raw_teardown: Any) -> None:
        records = self.records(1_000)
        if template.put_many(records) != len(records) or template.put_many(records[:10]) != 0:
            raise AssertionError("Database.put_many did not write each new row once")
        ours = self._table_text(f'"{template_schema}".completions')
        for name, way in RAW_PUTS.items():
            table = raw_setup()
            try:
                written = (way(self.raw, table, records), way(self.raw, table, records[:10]))
                if written != (len(records), 0):
                    raise AssertionError(f"{name}: rows written, then re-put: {written}")
                if self._table_text(table) != ours:
                    raise AssertionError(f"{name} does not store the same values as Database.put_many")
            finally:
                raw_teardown(table, None)
        self.sql(f'TRUNCATE "{template_schema}".completions')

    def _table_text(self, table: str) -> list[Any]:
        columns = ", ".join(f"{c}::text" for c in FIELDS)
        return self.sql(f"SELECT {columns} FROM {table} ORDER BY input_hash")  # type: ignore[no-any-return]


# ---------------------------------------------------------------- main


def report(results: Sequence[Result], notes: Sequence[str]) -> None:
    headers = ["case", "judgestore", "raw ways", "best raw", "ratio", f"{TARGET}x", "CPU ratio", "other floors"]
    rows = []
    for r in results:
        ways = ", ".join(f"{name.removeprefix('raw ')} {format_seconds(t.median)}" for name, t in r.raw.items())
        others = ", ".join(
            f"{name} {format_seconds(t.median)} (ours {r.ours.median / t.median:.2f}x)" for name, t in r.extra.items()
        )
        rows.append([f"{r.group}: {r.case}", format_seconds(r.ours.median), ways, r.best_raw.name.removeprefix("raw "),
                     f"{r.ratio:.2f}x", "PASS" if r.ratio <= TARGET else "MISS", f"{r.cpu_ratio:.2f}x",
                     others])  # fmt: skip
    print()
    print_table(headers, rows, right=(1, 4, 6))
    print()
    for note in notes:
        print(f"* {note}")


def main(args: Any) -> int:
    """Run the PostgreSQL cases (``args`` as ``store_bench.py`` parses them)."""
    sizes = dataclasses.replace(QUICK if args.quick else FULL,
                                **({"db_rows": args.db_rows} if args.db_rows is not None else {}))  # fmt: skip
    reps = args.reps or sizes.reps
    only = set(args.only.split(",")) - {"open"}
    env = environment()
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with server(args.url) as url:
        bench = Bench(sizes, url, reps)
        try:
            server_version = bench.sql("SHOW server_version")[0][0]
            fsync = bench.sql("SHOW fsync")[0][0]
            log(f"judgestore bench on PostgreSQL {server_version}: {'quick' if args.quick else 'full'}, {reps} reps")
            if "get" in only:
                bench.bench_get_many()
            if "put" in only:
                bench.bench_put_many()
        finally:
            bench.close()
    import psycopg

    if bench._records:
        bench.notes.insert(0, f"rows: {mean_row_bytes(bench._records[:5_000]) / 1e3:.1f} KB on average")
    bench.notes.append(
        f"medians of {reps} interleaved samples ({reps * 3} for 1,000-row puts); "
        "ratio = judgestore / the fastest raw way (wall clock); "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; PostgreSQL {server_version} "
        f"(fsync={fsync}, {'--url' if args.url else 'throwaway cluster on a Unix socket'}), psycopg "
        f"{psycopg.__version__} ({psycopg.pq.__impl__}), python {env['python']}, sqlalchemy {env['sqlalchemy']}, "
        f"{env['cpus']} CPUs shared by client and server; {time.perf_counter() - started:.0f} s in all"
    )
    report(bench.results, bench.notes)
    if args.json:
        write_json(args.json, {"environment": env, "backend": "postgresql", "quick": args.quick, "reps": reps,
                               "sizes": dataclasses.asdict(sizes), "notes": bench.notes,
                               "results": [r.as_dict() for r in bench.results]})  # fmt: skip
    return 0
