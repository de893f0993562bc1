"""The store on a PostgreSQL server: the same rows, migrations and errors as a folder, one schema per descriptor."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from store import jsonvalues, logprobs
from store.backends.postgres import generations
from store.backends.postgres.connections import display_url, parse_store_url
from store.backends.postgres.registry import registry, schema_name
from store.backends.postgres.storage import PostgresStorage
from store.backends.postgres.text import ESCAPE
from store.cli.app import build_app
from store.descriptor import ModelDescriptor, input_hash
from store.errors import (
    ForeignDatabaseError,
    ForeignSchemaError,
    InvalidInputError,
    SchemaAheadError,
    SchemaBehindError,
    SchemaError,
    ServerAuthError,
    ServerPermissionError,
    ServerSchemaError,
    ServerUnavailableError,
    ServerURLError,
)
from store.layout import Location, metadata_bytes
from store.logprobs import PositionLogprobs, TokenLogprob
from store.reports import ProblemKind, UpgradeOutcome
from store.runs import record_run, run_totals
from store.schema import DatabaseState, migrate
from store.settings import Settings
from store.stats import database_stats
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import SHIPPED_HEAD, SYNTHETIC_HEAD, completion_record, judgement_record
from tests.pg_server import Cluster
from tests.store.schema_helpers import pretend_shipped_scripts_are
from tests.store.test_runs import run
from tests.store.test_upgrade import FAILURES, failing_script

pytestmark = pytest.mark.postgres

QWEN = ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0})


def test_a_server_store_keeps_rows_exactly_as_a_folder_does(pg_url: str) -> None:
    top = logprobs.encode([PositionLogprobs((TokenLogprob("A", -0.5, 1, 1), TokenLogprob("B", -math.inf, 2, 2)))])
    rows = [judgement_record(i, top_logprobs=top, usage={"x": -math.inf}) for i in range(20)]
    with Store(url=pg_url) as store:
        database = store.database("judgements", "arena", QWEN)
        assert database.put_many(rows) == 20 and database.put_many(rows) == 0
        assert database.count() == 20 and database.count(RowFilter(orientation="direct")) == 20
    with Store(url=pg_url, readonly=True) as again:
        found = again.find("judgements", "arena", QWEN)
        assert found is not None
        got = found.get_many([r.input_hash for r in rows] + ["0" * 64])
        assert got == {r.input_hash: r for r in rows}
        assert [r.input_hash for r in found.query()] == [
            r.input_hash for r in sorted(rows, key=lambda r: (r.created_at, r.input_hash))
        ]
        assert again.locations() == [Location.of("judgements", "arena", QWEN)]
        assert found.metadata().descriptor == QWEN
        assert again.find("completions", "arena", QWEN) is None


def test_a_server_store_lists_its_databases_in_the_folder_stores_order(pg_url: str, tmp_path: Path) -> None:
    """query --limit, export and ls take the databases in this order: the same on both backends, whatever the
    server's collation (was: the server's ORDER BY, "A task" first where the folder store has "é-task")."""
    tasks = ["b-task", "B-task", "a_task", "a-task", "A task", "é-task", "z", "%"]
    descriptor = ModelDescriptor(provider="vllm", model="org/m")
    orders = []
    for where in ({"root": tmp_path / "folder"}, {"url": pg_url}):
        with Store(Settings(), **where) as store:  # type: ignore[arg-type]
            for task in tasks:
                store.database("judgements", task, descriptor).put_many([])
                store.database("completions", task, descriptor).put_many([])
            orders.append([(location.role, location.task) for location in store.locations()])
    folder, server = orders
    assert server == folder and len(folder) == 2 * len(tasks)
    assert folder[0][0] == "completions" and folder[-1][0] == "judgements"


def test_writes_on_a_server_count_what_they_wrote_and_refuse_malformed_rows_whole(pg_url: str) -> None:
    with Store(url=pg_url) as store:
        completions = store.database("completions", "t", QWEN)
        judgements = store.database("judgements", "t", QWEN)
        assert completions.put_many([completion_record(i) for i in range(10)] + [completion_record(3)]) == 10
        changed = [completion_record(i, completion="changed") for i in range(15)]
        assert completions.put_many(changed) == 5  # ignore: the 10 stored rows are kept
        assert completions.get_many([changed[0].input_hash])[changed[0].input_hash].completion == "answer 0"
        assert completions.put_many(changed, on_conflict="replace") == 15
        assert completions.get_many(r.input_hash for r in changed) == {r.input_hash: r for r in changed}
        for bad in (
            completion_record(1, created_at=datetime(2026, 1, 1)),  # naive
            completion_record(1, model="m\ud800"),  # a lone surrogate
            completion_record(1, input_hash=completion_record(2).input_hash),  # not the hash of its input
        ):
            with pytest.raises(InvalidInputError):
                completions.put_many([completion_record(100), bad])
        with pytest.raises(InvalidInputError, match="orientation"):
            judgements.put_many([judgement_record(1), judgement_record(2, orientation="sideways")])
        assert completions.count() == 15 and judgements.count() == 0


def test_schema_names_are_short_safe_and_the_registry_keeps_the_whole_name(pg_url: str, pg_cluster: Cluster) -> None:
    hostile = ModelDescriptor(provider="vllm", model='x"; DROP SCHEMA public CASCADE; --' + "é" * 80)
    location = Location.of("completions", "t", hostile)
    assert re.fullmatch(r"js_c_[0-9a-f]{32}", schema_name(location))
    with Store(url=pg_url) as store:
        store.database("completions", "t", hostile).put_many([completion_record(1)])
        assert store.locations() == [location]
        with store.storage.connection() as conn:
            row = conn.execute(registry.select()).one()
    assert row.model == hostile.model and row.descriptor_hash16 == hostile.hash16()
    assert row.metadata_json.encode() == metadata_bytes("completions", "t", hostile)
    database = make_url(pg_url).database
    assert pg_cluster.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'public'", database) == [(1,)]


def test_connection_parameters_in_the_url_or_pgappname_win_over_judgestores_defaults(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cluster's job scripts tell jobs apart in pg_stat_activity by their application name (the test URL has a query)
    def seen(url: str) -> tuple[str, str]:
        with Store(Settings(connect_timeout_s=7), url=url) as store, store.storage.engine.connect() as conn:
            name = conn.execute(text("SELECT current_setting('application_name')")).scalar_one()
            timeout = conn.connection.dbapi_connection.info.get_parameters().get("connect_timeout")  # libpq's
            return str(name), str(timeout)

    monkeypatch.delenv("PGAPPNAME", raising=False)
    assert seen(pg_url) == ("judgestore", "7")
    assert seen(f"{pg_url}&application_name=job-17&connect_timeout=3") == ("job-17", "3")
    monkeypatch.setenv("PGAPPNAME", "job-18")
    assert seen(pg_url) == ("job-18", "7")


def test_a_read_transaction_on_a_server_is_one_snapshot_as_on_a_folder(pg_url: str) -> None:
    """Under READ COMMITTED each statement of a read took its own snapshot: one `stats` counted 20,400 rows and
    21,400 finish reasons while a writer worked (was)."""
    with Store(Settings(), url=pg_url) as store, Store(Settings(), url=pg_url) as writer:
        database = store.database("completions", "t", QWEN)
        database.put_many([completion_record(i) for i in range(3)])
        with database.reading() as repo:
            before = repo.count()
            writer.database("completions", "t", QWEN).put_many([completion_record(i) for i in range(3, 8)])
            assert (before, repo.count(), sum(g.rows for g in repo.groups("finish_reason"))) == (3, 3, 3)
        assert database.count() == 8  # a new read sees the writer's rows


def test_opening_reads_the_revision_with_one_select(pg_url: str) -> None:
    with Store(url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
    with Store(url=pg_url) as store:
        statements: list[str] = []
        event.listen(store.storage.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        store.open(Location.of("completions", "t", QWEN))
    assert sum("judgestore_alembic_version" in s for s in statements) == 1


def test_a_schema_created_while_it_is_classified_is_current_not_foreign(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each statement reads what was committed when it began: a job creating the schema between the version
    # query and the table listing must not make it look foreign.
    import store.backends.postgres.status as status

    location = Location.of("completions", "t", QWEN)
    real_inspect = status.inspect

    def created_meanwhile(conn: Any) -> Any:
        monkeypatch.setattr(status, "inspect", real_inspect)
        with Store(url=pg_url) as creator:
            creator.database("completions", "t", QWEN)
        return real_inspect(conn)

    with Store(url=pg_url) as store:
        assert isinstance(store.storage, PostgresStorage)
        monkeypatch.setattr(status, "inspect", created_meanwhile)
        with store.storage.connection() as conn:
            found = status.classify(conn, location)
    assert (found.state, found.revision) == (DatabaseState.CURRENT, SHIPPED_HEAD)


def _schema_shape(pg_cluster: Cluster, database: str, schema: str) -> list[tuple[object, ...]]:
    """A schema's columns, indexes, constraints, triggers and version rows, its own name written as S."""
    queries = [
        "SELECT table_name, column_name, data_type, is_nullable, column_default, ordinal_position "
        "FROM information_schema.columns WHERE table_schema = '{s}'",
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = '{s}'",
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE connamespace = '\"{s}\"'::regnamespace",
        "SELECT event_object_table, trigger_name, action_statement FROM information_schema.triggers "
        "WHERE trigger_schema = '{s}'",
        'SELECT version_num FROM "{s}".judgestore_alembic_version',
    ]
    rows = [row for query in queries for row in pg_cluster.sql(query.format(s=schema), database)]
    return sorted(tuple(str(v).replace(schema, "S") for v in row) for row in rows)


