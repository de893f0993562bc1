"""Every command on a PostgreSQL store (``--store-url``), as a user types it, against a real throwaway server.

The model is a fake OpenAI-compatible server (tests/fake_openai.py, the real
client library speaks to it), so that this runs without the engine; the real
engine on a server store is in tests/inference/test_postgres_engine.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url
from typer.testing import CliRunner, Result

from inference.cli.app import app
from store.backends.postgres.registry import schema_name
from store.descriptor import ModelDescriptor
from store.errors import ServerSchemaError, ServerUnavailableError
from store.schema import read_script_directory
from store.settings import Settings
from store.store import Store
from tests.factories import SHIPPED_HEAD, SYNTHETIC_HEAD, SYNTHETIC_REVISIONS, completion_record, judgement_record
from tests.fake_openai import FakeOpenAI
from tests.legacy import builders as b
from tests.pg_server import Cluster
from tests.store.schema_helpers import pretend_shipped_scripts_are

pytestmark = pytest.mark.postgres


def judgestore(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app(), list(args), env={"COLUMNS": "200", **(env or {})})


def generate(openai_server: FakeOpenAI, chat_prompts: Path, out: Path, *store: str) -> Result:
    return judgestore(
        "generate", "--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
        "--api-key-env", "JUDGE_KEY", "--task", "t", "-i", str(chat_prompts), "-o", str(out), "--json", *store,
    )  # fmt: skip


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def test_generate_then_every_read_command_on_a_server_store(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, pg_url: str
) -> None:
    store = ("--store-url", pg_url)
    first = as_json(generate(openai_server, chat_prompts, tmp_path / "a.jsonl", *store))
    assert (first["misses"], first["rows_written"]) == (5, 5)
    again = as_json(generate(openai_server, chat_prompts, tmp_path / "b.jsonl", *store))
    assert (again["hits"], again["requests_sent"]) == (5, 0) and len(openai_server.completions()) == 5
    assert not (tmp_path / "store").exists()  # nothing went to the folder in JUDGESTORE_STORE_ROOT

    (listed,) = as_json(judgestore("ls", "--json", *store))
    assert (listed["state"], listed["rows"], listed["task"]) == ("current", 5, "t")
    assert listed["path"].startswith("postgresql+psycopg://") and "js_c_" in listed["path"]
    rows = [orjson.loads(line) for line in judgestore("query", "--format", "jsonl", *store).stdout.splitlines()]
    assert sorted(r["instruction_id"] for r in rows) == ["0", "1", "2", "3", "4"]
    assert as_json(judgestore("db", "status", "--json", *store))["ok"] is True
    assert [r["outcome"] for r in as_json(judgestore("db", "upgrade", "--json", *store))["results"]] == ["up-to-date"]
    no_backup = judgestore("db", "upgrade", "--no-backup", *store)  # was: accepted without a word
    assert no_backup.exit_code == 0 and "a server's upgrade makes no backup to delete" in no_backup.stderr
    verified = as_json(judgestore("verify", "--json", *store))
    assert (verified["ok"], verified["databases"], verified["rows_checked"]) == (True, 1, 5)
    stats = as_json(judgestore("stats", "--json", *store))
    assert stats["totals"]["rows"]["rows"] == 5 and stats["databases"][0]["runs"]["runs"] == 2
    exported = judgestore("export", "--format", "jsonl", "--instruction-id", "3", *store)
    assert [orjson.loads(line)["instruction_id"] for line in exported.stdout.splitlines()] == ["3"]

    deleted = as_json(judgestore("delete", "--instruction-id", "0", "--yes", "--json", *store))
    assert deleted["deleted"] == 1
    pruned = judgestore("prune", "--instruction-id", "1", "--older-than", "0s", "--yes", *store)
    assert pruned.exit_code == 0, pruned.output  # was: told to run vacuum, which a server store refuses
    assert "Pruned 1 row from 1 database; the server's autovacuum reuses their space." in pruned.stdout
    assert as_json(judgestore("ls", "--json", *store))[0]["rows"] == 3
    third = as_json(generate(openai_server, chat_prompts, tmp_path / "c.jsonl", *store))
    assert (third["hits"], third["misses"]) == (3, 2)  # exactly the deleted rows are recomputed


def test_a_user_who_may_only_read_gets_every_hit_and_a_warning_that_the_run_was_not_recorded(
    openai_server: FakeOpenAI, chat_prompts: Path, tmp_path: Path, pg_url: str, pg_cluster: Cluster
) -> None:
    """All hits need no write but the run's accounting row: the run failed there, at its end, and its output was
    never written (was; JUDGESTORE_RECORD_RUNS=false was the way out)."""
    as_json(generate(openai_server, chat_prompts, tmp_path / "a.jsonl", "--store-url", pg_url))
    database = make_url(pg_url).database
    (schema,) = (
        name for (name,) in pg_cluster.sql("SELECT nspname FROM pg_namespace", database) if name.startswith("js_")
    )
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE viewer LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql(f'GRANT USAGE ON SCHEMA "{schema}", judgestore TO viewer', database)
    pg_cluster.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}", judgestore TO viewer', database)
    runs = f'SELECT count(*) FROM "{schema}".runs'
    before = pg_cluster.sql(runs, database)
    viewer = pg_cluster.url(database, "viewer", "pw")
    result = generate(openai_server, chat_prompts, tmp_path / "b.jsonl", "--store-url", viewer)
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert (report["hits"], report["requests_sent"]) == (5, 0) and len(openai_server.completions()) == 5
    first, hits = (
        [orjson.loads(line) for line in (tmp_path / f).read_bytes().splitlines()] for f in ("a.jsonl", "b.jsonl")
    )
    assert [r["completion"] for r in hits] == [r["completion"] for r in first] and all(r["cached"] for r in hits)
    (warning,) = [orjson.loads(line) for line in result.stderr.splitlines()]  # with --json, a JSON object
    assert warning["type"] == "RunNotRecordedWarning", warning
    assert (
        warning["warning"].startswith("this run was not recorded")
        and "JUDGESTORE_RECORD_RUNS=false" in warning["warning"]
    )
    assert pg_cluster.sql(runs, database) == before


def test_judge_pairwise_and_pointwise_on_a_server_store(openai_server: FakeOpenAI, tmp_path: Path, pg_url: str) -> None:
    pairs = tmp_path / "pairs.jsonl"
    lines = [
        {"instruction_id": "0", "question": "q0", "model_a": "a", "answer_a": "x", "model_b": "b", "answer_b": "y"},
        {"instruction_id": "1", "question": "q1", "model_a": "a", "answer_a": "z"},  # pointwise: no model_b
    ]
    pairs.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))

    def judge() -> Any:
        return as_json(judgestore(
            "judge", "--provider", "vllm-server", "--base-url", openai_server.base_url, "--model", "fake-judge",
            "--api-key-env", "JUDGE_KEY", "--task", "t", "-i", str(pairs), "-o", str(tmp_path / "verdicts.jsonl"),
            "--orientation", "both", "--json", "--store-url", pg_url,
        ))  # fmt: skip

    first = judge()
    assert (first["requested"], first["rows_written"]) == (3, 3)  # the pair both ways, the single answer once
    again = judge()
    assert (again["hits"], again["requests_sent"]) == (3, 0) and len(openai_server.completions()) == 3
    (listed,) = as_json(judgestore("ls", "--json", "--store-url", pg_url))
    assert (listed["role"], listed["rows"]) == ("judgements", 3) and "js_j_" in listed["path"]
    rows = [orjson.loads(x) for x in judgestore("query", "--role", "judgements", "--format", "jsonl",
                                                 "--store-url", pg_url).stdout.splitlines()]  # fmt: skip
    slots = sorted((r["model_a"], r["model_b"] or "", r["orientation"] or "") for r in rows)
    assert slots == [("a", "", ""), ("a", "b", "direct"), ("b", "a", "reversed")]  # pointwise: model_b NULL


def test_vacuum_on_a_server_store_says_what_to_do_instead(pg_url: str) -> None:
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="org/m")).put_many(
            [completion_record(0)]
        )
    result = judgestore("vacuum", "--store-url", pg_url)
    assert result.exit_code == 1 and "autovacuum" in result.stderr and "Traceback" not in result.output


def test_a_filter_value_no_row_of_a_server_store_holds_is_named_with_the_one_meant(pg_url: str) -> None:
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="org/m")).put_many(
            [completion_record(i, model="qwen") for i in range(2)]
        )
    result = judgestore("delete", "--model", "/models/qwen", "--yes", "--store-url", pg_url)
    assert result.exit_code == 0 and "nothing to delete" in result.stdout
    assert "No row here has --model '/models/qwen'; did you mean 'qwen'?" in " ".join(result.stderr.split())


def pushed_server_store(pg_url: str, remote: Path) -> ModelDescriptor:
    """Six completions on the server, pushed to the shared folder ``remote``; their descriptor."""
    descriptor = ModelDescriptor(provider="vllm", model="org/m")
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", descriptor).put_many([completion_record(i) for i in range(6)])
    pushed = as_json(judgestore("hub", "push", "--dir", str(remote), "--all", "--create-repo", "--json",
                                "--store-url", pg_url))  # fmt: skip
    assert pushed["rows"] == 6
    return descriptor


def test_push_from_a_server_and_fetch_into_a_folder_and_back(pg_url: str, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    descriptor = pushed_server_store(pg_url, remote)
    folder = tmp_path / "folder"
    fetched = as_json(judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-root", str(folder)))
    assert fetched["rows_inserted"] == 6
    (listed,) = as_json(judgestore("ls", "--json", "--store-root", str(folder)))
    assert listed["rows"] == 6 and listed["descriptor"] == descriptor.hash16()


def test_sharing_bookkeeping_belongs_to_the_database_not_the_urls_spelling(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Another spelling of the URL pushed every row again, and a database made again under the same name was told
    its shards were 'already here' (its rows never came back). Both were: the bookkeeping was named after the text."""
    remote = tmp_path / "remote"
    pushed_server_store(pg_url, remote)
    url = make_url(pg_url)
    respelled = f"postgresql+psycopg:///{url.database}?host={pg_cluster.socket_dir}&user={url.username}"
    again = as_json(judgestore("hub", "push", "--dir", str(remote), "--all", "--json", "--store-url", respelled))
    assert again["rows"] == 0, again

    pg_cluster.drop_database(str(url.database))  # made again, empty, under the same name
    pg_cluster.sql(f'CREATE DATABASE "{url.database}"')
    fetched = as_json(judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-url", pg_url))
    assert fetched["rows_inserted"] == 6, fetched
    (listed,) = as_json(judgestore("ls", "--json", "--store-url", pg_url))
    assert listed["rows"] == 6


def test_a_schema_dropped_by_hand_is_fetched_again_whole(pg_cluster: Cluster, pg_url: str, tmp_path: Path) -> None:
    """Its registry row outlived the DROP SCHEMA, so the folder counted as here and its shards as imported: "1
    shard already here", and the rows never came back (was)."""
    remote = tmp_path / "remote"
    pushed_server_store(pg_url, remote)
    with Store(Settings(), url=pg_url) as store:
        (location,) = store.locations()
    pg_cluster.sql(f'DROP SCHEMA "{schema_name(location)}" CASCADE', make_url(pg_url).database)
    fetched = as_json(judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-url", pg_url))
    assert (fetched["rows_inserted"], fetched["skipped"]) == (6, 0), fetched
    (listed,) = as_json(judgestore("ls", "--json", "--store-url", pg_url))
    assert listed["rows"] == 6
    again = as_json(judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-url", pg_url))
    assert (again["rows_inserted"], again["skipped"]) == (0, 1), again  # whole again: skipped as ever


def test_a_registry_row_whose_task_was_edited_is_reported_and_copy_says_so(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Its schema's rows were left behind by copy (exit 0), ls showed the database empty and verify said its rows
    were gone (was): as a folder store's edited metadata.json, the database is a metadata mismatch."""
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="a")).put_many(
            [completion_record(i) for i in range(3)]
        )
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="b")).put_many([completion_record(1)])
        edited = next(location for location in store.locations() if location.model == "a")
    name = schema_name(edited)
    pg_cluster.sql(
        f"UPDATE judgestore.registry SET task = 'other' WHERE schema_name = '{name}'", make_url(pg_url).database
    )
    listed = judgestore("ls", "--json", "--store-url", pg_url)
    assert listed.exit_code == 1
    by_model = {row["model"]: row for row in orjson.loads(listed.stdout)}
    assert by_model["a"]["state"] == "metadata-mismatch" and name in str(by_model["a"]["error"])
    assert by_model["b"]["rows"] == 1
    verified = judgestore("verify", "--json", "--store-url", pg_url)
    assert verified.exit_code == 1
    (problem,) = orjson.loads(verified.stdout)["problems"]
    assert "edited" in problem["message"] and "rows are gone" not in problem["message"]
    copied = judgestore("copy", "--from-url", pg_url, "--to-root", str(tmp_path / "copy"), "--json")
    assert copied.exit_code == 1, copied.output
    assert "metadata" in copied.output.lower() or name in copied.output
    with Store(root=tmp_path / "copy") as copy:
        assert [location.model for location in copy.locations()] == ["b"]  # the other went, and is said not to


