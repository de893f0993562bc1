"""Jobs of one shared batch, as a SLURM array or one process per GPU starts them: ``judgestore generate
--shared-batch`` in separate processes against the fake OpenAI server (tests/fake_openai.py) and one store.

Used by tests/inference/test_shared_batch.py and bench/shared_bench.py: :func:`write_prompts` writes a prompt
file, :func:`start_jobs` starts the processes, :func:`finish` waits for them, :func:`requests_per_prompt` counts
what the server was asked for each prompt, :func:`busy_seconds` how long the batch kept it busy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.fake_openai import FakeOpenAI

REPO_ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-shared-batch-test-key"


def write_prompts(path: Path, count: int) -> Path:
    rows = [
        {"benchmark": "shared", "instruction_id": str(i), "messages": [{"role": "user", "content": f"prompt {i}"}]}
        for i in range(count)
    ]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@dataclass
class Job:
    index: int
    process: subprocess.Popen[bytes]
    output: Path
    log: Path
    started: float
    ended: float | None = None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def summary(self) -> dict[str, object]:
        """The ``--json`` summary the job printed on stdout."""
        return orjson.loads(self.log.with_suffix(".out").read_bytes())  # type: ignore[no-any-return]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def start_jobs(
    count: int,
    *,
    server: FakeOpenAI,
    prompts: Path,
    folder: Path,
    store: dict[str, str],
    shared: bool = True,
    chunk_size: int = 8,
    concurrency: int = 4,
    lease_seconds: float = 30.0,
    first: int = 0,
) -> list[Job]:
    """Start ``count`` jobs (``store``: the environment naming the store, JUDGESTORE_STORE_ROOT or _URL)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "JUDGE_KEY": KEY,
        "JUDGESTORE_LEASE_SECONDS": str(lease_seconds),
        "JUDGESTORE_RUN_ID": "shared-test",
        **store,
    }
    jobs = []
    for i in range(first, first + count):
        output, log = folder / f"job{i}.jsonl", folder / f"job{i}.log"
        argv = [
            sys.executable, "-c", "from inference.cli import main; main()", "generate", "--provider", "vllm-server",
            "--base-url", server.base_url, "--model", "fake-judge", "--api-key-env", "JUDGE_KEY", "--task", "shared",
            "-i", str(prompts), "-o", str(output), "--json", "--chunk-size", str(chunk_size), "--max-concurrency",
            str(concurrency), *(["--shared-batch"] if shared else []),
        ]  # fmt: skip
        with log.open("wb") as err, log.with_suffix(".out").open("wb") as out:
            process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=err)
        jobs.append(Job(i, process, output, log, time.monotonic()))
    return jobs


def finish(jobs: list[Job], timeout: float = 300) -> None:
    """Wait for every job (each one's end time is kept); kill them all past ``timeout``."""
    deadline = time.monotonic() + timeout
    waiting = [job for job in jobs if job.ended is None]
    while waiting:
        for job in waiting:
            if job.process.poll() is not None:
                job.ended = time.monotonic()
        waiting = [job for job in waiting if job.ended is None]
        if waiting and time.monotonic() > deadline:
            for job in waiting:
                job.process.kill()
                job.process.wait()
            raise TimeoutError(f"{len(waiting)} jobs still running after {timeout} s")
        time.sleep(0.05)


def busy_seconds(server: FakeOpenAI) -> float:
    """From the server's first completion request to its last answer: how long the batch kept it busy."""
    times = [recorded.at for recorded in server.completions()]
    return max(times) - min(times) + server.delay if times else 0.0


def requests_per_prompt(server: FakeOpenAI, *, cut_off: int = 0) -> Counter[str]:
    """How many whole completion requests the server received for each prompt (its last message).

    A job killed while sending leaves a request whose body was cut off: the server could not read it, so it
    generated nothing for it. ``cut_off`` is how many of those the caller allows (0: any one fails the test).
    """
    counts: Counter[str] = Counter()
    unreadable = 0
    for recorded in server.completions():
        if recorded.body is None:
            unreadable += 1
            continue
        counts[recorded.body["messages"][-1]["content"]] += 1
    assert unreadable <= cut_off, f"{unreadable} requests the server could not read"
    return counts