def test_a_new_schema_is_what_the_scripts_build_without_importing_alembic(pg_url: str, pg_cluster: Cluster) -> None:
    code = (  # a new schema is built from the models: Alembic is never imported
        "import sys; from store import Store, ModelDescriptor\n"
        f"with Store(url={pg_url!r}) as s: s.database('completions', 't', ModelDescriptor(provider='p', model='m'))\n"
        "print('alembic' in sys.modules)"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"
    created = schema_name(Location.of("completions", "t", ModelDescriptor(provider="p", model="m")))
    engine = create_engine(pg_url)
    with engine.begin() as conn:  # the same schema built by running every script
        conn.execute(text('CREATE SCHEMA "migrated"; SET LOCAL search_path TO "migrated"'))
        migrate(conn.execution_options(schema_translate_map={None: "migrated"}))
        generations.install(conn, "migrated")
    engine.dispose()
    database = make_url(pg_url).database
    assert database is not None
    shape = _schema_shape(pg_cluster, database, created)
    assert shape == _schema_shape(pg_cluster, database, "migrated")
    assert any("WHERE (adopted_from IS NOT NULL)" in str(row) for row in shape)  # the partial indexes kept theirs
    assert (SHIPPED_HEAD,) in shape


def test_a_schema_that_is_not_ours_is_refused_untouched(pg_url: str, pg_cluster: Cluster) -> None:
    database = make_url(pg_url).database
    name = schema_name(Location.of("completions", "t", QWEN))
    pg_cluster.sql(
        f'CREATE SCHEMA "{name}"; CREATE TABLE "{name}".theirs (x int); INSERT INTO "{name}".theirs VALUES (7)',
        database,
    )
    with Store(url=pg_url) as store, pytest.raises(ForeignSchemaError, match="not touched"):
        store.database("completions", "t", QWEN)
    assert pg_cluster.sql(f'SELECT x FROM "{name}".theirs', database) == [(7,)]


@pytest.mark.parametrize(
    ("revision", "error", "said", "state"),
    [
        ("f00d", SchemaAheadError, "f00d", DatabaseState.AHEAD),
        # emptied: it read as a newer judgestore's revision, "Upgrade the library" (was), as on SQLite
        ("", ForeignDatabaseError, "does not hold exactly one revision", DatabaseState.FOREIGN),
    ],
)
def test_a_revision_this_library_does_not_know_is_refused_untouched(
    pg_url: str, pg_cluster: Cluster, revision: str, error: type[Exception], said: str, state: DatabaseState
) -> None:
    with Store(url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
    database = make_url(pg_url).database
    name = schema_name(Location.of("completions", "t", QWEN))
    pg_cluster.sql(f"UPDATE \"{name}\".judgestore_alembic_version SET version_num = '{revision}'", database)
    with Store(url=pg_url) as store:
        with pytest.raises(error, match=said) as caught:
            store.open(Location.of("completions", "t", QWEN))
        assert "file" not in str(caught.value)  # a schema (was: file)
        if revision:
            assert "the schema was not touched" in str(caught.value)
        (info,) = store.infos(store.locations())
        assert info.state is state
    assert pg_cluster.sql(f'SELECT version_num FROM "{name}".judgestore_alembic_version', database) == [(revision,)]


@pytest.mark.parametrize("kind", ["bad-scheme", "down", "password", "no-password", "no-database", "no-connect"])
def test_a_server_that_cannot_be_used_is_a_typed_error(
    kind: str, pg_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Was, without a password or for a database that does not exist: "cannot reach the server".)"""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    if kind in ("password", "no-password", "no-connect"):
        pg_cluster.sql(
            "DO $$ BEGIN CREATE ROLE judge LOGIN PASSWORD 'right'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    closed = pg_cluster.new_database()
    pg_cluster.sql(f'REVOKE CONNECT ON DATABASE "{closed}" FROM PUBLIC')
    url, error = {
        "bad-scheme": ("mysql://user@host/db", InvalidInputError),
        "down": (f"postgresql+psycopg://postgres@/x?host={tmp_path}", ServerUnavailableError),
        "password": (pg_cluster.url("postgres", "judge", "wrong"), ServerAuthError),
        "no-password": (pg_cluster.url("postgres", "judge"), ServerAuthError),
        "no-database": (pg_cluster.url("no_such_database"), ServerURLError),
        # it was "is it running?", asked again 9 times
        "no-connect": (pg_cluster.url(closed, "judge", "right"), ServerPermissionError),
    }[kind]
    with pytest.raises(error) as caught, Store(url=url) as store:
        store.locations()
    assert type(caught.value) is error and "wrong" not in str(caught.value)  # a password is never shown
    # A server that answered is not asked again (was, for a database it has not: 9 times, "try again later").
    assert kind == "down" or not getattr(caught.value, "__notes__", None), caught.value.__notes__
    assert "cannot reach" not in str(caught.value) or kind == "down"
    if kind in ("no-password", "no-database", "no-connect"):
        said = {"no-password": "none was given", "no-database": "createdb", "no-connect": "GRANT CONNECT"}[kind]
        assert said in str(caught.value)
    if kind == "no-password":  # never in the URL of a job script, as the README says (it advised the URL: was)
        assert "put it in ~/.pgpass or PGPASSWORD" in str(caught.value) and "in the URL" not in str(caught.value)


def test_a_user_who_may_not_create_schemas_gets_a_typed_error_and_nothing_changes(
    pg_url: str, pg_cluster: Cluster
) -> None:
    database = make_url(pg_url).database
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE reader LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql(f'REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC')
    with (
        Store(url=pg_cluster.url(database, "reader", "pw")) as store,
        pytest.raises(ServerPermissionError, match="CREATE"),
    ):
        store.database("completions", "t", QWEN)
    assert pg_cluster.sql("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'js_%'", database) == [(0,)]
    # Asked before anything is generated (was: found when the first rows were written, after the engine ran)
    with (
        Store(url=pg_cluster.url(database, "reader", "pw")) as store,
        pytest.raises(ServerPermissionError, match="lacks CREATE on the database"),
    ):
        store.check_writable("completions", "t", QWEN)
    with Store(url=pg_url) as owner:
        location = owner.database("completions", "t", QWEN).location
    name = schema_name(location)
    pg_cluster.sql(f'GRANT CREATE ON DATABASE "{database}" TO reader', database)
    pg_cluster.sql(f'GRANT USAGE ON SCHEMA "{name}", judgestore TO reader', database)
    pg_cluster.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{name}", judgestore TO reader', database)
    lacks = f"lacks INSERT on {name}.completions and INSERT on {name}.runs"
    with Store(url=pg_cluster.url(database, "reader", "pw")) as store:
        with pytest.raises(ServerPermissionError, match=lacks):
            store.check_writable("completions", "t", QWEN)
        store.check_writable("judgements", "t", QWEN)  # no schema yet: CREATE is what it needs
    with Store(url=pg_url) as owner:
        owner.check_writable("completions", "t", QWEN)  # the owner may write


def test_an_upgrade_the_user_may_not_make_says_so_by_name_and_changes_nothing(pg_url: str, pg_cluster: Cluster) -> None:
    database = make_url(pg_url).database
    with Store(url=pg_url) as server:
        location = server.database("completions", "t", QWEN).location
    name = schema_name(location)
    pg_cluster.sql(f"UPDATE \"{name}\".judgestore_alembic_version SET version_num = '0005'", database)
    pg_cluster.sql(f'DROP TABLE "{name}".claims', database)  # what revision 0006 adds
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE looker LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql(f'GRANT USAGE ON SCHEMA "{name}", judgestore TO looker', database)
    pg_cluster.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{name}", judgestore TO looker', database)
    with Store(url=pg_cluster.url(database, "looker", "pw")) as store:
        (result,) = store.upgrade([location])
    assert result.outcome is UpgradeOutcome.FAILED and result.error is not None
    assert result.error.startswith("ServerPermissionError: ") and "[SQL:" not in result.error
    assert pg_cluster.sql(f'SELECT version_num FROM "{name}".judgestore_alembic_version', database) == [("0005",)]


def test_a_run_of_more_tokens_than_an_integer_holds_is_recorded_and_an_older_schema_is_widened(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """A call of a million prompts of 2,200 tokens spent more than PostgreSQL's integer holds: its run was refused
    after its rows were stored, and every all-hit rerun was refused again on its saved tokens (was)."""
    database = make_url(pg_url).database
    assert database is not None
    big = 2**31 + 7
    with Store(url=pg_url) as store:
        fresh = store.database("completions", "t", QWEN)
        record_run(fresh, run(1, prompt_tokens=big, saved_prompt_tokens=2 * big, requested=big))
        assert (run_totals(fresh).prompt_tokens, run_totals(fresh).saved_prompt_tokens) == (big, 2 * big)
        older = store.database("completions", "t", ModelDescriptor(provider="vllm", model="older"))
        older.put_many([completion_record(1)])
        record_run(older, run(1))
    old = schema_name(older.location)  # as revision 0006 built it: integer counts
    widened = ("runs", "prompt_tokens"), ("runs", "hits_without_cost"), ("adoptions", "sample_seed")
    for table, column in widened:
        pg_cluster.sql(f'ALTER TABLE "{old}".{table} ALTER COLUMN {column} TYPE integer', database)
    pg_cluster.sql(f"UPDATE \"{old}\".judgestore_alembic_version SET version_num = '0006'", database)
    with Store(url=pg_url) as store:
        (result,) = store.upgrade([older.location])
        assert (result.outcome, result.from_revision) == (UpgradeOutcome.UPGRADED, "0006"), result.error
        record_run(store.open(older.location), run(2, prompt_tokens=big))
        assert run_totals(store.open(older.location)).prompt_tokens == big + run(1).prompt_tokens
        assert store.open(older.location).count() == 1  # the rows as they were
    types = pg_cluster.sql(
        f"SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = '{old}' "
        "AND table_name IN ('runs', 'adoptions') AND data_type = 'integer'",
        database,
    )
    assert sorted(types) == [("adoptions", "id", "integer"), ("runs", "id", "integer")]  # only the row ids


def test_an_upgrade_of_a_schema_another_login_owns_is_refused_by_its_dry_run_and_its_failure_says_why(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """A colleague granted every right on a schema but not its ownership: the dry run said "would upgrade", and the
    upgrade then failed on "must be owner of table" with advice to grant what the colleague had (was)."""
    database = make_url(pg_url).database
    assert database is not None
    with Store(url=pg_url) as owner:
        location = owner.database("completions", "t", QWEN).location
        owner.open(location).put_many([completion_record(1)])
    name = schema_name(location)
    pg_cluster.sql(f"UPDATE \"{name}\".judgestore_alembic_version SET version_num = '0006'", database)
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE mate LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql(f'GRANT CREATE ON DATABASE "{database}" TO mate', database)
    pg_cluster.sql(f'GRANT USAGE, CREATE ON SCHEMA "{name}", judgestore TO mate', database)
    pg_cluster.sql(f'GRANT ALL ON ALL TABLES IN SCHEMA "{name}", judgestore TO mate', database)
    with Store(url=pg_cluster.url(database, "mate", "pw")) as mate:
        (planned,) = mate.upgrade([location], dry_run=True)
        assert planned.outcome is UpgradeOutcome.REFUSED and planned.error is not None
        assert "lacks ownership of its tables" in planned.error and "runs" in planned.error
        (tried,) = mate.upgrade([location])
    assert tried.outcome is UpgradeOutcome.FAILED and tried.error is not None
    assert "must be owner of" in tried.error and "takes its owner" in tried.error and "GRANT CREATE" not in tried.error
    assert pg_cluster.sql(f'SELECT version_num FROM "{name}".judgestore_alembic_version', database) == [("0006",)]
    with Store(url=pg_url) as owner:
        (planned,) = owner.upgrade([location], dry_run=True)
        assert planned.outcome is UpgradeOutcome.WOULD_UPGRADE, planned.error
        assert [r.outcome for r in owner.upgrade([location])] == [UpgradeOutcome.UPGRADED]


# ---------------------------------------------------------------- revisions per schema


def test_db_upgrade_upgrades_every_schema_in_its_own_transaction(
    pg_url: str, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    descriptors = [ModelDescriptor(provider="vllm", model=f"m{i}") for i in range(3)]
    with Store(url=pg_url) as store:
        for i, d in enumerate(descriptors):
            store.database("judgements", "t", d).put_many([judgement_record(k) for k in range(i + 2)])
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    with Store(url=pg_url) as store:
        locations = store.locations()
        assert {info.state for info in store.infos(locations)} == {DatabaseState.BEHIND}
        with pytest.raises(SchemaBehindError, match="judgestore db upgrade"):
            store.open(locations[0])
        results = list(store.upgrade(locations))
        assert [(r.outcome, r.from_revision, r.to_revision) for r in results] == [
            (UpgradeOutcome.UPGRADED, SHIPPED_HEAD, SYNTHETIC_HEAD)
        ] * 3
        assert [r.rows["judgements"] for r in results if r.rows] == [2, 3, 4]
        assert {r.outcome for r in store.upgrade(locations)} == {UpgradeOutcome.UP_TO_DATE}  # a second run: nothing
        for location, d in zip(locations, descriptors, strict=True):
            assert store.open(location).count() == int(d.model[1:]) + 2
            with store.storage.connection() as conn:
                columns = {c["name"] for c in inspect(conn).get_columns("judgements", schema=schema_name(location))}
            assert "reviewer_note" in columns  # the synthetic revision's column, in every schema


@pytest.mark.parametrize("failure", ["raises", "the-server-refuses"])
def test_a_failed_migration_leaves_its_schema_as_it_was_and_the_others_go_on(
    failure: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(url=pg_url) as store:
        for name in ("good", "explode"):
            store.database("completions", "t", ModelDescriptor(provider="vllm", model=name)).put_many(
                [completion_record(1, benchmark=name)]  # the failing revision explodes where it finds 'explode'
            )
    script = failing_script(tmp_path, failure)
    pretend_shipped_scripts_are(script, monkeypatch)
    with Store(url=pg_url) as store:
        results = {r.where.rsplit(" ", 1)[-1]: r for r in store.upgrade(store.locations(), script=script)}
        by_model = {loc.model: schema_name(loc) for loc in store.locations()}
        assert results[by_model["explode"]].outcome is UpgradeOutcome.FAILED
        error = str(results[by_model["explode"]].error)
        assert "rolled back" in error and FAILURES[failure][2] in error
        # A statement the schema refuses fails again on a rerun: named there, with no advice to run it again (was).
        assert "again" not in error and (failure == "raises" or by_model["explode"] in error), error
        assert results[by_model["good"]].outcome is UpgradeOutcome.UPGRADED
        bad = next(loc for loc in store.locations() if loc.model == "explode")
        assert store.storage.info(bad).revision == SHIPPED_HEAD  # the failed schema is as it was


def test_two_upgrades_started_at_once_migrate_once(
    pg_url: str, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(url=pg_url) as store:
        store.database("judgements", "t", QWEN).put_many([judgement_record(1)])
    pretend_shipped_scripts_are(synthetic, monkeypatch)
    outcomes: list[UpgradeOutcome] = []

    def upgrade() -> None:
        with Store(url=pg_url) as store:
            outcomes.extend(r.outcome for r in store.upgrade(store.locations()))

    threads = [threading.Thread(target=upgrade) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == sorted([UpgradeOutcome.UPGRADED, UpgradeOutcome.UP_TO_DATE])


@contextmanager
def a_writer_inside_its_transaction(pg_url: str, location: Location) -> Iterator[threading.Event]:
    """The block runs while another session (a job opened on the schema as it is now) holds its write lock, inside
    a write of one row not yet committed; setting the event yielded lets it commit (the block's end does too)."""
    inside, proceed = threading.Event(), threading.Event()

    def write_slowly() -> None:
        with Store(url=pg_url) as store:
            store.open(location)._write(
                lambda repo: (repo.put_many([judgement_record(2)]), inside.set(), proceed.wait(20))[0]
            )

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        assert inside.wait(20)
        yield proceed
    finally:
        proceed.set()
        writer.join()


def test_an_upgrade_waits_for_a_writer_inside_its_transaction_and_counts_its_rows(
    pg_url: str, synthetic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job writing while `db upgrade` ran: rows it committed during the migration changed the counts, and the
    upgrade was refused as if rows were lost, or deadlocked with it (was). The upgrade takes the write lock first."""
    with Store(url=pg_url) as store:
        location = store.database("judgements", "t", QWEN).location
        store.open(location).put_many([judgement_record(1)])
    results: list[Any] = []
    with a_writer_inside_its_transaction(pg_url, location) as commit, Store(url=pg_url) as store:
        pretend_shipped_scripts_are(synthetic, monkeypatch)  # a newer library upgrades while the job writes
        upgrader = threading.Thread(target=lambda: results.extend(store.upgrade([location])))
        upgrader.start()
        upgrader.join(1.0)
        assert upgrader.is_alive()  # waiting for the writer's transaction
        commit.set()
        upgrader.join()
    ((outcome, rows),) = [(r.outcome, r.rows) for r in results]
    assert outcome is UpgradeOutcome.UPGRADED and rows is not None and rows["judgements"] == 2
    with Store(url=pg_url) as store:
        assert store.open(location).count() == 2


def test_an_upgrade_of_a_current_schema_does_not_wait_for_its_writers(pg_url: str) -> None:
    """The first mend took the write lock before looking: a schema with nothing to do waited for a writer's
    transaction, and was refused after the busy timeout (was)."""
    with Store(url=pg_url) as store:
        location = store.database("judgements", "t", QWEN).location
    with (
        a_writer_inside_its_transaction(pg_url, location),
        Store(Settings(busy_timeout_ms=200, lock_retries=0), url=pg_url) as store,
    ):
        (result,) = store.upgrade([location])
    assert result.outcome is UpgradeOutcome.UP_TO_DATE, result.error


def test_an_upgrade_that_puts_back_a_schemas_triggers_waits_for_a_writer_as_long_as_a_write_would(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """A current schema without its generation triggers (made before them) waited for a writer's transaction
    without a bound once the write lock was taken only for a migration (was)."""
    with Store(url=pg_url) as store:
        location = store.database("judgements", "t", QWEN).location
    dropped = f'DROP TRIGGER judgestore_generation ON "{schema_name(location)}".judgements'
    pg_cluster.sql(dropped, make_url(pg_url).database)
    with (
        a_writer_inside_its_transaction(pg_url, location),
        Store(Settings(busy_timeout_ms=200, lock_retries=0), url=pg_url) as store,
    ):
        started = time.monotonic()
        (result,) = store.upgrade([location])
        waited = time.monotonic() - started
    assert result.outcome is UpgradeOutcome.REFUSED and "lock" in str(result.error) and waited < 10
    with Store(url=pg_url) as store:  # once the writer is done, the triggers go back
        (again,) = store.upgrade([location])
        assert again.outcome is UpgradeOutcome.UP_TO_DATE
        with store.storage.connection() as conn:
            assert generations.installed(conn, schema_name(location))


def test_an_upgrade_that_puts_back_triggers_waits_for_a_long_reader_as_long_as_a_write_would(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """With no writer, the triggers' DDL waited for a reader's open transaction without a bound (was)."""
    with Store(url=pg_url) as store:
        location = store.database("judgements", "t", QWEN).location
    name = schema_name(location)
    pg_cluster.sql(f'DROP TRIGGER judgestore_generation ON "{name}".judgements', make_url(pg_url).database)
    with Store(url=pg_url) as reader, reader.storage.connection() as held:
        held.execute(text(f'SELECT count(*) FROM "{name}".adoptions'))  # its lock held until the block ends
        started = time.monotonic()
        with Store(Settings(busy_timeout_ms=200, lock_retries=0), url=pg_url) as store:
            (result,) = store.upgrade([location])
        waited = time.monotonic() - started
    assert result.outcome is UpgradeOutcome.REFUSED and "lock" in str(result.error) and waited < 10


def test_an_upgrade_the_server_rolls_back_for_a_deadlock_runs_again(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadlock with a reader (each holding a table the other asks for) failed the schema's upgrade (was): it is
    rolled back by the server, and runs again as a write does."""
    from tests.store.test_upgrade import _FAILING_REVISION

    marker = tmp_path / "deadlocked-once"
    body = (
        f"    marker = __import__('pathlib').Path({str(marker)!r})\n"
        "    if not marker.exists():\n"
        "        marker.write_text('once')\n"
        "        op.execute(\"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40P01'; END $$\")"
    )
    folder = tmp_path / "deadlocks-once"
    folder.mkdir()
    revision = _FAILING_REVISION.format(how="a deadlock, once", body=body, shipped=SHIPPED_HEAD)
    (folder / "9001_deadlocks.py").write_text(revision)
    from store.schema import read_script_directory

    script = read_script_directory(folder)
    with Store(url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1, benchmark="explode")])
    pretend_shipped_scripts_are(script, monkeypatch)
    with Store(url=pg_url) as store:
        (result,) = store.upgrade(store.locations(), script=script)
    assert marker.read_text() == "once"  # it did deadlock, the first time
    assert (result.outcome, result.to_revision, result.error) == (UpgradeOutcome.UPGRADED, "9001", None)


@pytest.mark.parametrize("prepared", [True, False])
def test_prepared_statements_can_be_turned_off_for_a_transaction_pooler(pg_url: str, prepared: bool) -> None:
    with Store(Settings(prepared_statements=prepared), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(i) for i in range(3)])
        with store.storage.connection() as conn:
            for _ in range(6):  # psycopg prepares a statement from its 5th run on a connection, unless told not to
                conn.exec_driver_sql("SELECT count(*) FROM judgestore.registry").scalar_one()
            prepared_now = conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one()
    assert (prepared_now > 0) is prepared


# ---------------------------------------------------------------- verify on a server


def _server_store(pg_url: str) -> list[Location]:
    """Three schemas: completions of two models (one with 12 rows, two adopted) and judgements."""
    with Store(url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many(
            [completion_record(i, adopted_from="ab" * 32 if i < 2 else None) for i in range(12)]
        )
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="other")).put_many(
            [completion_record(i) for i in range(3)]
        )
        store.database("judgements", "t", QWEN).put_many([judgement_record(i) for i in range(4)])
        return store.locations()


