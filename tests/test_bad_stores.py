"""Every command over every kind of bad store: no traceback anywhere, and a bad file is never changed.

Each fixture is a small store whose two databases of one descriptor (the one ``generate`` and ``import``
write to) are bad in one way. Every command runs over it through the whole app, in-process; the next
fault of this kind is then caught here, not by a user. A healthy store runs first, as the control.

* Every command ends through the CLI's edge: exit status 0 or 1, no exception escaped, no traceback.
* The bad files are byte-identical afterwards, whatever the command (a zero-byte database is not bad:
  a writer gives it its tables); commands that only read leave every file of the store as it was.
* "unreadable" makes the files mode 000. Root reads them anyway, so as root the commands on that fixture
  run with the effective uid of ``nobody`` (its files are in a folder anyone may enter); where that is
  not possible the fixture is skipped and the read-only mount covers a store the user cannot write.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.layout import METADATA_FILE, Location, walk
from tests.factories import file_digests, fill_small_store, foreign_database, stamp
from tests.faults import (
    as_nobody,
    assert_no_traceback,
    damage_page,
    damage_text,
    is_root,
    judgestore,
    remount,
    small_filesystem,
)
from tests.inference.test_cached import CountingBackend
from tests.legacy import builders

TASK = "walk"
READ_ONLY_COMMANDS = (
    "ls", "query", "db status", "verify", "stats", "export", "explain", "copy", "generate readonly", "generate replay",
)  # fmt: skip


@dataclass(frozen=True)
class Place:
    """Everything a walk over one store needs: the store, a shared folder, a legacy source, the model."""

    root: Path
    shared: Path
    legacy: Path
    descriptor_file: Path
    model: Path
    requests: Path

    def bad_files(self) -> list[Path]:
        """The two databases of the walk's descriptor (completions written by generate, judgements by import)."""
        return [loc.db_path(self.root) for loc in walk(self.root) if loc.task == TASK]


def commands(place: Place) -> dict[str, list[str]]:
    root = ["--store-root", str(place.root)]
    run = ["--model", str(place.model), "--task", TASK, "-i", str(place.requests), "-o", "-", *root]
    return {
        "ls": ["ls", *root],
        "query": ["query", "--format", "jsonl", *root],
        "delete": ["delete", "--run-id", "run-1", "--yes", *root],
        "db status": ["db", "status", *root],
        "db upgrade": ["db", "upgrade", *root],
        "verify": ["verify", *root],
        "hub push": ["hub", "push", "--all", "--dir", str(place.shared), *root],
        "hub fetch": ["hub", "fetch", "--all", "--dir", str(place.shared), *root],
        "import": ["import", str(place.legacy), "--descriptor", str(place.descriptor_file), "--task", TASK, *root],
        "stats": ["stats", "--runs", "3", *root],
        "export": ["export", "--format", "jsonl", "-o", "-", *root],
        "explain": ["explain", "--model", str(place.model), "--task", TASK, "-i", str(place.requests), *root],
        "prune": ["prune", "--older-than", "3650d", "--yes", *root],
        "vacuum": ["vacuum", *root],
        "copy": ["copy", "--from-root", str(place.root), "--to-root", str(place.root.parent / "copied")],
        "generate readonly": ["generate", *run, "--mode", "readonly"],
        "generate replay": ["generate", *run, "--mode", "replay"],
    }


# ---------------------------------------------------------------- the healthy store every fixture starts from