def test_a_schema_whose_registry_row_was_deleted_is_said_by_ls_db_status_and_db_upgrade(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """db status said "All databases are usable", ls and db upgrade exited 0, without a word of the schema holding
    rows that every command left out; only verify named it (was). A folder store's lost metadata is said by all."""
    with Store(Settings(), url=pg_url) as store:
        for model in ("a", "b"):
            store.database("completions", "t", ModelDescriptor(provider="vllm", model=model)).put_many(
                [completion_record(i) for i in range(3)]
            )
        lost = schema_name(next(location for location in store.locations() if location.model == "a"))
    pg_cluster.sql(f"DELETE FROM judgestore.registry WHERE schema_name = '{lost}'", make_url(pg_url).database)
    status = judgestore("db", "status", "--json", "--store-url", pg_url)
    assert status.exit_code == 1
    document = orjson.loads(status.stdout)
    assert document["ok"] is False and [d["model"] for d in document["databases"]] == ["b"]
    (unlisted,) = document["unlisted"]
    assert unlisted["path"] == lost and "3 rows" in unlisted["message"]
    for args in (["db", "status"], ["ls"], ["db", "upgrade"], ["ls", "--json"], ["db", "upgrade", "--dry-run"]):
        result = judgestore(*args, "--store-url", pg_url)
        assert result.exit_code == 1, (args, result.output)
        assert lost in result.stderr and "left out of this listing" in result.stderr, (args, result.stderr)
    assert judgestore("ls", "--store-url", pg_url, "--model-id", "b").exit_code == 0  # a selection cannot pick it
    # A role that may read only the registered schema: ls and db status failed on the other's rows (was)
    database = make_url(pg_url).database
    kept = schema_name(next(loc for loc in Store(Settings(), url=pg_url).locations()))
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE partial LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    for schema in (kept, "judgestore"):
        pg_cluster.sql(f'GRANT USAGE ON SCHEMA "{schema}" TO partial', database)
        pg_cluster.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO partial', database)
    partial = pg_cluster.url(database, "partial", "pw")
    for args in (["ls", "--json"], ["db", "status", "--json"]):
        result = judgestore(*args, "--store-url", partial)
        assert result.exit_code == 1 and "rows this role may not read" in result.stderr + result.stdout, result.output
    (listed,) = orjson.loads(judgestore("ls", "--json", "--store-url", partial).stdout)
    assert listed["model"] == "b" and listed["rows"] == 3


def test_a_fetch_the_server_leaves_midway_stops_at_once_and_says_what_it_imported_before(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every later group, and every later folder, waited out the retries and was listed failed with the same
    "cannot reach the server" (224 s for 311 shards), and nothing said what was imported before (was)."""
    import store.store
    from store.sync.fetch import ShardImporter

    remote = tmp_path / "remote"
    with Store(Settings(), url=pg_url) as source:
        source.database("completions", "t", ModelDescriptor(provider="vllm", model="org/m")).put_many(
            [completion_record(i) for i in range(40)]
        )
    pushed = as_json(judgestore("hub", "push", "--dir", str(remote), "--all", "--create-repo", "--json",
                                "--store-url", pg_url, env={"JUDGESTORE_SHARD_TARGET_BYTES": "2000"}))  # fmt: skip
    assert pushed["shards"] >= 4, pushed
    target = pg_cluster.url(pg_cluster.new_database())
    real_put, writes = store.store.Database.put_many, []

    def the_server_goes_away(self: Any, *args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        if len(writes) > 1:
            raise ServerUnavailableError(target, "cannot reach the server")
        return real_put(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(sys.modules[ShardImporter.__module__], "GROUP_SHARDS", 1)  # a transaction per shard
        patched.setattr(store.store.Database, "put_many", the_server_goes_away)
        result = judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-url", target)
    error = orjson.loads(result.stderr)
    assert result.exit_code == 1 and error["type"] == "ServerUnavailableError", result.output
    assert len(writes) == 2  # stopped at the first group the server failed
    said = " ".join(error["notes"])
    assert "Before it, 1 shard (" in said and "run the same fetch again once the server answers" in said
    again = as_json(judgestore("hub", "fetch", "--dir", str(remote), "--all", "--json", "--store-url", target))
    assert again["ok"] and again["skipped"] == 1 and again["shards"] == pushed["shards"] - 1, again
    (listed,) = as_json(judgestore("ls", "--json", "--store-url", target))
    assert listed["rows"] == 40


def _legacy_judge_cache(tmp_path: Path, files: int = 1) -> tuple[str, ...]:
    """An S0 cache of ``files`` files of 4 rows, and the import arguments that name its judge (--json)."""
    legacy = tmp_path / "legacy"
    for f in range(files):
        rows = [
            {"benchmark": "mt-bench", "instruction_id": str(i), "model_a": "a", "model_b": "b", "judge": "gpt-4",
             "judge_input": f"Compare answers to question {i} ({f})", "judge_completion": "[[A]]",
             "date": "2025-12-31"}
            for i in range(4)
        ]  # fmt: skip
        b.create_db(legacy / "cache" / "db" / "mt-bench" / f"gpt-4-{f}.db", b.S0_DDL, rows)
    descriptor_file = tmp_path / "descriptor.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="gpt-4-judge").model_dump_json())
    return ("import", str(legacy), "--descriptor", str(descriptor_file), "--task", "mt-bench", "--json")


def test_import_a_legacy_cache_onto_a_server(pg_url: str, tmp_path: Path) -> None:
    args = (*_legacy_judge_cache(tmp_path), "--store-url", pg_url)
    assert as_json(judgestore(*args))["totals"]["imported"] == 4
    assert as_json(judgestore(*args))["totals"]["already_present"] == 4
    (listed,) = as_json(judgestore("ls", "--json", "--store-url", pg_url))
    assert (listed["role"], listed["rows"]) == ("judgements", 4)


def test_an_import_onto_a_server_it_cannot_use_stops_at_once_with_the_servers_reason(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    """Each source was reported failed, every row of it counted "failed", one connection attempt after another."""
    result = judgestore(*_legacy_judge_cache(tmp_path, files=3), "--store-url", pg_cluster.url("no_such_database"))
    error = orjson.loads(result.stderr)
    assert result.exit_code == 1 and not result.stdout, result.output
    assert error["type"] == "ServerURLError" and "createdb" in error["error"] and not error.get("notes"), error


def test_an_import_the_server_leaves_midway_says_what_it_imported_before(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It stopped with the server's error alone: nothing said the first source's rows were in the store."""
    import store.legacy.writer as writer

    written = writer._outcomes_written
    calls: list[int] = []

    def the_server_goes_away(*args: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise ServerUnavailableError(pg_url, "the server closed the connection")
        return written(*args)

    monkeypatch.setattr(writer, "_outcomes_written", the_server_goes_away)
    args = (*_legacy_judge_cache(tmp_path, files=3), "--store-url", pg_url)
    result = judgestore(*args)
    error = orjson.loads(result.stderr)
    assert result.exit_code == 1 and error["type"] == "ServerUnavailableError", result.output
    assert "Before it, 4 rows were imported (kept): run the same import again" in " ".join(error["notes"])
    monkeypatch.undo()
    again = as_json(judgestore(*args))["totals"]
    assert (again["already_present"], again["imported"]) == (4, 8)


def test_an_explicit_folder_wins_over_the_url_in_the_environment(pg_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    with Store(Settings(), root=folder) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="org/m")).count()
    env = {"JUDGESTORE_STORE_URL": pg_url}
    from_env = judgestore("ls", "--json", env=env)  # the server, which holds no store yet
    refused = orjson.loads(from_env.stderr)
    assert from_env.exit_code == 1 and refused["type"] == "StoreMissingError" and "no registry" in refused["error"]
    (from_folder,) = as_json(judgestore("ls", "--json", "--store-root", str(folder), env=env))
    assert from_folder["path"].startswith(str(folder))
    both = judgestore("ls", "--store-root", str(folder), "--store-url", pg_url)
    assert both.exit_code == 2 and "give one" in both.stderr  # a usage error


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://judgestore@127.0.0.1:1/nowhere", "cannot reach the server"),
        ("postgresql+psycopg://", "cannot reach the server"),  # the default socket, where no server runs
        # was: 'the transaction was rolled back ... report this message'
        ("postgresql+psycopg://judgestore@/x?host=/tmp&foo=bar", "the URL names an option libpq does not know"),
        # was: 'failed in a way judgestore has no name for ... report this message' (psycopg's own check)
        ("postgresql+psycopg://judgestore@/x?host=/tmp&connect_timeout=abc", "gives a connection option a value"),
        ("postgresql+psycopg://judgestore@/x?host=/tmp&sslmode=bogus", "gives a connection option a value"),
        ("postgresql+psycopg://judgestore@/x?host=/tmp&port=abc", "gives a connection option a value"),
        ("postgresql+psycopg://judgestore@/x?host=/tmp&port=99999", "gives a connection option a value"),
    ],
)
def test_a_bad_url_is_one_clear_line_and_exit_1(url: str, expected: str, tmp_path: Path) -> None:
    for args in (("ls",), ("db", "upgrade"), ("verify",)):
        result = judgestore(*args, "--store-url", url, "--json")
        assert result.exit_code == 1, (args, result.output)
        error = json.loads(result.stderr)
        assert expected in error["error"] and error["type"].endswith("Error"), error
        assert "Traceback" not in result.output


