"""`judgestore import` as a user types it: options, output, report file, exit codes."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.cli.legacy import register
from store.cli.app import build_app
from store.descriptor import ModelDescriptor
from store.layout import read_metadata, walk
from store.legacy.importer import DEFAULT_CHUNK_SIZE
from tests.legacy import builders as b
from tests.legacy.conftest import judgestore, stored_rows


def test_import_is_a_command_of_judgestore_but_not_of_the_store_alone() -> None:
    app = build_app(register)
    assert "import" in [c.name for c in app.registered_commands]
    assert "import" not in [c.name for c in build_app().registered_commands]


def test_s0_and_a_pass_level_cache_under_a_user_descriptor_with_inputs(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    rows = [
        {
            "benchmark": "mt-bench",
            "instruction_id": str(i),
            "model_a": "a",
            "model_b": "b",
            "judge": "gpt-4",
            "judge_input": f"Compare answers to question {i} — ¿cuál?",
            "judge_completion": f"[[{'AB'[i % 2]}]]",
            "date": "2025-12-31T23:59:59",
        }
        for i in range(4)
    ]
    b.create_db(legacy / "cache" / "db" / "mt-bench" / "gpt-4.db", b.S0_DDL, rows)
    pd.DataFrame({"completion": ["Paris.", "Berlin."], "instruction_index": [0, 1]}).to_csv(
        legacy / "cache" / "model-x.csv.zip", index=False
    )
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(
        "\n".join(
            json.dumps({"instruction_index": i, "messages": [{"role": "user", "content": q}]})
            for i, q in enumerate(["Capital of France?", "Capital of Germany?"])
        )
    )
    descriptor = ModelDescriptor(provider="vllm", model="gpt-4-judge", sampling={"temperature": 0.0})
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(descriptor.model_dump_json())
    report_file = tmp_path / "report.json"
    args = [
        "import",
        str(legacy),
        "--store-root",
        str(root),
        "--descriptor",
        str(descriptor_file),
        "--task",
        "mt-bench",
        "--inputs",
        str(inputs),
        "--report",
        str(report_file),
    ]

    nowhere = judgestore(*args[:-1], str(tmp_path / "no-such-folder" / "report.json"))  # said before importing
    assert nowhere.returncode == 1 and "there is no folder" in nowhere.stderr and not root.exists()
    before = b.file_digests(tmp_path)  # the legacy cache, the inputs and the descriptor
    for over, said in [  # a report over what is read, or among the legacy files (was: written there, exit 0)
        (inputs, "is the input file"),
        (descriptor_file, "is the input file"),
        (legacy / "cache" / "model-x.csv.zip", "is inside the legacy cache"),
        (legacy / "cache" / "report.json", "is inside the legacy cache"),
    ]:
        refused = judgestore(*args[:-1], str(over))
        assert refused.returncode == 1 and said in " ".join(refused.stderr.split()), refused.stderr
    assert b.file_digests(tmp_path) == before and not root.exists()

    dry = judgestore(*args[:-2], "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert orjson.loads(dry.stdout)["totals"]["imported"] == 6 and not root.exists()

    result = judgestore(*args)
    assert result.returncode == 0, result.stderr
    assert "6 imported" in " ".join(result.stdout.split())
    report = orjson.loads(report_file.read_bytes())
    assert report["ok"] and report["totals"] == {
        "sources": 2,
        "rows": 6,
        "imported": 6,
        "already_present": 0,
        "conflicts": 0,
        "skipped": 0,
        "unattributed": 0,
        "failed": 0,
        "failed_sources": 0,
    }
    by_role = {loc.role: loc for loc in walk(root)}
    assert set(by_role) == {"completions", "judgements"}
    metadata = read_metadata(by_role["judgements"].folder(root))
    assert metadata.descriptor == descriptor
    assert any("given by the user" in a for a in metadata.assumptions)
    assert any("imported as one user message" in a for a in metadata.assumptions)
    judged = next(rows for folder, rows in stored_rows(root).items() if folder.startswith("judgements"))
    assert sorted(r["completion"] for r in judged) == ["[[A]]", "[[A]]", "[[B]]", "[[B]]"]

    again = judgestore(*args[:-2], "--json")
    assert orjson.loads(again.stdout)["totals"]["already_present"] == 6


def test_a_source_of_exactly_one_chunk_of_rows_ends_with_its_report(tmp_path: Path) -> None:
    """The last chunk's progress was told twice (at the chunk and at the end): the second once crashed the bar."""
    legacy, root, report_file = tmp_path / "legacy", tmp_path / "store", tmp_path / "report.json"
    rows = [
        {
            "benchmark": "b",
            "instruction_id": str(i),
            "model_a": "a",
            "model_b": "b",
            "judge": "gpt-4",
            "judge_input": f"Compare the answers to question {i}",
            "judge_completion": "[[A]]",
            "date": "2025-12-31T23:59:59",
        }
        for i in range(DEFAULT_CHUNK_SIZE)
    ]
    b.create_db(legacy / "cache" / "db" / "b" / "gpt-4.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="judge").model_dump_json())
    args = ["import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file), "--task", "b"]

    dry = judgestore(*args, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert orjson.loads(dry.stdout)["totals"]["imported"] == DEFAULT_CHUNK_SIZE

    result = judgestore(*args, "--json", "--report", str(report_file))
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["totals"]["imported"] == DEFAULT_CHUNK_SIZE
    assert orjson.loads(report_file.read_bytes())["totals"]["imported"] == DEFAULT_CHUNK_SIZE


def test_a_source_that_cannot_be_read_is_counted_in_the_summary_line(tmp_path: Path) -> None:
    """A damaged file beside a good one: exit 1, and a summary of "N rows: N imported, ..., 0 failed" (was)."""
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    rows = [{"benchmark": "b", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "gpt-4",
             "judge_input": f"Compare {i}", "judge_completion": "[[A]]"} for i in range(3)]  # fmt: skip
    b.create_db(legacy / "cache" / "db" / "b" / "gpt-4.db", b.S0_DDL, rows)
    (legacy / "cache" / "db" / "b" / "broken.db").write_bytes(b"this was a database once" * 50)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="judge").model_dump_json())
    args = ["import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file), "--task", "b"]
    result = judgestore(*args)
    assert result.returncode == 1
    assert "3 rows: 3 imported" in " ".join(result.stdout.split())
    assert "0 failed; 1 source failed" in " ".join(result.stdout.split())
    as_json = judgestore(*args, "--json")
    assert orjson.loads(as_json.stdout)["totals"]["failed_sources"] == 1


def test_rows_the_store_refuses_for_one_reason_are_counted_under_that_reason_once(tmp_path: Path) -> None:
    """A benchmark keyed by its question text: each row got a reason of its own (its key, its byte count), 2,000
    reasons for 2,000 rows, each saying "nothing of the batch was written" beside the rows that were (was)."""
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    question = "Explain, step by step and with care, " * 40  # about 1,500 bytes: more than an index holds
    rows = [
        {"benchmark": "b", "instruction_id": question + str(i) if i >= 2 else str(i), "model_a": "a",
         "model_b": "b", "judge": "gpt-4", "judge_input": f"Compare the answers to question {i}",
         "judge_completion": "[[A]]", "date": "2025-12-31T23:59:59"}
        for i in range(12)
    ]  # fmt: skip
    b.create_db(legacy / "cache" / "db" / "b" / "gpt-4.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="judge").model_dump_json())
    args = ["import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file), "--task", "b"]
    result = judgestore(*args, "--json")
    (source,) = orjson.loads(result.stdout)["sources"]
    assert result.returncode == 1 and (source["imported"], sum(source["failed"].values())) == (2, 10)
    ((reason, count),) = source["failed"].items()
    assert count == 10 and reason.startswith("instruction_id takes more bytes than an indexed column holds")
    assert "nothing of the batch" not in reason and len(source["examples"][reason]) == 5
    assert all(len(example) <= 160 for example in source["examples"][reason])


def test_a_report_of_a_source_whose_path_is_not_utf8_is_written(tmp_path: Path) -> None:
    """The report names each source by its path; one of bytes that are not UTF-8 once crashed its writing, after
    the import, with no report left. It is written as --json writes it, with the bytes as escapes."""
    legacy, root, report_file = tmp_path / "legacy", tmp_path / "store", tmp_path / "report.json"
    odd = os.fsdecode(b"caches-\xff\xfe")
    rows = [{"benchmark": "b", "instruction_id": "0", "model_a": "a", "model_b": "b", "judge": "gpt-4",
             "judge_input": "Compare", "judge_completion": "[[A]]", "date": "2025-12-31T23:59:59"}]  # fmt: skip
    b.create_db(legacy / odd / "cache" / "db" / "b" / "gpt-4.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="judge").model_dump_json())

    result = judgestore("import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file),
                        "--task", "b", "--report", str(report_file), "--json")  # fmt: skip

    assert result.returncode == 0, result.stderr
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert report["totals"]["imported"] == 1 and odd in report["sources"][0]["path"]


def test_usage_errors_name_the_option(tmp_path: Path) -> None:
    bad = tmp_path / "descriptor.json"
    bad.write_text("[1, 2]")
    result = judgestore("import", str(tmp_path), "--descriptor", str(bad))
    assert result.returncode == 1 and "descriptor.json: a descriptor file holds a JSON object" in result.stderr
    result = judgestore("import", str(tmp_path), "--assume-setting", "novalue", "--json")
    assert result.returncode == 2  # malformed on the command line: a usage error, as every KEY=VALUE option's
    assert orjson.loads(result.stderr) == {
        "error": "Invalid value for '--assume-setting': expects KEY=VALUE, got 'novalue'",
        "type": "BadParameter",
    }
    result = judgestore("import", str(tmp_path), "--task", "..")  # a task that names no folder: before any row
    assert result.returncode == 2 and "Invalid value for '--task': invalid path segment '..'" in result.stderr
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text('{"instruction_index": 1}\n')
    result = judgestore("import", str(tmp_path), "--inputs", str(inputs))
    assert result.returncode == 1 and "inputs.jsonl:1: give exactly one of messages, text, turns" in result.stderr


def test_a_folder_holding_no_cache_says_so_and_how_many_files_were_ignored(tmp_path: Path) -> None:
    folder, root = tmp_path / "results", tmp_path / "store"
    folder.mkdir()
    (folder / "answers.jsonl").write_text('{"text": "hi"}\n')
    (folder / "notes.txt").write_text("not a cache\n")
    result = judgestore("import", str(folder), "--store-root", str(root), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert f"No legacy cache found in {folder} (2 other files ignored)" in result.stderr
    assert "2 other files ignored" in result.stdout  # the table's caption too
    assert not list(root.rglob("*.db"))


def test_rows_an_older_vllm_produced_come_with_the_exact_adopt_command(tiny_model: Path, tmp_path: Path) -> None:
    """The printed `judgestore adopt` names the imported descriptor and settings that differ from it only in the
    vLLM version: `judgestore explain` given the same options finds it as the nearest, differing in nothing else."""
    import shlex

    from inference.backends.vllm.descriptor import backend_version

    legacy, root = tmp_path / "legacy", tmp_path / "store"
    kwargs = {"dtype": "float32", "max_model_len": 256, "seed": 0, "max_tokens": 8, "temperature": 0}
    metadata = b.s3_metadata(str(tiny_model), kwargs, backend_version="0.10.0")
    folder = b.legacy_folder(legacy, "completions", "mt bench", "VLLM", str(tiny_model), metadata)
    text = b.rendered_messages([{"role": "user", "content": "hi"}])
    row = {"input_hash": b.sha(text), "input_text": text, "completion": "hello", "benchmark": "mt bench",
           "instruction_id": "0", "model": "tiny", "pushed_by": "u", "pushed_at": "2026-01-01",
           "run_id": "r"}  # fmt: skip
    b.create_db(folder / "completions.db", b.S4C_DDL, [row])

    imported = judgestore("import", str(legacy), "--store-root", str(root), "--assume-current-model", str(tiny_model))
    assert imported.returncode == 0, imported.stderr
    (location,) = walk(root)
    notes = " ".join(imported.stderr.split())  # rich wraps long lines on stderr
    assert f"rows were produced by vLLM 0.10.0; this machine has {backend_version()}" in notes
    assert "(add the engine arguments this machine needs that change no output" in notes  # the command names none
    command = shlex.split(notes.split("adopt them if they come out the same, run: ", 1)[1].split(" note:")[0])
    assert command[:2] == ["judgestore", "adopt"]
    assert command[command.index("--from") + 1] == location.descriptor_hash16
    assert command[command.index("--task") + 1] == "mt bench"
    assert command[command.index("--across") + 1] == "backend_version"

    options = command[2 : command.index("--from")]
    explained = judgestore("explain", *options, "--store-root", str(root), "--json")
    assert explained.returncode == 0, explained.stderr
    (nearest,) = orjson.loads(explained.stdout)["descriptor"]["neighbours"]
    assert nearest["descriptor"] == location.descriptor_hash16
    assert [(c["field"], c["stored"], c["wanted"]) for c in nearest["changes"]] == [
        ("backend_version", "0.10.0", backend_version())
    ]
    again = judgestore("import", str(legacy), "--store-root", str(root), "--assume-current-model", str(tiny_model),
                       "--dry-run", "--json")  # fmt: skip
    (source,) = orjson.loads(again.stdout)["sources"]
    assert any(note.endswith("run: " + shlex.join(command)) for note in source["notes"])  # --json carries it whole


def test_rows_an_older_vllm_produced_under_a_descriptor_file_come_with_the_adopt_command_too(
    tiny_model: Path, tmp_path: Path
) -> None:
    """--descriptor naming vLLM 0.8.5: imported with no word that no live run here would hit them, nor the adopt
    command a legacy descriptor gets (was)."""
    from inference.backends.vllm.descriptor import backend_version

    settings = {"model": str(tiny_model), "sampling": {"temperature": 0, "max_tokens": 8}, "backend_version": "0.8.5"}
    args, root = _one_judge_cache_of_4_rows(tmp_path, json.dumps({"vllm": settings}))
    imported = judgestore(*args, "--json")
    assert imported.returncode == 0, imported.stderr
    (source,) = orjson.loads(imported.stdout)["sources"]
    assert source["imported"] == 4
    assert f"rows were produced by vLLM 0.8.5; this machine has {backend_version()}" in " ".join(source["notes"])
    (location,) = walk(root)
    assert any(f"--from {location.descriptor_hash16} --across backend_version" in n for n in source["notes"])


def _a_tree_source_and_a_descriptor_naming_no_vllm(tmp_path: Path) -> Path:
    """A legacy tree source of one row under ``tmp_path/legacy``, whose metadata.json names no revision (so it is
    not mapped without --assume-current-model), and a --descriptor file without backend_version: its path."""
    metadata = b.s3_metadata("legacy-model", {"max_tokens": 8, "temperature": 0}, backend_version="0.10.0")
    folder = b.legacy_folder(tmp_path / "legacy", "completions", "t", "VLLM", "legacy-model", metadata)
    text = b.rendered_messages([{"role": "user", "content": "hi"}])
    row = {"input_hash": b.sha(text), "input_text": text, "completion": "hello", "benchmark": "t",
           "instruction_id": "0", "model": "m", "pushed_by": "u", "pushed_at": "2026-01-01", "run_id": "r"}  # fmt: skip
    b.create_db(folder / "completions.db", b.S4C_DDL, [row])
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="legacy-model").model_dump_json())
    return descriptor_file


def test_a_tree_source_under_a_descriptor_naming_no_vllm_says_so_without_advising_what_was_given(
    tmp_path: Path,
) -> None:
    """A --descriptor without backend_version was said as "produced by vLLM None", and the note why the legacy
    descriptor was not used ended advising "or --descriptor FILE", given already (was)."""
    descriptor_file = _a_tree_source_and_a_descriptor_naming_no_vllm(tmp_path)
    args = ["import", str(tmp_path / "legacy"), "--store-root", str(tmp_path / "store"), "--descriptor"]
    result = judgestore(*args, str(descriptor_file), "--json")
    assert result.returncode == 0, result.stderr
    (source,) = orjson.loads(result.stdout)["sources"]
    notes = " ".join(source["notes"])
    assert source["imported"] == 1 and "None" not in notes
    assert "rows were produced by a vLLM the descriptor does not name (no backend_version)" in notes
    assert "does not record the resolved revision or chat template of 'legacy-model'): imported under" in notes
    assert "or --descriptor FILE" not in notes


def test_an_s2_source_gets_the_adopt_command_only_of_the_roles_it_holds(tiny_model: Path, tmp_path: Path) -> None:
    """S2 files hold both roles per row: one holding only completions was told to adopt judgements too (a command
    that finds no rows)."""
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    metadata = {
        "descriptor_schema_version": "judgearena-inference-descriptor/v1",
        "model_spec": f"VLLM/{tiny_model}",
        "model": str(tiny_model),
        "input_mode": "chat",
        "chat_template": None,
        "chat_template_kwargs": {},
        "sampling": {"temperature": 0.0, "max_tokens": 8},
        "engine_settings": {"max_model_len": 256, "dtype": "float32", "seed": 0},
        "vllm_version": "0.10.0",
    }
    folder = b.legacy_folder(legacy, "inference", "mt bench", "VLLM", str(tiny_model), metadata)
    canonical = b.s2_rendered([{"role": "user", "content": "hi"}])
    stored = b.s2_hash(canonical)
    path = b.create_db(folder / "inference.db", b.S2_DDL, [{
        "input_hash": stored, "input_text": canonical, "output_text": "hello", "producer_metadata_json": "{}",
        "pushed_by": "bo", "pushed_at": "2026-01-01T00:00:00", "run_id": "r"}], table="inference")  # fmt: skip
    meta = b.legacy_dumps({"benchmark": "mt bench", "instruction_id": "0", "model": str(tiny_model)})
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO inference_metadata VALUES (?, ?, ?, ?, ?)",
                     (stored, b.sha(meta), meta, "2026-01-01T00:00:00", "r"))  # fmt: skip
        conn.commit()

    imported = judgestore("import", str(legacy), "--store-root", str(root), "--assume-current-model", str(tiny_model),
                          "--json")  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    (source,) = orjson.loads(imported.stdout)["sources"]
    assert source["imported"] == 1, source
    adopt = [note for note in source["notes"] if "judgestore adopt" in note]
    assert len(adopt) == 1 and adopt[0].startswith("to audit completions with vLLM"), source["notes"]
    assert "--role judgements" not in adopt[0]


def test_a_legacy_setting_no_key_can_hold_fails_its_source_alone(tiny_model: Path, tmp_path: Path) -> None:
    """An integer over 64 bits in a legacy metadata.json (the legacy hash, of stdlib JSON, takes it): that source
    is reported, the others are imported; it once stopped the whole import with a traceback."""
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    text = b.rendered_messages([{"role": "user", "content": "hi"}])
    row = {"input_hash": b.sha(text), "input_text": text, "completion": "hello", "benchmark": "t",
           "instruction_id": "0", "model": "tiny", "pushed_by": "u", "pushed_at": "2026-01-01",
           "run_id": "r"}  # fmt: skip
    for task, max_tokens in (("huge", 10**30), ("fine", 8)):
        metadata = b.s3_metadata(str(tiny_model), {"max_tokens": max_tokens, "temperature": 0})
        b.create_db(b.legacy_folder(legacy, "completions", task, "VLLM", str(tiny_model), metadata) / "completions.db",
                    b.S4C_DDL, [row])  # fmt: skip

    result = judgestore("import", str(legacy), "--store-root", str(root), "--assume-current-model", str(tiny_model),
                        "--json")  # fmt: skip

    assert result.returncode == 1 and "Traceback" not in result.stderr
    report = orjson.loads(result.stdout)
    assert report["totals"]["imported"] == 1 and report["totals"]["unattributed"] == 1
    (huge,) = [s for s in report["sources"] if "/huge/" in s["path"]]
    assert "64-bit" in huge["error"]
    assert [loc.task for loc in walk(root)] == ["fine"]


def test_on_a_core_install_the_note_says_vllm_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without vLLM (a core install) the import note names what to install, never 'this machine has None'."""
    import inference.legacy.mapper
    from inference.backends.vllm.tiny_model import build_tiny_model
    from inference.legacy.mapper import LegacyDescriptorMapper
    from tests.legacy.conftest import run_import

    monkeypatch.setattr(inference.legacy.mapper, "installed_backend_version", lambda: None)
    model = build_tiny_model(tmp_path / "tiny-local", seed=0)
    metadata = b.s3_metadata(str(model), {"max_tokens": 8, "temperature": 0}, backend_version="0.10.0")
    folder = b.legacy_folder(tmp_path / "legacy", "completions", "t", "VLLM", str(model), metadata)
    text = b.rendered_messages([{"role": "user", "content": "hi"}])
    row = {"input_hash": b.sha(text), "input_text": text, "completion": "hello", "benchmark": "t",
           "instruction_id": "0", "model": "tiny", "pushed_by": "u", "pushed_at": "2026-01-01",
           "run_id": "r"}  # fmt: skip
    b.create_db(folder / "completions.db", b.S4C_DDL, [row])
    mapper = LegacyDescriptorMapper(assume_current_model={str(model): str(model)})
    (source,) = run_import([tmp_path / "legacy"], tmp_path / "store", mapper, dry_run=True).sources
    notes = " ".join(source.notes)
    assert "rows were produced by vLLM 0.10.0; vLLM is not installed here" in notes, notes
    assert "None" not in notes and "install vLLM 0.10.0" in notes


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_an_import_says_what_was_imported_and_a_rerun_imports_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Two S0 caches of 4 rows: Ctrl-C as the second one's chunk is about to be written. (Was: exit 130, silent.)"""
    from typer.testing import CliRunner

    from inference.cli.app import app
    from store.legacy.writer import ChunkedWriter

    legacy, root = tmp_path / "legacy", tmp_path / "store"
    for name in ("gpt-4", "gpt-4-rerun"):  # one judge's (--descriptor names one)
        rows = [{"benchmark": "mt-bench", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "gpt-4",
                 "judge_input": f"{name} compares {i}", "judge_completion": "[[A]]", "date": "2025-12-31T23:59:59"}
                for i in range(4)]  # fmt: skip
        b.create_db(legacy / "cache" / "db" / "mt-bench" / f"{name}.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="judge", sampling={}).model_dump_json())
    args = ["import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file), "--task", "t"]
    real_write, written = ChunkedWriter._write, []

    def write_then_ctrl_c(self: ChunkedWriter, target: Any, report: Any) -> None:
        if target.pending and written:
            raise KeyboardInterrupt
        written.extend(target.pending)
        real_write(self, target, report)

    with pytest.MonkeyPatch.context() as interrupting:
        interrupting.setattr(ChunkedWriter, "_write", write_then_ctrl_c)
        result = CliRunner().invoke(app(), [*args, *(["--json"] if json_output else [])], env={"COLUMNS": "200"})
    assert result.exit_code == 130 and result.stdout == "" and len(written) == 4
    said = "interrupted; imported 4 rows from 2 of 2 sources before it, kept: run the same import again"
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert (error["rows_imported"], error["sources_started"], error["sources"]) == (4, 2, 2)
    else:
        assert said in " ".join(result.stderr.split())
    assert sum(len(rows) for rows in stored_rows(root).values()) == 4  # what the line said is what is stored

    again = orjson.loads(CliRunner().invoke(app(), [*args, "--json"]).stdout)["totals"]
    assert (again["imported"], again["already_present"]) == (4, 4)
    assert sum(len(rows) for rows in stored_rows(root).values()) == 8

    if json_output:  # a dry run stopped so imported nothing, whatever it had counted (was: rows_imported 4)
        written.clear()
        with pytest.MonkeyPatch.context() as interrupting:
            interrupting.setattr(ChunkedWriter, "_write", write_then_ctrl_c)
            dry = CliRunner().invoke(app(), [*args, "--store-root", str(tmp_path / "dry"), "--dry-run", "--json"])
        assert dry.exit_code == 130 and len(written) == 4 and not (tmp_path / "dry").exists()
        stopped = orjson.loads(dry.stderr)
        assert "a dry run writes nothing, so nothing was imported" in stopped["error"]
        assert stopped["rows_imported"] == 0


def _one_judge_cache_of_4_rows(tmp_path: Path, descriptor: str | None = None) -> tuple[list[str], Path]:
    """A legacy cache of one judge's 4 verdicts, and the import command line (without --json) of it into a store,
    under ``descriptor`` (a --descriptor file's text; default: a plain descriptor)."""
    legacy, root = tmp_path / "legacy", tmp_path / "store"
    rows = [{"benchmark": "mt-bench", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "gpt-4",
             "judge_input": f"compare {i}", "judge_completion": "[[A]]", "date": "2025-12-31T23:59:59"}
            for i in range(4)]  # fmt: skip
    b.create_db(legacy / "cache" / "db" / "mt-bench" / "gpt-4.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(descriptor or ModelDescriptor(provider="vllm", model="judge").model_dump_json())
    return ["import", str(legacy), "--store-root", str(root), "--descriptor", str(descriptor_file), "--task", "t"], root


def test_ctrl_c_during_a_chunks_commit_counts_the_chunk_that_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT while SQLite commits is raised once the commit returned: those rows are stored, and the line
    counts them. (Was: 'imported 0 rows' with 4 stored.)"""
    from contextlib import contextmanager

    from typer.testing import CliRunner

    from inference.cli.app import app
    from store.backends.sqlite.database import SqliteDatabase

    args, root = _one_judge_cache_of_4_rows(tmp_path)
    real_transaction = SqliteDatabase.transaction

    @contextmanager
    def commit_then_ctrl_c(self: SqliteDatabase) -> Any:
        with real_transaction(self) as repo:
            yield repo
        raise KeyboardInterrupt  # the commit is done: as SIGINT during it

    monkeypatch.setattr(SqliteDatabase, "transaction", commit_then_ctrl_c)
    result = CliRunner().invoke(app(), [*args, "--json"])
    assert result.exit_code == 130
    assert sum(len(rows) for rows in stored_rows(root).values()) == 4
    assert orjson.loads(result.stderr)["rows_imported"] == 4


def test_ctrl_c_as_the_store_closes_counts_every_row_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row imported, Ctrl-C as the store closed: 'imported 0 rows from 0 of 1 source' (was)."""
    from typer.testing import CliRunner

    from inference.cli.app import app
    from store.store import Store

    args, root = _one_judge_cache_of_4_rows(tmp_path)
    real_close = Store.close

    def close_then_ctrl_c(self: Store) -> None:
        real_close(self)
        if not self.readonly:
            raise KeyboardInterrupt

    monkeypatch.setattr(Store, "close", close_then_ctrl_c)
    result = CliRunner().invoke(app(), [*args, "--json"])
    assert result.exit_code == 130
    assert sum(len(rows) for rows in stored_rows(root).values()) == 4
    said = orjson.loads(result.stderr)
    assert (said["rows_imported"], said["sources_started"], said["sources"]) == (4, 1, 1)


def test_on_a_core_install_a_descriptor_naming_no_vllm_still_gets_the_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No vLLM here and none named by --descriptor: "None == None" said nothing at all (was)."""
    import inference.legacy.mapper
    from inference.legacy.mapper import LegacyDescriptorMapper
    from inference.legacy.user_descriptor import load_user_descriptor
    from tests.legacy.conftest import run_import

    monkeypatch.setattr(inference.legacy.mapper, "installed_backend_version", lambda: None)
    descriptor_file = _a_tree_source_and_a_descriptor_naming_no_vllm(tmp_path)
    mapper = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file))
    (source,) = run_import([tmp_path / "legacy"], tmp_path / "store", mapper, dry_run=True).sources
    notes = " ".join(source.notes)
    assert "rows were produced by a vLLM the descriptor does not name (no backend_version); vLLM is not" in notes
    assert "None" not in notes


@pytest.mark.parametrize(
    ("where", "descriptor"),
    [
        ("endpoint", {"provider": "vllm-server", "model": "j", "endpoint": "http://user:S3cretPw99@127.0.0.1:9/v1"}),
        ("endpoint", {"provider": "vllm-server", "model": "j", "endpoint": "http://127.0.0.1:9/v1?api_key=S3cretPw99"}),
        ("sampling.api_key", {"provider": "vllm", "model": "j", "sampling": {"api_key": "S3cretPw99"}}),
        ("sampling.user", {"provider": "vllm", "model": "j", "sampling": {"user": "sk-" + "S3cretPw99" * 3}}),
    ],
)
def test_a_descriptor_file_holding_a_credential_is_refused_without_showing_it(
    tmp_path: Path, where: str, descriptor: dict[str, object]
) -> None:
    """The key was imported into metadata.json, hashed into the descriptor and published by `hub push` (was)."""
    args, root = _one_judge_cache_of_4_rows(tmp_path, json.dumps(descriptor))
    result = judgestore(*args, "--json")
    assert result.returncode == 1, result.stdout
    error = orjson.loads(result.stderr)
    assert error["type"] == "InvalidInputError" and f"descriptor.{where}" in error["error"]
    assert "S3cretPw99" not in result.stdout + result.stderr
    assert not root.exists()


def test_detect_names_an_s1_metadata_model_without_a_provider(tmp_path: Path) -> None:
    """An S1 metadata.json names no provider: --detect showed "None/model-x" (was)."""
    folder = tmp_path / "legacy" / "results" / "mt-bench_model-x"
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"model": "model-x", "arena": "mt-bench"}))
    b.create_db(folder / "judgements.db", b.S1J_DDL, [
        {"instruction_index": 0, "model_A": "a", "model_B": "b", "judge_input": "p", "judge_output": "[[A]]"}
    ])  # fmt: skip
    found = judgestore("import", str(tmp_path / "legacy"), "--detect")
    said = " ".join(found.stdout.split())
    assert found.returncode == 0 and "S1 metadata.json: model-x" in said and "None/" not in said, found.stdout
