"""A server store's catalog: an unchanged store is listed from one statement; any change to a schema is seen."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from store.backends.postgres.generations import TRIGGER, installed, stamps
from store.backends.postgres.registry import schema_name
from store.backends.postgres.survey import SCHEMA_TABLES
from store.errors import ServerUnavailableError
from store.layout import Location, Selector
from store.reports import UpgradeOutcome
from store.settings import Settings
from store.stats import store_stats
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import completion_record
from tests.pg_server import Cluster, running_cluster, server_bin
from tests.store.test_narrowing import descriptor, fill


def answers(url: str) -> tuple[Any, ...]:
    """What ``ls``, ``db status``, ``stats`` and a row filter say of the store, each as a fresh command would."""
    with Store(Settings(), url=url, readonly=True) as store:
        locations = store.locations()
        infos = [info.as_dict() for info in store.infos(locations)]
        statuses = [info.as_dict() for info in store.infos(locations, count_rows=False)]
        stats = [s.as_dict() for s in store_stats(store)]
        rows = sorted((row.location.model, row.record.input_hash) for row in store.query_rows(Selector(),
                      RowFilter(model="m-1")))  # fmt: skip
    return infos, statuses, stats, rows


def forbid_reading_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make reading any schema's rows, state or values fail the test: only the stamps and the catalog may answer."""
    import store.backends.postgres.storage as storage
    import store.stats as stats

    for module, name in ((storage, "schema_infos"), (storage, "distinct_values"), (stats, "database_stats")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a schema was read"))


def execute(url: str, statement: str, **params: Any) -> None:
    with Store(Settings(), url=url) as store, store.storage.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text(statement), params)


def first_completions(url: str) -> Location:
    with Store(Settings(), url=url, readonly=True) as store:
        return next(loc for loc in store.locations() if loc.model == descriptor(1).model)


