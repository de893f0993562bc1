"""`judgestore hub push` / `hub fetch`: in-process through typer's CliRunner, and as real processes on loopback.

The subprocess tests run ``python -m store hub ...`` in effect, with the
socket guard installed in the child too.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from store.backends.sqlite.database import SqliteDatabase
from store.cli.app import build_app
from store.settings import Settings
from store.store import Store
from tests.factories import file_digests, stamp
from tests.fake_hub import FakeHub
from tests.interrupts import ctrl_c_on_call
from tests.sync.helpers import (
    QWEN,
    QWEN_FOLDER,
    READ_TOKEN,
    REPO,
    WRITE_TOKEN,
    completions,
    fill,
    hub_remote,
    judgements,
    rows,
)

# huggingface_hub's LFS upload passes a file as `data=`, which httpx2 deprecates; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>' to upload raw bytes:DeprecationWarning")
ROOT = Path(__file__).resolve().parents[2]
CHILD = (
    "import sys; from tests import socket_guard; socket_guard.install(); "
    "sys.argv.insert(1, 'hub'); from store.cli.app import main; main()"
)


def hub_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(build_app(), ["hub", *args], env={"COLUMNS": "200", **(env or {})})


def filled_store(root: Path) -> Path:
    with Store(Settings(), root=root) as store:
        fill(store, completions(range(7)), judgements(range(3)))
    return root


def read_rows(root: Path) -> dict[Any, Any]:
    with Store(Settings(), root=root) as store:
        return rows(store)


# ---------------------------------------------------------------- in-process


def test_a_selection_is_required(tmp_path: Path) -> None:
    result = hub_cli("push", "--dir", str(tmp_path / "shared"), "--store-root", str(tmp_path / "s"))
    assert result.exit_code == 2 and "--all" in result.output
    both = hub_cli("fetch", "--dir", str(tmp_path), "--all", "--role", "completions")
    assert both.exit_code == 2


def test_a_bad_sharing_setting_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGESTORE_MAX_SHARD_BYTES", "0")
    for command in ("push", "fetch"):
        result = hub_cli(command, "--dir", str(tmp_path / "shared"), "--all", "--store-root", str(tmp_path / "s"))
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert result.stderr.startswith("Error: invalid setting in the environment: JUDGESTORE_MAX_SHARD_BYTES")


def test_no_remote_named_is_a_one_line_error(tmp_path: Path) -> None:
    result = hub_cli("push", "--all", "--store-root", str(tmp_path / "s"))
    assert result.exit_code == 1
    assert "pass --repo ORG/NAME" in result.stderr and "JUDGESTORE_HUB_REPO" in result.stderr


@pytest.mark.parametrize("repo", ["../x", "org/na me", "a/b/c", "name", "org/"])
def test_a_repo_that_is_no_hub_repository_id_is_refused_before_anything_is_written(tmp_path: Path, repo: str) -> None:
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    for command in ("push", "fetch"):
        result = hub_cli(command, "--repo", repo, "--all", "--store-root", str(store))
        assert result.exit_code == 2 and "--repo must be ORG/NAME" in result.stderr, result.output  # a usage error
    assert file_digests(store) == before  # no bookkeeping of a remote that never answered


@pytest.mark.parametrize("inside", [".", "shared", "completions"])
def test_a_shared_folder_inside_the_store_is_refused_and_nothing_is_written(tmp_path: Path, inside: str) -> None:
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    shared = store / inside
    for command in (["push", "--create-repo", "--all"], ["fetch", "--all"]):
        result = hub_cli(*command, "--dir", str(shared), "--store-root", str(store))
        assert result.exit_code == 1, result.output
        assert "is inside the store" in result.stderr and "give a folder outside the store" in result.stderr
    assert file_digests(store) == before and not (store / "shared").exists()  # --create-repo made nothing


def test_a_shared_folder_whose_path_is_not_utf8_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    shared = tmp_path / os.fsdecode(b"caf\xe9")  # a Latin-1 name
    for command in (["push", "--create-repo", "--all"], ["fetch", "--all"]):
        result = hub_cli(*command, "--dir", str(shared), "--store-root", str(store))
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output  # was: a traceback
        assert "the shared folder's path is not valid UTF-8 text; rename it" in result.stderr
    assert file_digests(store) == before and not shared.exists()


def test_a_shared_folder_that_is_a_file_is_named_as_one_and_left_alone(tmp_path: Path) -> None:
    """Was: 'the folder does not exist' for push and fetch, and a FileExistsError for push --create-repo."""
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    shared = tmp_path / "shared.txt"
    shared.write_text("notes")
    for command in (["push", "--create-repo", "--all"], ["push", "--all"], ["fetch", "--all"]):
        result = hub_cli(*command, "--dir", str(shared), "--store-root", str(store), "--json")
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert json.loads(result.stderr) == {
            "error": f"dir:{shared}: this is a file, not a folder; give the shared folder's path",
            "type": "InvalidInputError",
        }
    assert file_digests(store) == before and shared.read_text() == "notes"


def test_a_fetch_from_a_shared_folder_that_is_not_there_creates_nothing(tmp_path: Path) -> None:
    """It failed, and left a new store's .judgestore-sync (lock, bookkeeping) behind (was)."""
    store = tmp_path / "new-store"
    result = hub_cli("fetch", "--all", "--dir", str(tmp_path / "nowhere"), "--store-root", str(store), "--json")
    assert result.exit_code == 1 and "the folder does not exist" in json.loads(result.stderr)["error"]
    assert not store.exists()