@pytest.mark.parametrize("setting", ["statement_timeout%3Dabc", "no_such_setting%3D1"])
def test_a_setting_the_server_refuses_in_the_urls_options_says_to_fix_the_url(pg_url: str, setting: str) -> None:
    """The server refusing `options=-c statement_timeout=abc` was reported as a server that cannot be reached (was)."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}options=-c%20{setting}"
    result = judgestore("ls", "--store-url", url, "--json")
    error = json.loads(result.stderr)
    assert result.exit_code == 1 and error["type"] == "ServerURLError", error
    assert "a setting it refuses" in error["error"] and "cannot reach" not in error["error"]


def test_a_bad_url_names_the_variable_or_the_option_it_came_from() -> None:
    """Was: 'store URL driver ... is not supported', and nothing said where the URL came from."""
    for url, said in (
        ("postgresq://x@/y", "driver 'postgresq' is not supported"),
        ("not a url", "not a store URL"),
        ("postgresql+psycopg://x@localhost:65536/y", "port 65536 is not a TCP port"),  # exit 1 on connecting (was)
        ("postgresql+psycopg://x@localhost:0/y", "port 0 is not a TCP port"),
    ):
        for args, env, named in (
            (["ls"], {"JUDGESTORE_STORE_URL": url}, "JUDGESTORE_STORE_URL"),
            (["ls", "--store-url", url], {}, "--store-url"),
            (["copy", "--from-url", url, "--to-root", "elsewhere", "--dry-run"], {}, "--from-url"),
        ):
            result = judgestore(*args, "--json", env=env)
            if named.startswith("--"):  # a value given on the command line: a usage error (exit 1, was)
                shown = " ".join(result.stderr.split())
                assert result.exit_code == 2 and f"Invalid value for '{named}': " in shown and said in shown, shown
                continue
            error = json.loads(result.stderr)  # the environment's: the command's error
            assert result.exit_code == 1 and error["type"] == "InvalidInputError", result.output
            assert error["error"].startswith(f"{named}: ") and said in error["error"], error


@pytest.mark.parametrize("backend", ["folder", "server"])
def test_the_worked_example_revision_upgrades_either_backend_from_the_command_line(
    backend: str, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revision like docs/schema-evolution.md's (tests/store/revisions: judgements.reviewer_note) on a folder and
    on a server."""
    store = ("--store-root", str(tmp_path / "folder")) if backend == "folder" else ("--store-url", pg_url)
    settings = Settings(store_root=tmp_path / "folder", store_url=pg_url if backend == "server" else None)
    with Store(settings) as opened:
        for i in range(2):
            opened.database("judgements", "t", ModelDescriptor(provider="vllm", model=f"m{i}")).put_many(
                [judgement_record(k) for k in range(i + 3)]
            )
    pretend_shipped_scripts_are(read_script_directory(SYNTHETIC_REVISIONS), monkeypatch)

    status = judgestore("db", "status", "--json", *store)
    assert status.exit_code == 1 and {d["state"] for d in orjson.loads(status.stdout)["databases"]} == {"behind"}
    refused = judgestore("query", *store)
    assert refused.exit_code == 1 and "judgestore db upgrade" in refused.stderr
    # was: "the upgrade also keeps one" on a server too, whose upgrade keeps no backup
    assert "a server's keeps none: use pg_dump" in " ".join(refused.stderr.split())
    dry = as_json(judgestore("db", "upgrade", "--dry-run", "--json", *store))
    assert (
        dry["dry_run"]
        and [(r["outcome"], r["from_revision"], r["to_revision"]) for r in dry["results"]]
        == [("would_upgrade", SHIPPED_HEAD, SYNTHETIC_HEAD)] * 2
    )
    assert sorted(r["rows"]["judgements"] for r in dry["results"]) == [3, 4]
    still = orjson.loads(judgestore("db", "status", "--json", *store).stdout)["databases"]
    assert {d["state"] for d in still} == {"behind"}  # the dry run changed nothing
    upgraded = as_json(judgestore("db", "upgrade", "--json", *store))["results"]
    assert [(r["outcome"], r["from_revision"], r["to_revision"]) for r in upgraded] == [
        ("upgraded", SHIPPED_HEAD, SYNTHETIC_HEAD)
    ] * 2
    assert sorted(r["rows"]["judgements"] for r in upgraded) == [3, 4]
    again = as_json(judgestore("db", "upgrade", "--json", *store))["results"]
    assert {r["outcome"] for r in again} == {"up-to-date"}
    assert as_json(judgestore("verify", "--json", *store))["rows_checked"] == 7
    with Store(settings, readonly=True) as opened:
        for location in opened.locations():
            assert opened.open(location).count() == int(location.model[1:]) + 3
            if backend == "folder":
                engine = create_engine(f"sqlite:///{location.db_path(tmp_path / 'folder')}")
                schema = None
            else:
                engine, schema = create_engine(pg_url), schema_name(location)
            with engine.connect() as conn:
                assert "reviewer_note" in {c["name"] for c in inspect(conn).get_columns("judgements", schema=schema)}
            engine.dispose()


