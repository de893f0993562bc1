"""judgestore's hot paths beside stdlib sqlite3 doing the same work (the physical limit).

Usage::

    python bench/store_bench.py [--quick] [--reps N] [--json out.json] [--only get,put,index,open]
                                [--db-rows N] [--open-dbs N] [--workdir DIR] [--keep]
    python bench/store_bench.py --backend postgresql [--url URL] [--quick] ...   (see bench/pg_bench.py)

Every case is measured beside a "raw" variant that uses only ``sqlite3`` and
``orjson`` on an identically-shaped database (the same file for lookups, the
same DDL for inserts) in the same run. Calls are interleaved (call by call
within a sample, variant order alternating), each sample is preceded by a full
``gc.collect()`` and each call ends with a timed ``gc.collect(0)`` (young
objects left behind by code that paused the GC are charged to that code). The
median of the samples is reported, wall clock and process CPU time, and the
ratio is judgestore / raw. Before timing, each raw variant is checked to
produce exactly what judgestore produces (equal records, byte-equal rows), so
the ratio compares the same work.

Cases:

* get_many: ``Database.get_many(hashes, deferred=False)`` (whole records, as
  raw builds them; the cache's own lookup, which leaves the prompt and the
  bookkeeping on disk, is measured by ``bench/peers.py`` against a floor that
  reads what a hit returns) against a database of ``--db-rows``
  rows, at 0 %, 50 % and 100 % hits. Raw: ``SELECT <cols> FROM completions
  WHERE input_hash IN (SELECT value FROM json_each(?))`` in batches of the
  same size, ``fetchall``, then the same result: ``dict[hash, CompletionRecord]``
  with ``usage``/``top_logprobs`` decoded by orjson where not NULL and
  ``created_at`` parsed to an aware UTC datetime, with the cyclic GC paused
  (the fastest correct raw code). The "fetch only" column is the query and
  ``fetchall`` alone: the I/O floor under any Python result.
* put_many: ``Database.put_many(records)`` of new rows into a fresh database.
  Raw: ``executemany("INSERT OR IGNORE ...")`` in one ``BEGIN IMMEDIATE``
  transaction, same pragmas (WAL, synchronous=NORMAL, busy timeout, foreign
  keys), JSON columns encoded by orjson with sorted keys, ``created_at`` as
  SQLAlchemy stores it on SQLite (``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC).
* index: what each secondary index costs a write: raw put_many of new rows
  with all of them, without each one, and without any (printed as a note).
* open: open-and-check ``--open-dbs`` current databases with a fresh
  :class:`~store.store.Store` per sample (so the engine cache hides
  nothing), then close them all. Raw per database: read metadata.json, hash
  its descriptor and compare with the folder name, ``sqlite3.connect``, the
  same PRAGMAs, one ``SELECT version_num FROM judgestore_alembic_version``,
  close. The migration scripts are read once per process (before timing), as
  the library does. The SQL judgestore sends per open is printed too.

Targets (issue 2): get_many and put_many within 1.2x of raw; opening a current
database costs one SELECT (about a millisecond). PASS/MISS is printed against
1.2x; the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/store_bench.py` from anywhere

from bench.common import (
    FIELDS,
    RAW_COLUMNS,
    SELECT_BY_KEYS,
    Timing,
    Variant,
    completion_records,
    discard,
    environment,
    file_of,
    format_seconds,
    gc_paused,
    mean_row_bytes,
    measure,
    miss_hashes,
    print_table,
    raw_connect,
    raw_get_many,
    write_json,
)
from store import Database, Settings, Store
from store.backends.sqlite.rows import LOOKUP_BATCH
from store.descriptor import ModelDescriptor
from store.layout import Location, metadata_bytes, write_metadata
from store.roles import Role
from store.schema import VERSION_TABLE, revisions
from store.tables.records import CompletionRecord

TARGET = 1.2
ROLE: Role = "completions"
TASK = "bench"
COLUMNS = RAW_COLUMNS  # raw_row's order
INSERT_IGNORE = f"INSERT OR IGNORE INTO completions ({COLUMNS}) VALUES ({', '.join('?' * len(FIELDS))})"


@dataclass
class Sizes:
    db_rows: int
    lookups: tuple[int, ...]
    hit_rates: tuple[float, ...]
    puts: tuple[int, ...]
    open_dbs: int
    reps: int


FULL = Sizes(
    db_rows=100_000,
    lookups=(1_000, 10_000, 100_000),
    hit_rates=(0.0, 0.5, 1.0),
    puts=(10_000, 100_000),
    open_dbs=1_000,
    reps=5,
)
QUICK = Sizes(db_rows=10_000, lookups=(1_000, 10_000), hit_rates=(0.0, 0.5, 1.0), puts=(10_000,), open_dbs=200, reps=3)


@dataclass
class Result:
    group: str
    case: str
    ours: Timing
    raw: Timing
    unit: int  # rows, keys or databases: per-unit figures divide by this
    unit_name: str
    extra: dict[str, Timing] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ours.median / self.raw.median

    @property
    def cpu_ratio(self) -> float:
        return self.ours.cpu_median / self.raw.cpu_median

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "case": self.case,
            "unit": self.unit,
            "unit_name": self.unit_name,
            "ours": self.ours.as_dict(),
            "raw": self.raw.as_dict(),
            "ratio": self.ratio,
            "cpu_ratio": self.cpu_ratio,
            "target": TARGET,
            "pass": self.ratio <= TARGET,
            "extra": {k: v.as_dict() for k, v in self.extra.items()},
        }


def inner_calls(estimated_s: float, sample_s: float = 0.25) -> int:
    """Calls per timed sample so that one sample lasts about ``sample_s`` (1 to 50)."""
    return max(1, min(50, round(sample_s / estimated_s)))


def _ignore_state(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, called as ``run(state)`` by :func:`measure` (the state comes last and is dropped)."""
    return function(*args[:-1])