def _verify(pg_url: str) -> dict[str, Any]:
    with Store(url=pg_url, readonly=True) as store:
        return {loc.role + "/" + loc.model: store.verify(loc) for loc in store.locations()}


def test_verify_passes_a_clean_server_store_and_counts_adopted_rows(pg_url: str) -> None:
    _server_store(pg_url)
    results = _verify(pg_url)
    assert all(r.ok for r in results.values()), [r.problems for r in results.values()]
    assert [r.rows_checked for r in results.values()] == [12, 3, 4]
    assert results["completions/Qwen/Qwen3-8B"].rows_adopted == 2
    assert all(" schema js_" in r.where for r in results.values())


def test_a_registry_row_edited_by_hand_is_left_out_and_verify_reports_it(pg_url: str, pg_cluster: Cluster) -> None:
    """One bad row of the registry (an unknown role) stopped every command with "role must be one of ...": it is
    left out, as a folder of the wrong shape is, and verify names it."""
    locations = _server_store(pg_url)
    judged = next(loc for loc in locations if loc.role == "judgements")
    database = make_url(pg_url).database
    edit = f"UPDATE judgestore.registry SET role = 'bogus' WHERE schema_name = '{schema_name(judged)}'"
    pg_cluster.sql(edit, database)
    runner = CliRunner()
    listed = runner.invoke(build_app(), ["ls", "--json", "--store-url", pg_url])
    assert listed.exit_code == 1, listed.output  # the others listed, and this one said on stderr (report_unlisted)
    assert sorted(d["role"] for d in orjson.loads(listed.stdout)) == ["completions", "completions"]
    (unlisted,) = orjson.loads(listed.stderr)["unlisted"]
    assert unlisted["path"] == schema_name(judged)
    rows = runner.invoke(build_app(), ["query", "--format", "jsonl", "--store-url", pg_url])
    assert rows.exit_code == 0 and len(rows.stdout.splitlines()) == 15
    verified = runner.invoke(build_app(), ["verify", "--json", "--store-url", pg_url])
    assert verified.exit_code == 1
    problems = [p for d in [orjson.loads(verified.stdout)] for p in d["problems"]]
    assert [(p["kind"], p["path"]) for p in problems] == [("stray", schema_name(judged))]
    assert "role must be one of completions, judgements, got 'bogus'" in problems[0]["message"]


