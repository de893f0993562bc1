"""Detection by content: tables, columns, NOT NULL flags, metadata.json keys; never by a file's name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from store.descriptor import ModelDescriptor
from store.legacy.detect import BOOKKEEPING_TABLES, Detection, State, detect, detect_file
from store.legacy.metadata import MetadataForm, read_legacy_metadata
from store.settings import Settings
from store.store import Store
from store.sync.bookkeeping import metadata as bookkeeping_metadata
from tests.factories import completion_record
from tests.legacy import builders as b
from tests.legacy.conftest import judgestore, run_import


def _one(path: Path) -> Detection:
    detection = detect_file(path)
    assert detection is not None
    return detection


def test_names_do_not_decide(tmp_path: Path) -> None:
    s5 = b.create_db(tmp_path / "completions.db", b.S5J_DDL)
    s6 = b.create_db(tmp_path / "whatever.sqlite", b.S6J_DDL)
    s0 = b.create_db(tmp_path / "cache.bin", b.S0_DDL)
    assert (_one(s5).variant, _one(s5).role) == ("S5j", "judgements")  # model_b NOT NULL
    assert _one(s6).variant == "S6j"  # the same columns, model_b nullable
    assert _one(s0).variant == "S0"
    not_sqlite = tmp_path / "judgements.db"
    not_sqlite.write_text("SQLite format 2, honestly")
    assert (_one(not_sqlite).state, _one(not_sqlite).detail) == (State.CORRUPT, "not an SQLite database (wrong header)")


def test_usage_json_added_in_place_is_a_flag_and_names_s7(tmp_path: Path) -> None:
    altered = b.create_db(tmp_path / "a.db", b.S4C_DDL, alter=["ALTER TABLE completions ADD COLUMN usage_json TEXT"])
    s5 = b.create_db(tmp_path / "b.db", b.S5J_DDL, alter=["ALTER TABLE judgements ADD COLUMN usage_json TEXT"])
    s1 = b.create_db(tmp_path / "c.db", b.S1C_DDL, alter=["ALTER TABLE completions ADD COLUMN usage_json TEXT"])
    assert (_one(altered).variant, _one(altered).has_usage) == ("S7c", True)
    assert _one(s5).variant == "S5j+usage_json"
    assert _one(s1).state is State.INVALID and "usage_json" in _one(s1).detail


def test_unknown_foreign_and_judgestore_files(tmp_path: Path, store_root: Path) -> None:
    extra = b.create_db(tmp_path / "x.db", b.S4C_DDL, alter=["ALTER TABLE completions ADD COLUMN score REAL"])
    detection = _one(extra)
    assert detection.state is State.INVALID
    assert "closest: S4c" in detection.detail and "unexpected ['score']" in detection.detail
    foreign = b.create_db(tmp_path / "optuna.db", "CREATE TABLE studies (id INTEGER PRIMARY KEY)", table="studies")
    assert _one(foreign).state is State.NOT_OURS
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="m")).count()
    found = detect([store_root]).detections
    assert {d.state for d in found} == {State.JUDGESTORE}
    assert run_import([store_root], store_root.parent / "other").sources[0].status == "skipped"


def test_a_store_with_its_sharing_bookkeeping_is_judgestore_and_a_missing_path_is_missing(
    tmp_path: Path, store_root: Path
) -> None:
    """`import --detect` on a store: its sync.db is judgestore's own, not another tool's; a typo is `missing`."""
    assert {t.name for t in bookkeeping_metadata.sorted_tables} == BOOKKEEPING_TABLES  # what detection looks for
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="m")).put_many([completion_record(1)])
    pushed = judgestore("hub", "push", "--dir", str(tmp_path / "shared"), "--all", "--create-repo",
                        "--store-root", str(store_root))  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    sync_db = store_root / ".judgestore-sync" / "sync.db"
    assert sync_db.is_file()
    found = {d.path: d for d in detect([store_root, tmp_path / "no-such-cache"]).detections}
    assert found[sync_db].state is State.JUDGESTORE and "sharing bookkeeping" in found[sync_db].detail
    missing = found[tmp_path / "no-such-cache"]
    assert (missing.state, missing.detail) == (State.MISSING, "does not exist (check the path)")
    shown = judgestore("import", str(store_root), str(tmp_path / "no-such-cache"), "--detect")
    assert shown.returncode == 1  # a path that is not there is a problem, as a corrupt one is
    assert "another tool" not in shown.stdout and "corrupt" not in shown.stdout and "missing" in shown.stdout


def test_legacy_metadata_forms(tmp_path: Path) -> None:
    forms = {
        "s3.json": (b.s3_metadata("m", {"max_tokens": 8}), MetadataForm.S3),
        "s2.json": ({"descriptor_schema_version": "judgearena-inference-descriptor/v1", "model_spec": "VLLM/m",
                     "model": "m"}, MetadataForm.S2),
        "s1.json": ({"model": "m", "arena": "mt-bench", "languages": ["en", "fr"], "n_instructions": 80,
                     "pushed_by": "u", "pushed_at": "2026-01-01"}, MetadataForm.S1),
        "other.json": ({"hello": "world"}, MetadataForm.UNKNOWN),
    }  # fmt: skip
    for name, (doc, form) in forms.items():
        (tmp_path / name).write_text(json.dumps(doc))
        metadata = read_legacy_metadata(tmp_path / name)
        assert metadata.form is form, name
        assert (metadata.problem is None) == (form is not MetadataForm.UNKNOWN)
    (tmp_path / "broken.json").write_text("{not json")
    assert "not valid JSON" in str(read_legacy_metadata(tmp_path / "broken.json").problem)


def test_s1_files_beside_their_metadata_need_a_descriptor(legacy_root: Path, store_root: Path) -> None:
    folder = legacy_root / "results" / "mt-bench_model-x"
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"model": "model-x", "arena": "mt-bench"}))
    b.create_db(folder / "judgements.db", b.S1J_DDL, [
        {"instruction_index": 0, "model_A": "a", "model_B": "b", "judge_input": "p", "judge_output": "[[A]]"}
    ])  # fmt: skip
    (detection,) = detect([legacy_root]).detections
    assert detection.metadata is not None and detection.metadata.form is MetadataForm.S1
    from inference.legacy.mapper import LegacyDescriptorMapper

    report = run_import([legacy_root], store_root, LegacyDescriptorMapper(detections=[detection]), task="t")
    assert report.sources[0].skipped == {"S1j records no descriptor; import it with --descriptor FILE": 1}


def test_a_lone_metadata_json_is_reported_not_imported(legacy_root: Path, store_root: Path) -> None:
    folder = b.legacy_folder(legacy_root, "completions", "t", "VLLM", "m", b.s3_metadata("m", {}))
    (found,) = detect([legacy_root]).detections
    assert (found.kind, found.path) == ("metadata", folder / "metadata.json")
    assert "no database beside it" in found.detail
    report = run_import([legacy_root], store_root)
    assert report.sources[0].status == "skipped" and report.ok


def test_a_lone_metadata_json_beside_an_empty_database_names_it(legacy_root: Path) -> None:
    """Was: "no database beside it", and the 0-byte file only among the "other files ignored"."""
    folder = b.legacy_folder(legacy_root, "completions", "t", "VLLM", "m", b.s3_metadata("m", {}))
    (folder / "completions.db").write_bytes(b"")
    (found,) = detect([legacy_root]).detections
    assert found.path == folder / "metadata.json"
    assert "whose database completions.db is empty (0 bytes: a run that stopped before writing" in found.detail


def test_a_linked_database_is_detected_once_at_its_own_place_with_its_metadata(legacy_root: Path) -> None:
    """A link sorting before the file it names was detected instead of it: no metadata.json beside the link, so its
    rows went under whatever --descriptor said, and the tree's metadata.json was "with no database beside it" (was).
    """
    folder = b.legacy_folder(legacy_root, "completions", "t", "VLLM", "m", b.s3_metadata("m", {"top_p": 0.95}))
    database = b.create_db(folder / "completions.db", b.S4C_DDL)
    (legacy_root / "again.db").symlink_to(database)
    outside = legacy_root.parent / "outside"
    outside.mkdir()
    (outside / "alone.db").symlink_to(database)  # a link named on its own, nothing beside it
    for sources in ([legacy_root], [outside / "alone.db"], [outside / "alone.db", legacy_root]):
        (found,) = detect(sources).detections
        assert found.path == database and found.variant == "S4c", sources
        assert found.metadata is not None and found.metadata.path == folder / "metadata.json"


def test_a_cache_tree_linked_into_the_folder_is_walked_each_folder_once(legacy_root: Path, tmp_path: Path) -> None:
    """A folder reached through a link was skipped without a word: "No legacy cache found", exit 0 (was)."""
    elsewhere = tmp_path / "elsewhere"
    folder = b.legacy_folder(elsewhere, "completions", "t", "VLLM", "m", b.s3_metadata("m", {}))
    database = b.create_db(folder / "completions.db", b.S4C_DDL)
    legacy_root.mkdir()
    (legacy_root / "completions").symlink_to(elsewhere / "completions", target_is_directory=True)
    (folder / "up").symlink_to(legacy_root, target_is_directory=True)  # a loop back to the top
    (found,) = detect([legacy_root]).detections
    assert found.path.resolve() == database and found.metadata is not None


def test_a_damaged_database_beside_its_metadata_is_named_and_the_metadata_not_called_alone(legacy_root: Path) -> None:
    """Beside the corrupt database's own line, its metadata.json was reported "with no database beside it" (was)."""
    folder = b.legacy_folder(legacy_root, "completions", "t", "VLLM", "m", b.s3_metadata("m", {}))
    (folder / "completions.db").write_bytes(b"not a database at all" * 10)
    (found,) = detect([legacy_root]).detections
    assert (found.path, found.state) == (folder / "completions.db", State.CORRUPT)


