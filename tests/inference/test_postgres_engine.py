"""The real engine over a PostgreSQL store: generate and judge with ``JUDGESTORE_STORE_URL``, rerun without vLLM.

The rerun is a fresh process, as a SLURM job would be: it reads its hits
from the server and reports (from its own ``sys.modules``) that vLLM was
never imported. The runs that load the engine run in the test's process
(:func:`~tests.inference.conftest.judgestore_here`). The same prompts on a
folder store give the same outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from store.settings import Settings
from store.store import Store
from tests.inference.conftest import judgestore_here
from tests.inference.test_cli import ENGINE_ARGS, judgestore, lines

pytestmark = [pytest.mark.engine, pytest.mark.postgres]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"instruction_id": str(i), "messages": [{"role": "user", "content": f"Tell me {w}."}]} for i, w in
            enumerate(["a joke", "a fact", "a story"])]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_generate_on_a_server_then_rerun_without_the_engine(
    tmp_path: Path, prompts: Path, tiny_model_dir: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["--model", str(tiny_model_dir), "--task", "demo", "--max-tokens", "8", *ENGINE_ARGS, "-i", str(prompts)]

    def generate(out: Path, *store: str, fresh_process: bool = False) -> dict[str, Any]:
        run = judgestore if fresh_process else judgestore_here
        summary: dict[str, Any] = orjson.loads(
            run("generate", *common, "-o", str(out), "--json", *store, root=tmp_path / "unused").stdout
        )
        return summary

    monkeypatch.setenv("JUDGESTORE_STORE_URL", pg_url)  # as a job script would export it
    first = generate(tmp_path / "a.jsonl")
    assert first["engine_loaded"] and first["rows_written"] == 3
    again = generate(tmp_path / "b.jsonl", fresh_process=True)
    assert (again["hits"], again["misses"], again["engine_loaded"], again["vllm_imported"]) == (3, 0, False, False)
    assert [r["completion"] for r in lines(tmp_path / "b.jsonl")] == [
        r["completion"] for r in lines(tmp_path / "a.jsonl")
    ]
    assert not (tmp_path / "unused").exists()  # the URL won over the folder in JUDGESTORE_STORE_ROOT

    on_folder = generate(tmp_path / "c.jsonl", "--store-root", str(tmp_path / "folder"))
    assert on_folder["rows_written"] == 3  # an explicit --store-root wins over the URL in the environment
    assert [r["completion"] for r in lines(tmp_path / "c.jsonl")] == [
        r["completion"] for r in lines(tmp_path / "a.jsonl")
    ]
    with (
        Store(Settings(), url=pg_url, readonly=True) as server,
        Store(root=tmp_path / "folder", readonly=True) as folder,
    ):
        (location,) = server.locations()
        assert folder.locations() == [location]  # the same descriptor, the same layout location
        assert {r.input_hash: r.completion for r in server.open(location).query()} == {
            r.input_hash: r.completion for r in folder.open(location).query()
        }