@pytest.fixture(scope="module")
def engine() -> Iterator[CountingBackend]:
    """The engine of every run in this module: it answers at once and never loads a model."""
    backend = CountingBackend()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelSpec, "backend", lambda self: backend)
        yield backend


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, engine: CountingBackend) -> Place:
    """A healthy place: a small store plus the walk's descriptor in both roles, pushed to a shared folder."""
    from inference.backends.vllm.tiny_model import build_tiny_model

    base = tmp_path_factory.mktemp("template")
    model = build_tiny_model(base / "tiny-llama", seed=0)
    requests = base / "requests.jsonl"
    lines = [{"instruction_id": str(i), "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    requests.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines[:2]))
    root = fill_small_store(base / "store")
    generated = judgestore("generate", "--model", str(model), "--task", TASK, "-i", str(requests), "-o", "-",
                           "--store-root", str(root), "--json")  # fmt: skip
    assert generated.exit_code == 0, generated.output
    requests.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))  # 2 hits, 1 miss
    descriptor = ModelSpec(model=str(model)).descriptor
    descriptor_file = base / "descriptor.json"
    descriptor_file.write_text(descriptor.model_dump_json())
    legacy = base / "legacy" / "cache" / "db" / TASK / "judge.db"
    rows = [{"benchmark": TASK, "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "judge",
             "judge_input": f"compare {i}", "judge_completion": "[[A]]", "date": "2026-01-01T00:00:00"}
            for i in range(3)]  # fmt: skip
    builders.create_db(legacy, builders.S0_DDL, rows)
    imported = judgestore("import", str(legacy.parents[3]), "--descriptor", str(descriptor_file), "--task", TASK,
                          "--store-root", str(root))  # fmt: skip
    assert imported.exit_code == 0, imported.output
    place = Place(root, base / "shared", legacy.parents[3], descriptor_file, model, requests)
    place.shared.mkdir()
    assert judgestore(*commands(place)["hub push"]).exit_code == 0
    assert len(place.bad_files()) == 2
    return place


def copy_place(template: Place, into: Path) -> Place:
    """A private copy of the template place under ``into``: the store, the shared folder and the rest."""
    base = template.root.parent
    shutil.copytree(base, into, dirs_exist_ok=True, symlinks=True)
    moved = {name: into / Path(getattr(template, name)).relative_to(base) for name in Place.__dataclass_fields__}
    return Place(**moved)


# ---------------------------------------------------------------- the bad stores


def _each(place: Place, damage: Callable[[Path], None]) -> None:
    for path in place.bad_files():
        for side in path.parent.iterdir():  # the copy was closed cleanly: no -wal; a lock file is harmless
            if side.name.endswith(("-wal", "-shm")):
                side.unlink()
        damage(path)


def _table(path: Path) -> str:
    return "judgements" if path.name.startswith("judgements") else "completions"