def test_a_registered_schema_dropped_by_hand_is_reported_skipped_and_built_again_on_a_write(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """Was: verify said all was well, and every query, delete and write failed on it."""
    locations = _server_store(pg_url)
    other = next(loc for loc in locations if loc.model == "other")
    pg_cluster.sql(f'DROP SCHEMA "{schema_name(other)}" CASCADE', make_url(pg_url).database)
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(build_app(), [*args, "--store-url", pg_url])

    verified = run("verify", "--json")
    assert verified.exit_code == 1
    (problem,) = orjson.loads(verified.stdout)["problems"]
    assert problem["kind"] == "schema" and "holds no tables (dropped by hand?)" in problem["message"]
    rows = run("query", "--format", "jsonl")
    assert rows.exit_code == 0 and len(rows.stdout.splitlines()) == 16, rows.output  # 12 + 4: the others
    stats = run("stats", "--json")  # as for a folder store's empty file, which a read-only open cannot build
    assert stats.exit_code == 1 and "holds no tables (dropped by hand?)" in stats.stdout
    assert run("delete", "--run-id", "nothing-such", "--yes").exit_code == 0
    with Store(url=pg_url) as store:
        assert store.find("completions", "t", ModelDescriptor(provider="vllm", model="other")) is None
        database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="other"))
        assert database.put_many([completion_record(1)]) == 1
    assert run("verify", "--json").exit_code == 0