def test_a_push_to_a_remote_that_is_not_there_exports_and_creates_nothing(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It exported every folder's rows into shards, then failed at the remote, and left .judgestore-sync (lock,
    bookkeeping, staging) behind (was)."""
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    monkeypatch.setattr(
        importlib.import_module("store.sync.push"),
        "_plan_folder",
        lambda *_, **__: pytest.fail("a folder was exported"),
    )
    for dry_run in ([], ["--dry-run"]):
        result = hub_cli("push", "--all", *dry_run, "--dir", str(tmp_path / "nowhere"), "--store-root", str(store),
                         "--json")  # fmt: skip
        assert result.exit_code == 1 and "the folder does not exist" in json.loads(result.stderr)["error"]
    missing = run_cli("push", "--repo", "org/no-such-cache", "--all", "--json", "--store-root", str(store), hub=hub,
                      tmp_path=tmp_path)  # fmt: skip
    assert missing.returncode == 1 and orjson.loads(missing.stderr)["type"] == "RemoteNotFoundError", missing.stderr
    assert file_digests(store) == before and not (store / ".judgestore-sync").exists()
    assert not (tmp_path / "nowhere").exists()


def test_a_push_from_a_store_that_is_not_there_is_a_store_missing_error(tmp_path: Path) -> None:
    """It was an InvalidInputError without the store's path, where every other command names it (was)."""
    missing = tmp_path / "no-such-store"
    result = hub_cli("push", "--all", "--dir", str(tmp_path / "shared"), "--store-root", str(missing), "--json")
    assert result.exit_code == 1
    error = json.loads(result.stderr)
    assert error["type"] == "StoreMissingError" and error["path"] == str(missing)
    assert "there is no store to push" in error["error"] and not missing.exists()


def test_create_repo_of_a_folder_that_cannot_be_made_names_the_shared_folder(tmp_path: Path) -> None:
    """Its error was the store's, advising read-only commands and another --store-root (was)."""
    store = filled_store(tmp_path / "store")
    before = file_digests(store)
    notes = tmp_path / "notes.txt"
    notes.write_text("a file where the shared folder's parent should be")
    result = hub_cli("push", "--all", "--create-repo", "--dir", str(notes / "shared"), "--store-root", str(store))
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert f"dir:{notes / 'shared'}: cannot create the shared folder (Not a directory)" in said, said
    assert "Read-only commands" not in said and file_digests(store) == before


def test_push_and_fetch_through_a_shared_folder(tmp_path: Path) -> None:
    alice, bob, shared = filled_store(tmp_path / "alice"), tmp_path / "bob", tmp_path / "shared"

    pushed = hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice))
    assert pushed.exit_code == 0, pushed.output
    assert "Pushed to dir:" in pushed.stdout and "10 rows" in pushed.stdout and "Qwen/Qwen3-8B" in pushed.stdout

    preview = hub_cli("fetch", "--dir", str(shared), "--all", "--dry-run", "--store-root", str(bob))
    assert preview.exit_code == 0 and "Would download" in preview.stdout
    assert "new row" not in preview.stdout  # a dry run downloads nothing: it said "0 new rows" (was)
    assert not (bob / ".judgestore-sync").exists()  # was: a preview created the sync workspace (lock, sync.db)
    assert read_rows(bob) == {}

    fetched = hub_cli("fetch", "--dir", str(shared), "--task", "mt-bench", "--json", "--store-root", str(bob))
    assert fetched.exit_code == 0, fetched.output
    report = orjson.loads(fetched.stdout)
    assert report["ok"] and report["rows_inserted"] == 7 and report["folders"][0]["model"] == "Qwen/Qwen3-8B"
    rest = hub_cli("fetch", "--dir", str(shared), "--all", "--dry-run", "--json", "--store-root", str(bob))
    assert rest.exit_code == 0, rest.output  # the workspace is there now: its bookkeeping skips what was fetched
    planned = orjson.loads(rest.stdout)
    assert (planned["skipped"], len(planned["folders"])) == (1, 1)
    assert (planned["rows_read"], planned["rows_inserted"], planned["folders"][0]["rows_inserted"]) == (None,) * 3

    again = hub_cli("push", "--dir", str(shared), "--all", "--store-root", str(bob))
    assert again.exit_code == 0 and "Nothing to push" in again.stdout
    # What it knows is what it recorded (it said the remote "has every selected row"; a shard removed by hand)
    assert "every selected row is recorded as on it (pushed or fetched), or listed there" in " ".join(
        again.stdout.split()
    )