def _server_snapshot(pg_cluster: Cluster, database: str) -> list[Any]:
    """Every table of every judgestore schema with a digest of its rows, and the registry's own tables."""
    tables = pg_cluster.sql(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema LIKE 'js\\_%' OR table_schema = 'judgestore' ORDER BY 1, 2",
        database,
    )
    digests = [
        pg_cluster.sql(
            f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM \"{s}\".\"{n}\" t", database
        )
        for s, n in tables
    ]
    return [*tables, *digests]


DAMAGED_SCHEMAS = {
    "an edited registry row": "UPDATE judgestore.registry SET metadata_json = replace(metadata_json, '\"t\"', "
    "'\"u\"') WHERE schema_name = '{schema}'",
    "a dropped table": 'DROP TABLE "{schema}".completions',
    "a foreign schema": 'DROP TABLE "{schema}".judgestore_alembic_version',
}


@pytest.mark.parametrize("kind", list(DAMAGED_SCHEMAS))
def test_ls_and_stats_list_a_damaged_schema_with_the_good_ones_and_exit_1(
    kind: str, pg_url: str, pg_cluster: Cluster
) -> None:
    with Store(Settings(), url=pg_url) as opened:
        damaged = opened.database("completions", "t", ModelDescriptor(provider="vllm", model="bad"))
        damaged.put_many([completion_record(i) for i in range(3)])
        opened.database("completions", "t", ModelDescriptor(provider="vllm", model="good")).put_many(
            [completion_record(i) for i in range(4)]
        )
        name = schema_name(damaged.location)
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(DAMAGED_SCHEMAS[kind].format(schema=name), database)
    before = _server_snapshot(pg_cluster, database)

    listed = judgestore("ls", "--json", "--store-url", pg_url)
    assert listed.exit_code == 1 and listed.stderr == "", listed.output
    found = {d["model"]: (d["rows"], d["ok"]) for d in orjson.loads(listed.stdout)}
    assert found == {"bad": (None, False), "good": (4, True)}, listed.stdout
    table = judgestore("ls", "--store-url", pg_url)
    assert table.exit_code == 1 and "2 databases, 4 rows" in table.stdout
    assert "1 of 2 databases could not be read" in table.stderr and "`judgestore db status`" in table.stderr
    stats = judgestore("stats", "--json", "--store-url", pg_url)
    assert stats.exit_code == 1 and stats.stderr == "", stats.output
    report = orjson.loads(stats.stdout)
    assert report["ok"] is False and (report["totals"]["unreadable"], report["totals"]["rows"]["rows"]) == (1, 4)
    stats_table = judgestore("stats", "--store-url", pg_url)
    assert stats_table.exit_code == 1 and "1 of 2 databases could not be read" in stats_table.stderr
    assert _server_snapshot(pg_cluster, database) == before  # listing changed nothing on the server