def test_a_file_or_folder_that_cannot_be_read_is_a_problem_not_a_wrong_header_or_nothing(legacy_root: Path) -> None:
    """An unreadable database was "not an SQLite database (wrong header)", an unreadable zip or folder not reported
    at all, exit 0 (was). Root reads anything: the detection runs without its capabilities (setpriv)."""
    folder = b.legacy_folder(legacy_root, "completions", "t", "VLLM", "m", b.s3_metadata("m", {}))
    database = b.create_db(folder / "completions.db", b.S4C_DDL)
    hidden = b.legacy_folder(legacy_root, "completions", "u", "VLLM", "m", b.s3_metadata("m", {}))
    b.create_db(hidden / "completions.db", b.S4C_DDL)
    archive = legacy_root / "cache" / "model-y.csv.zip"
    archive.parent.mkdir()
    archive.write_bytes(b"PK\x03\x04 whatever")
    database.chmod(0)
    archive.chmod(0)
    hidden.chmod(0)
    script = (
        "import sys, json; from pathlib import Path; from store.legacy.detect import detect; "
        "print(json.dumps([[str(d.path), d.state.value, d.detail] for d in detect([Path(sys.argv[1])]).detections]))"
    )
    command = [sys.executable, "-c", script, str(legacy_root)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root reads any file; dropping that needs setpriv (util-linux)")
        command = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *command]
    try:
        ran = subprocess.run(command, capture_output=True, text=True, check=False, cwd=Path(__file__).parents[2])
    finally:
        hidden.chmod(0o755)
    assert ran.returncode == 0, ran.stderr
    found = {Path(path): (state, detail) for path, state, detail in json.loads(ran.stdout)}
    assert found[database] == ("corrupt", "cannot be read (Permission denied); nothing of it was imported")
    assert found[archive][0] == "corrupt" and "cannot be read" in found[archive][1]
    assert found[hidden] == ("corrupt", "a folder that cannot be listed (Permission denied)")
    assert folder / "metadata.json" not in found  # its database is there, unreadable: not "no database beside it"


