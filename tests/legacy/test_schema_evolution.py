"""docs/schema-evolution.md, run for real: add a column, autogenerate, check, upgrade a store of many databases.

The package tree (store/, migrations/, alembic.ini) is copied to a temporary
folder and edited there, exactly as the guide says; the repository itself is
never changed. The commands run in subprocesses whose PYTHONPATH puts the copy
first, so they see the edited models and the new revision; the store is built
beforehand by this checkout's library (its shipped head), as a user's store
would have been.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from store.backends.sqlite.upgrade import upgrade_database
from store.descriptor import ModelDescriptor
from store.errors import SchemaAheadError
from store.schema import read_script_directory
from store.settings import Settings
from store.store import Store
from tests.factories import SHIPPED_HEAD, SYNTHETIC_REVISIONS, completion_record, judgement_record

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = REPO_ROOT / "docs" / "schema-evolution.md"
ALEMBIC = Path(sys.executable).with_name("alembic")
NEW_REVISION = f"{int(SHIPPED_HEAD) + 1:04d}"  # the guide's new revision, after the newest shipped one

MODEL_ANCHOR = "    orientation: Mapped[Orientation | None] = mapped_column(server_safe(String(16)), sort_order=-77)\n"
MODEL_EDIT = "    verdict: Mapped[str | None] = mapped_column(server_safe(String(16)), sort_order=41)\n"
CODEGEN = "python -m store.tables.codegen"
DOCSTRING = """What changes: adds the nullable column judgements.verdict (String(16)).
Why: parsed verdicts can be filtered on without re-parsing completions.
Data impact: none; existing rows read NULL, no row is rewritten.
Expected cost: milliseconds per database (a nullable column is added in place).
"""
DESCRIPTORS = [
    ModelDescriptor(provider="vllm", model=f"org/model-{k}", sampling={"max_tokens": k + 1}) for k in range(5)
]


def _copy_package(destination: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("store", "migrations"):
        shutil.copytree(REPO_ROOT / name, destination / name, ignore=ignore)
    shutil.copy2(REPO_ROOT / "alembic.ini", destination / "alembic.ini")
    return destination


def _edit(path: Path, anchor: str, addition: str) -> None:
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path.name} changed: the guide's anchor is gone"
    path.write_text(text.replace(anchor, anchor.split("\n")[0] + "\n" + addition + anchor.split("\n", 1)[1]))


def _edit_revision(models: Path) -> None:
    """``SCHEMA_REVISION`` moved to the new revision, as the guide says."""
    text = models.read_text()
    old = f'SCHEMA_REVISION = "{SHIPPED_HEAD}"'
    assert text.count(old) == 1, f"{models.name} changed: the guide's SCHEMA_REVISION line is gone"
    models.write_text(text.replace(old, f'SCHEMA_REVISION = "{NEW_REVISION}"'))


def _run(copy: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=120)


def _store(copy: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run(copy, sys.executable, "-m", "store", *args, env=env)


def test_the_guide_shows_the_edits_this_test_makes() -> None:
    guide = GUIDE.read_text()
    for snippet in (
        MODEL_EDIT,
        CODEGEN,
        DOCSTRING,
        'alembic revision --autogenerate -m "add judgement verdict"',
        f"--rev-id {NEW_REVISION}",
        f'SCHEMA_REVISION = "{NEW_REVISION}"',
    ):
        assert snippet in guide


def test_add_a_column_generate_check_and_upgrade_a_whole_store(tmp_path: Path) -> None:
    if not ALEMBIC.exists():
        pytest.skip("the alembic command is not installed beside this interpreter")
    copy = _copy_package(tmp_path / "copy")
    env = {**os.environ, "PYTHONPATH": str(copy), "JUDGESTORE_ALEMBIC_DB": str(tmp_path / "dev.db")}

    # The store, written by this checkout's library (its shipped head): many descriptor databases.
    root = tmp_path / "store"
    with Store(Settings(), root=root) as store:
        for k, descriptor in enumerate(DESCRIPTORS):
            store.database("judgements", "mt-bench", descriptor).put_many([judgement_record(i) for i in range(k + 3)])
            store.database("completions", "mt-bench", descriptor).put_many([completion_record(i) for i in range(4)])
    # ... and shared before the change, by the same library: its shards have no verdict
    old_hub = tmp_path / "old-hub"
    shared = ("hub", "push", "--store-root", str(root), "--dir", str(old_hub), "--all", "--create-repo", "--json")
    before_change = _store(REPO_ROOT, *shared, env={**env, "PYTHONPATH": str(REPO_ROOT)})
    assert before_change.returncode == 0, before_change.stderr

    # 1. the model, edited as the guide shows, and the records generated from it
    _edit(copy / "store" / "tables" / "models.py", MODEL_ANCHOR, MODEL_EDIT)
    stale = _run(copy, sys.executable, "-m", "store.tables.codegen", "--check", env=env)
    assert stale.returncode == 1 and "store/tables/records.py" in stale.stderr  # the guide's command is then needed
    assert _run(copy, *CODEGEN.replace("python", sys.executable, 1).split(), env=env).returncode == 0
    assert "    verdict: str | None = None\n" in (copy / "store" / "tables" / "records.py").read_text()

    # 2. a development database at head; alembic check sees the new column
    assert _run(copy, str(ALEMBIC), "upgrade", "head", env=env).returncode == 0
    check = _run(copy, str(ALEMBIC), "check", env=env)
    assert check.returncode != 0 and "add_column" in check.stdout + check.stderr and "verdict" in check.stdout

    # 3. the revision, generated; its docstring filled in; then check passes
    generated = _run(
        copy,
        str(ALEMBIC),
        "revision",
        "--autogenerate",
        "-m",
        "add judgement verdict",
        "--rev-id",
        NEW_REVISION,
        env=env,
    )
    assert generated.returncode == 0, generated.stderr
    revision = copy / "migrations" / "versions" / f"{NEW_REVISION}_add_judgement_verdict.py"
    source = revision.read_text()
    assert "batch_op.add_column(sa.Column('verdict', sa.String(length=16), nullable=True))" in source
    assert "forward-only" in source
    start, end = source.index("What changes:"), source.index("Revision ID:")
    revision.write_text(source[:start] + DOCSTRING + "\n" + source[end:])
    assert _run(copy, str(ALEMBIC), "upgrade", "head", env=env).returncode == 0
    check = _run(copy, str(ALEMBIC), "check", env=env)
    assert check.returncode == 0 and "No new upgrade operations detected" in check.stdout
    # ... and the models say which revision they declare: a new database is then created from them, at it
    _edit_revision(copy / "store" / "tables" / "models.py")
    fresh = (
        "import sqlite3, sys; from store.store import Store; from store.descriptor import ModelDescriptor\n"
        "with Store(root=sys.argv[1]) as s: path = s.database('judgements', 't', ModelDescriptor(provider='vllm', "
        "model='new')).path\n"
        "conn = sqlite3.connect(path)\n"
        "print(conn.execute('SELECT version_num FROM judgestore_alembic_version').fetchone()[0], "
        "','.join(r[1] for r in conn.execute('PRAGMA table_info(judgements)')))"
    )
    created = _run(copy, sys.executable, "-c", fresh, str(tmp_path / "new-store"), env=env)
    assert created.returncode == 0, created.stderr
    revision_made, columns_made = created.stdout.split()
    assert revision_made == NEW_REVISION and columns_made.split(",").count("verdict") == 1

    # 3. "run the tests": their synthetic revision (tests/store/revisions) still goes on top of the new head (it
    # added this very column, so after the guide the schema tests failed: duplicate column name)
    on_top = (
        "import sys; from sqlalchemy import create_engine; from store.schema import migrate, read_script_directory\n"
        "from tests.factories import SYNTHETIC_REVISIONS\n"
        "engine = create_engine('sqlite:///' + sys.argv[1])\n"
        "with engine.begin() as conn: migrate(conn, script=read_script_directory(SYNTHETIC_REVISIONS))\n"
        "print(read_script_directory(SYNTHETIC_REVISIONS).get_revision('9001').down_revision)"
    )
    tested = _run(
        copy, sys.executable, "-c", on_top, str(tmp_path / "tests.db"),
        env={**env, "PYTHONPATH": f"{copy}{os.pathsep}{REPO_ROOT}"},
    )  # fmt: skip
    assert tested.returncode == 0 and tested.stdout.strip() == NEW_REVISION, tested.stderr

    # 4. the store: all behind, then upgraded with backups and a report, then a second run does nothing
    status = _store(copy, "db", "status", "--store-root", str(root), "--json", env=env)
    assert status.returncode == 1
    assert {d["state"] for d in orjson.loads(status.stdout)["databases"]} == {"behind"}
    upgrade = _store(copy, "db", "upgrade", "--store-root", str(root), "--json", env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    results = orjson.loads(upgrade.stdout)["results"]
    assert len(results) == 2 * len(DESCRIPTORS)
    assert {(r["outcome"], r["from_revision"], r["to_revision"]) for r in results} == {
        ("upgraded", SHIPPED_HEAD, NEW_REVISION)
    }
    for result in results:
        assert Path(result["backup"]).is_file() and f".bak-{SHIPPED_HEAD}-" in result["backup"]
        assert sum(result["rows"].values()) > 0
    again = _store(copy, "db", "upgrade", "--store-root", str(root), "--json", env=env)
    assert {r["outcome"] for r in orjson.loads(again.stdout)["results"]} == {"up-to-date"}
    verify = _store(copy, "verify", "--store-root", str(root), "--json", env=env)
    assert verify.returncode == 0, verify.stdout
    # A new database (built from the models) holds the columns in the order an upgraded one does: the guide's
    # first sort_order put verdict after orientation, the migration at the end (the schema tests then failed)
    with closing(sqlite3.connect(next(root.glob("judgements/**/judgements.db")))) as upgraded:
        columns = ",".join(r[1] for r in upgraded.execute("PRAGMA table_info(judgements)"))
    assert columns == columns_made
    assert orjson.loads(verify.stdout)["rows_checked"] == sum(k + 3 + 4 for k in range(len(DESCRIPTORS)))

    # The new column is usable by the new library: write a verdict, read it back.
    use_it = (
        "from store.store import Store; from store.descriptor import ModelDescriptor; "
        "from tests.factories import judgement_record; import dataclasses, sys\n"
        f"d = ModelDescriptor.model_validate_json({DESCRIPTORS[0].model_dump_json()!r})\n"
        "db = Store(root=sys.argv[1]).database('judgements', 'mt-bench', d)\n"
        "db.put_many([dataclasses.replace(judgement_record(99), verdict='A')])\n"
        "print(sorted(str(r.verdict) for r in db.query()))"
    )
    read = _run(
        copy, sys.executable, "-c", use_it, str(root), env={**env, "PYTHONPATH": f"{copy}{os.pathsep}{REPO_ROOT}"}
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == str(sorted(["A"] + ["None"] * 3))

    # ... and shared: a push and a fetch carry it (a fetch quarantined every judgement shard, for a field it did
    # not expect, was)
    hub, fetched = tmp_path / "hub", tmp_path / "fetched"
    push = ("hub", "push", "--store-root", str(root), "--dir", str(hub), "--all", "--create-repo", "--json")
    assert (pushed := _store(copy, *push, env=env)).returncode == 0, pushed.stderr
    fetch = ("hub", "fetch", "--dir", str(hub), "--all", "--store-root", str(fetched), "--json")
    assert (got := _store(copy, *fetch, env=env)).returncode == 0, got.stdout + got.stderr
    rows = _store(copy, "query", "--store-root", str(fetched), "--role", "judgements", "--format", "jsonl", env=env)
    verdicts = [orjson.loads(line)["verdict"] for line in rows.stdout.splitlines()]
    assert len(verdicts) == sum(k + 3 for k in range(len(DESCRIPTORS))) + 1 and verdicts.count("A") == 1
    # The shards pushed before the change are still fetched, their verdicts NULL (the first mend required the new
    # field of every shard, and quarantined every one pushed before it)
    older = ("hub", "fetch", "--dir", str(old_hub), "--all", "--store-root", str(tmp_path / "older"), "--json")
    assert (old_got := _store(copy, *older, env=env)).returncode == 0, old_got.stdout + old_got.stderr
    judged = ("query", "--store-root", str(tmp_path / "older"), "--role", "judgements", "--format", "jsonl")
    rows = _store(copy, *judged, env=env)
    verdicts = [orjson.loads(line)["verdict"] for line in rows.stdout.splitlines()]
    assert len(verdicts) == sum(k + 3 for k in range(len(DESCRIPTORS))) and set(verdicts) == {None}

    # 5. going back is refused: alembic downgrade stops, and the older library will not open the file
    down = _run(copy, str(ALEMBIC), "downgrade", "-1", env=env)
    assert down.returncode != 0 and "forward-only" in down.stderr
    with Store(Settings(), root=root) as store, pytest.raises(SchemaAheadError, match="Upgrade the library"):
        store.database("judgements", "mt-bench", DESCRIPTORS[0]).count()


def _going_back_commands() -> list[str]:
    """The commands of the guide's "Going back" section, as its first console block shows them."""
    section = GUIDE.read_text().split("### 5. Going back", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    return [line.removeprefix("$ ") for line in block.splitlines() if line.startswith("$ ")]


def test_going_back_as_the_guide_says_gives_the_backup_whole(store_root: Path) -> None:
    """A job of the newer library was killed after writing (its -wal stays): the guide's commands, run in the
    descriptor folder, must leave exactly the backed-up database, with no page of the upgraded one."""
    descriptor = DESCRIPTORS[0]
    with Store(Settings(), root=store_root) as store:
        db_path = store.database("judgements", "t", descriptor).path
        store.database("judgements", "t", descriptor).put_many([judgement_record(i) for i in range(20)])
    with Store(Settings(), root=store_root) as store:
        before = sorted(r.completion for r in store.database("judgements", "t", descriptor).query())
    upgraded = upgrade_database(db_path, Settings(), script=read_script_directory(SYNTHETIC_REVISIONS))
    assert upgraded.backup is not None
    killed_job = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute(\"UPDATE judgements SET completion = 'new ' || completion\")\n"
        "c.execute('CREATE TABLE extra(x)')\n"
        "c.execute('COMMIT')\n"
        "os._exit(0)  # killed: no checkpoint, the -wal stays\n"
    )
    subprocess.run([sys.executable, "-c", killed_job, str(db_path)], check=True, timeout=60)
    assert Path(f"{db_path}-wal").stat().st_size > 0

    commands = _going_back_commands()
    assert commands and any(c.startswith("cp ") for c in commands)
    for command in commands:  # the guide's backup name stands for the one this upgrade kept
        command = re.sub(r"judgements\.db\.bak-\S+", upgraded.backup.name, command)
        subprocess.run(["bash", "-c", command], cwd=db_path.parent, check=True, timeout=60)

    with Store(Settings(), root=store_root) as store:  # the older library: this checkout's shipped head
        database = store.database("judgements", "t", descriptor)
        assert sorted(r.completion for r in database.query()) == before
        assert database.damage() is None
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("SELECT version_num FROM judgestore_alembic_version").fetchone() == (SHIPPED_HEAD,)
        assert "extra" not in {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