def test_shards_the_remote_already_had_are_counted_as_among_those_pushed(tmp_path: Path) -> None:
    """A copy of a store pushes the same shards: the report says they were there, not that it sent them."""
    alice, shared = filled_store(tmp_path / "alice"), tmp_path / "shared"
    bob, carol = tmp_path / "bob", tmp_path / "carol"
    for copy in (bob, carol):  # copied by hand, without the bookkeeping
        shutil.copytree(alice, copy, ignore=shutil.ignore_patterns(".judgestore-sync"))
    assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice)).exit_code == 0

    text = hub_cli("push", "--dir", str(shared), "--all", "--store-root", str(bob))
    pushed = hub_cli("push", "--dir", str(shared), "--all", "--json", "--store-root", str(carol))

    assert text.exit_code == 0 and pushed.exit_code == 0, text.output + pushed.output
    report = orjson.loads(pushed.stdout)
    assert (report["shards"], report["already_present"]) == (2, 2)
    # was "2 shards, ...; 2 shards already there": read as four shards, two of them sent
    caption = " ".join(text.stdout.split())
    assert "2 shards, 10 rows" in caption and "2 of the shards already there, not sent again" in caption


def test_rows_another_store_answered_otherwise_are_counted_as_conflicts_not_dropped_silently(tmp_path: Path) -> None:
    """Two labs held other answers under keys 3 and 4; a fetch said only "rows_read 10, rows_inserted 8" and kept
    one answer of each, saying nothing of the other (was)."""
    alice, bob, carol, shared = tmp_path / "alice", tmp_path / "bob", tmp_path / "carol", tmp_path / "shared"
    with Store(Settings(), root=alice) as store:
        fill(store, completions(range(5)))
    with Store(Settings(), root=bob) as store:
        fill(store, completions(range(3)) + completions([3, 4], completion="another answer"))
    for lab in (alice, bob):
        assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(lab)).exit_code == 0
    fetched = hub_cli("fetch", "--dir", str(shared), "--all", "--json", "--store-root", str(carol))
    assert fetched.exit_code == 0, fetched.output  # temperatures above 0 answer apart: reported, not a failure
    report = orjson.loads(fetched.stdout)
    assert (report["rows_read"], report["rows_inserted"], report["conflicts"]) == (10, 5, 2)
    assert report["folders"][0]["conflicts"] == 2
    into_bob = hub_cli("fetch", "--dir", str(shared), "--all", "--store-root", str(bob))
    assert "2 rows not imported: another answer is stored under its key here (kept)" in " ".join(
        into_bob.stdout.split()
    )
    stored = {record.completion for record in read_rows(bob).values()}
    assert "another answer" in stored  # bob's own answers are kept
    nothing = hub_cli("fetch", "--dir", str(shared), "--task", "mt-bench", "--store-root", str(carol))
    assert "(2 shards already here)" in nothing.stdout
    alone = tmp_path / "alone"
    with Store(Settings(), root=alone) as store:
        fill(store, completions(range(1)))
    assert hub_cli("push", "--dir", str(tmp_path / "one"), "--create-repo", "--all", "--store-root", str(alone))
    once = hub_cli("fetch", "--dir", str(tmp_path / "one"), "--all", "--store-root", str(alone))
    assert "(1 shard already here)" in once.stdout  # "1 shards" (was)