def test_verify_finds_rows_whose_key_was_edited_on_the_server(pg_url: str, pg_cluster: Cluster) -> None:
    locations = _server_store(pg_url)
    qwen = next(loc for loc in locations if loc.role == "completions" and loc.model == QWEN.model)
    name, database = schema_name(qwen), make_url(pg_url).database
    victim = completion_record(5).input_hash
    edited = "0" * 64
    pg_cluster.sql(f"UPDATE \"{name}\".completions SET input_hash = '{edited}' WHERE input_hash = '{victim}'", database)
    results = _verify(pg_url)
    (problem,) = results["completions/Qwen/Qwen3-8B"].problems
    assert problem.kind is ProblemKind.INPUT_HASH and edited in problem.message and name in problem.where
    assert f"judgestore delete {qwen.selector_options()} --input-hash {edited}`" in problem.message
    assert results["completions/Qwen/Qwen3-8B"].rows_checked == 12
    assert all(r.ok for key, r in results.items() if key != "completions/Qwen/Qwen3-8B")
    command = CliRunner().invoke(build_app(), ["verify", "--store-url", pg_url, "--json"])
    assert command.exit_code == 1
    report = orjson.loads(command.stdout)
    assert [p["kind"] for p in report["problems"]] == ["input-hash"] and report["rows_checked"] == 19
    assert pg_cluster.sql(f"SELECT count(*) FROM \"{name}\".completions WHERE input_hash = '{edited}'", database) == [
        (1,)
    ]  # verify changes nothing