def _edit_metadata(path: Path) -> None:
    metadata = path.parent / METADATA_FILE
    doc = orjson.loads(metadata.read_bytes())
    doc["descriptor"]["sampling"]["temperature"] = 0.5  # no longer the descriptor the folder is named after
    metadata.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _leave_wal(path: Path) -> None:
    """Leave a commit in ``path``'s -wal, as a writer killed before its checkpoint does."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        with conn:
            conn.execute(f"UPDATE {_table(path)} SET run_id = 'left-in-the-wal' WHERE rowid = 1")
        saved = {side: side.read_bytes() for side in (path, path.with_name(path.name + "-wal"))}
    for side, data in saved.items():  # closing checkpointed and removed the -wal: put both back as they were
        side.write_bytes(data)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "healthy": lambda path: None,
    "not SQLite": lambda path: path.write_bytes(b"this is a text file, not a database\n" * 200),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "damaged page": lambda path: damage_page(path, _table(path)),
    "damaged text": lambda path: (damage_text(path, _table(path)), None)[1],
    "zero bytes": lambda path: path.write_bytes(b""),
    "newer revision": lambda path: stamp(path, "9999_from_the_future"),
    "foreign alembic table": lambda path: (path.unlink(), foreign_database(path, "optuna"))[1],
    "metadata mismatch": _edit_metadata,
    "unreadable": lambda path: path.chmod(0),
    "read-only mount": lambda path: None,  # the whole store, on a tmpfs remounted read-only
    "read-only mount, a -wal left": _leave_wal,  # ...and the bad files keep a commit in a -wal (a writer died)
}


@contextmanager
def bad_place(kind: str, template: Place, tmp_path: Path) -> Iterator[Place]:
    if kind.startswith("read-only mount"):
        with small_filesystem(tmp_path / "disk", "16m") as disk:
            place = copy_place(template, disk / "place")
            _each(place, DAMAGES[kind])
            remount(disk, "ro")
            yield place
        return
    if kind == "unreadable" and is_root():
        base = Path(tempfile.mkdtemp(prefix="judgestore-unreadable-"))  # not under pytest's 0700 folders
        try:
            place = copy_place(template, base / "place")
            for path in [base, *base.rglob("*")]:  # everyone may read it all (pytest's folders are 0700)...
                path.chmod(0o755 if path.is_dir() else 0o644)
            _each(place, DAMAGES[kind])  # ...but the bad files
            yield place
        finally:
            shutil.rmtree(base)
        return
    place = copy_place(template, tmp_path / "place")
    _each(place, DAMAGES[kind])
    yield place


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_every_command_over_a_bad_store_ends_cleanly_and_leaves_the_bad_files_alone(
    kind: str, template: Place, tmp_path: Path, engine: CountingBackend
) -> None:
    with bad_place(kind, template, tmp_path) as place:
        bad_files = place.bad_files()
        outcomes: dict[str, int] = {}
        for name, args in commands(place).items():
            before, bad = _readable_digests(place.root), {path: _digest(path) for path in bad_files}
            rows = {path: _row_bytes(path) for path in bad_files} if kind == "damaged text" else {}
            with as_nobody() if kind == "unreadable" and is_root() else nullcontext():
                result = judgestore(*args)
            assert_no_traceback(result)
            assert result.exit_code in (0, 1), (kind, name, result.output)
            outcomes[name] = result.exit_code
            if (kind, name) == ("damaged text", "vacuum"):
                # Text that is not UTF-8 is only found by reading every row (verify). VACUUM copies each record's
                # bytes as they are: the pages move, every row (the damaged one too) stays byte for byte.
                assert {path: _row_bytes(path) for path in bad_files} == rows, (kind, name)
            elif kind not in ("healthy", "zero bytes") or name in READ_ONLY_COMMANDS:
                assert {path: _digest(path) for path in bad_files} == bad, (kind, name)
            if name in READ_ONLY_COMMANDS:
                assert _readable_digests(place.root) == before, (kind, name)
        if kind == "healthy":  # replay meets the one request the store does not hold
            assert outcomes == {name: int(name == "generate replay") for name in outcomes}, outcomes
        else:
            assert any(outcomes.values()), f"{kind}: no command noticed anything ({outcomes})"


def _digest(path: Path) -> str | None:
    try:
        return file_digests(path.parent).get(str(path))
    except OSError:  # unreadable: its mode is the fixture
        return f"mode {path.stat().st_mode:o}"


def _row_bytes(path: Path) -> list[tuple[bytes | None, ...]]:
    """Every row of ``path``'s table as the bytes stored, in key order (text read as blobs: no decoding)."""
    with closing(sqlite3.connect(path)) as conn:
        table = _table(path)
        columns = [name for _, name, *_ in conn.execute(f"PRAGMA table_info({table})")]
        blobs = ", ".join(f"CAST({name} AS BLOB)" for name in columns)
        return conn.execute(f"SELECT {blobs} FROM {table} ORDER BY CAST(input_hash AS BLOB)").fetchall()


