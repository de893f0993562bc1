"""The models and the migration scripts describe the same schema, and the scripts form one line.

The committed dump ``tests/store/schema_dump.sql`` is what ``upgrade head`` builds
on an empty database; regenerate it after adding a revision with::

    .venv/bin/python -m tests.store.test_migrations --write-schema-dump
"""

from __future__ import annotations

import ast
import os
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from store import schema
from store.backends.sqlite.rows import SqliteRepository
from store.backends.sqlite.upgrade import upgrade_database
from store.descriptor import input_hash, render_messages
from store.reports import UpgradeOutcome
from store.schema import (
    MIGRATION_OPTIONS,
    VERSION_TABLE,
    create_at_head,
    migrate,
    migrations_dir,
    read_script_directory,
)
from store.settings import Settings
from store.tables.models import SCHEMA_REVISION, Base, Completion, Judgement
from store.tables.records import JudgementRecord
from tests.factories import SHIPPED_HEAD, SYNTHETIC_HEAD, SYNTHETIC_REVISIONS, completion_record, put_at_old_revision

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DUMP = Path(__file__).with_name("schema_dump.sql")
REGENERATE = "`.venv/bin/python -m tests.store.test_migrations --write-schema-dump`"


def normalised_schema(db_path: Path, *, include_version_table: bool = True) -> str:
    """sqlite_master as comparable text: whitespace collapsed, table constraints sorted, objects sorted."""
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    conn.close()
    statements = []
    for kind, name, sql in sorted(rows):
        if not include_version_table and name == VERSION_TABLE:
            continue
        sql = " ".join(sql.split())
        if kind == "table":
            head, body = sql.split("(", 1)
            parts = [p.strip() for p in re.split(r",(?![^(]*\))", body.rstrip(")"))]
            columns = [p for p in parts if not p.startswith("CONSTRAINT")]
            constraints = sorted(p for p in parts if p.startswith("CONSTRAINT"))
            sql = head + "(\n  " + ",\n  ".join(columns + constraints) + "\n)"
        statements.append(sql + ";")
    return "\n".join(statements) + "\n"


def upgraded_to_head(db_path: Path) -> Path:
    """A database built by running every script (``upgrade head``)."""
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.begin() as conn:
        migrate(conn)
    engine.dispose()
    return db_path


def created_at_head(db_path: Path) -> Path:
    """A database as the store creates one (:func:`store.schema.create_at_head`)."""
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.begin() as conn:
        create_at_head(conn)
    engine.dispose()
    return db_path


def version_rows(db_path: Path) -> list[tuple[str, ...]]:
    with closing(sqlite3.connect(db_path)) as conn:
        return conn.execute(f"SELECT * FROM {VERSION_TABLE}").fetchall()  # type: ignore[no-any-return]


def test_the_scripts_have_exactly_one_head() -> None:
    script = read_script_directory()
    assert len(script.get_heads()) == 1
    assert [s.revision for s in script.walk_revisions()][-1] == "0001"  # the line starts at 0001


def test_a_migrations_package_in_the_working_folder_never_stands_in_for_the_shipped_scripts(tmp_path: Path) -> None:
    """A project's own ``migrations`` package, first on the path under ``python -c``: its revision was run into new
    databases and every real one was called "ahead" (was)."""
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "migrations" / "__init__.py").write_text("")
    (versions / "a1b2_users.py").write_text('revision = "a1b2"\ndown_revision = None\n')
    code = "from store.schema import read_script_directory; print(read_script_directory().get_current_head())"
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == SHIPPED_HEAD


def test_every_revision_documents_itself() -> None:
    """Each revision says what changes, why, data impact, expected cost (docs/schema-evolution.md); forward-only."""
    for path in sorted((migrations_dir() / "versions").glob("[0-9]*.py")):
        module = ast.parse(path.read_text())
        doc = ast.get_docstring(module) or ""
        for heading in ("What changes", "Why", "Data impact", "Expected cost"):
            assert heading in doc, f"{path.name}: docstring lacks {heading!r}"