def test_verify_on_a_server_names_each_row_whose_value_its_type_cannot_read(pg_url: str, pg_cluster: Cluster) -> None:
    """Values another tool wrote that the server's types take but the store cannot read (JSON's 1e999, a time of
    'infinity'): verify named the schema with the decoder's message, checked no row, and hid an edited key."""
    locations = _server_store(pg_url)
    qwen = next(loc for loc in locations if loc.role == "completions" and loc.model == QWEN.model)
    name, database = schema_name(qwen), make_url(pg_url).database
    bad_json, bad_time, edited = (completion_record(i).input_hash for i in (3, 4, 5))
    pg_cluster.sql(f"""UPDATE "{name}".completions SET usage = '{{"a": 1e999}}' WHERE input_hash = '{bad_json}'""",
                   database)  # fmt: skip
    pg_cluster.sql(
        f"UPDATE \"{name}\".completions SET created_at = 'infinity' WHERE input_hash = '{bad_time}'", database
    )
    pg_cluster.sql(f"UPDATE \"{name}\".completions SET input_text = 'x' WHERE input_hash = '{edited}'", database)
    before = pg_cluster.sql(f'SELECT c::text FROM "{name}".completions AS c ORDER BY 1', database)
    result = _verify(pg_url)["completions/Qwen/Qwen3-8B"]
    assert result.rows_checked == 12
    by_kind = {p.kind: p.message for p in result.problems}
    assert set(by_kind) == {ProblemKind.VALUE, ProblemKind.INPUT_HASH} and len(result.problems) == 3
    named = [p.message for p in result.problems if p.kind is ProblemKind.VALUE]
    assert any(m.startswith(f"row {bad_json} (ctid (") and "usage is not a value of its type" in m for m in named)
    assert any(m.startswith(f"row {bad_time} (ctid (") and "created_at is not a value of its type" in m for m in named)
    assert (
        f"judgestore delete {qwen.selector_options()} --input-hash {bad_json}`" in " ".join(named)
        and edited in by_kind[ProblemKind.INPUT_HASH]
    )
    assert pg_cluster.sql(f'SELECT c::text FROM "{name}".completions AS c ORDER BY 1', database) == before


def test_verify_on_a_server_lists_ten_bad_rows_and_counts_them_all(pg_url: str, pg_cluster: Cluster) -> None:
    locations = _server_store(pg_url)
    qwen = next(loc for loc in locations if loc.role == "completions" and loc.model == QWEN.model)
    pg_cluster.sql(
        f"UPDATE \"{schema_name(qwen)}\".completions SET input_text = input_text || ' '", make_url(pg_url).database
    )
    problems = _verify(pg_url)["completions/Qwen/Qwen3-8B"].problems
    assert len(problems) == 11 and {p.kind for p in problems} == {ProblemKind.INPUT_HASH}
    assert "12 rows in all have problems" in problems[-1].message


def test_verify_on_a_server_reports_an_edited_registry_a_newer_revision_and_a_dropped_table(
    pg_url: str, pg_cluster: Cluster
) -> None:
    locations = _server_store(pg_url)
    database = make_url(pg_url).database
    by_key = {loc.role + "/" + loc.model: loc for loc in locations}
    pg_cluster.sql(
        "UPDATE judgestore.registry SET metadata_json = replace(metadata_json, '\"t\"', '\"u\"') "
        f"WHERE schema_name = '{schema_name(by_key['judgements/Qwen/Qwen3-8B'])}'",
        database,
    )
    pg_cluster.sql(
        f"UPDATE \"{schema_name(by_key['completions/other'])}\".judgestore_alembic_version SET version_num = 'f00d'",
        database,
    )
    pg_cluster.sql(f'DROP TABLE "{schema_name(by_key["completions/Qwen/Qwen3-8B"])}".completions', database)
    results = _verify(pg_url)
    kinds = {key: [p.kind for p in r.problems] for key, r in results.items()}
    assert kinds["judgements/Qwen/Qwen3-8B"] == [ProblemKind.METADATA]
    assert (
        kinds["completions/other"] == [ProblemKind.SCHEMA]
        and "f00d" in results["completions/other"].problems[0].message
    )
    assert kinds["completions/Qwen/Qwen3-8B"] == [ProblemKind.SCHEMA]