@pytest.mark.parametrize("command", [["ls"], ["query", "--format", "jsonl"], ["db", "upgrade"], ["verify"]])
def test_a_dropped_registry_beside_descriptor_schemas_is_said_so_and_nothing_is_written(
    command: list[str], pg_url: str, pg_cluster: Cluster
) -> None:
    """Was: "this database holds no judgestore store", `db upgrade` saying "No databases" and exiting 0, and a
    write making a new, empty registry beside the orphaned schemas."""
    with Store(Settings(), url=pg_url) as opened:
        opened.database("completions", "t", ModelDescriptor(provider="vllm", model="m")).put_many(
            [completion_record(i) for i in range(3)]
        )
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql("DROP TABLE judgestore.registry", database)
    before = _server_snapshot(pg_cluster, database)
    result = judgestore(*command, "--json", "--store-url", pg_url)
    assert result.exit_code == 1, result.output
    error = orjson.loads(result.stderr)
    assert error["type"] == "ServerSchemaError" and "registry (table judgestore.registry) is missing" in error["error"]
    assert "3 rows in all" in error["error"] and "pg_restore" in error["error"]
    with Store(Settings(), url=pg_url) as opened, pytest.raises(ServerSchemaError, match=r"registry .* is missing"):
        opened.database("completions", "t", ModelDescriptor(provider="vllm", model="other"))
    assert _server_snapshot(pg_cluster, database) == before  # no registry made again, nothing written