def test_upgrade_from_empty_builds_the_same_schema_as_create_all(tmp_path: Path) -> None:
    migrated = upgraded_to_head(tmp_path / "migrated.db")
    created = tmp_path / "created.db"
    engine = create_engine(f"sqlite:///{created}")
    Base.metadata.create_all(engine)
    engine.dispose()
    assert normalised_schema(migrated, include_version_table=False) == normalised_schema(created)
    # and the same through the inspector: columns in order, types, nullability, indexes, constraint names
    engines = [create_engine(f"sqlite:///{p}") for p in (migrated, created)]
    described = []
    for engine in engines:
        insp = inspect(engine)
        described.append(
            {
                table: (
                    [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(table)],
                    sorted((i["name"], tuple(i["column_names"]), i["unique"]) for i in insp.get_indexes(table)),
                    sorted((c["name"], c["sqltext"]) for c in insp.get_check_constraints(table)),
                    insp.get_pk_constraint(table),
                )
                for table in ("completions", "judgements")
            }
        )
        engine.dispose()
    assert described[0] == described[1]


def test_the_models_declare_the_scripts_head() -> None:
    assert SCHEMA_REVISION == schema.revisions().head == SHIPPED_HEAD


def test_a_new_database_is_what_the_scripts_build_without_running_them(tmp_path: Path) -> None:
    created = created_at_head(tmp_path / "created.db")
    migrated = upgraded_to_head(tmp_path / "migrated.db")
    # The whole schema, the version table's definition included, and the one version row.
    assert normalised_schema(created) == normalised_schema(migrated)
    assert version_rows(created) == version_rows(migrated) == [(SHIPPED_HEAD,)]
    code = (  # built from the models: Alembic is never imported
        "import sys, tempfile; from sqlalchemy import create_engine; from store import schema\n"
        "with create_engine(f'sqlite:///{tempfile.mkdtemp()}/x.db').begin() as conn: schema.create_at_head(conn)\n"
        "print('alembic' in sys.modules)"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"


def test_new_databases_share_one_compiled_schema(tmp_path: Path) -> None:
    """The models' DDL is compiled once per dialect, not once per new database (the store's files share one)."""
    from store.backends.sqlite.connections import sqlite_dialect

    dialect = sqlite_dialect()
    first = schema._head_statements(dialect)
    before = schema._head_statements.cache_info()
    for name in ("a.db", "b.db"):
        engine = create_engine(f"sqlite:///{tmp_path / name}")
        engine.dialect = dialect  # as every file of a store (store.backends.sqlite.connections.sqlite_engine)
        with engine.begin() as conn:
            create_at_head(conn)
        engine.dispose()
    assert schema._head_statements.cache_info().misses == before.misses
    assert schema._head_statements(dialect) is first
    assert normalised_schema(tmp_path / "a.db") == normalised_schema(tmp_path / "b.db")
    assert version_rows(tmp_path / "b.db") == [(SHIPPED_HEAD,)]


def test_against_other_scripts_a_new_database_is_built_by_them(
    tmp_path: Path, synthetic_head: str, synthetic: Any
) -> None:
    created = created_at_head(tmp_path / "created.db")
    by_scripts = tmp_path / "by-scripts.db"
    engine = create_engine(f"sqlite:///{by_scripts}")
    with engine.begin() as conn:
        migrate(conn, script=synthetic)
    engine.dispose()
    assert version_rows(created) == [(synthetic_head,)] and synthetic_head != SCHEMA_REVISION
    assert normalised_schema(created) == normalised_schema(by_scripts)


def test_upgrade_from_empty_matches_the_committed_schema_dump(tmp_path: Path) -> None:
    actual = normalised_schema(upgraded_to_head(tmp_path / "migrated.db"))
    assert SCHEMA_DUMP.exists(), f"{SCHEMA_DUMP} is missing; create it with {REGENERATE}"
    assert actual == SCHEMA_DUMP.read_text(), (
        f"`upgrade head` no longer builds the schema in {SCHEMA_DUMP.name}. If the change is intended "
        f"(a new revision), regenerate the dump with {REGENERATE} and commit it."
    )


def test_models_match_the_design() -> None:
    completions, judgements = Completion.__table__, Judgement.__table__
    assert [c.name for c in completions.primary_key] == ["input_hash"]
    assert judgements.c.model_b.nullable and judgements.c.orientation.nullable
    assert not completions.c.input_text.nullable and not completions.c.created_at.nullable
    assert {"model_a", "model_b", "judge", "orientation"} <= set(judgements.c.keys())
    # small metadata columns are stored before the large text columns
    names = [c.name for c in judgements.columns]
    assert names.index("judge") < names.index("input_text") < names.index("completion")
    for table in (completions, judgements):
        for item in [*table.constraints, *table.indexes]:
            assert item.name, f"{table.name}: unnamed {item!r}"


def test_autogenerate_finds_no_difference_with_nothing_filtered(tmp_path: Path) -> None:
    assert not {"include_object", "include_name", "include_schemas"} & set(MIGRATION_OPTIONS)
    engine = create_engine(f"sqlite:///{upgraded_to_head(tmp_path / 'head.db')}")
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts=MIGRATION_OPTIONS)
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_autogenerate_does_see_a_difference_when_there_is_one(tmp_path: Path) -> None:
    """The comparison above is not vacuous: a revision the models lack shows up."""
    from store.schema import migrate

    engine = create_engine(f"sqlite:///{tmp_path / 'ahead.db'}")
    with engine.begin() as conn:
        migrate(conn, script=read_script_directory(SYNTHETIC_REVISIONS))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts=MIGRATION_OPTIONS), Base.metadata)
    engine.dispose()
    assert [(d[0], d[3].name) for d in diff] == [("remove_column", "reviewer_note")]