def test_verify_on_a_server_names_a_bookkeeping_table_or_column_another_tool_removed(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """A schema without its claims table, or a runs column, passed verify as 'no problems' (was)."""
    locations = _server_store(pg_url)
    database = make_url(pg_url).database
    by_key = {loc.role + "/" + loc.model: loc for loc in locations}
    pg_cluster.sql(f'DROP TABLE "{schema_name(by_key["completions/Qwen/Qwen3-8B"])}".claims', database)
    pg_cluster.sql(f'ALTER TABLE "{schema_name(by_key["judgements/Qwen/Qwen3-8B"])}".runs DROP COLUMN mode', database)
    results = _verify(pg_url)
    (claims,) = results["completions/Qwen/Qwen3-8B"].problems
    (runs,) = results["judgements/Qwen/Qwen3-8B"].problems
    assert claims.kind is runs.kind is ProblemKind.SCHEMA
    assert "lacks table claims, which its schema revision" in claims.message
    assert "lacks column runs.mode, which its schema revision" in runs.message
    assert results["completions/other"].ok


def test_a_column_another_tool_gave_another_type_is_reported_by_verify_and_named_by_every_command(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """Rows still read back through text where json was: only its type says what is wrong, so verify checks it."""
    locations = _server_store(pg_url)
    altered = next(loc for loc in locations if loc.role == "completions" and loc.model == "other")
    pg_cluster.sql(
        f'ALTER TABLE "{schema_name(altered)}".completions ALTER COLUMN usage TYPE text', make_url(pg_url).database
    )
    results = _verify(pg_url)
    (problem,) = results["completions/other"].problems
    assert problem.kind is ProblemKind.SCHEMA and "completions.usage is text, not the json" in problem.message
    assert all(r.ok for key, r in results.items() if key != "completions/other")
    refused = pytest.raises(ServerSchemaError, match="another type than the schema's revision declares")
    with Store(url=pg_url, readonly=True) as store, refused:
        database_stats(store.open(altered))  # what `judgestore stats` reads


def test_a_server_counts_the_data_bytes_of_escaped_text_as_the_readme_says(pg_url: str, tmp_path: Path) -> None:
    """README ("Every value a folder keeps"): sizes are of the text as stored, so a U+0000 counts 3 bytes more in
    text and 2 fewer in JSON than a folder's, a U+FDD0 1 more; every other value the same."""
    prompt = f"a\0b{ESCAPE}c{ESCAPE}0"  # 1 U+0000 and 2 U+FDD0 in text: +5
    rows = [
        completion_record(1, input_hash=input_hash(prompt), input_text=prompt, completion=f"x\0\0{ESCAPE}"),  # +7
        completion_record(2, usage={f"k\0{ESCAPE}": "\0", "prompt_tokens": 3}, top_logprobs={ESCAPE: -1.5}),  # -2+1-2+1
        completion_record(3),
    ]
    totals = {}
    for backend in (Settings(store_root=tmp_path / "folder"), Settings(store_url=pg_url)):
        with Store(backend) as store:
            database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="m"))
            database.put_many(rows)
            with database.reading() as repo:
                totals[backend.store_url is None] = (repo.totals(), [g.data_bytes for g in repo.groups("model")])
    (folder, folder_groups), (server, server_groups) = totals[True], totals[False]
    assert server.data_bytes - folder.data_bytes == 5 + 7 - 2
    assert dataclasses.replace(server, data_bytes=folder.data_bytes) == folder
    assert [n - (5 + 7 - 2) for n in server_groups] == folder_groups