def test_ls_with_row_filters_lists_every_schema_when_one_cannot_be_counted(pg_url: str, pg_cluster: Cluster) -> None:
    """A schema at head whose table lost a column: ls reads its revision and row count, its filter's count fails.
    The schema is listed as unreadable with the error, the others with what they match, and ls exits 1."""
    with Store(Settings(), url=pg_url) as opened:
        damaged = opened.database("completions", "t", ModelDescriptor(provider="vllm", model="bad"))
        damaged.put_many([completion_record(i) for i in range(3)])
        opened.database("completions", "t", ModelDescriptor(provider="vllm", model="good")).put_many(
            [completion_record(i) for i in range(4)]
        )
        name = schema_name(damaged.location)
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(f'ALTER TABLE "{name}".completions DROP COLUMN finish_reason', database)
    before = _server_snapshot(pg_cluster, database)

    listed = judgestore("ls", "--json", "--finish-reason", "stop", "--store-url", pg_url)
    assert listed.exit_code == 1 and listed.stderr == "", listed.output
    found = {d["model"]: (d["state"], d["ok"], d["matching"]) for d in orjson.loads(listed.stdout)}
    assert found == {"bad": ("unreadable", False, None), "good": ("current", True, 4)}, listed.stdout
    table = judgestore("ls", "--finish-reason", "stop", "--store-url", pg_url)
    assert table.exit_code == 1 and "2 databases, 4 rows (4 matching)" in table.stdout, table.output
    assert "1 of 2 databases could not be read" in table.stderr
    assert _server_snapshot(pg_cluster, database) == before