def test_alembic_check_command_passes(tmp_path: Path) -> None:
    """What CI runs: the developers' `alembic check` from the repository root."""
    db = upgraded_to_head(tmp_path / "dev.db")
    env = {**os.environ, "JUDGESTORE_ALEMBIC_DB": str(db)}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout + result.stderr


def test_alembic_in_a_fresh_clone_leaves_no_database_in_it(tmp_path: Path) -> None:
    """Without JUDGESTORE_ALEMBIC_DB the scratch database goes to the temporary folder, never the clone's root."""
    env = {k: v for k, v in os.environ.items() if k != "JUDGESTORE_ALEMBIC_DB"} | {"TMPDIR": str(tmp_path)}
    for command in (["upgrade", "head"], ["check"]):
        result = subprocess.run([sys.executable, "-m", "alembic", *command], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "judgestore-dev.db").is_file()
    assert not (REPO_ROOT / "judgestore-dev.db").exists()


def test_the_revisions_read_as_text_are_those_alembic_reads_without_importing_alembic() -> None:
    assert schema.revisions() == schema.revisions_of(read_script_directory())
    code = "import sys; from store import schema; schema.revisions(); print('alembic' in sys.modules)"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"


def test_a_script_whose_identity_is_not_plain_text_is_read_by_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrations = tmp_path / "migrations"
    (migrations / "versions").mkdir(parents=True)
    for script in (schema.migrations_dir() / "versions").glob("*.py"):
        text = script.read_text().replace('down_revision: str | None = "0001"', 'down_revision = ("0001",)')
        (migrations / "versions" / script.name).write_text(text)
    (migrations / "script.py.mako").write_text((schema.migrations_dir() / "script.py.mako").read_text())
    monkeypatch.setattr(schema, "migrations_dir", lambda: migrations)
    read_by_alembic = []
    monkeypatch.setattr(schema, "revisions_of", lambda script: read_by_alembic.append(script) or "alembic's")
    schema.revisions.cache_clear()
    schema.script_directory.cache_clear()
    try:
        assert schema.revisions() == "alembic's" and len(read_by_alembic) == 1
    finally:
        schema.revisions.cache_clear()
        schema.script_directory.cache_clear()


def test_synthetic_revisions_build_on_the_shipped_ones() -> None:
    script = read_script_directory(SYNTHETIC_REVISIONS)
    assert script.get_heads() == [SYNTHETIC_HEAD]
    assert script.get_revision(SYNTHETIC_HEAD).down_revision == read_script_directory().get_current_head()


def _write_schema_dump() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        SCHEMA_DUMP.write_text(normalised_schema(upgraded_to_head(Path(tmp) / "head.db")))
    print(f"wrote {SCHEMA_DUMP}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-schema-dump"]:
        raise SystemExit(f"usage: {REGENERATE.strip('`')}")
    _write_schema_dump()