def test_a_fetch_dry_run_says_which_local_database_cannot_take_rows_as_the_fetch_will(tmp_path: Path) -> None:
    """It said it would download the folder's shards and exited 0; the fetch then failed the folder, exit 1 (was)."""
    alice, bob, shared = filled_store(tmp_path / "alice"), filled_store(tmp_path / "bob"), tmp_path / "shared"
    assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice)).exit_code == 0
    with closing(sqlite3.connect(bob / QWEN_FOLDER / "completions.db")) as db, db:
        db.execute("DROP TABLE claims")  # as revision 0005 left it
        db.execute("UPDATE judgestore_alembic_version SET version_num = '0005'")
    args = ("fetch", "--dir", str(shared), "--all", "--json", "--store-root", str(bob))
    for extra in (["--dry-run"], []):
        result = hub_cli(*args, *extra)
        assert result.exit_code == 1, (extra, result.output)
        report = orjson.loads(result.stdout)
        (failed,) = report["failed"]
        assert failed["path"] == QWEN_FOLDER and "local database cannot take rows" in failed["reason"], failed
        assert "schema revision 0005" in failed["reason"]
        assert [f["role"] for f in report["folders"]] == ["judgements"], (extra, report)
    upgrading = hub_cli(*args, "--dry-run", env={"JUDGESTORE_AUTO_UPGRADE": "1"})  # the fetch would upgrade it
    assert upgrading.exit_code == 0, upgrading.output
    assert [f["role"] for f in orjson.loads(upgrading.stdout)["folders"]] == ["completions"]  # the rest is here


def test_ctrl_c_as_the_store_closes_after_a_fetch_counts_what_it_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal landed in the store's close, every shard imported: "imported no shard ... run the same fetch
    again" (was)."""
    alice, bob, shared = filled_store(tmp_path / "alice"), tmp_path / "bob", tmp_path / "shared"
    assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice)).exit_code == 0
    real_close = Store.close

    def close_then_ctrl_c(self: Store) -> None:
        real_close(self)
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(Store, "close", close_then_ctrl_c)
        dry = hub_cli("fetch", "--dir", str(shared), "--all", "--json", "--dry-run", "--store-root", str(bob))
        result = hub_cli("fetch", "--dir", str(shared), "--all", "--json", "--store-root", str(bob))
    planned = orjson.loads(dry.stderr)  # a dry run imports nothing: it said "imported 2 shards" (was)
    assert dry.exit_code == 130 and planned["shards_imported"] == 0 and "dry run imports nothing" in planned["error"]
    assert result.exit_code == 130, result.output
    error = orjson.loads(result.stderr)
    assert (error["shards_imported"], error["rows_imported"]) == (2, 10), error
    assert len(read_rows(bob)) == 10


def test_fetch_reports_a_quarantined_shard_and_exits_1(tmp_path: Path) -> None:
    alice, shared = filled_store(tmp_path / "alice"), tmp_path / "shared"
    assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice)).exit_code == 0
    shard = next((shared / QWEN_FOLDER / "shards").iterdir())
    shard.write_bytes(shard.read_bytes()[:-8])

    # Wide enough for the whole message on one line, however long the temporary folder's path is (xdist's are longer).
    result = hub_cli(
        "fetch", "--dir", str(shared), "--all", "--store-root", str(tmp_path / "bob"), env={"COLUMNS": "1000"}
    )

    assert result.exit_code == 1
    assert "quarantined" in result.stdout and "truncated" in result.stdout and ".judgestore-sync" in result.stdout
    as_json = hub_cli("fetch", "--dir", str(shared), "--all", "--json", "--store-root", str(tmp_path / "bob"))
    assert as_json.exit_code == 1 and orjson.loads(as_json.stdout)["quarantined"][0]["path"].endswith(shard.name)


def test_fetch_into_a_database_at_another_revision_says_the_shards_were_found_not_imported(tmp_path: Path) -> None:
    alice, bob, shared = filled_store(tmp_path / "alice"), tmp_path / "bob", tmp_path / "shared"
    assert hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--store-root", str(alice)).exit_code == 0
    with Store(Settings(), root=bob) as store:  # bob's own row of the same folder, in a file an older release left
        fill(store, completions([99]))
        database = store.database("completions", "mt-bench", QWEN)
        assert isinstance(database, SqliteDatabase)
        db_path = database.path
    stamp(db_path, "0001")

    result = hub_cli(
        "fetch", "--dir", str(shared), "--task", "mt-bench", "--store-root", str(bob), env={"COLUMNS": "1000"}
    )

    assert result.exit_code == 1
    assert "Nothing new" not in result.stdout
    assert "Found new shards at dir:" in result.stdout and "none was imported: 1 failed" in result.stdout
    assert "local database cannot take rows" in result.stdout
    assert orjson.loads(hub_cli("fetch", "--dir", str(shared), "--task", "mt-bench", "--json", "--store-root",
                                str(bob)).stdout)["failed"]  # fmt: skip