def test_an_unchanged_server_store_is_answered_from_the_catalog(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    first = answers(pg_url)
    assert len(first[3]) == 3 and all(info["rows"] for info in first[0])
    forbid_reading_schemas(monkeypatch)
    assert answers(pg_url) == first  # the same, without reading a schema


@pytest.mark.parametrize("read", ["distinct values", "existence probe"])
def test_a_connection_lost_while_narrowing_is_a_typed_error_not_a_traceback(pg_url: str, read: str) -> None:
    """A lost connection was taken for a batch the server refused, and the transaction around it then failed with
    SQLAlchemy's PendingRollbackError, shown as a traceback."""
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    marker = "SELECT DISTINCT" if read == "distinct values" else " AS s \nFROM "

    def lose_the_connection(conn: Any, cursor: Any, statement: str, *rest: Any) -> tuple[Any, ...]:
        if marker in statement:  # the server ends this very session
            return "SELECT pg_terminate_backend(pg_backend_pid())", ()
        return statement, rest[0]

    with Store(Settings(lock_retries=1), url=pg_url, readonly=True) as store:
        if read == "existence probe":
            list(store.query_rows(Selector(), RowFilter(model="m-1")))  # the values are known: next time, the probe
        event.listen(store.storage.engine, "before_cursor_execute", lose_the_connection, retval=True)
        with pytest.raises(ServerUnavailableError, match="the server ended the connection") as lost:
            list(store.query_rows(Selector(), RowFilter(model="m-1", benchmark="bench-1")))
        assert "is it running" not in str(lost.value)  # it was reached


@pytest.mark.parametrize(
    "change",
    [
        "a row written through the store",
        "a row changed by hand",
        "rows deleted by hand",
        "a table emptied by hand",
        "a row changed by hand with the trigger disabled",
        # a pg_dump --disable-triggers restore: the trigger is back as it was (the stamp was too: was)
        "a row changed by hand with the trigger disabled, then enabled again",
        # a logical replica's apply, a restore's load: an ordinary trigger does not fire (was)
        "a row changed by hand as a replica",
        "a table replaced by hand, its trigger put back",
    ],
)
def test_a_change_to_a_schema_is_seen_by_the_next_command(pg_url: str, change: str) -> None:
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    before = answers(pg_url)  # kept in the catalog
    location = first_completions(pg_url)
    table = f'"{schema_name(location)}".completions'
    change_one = f"UPDATE {table} SET model = 'm-9' WHERE input_hash = (SELECT min(input_hash) FROM {table})"
    if change == "a row written through the store":
        with Store(Settings(), url=pg_url) as store:
            store.open(location).put_many([completion_record(900, model="m-1")])
    elif change == "a row changed by hand":
        execute(pg_url, change_one)
    elif change == "rows deleted by hand":
        execute(pg_url, f"DELETE FROM {table} WHERE model = 'm-1'")
    elif change == "a table emptied by hand":
        execute(pg_url, f"TRUNCATE {table}")
    elif change == "a row changed by hand with the trigger disabled":
        execute(pg_url, f"ALTER TABLE {table} DISABLE TRIGGER {TRIGGER}")
        execute(pg_url, change_one)
    elif change == "a row changed by hand with the trigger disabled, then enabled again":
        execute(pg_url, f"ALTER TABLE {table} DISABLE TRIGGER {TRIGGER}")
        execute(pg_url, change_one)
        execute(pg_url, f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {TRIGGER}")
    elif change == "a row changed by hand as a replica":
        execute(pg_url, f"SET LOCAL session_replication_role = replica; {change_one}")
    else:  # an empty copy: no trigger fires, the counter stays, but the table is another relation
        name = f'"{schema_name(location)}"'
        execute(pg_url, f"CREATE TABLE {name}.fresh (LIKE {table} INCLUDING ALL)")
        execute(pg_url, f"DROP TABLE {table}")
        execute(pg_url, f"ALTER TABLE {name}.fresh RENAME TO completions")
        execute(pg_url, f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
                        "FOR EACH STATEMENT EXECUTE FUNCTION judgestore.touch()")  # fmt: skip
    after = answers(pg_url)
    assert after != before
    with Store(Settings(), url=pg_url, readonly=True) as store:
        (info,) = store.infos([location])
        assert info.as_dict() == store.storage.info(location).as_dict()  # what reading the schema afresh says
        # a value only the catalog could hide: the row changed by hand to m-9 is found (the stamp moved)
        found = [row.location for row in store.query_rows(Selector(), RowFilter(model="m-9"))]
    assert found == ([location] if "changed by hand" in change else [])
    if change.startswith("a table replaced"):
        assert info.rows == 0


def test_a_schema_made_before_generations_is_read_each_time_until_upgraded(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    location = first_completions(pg_url)
    name = schema_name(location)
    for table in SCHEMA_TABLES:  # as a schema of the last version was: no triggers, no counter
        execute(pg_url, f'DROP TRIGGER IF EXISTS {TRIGGER} ON "{name}"."{table}"')
    execute(pg_url, "DELETE FROM judgestore.generations WHERE schema_name = :n", n=name)
    first = answers(pg_url)
    with Store(Settings(), url=pg_url, readonly=True) as store, store.storage.connection() as conn:  # type: ignore[attr-defined]
        assert stamps(conn)[name] is None and not installed(conn, name)
    with monkeypatch.context() as patched:
        forbid_reading_schemas(patched)
        with pytest.raises(pytest.fail.Exception, match="a schema was read"):
            answers(pg_url)  # the others come from the catalog, this one cannot
    with Store(Settings(), url=pg_url) as store:
        results = list(store.upgrade(store.locations()))
    assert {result.outcome for result in results} == {UpgradeOutcome.UP_TO_DATE}  # nothing else to say
    with Store(Settings(), url=pg_url, readonly=True) as store, store.storage.connection() as conn:  # type: ignore[attr-defined]
        assert installed(conn, name)
    assert answers(pg_url) == first
    forbid_reading_schemas(monkeypatch)
    assert answers(pg_url) == first  # now kept


def test_a_role_that_may_only_write_the_tables_raises_the_counter(pg_url: str, pg_cluster: Cluster) -> None:
    # touch() runs with its owner's rights: a writer needs no grant on the registry's counters.
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    location = first_completions(pg_url)
    name, database = schema_name(location), make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE writer LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    for statement in (
        f'GRANT USAGE ON SCHEMA "{name}", judgestore TO writer',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{name}" TO writer',
        "GRANT SELECT ON judgestore.registry TO writer",
    ):
        pg_cluster.sql(statement, database)
    before = answers(pg_url)
    with Store(Settings(), url=pg_cluster.url(database, "writer", "pw")) as store:
        store.open(location).put_many([completion_record(901, model="m-1")])
    assert pg_cluster.sql("SELECT has_table_privilege('writer', 'judgestore.generations', 'UPDATE')", database) == [
        (False,)
    ]
    after = answers(pg_url)
    assert len(after[3]) == len(before[3]) + 1  # the new row is found: the counter moved with it


def test_triggers_not_firing_always_give_no_stamp_until_the_owner_upgrades(pg_url: str, pg_cluster: Cluster) -> None:
    """A trigger enabled otherwise (an older library's, or put back by a restore's ENABLE TRIGGER ALL) misses a
    replica's writes: its schema's stamp was believed (was). A role that may not change them is told, not refused."""
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    location = first_completions(pg_url)
    name, database = schema_name(location), make_url(pg_url).database
    assert database is not None
    for table in SCHEMA_TABLES:
        execute(pg_url, f'ALTER TABLE IF EXISTS "{name}"."{table}" ENABLE TRIGGER {TRIGGER}')  # ordinary, not always

    def stamped() -> bool:
        with Store(Settings(), url=pg_url, readonly=True) as store, store.storage.connection() as conn:  # type: ignore[attr-defined]
            return stamps(conn)[name] is not None

    assert not stamped()
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE mate LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    for statement in (
        f'GRANT USAGE ON SCHEMA "{name}", judgestore TO mate',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{name}" TO mate',
        "GRANT SELECT ON ALL TABLES IN SCHEMA judgestore TO mate",
    ):
        pg_cluster.sql(statement, database)
    with Store(Settings(), url=pg_cluster.url(database, "mate", "pw")) as store:
        (result,) = store.upgrade([location])
    assert result.outcome is UpgradeOutcome.UP_TO_DATE and result.error is not None
    assert "only the tables' owner may change them" in result.error and not stamped()
    with Store(Settings(), url=pg_url) as store:
        (result,) = store.upgrade([location])
    assert (result.outcome, result.error) == (UpgradeOutcome.UP_TO_DATE, None) and stamped()


def test_a_role_that_may_read_less_never_gets_another_roles_catalogued_answers(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """The catalog was one per database: a role without access to the schemas was shown the owner's counts and
    states ("usable", exit 0) from this machine's cache."""
    with Store(Settings(), url=pg_url) as store:
        fill(store)
    owner = answers(pg_url)
    assert all(info["state"] == "current" for info in owner[0])
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE outsider LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql("GRANT USAGE ON SCHEMA judgestore TO outsider", database)
    pg_cluster.sql("GRANT SELECT ON ALL TABLES IN SCHEMA judgestore TO outsider", database)
    with Store(Settings(), url=pg_cluster.url(database, "outsider", "pw"), readonly=True) as store:
        locations = store.locations()
        assert len(locations) == len(owner[0])
        states = {info.as_dict()["state"] for info in store.infos(locations)}
    assert "current" not in states
    assert answers(pg_url) == owner  # the owner's own catalog is still its own


def test_a_schema_discarded_empty_leaves_no_counter_behind(pg_url: str, pg_cluster: Cluster) -> None:
    database = make_url(pg_url).database
    assert database is not None
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", descriptor(7))  # created, no row written
        (location,) = store.locations()
        name = schema_name(location)
        assert pg_cluster.sql(f"SELECT generation FROM judgestore.generations WHERE schema_name = '{name}'", database)
        assert store.discard_if_empty(location)
        assert store.locations() == []
    assert pg_cluster.sql("SELECT count(*) FROM judgestore.generations", database) == [(0,)]


def test_a_write_of_many_statements_raises_the_counter_once(pg_url: str, pg_cluster: Cluster) -> None:
    database = make_url(pg_url).database
    assert database is not None
    with Store(Settings(), url=pg_url) as store:
        written = store.database("completions", "t", descriptor(3))
        (location,) = store.locations()
        query = f"SELECT generation FROM judgestore.generations WHERE schema_name = '{schema_name(location)}'"
        [(before,)] = pg_cluster.sql(query, database)
        written.put_many([completion_record(i) for i in range(50)])  # one INSERT per row (executemany)
        [(after,)] = pg_cluster.sql(query, database)
        assert after == before + 1
        table = f'"{schema_name(location)}".completions'
        with store.storage.engine.begin() as conn:  # type: ignore[attr-defined]
            with conn.begin_nested() as savepoint:  # raised, then rolled back with its mark
                conn.execute(text(f"DELETE FROM {table} WHERE sample_index = 0"))
                savepoint.rollback()
            conn.execute(text(f"UPDATE {table} SET run_id = NULL"))  # so this statement raises it again
            conn.execute(text(f"UPDATE {table} SET run_id = 'r'"))
        assert pg_cluster.sql(query, database) == [(after + 1,)]
        assert len(list(store.open(location).query())) == 50  # the rolled-back delete deleted nothing


def test_a_server_restored_from_a_copy_of_its_files_is_read_again(tmp_path: Path) -> None:
    """A backup restored (or a snapshot rolled back, a replica promoted) rewinds every counter: a write after it
    reached the stamp the catalog held for another write, and a row filter skipped the schema that holds its rows
    (was: `query --model m-B` found nothing, `delete` said there was nothing to delete)."""
    if server_bin() is None:
        pytest.skip("PostgreSQL's server binaries are not installed (apt-get install postgresql; .ci/setup does it)")
    with running_cluster() as cluster:  # a server of its own: it is stopped and its files replaced
        url = cluster.url(cluster.new_database())
        with Store(Settings(), url=url) as store:
            fill(store)
        location = first_completions(url)
        assert answers(url)[3]  # the catalog holds every schema now

        def write(model: str) -> None:
            with Store(Settings(), url=url) as store:
                store.open(location).put_many([completion_record(900, model=model)])
            answers(url)  # what the next command derives, kept in the catalog

        def matching(model: str) -> int:
            with Store(Settings(), url=url, readonly=True) as store:
                return sum(1 for _ in store.query_rows(Selector(), RowFilter(model=model)))

        cluster.stop()
        backup = tmp_path / "backup"
        subprocess.run(["cp", "-a", str(cluster.data), str(backup)], check=True)
        cluster.start_again()
        write("m-A")
        assert matching("m-A") == 1
        cluster.stop()
        shutil.rmtree(cluster.data)
        subprocess.run(["cp", "-a", str(backup), str(cluster.data)], check=True)
        cluster.start_again()
        write("m-B")  # the counter it raises is the one m-A's write raised before the restore
        assert matching("m-A") == 0 and matching("m-B") == 1