def _readable_digests(root: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and os.access(path, os.R_OK) and path.stat().st_mode & 0o444:
            digests[str(path)] = _digest(path) or ""
    return digests


def test_the_fixtures_are_what_they_say(template: Place, tmp_path: Path) -> None:
    """A bad store that is not bad would make the walk above prove nothing."""
    descriptor = ModelDescriptor.model_validate_json(template.descriptor_file.read_text())
    walked = {Location.of(role, TASK, descriptor).db_path(template.root) for role in ("completions", "judgements")}
    assert walked == set(template.bad_files())
    assert len(template.requests.read_bytes().splitlines()) == 3  # two hits and a miss
    for kind in DAMAGES:
        if kind in ("healthy", "read-only mount"):
            continue  # (a read-only mount has no bad file: every write fails)
        with bad_place(kind, template, tmp_path / kind.replace(" ", "-")) as place:
            with as_nobody() if kind == "unreadable" and is_root() else nullcontext():
                status = judgestore("db", "status", "--json", "--store-root", str(place.root))
            states = {d["path"]: d["state"] for d in orjson.loads(status.stdout)["databases"]}
            bad_states = {states[str(path)] for path in place.bad_files()}
            assert bad_states != {"current"} or kind in ("damaged page", "damaged text"), (kind, bad_states)
            if kind in ("damaged page", "damaged text"):  # the version table is intact; the rows are not
                assert judgestore("verify", "--store-root", str(place.root)).exit_code == 1


@contextmanager
def shut_folder(*folders: Path) -> Iterator[None]:
    """``folders`` closed to the block's user (as root, the block runs as nobody; files anyone may enter around
    them)."""
    for folder in folders:
        folder.chmod(0o700 if is_root() else 0)
    try:
        with as_nobody() if is_root() else nullcontext():
            yield
    finally:
        for folder in folders:
            folder.chmod(0o755)


@pytest.mark.parametrize("depth", ["store root", "model folder"])
def test_a_folder_this_user_cannot_look_into_is_an_error_not_an_empty_store(depth: str) -> None:
    """It read as no databases: ls listed the others and exited 0, delete left the rows inside (was)."""
    base = Path(tempfile.mkdtemp(prefix="judgestore-shut-"))  # not under pytest's 0700 folders
    try:
        root = fill_small_store(base / "store")
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o666)
        before = file_digests(root)
        locations = list(walk(root))
        model = next(loc for loc in locations if loc.model == "meta-llama/Llama-3.1-8B").folder(root).parent
        with shut_folder(root if depth == "store root" else model):
            listed = judgestore("ls", "--store-root", str(root), "--json")
            deleted = judgestore("delete", "--store-root", str(root), "--run-id", "run-2", "--yes", "--json")
        for result in (listed, deleted):
            assert_no_traceback(result)
            assert result.exit_code == 1, result.output
            error = orjson.loads(result.stderr)
            assert error["type"] == "DatabaseIOError" and "permission denied" in error["error"], error
            assert error["error"].startswith(f"{root if depth == 'store root' else model}: "), error  # the one to fix
        assert file_digests(root) == before  # nothing deleted: the rows of run-2 in the readable databases too
    finally:
        shutil.rmtree(base)


def test_a_closed_folder_elsewhere_stops_no_command_that_does_not_look_there() -> None:
    """Another user's closed judge folder, and a stray closed folder (lost+found) that can hold no database: a
    command of the other role, task or model, and every command for the stray, go on (they stopped, was)."""
    base = Path(tempfile.mkdtemp(prefix="judgestore-shut-"))  # not under pytest's 0700 folders
    try:
        root = fill_small_store(base / "store")
        (root / "completions" / "mt-bench" / "lost+found").mkdir()
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o666)
        judge = next(loc for loc in walk(root) if loc.role == "judgements").folder(root).parent
        with shut_folder(judge, root / "completions" / "mt-bench" / "lost+found"):
            listed = judgestore("ls", "--store-root", str(root), "--role", "completions", "--json")
            by_task = judgestore("query", "--store-root", str(root), "--task", "mt-bench", "--format", "jsonl")
            whole = judgestore("ls", "--store-root", str(root), "--json")
            mistyped = judgestore("ls", "--store-root", str(root), "--task", "mt-bnch")
            from store import Selector, Store

            with Store(root=root) as store:
                mine = store.select(Selector(role="completions", task="mt-bench", model="Qwen/Qwen3-8B"))
        assert listed.exit_code == 0 and len(orjson.loads(listed.stdout)) == 2, listed.output
        assert by_task.exit_code == 0 and len(by_task.stdout.splitlines()) == 5, by_task.output
        assert [loc.model for loc in mine] == ["Qwen/Qwen3-8B"]
        assert whole.exit_code == 1 and str(judge) in orjson.loads(whole.stderr)["error"]  # it does look there
        # the note of a selection that matches nothing (a permission error of the closed folder, was)
        assert mistyped.exit_code == 0 and "matches --task mt-bnch" in mistyped.output, mistyped.output

    finally:
        shutil.rmtree(base)


def test_a_database_file_that_is_a_link_to_nothing_is_a_stray_not_an_error(tmp_path: Path) -> None:
    """A link loop where a database file belongs stopped ls and verify with "fix its permissions" (was)."""
    root = fill_small_store(tmp_path / "store")
    folder = root / "completions" / "t" / "vllm" / "m" / "0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "completions.db").symlink_to("completions.db")
    listed = judgestore("ls", "--store-root", str(root), "--json")
    verified = judgestore("verify", "--store-root", str(root), "--json")
    assert listed.exit_code == 0 and len(orjson.loads(listed.stdout)) == 3, listed.output
    assert verified.exit_code == 1 and "a link to nothing" in verified.stdout, verified.output
    assert "permission" not in verified.output