def test_hub_errors_are_one_typed_line(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # HF_ENDPOINT is read when huggingface_hub is imported; in this process that already happened
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
    alice = filled_store(tmp_path / "alice")

    denied = hub_cli("push", "--repo", REPO, "--all", "--json", "--token", READ_TOKEN, "--store-root", str(alice))
    missing = hub_cli("fetch", "--repo", "org/nope", "--all", "--store-root", str(alice))

    assert denied.exit_code == 1 and orjson.loads(denied.stderr)["type"] == "RemoteAuthError"
    assert missing.exit_code == 1 and "--create-repo" in missing.stderr and "Traceback" not in missing.output


@pytest.mark.parametrize(
    ("token", "said"),
    [("", "the token is empty"), ("hf_secret_abc123\r", "control character"), ("hf_secrét_abc123", "not ASCII")],
)
def test_a_token_no_server_could_take_is_refused_at_once_and_never_shown(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, said: str
) -> None:
    """An empty --token (an unset variable) or one with a file's \\r: the client refused the header locally, which
    was retried for a minute and a half as a network failure, and each warning quoted the whole token (was)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
    alice = filled_store(tmp_path / "alice")
    before = read_rows(alice)
    for command in ("push", "fetch"):
        result = hub_cli(command, "--repo", REPO, "--all", "--json", "--token", token, "--store-root", str(alice))
        assert result.exit_code == 2, result.output
        assert "Invalid value for --token" in result.stderr and said in result.stderr
        assert "secret" not in result.output and "retrying" not in result.output
    assert read_rows(alice) == before
    assert hub.requests == []  # nothing was asked of the Hub
    shared = tmp_path / "shared"  # a folder remote takes no token: a script's --token "$UNSET" does no harm there
    shared.mkdir()
    pushed = hub_cli("push", "--dir", str(shared), "--all", "--json", "--token", token, "--store-root", str(alice))
    assert pushed.exit_code == 0 and orjson.loads(pushed.stdout)["ok"], pushed.output


def test_a_client_error_quoting_a_header_never_shows_the_token() -> None:
    import httpx

    from store.sync.hub import _classify

    failure = _classify(httpx.LocalProtocolError("Illegal header value b'Bearer hf_secret_abc123 '"))
    assert failure is not None and "hf_secret" not in failure.detail and "Bearer ***" in failure.detail


def test_a_push_to_a_new_branch_says_it_creates_it(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
    alice = filled_store(tmp_path / "alice")
    main_head = hub.repo(REPO).branches["main"]
    push = ("push", "--repo", REPO, "--revision", "exp", "--all", "--store-root", str(alice))

    dry = hub_cli(*push, "--dry-run")
    assert dry.exit_code == 0 and f"Would create the branch 'exp' of hf:{hub.endpoint}" in dry.stdout
    assert "exp" not in hub.repo(REPO).branches
    pushed = hub_cli(*push, "--json")
    assert pushed.exit_code == 0, pushed.output
    assert orjson.loads(pushed.stdout)["created_branch"] == {"name": "exp", "from_commit": main_head}
    again = hub_cli(*push)
    assert again.exit_code == 0 and "Nothing to push" in again.stdout and "branch" not in again.stdout
    assert "exp" in hub.repo(REPO).branches


@pytest.mark.parametrize(("landed", "json_output"), [("before", False), ("after", True)])
def test_ctrl_c_in_a_push_says_what_the_hub_confirmed_and_a_rerun_resumes(
    hub: FakeHub, tmp_path: Path, landed: str, json_output: bool
) -> None:
    """Two batches (one commit each): the completions folder, then the judgements one. Ctrl-C lands as the second
    is about to go, or just after the Hub committed it, before it was recorded here. (Was: exit 130, nothing said.)"""
    import huggingface_hub.constants

    from store.sync import HubRemote, fetch

    real_init = HubRemote.__init__

    def two_files_per_commit(self: HubRemote, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **{**kwargs, "max_files_per_add": 2})  # a folder's metadata.json and its shard

    alice = filled_store(tmp_path / "alice")
    push = ("push", "--repo", REPO, "--all", "--store-root", str(alice))
    # HF_ENDPOINT is read when huggingface_hub is imported; in this process that already happened. Only while the
    # CLI runs: the client's downloads, given an endpoint of their own, would go to its import-time default.
    with pytest.MonkeyPatch.context() as interrupting:
        interrupting.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
        interrupting.setattr(HubRemote, "__init__", two_files_per_commit)
        ctrl_c_on_call(interrupting, HubRemote, "add_files", 2, after=landed == "after")
        result = hub_cli(*push, *(["--json"] if json_output else []))
    assert result.exit_code == 130 and result.stdout == ""
    on_hub = [path for path in hub.files(REPO) if path.endswith(".jsonl.gz")]
    assert len(on_hub) == (1 if landed == "before" else 2) and QWEN_FOLDER in on_hub[0]
    said = f"interrupted; hf:{hub.endpoint}/datasets/{REPO} confirmed 1 shard (7 rows) in 1 commit before it"
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"] and "run the same push again" in error["error"]
        assert (error["shards_pushed"], error["rows_pushed"], len(error["commits"])) == (1, 7, 1)
    else:
        assert said in " ".join(result.stderr.split()) and "run the same push again" in result.stderr

    with pytest.MonkeyPatch.context() as rerun:
        rerun.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
        again = hub_cli(*push, "--json")
    assert again.exit_code == 0, again.output
    report = orjson.loads(again.stdout)
    # before: the judgements' shard is sent now; after: the Hub had it, and the push confirms it (sends nothing)
    assert (report["rows"], report["recovered"]) == ((3, 0) if landed == "before" else (0, 1))
    assert len([path for path in hub.files(REPO) if path.endswith(".jsonl.gz")]) == 2  # nothing sent twice
    with Store(Settings(), root=tmp_path / "bob") as bob:
        assert fetch(bob, hub_remote(hub)).rows == 10 and rows(bob) == read_rows(alice)  # nothing lost


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_in_a_fetch_says_what_was_imported_and_a_rerun_imports_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Two folders, one shard each: Ctrl-C lands as the judgements' shard is about to be imported, after the
    completions' one was. (Was: exit 130, nothing said.)"""
    from store.sync.fetch import ShardImporter

    alice, shared, bob = filled_store(tmp_path / "alice"), tmp_path / "shared", tmp_path / "bob"
    assert hub_cli("push", "--dir", str(shared), "--all", "--create-repo", "--store-root", str(alice)).exit_code == 0
    fetch = ("fetch", "--dir", str(shared), "--all", "--store-root", str(bob))
    with pytest.MonkeyPatch.context() as interrupting:
        groups = ctrl_c_on_call(interrupting, ShardImporter, "_group", 2)
        result = hub_cli(*fetch, *(["--json"] if json_output else []))
    assert result.exit_code == 130 and result.stdout == "" and len(groups) == 2
    said = f"interrupted; imported 1 shard (7 rows) from dir:{shared} before it, kept: run the same fetch again"
    if json_output:
        error = orjson.loads(result.stderr)
        assert error["type"] == "Interrupted" and said in error["error"]
        assert (error["shards_imported"], error["rows_imported"]) == (1, 7)
    else:
        assert said in " ".join(result.stderr.split())
    with Store(Settings(), root=bob, readonly=True) as store:
        assert len(rows(store)) == 7  # what the line said is what is here

    again = hub_cli(*fetch, "--json")
    assert again.exit_code == 0, again.output
    report = orjson.loads(again.stdout)
    assert (report["shards"], report["rows_inserted"], report["skipped"]) == (1, 3, 1)
    assert read_rows(bob) == read_rows(alice)


def test_ctrl_c_midway_through_a_folder_counts_the_shards_it_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row a shard, one shard a transaction: Ctrl-C before the third of the completions folder's seven."""
    from store.sync.fetch import ShardImporter

    fetching = sys.modules[ShardImporter.__module__]  # the package's `fetch` is the function, not this module

    alice, shared, bob = filled_store(tmp_path / "alice"), tmp_path / "shared", tmp_path / "bob"
    push = hub_cli("push", "--dir", str(shared), "--all", "--create-repo", "--store-root", str(alice), "--json",
                   env={"JUDGESTORE_SHARD_TARGET_BYTES": "1"})  # fmt: skip
    assert orjson.loads(push.stdout)["shards"] == 10
    monkeypatch.setattr(fetching, "GROUP_SHARDS", 1)
    ctrl_c_on_call(monkeypatch, ShardImporter, "_group", 3)
    result = hub_cli("fetch", "--dir", str(shared), "--all", "--store-root", str(bob), "--json")
    assert result.exit_code == 130
    error = orjson.loads(result.stderr)
    assert (error["shards_imported"], error["rows_imported"]) == (2, 2)  # was (0, 0): the folder was unfinished
    with Store(Settings(), root=bob, readonly=True) as store:
        assert len(rows(store)) == 2


def test_ctrl_c_after_a_group_committed_but_before_it_was_recorded_counts_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while the first group is recorded as imported in sync.db, after its rows committed to the
    database: the line counts them (they are here), and the rerun imports that group again, writing nothing.
    (Was: 'imported no shard', with 7 rows inserted.)"""
    from store.sync.bookkeeping import Bookkeeping

    alice, shared, bob = filled_store(tmp_path / "alice"), tmp_path / "shared", tmp_path / "bob"
    assert hub_cli("push", "--dir", str(shared), "--all", "--create-repo", "--store-root", str(alice)).exit_code == 0
    fetch = ("fetch", "--dir", str(shared), "--all", "--store-root", str(bob))
    with pytest.MonkeyPatch.context() as interrupting:
        ctrl_c_on_call(interrupting, Bookkeeping, "set_state", 1)
        result = hub_cli(*fetch, "--json")
    assert result.exit_code == 130 and result.stdout == ""
    with Store(Settings(), root=bob, readonly=True) as store:
        here = len(rows(store))
    assert here == 7  # the completions' group committed
    error = orjson.loads(result.stderr)
    assert (error["shards_imported"], error["rows_imported"]) == (1, here), error
    assert "imported 1 shard (7 rows)" in error["error"]
    again = hub_cli(*fetch, "--json")
    assert again.exit_code == 0, again.output
    assert orjson.loads(again.stdout)["rows_inserted"] == 3  # the 7 were not written twice
    assert read_rows(bob) == read_rows(alice)


def test_ctrl_c_during_a_groups_commit_counts_the_group_that_stands(tmp_path: Path) -> None:
    """SIGINT while SQLite commits is raised once the commit returned: the group's rows are here, and counted.
    (Was: 'imported no shard' with 7 rows stored.)"""
    alice, shared, bob = filled_store(tmp_path / "alice"), tmp_path / "shared", tmp_path / "bob"
    assert hub_cli("push", "--dir", str(shared), "--all", "--create-repo", "--store-root", str(alice)).exit_code == 0
    with pytest.MonkeyPatch.context() as interrupting:
        ctrl_c_on_call(interrupting, SqliteDatabase, "put_many", 1, after=True)
        result = hub_cli("fetch", "--dir", str(shared), "--all", "--store-root", str(bob), "--json")
    assert result.exit_code == 130
    with Store(Settings(), root=bob, readonly=True) as store:
        assert len(rows(store)) == 7
    assert (orjson.loads(result.stderr)["shards_imported"], orjson.loads(result.stderr)["rows_imported"]) == (1, 7)


# ---------------------------------------------------------------- real processes


def run_cli(*args: str, hub: FakeHub, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "JUDGESTORE_"))},
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "JUDGESTORE_RUN_ID": "cli-test",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


def test_push_and_fetch_as_processes_against_the_loopback_hub(hub: FakeHub, tmp_path: Path) -> None:
    alice, bob = filled_store(tmp_path / "alice"), tmp_path / "bob"

    pushed = run_cli("push", "--repo", "org/new-cache", "--create-repo", "--private", "--all", "--json",
                     "--store-root", str(alice), hub=hub, tmp_path=tmp_path)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    report = orjson.loads(pushed.stdout)
    assert report["ok"] and report["rows"] == 10 and len(report["commits"]) == 1
    assert hub.repo("org/new-cache").private

    fetched = run_cli("fetch", "--repo", "org/new-cache", "--all", "--store-root", str(bob), hub=hub,
                      tmp_path=tmp_path)  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert "Fetched from hf:" in fetched.stdout and "10 new rows" in fetched.stdout
    assert read_rows(bob) == read_rows(alice)

    again = run_cli("push", "--repo", "org/new-cache", "--all", "--store-root", str(bob), hub=hub, tmp_path=tmp_path)
    assert again.returncode == 0 and "Nothing to push" in again.stdout
    assert "Traceback" not in pushed.stderr + fetched.stderr + again.stderr


def test_importing_the_cli_does_not_import_the_hub_client() -> None:
    code = "import sys, store.sync, store.cli.hub; print('huggingface_hub' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_hub_is_a_command_group_of_the_judgestore_app() -> None:
    result = CliRunner().invoke(build_app(), ["hub", "push", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--create-repo" in result.stdout and "--model-id" in result.stdout


def test_a_push_to_a_folder_with_a_revision_is_refused_and_sends_nothing(tmp_path: Path) -> None:
    alice, shared = filled_store(tmp_path / "alice"), tmp_path / "shared"
    shared.mkdir()

    result = hub_cli("push", "--dir", str(shared), "--revision", "exp", "--all", "--json", "--store-root", str(alice))

    assert result.exit_code == 2 and "no branches" in result.stderr  # a usage error (was 1)
    assert list(shared.iterdir()) == []
    both = hub_cli("push", "--dir", str(shared), "--repo", "org/x", "--all", "--store-root", str(alice))
    assert both.exit_code == 2 and "name one remote" in both.stderr
    upper = hub_cli("fetch", "--dir", str(shared), "--descriptor", "BB8E", "--store-root", str(alice))
    assert upper.exit_code == 2 and "descriptor must be lowercase hex" in upper.stderr


def test_a_push_whose_selection_matches_no_database_says_so(tmp_path: Path) -> None:
    """A mistyped --task was answered "it has every selected row", as if the remote held them."""
    alice, shared = filled_store(tmp_path / "alice"), tmp_path / "shared"
    shared.mkdir()

    result = hub_cli("push", "--dir", str(shared), "--task", "no-such-task", "--store-root", str(alice))

    assert result.exit_code == 0 and "every selected row" not in result.stdout
    assert "No database in" in result.stderr and "--task no-such-task" in result.stderr
    assert list(shared.iterdir()) == []
    # --json said only zeros and ok (was): the count of databases picked says it
    for task, picked in (("no-such-task", 0), ("mt-bench", None)):
        pushed = hub_cli("push", "--dir", str(shared), "--task", task, "--json", "--store-root", str(alice))
        assert pushed.exit_code == 0, pushed.output
        count = orjson.loads(pushed.stdout)["databases_selected"]
        assert count == picked if picked is not None else count > 0


def test_a_fetch_whose_selection_matches_no_folder_of_the_remote_says_so(tmp_path: Path) -> None:
    """A mistyped --task was answered "Nothing new to fetch (0 shards already here)", as if it had them all."""
    alice, shared, bob = filled_store(tmp_path / "alice"), tmp_path / "shared", tmp_path / "bob"
    shared.mkdir()
    assert hub_cli("push", "--dir", str(shared), "--all", "--store-root", str(alice)).exit_code == 0
    missed = hub_cli("fetch", "--dir", str(shared), "--task", "no-such-task", "--store-root", str(bob))
    assert missed.exit_code == 0 and "matches the selection: nothing to fetch" in missed.stdout, missed.output
    for task, matched in (("no-such-task", 0), ("mt-bench", None)):
        fetched = hub_cli("fetch", "--dir", str(shared), "--task", task, "--json", "--store-root", str(bob))
        count = orjson.loads(fetched.stdout)["folders_matched"]
        assert count == matched if matched is not None else count > 0
    assert hub_cli("fetch", "--dir", str(shared), "--all", "--store-root", str(bob)).exit_code == 0
    again = hub_cli("fetch", "--dir", str(shared), "--all", "--store-root", str(bob))
    assert again.exit_code == 0 and "Nothing new to fetch" in again.stdout  # folders there, all fetched


def test_a_dry_run_with_create_repo_previews_the_whole_push_and_creates_nothing(hub: FakeHub, tmp_path: Path) -> None:
    """Was: 'the repository ... does not exist ... push with --create-repo' (and 'the folder does not exist')."""
    alice, shared = filled_store(tmp_path / "alice"), tmp_path / "shared"
    preview = run_cli("push", "--repo", "org/new-cache", "--create-repo", "--private", "--all", "--dry-run", "--json",
                      "--store-root", str(alice), hub=hub, tmp_path=tmp_path)  # fmt: skip
    assert preview.returncode == 0, preview.stderr
    report = orjson.loads(preview.stdout)
    assert (report["dry_run"], report["created_repo"], report["rows"], report["commits"]) == (True, True, 10, [])
    assert ("dataset", "org/new-cache") not in hub.repos
    human = hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--dry-run", "--store-root", str(alice))
    assert human.exit_code == 0, human.output
    assert f"Would create dir:{shared}." in human.stdout and "10 rows" in human.stdout
    assert not shared.exists()
    assert not (alice / ".judgestore-sync").exists()  # was: the preview made the workspace to build its shards in
    made = hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--json", "--store-root", str(alice))
    assert made.exit_code == 0 and orjson.loads(made.stdout)["created_repo"] and shared.is_dir(), made.output
    again = hub_cli("push", "--dir", str(shared), "--create-repo", "--all", "--json", "--store-root", str(alice))
    assert again.exit_code == 0 and not orjson.loads(again.stdout)["created_repo"], again.output


def test_private_for_an_existing_public_repository_is_refused_and_nothing_is_pushed(
    hub: FakeHub, tmp_path: Path
) -> None:
    """Was: the rows pushed to the public repository, and nothing said."""
    alice = filled_store(tmp_path / "alice")
    hub.create_repo("org/public-cache", private=False)
    before = hub.commits("org/public-cache")
    for extra in ([], ["--dry-run"]):
        pushed = run_cli("push", "--repo", "org/public-cache", "--create-repo", "--private", "--all", "--json",
                         *extra, "--store-root", str(alice), hub=hub, tmp_path=tmp_path)  # fmt: skip
        assert pushed.returncode == 1, pushed.stderr
        error = orjson.loads(pushed.stderr.splitlines()[-1])
        assert error["type"] == "InvalidInputError", error
        assert "the repository exists and is public" in error["error"] and "nothing was pushed" in error["error"]
    assert hub.commits("org/public-cache") == before and not hub.repo("org/public-cache").private
    public = run_cli("push", "--repo", "org/public-cache", "--create-repo", "--all", "--json", "--store-root",
                     str(alice), hub=hub, tmp_path=tmp_path)  # fmt: skip
    assert public.returncode == 0 and orjson.loads(public.stdout)["rows"] == 10, public.stderr
