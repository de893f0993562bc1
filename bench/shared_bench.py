"""Many jobs, one batch: the speedup of ``judgestore generate --shared-batch`` with 1, 2, 4 and 8 processes.

Usage::

    python bench/shared_bench.py [--prompts 200] [--delay 0.5] [--concurrency 4] [--jobs 1,2,4,8]
                                 [--backend folder,postgresql] [--json out.json]

Each point starts N ``judgestore generate --shared-batch`` processes at once
on one empty store (a folder, or a throwaway PostgreSQL server started as the
tests start one, ``tests/pg_server.py``) against the fake OpenAI server
(``tests/fake_openai.py``) answering every request after ``--delay`` seconds,
at most ``--concurrency`` requests in flight per process (``--chunk-size``
twice that). It reports:

* **wall**: from starting the processes to the last one's exit (interpreter
  start and the openai client's import included, as a user waits for them);
* **busy**: from the server's first request to its last answer (the batch's
  own time, without process start-up);
* each as a ratio to one process, and the requests sent per prompt (every
  point must show exactly 1: it exits 1 otherwise);
* **floor**: N processes started at once that only import the libraries a job
  needs (:data:`LIBRARIES`: the openai client, SQLAlchemy, typer, rich,
  pydantic-settings) and exit, measured just before the point; and **bound**,
  that floor plus the batch's own time at N processes with nothing lost
  (``prompts * delay / (concurrency * N)``), as a ratio to one process: the
  best wall ratio any job could reach on this machine.

The ideal ratio at N processes is 1/N plus start-up; what start-up costs
depends on the machine (on two shared cores, N processes importing the
openai client take seconds each): the bound says how much.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fake_openai import FakeOpenAI
from tests.pg_server import Cluster, running_cluster, server_bin
from tests.shared_jobs import KEY, busy_seconds, finish, requests_per_prompt, start_jobs, write_prompts

LIBRARIES = "import openai, sqlalchemy.orm, typer, rich, pydantic_settings"


def startup_floor(jobs: int) -> float:
    """Wall seconds for ``jobs`` processes, started at once, to import :data:`LIBRARIES` and exit."""
    started = time.monotonic()
    code = f"{LIBRARIES}; import os; os._exit(0)"  # and leave as judgestore does (store.cli.app.run_program)
    running = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(jobs)]
    if any(process.wait() != 0 for process in running):
        raise SystemExit(f"importing the libraries failed: {LIBRARIES}")
    return time.monotonic() - started


def point(jobs: int, backend: str, args: argparse.Namespace, tmp: Path, cluster: Cluster | None) -> dict[str, float]:
    folder = tmp / f"{backend}-{jobs}"
    folder.mkdir()
    if cluster is None:
        store = {"JUDGESTORE_STORE_ROOT": str(folder / "store")}
    else:
        store = {"JUDGESTORE_STORE_URL": cluster.url(cluster.new_database())}
    prompts = write_prompts(folder / "prompts.jsonl", args.prompts)
    with FakeOpenAI(api_key=KEY) as server:
        server.delay = args.delay
        started = time.monotonic()
        running = start_jobs(
            jobs, server=server, prompts=prompts, folder=folder, store=store,
            chunk_size=2 * args.concurrency, concurrency=args.concurrency,
        )  # fmt: skip
        finish(running, timeout=1800)
        wall = max(job.ended or 0.0 for job in running) - started
        failed = [job.index for job in running if job.returncode != 0]
        if failed:
            raise SystemExit(f"jobs {failed} failed: {running[failed[0]].stderr()[-2000:]}")
        counts = requests_per_prompt(server)
        if len(counts) != args.prompts or set(counts.values()) != {1}:
            raise SystemExit(f"{backend}, {jobs} jobs: a prompt was not asked exactly once ({counts.most_common(3)})")
        return {"wall": wall, "busy": busy_seconds(server), "requests": sum(counts.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--jobs", default="1,2,4,8")
    parser.add_argument("--backend", default="folder,postgresql")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        job_counts = [int(n) for n in args.jobs.split(",")]
    except ValueError:
        parser.error(f"--jobs takes comma-separated numbers, not {args.jobs!r}")
    if job_counts[0] != 1 or sorted(set(job_counts)) != job_counts:  # every ratio is to one process, timed first
        parser.error(f"--jobs must start at 1 and rise (e.g. 1,2,4,8), not {args.jobs!r}")
    if min(job_counts) < 1 or args.prompts < 1 or args.concurrency < 1 or args.delay < 0:
        parser.error("--jobs, --prompts and --concurrency must be at least 1, --delay at least 0")
    if unknown := set(args.backend.split(",")) - {"folder", "postgresql"}:
        parser.error(f"--backend: unknown {', '.join(sorted(unknown))} (known: folder, postgresql)")
    backends = [b for b in args.backend.split(",") if b != "postgresql" or server_bin() is not None]
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        for backend in backends:
            cluster = stack.enter_context(running_cluster()) if backend == "postgresql" else None
            results[backend] = {}
            for jobs in job_counts:
                floor = startup_floor(jobs)
                measured = point(jobs, backend, args, Path(tmp), cluster)
                ideal = args.prompts * args.delay / (args.concurrency * jobs)
                results[backend][jobs] = measured | {"floor": floor, "bound": floor + ideal}
                one = results[backend][1]
                r = results[backend][jobs]
                print(
                    f"{backend:10} {jobs} jobs: wall {r['wall']:6.2f} s ({r['wall'] / one['wall']:.2f}x), "
                    f"busy {r['busy']:6.2f} s ({r['busy'] / one['busy']:.2f}x), {int(r['requests'])} requests "
                    f"for {args.prompts} prompts; start-up floor {r['floor']:.2f} s, bound "
                    f"{r['bound']:.2f} s ({r['bound'] / one['wall']:.2f}x)",
                    flush=True,
                )
    if args.json is not None:
        payload = {"args": vars(args) | {"json": str(args.json)}, "results": results}
        args.json.write_bytes(orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS))


if __name__ == "__main__":
    main()
