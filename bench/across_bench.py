"""Memory while ``Store.scalars`` streams every row of many databases: it stays flat, whatever the row count.

Contract:

* Builds a store of ``--databases`` completion databases holding ``--rows``
  rows in all (small rows: a rendered prompt of 120-300 characters and a
  completion of 60-200, so a million rows fit in about 0.5 GB of files), in a
  child process, so the parent's peak RSS is the reading's alone.
* Then streams every row three ways, touching each object and keeping none:
  ``select(Completion).order_by(Completion.created_at, Completion.input_hash)``
  (the k-way merge), the same without ``order_by`` (databases one after
  another), and ``Store.execute`` of ``count``/``sum`` grouped by benchmark.
  It prints the process's RSS after 10 %, 50 % and 100 % of the rows, each
  way's own peak RSS (``VmHWM``, which writing 5 to ``/proc/self/clear_refs``
  resets to the current RSS before each way: Linux), and rows per second.
* Default: 1,000,000 rows across 100 databases (building them takes several
  minutes); ``--quick`` is 50,000 rows across 20. ``--url`` runs it on a
  PostgreSQL store (an empty database); without it, a temporary folder.
  Always exits 0 unless the rows read differ from the rows written.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import completion_records, environment
from store import Completion, Settings, Store
from store.descriptor import ModelDescriptor

CHUNK = 5_000


def _descriptor(i: int) -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model=f"bench/model-{i}", sampling={"temperature": 0, "seed": i})


def _open(where: str) -> Store:
    return Store(Settings(), url=where) if "://" in where else Store(Settings(), root=where)


def build(where: str, rows: int, databases: int) -> None:
    """Write ``rows`` rows across ``databases`` databases (row i goes to database i % databases)."""
    with _open(where) as store:
        opened = [store.database("completions", "bench", _descriptor(d)) for d in range(databases)]
        for start in range(0, rows, CHUNK):
            chunk = completion_records(min(CHUNK, rows - start), start=start, prompt_chars=(120, 300),
                                       completion_chars=(60, 200), logprobs=False)  # fmt: skip
            for d, database in enumerate(opened):
                mine = chunk[(d - start) % databases :: databases]
                if mine:
                    database.put_many(mine)


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_mb() -> float:
    """The peak RSS since the last :func:`reset_peak` (since the start, before any)."""
    return _status_mb("VmHWM")


def reset_peak() -> None:
    """Make the peak RSS the current RSS, so that the next way's peak is its own (not ``ru_maxrss``, which
    never goes down: a way that ran later could never show a lower peak than an earlier one)."""
    Path("/proc/self/clear_refs").write_text("5")


def stream(store: Store, statement: Any, rows: int) -> dict[str, Any]:
    marks = {rows // 10: "10%", rows // 2: "50%"}
    reset_peak()
    seen, started, at = 0, time.perf_counter(), {}
    for found in store.scalars(statement):
        seen += 1
        if found.row.input_hash is None:  # touch the object; keep nothing
            raise AssertionError("a row without its key")
        if seen in marks:
            at[marks[seen]] = round(rss_mb(), 1)
    seconds = time.perf_counter() - started
    at["100%"] = round(rss_mb(), 1)
    if seen != rows:
        raise SystemExit(f"read {seen} rows, wrote {rows}")
    return {"rows": seen, "seconds": round(seconds, 2), "rows_per_s": round(seen / seconds), "rss_mb": at,
            "peak_rss_mb": round(peak_mb(), 1)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="rows in all (default 1,000,000)")
    parser.add_argument("--databases", type=int, help="databases they are spread over (default 100)")
    parser.add_argument("--quick", action="store_true", help="50,000 rows across 20 databases")
    parser.add_argument("--url", help="a PostgreSQL store URL (an empty database) instead of a temporary folder")
    args = parser.parse_args()
    if args.quick and (args.rows is not None or args.databases is not None):
        parser.error("--quick sets --rows and --databases: give either")
    rows, databases = (50_000, 20) if args.quick else (args.rows or 1_000_000, args.databases or 100)
    if any(n is not None and n < 1 for n in (args.rows, args.databases)):  # 0 is given, not the default
        parser.error("--rows and --databases must be at least 1")
    with tempfile.TemporaryDirectory(prefix="across-bench-") as folder:
        where = args.url or str(Path(folder) / "store")
        started = time.perf_counter()
        child = multiprocessing.get_context("fork").Process(target=build, args=(where, rows, databases))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"building the store failed (exit {child.exitcode})")
        print(f"built {rows:,} rows across {databases} databases in {time.perf_counter() - started:.0f} s ({where})")
        gc.collect()
        print(f"before reading: RSS {rss_mb():.1f} MB, peak {peak_mb():.1f} MB")
        with _open(where) as store:
            ordered = select(Completion).order_by(Completion.created_at, Completion.input_hash)
            for name, statement in (("ordered (k-way merge)", ordered), ("unordered", select(Completion))):
                result = stream(store, statement, rows)
                print(f"{name}: {result['rows']:,} rows in {result['seconds']} s ({result['rows_per_s']:,}/s); "
                      f"RSS {result['rss_mb']} MB; peak {result['peak_rss_mb']} MB")  # fmt: skip
            counted = select(Completion.benchmark, func.count(), func.sum(Completion.sample_index))
            started = time.perf_counter()
            groups = store.execute(counted.group_by(Completion.benchmark)).all()
            total = sum(count for _, count, _ in groups)
            print(f"count by benchmark: {len(groups)} groups, {total:,} rows in {time.perf_counter() - started:.2f} s")
            if total != rows:
                raise SystemExit(f"counted {total} rows, wrote {rows}")
        env = environment()
        print(f"python {env.get('python')}, sqlalchemy {env.get('sqlalchemy')}, sqlite {env.get('sqlite')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
