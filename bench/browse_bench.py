"""`judgestore browse` at scale: server-side times of its pages over a store of a million rows.

Usage::

    python bench/browse_bench.py [--rows 1000000] [--dir PATH] [--reps 5] [--json out.json]
    python bench/browse_bench.py --databases 2000 [--dir PATH] [--reps 5] [--json out.json]

It builds (through ``Database.put_many``, in batches, printing progress) a
folder store of ``--rows`` rows, or reuses the one ``--dir`` already holds:
two models' completions of ``rows / 4`` instructions each (a prompt of
1-2 KB, an answer of 0.5-1 KB) and a judge's verdicts of every pair in both
orientations (the judge prompt holds both answers; first-token logprobs
stored), in three databases. Rows are written 64 to a timestamp, as write
chunks share one, so the keyset ties are real. One word (``zanzibar``) is
planted in every 50,000th answer, for a search that has to read far.

Then it serves the store read-only in this process (``store.browse.server.serving``)
and requests each page over HTTP, reading the time the server spent on it
from its ``Server-Timing`` header: the median of ``--reps`` after one
untimed request (the first, cold time is printed too). Cases: the rows page
(first page, a keyset page half-way down, a page filtered by an indexed
column that selects half the rows, by one that selects few, by a scanned
column, a search for a common word and for the rare one), the battle page,
a row's page, a judge's page and the overview (whose finish reasons read
every table once, then are kept until a file changes). The target for the
rows and battle pages is 300 ms.

``--databases N`` measures a store of many small databases instead: N
completion databases of one row each (one model each, ten instructions),
and the pages whose cost grows with the number of databases: the overview
(cold: every database read; then what the store's catalog kept), the rows
page unfiltered, filtered on one model (the catalog's values leave the
other databases unopened) and searched for text one row holds (every
database is read), and a battle of one pair. ``--judgements K``
adds K judgements databases of one verdict each (a judge each, pairs of
neighbouring models), and times the judges page too (the overview shows
every judge's total).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from bench.common import TextPool, environment, write_json  # noqa: E402
from store import CompletionRecord, JudgementRecord, ModelDescriptor, Store, input_hash  # noqa: E402
from store.descriptor import render_messages  # noqa: E402
from store.logprobs import PositionLogprobs, TokenLogprob, encode  # noqa: E402
from store.tables.models import Orientation  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BATCH = 10_000
TARGET_MS = 300.0
RARE = "zanzibar"
JUDGE_SYSTEM = "You are an impartial judge. Reply with A if Assistant A's answer is better, B otherwise."


def descriptor(model: str) -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model=model, sampling={"temperature": 0, "max_tokens": 512})


def _stamp(i: int) -> datetime:
    return T0 + timedelta(seconds=i // 64)


def build(root: Path, rows: int) -> None:
    """Fill ``root`` with ``rows`` rows (see the module docstring), printing progress."""
    instructions = rows // 4
    pool = TextPool(seed=26)
    rng = random.Random(26)
    started = time.perf_counter()
    written = 0
    with Store(root=root) as store:
        models = ("model-x", "model-y")
        databases = {m: store.database("completions", "arena", descriptor(m)) for m in models}
        judge = store.database("judgements", "arena", descriptor("judge-j"))
        for first in range(0, instructions, BATCH // 4):
            last = min(instructions, first + BATCH // 4)
            completions: dict[str, list[CompletionRecord]] = {m: [] for m in models}
            verdicts: list[JudgementRecord] = []
            for i in range(first, last):
                question = f"Question {i}: " + pool.take(rng, rng.randint(1000, 2000))
                messages = [{"role": "user", "content": question}]
                text = render_messages(messages)
                answers = {}
                for m in models:
                    answer = pool.take(rng, rng.randint(500, 1000))
                    if i % 50_000 == 7 and m == "model-y":
                        answer += f" {RARE}"
                    answers[m] = answer
                    completions[m].append(
                        CompletionRecord(
                            input_hash=input_hash(text),
                            input_text=text,
                            completion=answer,
                            benchmark="arena-hard",
                            instruction_id=str(i),
                            model=m,
                            finish_reason="stop",
                            usage={"prompt_tokens": 400, "completion_tokens": 200},
                            run_id="run-1",
                            created_by="bench",
                            created_at=_stamp(2 * i),
                        )
                    )
                orientations: tuple[tuple[Orientation, tuple[str, str]], ...] = (
                    ("direct", models),
                    ("reversed", (models[1], models[0])),
                )
                for orientation, (a, b) in orientations:
                    user = f"[Question]\n{question}\n\n[Assistant A]\n{answers[a]}\n\n[Assistant B]\n{answers[b]}"
                    judge_text = render_messages([{"role": "system", "content": JUDGE_SYSTEM},
                                                  {"role": "user", "content": user}])  # fmt: skip
                    p_a = rng.uniform(0.05, 0.9)
                    top = encode([PositionLogprobs(
                        (TokenLogprob("A", _log(p_a), 32, 1), TokenLogprob("B", _log(0.95 - p_a), 33, 2)),
                        TokenLogprob("A", _log(p_a), 32, 1),
                    )])  # fmt: skip
                    verdicts.append(
                        JudgementRecord(
                            input_hash=input_hash(judge_text),
                            input_text=judge_text,
                            completion="A" if p_a > 0.475 else "B",
                            benchmark="arena-hard",
                            instruction_id=str(i),
                            model_a=a,
                            model_b=b,
                            judge="judge-j",
                            orientation=orientation,
                            finish_reason="stop" if i % 10 else "length",
                            top_logprobs=top,
                            run_id="run-2",
                            created_by="bench",
                            created_at=_stamp(2 * i + (orientation == "reversed")),
                        )
                    )
            for m in models:
                databases[m].put_many(completions[m])
            judge.put_many(verdicts)
            written += 4 * (last - first)
            elapsed = time.perf_counter() - started
            print(f"  built {written:,} of {4 * instructions:,} rows ({elapsed:.0f} s)", file=sys.stderr, flush=True)


def build_many(root: Path, databases: int, judgements: int = 0) -> None:
    """Fill ``root`` with ``databases`` completion databases of one row each, and ``judgements`` judgements
    databases of one row each (see the module docstring)."""
    started = time.perf_counter()
    with Store(root=root) as store:
        for j in range(judgements):
            judge = f"judge{j:05d}"
            text = render_messages([{"role": "user", "content": f"Judge m{j:05d} against m{j + 1:05d}"}])
            verdict = JudgementRecord(input_hash=input_hash(text), input_text=text, completion="[[A]]",
                                      benchmark="many", instruction_id=str(j % 10), model_a=f"m{j:05d}",
                                      model_b=f"m{j + 1:05d}", judge=judge, orientation="direct",
                                      finish_reason="stop", created_by="bench", created_at=_stamp(j))  # fmt: skip
            store.database("judgements", "many", descriptor(judge)).put_many([verdict])
        for i in range(databases):
            model = f"m{i:05d}"
            text = render_messages([{"role": "user", "content": f"Question {i % 10}?"}])
            row = CompletionRecord(input_hash=input_hash(text), input_text=text, completion=f"answer {i}",
                                   benchmark="many", instruction_id=str(i % 10), model=model, finish_reason="stop",
                                   created_by="bench", created_at=_stamp(i))  # fmt: skip
            store.database("completions", "many", descriptor(model)).put_many([row])
            if (i + 1) % 500 == 0:
                print(f"  built {i + 1:,} of {databases:,} databases ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip


def _log(p: float) -> float:
    return math.log(max(p, 1e-9))


def request(url: str) -> tuple[float, int, str]:
    """Server-side milliseconds (``Server-Timing``), the status and the page of one GET."""
    with urllib.request.urlopen(url, timeout=600) as response:
        page = response.read().decode()
        timing = response.headers.get("server-timing", "")
        return float(timing.split("dur=")[1]), response.status, page


def check_rows(name: str, page: str, expected: int | None) -> None:
    """A rows page shows ``expected`` rows (None: at least one): a page of nothing would only look fast."""
    shown = page.count('<tr data-hash="')
    if shown == 0 if expected is None else shown != expected:
        raise SystemExit(f"{name}: the page shows {shown} rows, not {expected or 'some'} (another --rows in --dir?)")


def time_page(
    base: str, name: str, path: str, params: dict[str, Any], reps: int, expected: int | None = 0
) -> dict[str, Any]:
    """One page's cold time and the median of ``reps`` more, printed; a rows page must show ``expected`` rows (0:
    some; None: not checked)."""
    target = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    cold, status, page = request(target)
    if path == "/rows" and expected is not None:
        check_rows(name, page, expected or None)
    times = [request(target)[0] for _ in range(reps)]
    median = statistics.median(times)
    aimed = path in ("/rows", "/battle")
    verdict = ("PASS" if median < TARGET_MS else "MISS") if aimed else ""
    print(f"{name:<42} {cold:>7.1f}ms {median:>7.1f}ms  {verdict}", file=sys.stderr, flush=True)
    return {"case": name, "url": target.removeprefix(base), "status": status, "cold_ms": cold, "median_ms": median,
            "samples_ms": times, "target_ms": TARGET_MS if aimed else None}  # fmt: skip


def run_many(root: Path, args: argparse.Namespace) -> None:
    """The ``--databases`` cases (see the module docstring)."""
    from store.browse.browser import Browser
    from store.browse.server import serving

    if not (root / "completions").exists():
        print(f"building a store of {args.databases:,} databases in {root}", file=sys.stderr)
        build_many(root, args.databases, args.judgements)
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("overview", "/", {}),
        *([("judges", "/judges", {})] if (root / "judgements").exists() else []),
        ("rows: first page", "/rows", {}),
        ("rows: model=m00001 (one database)", "/rows", {"model": "m00001"}),
        ("rows: search, text one row holds", "/rows", {"q": "answer 0"}),
        ("battle (one pair)", "/battle", {"benchmark": "many", "instruction_id": "1", "a": "m00001", "b": "m00011"}),
    ]
    with Store(root=root, readonly=True) as store, serving(Browser(store)) as url:
        base = url.rstrip("/")
        print(f"{'page':<42} {'cold':>9} {'median':>9}  target", file=sys.stderr)
        results = [time_page(base, name, path, params, args.reps) for name, path, params in cases]
    if args.json:
        write_json(args.json, {"environment": environment(), "databases": args.databases, "store": str(root),
                               "results": results})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, help="store folder (built if empty, reused if built)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--databases", type=int, help="time a store of this many one-row databases instead")
    parser.add_argument("--judgements", type=int, default=0, help="with --databases: this many judgements ones too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rows < 8 or args.reps < 1 or (args.databases is not None and args.databases < 2):
        parser.error("--rows must be at least 8, --reps at least 1 and --databases at least 2")
    with tempfile.TemporaryDirectory(prefix="judgestore-browse-bench-") as work:
        # judgestore's cache folder (the store's catalog) stays with the bench, and goes with a throwaway store
        os.environ["XDG_CACHE_HOME"] = str(Path(work) / "cache")
        run(args.dir or Path(work) / "store", args)


def run(root: Path, args: argparse.Namespace) -> None:
    from store.browse.browser import Browser
    from store.browse.pages import RowsQuery
    from store.browse.queries import Key
    from store.browse.server import serving

    if args.databases is not None:
        run_many(root, args)
        return
    if not (root / "judgements").exists():
        print(f"building a store of {args.rows:,} rows in {root}", file=sys.stderr)
        build(root, args.rows)
    instructions = args.rows // 4
    middle = instructions // 2
    deep = Key(_stamp(2 * middle), "judgements/arena/vllm/judge-j/" + descriptor("judge-j").hash16(), "8" * 64)
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("rows: first page", "/rows", {}),
        ("rows: keyset page half-way down", "/rows", {"after": deep.token()}),
        ("rows: oldest first", "/rows", {"order": "oldest"}),
        ("rows: judge=judge-j (half the rows)", "/rows", {"judge": "judge-j"}),
        # model matches completions.model and judgements' model_a/model_b: x's answers and every verdict.
        ("rows: model=model-x (three quarters)", "/rows", {"model": "model-x"}),
        ("rows: instruction_id (4 rows)", "/rows", {"instruction_id": str(middle)}),
        ("rows: orientation=reversed (scanned)", "/rows", {"orientation": "reversed"}),
        ("rows: finish_reason=length (scanned)", "/rows", {"finish_reason": "length"}),
        ("rows: search a common word", "/rows", {"q": "ka"}),
        (f"rows: search a rare word ({RARE})", "/rows", {"q": RARE}),
        ("battle", "/battle", {"benchmark": "arena-hard", "instruction_id": str(middle)}),
        ("row", "/row", {}),
        ("judge (newest 5,000 verdicts)", "/judges", {"judge": "judge-j"}),
        ("overview", "/", {}),
    ]
    results = []
    with Store(root=root, readonly=True) as store, serving(Browser(store)) as url:
        base = url.rstrip("/")
        print(f"{'page':<42} {'cold':>9} {'median':>9}  target", file=sys.stderr)
        for name, path, params in cases:
            if path == "/row":  # found only now, so that the first page's request is the server's first
                hit = Browser(store).rows(RowsQuery(limit=1))
                params = {"db": hit.rows[0].key.database, "hash": hit.rows[0].input_hash}
            expected = None if params.get("q") == RARE else 4 if "instruction_id" in params else 0
            results.append(time_page(base, name, path, params, args.reps, expected))
        # Following "Keep searching" until the rare word shows, as a reader would.
        token, requests, total_ms = None, 0, 0.0
        while True:
            params = {"q": RARE, **({"after": token} if token else {})}
            target = f"{base}/rows?{urllib.parse.urlencode(params)}"
            with urllib.request.urlopen(target, timeout=600) as response:
                html = response.read().decode()
                total_ms += float(response.headers["server-timing"].split("dur=")[1])
            requests += 1
            found = 'data-hash="' in html
            cursor = re.search(r'id="next-page" href="[^"]*after=([A-Za-z0-9_-]+)', html)
            if found or cursor is None:
                break
            token = cursor.group(1)
        shown = f"shown after {requests} requests" if found else f"not in the store (too few rows), {requests} requests"
        print(f"{RARE}: {shown}, {total_ms:.0f} ms of server time in all", file=sys.stderr)
        counted = request(f"{base}/?finish_reasons=count")[0]
        print(f"overview, finish reasons counted once (reads every row): {counted / 1000:.1f} s", file=sys.stderr)
        searched = {"found": found, "requests": requests, "server_ms": total_ms}
        results.append({"case": f"search {RARE} until shown", **searched})
        results.append({"case": "overview, finish reasons counted", "cold_ms": counted})
    if args.json:
        write_json(args.json, {"environment": environment(), "rows": args.rows, "store": str(root),
                               "results": results})  # fmt: skip


if __name__ == "__main__":
    main()