def test_what_a_server_store_wrote_before_it_escaped_text_reads_back_the_same_after_revision_0005(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """Values holding U+FDD0, and JSON holding \\u0000, that older code stored verbatim are rewritten escaped."""
    verbatim = completion_record(
        1,
        completion=f"{ESCAPE}0 {ESCAPE}1 {ESCAPE}",
        benchmark=f"b{ESCAPE}1",
        usage={f"k{ESCAPE}0": "\0", "prompt_tokens": 3},
        top_logprobs={"\0": -1.5, "x": [ESCAPE, -math.inf]},
    )
    plain = completion_record(2, usage={"prompt_tokens": 4})
    with Store(url=pg_url) as server:
        location = server.database("completions", "t", QWEN).location
    name, database = schema_name(location), make_url(pg_url).database
    pg_cluster.sql(f"UPDATE \"{name}\".judgestore_alembic_version SET version_num = '0004'", database)
    pg_cluster.sql(f'DROP TABLE "{name}".claims', database)  # what revision 0006 adds
    engine = create_engine(pg_url)
    with engine.begin() as conn:  # the rows as judgestore stored them before revision 0005: verbatim
        for row in (verbatim, plain):
            values = dataclasses.asdict(row)
            values.update(usage=jsonvalues.dumps(row.usage), top_logprobs=jsonvalues.dumps(row.top_logprobs),
                          created_at=row.created_at.replace(tzinfo=None))  # fmt: skip
            placeholders = ", ".join(f"%({c})s::json" if c in ("usage", "top_logprobs") else f"%({c})s" for c in values)
            conn.exec_driver_sql(f'INSERT INTO "{name}".completions ({", ".join(values)}) VALUES ({placeholders})',
                                 values)  # fmt: skip
    engine.dispose()
    with Store(url=pg_url) as server:
        (result,) = server.upgrade([location])
        assert (result.outcome, result.from_revision, result.to_revision) == (
            UpgradeOutcome.UPGRADED, "0004", SHIPPED_HEAD
        )  # fmt: skip
        opened = server.open(location)
        found = opened.get_many([verbatim.input_hash, plain.input_hash])
        assert math.isinf(found[verbatim.input_hash].top_logprobs["x"][1])  # type: ignore[index]
        assert found == {verbatim.input_hash: verbatim, plain.input_hash: plain}
        assert opened.count(RowFilter(benchmark=f"b{ESCAPE}1")) == 1
        assert server.verify(location).ok
        with opened.reading() as repo:
            assert repo.totals().prompt_tokens == 7  # PostgreSQL's json operators read every usage value now
    query = f'SELECT completion, usage::text, top_logprobs::text FROM "{name}".completions ORDER BY instruction_id'
    completion, usage, top = pg_cluster.sql(query, database)[0]
    assert completion == f"{ESCAPE}10 {ESCAPE}11 {ESCAPE}1"  # as revision 0005 rewrote it
    assert "\\u0000" not in f"{usage}{top}" and f"k{ESCAPE}10" in str(usage)


@pytest.mark.parametrize(
    ("url", "password", "host", "shown"),
    [
        ("postgresql+psycopg://eval:p@ss@db.example/evals", "p@ss", "db.example",
         "postgresql+psycopg://eval:***@db.example/evals"),
        ("postgresql+psycopg://eval:p%40ss@db.example:5433/evals", "p@ss", "db.example",
         "postgresql+psycopg://eval:***@db.example:5433/evals"),
        ("postgresql+psycopg://eval:a:b@c@/evals?host=/run/pg", "a:b@c", None,
         "postgresql+psycopg://eval:***@/evals?host=%2Frun%2Fpg"),
        ("postgresql+psycopg://eval@db.example/evals?password=p@ss&sslmode=require", None, "db.example",
         "postgresql+psycopg://eval@db.example/evals?password=***&sslmode=require"),
        ("postgresql+psycopg://eval@db.example/evals?sslpassword=k3y", None, "db.example",
         "postgresql+psycopg://eval@db.example/evals?sslpassword=***"),
        ("postgresql+psycopg://eval@db.example?password=p@ss", None, "db.example",
         "postgresql+psycopg://eval@db.example?password=***"),
        ("postgresql+psycopg://eval:p?s@s@db.example?sslmode=require", "p?s@s", "db.example",
         "postgresql+psycopg://eval:***@db.example?sslmode=require"),
        ("postgresql://eval@db.example/evals", None, "db.example", "postgresql://eval@db.example/evals"),
    ],
)  # fmt: skip
def test_a_url_is_read_as_the_server_reads_it_and_shown_without_any_password(
    url: str, password: str | None, host: str | None, shown: str
) -> None:
    parsed = parse_store_url(url)
    assert (parsed.password, parsed.host) == (password, host)
    assert display_url(url) == shown
    assert "p@ss" not in display_url(url) and "k3y" not in display_url(url)


def test_names_holding_nul_are_registered_and_a_name_registered_verbatim_before_0005_still_opens(
    pg_url: str, pg_cluster: Cluster
) -> None:
    nul_task, old_task = "task\0with nul", f"task{ESCAPE}1"  # the second, stored verbatim, reads as escaped text
    with Store(url=pg_url) as server:
        for task in (nul_task, old_task):
            server.database("completions", task, QWEN).put_many([completion_record(1)])
    database = make_url(pg_url).database
    assert database is not None
    # What judgestore wrote before revision 0005: the name as it is, unescaped.
    pg_cluster.sql(f"UPDATE judgestore.registry SET task = '{old_task}' WHERE task = '{old_task}1'", database)
    assert pg_cluster.sql(f"SELECT count(*) FROM judgestore.registry WHERE task = '{old_task}'", database) == [(1,)]
    with Store(url=pg_url, readonly=True) as server:
        assert sorted(location.task for location in server.locations()) == sorted([nul_task, old_task])
        assert all(server.open(location).count() == 1 for location in server.locations())


def test_a_side_folder_named_after_the_urls_text_is_carried_over_once(pg_url: str) -> None:
    """The side folder was named after the URL's text before it was named after the database: its bookkeeping is
    carried over, so the first push after the change does not send every row again."""
    import hashlib

    from store.catalog import cache_home

    with Store(url=pg_url) as store:
        where = store.where
    by_text = cache_home() / "servers" / hashlib.sha256(where.encode()).hexdigest()[:16]
    by_text.mkdir(parents=True)
    (by_text / "bookkeeping").write_text("pushed shards")
    with Store(url=pg_url) as store:
        root = store.root
    assert root != by_text and (root / "bookkeeping").read_text() == "pushed shards" and not by_text.exists()


def test_a_handle_a_run_keeps_refuses_to_write_a_schema_another_process_moved_to_another_revision(pg_url: str) -> None:
    """A run writes through the handle it opened: after another process's upgrade by a newer judgestore it went on
    writing rows of its own revision into the new schema, 76,700 rows (was). Asked inside every write."""
    with Store(url=pg_url) as store:
        handle = store.database("completions", "t", QWEN)
        assert handle.put_many([completion_record(1)]) == 1
        table = f'"{schema_name(handle.location)}".judgestore_alembic_version'
        engine = create_engine(pg_url)
        with engine.begin() as conn:  # as the newer judgestore's upgrade leaves it
            head = conn.execute(text(f"SELECT version_num FROM {table}")).scalar_one()
            conn.execute(text(f"UPDATE {table} SET version_num = '9999'"))
        with pytest.raises(SchemaError, match=r"changed under this process .* its revision is now 9999"):
            handle.put_many([completion_record(2)])
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET version_num = :head"), {"head": head})
        engine.dispose()
        assert handle.count() == 1  # nothing was written
        assert handle.put_many([completion_record(2)]) == 1  # back at this library's revision: it writes again


def test_a_write_that_waited_for_a_schemas_upgrade_is_refused_under_its_write_lock(pg_url: str) -> None:
    """The revision was asked at most once a second, before the write's transaction: a write made within a second
    of another process's upgrade, or one that waited for the upgrade's lock, went into the migrated schema (was)."""
    from store.backends.postgres.generations import write_lock

    with Store(url=pg_url) as store:
        handle = store.database("completions", "t", QWEN)
        assert handle.put_many([completion_record(1)]) == 1
        schema = schema_name(handle.location)
        table = f'"{schema}".judgestore_alembic_version'
        engine = create_engine(pg_url)
        upgrader = engine.connect()
        upgrade = upgrader.begin()
        write_lock(upgrader, schema)  # as a newer judgestore's `db upgrade` holds it while it migrates
        head = upgrader.execute(text(f"SELECT version_num FROM {table}")).scalar_one()
        upgrader.execute(text(f"UPDATE {table} SET version_num = '9999'"))
        threading.Timer(0.6, upgrade.commit).start()
        started = time.monotonic()
        try:
            with pytest.raises(SchemaError, match=r"changed under this process .* its revision is now 9999"):
                handle.put_many([completion_record(2)])
            assert time.monotonic() - started >= 0.5  # it waited for the upgrade's lock, then read what it left
            with pytest.raises(SchemaError, match="its revision is now 9999"):
                handle.delete(RowFilter(run_id="run-1"))  # every write, not only put_many
        finally:
            time.sleep(0.2)
            upgrader.close()
        with engine.begin() as conn:
            assert conn.execute(text(f'SELECT count(*) FROM "{schema}".completions')).scalar_one() == 1
            conn.execute(text(f"UPDATE {table} SET version_num = :head"), {"head": head})
        engine.dispose()
        assert handle.put_many([completion_record(2)]) == 1