# ---------------------------------------------------------------- passwords never print

PASSWORD = "Zq7@Wx9:pw-secret"  # an @ and a : in it, as real passwords have
WRONG = "Yy3@Vv8:no-guess"


def fragments(password: str) -> list[str]:
    """The password and every piece a parser could cut it into (at its @ and :)."""
    return [password, *password.replace(":", "@").split("@")]


def password_spellings(user: str, database: str, socket: str, password: str, home: Path) -> dict[str, Any]:
    """Each way a user can give the password: (URL, environment)."""
    base = f"postgresql+psycopg://{user}@/{database}?host={socket}"
    pgpass = home / ".pgpass"
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    pgpass.write_text(f"*:*:*:{user}:{escaped}\n")
    pgpass.chmod(0o600)
    return {
        "user-part, encoded": (f"postgresql+psycopg://{user}:{quote(password, safe='')}@/{database}?host={socket}", {}),
        "user-part, @ unencoded": (f"postgresql+psycopg://{user}:{password}@/{database}?host={socket}", {}),
        "query parameter": (f"{base}&password={quote(password, safe='')}", {}),
        "PGPASSWORD": (base, {"PGPASSWORD": password}),
        "~/.pgpass": (base, {"HOME": str(home)}),
    }


@pytest.mark.parametrize("right", [True, False], ids=["right-password", "wrong-password"])
def test_no_password_spelling_ever_prints(right: bool, pg_url: str, pg_cluster: Cluster, tmp_path: Path) -> None:
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE pw_user LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; "
        f"ALTER ROLE pw_user PASSWORD '{PASSWORD}'"
    )
    pg_cluster.sql(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO pw_user')
    folder = tmp_path / "folder"
    with Store(Settings(), root=folder) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="org/m")).put_many(
            [completion_record(i) for i in range(3)]
        )
    given = PASSWORD if right else WRONG
    home = tmp_path / "home"
    home.mkdir()
    for spelling, (url, env) in password_spellings("pw_user", database, pg_cluster.socket_dir, given, home).items():
        runs = {
            "copy": judgestore("copy", "--from-root", str(folder), "--to-url", url, env=env),
            "copy --json": judgestore("copy", "--from-root", str(folder), "--to-url", url, "--json", env=env),
            "ls": judgestore("ls", "--store-url", url, env=env),
            "ls --json": judgestore("ls", "--json", "--store-url", url, env=env),
            "db status": judgestore("db", "status", "--json", "--store-url", url, env=env),
            "verify": judgestore("verify", "--store-url", url, env=env),
            "query": judgestore("query", "--format", "jsonl", "--store-url", url, env=env),
            "stats": judgestore("stats", "--store-url", url, env=env),
        }
        for command, result in runs.items():
            printed = result.stdout + result.stderr
            assert not [f for f in fragments(given) if f in printed], (spelling, command, printed)
            assert "Traceback" not in printed
            if right:
                assert result.exit_code == 0, (spelling, command, printed)
            else:
                assert result.exit_code == 1 and "refused the credentials" in printed, (spelling, command, printed)
        if right:
            (listed,) = orjson.loads(runs["ls --json"].stdout)
            assert listed["rows"] == 3 and listed["path"].startswith("postgresql+psycopg://pw_user")
            assert "pw_user@" in runs["ls"].stdout.replace("\n", "") or "pw_user:***@" in runs["ls"].stdout


