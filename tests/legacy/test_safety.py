"""Imports are safe to repeat, to interrupt and to dry-run; bad sources are reported and the rest goes on."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.descriptor import input_hash
from store.legacy.readonly import open_dataframe
from store.settings import Settings
from store.store import Store
from store.tables.records import CompletionRecord
from tests.legacy import builders as b
from tests.legacy.conftest import CHAT, REPO_ROOT, all_rows, checksum, judgestore, run_import


def _s4c(root: Path, task: str, n: int, *, offset: int = 0, completion: str = "answer {i}", **kw: Any) -> Path:
    rows = []
    for i in range(offset, offset + n):
        text = b.rendered_messages([{"role": "user", "content": f"question {i}: {b.AWKWARD_TEXTS[i % 7]}"}])
        rows.append(
            {
                "input_hash": b.sha(text),
                "input_text": text,
                "completion": completion.format(i=i),
                "benchmark": task,
                "instruction_id": str(i),
                "model": "m",
                "pushed_by": "u",
                "pushed_at": "2026-01-01T00:00:00",
                "run_id": "r",
            }
        )
    folder = b.legacy_folder(root, "completions", task, "VLLM", "m", b.s3_metadata("m", {"max_tokens": 8}))
    return b.create_db(folder / "completions.db", b.S4C_DDL, rows, **kw)


def _s6j(root: Path, n: int) -> Path:
    rows = []
    for i in range(n):
        text = b.rendered_messages([{"role": "user", "content": f"judge {i} ¿?"}])
        rows.append(
            {
                "input_hash": b.sha(text),
                "judge_input": text,
                "judge_completion": f"[[A]] {i}",
                "benchmark": "t",
                "instruction_id": str(i),
                "model_a": "a",
                "model_b": None if i % 2 else "b",
                "judge": "j",
                "top_logprobs": '{"A":-0.5}',
                "orientation": "single" if i % 2 else "forward",
                "pushed_by": "u",
                "pushed_at": "2026-01-01T00:00:00",
                "run_id": "r",
            }
        )
    folder = b.legacy_folder(root, "judgements", "t", "VLLM", "j", b.s3_metadata("j", {"max_tokens": 8}))
    return b.create_db(folder / "judgements.db", b.S6J_DDL, rows)


def _s0(root: Path, n: int) -> Path:
    rows = [
        {
            "benchmark": "b",
            "instruction_id": str(i),
            "model_a": "a",
            "model_b": "b",
            "judge": "j",
            "judge_input": f"p{i}",
            "judge_completion": f"c{i}",
            "date": "",
        }
        for i in range(n)
    ]
    return b.create_db(root / "cache" / "db" / "b" / "j.db", b.S0_DDL, rows)


def test_a_dry_run_changes_nothing_on_disk_and_counts_what_a_real_run_does(legacy_root: Path, store_root: Path) -> None:
    _s4c(legacy_root, "t", 30, leave_wal=True)  # a pending -wal must not be touched either
    _s6j(legacy_root, 10)
    _s0(legacy_root, 5)
    run_import([legacy_root / "judgements"], store_root)  # the store already holds the S6j rows
    before = b.file_digests(legacy_root, store_root)
    dry = run_import([legacy_root], store_root, task="b", dry_run=True)
    assert b.file_digests(legacy_root, store_root) == before
    real = run_import([legacy_root], store_root, task="b")
    assert dry.totals() == real.totals()
    assert real.totals()["imported"] == 35 and real.totals()["already_present"] == 10


def test_a_dry_run_into_a_new_store_creates_nothing(legacy_root: Path, store_root: Path, tiny_model: Path) -> None:
    _s4c(legacy_root, "t", 5)
    result = judgestore(
        "import", str(legacy_root), "--store-root", str(store_root), "--dry-run", "--assume-current-model",
        f"m={tiny_model}",
    )  # fmt: skip
    assert not store_root.exists()
    assert result.returncode == 0


def test_a_second_import_imports_nothing_new(legacy_root: Path, store_root: Path) -> None:
    _s4c(legacy_root, "t", 25)
    _s6j(legacy_root, 12)
    first = run_import([legacy_root], store_root)
    rows = all_rows(store_root)
    second = run_import([legacy_root], store_root)
    assert first.totals()["imported"] == 37
    assert second.totals()["imported"] == 0 and second.totals()["already_present"] == 37
    assert checksum(all_rows(store_root)) == checksum(rows)


def _a_writer_commits(db: Path) -> None:
    """What a run still writing its cache does: a commit that rewrites pages (the file's change counter moves)."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE completions SET run_id = run_id || 'x'")
        conn.commit()


def test_a_cache_written_while_it_is_imported_fails_its_source_saying_so(legacy_root: Path, store_root: Path) -> None:
    """Was: read without a lock as if no one wrote it, a torn read gave "damaged" or a silent count, and exit 0."""
    db = _s4c(legacy_root, "live", 40)
    written: list[int] = []

    def on_progress(event: Any) -> None:
        if not written:
            written.append(event.rows_done)
            _a_writer_commits(db)

    report = run_import([legacy_root], store_root, on_progress=on_progress)
    (source,) = report.sources
    assert written and source.source_failed and "was written by another process while it was read" in source.error
    assert "import it again once its writer has finished" in source.error
    assert len(all_rows(store_root)) == source.imported >= 40  # what was read, each row checked, is kept


def test_a_cache_another_process_only_reads_while_it_is_imported_is_imported_as_any(
    legacy_root: Path, store_root: Path
) -> None:
    """A reader of a WAL database creates an empty -wal beside it, and leaves it: no write (a review found the
    source failed as "written by another process")."""
    db = _s4c(legacy_root, "read", 30)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    assert not Path(f"{db}-wal").exists()
    readers: list[sqlite3.Connection] = []

    def on_progress(event: Any) -> None:
        if not readers:
            readers.append(sqlite3.connect(f"file:{db}?mode=ro", uri=True))
            readers[0].execute("SELECT count(*) FROM completions").fetchone()

    try:
        report = run_import([legacy_root], store_root, on_progress=on_progress)
    finally:
        for reader in readers:
            reader.close()
    (source,) = report.sources
    assert readers and Path(f"{db}-wal").exists()  # the reader's empty -wal, there during the import
    assert not source.source_failed and source.imported == 30, source.as_dict()


def test_a_cache_written_while_it_is_detected_is_not_called_damaged(
    legacy_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.legacy import detect

    db = _s4c(legacy_root, "live", 3)

    def torn_read(conn: sqlite3.Connection) -> Any:
        _a_writer_commits(db)  # a commit lands while the pages are read
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(detect, "table_columns", torn_read)
    (found,) = detect.detect([db]).detections
    assert "was written by another process while it was read" in found.detail and "damaged" not in found.detail


KILLED_IMPORT = """
import os, signal, sys
from pathlib import Path
from store.legacy.detect import detect
from store.legacy.importer import ImportOptions, import_sources
from store.store import Store
from tests.legacy.conftest import fixed

legacy, root, kill_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

def progress(event):
    if event.rows_done >= kill_after:
        os.kill(os.getpid(), signal.SIGKILL)

with Store(root=root) as store:
    import_sources(detect([legacy]).detections, store, fixed(), ImportOptions(chunk_size=10), on_progress=progress)
"""


def test_a_killed_import_leaves_a_consistent_store_and_a_rerun_completes_it(
    legacy_root: Path, store_root: Path
) -> None:
    _s4c(legacy_root, "t", 95)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", KILLED_IMPORT, str(legacy_root), str(store_root), "40"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    partial = len(all_rows(store_root))
    assert partial == 40  # whole chunks only
    verify = subprocess.run(
        [sys.executable, "-m", "store", "verify", "--store-root", str(store_root)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    rerun = run_import([legacy_root], store_root, chunk_size=10)
    assert (rerun.totals()["imported"], rerun.totals()["already_present"]) == (95 - partial, partial)
    assert len(all_rows(store_root)) == 95


def test_rows_already_in_the_store_win_and_differences_are_conflicts(legacy_root: Path, store_root: Path) -> None:
    _s4c(legacy_root, "t", 6)
    local = []
    for i, completion in ((0, "answer 0"), (1, "a fresher local answer")):
        text = b.rendered_messages([{"role": "user", "content": f"question {i}: {b.AWKWARD_TEXTS[i]}"}])
        local.append(
            CompletionRecord(
                input_hash=input_hash(text),
                input_text=text,
                completion=completion,
                created_at=datetime(2026, 5, 1, tzinfo=UTC),
                run_id="live",
            )
        )
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", CHAT).put_many(local)
    report = run_import([legacy_root], store_root)
    source = report.sources[0]
    assert (source.imported, source.already_present, source.conflicts) == (4, 1, 1)
    (conflict,) = source.conflict_list
    assert "fresher local" in conflict["kept"] and "answer 1" in conflict["not_imported"]
    stored = {r["input_hash"]: r for r in all_rows(store_root)}
    assert stored[local[1].input_hash]["completion"] == "a fresher local answer"
    assert stored[local[1].input_hash]["run_id"] == "live"


def test_two_legacy_rows_with_one_key_and_two_outputs_are_a_conflict_not_a_merge(
    tmp_path: Path, store_root: Path
) -> None:
    first = _s4c(tmp_path / "alice", "t", 4)
    second = _s4c(tmp_path / "bob", "t", 4, offset=2, completion="bob's answer {i}")
    report = run_import([first, second], store_root)
    assert [s.imported for s in report.sources] == [4, 2]
    assert report.sources[1].conflicts == 2 and report.ok
    assert [s.status for s in report.sources] == ["imported", "imported"]
    third = _s4c(tmp_path / "carol", "t", 2, completion="carol's answer {i}")  # every row a conflict
    (only_conflicts,) = run_import([third], store_root).sources
    assert (only_conflicts.imported, only_conflicts.conflicts) == (0, 2)
    assert only_conflicts.status == "conflicts"  # nothing of it was imported: "imported" said otherwise (was)
    assert {c["row"].split(" (")[0] for c in report.sources[1].conflict_list} == {"row 1", "row 2"}
    assert not any(
        r["completion"].startswith("bob's") and r["instruction_id"] in ("2", "3") for r in all_rows(store_root)
    )


def test_a_dry_run_reports_what_the_import_does_of_rows_it_would_write_twice(tmp_path: Path) -> None:
    """A dry run keeps a preview of each row it would write, not its text: its report (conflicts and what they
    show included) is still the real run's."""
    first = _s4c(tmp_path / "alice", "t", 6)
    same = _s4c(tmp_path / "carol", "t", 3)  # the same outputs: already present
    second = _s4c(tmp_path / "bob", "t", 4, offset=2, completion="bob's answer {i}")
    sources = [first, same, second]
    dry = run_import(sources, tmp_path / "dry", dry_run=True, chunk_size=2)
    real = run_import(sources, tmp_path / "real", chunk_size=2)
    assert [s.as_dict() for s in dry.sources] == [s.as_dict() for s in real.sources]
    assert [(s.imported, s.already_present, s.conflicts) for s in real.sources] == [(6, 0, 0), (0, 3, 0), (0, 0, 4)]
    assert "'answer 2'" in real.sources[2].conflict_list[0]["kept"]


def test_bad_sources_are_reported_and_the_rest_is_imported(
    legacy_root: Path, store_root: Path, tmp_path: Path, tiny_model: Path
) -> None:
    pd = pytest.importorskip("pandas")
    good = _s4c(legacy_root, "good", 5)
    # 1. not SQLite at all, though named like a cache
    (legacy_root / "broken").mkdir()
    (legacy_root / "broken" / "judgements.db").write_bytes(b"this is not a database" * 100)
    # 2. SQLite, truncated mid-file
    truncated = _s4c(tmp_path / "t2", "trunc", 400)
    data = truncated.read_bytes()
    (legacy_root / "broken" / "truncated.db").write_bytes(data[: len(data) // 2])
    # 3. a metadata.json edited after its folder was named
    edited = _s4c(legacy_root, "edited", 3)
    metadata_path = edited.parent / "metadata.json"
    doc = orjson.loads(metadata_path.read_bytes())
    doc["model_kwargs"]["max_tokens"] = 4096
    metadata_path.write_bytes(orjson.dumps(doc))
    # 4. rows whose stored hash does not match their input
    tampered = _s4c(legacy_root, "tampered", 4)
    with closing(sqlite3.connect(tampered)) as conn:
        conn.execute("UPDATE completions SET input_text = replace(input_text, 'question 1', 'question one')")
        conn.commit()
    # 4b. a folder moved under another model
    model_folder = _s4c(legacy_root, "moved", 2).parent.parent  # .../moved/VLLM/m
    moved = next(model_folder.rename(model_folder.with_name("other")).glob("*/completions.db"))
    # 5. a CSV cache with a missing column
    cache = legacy_root / "cache"
    cache.mkdir()
    pd.DataFrame({"instruction_index": [0, 1], "answer": ["x", "y"]}).to_csv(cache / "m.csv.zip", index=False)

    report = run_import([legacy_root], store_root, task="pass")
    by_name = {s.path.relative_to(legacy_root).parts[0] + "/" + s.path.name: s for s in report.sources}
    assert not report.ok
    assert by_name["completions/completions.db"].status != "failed"
    reasons = {name: (s.status, s.error or "; ".join(s.failed)) for name, s in by_name.items()}
    assert reasons["broken/judgements.db"] == ("failed", "not an SQLite database (wrong header)")
    assert reasons["broken/truncated.db"][0] == "failed" and "damaged" in reasons["broken/truncated.db"][1]
    assert (
        reasons["cache/m.csv.zip"][0] == "failed" and "missing columns ['completion']" in reasons["cache/m.csv.zip"][1]
    )
    sources = {s.path: s for s in report.sources}
    assert sources[good].imported == 5
    assert sources[edited].status == "failed" and "edited or the folder renamed" in str(sources[edited].error)
    # advice that works: --descriptor was advised, though the file is checked before any descriptor (was)
    assert "Restore the original metadata.json" in str(sources[edited].error)
    assert "--descriptor" not in str(sources[edited].error)
    assert sources[moved].status == "failed"
    assert (
        "records provider/model VLLM/m but lies under VLLM/other: the folder was moved. Move it back under VLLM/m"
        in (str(sources[moved].error))
    )
    assert sources[edited].failed and sum(sources[edited].failed.values()) == 3
    assert (sources[tampered].imported, dict(sources[tampered].failed)) == (
        3,
        {"stored input_hash does not match its input (the row was edited or damaged)": 1},
    )
    assert sources[tampered].examples[next(iter(sources[tampered].failed))][0].startswith("row 2 (input_hash ")

    result = judgestore(
        "import",
        str(legacy_root),
        "--store-root",
        str(tmp_path / "cli-store"),
        "--task",
        "pass",
        "--assume-current-model",
        f"m={tiny_model}",
        "--report",
        str(tmp_path / "report.json"),
    )
    assert result.returncode == 1
    assert "not an SQLite database" in result.stderr and "does not match its input" in result.stderr
    written = orjson.loads((tmp_path / "report.json").read_bytes())
    assert written["ok"] is False and written["totals"]["failed"] >= 4


def test_detect_prints_what_was_found(legacy_root: Path) -> None:
    _s4c(legacy_root, "t", 3)
    _s6j(legacy_root, 2)
    _s0(legacy_root, 2)
    b.create_db(legacy_root / "elsewhere" / "judgements.db", b.S3C_DDL, [])  # a misleading name
    (legacy_root / "notes.txt").write_text("not a cache")
    # Other tools' files that look like data: they were reported corrupt, and failed the run (was)
    (legacy_root / "notes.csv").write_bytes("r\xe9sum\xe9,auteur\nun,deux\n".encode("latin-1"))
    with zipfile.ZipFile(legacy_root / "logs.zip", "w") as archive:
        archive.writestr("a.log", "started")
        archive.writestr("b.log", "done")
    with zipfile.ZipFile(legacy_root / "report.docx", "w") as archive:
        archive.writestr("word/document.xml", "<w:document/>")
    (legacy_root / "crashed").mkdir()
    (legacy_root / "crashed" / "judgements.db").touch()  # a run that stopped before its tables: no rows, no failure
    report = legacy_root.parent / "detected.json"
    result = judgestore("import", "--detect", str(legacy_root), "--json", "--report", str(report))
    assert result.returncode == 0, result.stderr
    assert orjson.loads(report.read_bytes()) == orjson.loads(result.stdout)  # it was not written (was)

    def shown(path: str) -> str:  # the descriptor-hash folder as HASH
        parts = list(Path(path).relative_to(legacy_root).parts)
        return "/".join("HASH" if len(parts) == 6 and i == 4 else p for i, p in enumerate(parts))

    found = {shown(d["path"]): (d["variant"], d["role"], d["rows"]) for d in orjson.loads(result.stdout)["sources"]}
    assert found == {
        "cache/db/b/j.db": ("S0", "judgements", 2),
        "completions/t/VLLM/m/HASH/completions.db": ("S4c", "completions", 3),
        "elsewhere/judgements.db": ("S3c", "completions", 0),  # by content, not by name
        "judgements/t/VLLM/j/HASH/judgements.db": ("S6j", "judgements", 2),
    }
    table = judgestore("import", "--detect", str(legacy_root))
    assert "S4c" in table.stdout and "S6j" in table.stdout and "5 other files ignored" in table.stdout
    # Named, each is still reported, as what it is
    named = judgestore("import", "--detect", str(legacy_root / "notes.csv"), str(legacy_root / "logs.zip"), "--json")
    states = [d["state"] for d in orjson.loads(named.stdout)["sources"]]
    assert states == ["not-ours", "not-ours"], named.stdout


def test_detect_says_invalid_for_a_metadata_json_the_import_would_refuse(legacy_root: Path) -> None:
    """An edited metadata.json, or a folder moved under another model: `--detect` said ok (exit 0), then the import
    failed the source (was)."""
    edited = _s4c(legacy_root / "a", "edited", 3)
    doc = orjson.loads((edited.parent / "metadata.json").read_bytes())
    doc["model_kwargs"]["max_tokens"] = 4096
    (edited.parent / "metadata.json").write_bytes(orjson.dumps(doc))
    model_folder = _s4c(legacy_root / "b", "moved", 2).parent.parent  # .../moved/VLLM/m
    model_folder.rename(model_folder.with_name("other"))
    _s4c(legacy_root / "c", "good", 2)
    result = judgestore("import", "--detect", str(legacy_root), "--json")
    assert result.returncode == 1, result.stderr
    found = {Path(d["path"]).relative_to(legacy_root).parts[0]: d for d in orjson.loads(result.stdout)["sources"]}
    assert {name: d["state"] for name, d in found.items()} == {"a": "invalid", "b": "invalid", "c": "ok"}
    assert "edited or the folder renamed" in found["a"]["detail"]
    assert "lies under VLLM/other: the folder was moved" in found["b"]["detail"]


def test_a_damaged_destination_database_fails_its_source_and_the_import_goes_on(
    tmp_path: Path, store_root: Path
) -> None:
    first = _s4c(tmp_path / "one", "broken-target", 5)
    second = _s6j(tmp_path / "two", 4)
    with Store(Settings(), root=store_root) as store:
        database = store.database("completions", "broken-target", CHAT)
        path = database.path
    path.write_bytes(b"garbage where a database was" * 200)
    report = run_import([first, second], store_root)
    broken, fine = report.sources
    assert broken.status == "failed" and "not an SQLite database" in str(broken.error)
    assert sum(broken.failed.values()) == 5
    assert fine.imported == 4 and not report.ok


def test_a_dataframe_cache_damaged_past_its_header_fails_alone_and_the_rest_is_imported(
    legacy_root: Path, store_root: Path, tmp_path: Path
) -> None:
    """A byte that is not UTF-8 deep in a CSV, or a zipped CSV whose data fails its CRC, ended the whole import
    with a traceback, after other sources were written, and with no report (was)."""
    pd = pytest.importorskip("pandas")
    _s0(legacy_root, 3)
    cache = legacy_root / "frames"
    cache.mkdir()
    rows = "".join(f"answer {i},{i}\n" for i in range(2000)).encode()  # past what the header check reads
    (cache / "late.csv").write_bytes(b"completion,instruction_index\n" + rows + b"\xff\xfe bad,2000\n")
    frame = pd.DataFrame({"completion": [f"answer {i}" for i in range(500)], "instruction_index": range(500)})
    frame.to_csv(cache / "crc.csv.zip", index=False)
    zipped = bytearray((cache / "crc.csv.zip").read_bytes())
    zipped[len(zipped) // 2] ^= 0xFF  # inside the member's compressed data: its header and directory still read
    (cache / "crc.csv.zip").write_bytes(bytes(zipped))

    report = run_import([legacy_root], store_root, task="b")
    sources = {s.path.name: s for s in report.sources}
    assert sources["j.db"].imported == 3
    for name, said in (("late.csv", "is not UTF-8 text"), ("crc.csv.zip", "is not a readable zip archive")):
        assert sources[name].status == "failed" and said in str(sources[name].error), sources[name].as_dict()
    assert not report.ok


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        (lambda whole: whole[:-12] + b"\n", "unexpected end of data"),  # inside the last answer's quotes
        (lambda whole: whole[:-3], "does not end with a line break"),  # inside the last number: 1999 became 19
        (lambda whole: whole.replace(b',"answer 7 said"', b""), "line 9 has 1 fields where the header has 2"),
    ],
    ids=["in-a-quoted-field", "in-a-number", "a-row-short-of-a-field"],
)
def test_a_csv_cut_short_or_mangled_fails_its_source_and_stores_no_shortened_answer(
    cut: Callable[[bytes], bytes], said: str, legacy_root: Path, store_root: Path
) -> None:
    """The csv module's defaults read a file that ends inside a quoted field as a shorter answer, and pad a row
    short of a field with NULLs: a cut-off answer became a hit, and a cut number filed an answer under another
    instruction (was: "imported", exit 0). A DataFrame is read through (counted) before any row is imported, so
    the source fails whole, and the other sources are imported."""
    cache = legacy_root / "frames"
    cache.mkdir(parents=True)
    whole = b"instruction_index,completion\n" + b"".join(b'%d,"answer %d said"\n' % (i, i) for i in range(1999))
    whole += b'1999,"the last answer, which is long"\n'
    (cache / "cut.csv").write_bytes(cut(whole))
    (cache / "whole.csv").write_bytes(whole)
    lines = [{"instruction_index": i, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(2000)]
    inputs = legacy_root / "inputs.jsonl"
    inputs.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))

    report = run_import([cache], store_root, task="t", inputs=inputs)
    sources = {s.path.name: s for s in report.sources}
    damaged, whole_one = sources["cut.csv"], sources["whole.csv"]
    assert damaged.status == "failed" and said in str(damaged.error), damaged.as_dict()
    assert damaged.imported == 0 and whole_one.imported == 2000 and not report.ok
    answers = {row["instruction_id"]: row["completion"] for row in all_rows(store_root)}
    assert answers == {str(i): f"answer {i} said" for i in range(1999)} | {"1999": "the last answer, which is long"}


def test_a_csv_saved_with_a_byte_order_mark_reads_its_first_column_by_name(tmp_path: Path) -> None:
    """Excel writes UTF-8 with a BOM: the first column was read as '\\ufeffcompletion', and the cache as invalid."""
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffcompletion,instruction_index\nanswer,0\n".encode())
    source = open_dataframe(path)
    assert source.columns == ("completion", "instruction_index")
    assert list(source.iter_rows()) == [{"completion": "answer", "instruction_index": "0"}]


def test_a_dry_run_counts_a_key_repeated_within_one_chunk_as_the_real_run_does(tmp_path: Path) -> None:
    """One chunk holding a key three times (the same output, then another): imported, present, conflict; the dry
    run's keys kept on disk (not in memory) give the same as the real run's transaction."""
    from store.descriptor import ModelDescriptor
    from store.legacy.report import SourceReport
    from store.legacy.writer import ChunkedWriter
    from tests.factories import completion_record

    row = completion_record(1)
    rows = [row, completion_record(2), row, completion_record(1, completion="another answer")]
    outcomes = []
    for dry_run in (True, False):
        with Store(Settings(), root=tmp_path / str(dry_run), readonly=dry_run) as store:
            writer = ChunkedWriter(store, dry_run=dry_run, chunk_size=100)
            report = SourceReport(tmp_path / "source.db", None, "ok")
            for i, record in enumerate(rows):
                writer.add(record, f"row {i}", role="completions", task="t", descriptor=ModelDescriptor(
                    provider="vllm", model="m"), assumptions=(), report=report)  # fmt: skip
            writer.flush(report)
            writer.close()
            outcomes.append((report.imported, report.already_present, report.conflicts, report.conflict_list))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][:3] == (2, 1, 1) and "'answer 1'" in outcomes[0][3][0]["kept"]
