"""Commands over a store of many descriptor databases: ``ls``, ``stats``, ``db status``, ``query --model X``.

Contract:

* Usage::

      python bench/scale_bench.py [--sizes 500,1000,5000] [--rows 10] [--backends folder,postgres]
                                  [--reps 3] [--url URL] [--workdir DIR] [--json out.json]

* One store per backend grows to each size in turn (databases are added, never
  rebuilt): a folder store, and a PostgreSQL store on a throwaway server
  (``tests/pg_server.py``) or on ``--url``. One database in five holds
  judgements (model_a/model_b/judge), the others completions; each database's
  descriptor names its own model and its rows carry it, over 20 tasks, with
  ``--rows`` rows each.
* Building is not timed and is fast: the first database of each role is
  written through the API, the others are copies of it (a folder: the file
  copied in by hand beside a metadata.json written for its descriptor, its
  rows' model changed; a server: ``CREATE TABLE ... (LIKE ... INCLUDING ALL)``,
  the registry row and the generation triggers judgestore puts on a schema it
  creates), as a lab's store that grew by hand and by ``copy``.
* At each size every command runs ``--reps`` times as a fresh process
  (``python -m store``: start-up and imports included, as a user meets it),
  wall clock and CPU time (user + system, from ``wait4``: what the command
  costs, whatever else the machine runs), medians printed; the first run
  after growing (a catalog rebuilt, if the store keeps one) is reported
  apart as "first". Every command's first run meets the caches as they were
  right after growing: judgestore's cache folder (``XDG_CACHE_HOME``, kept in
  the work folder) is put back as it was then before each command's first
  run, so a command run earlier has not already brought the catalog up to
  date for it.
* Each command must exit 0 and ``query --model X`` must print the rows of X
  (one database's); after its timed runs, ``ls``, ``stats`` and ``db status``
  run once more, untimed, with ``--json``, and must list every database
  (``ls`` and ``stats`` with its rows): otherwise the bench stops with exit
  status 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/scale_bench.py` from anywhere

from bench.common import environment, print_table, write_json
from store import Settings, Store
from store.descriptor import ModelDescriptor
from store.layout import Location, metadata_bytes, write_metadata
from store.roles import Role
from tests.factories import completion_record, judgement_record

TASKS = 20
COMMANDS: dict[str, list[str]] = {
    "ls": ["ls"],
    "stats": ["stats"],
    "db status": ["db", "status"],
    "query --model X": ["query", "--model", "{model}", "--json"],
    "verify": ["verify", "--json"],  # not among the targets: run it with --commands
}
TARGETS = ("ls", "stats", "db status", "query --model X")


def descriptor_of(i: int) -> tuple[Role, str, ModelDescriptor]:
    """The ``i``-th database: its role, task and descriptor (its own model)."""
    role: Role = "judgements" if i % 5 == 4 else "completions"
    return role, f"task-{i % TASKS:02d}", ModelDescriptor(provider="vllm", model=f"org/model-{i:05d}")


def model_of(i: int) -> str:
    return f"org/model-{i:05d}"


def template_rows(role: Role, rows: int) -> list[Any]:
    if role == "completions":
        return [completion_record(k, model="TEMPLATE") for k in range(rows)]
    return [judgement_record(k, model_a="TEMPLATE", model_b="other/model", judge="judge/x") for k in range(rows)]


def _model_column(role: Role) -> str:
    return "model" if role == "completions" else "model_a"


class Grower:
    """Adds databases to one store; ``grow(n)`` makes it hold databases 0..n-1."""

    size = 0

    def grow(self, n: int) -> None:
        raise NotImplementedError

    env: dict[str, str]


class FolderGrower(Grower):
    def __init__(self, root: Path, rows: int) -> None:
        self.root, self.rows = root, rows
        self.env = {"JUDGESTORE_STORE_ROOT": str(root)}
        self.templates: dict[str, Path] = {}

    def _template(self, role: Role, i: int) -> Path:
        _, task, descriptor = descriptor_of(i)
        with Store(Settings(), root=self.root) as store:
            database = store.database(role, task, descriptor)
            rows = template_rows(role, self.rows)
            database.put_many(rows)
        path = Location.of(role, task, descriptor).db_path(self.root)
        self._retag(path, role, model_of(i))
        template = self.root.parent / f"template-{role}.db"
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copyfile(path, template)
        return template

    @staticmethod
    def _retag(path: Path, role: Role, model: str) -> None:
        conn = sqlite3.connect(path)
        try:
            column = "model" if role == "completions" else "model_a"
            with conn:
                conn.execute(f"UPDATE {role} SET {column} = ?", (model,))
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()

    def grow(self, n: int) -> None:
        for i in range(self.size, n):
            role, task, descriptor = descriptor_of(i)
            if role not in self.templates:
                self.templates[role] = self._template(role, i)
                continue
            location = Location.of(role, task, descriptor)
            folder = location.folder(self.root)
            folder.mkdir(parents=True, exist_ok=True)
            write_metadata(folder, metadata_bytes(role, task, descriptor))
            path = location.db_path(self.root)
            shutil.copyfile(self.templates[role], path)
            self._retag(path, role, model_of(i))
        self.size = max(self.size, n)


class PostgresGrower(Grower):
    def __init__(self, url: str, rows: int) -> None:
        self.url, self.rows = url, rows
        self.env = {"JUDGESTORE_STORE_URL": url}
        self.templates: dict[str, str] = {}
        self.tables: dict[str, list[str]] = {}

    def grow(self, n: int) -> None:
        from sqlalchemy import text

        from store.backends.postgres.generations import install
        from store.backends.postgres.registry import quoted, register, schema_name

        with Store(Settings(), url=self.url) as store:
            engine = store.storage.engine  # type: ignore[attr-defined]
            for i in range(self.size, n):
                role, task, descriptor = descriptor_of(i)
                if role not in self.templates:  # the first of its role, through the API
                    store.database(role, task, descriptor).put_many(template_rows(role, self.rows))
                    self.templates[role] = name = schema_name(Location.of(role, task, descriptor))
                    with engine.begin() as conn:
                        conn.execute(text(f"UPDATE {quoted(name)}.{role} SET {_model_column(role)} = :m"),
                                     {"m": model_of(i)})  # fmt: skip
                        found = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": name})
                        self.tables[role] = [table for (table,) in found]
            todo = [i for i in range(self.size, n) if schema_name(Location.of(*descriptor_of(i))) not in
                    self.templates.values()]  # fmt: skip
            for start in range(0, len(todo), 200):
                with engine.begin() as conn:
                    for i in todo[start : start + 200]:
                        role, task, descriptor = descriptor_of(i)
                        location = Location.of(role, task, descriptor)
                        source, name = quoted(self.templates[role]), quoted(schema_name(location))
                        conn.execute(text(f"CREATE SCHEMA {name}"))
                        for table in self.tables[role]:
                            conn.execute(text(f"CREATE TABLE {name}.{table} (LIKE {source}.{table} INCLUDING ALL)"))
                            conn.execute(text(f"INSERT INTO {name}.{table} SELECT * FROM {source}.{table}"))
                        conn.execute(text(f"UPDATE {name}.{role} SET {_model_column(role)} = :m"), {"m": model_of(i)})
                        meta = metadata_bytes(role, task, descriptor)
                        register(conn, location, orjson.loads(meta)["descriptor_sha256"], meta.decode())
                        install(conn, schema_name(location))  # the generation triggers judgestore gives a schema
        self.size = max(self.size, n)


@contextmanager
def postgres_url(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.pg_server import running_cluster

    with running_cluster() as cluster:
        yield cluster.url(cluster.new_database())


@dataclass
class Result:
    backend: str
    size: int
    command: str
    first: float
    times: list[float]
    first_cpu: float
    cpu: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


def run_command(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``python -m store argv``: its wall seconds, its CPU seconds (user + system, from ``wait4``), stdout."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([sys.executable, "-m", "store", *argv], env={**os.environ, **env, "COLUMNS": "200"},
                                   stdout=out, stderr=err, text=True)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
        took = time.perf_counter() - started
        process.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise SystemExit(f"`judgestore {' '.join(argv)}` failed ({code}): {err.read()[-2000:]}")
        return took, usage.ru_utime + usage.ru_stime, out.read()


def check_listing(name: str, argv: list[str], env: dict[str, str], size: int, rows: int) -> None:
    """``ls``, ``stats`` or ``db status`` with ``--json`` (untimed) lists all ``size`` databases, and ``ls`` and
    ``stats`` their ``rows`` rows each (``verify``: checked them all): a command that skipped databases would
    otherwise just look fast."""
    listed = orjson.loads(run_command([*argv, "--json"] if "--json" not in argv else argv, env)[2])
    if name == "verify":  # a count, and every row's key checked
        if (listed["databases"], listed["rows_checked"], listed["ok"]) != (size, size * rows, True):
            raise SystemExit(f"`judgestore verify` checked {listed['databases']:,} of {size:,} databases: {listed}")
        return
    databases = listed if isinstance(listed, list) else listed["databases"]
    counts = None  # db status counts no rows
    if name == "ls":
        counts = [d["rows"] for d in databases]
    elif name == "stats":
        counts = [d["rows"]["rows"] for d in databases]
    if len(databases) != size or (counts is not None and counts != [rows] * size):
        raise SystemExit(f"`judgestore {' '.join(argv)}` listed {len(databases):,} of {size:,} databases ({counts})")


def bench(backend: str, grower: Grower, sizes: Sequence[int], reps: int, rows: int, cache: Path) -> list[Result]:
    results = []
    env = {**grower.env, "XDG_CACHE_HOME": str(cache)}
    grown = cache.with_name(cache.name + "-as-grown")
    for size in sizes:
        started = time.perf_counter()
        grower.grow(size)
        print(f"{backend}: {size:,} databases built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        shutil.rmtree(grown, ignore_errors=True)
        if cache.exists():
            shutil.copytree(cache, grown)
        target = size // 2
        for name, template in COMMANDS.items():
            argv = [part.format(model=model_of(target)) for part in template]
            shutil.rmtree(cache, ignore_errors=True)  # the caches as the store's growth left them
            if grown.exists():
                shutil.copytree(grown, cache)
            times, cpu = [], []
            for _ in range(reps + 1):
                took, used, out = run_command(argv, env)
                times.append(took)
                cpu.append(used)
                if name.startswith("query"):
                    found = orjson.loads(out)
                    models = {row.get("model") or row.get("model_a") for row in found}
                    if len(found) != rows or models != {model_of(target)}:
                        raise SystemExit(f"query --model {model_of(target)} gave {len(found)} rows of {models}")
            if not name.startswith("query"):
                check_listing(name, argv, env, size, rows)
            results.append(Result(backend, size, name, times[0], times[1:], cpu[0], cpu[1:]))
            print(f"  {name}: first {times[0]:.2f} s ({cpu[0]:.2f} s CPU), median {statistics.median(times[1:]):.2f} s "
                  f"({statistics.median(cpu[1:]):.2f} s CPU)", file=sys.stderr)  # fmt: skip
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500,1000,5000", help="databases at each step (default 500,1000,5000)")
    parser.add_argument("--rows", type=int, default=10, help="rows per database (default 10)")
    parser.add_argument("--backends", default="folder,postgres")
    parser.add_argument("--reps", type=int, default=3, help="runs of each command after the first (default 3)")
    parser.add_argument("--url", help="a PostgreSQL store URL to fill (default: a throwaway server)")
    parser.add_argument("--workdir", type=Path, help="where the folder store goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write every timing to this file")
    parser.add_argument(
        "--commands", default=",".join(TARGETS), help=f"which commands (default: {', '.join(TARGETS)}; also verify)"
    )
    args = parser.parse_args(argv)
    if unknown := set(args.commands.split(",")) - set(COMMANDS):
        parser.error(f"--commands: unknown {', '.join(sorted(unknown))} (known: {', '.join(COMMANDS)})")
    for name in list(COMMANDS):
        if name not in args.commands.split(","):
            del COMMANDS[name]
    try:
        sizes = sorted(int(s) for s in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes must be comma-separated numbers, not {args.sizes!r}")
    backends = args.backends.split(",")
    if unknown := set(backends) - {"folder", "postgres"}:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))} (known: folder, postgres)")
    if min(sizes) < 1 or args.rows < 1 or args.reps < 1:
        parser.error("--sizes, --rows and --reps must be at least 1")
    if len(set(sizes)) < len(sizes):  # the store grows from one size to the next: a size twice failed at the end
        parser.error(f"--sizes names a size twice: {args.sizes!r}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="judgestore-scale-"))
    results: list[Result] = []
    try:
        if "folder" in backends:
            grower: Grower = FolderGrower(workdir / "store", args.rows)
            results += bench("folder", grower, sizes, args.reps, args.rows, workdir / "cache-folder")
        if "postgres" in backends:
            with postgres_url(args.url) as url:
                grower = PostgresGrower(url, args.rows)
                results += bench("postgres", grower, sizes, args.reps, args.rows, workdir / "cache-postgres")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    headers = ["backend", "command", *(f"{size:,} dbs" for size in sizes)]
    rows = []
    for backend in backends:
        for name in COMMANDS:
            cells = [backend, name]
            for size in sizes:
                (r,) = [r for r in results if (r.backend, r.size, r.command) == (backend, size, name)]
                cells.append(f"{r.median:.2f} s / {r.median_cpu:.2f} s CPU (first {r.first:.1f} / {r.first_cpu:.1f})")
            rows.append(cells)
    print()
    print_table(headers, rows, right=tuple(range(2, len(headers))), markdown=True)
    env = environment()
    print(f"\n* {args.rows} rows per database; medians of {args.reps} runs after the first, wall clock, each a fresh "
          f"process; python {env['python']}, sqlite {env['sqlite']}, {env['cpus']} CPUs")  # fmt: skip
    if args.json:
        write_json(args.json, {"environment": env, "rows": args.rows, "results": [vars(r) for r in results]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
