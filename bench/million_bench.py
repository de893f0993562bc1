"""One big database: a 100k-key full-hit lookup, ``export --format parquet`` and ``verify``, as it grows.

Contract:

* Usage::

      python bench/million_bench.py [--rows 100000,1000000] [--keys 100000] [--prompt-chars 1000,2000]
                                    [--completion-chars 500,1000] [--workdir DIR] [--json out.json]

* One folder store, one completions database, grown to each ``--rows`` in
  turn (``bench/common.py``'s deterministic rows, written by ``put_many`` in
  batches of 20,000; rows of 1,000-2,000 prompt and 500-1,000 completion
  characters by default, no logprobs: 1M rows take about 4.4 GB with the
  indexes and SQLite's pages). Building is timed and reported, not compared.
* At each size, each once (a big store is not measured five times on a
  shared machine; the figures are single runs):

  - the lookup of a full-hit plan: ``Database.get_many`` of ``--keys`` stored
    keys (the prompt deferred, as the cache reads it), in this process;
  - ``judgestore export --format parquet`` of the whole store and
    ``judgestore verify``, each a fresh process: wall time and the child's
    peak RSS (``wait4``), which stays flat if they stream.
* Each result is checked: the lookup finds every key, the Parquet file holds
  every row, ``verify --json`` says it checked every row. The growth from the first size to the last is
  printed as a ratio (the rows grew by the ratio of the sizes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/million_bench.py` from anywhere

from bench.common import completion_records, environment, print_table, write_json
from store import Settings, Store
from store.descriptor import ModelDescriptor

BATCH = 20_000
DESCRIPTOR = ModelDescriptor(provider="bench", model="bench/big")


def child(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Run ``python -m store argv``: (wall seconds, peak RSS in MB, stdout); a failure stops the bench."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # files: no pipe to fill
        process = subprocess.Popen([sys.executable, "-m", "store", *argv], env={**os.environ, **env}, stdout=out,
                                   stderr=err, text=True)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
        took = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise SystemExit(f"`judgestore {' '.join(argv)}` failed ({process.returncode}): {err.read()[-2000:]}")
        return took, usage.ru_maxrss // 1024, out.read()


def _bounds(text: str) -> tuple[int, int]:
    """``LOW,HIGH`` characters; anything else is a ValueError."""
    low, high = (int(n) for n in text.split(","))
    if not 1 <= low <= high:
        raise ValueError(text)
    return low, high


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="100000,1000000", help="sizes the database grows to (default 100k, 1M)")
    parser.add_argument("--keys", type=int, default=100_000, help="keys of the full-hit lookup (default 100,000)")
    parser.add_argument("--prompt-chars", default="1000,2000")
    parser.add_argument("--completion-chars", default="500,1000")
    parser.add_argument("--workdir", type=Path, help="where the store goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    try:
        sizes = sorted(int(n) for n in args.rows.split(","))
        prompt = _bounds(args.prompt_chars)
        completion = _bounds(args.completion_chars)
    except ValueError:
        parser.error("--rows takes comma-separated numbers; --prompt-chars and --completion-chars take LOW,HIGH")
    if min(sizes) < 1 or args.keys < 1:
        parser.error("--rows and --keys must be at least 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="judgestore-big-"))
    root = workdir / "store"
    env = {"JUDGESTORE_STORE_ROOT": str(root), "XDG_CACHE_HOME": str(workdir / "cache")}
    settings = Settings(store_root=root, run_id="bench-run", created_by="bench")
    results = []
    try:
        written = 0
        for size in sizes:
            started = time.perf_counter()
            keys: list[str] = []
            with Store(settings, root=root) as store:
                database = store.database("completions", "big", DESCRIPTOR)
                while written < size:
                    batch = completion_records(min(BATCH, size - written), start=written, prompt_chars=prompt,
                                               completion_chars=completion, logprobs=False)  # fmt: skip
                    database.put_many(batch)
                    if len(keys) < args.keys:
                        keys += [r.input_hash for r in batch[: args.keys - len(keys)]]
                    written += len(batch)
                built = time.perf_counter() - started
                if len(keys) < min(args.keys, size):
                    keys = [r.input_hash for r in completion_records(min(args.keys, size), prompt_chars=prompt,
                            completion_chars=completion, logprobs=False)]  # fmt: skip
                # The WAL's last batch folded into the file first: its size counted it twice over (was)
                (path,) = root.rglob("*.db")  # the one database of this bench
                with closing(sqlite3.connect(path)) as connection:
                    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                file_bytes = database.size_bytes()
                started = time.perf_counter()
                found = database.get_many(keys)
                lookup = time.perf_counter() - started
                if len(found) != len(keys):
                    raise SystemExit(f"the full-hit lookup found {len(found):,} of {len(keys):,} keys")
                del found
            out = workdir / f"export-{size}.parquet"
            export, export_rss, _ = child(["export", "--format", "parquet", "-o", str(out)], env)
            import pyarrow.parquet as pq

            exported = pq.ParquetFile(out).metadata.num_rows
            if exported != size:
                raise SystemExit(f"the Parquet file holds {exported:,} rows, not {size:,}")
            out.unlink()
            verify, verify_rss, report = child(["verify", "--json"], env)
            if (checked := orjson.loads(report)["rows_checked"]) != size:
                raise SystemExit(f"verify checked {checked:,} rows, not {size:,}")
            results.append(
                {"rows": size, "file_mb": file_bytes / 1e6, "build_s": built, "keys": len(keys), "lookup_s": lookup,
                 "export_s": export, "export_rss_mb": export_rss, "verify_s": verify, "verify_rss_mb": verify_rss}
            )  # fmt: skip
            r = results[-1]
            print(f"{size:,} rows ({r['file_mb']:,.0f} MB) built in {built:.0f} s: lookup of {len(keys):,} keys "
                  f"{lookup:.2f} s, export {export:.1f} s ({export_rss} MB), verify {verify:.1f} s ({verify_rss} MB)",
                  file=sys.stderr)  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    headers = ["rows", "file", f"lookup of {args.keys:,} keys", "export parquet (peak RSS)", "verify (peak RSS)"]
    rows = [[f"{r['rows']:,}", f"{r['file_mb']:,.0f} MB", f"{r['lookup_s']:.2f} s",
             f"{r['export_s']:.1f} s ({r['export_rss_mb']} MB)", f"{r['verify_s']:.1f} s ({r['verify_rss_mb']} MB)"]
            for r in results]  # fmt: skip
    if len(results) > 1:
        a, b = results[0], results[-1]
        rows.append([f"x{b['rows'] / a['rows']:.0f}", f"x{b['file_mb'] / a['file_mb']:.1f}",
                     f"x{b['lookup_s'] / a['lookup_s']:.2f}", f"x{b['export_s'] / a['export_s']:.1f} (RSS "
                     f"x{b['export_rss_mb'] / a['export_rss_mb']:.2f})", f"x{b['verify_s'] / a['verify_s']:.1f} (RSS "
                     f"x{b['verify_rss_mb'] / a['verify_rss_mb']:.2f})"])  # fmt: skip
    print()
    print_table(headers, rows, right=(1, 2, 3, 4), markdown=True)
    env_facts = environment()
    print(f"\n* single runs; rows of {prompt[0]:,}-{prompt[1]:,} prompt and {completion[0]:,}-{completion[1]:,} "
          f"completion chars, no logprobs; python {env_facts['python']}, sqlite {env_facts['sqlite']}, "
          f"{env_facts['cpus']} CPUs, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    if args.json:
        write_json(args.json, {"environment": env_facts, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