def _ours_put(records: list[CompletionRecord], state: tuple[Store, Database, Path]) -> int:
    return state[1].put_many(records)


def _raw_put(records: list[CompletionRecord], state: tuple[sqlite3.Connection, Path]) -> int:
    return raw_put_many(state[0], records)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- raw sqlite3: the same work


def raw_fetch_only(conn: sqlite3.Connection, hashes: Sequence[str]) -> int:
    """The query and ``fetchall`` alone, nothing built from the rows."""
    keys = list(dict.fromkeys(hashes))
    n = 0
    with gc_paused():
        conn.execute("BEGIN")
        try:
            for start in range(0, len(keys), LOOKUP_BATCH):
                chunk = orjson.dumps(keys[start : start + LOOKUP_BATCH]).decode()
                n += len(conn.execute(SELECT_BY_KEYS, (chunk,)).fetchall())
        finally:
            conn.execute("COMMIT")
    return n


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def raw_row(r: CompletionRecord) -> tuple[Any, ...]:
    """A record as judgestore stores it, in :data:`~bench.common.RAW_FIELDS` order."""
    return (
        r.input_hash,
        r.sample_index,
        r.input_text,
        r.completion,
        r.benchmark,
        r.instruction_id,
        r.model,
        r.finish_reason,
        _json_text(r.usage),
        _json_text(r.top_logprobs),
        r.run_id,
        r.created_by,
        r.created_at.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds"),
        r.adopted_from,
    )