@pytest.mark.parametrize("wrong", ["password", "failed", "auth"])
def test_a_wrong_password_that_is_a_word_of_the_refusal_is_still_a_refusal_of_the_credentials(
    wrong: str, pg_url: str, pg_cluster: Cluster
) -> None:
    """The password was blanked out of the driver's message before it was read: "password authentication failed"
    became "*** authentication failed", and the refusal was said as a server that cannot be reached (was)."""
    database = make_url(pg_url).database
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE pw_user LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; "
        f"ALTER ROLE pw_user PASSWORD '{PASSWORD}'"
    )
    url = f"postgresql+psycopg://pw_user:{wrong}@/{database}?host={pg_cluster.socket_dir}"
    result = judgestore("ls", "--json", "--store-url", url)
    error = orjson.loads(result.stderr)
    assert result.exit_code == 1 and error["type"] == "ServerAuthError", error
    assert "refused the credentials" in error["error"] and "cannot reach" not in error["error"]


@pytest.mark.parametrize("assignment", ["""usage = '{"a": 1e999}'""", "created_at = 'infinity'"])
def test_a_server_value_its_type_cannot_read_fails_reads_cleanly_and_its_row_can_be_deleted(
    pg_url: str, pg_cluster: Cluster, tmp_path: Path, assignment: str
) -> None:
    """A JSON value another tool wrote (the server's json type takes 1e999) was a traceback; a time of 'infinity'
    was 'the server refused a value ... please report this value', and `delete --input-hash`, the step the error
    advises, found no row: the delete's time bound left it out (was)."""
    with Store(url=pg_url) as store:
        store.database("completions", "t", ModelDescriptor(provider="vllm", model="m")).put_many(
            [completion_record(i) for i in range(3)]
        )
        (location,) = store.locations()
    victim = completion_record(1).input_hash
    pg_cluster.sql(
        f"""UPDATE "{schema_name(location)}".completions SET {assignment} WHERE input_hash = '{victim}'""",
        make_url(pg_url).database,
    )
    for args in (["query", "--store-url", pg_url], ["copy", "--from-url", pg_url, "--to-root", str(tmp_path / "c")]):
        result = judgestore(*args)
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert "holds a value its column's type cannot read" in " ".join(result.output.split())
    with Store(url=pg_url, readonly=True) as store:
        assert store.open(location).count() == 3
    deleted = judgestore("delete", "--store-url", pg_url, "--input-hash", victim, "--yes", "--json")
    assert orjson.loads(deleted.stdout)["deleted"] == 1, deleted.output
    listed = judgestore("query", "--store-url", pg_url, "--json")
    assert listed.exit_code == 0 and {row["input_hash"] for row in orjson.loads(listed.stdout)} == {
        completion_record(i).input_hash for i in (0, 2)
    }


def test_a_schema_whose_registry_row_was_deleted_is_reported_and_never_advised_dropped(
    pg_url: str, pg_cluster: Cluster
) -> None:
    """verify said 'no problems' (the schema was invisible), and a write advised dropping it, rows and all (was)."""
    descriptor = ModelDescriptor(provider="vllm", model="m")
    with Store(url=pg_url) as store:
        store.database("completions", "t", descriptor).put_many([completion_record(i) for i in range(3)])
        (location,) = store.locations()
    pg_cluster.sql("DELETE FROM judgestore.registry WHERE task = 't'", make_url(pg_url).database)
    verified = judgestore("verify", "--store-url", pg_url, "--json")
    assert verified.exit_code == 1, verified.output
    (problem,) = orjson.loads(verified.stdout)["problems"]
    assert problem["kind"] == "stray" and problem["path"] == schema_name(location)
    assert "holds judgestore's tables (3 rows) but no registry row" in problem["message"]
    with Store(url=pg_url) as store, pytest.raises(Exception) as refused:
        store.database("completions", "t", descriptor).put_many([completion_record(9)])
    assert "Restore its row of judgestore.registry" in str(refused.value) and "Drop it," not in str(refused.value)
    rows = pg_cluster.sql(f'SELECT count(*) FROM "{schema_name(location)}".completions', make_url(pg_url).database)
    assert rows == [(3,)]