def test_a_run_folder_linked_inside_its_tree_is_read_at_its_own_place(legacy_root: Path) -> None:
    """A `latest` link to a run folder listed before the tree stood for it: no tree, so no task, and under --task
    its rows went to another task's folder (the first mend of links did this; was)."""
    folder = b.legacy_folder(legacy_root, "completions", "mytask", "OpenAI", "gpt-4o", b.s3_metadata("gpt-4o", {}))
    database = b.create_db(folder / "completions.db", b.S4C_DDL)
    for name in ("aaa", "latest", "best", "zzz", "run-1", "run-2", "x", "newest"):  # listed before "completions"
        (legacy_root / name).symlink_to(folder, target_is_directory=True)  # or after, as the folder has them
    (found,) = detect([legacy_root]).detections
    assert found.path == database and found.tree is not None and found.tree.task == "mytask"


def test_links_to_nothing_and_link_loops_are_named_not_skipped_or_a_traceback(legacy_root: Path) -> None:
    legacy_root.mkdir()
    (legacy_root / "gone.db").symlink_to(legacy_root / "nowhere" / "completions.db")
    (legacy_root / "notes.txt").symlink_to(legacy_root / "nowhere.txt")  # not a cache's name: listed, no failure
    loop = legacy_root / "loop.db"
    loop.symlink_to(loop)
    found = {d.path.name: (d.state, d.detail) for d in detect([legacy_root]).detections}
    assert found["gone.db"][0] is State.MISSING and "which does not exist" in found["gone.db"][1]
    assert found["loop.db"] == (State.CORRUPT, "a symbolic link that leads back to itself (a loop)")
    assert found["notes.txt"][0] is State.NOT_OURS and "nothing there was read" in found["notes.txt"][1]
    (named,) = detect([loop]).detections  # named on its own: RuntimeError, a traceback (was)
    assert named.state is State.CORRUPT


def test_a_link_named_as_a_source_is_walked_after_the_real_folders(legacy_root: Path) -> None:
    """`import best completions` (a shell's `legacy/*` beside a `best` link) read the run folder through the link,
    with no tree and so no task (was)."""
    folder = b.legacy_folder(legacy_root, "completions", "mytask", "OpenAI", "gpt-4o", b.s3_metadata("gpt-4o", {}))
    database = b.create_db(folder / "completions.db", b.S4C_DDL)
    (legacy_root / "best").symlink_to(folder, target_is_directory=True)
    (found,) = detect([legacy_root / "best", legacy_root / "completions"]).detections
    assert found.path == database and found.tree is not None and found.tree.task == "mytask"


def test_a_link_to_a_folder_that_is_not_there_is_listed_without_failing_the_import(legacy_root: Path) -> None:
    """A data folder's `cache` link to an unmounted disk: "0 sources", exit 0, not a word (was)."""
    legacy_root.mkdir()
    (legacy_root / "cache").symlink_to(Path("/nonexistent-mount/judgearena-cache"), target_is_directory=True)
    (found,) = detect([legacy_root]).detections
    assert found.state is State.NOT_OURS and "/nonexistent-mount/judgearena-cache, which does not exist" in found.detail