def raw_put_many(conn: sqlite3.Connection, records: Sequence[CompletionRecord]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        cursor = conn.executemany(INSERT_IGNORE, [raw_row(r) for r in records])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return cursor.rowcount


@dataclass(frozen=True)
class RawTarget:
    """What raw code knows about one database: its file and folder (paths are computed once)."""

    db_path: Path
    folder_name: str


def raw_open_check(target: RawTarget, settings: Settings, head: str) -> None:
    """Verify metadata.json against the folder, connect with the pragmas, one SELECT of the version."""
    doc = orjson.loads((target.db_path.parent / "metadata.json").read_bytes())
    digest = hashlib.sha256(orjson.dumps(doc["descriptor"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    if digest != doc["descriptor_sha256"] or digest[:16] != target.folder_name:
        raise AssertionError(f"{target.db_path}: metadata does not match its folder")
    conn = raw_connect(target.db_path, settings)
    try:
        (revision,) = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        if revision != head:
            raise AssertionError(f"{target.db_path}: at {revision}, head is {head}")
    finally:
        conn.close()


def schema_ddl(path: Path) -> list[str]:
    """The CREATE statements of a database, in creation order: an identically-shaped empty copy."""
    conn = sqlite3.connect(path)
    try:
        return [sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")]
    finally:
        conn.close()


def all_rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            f"SELECT {', '.join(f'{c}, typeof({c})' for c in FIELDS)} FROM completions ORDER BY input_hash"
        ).fetchall()
    finally:
        conn.close()


# ---------------------------------------------------------------- the cases


class Bench:
    def __init__(self, sizes: Sizes, workdir: Path, reps: int) -> None:
        self.sizes = sizes
        self.workdir = workdir
        self.reps = reps
        self.settings = Settings(store_root=workdir / "unused", run_id="bench-run", created_by="bench")
        self.descriptor = ModelDescriptor(provider="bench", model="bench/model-1")
        self.results: list[Result] = []
        self.notes: list[str] = []
        self._records: list[CompletionRecord] = []
        self.index_timings: dict[str, Timing] = {}

    def records(self, n: int) -> list[CompletionRecord]:
        if len(self._records) < n:
            t0 = time.perf_counter()
            self._records += completion_records(n - len(self._records), start=len(self._records))
            log(f"  generated {n:,} rows in {time.perf_counter() - t0:.1f} s")
        return self._records[:n]

    def fresh_database(self, root: Path) -> tuple[Store, Database]:
        store = Store(self.settings, root=root)
        return store, store.database(ROLE, TASK, self.descriptor)

    # ------------------------------------------------------------ get_many

    def bench_get_many(self) -> None:
        s = self.sizes
        records = self.records(s.db_rows)
        log(f"get_many: building a {s.db_rows:,}-row database")
        store, db = self.fresh_database(self.workdir / "lookup")
        for start in range(0, len(records), 10_000):
            db.put_many(records[start : start + 10_000])
        with closing(sqlite3.connect(file_of(db), isolation_level=None)) as checkpoint:  # outside any transaction
            checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size_mb = file_of(db).stat().st_size / 1e6
        self.notes.append(f"lookup database: {s.db_rows:,} rows, {size_mb:,.0f} MB, same file for both variants")
        raw = raw_connect(file_of(db), self.settings)
        misses = miss_hashes(max(s.lookups))
        whole = partial(db.get_many, deferred=False)  # every column read, as raw_get_many reads them
        try:
            self._check_get_many(whole, raw, records[:500], misses[:500])
            for n in s.lookups:
                for hit_rate in s.hit_rates:
                    hits = round(n * hit_rate)
                    if hits > len(records):
                        continue
                    stride = max(len(records) // max(hits, 1), 1)
                    keys = [r.input_hash for r in records[::stride][:hits]] + misses[: n - hits]
                    random.Random(n).shuffle(keys)
                    inner = inner_calls(n * (hit_rate * 40e-6 + (1 - hit_rate) * 2e-6))
                    log(f"  get_many {n:,} keys, {hit_rate:.0%} hits: {self.reps} x {inner} calls")
                    timings = measure(
                        [
                            Variant("ours", partial(_ignore_state, whole, keys), check=discard),
                            Variant("raw", partial(_ignore_state, raw_get_many, raw, keys), check=discard),
                            Variant("fetch", partial(_ignore_state, raw_fetch_only, raw, keys), check=discard),
                        ],
                        self.reps,
                        inner=inner,
                    )
                    self.results.append(
                        Result(
                            "get_many",
                            f"{n:,} keys, {hit_rate:.0%} hits",
                            timings["ours"],
                            timings["raw"],
                            n,
                            "key",
                            {"fetch only": timings["fetch"]},
                        )
                    )
        finally:
            raw.close()
            store.close()

    def _check_get_many(
        self,
        get_many: Callable[[list[str]], dict[str, Any]],
        raw: sqlite3.Connection,
        records: list[CompletionRecord],
        misses: list[str],
    ) -> None:
        keys = [r.input_hash for r in records] + misses
        ours, theirs = get_many(keys), raw_get_many(raw, keys)
        if ours != theirs or ours != {r.input_hash: r for r in records}:
            raise AssertionError("raw get_many does not build the same result as Database.get_many")

    # ------------------------------------------------------------ put_many

    def bench_put_many(self) -> None:
        template_store, template = self.fresh_database(self.workdir / "template")
        template_store.close()
        ddl = schema_ddl(file_of(template))
        counter = iter(range(10**9))

        def raw_setup() -> tuple[sqlite3.Connection, Path]:
            path = self.workdir / f"raw-put-{next(counter)}.db"
            conn = raw_connect(path, self.settings)
            for statement in ddl:
                conn.execute(statement)
            return conn, path

        def raw_teardown(state: tuple[sqlite3.Connection, Path], _result: Any) -> None:
            conn, path = state
            conn.close()
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)

        def ours_setup() -> tuple[Store, Database, Path]:
            root = self.workdir / f"ours-put-{next(counter)}"
            store, db = self.fresh_database(root)
            return store, db, root

        def ours_teardown(state: tuple[Store, Database, Path], _result: Any) -> None:
            store, _db, root = state
            store.close()
            shutil.rmtree(root)

        self._check_put_many(ours_setup, ours_teardown, raw_setup, raw_teardown)
        for n in self.sizes.puts:
            records = self.records(n)
            log(f"  put_many {n:,} new rows x{self.reps}")
            timings = measure(
                [
                    Variant("ours", partial(_ours_put, records), ours_setup, ours_teardown),
                    Variant("raw", partial(_raw_put, records), raw_setup, raw_teardown),
                ],
                self.reps,
                warmup=n <= 10_000,
            )
            self.results.append(Result("put_many", f"{n:,} new rows", timings["ours"], timings["raw"], n, "row"))

    def _check_put_many(self, ours_setup: Any, ours_teardown: Any, raw_setup: Any, raw_teardown: Any) -> None:
        records = self.records(1_000)
        ours_state, raw_state = ours_setup(), raw_setup()
        try:
            written = (ours_state[1].put_many(records), raw_put_many(raw_state[0], records))
            again = (ours_state[1].put_many(records[:10]), raw_put_many(raw_state[0], records[:10]))
            if written != (len(records), len(records)) or again != (0, 0):
                raise AssertionError(f"rows written (ours, raw): {written}, re-put: {again}")
            ours_state[0].close()
            raw_state[0].close()
            if all_rows(file_of(ours_state[1])) != all_rows(raw_state[1]):
                raise AssertionError("raw put_many does not store the same bytes as Database.put_many")
        finally:
            ours_teardown(ours_state, None)
            raw_teardown(raw_state, None)

    # ------------------------------------------------------------ what each index costs a write

    def bench_indexes(self) -> None:
        """Raw put_many of new rows with every secondary index, without each one, and without any.

        Measured on the raw floor (the same DDL, less one ``CREATE INDEX``) so
        the figure is the index's own cost, not judgestore's code around it.
        """
        template_store, template = self.fresh_database(self.workdir / "index-template")
        template_store.close()
        ddl = schema_ddl(file_of(template))
        indexes = [sql.split()[2] for sql in ddl if sql.startswith("CREATE INDEX") and " completions " in sql]
        counter = iter(range(10**9))

        def setup_without(dropped: frozenset[str]) -> Callable[[], tuple[sqlite3.Connection, Path]]:
            def setup() -> tuple[sqlite3.Connection, Path]:
                path = self.workdir / f"index-put-{next(counter)}.db"
                conn = raw_connect(path, self.settings)
                for statement in ddl:
                    if not (statement.startswith("CREATE INDEX") and statement.split()[2] in dropped):
                        conn.execute(statement)
                return conn, path

            return setup

        def teardown(state: tuple[sqlite3.Connection, Path], _result: Any) -> None:
            conn, path = state
            conn.close()
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)

        n = self.sizes.puts[0]
        records = self.records(n)
        variants = [Variant("all indexes", partial(_raw_put, records), setup_without(frozenset()), teardown)]
        variants += [
            Variant(f"without {name}", partial(_raw_put, records), setup_without(frozenset({name})), teardown)
            for name in indexes
        ]
        variants.append(Variant("no index", partial(_raw_put, records), setup_without(frozenset(indexes)), teardown))
        log(f"  put_many {n:,} new rows (raw) with and without each of {len(indexes)} indexes x{self.reps}")
        timings = measure(variants, self.reps)
        full = timings["all indexes"].median
        lines = [f"raw put_many of {n:,} new rows with all {len(indexes)} secondary indexes: {format_seconds(full)}"]
        for name in [*(f"without {i}" for i in indexes), "no index"]:
            t = timings[name].median
            lines.append(
                f"{name}: {format_seconds(t)} (the index{'es' if name == 'no index' else ''} cost "
                f"{(full - t) / t:+.0%} of a write)"
            )
        self.notes.append("index cost: " + "; ".join(lines))
        self.index_timings = timings

    # ------------------------------------------------------------ open

    def bench_open(self) -> None:
        n = self.sizes.open_dbs
        root = self.workdir / "many"
        log(f"open: creating {n:,} current databases")
        descriptors = [ModelDescriptor(provider="bench", model=f"bench/model-{i:04d}") for i in range(n)]
        store, first = self.fresh_database(root)
        store.database(ROLE, TASK, descriptors[0]).put_many(self.records(10))
        store.close()
        locations = [Location.of(ROLE, TASK, d) for d in descriptors]
        template = self.workdir / "template-open.db"
        shutil.copyfile(Location.of(ROLE, TASK, descriptors[0]).db_path(root), template)
        for d, loc in zip(descriptors[1:], locations[1:], strict=True):
            write_metadata(loc.folder(root), metadata_bytes(ROLE, TASK, d))
            shutil.copyfile(template, loc.db_path(root))
        shutil.rmtree(file_of(first).parent)  # the bench descriptor's own database is not one of the n
        targets = [RawTarget(loc.db_path(root), loc.descriptor_hash16) for loc in locations]
        head = revisions().head  # once per process, as the library does

        def ours_database(_state: Any) -> None:
            with Store(self.settings, root=root) as s:
                for d in descriptors:
                    s.database(ROLE, TASK, d)

        def ours_open(_state: Any) -> None:
            with Store(self.settings, root=root) as s:
                for loc in locations:
                    s.open(loc)

        def raw(_state: Any) -> None:
            for t in targets:
                raw_open_check(t, self.settings, head)

        self.notes.append("open: SQL judgestore sends to open one current database: " + "; ".join(self._open_sql(root)))
        log(f"  open {n:,} databases x{self.reps}")
        timings = measure(
            [Variant("ours", ours_database), Variant("ours_open", ours_open), Variant("raw", raw)], self.reps
        )
        self.results.append(Result("open", f"{n:,} dbs, Store.database()", timings["ours"], timings["raw"], n, "db"))
        self.results.append(
            Result("open", f"{n:,} dbs, Store.open(location)", timings["ours_open"], timings["raw"], n, "db")
        )

    def _open_sql(self, root: Path) -> list[str]:
        """Every statement SQLite sees while judgestore opens one current database (pragmas included)."""
        import store.backends.sqlite.connections as engine_module

        seen: list[str] = []

        class Tracing:
            def __getattr__(self, name: str) -> Any:
                return getattr(sqlite3, name)

            @staticmethod
            def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
                conn = sqlite3.connect(*args, **kwargs)
                conn.set_trace_callback(seen.append)
                return conn

        original = engine_module.sqlite3
        engine_module.sqlite3 = Tracing()  # type: ignore[assignment]
        try:
            with Store(self.settings, root=root) as s:
                s.database(ROLE, TASK, ModelDescriptor(provider="bench", model="bench/model-0000"))
        finally:
            engine_module.sqlite3 = original
        return [" ".join(statement.split()) for statement in seen]


# ---------------------------------------------------------------- main


def report(results: Sequence[Result], notes: Sequence[str]) -> None:
    headers = [
        "case",
        "judgestore",
        "raw sqlite3",
        "ratio",
        "1.2x",
        "CPU ratio",
        "per unit (ours / raw)",
        "other floors",
    ]
    rows = []
    for r in results:
        per_unit = f"{format_seconds(r.ours.median / r.unit)} / {format_seconds(r.raw.median / r.unit)}"
        others = ", ".join(
            f"{name} {format_seconds(t.median)} (ours {r.ours.median / t.median:.2f}x)" for name, t in r.extra.items()
        )
        rows.append(
            [
                f"{r.group}: {r.case}",
                format_seconds(r.ours.median),
                format_seconds(r.raw.median),
                f"{r.ratio:.2f}x",
                "PASS" if r.ratio <= TARGET else "MISS",
                f"{r.cpu_ratio:.2f}x",
                f"{per_unit} per {r.unit_name}",
                others,
            ]
        )
    print()
    print_table(headers, rows, right=(1, 2, 3, 5))
    print()
    for note in notes:
        print(f"* {note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and 3 repetitions (about a minute)")
    parser.add_argument("--reps", type=int, help="repetitions per case (default 5, --quick 3)")
    parser.add_argument("--json", type=Path, help="also write every timing to this file")
    parser.add_argument("--only", default="get,put,index,open", help="comma-separated subset of get,put,index,open")
    parser.add_argument("--db-rows", type=int, help="rows of the lookup database (default 100,000, --quick 10,000)")
    parser.add_argument("--open-dbs", type=int, help="databases opened per sample (default 1,000, --quick 200)")
    parser.add_argument("--workdir", type=Path, help="where the databases go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--backend",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="postgresql: get and put beside raw psycopg on one server (bench/pg_bench.py)",
    )
    parser.add_argument("--url", help="with --backend postgresql: bench in this database (default: a throwaway server)")
    args = parser.parse_args(argv)
    # Checked for both backends (PostgreSQL's took a bad value silently, was)
    if any(n is not None and n < 1 for n in (args.reps, args.db_rows, args.open_dbs)):
        parser.error("--reps, --db-rows and --open-dbs must be at least 1")
    only = set(args.only.split(","))
    if not only <= {"get", "put", "index", "open"}:
        parser.error(f"--only: unknown cases {sorted(only - {'get', 'put', 'index', 'open'})}")
    if args.backend == "postgresql":
        if args.only != parser.get_default("only") and (unbenched := only - {"get", "put"}):
            parser.error(f"--backend postgresql benches get and put only, not {', '.join(sorted(unbenched))}")
        if args.open_dbs is not None:
            parser.error("--open-dbs is a case of the SQLite bench (open); --backend postgresql has none")
        from bench import pg_bench

        return pg_bench.main(args)
    sizes = dataclasses.replace(
        QUICK if args.quick else FULL,
        **{k: v for k, v in (("db_rows", args.db_rows), ("open_dbs", args.open_dbs)) if v is not None},
    )
    reps = args.reps or sizes.reps

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    # A folder of its own, even inside --workdir: removing it at the end removes nothing that was there before.
    workdir = Path(tempfile.mkdtemp(prefix="judgestore-bench-", dir=args.workdir))
    env = environment()
    log(f"judgestore bench: {'quick' if args.quick else 'full'}, {reps} repetitions, work folder {workdir}")
    bench = Bench(sizes, workdir, reps)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    revisions()  # the migration scripts, read once per process (not part of any timing)
    cases: list[tuple[str, Callable[[], None]]] = [
        ("get", bench.bench_get_many),
        ("put", bench.bench_put_many),
        ("index", bench.bench_indexes),
        ("open", bench.bench_open),
    ]
    try:
        for name, run in cases:
            if name in only:
                run()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if bench._records:
        bench.notes.insert(
            0,
            f"rows: {mean_row_bytes(bench._records[:5_000]) / 1e3:.1f} KB on average "
            "(prompt 2-8 KB, completion 1-4 KB, top_logprobs ~1.2 KB JSON in half the rows)",
        )
    bench.notes.append(
        "raw get_many builds the same dict[hash, CompletionRecord] (JSON decoded, created_at parsed) with GC "
        "paused; 'fetch only' is the query and fetchall alone"
    )
    bench.notes.append(
        f"medians of {reps} interleaved samples (short lookups: several calls per sample, time per call shown); "
        "ratio = wall clock (the figure), CPU ratio = process CPU time (less sensitive to other load); "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"python {env['python']}, sqlite {env['sqlite']}, sqlalchemy {env['sqlalchemy']}, orjson {env['orjson']}, "
        f"{env['cpus']} CPUs; {time.perf_counter() - started:.0f} s in all"
    )
    report(bench.results, bench.notes)
    if args.json:
        write_json(
            args.json,
            {
                "environment": env,
                "quick": args.quick,
                "reps": reps,
                "sizes": dataclasses.asdict(sizes),
                "notes": bench.notes,
                "results": [r.as_dict() for r in bench.results],
                "index_cost": {name: t.as_dict() for name, t in bench.index_timings.items()},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