# judgestore 0.1.0's default judge prompt: its reversed rows carried the pair's identity in model_a/model_b.
V0_1_PAIRWISE_SYSTEM = (
    "You are an impartial judge. Compare the two answers to the user's question. "
    "Reply with [[A]] if Assistant A's answer is better, [[B]] if Assistant B's answer is better."
)


def _judgement(system: str, orientation: str | None, model_a: str, model_b: str | None, n: int = 0) -> JudgementRecord:
    text = render_messages([{"role": "system", "content": system}, {"role": "user", "content": f"q{n} {orientation}"}])
    return JudgementRecord(
        input_hash=input_hash(text), sample_index=0, input_text=text, completion="[[A]]", model_a=model_a,
        model_b=model_b, judge="j", orientation=orientation, created_at=datetime(2026, 1, 1, tzinfo=UTC),  # type: ignore[arg-type]
    )  # fmt: skip


def test_0002_makes_the_slots_of_0_1_default_prompt_rows_positional_and_leaves_the_rest(tmp_path: Path) -> None:
    db_path = tmp_path / "judgements.db"
    engine = create_engine(f"sqlite:///{db_path}")
    native_reversed = _judgement(V0_1_PAIRWISE_SYSTEM, "reversed", "x", "y", 1)  # identity: X first in the pair
    native_direct = _judgement(V0_1_PAIRWISE_SYSTEM, "direct", "x", "y", 2)
    imported_reversed = _judgement("A legacy JudgeArena prompt", "reversed", "y", "x", 3)  # already positional
    pointwise = _judgement(V0_1_PAIRWISE_SYSTEM, None, "x", None, 4)
    with engine.begin() as conn:
        migrate(conn, "0001")
        put_at_old_revision(conn, "judgements", [native_reversed, native_direct, imported_reversed, pointwise])
    engine.dispose()

    result = upgrade_database(db_path, Settings())
    assert (result.outcome, result.from_revision) == (UpgradeOutcome.UPGRADED, "0001")
    assert result.rows == {"completions": 0, "judgements": 4}
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        slots = {
            row.input_hash: (row.model_a, row.model_b, row.orientation)
            for row in SqliteRepository(conn, "judgements").query()
        }
    engine.dispose()
    assert slots == {
        native_reversed.input_hash: ("y", "x", "reversed"),  # now: Y's answer is the one shown first
        native_direct.input_hash: ("x", "y", "direct"),
        imported_reversed.input_hash: ("y", "x", "reversed"),
        pointwise.input_hash: ("x", None, None),
    }


def test_0004_adds_adoptions_and_leaves_every_stored_row_not_adopted(tmp_path: Path) -> None:
    db_path = tmp_path / "completions.db"
    engine = create_engine(f"sqlite:///{db_path}")
    rows = [completion_record(i) for i in range(3)]
    with engine.begin() as conn:
        migrate(conn, "0003")
        put_at_old_revision(conn, "completions", rows)
    engine.dispose()
    result = upgrade_database(db_path, Settings())
    assert (result.outcome, result.from_revision, result.to_revision) == (UpgradeOutcome.UPGRADED, "0003", SHIPPED_HEAD)
    engine = create_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        stored = sorted(SqliteRepository(conn, "completions").query(), key=lambda r: r.input_hash)
        assert stored == sorted(rows, key=lambda r: r.input_hash)  # adopted_from NULL: none adopted
        assert "adoptions" in inspect(conn).get_table_names()
    engine.dispose()


def test_the_private_alembic_api_migrate_uses_still_gives_the_steps_in_order() -> None:
    """store.schema.migrate takes its steps from ScriptDirectory._upgrade_revs, as `alembic upgrade` does.

    It is private API: if an Alembic release changes it, this test says so before any database is migrated.
    """
    script = read_script_directory()
    line = [(s.revision,) for s in reversed(list(script.walk_revisions()))]  # 0001 first
    steps = script._upgrade_revs("heads", ())
    assert [step.to_revisions for step in steps] == line and all(step.is_upgrade for step in steps)
    assert [step.to_revisions for step in script._upgrade_revs("heads", "0001")] == line[1:]
    assert script._upgrade_revs("heads", script.get_current_head()) == []
