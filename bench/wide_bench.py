"""Wide rows (long completions with per-token logprobs) through export and sharing: peak memory against narrow rows.

Contract:

* Usage::

      python bench/wide_bench.py [--rows 3000] [--completion-chars 40000] [--positions 200]
                                 [--workdir DIR] [--json out.json]

* Two folder stores of ``--rows`` completions each: *wide* rows, each with a
  completion of ``--completion-chars`` characters and top logprobs
  (``judgestore-logprobs/v1``: 5 candidates) at ``--positions`` positions
  (about 75 KB a row by default, 300 KB once parsed), and *narrow* rows of the
  same prompts with a 100-character completion and no logprobs. Building is
  not timed.
* On each store, each command once as a fresh process (``python -m store``):
  ``export --format jsonl``, ``export --format parquet``, ``hub push --dir``
  to an empty folder, the same push again (nothing new), and ``hub fetch
  --dir`` into an empty store; wall time and the child's peak RSS
  (``wait4``). Memory that streams stays about the same for both stores; memory
  that grows with the rows' width shows as the wide store's figure.
* Each result is checked: the JSONL export has every row, the second push
  sends no shard, the fetched store holds every row.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/wide_bench.py` from anywhere

from bench.common import environment, print_table, write_json
from bench.million_bench import child
from store import Settings, Store
from store.descriptor import ModelDescriptor, input_hash, render_messages
from store.logprobs import LOGPROBS_FORMAT
from store.tables.records import CompletionRecord

DESCRIPTOR = ModelDescriptor(provider="bench", model="bench/wide")
BATCH = 500


def _logprobs(positions: int) -> dict[str, object]:
    candidates = [{"id": k, "logprob": -0.5 * k, "rank": k + 1, "text": f"t{k}"} for k in range(5)]
    return {"format": LOGPROBS_FORMAT, "positions": [{"candidates": candidates, "sampled": candidates[0]}] * positions}


def build(root: Path, rows: int, completion_chars: int, positions: int) -> None:
    """``rows`` completions in one database of a new folder store at ``root``: wide when ``positions`` > 0."""
    logprobs = _logprobs(positions) if positions else None
    base = datetime(2026, 1, 1, tzinfo=UTC)
    with Store(Settings(store_root=root), root=root) as store:
        database = store.database("completions", "wide", DESCRIPTOR)
        for start in range(0, rows, BATCH):
            batch = []
            for i in range(start, min(rows, start + BATCH)):
                text = render_messages([{"role": "user", "content": f"question {i}"}])
                batch.append(CompletionRecord(
                    input_hash=input_hash(text), input_text=text, completion=f"{i} " + "x" * completion_chars,
                    model="bench/wide", top_logprobs=logprobs, created_at=base + timedelta(seconds=i),
                ))  # fmt: skip
            database.put_many(batch)


def commands(workdir: Path, name: str, root: Path) -> list[tuple[str, list[str]]]:
    remote = workdir / f"{name}-remote"
    remote.mkdir()
    store = ["--store-root", str(root)]
    return [
        ("export jsonl", ["export", *store, "--format", "jsonl", "-o", str(workdir / f"{name}.jsonl")]),
        ("export parquet", ["export", *store, "--format", "parquet", "-o", str(workdir / f"{name}.parquet")]),
        ("hub push", ["hub", "push", *store, "--dir", str(remote), "--all", "--json"]),
        ("hub push, nothing new", ["hub", "push", *store, "--dir", str(remote), "--all", "--json"]),
        ("hub fetch", ["hub", "fetch", "--store-root", str(workdir / f"{name}-fetched"), "--dir", str(remote),
                       "--all", "--json"]),
    ]  # fmt: skip


def check(command: str, out: str, workdir: Path, name: str, rows: int) -> None:
    if command == "export jsonl":
        found = sum(1 for _ in (workdir / f"{name}.jsonl").open("rb"))
        if found != rows:
            raise SystemExit(f"{name}: the JSONL export holds {found:,} of {rows:,} rows")
    elif command == "hub push, nothing new" and orjson.loads(out)["shards"] != 0:
        raise SystemExit(f"{name}: the second push sent shards: {out[:300]}")
    elif command == "hub fetch":
        with Store(Settings(), root=workdir / f"{name}-fetched", readonly=True) as store:
            held = sum(store.open(location).count() for location in store.locations())
        if held != rows:
            raise SystemExit(f"{name}: the fetched store holds {held:,} of {rows:,} rows")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3_000, help="rows of each store (default 3,000)")
    parser.add_argument("--completion-chars", type=int, default=40_000, help="a wide row's completion (default 40,000)")
    parser.add_argument("--positions", type=int, default=200, help="a wide row's logprob positions (default 200)")
    parser.add_argument("--workdir", type=Path, help="where the stores go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.completion_chars < 1 or args.positions < 1:
        parser.error("--rows, --completion-chars and --positions must be at least 1")
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        parser.error(f"--workdir {args.workdir} is not a folder")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: give a new or empty folder (the stores are built there)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="judgestore-wide-"))
    env = {"XDG_CACHE_HOME": str(workdir / "cache")}
    shapes = {"narrow": (100, 0), "wide": (args.completion_chars, args.positions)}
    figures: dict[str, dict[str, tuple[float, int]]] = {}
    try:
        for name, (chars, positions) in shapes.items():
            root = workdir / f"{name}-store"
            build(root, args.rows, chars, positions)
            megabytes = sum(p.stat().st_size for p in root.rglob("*.db")) / 1e6
            print(f"{name}: {args.rows:,} rows, {megabytes:.0f} MB", file=sys.stderr)
            for command, argv_ in commands(workdir, name, root):
                took, peak, out = child(argv_, env)
                check(command, out, workdir, name, args.rows)
                figures.setdefault(command, {})[name] = (took, peak)
                print(f"  {command}: {took:.1f} s, peak RSS {peak} MB", file=sys.stderr)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = [
        [command, f"{by['narrow'][1]} MB ({by['narrow'][0]:.1f} s)", f"{by['wide'][1]} MB ({by['wide'][0]:.1f} s)",
         f"{by['wide'][1] / by['narrow'][1]:.2f}x"]
        for command, by in figures.items()
    ]  # fmt: skip
    print_table(["command", "narrow: peak RSS (wall)", "wide: peak RSS (wall)", "wide / narrow"], rows, right=(1, 2, 3))
    if args.json is not None:
        write_json(args.json, {"environment": environment(), "rows": args.rows, "figures": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
