"""The Hub remote against the fake Hub: retries, Retry-After, failures that must not retry, faults mid-transfer.

The client is the real huggingface_hub; only the server is fake (see
``fake_hub.py``), and faults are injected on it. Retries never really sleep:
the remote is given a sleep function that records what it was asked to wait.
"""

from __future__ import annotations

import random
import sqlite3
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from store.errors import RemoteAuthError, RemoteError, RemoteNotFoundError, RemoteUnavailableError, SyncError
from store.layout import Selector
from store.store import Store
from store.sync import fetch, push
from store.sync.bookkeeping import Bookkeeping, ShardState, bookkeeping_path
from store.sync.hub import HubRemote, RetryPolicy, _retry_after
from tests.fake_hub import FakeHub, Fault, point_client_at
from tests.sync.helpers import (
    FORMAT_1_SCHEMA,
    QWEN,
    READ_TOKEN,
    REPO,
    WRITE_TOKEN,
    Sleeps,
    completions,
    fill,
    hub_remote,
    rows,
    sync_state,
)

# huggingface_hub's LFS upload passes a file as `data=`, which httpx2 deprecates; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>' to upload raw bytes:DeprecationWarning")
MakeStore = Callable[[str], Store]


def commits_of(hub: FakeHub) -> int:
    return len(hub.commits(REPO))


def test_409_on_the_first_commits_is_retried_with_backoff(hub: FakeHub, make_store: MakeStore, sleeps: Sleeps) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(6)))
    hub.add_fault(Fault("POST", "/commit/", status=409, times=2))
    before = commits_of(hub)

    report = push(alice, hub_remote(hub, sleeps))

    assert report.ok and len(report.commits) == 1 and commits_of(hub) == before + 1
    assert len(sleeps) == 2 and sleeps[0] > 0
    assert fetch(make_store("bob"), hub_remote(hub)).rows == 6


def test_a_500_after_the_commit_was_applied_does_not_commit_twice(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(6)))
    hub.add_fault(Fault("POST", "/commit/", status=500, after_apply=True))
    before = commits_of(hub)

    report = push(alice, hub_remote(hub, sleeps))

    assert report.ok and commits_of(hub) == before + 1  # applied once; the retry found its files there
    # sent by this push, its answer lost: not "already there, not sent again" (was)
    assert report.commits == [] and report.already_present == 0 and report.shards == 1 and len(sleeps) == 1
    with Bookkeeping(alice.root) as books:
        states = {entry.state for entry in books.shards(books.remote_id(hub_remote(hub).url))}
    assert states == {ShardState.PUSHED}
    assert push(alice, hub_remote(hub)).shards == 0 and commits_of(hub) == before + 1


def test_429_waits_at_least_what_retry_after_says(hub: FakeHub, make_store: MakeStore, sleeps: Sleeps) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    hub.add_fault(Fault("POST", "/commit/", status=429, headers={"Retry-After": "7"}))

    assert push(alice, hub_remote(hub, sleeps)).ok
    assert sleeps and sleeps[0] >= 7


def test_retry_delays_grow_with_jitter_and_respect_retry_after() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0)
    rng = random.Random(0)
    delays = [policy.delay(attempt, None, rng) for attempt in range(6)]
    for attempt, delay in enumerate(delays):
        cap = min(8.0, 2**attempt)
        assert cap / 2 <= delay <= cap
    assert policy.delay(0, 30.0, rng) == 30.0
    assert policy.delay(0, 10_000.0, rng) == policy.max_retry_after
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 100 < (_retry_after({"Retry-After": later}) or 0) <= 120
    assert _retry_after({"Retry-After": "soon"}) is None and _retry_after({}) is None


def test_a_bad_token_fails_at_once_without_retrying(hub: FakeHub, make_store: MakeStore, sleeps: Sleeps) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    with pytest.raises(RemoteAuthError, match="401"):
        push(alice, hub_remote(hub, sleeps, token="hf_not_a_real_token"))
    with pytest.raises(RemoteAuthError, match=r"403.*write token"):
        push(alice, hub_remote(hub, sleeps, token=READ_TOKEN))
    assert sleeps == []


def test_offline_mode_fails_at_once_and_says_what_to_unset(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # vLLM users often set HF_HUB_OFFLINE=1; the client then refuses every request with a ConnectionError, which
    # no retry gets through
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    before = commits_of(hub)
    point_client_at(monkeypatch, tmp_path / "hf-home", token=WRITE_TOKEN, offline=True)
    for sync in (push, fetch):
        with pytest.raises(RemoteError, match="HF_HUB_OFFLINE is set") as raised:
            sync(alice, hub_remote(hub, sleeps))
        assert type(raised.value) is RemoteError
        assert "JUDGESTORE_SYNC_DIR for a run's --fetch" in str(raised.value)  # generate has no --dir (was named)
    assert sleeps == [] and commits_of(hub) == before
    point_client_at(monkeypatch, tmp_path / "hf-home", token=WRITE_TOKEN)  # online again: the push goes through
    assert push(alice, hub_remote(hub, sleeps)).ok and commits_of(hub) == before + 1


def test_a_missing_repository_fails_at_once_and_create_repo_fixes_it(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    remote = hub_remote(hub, sleeps)
    remote.repo_id = "org/not-there-yet"
    with pytest.raises(RemoteNotFoundError, match="--create-repo"):
        push(alice, remote)
    assert sleeps == []

    remote.create_repo(private=True)
    remote.create_repo(private=True)  # an existing repository is fine
    assert push(alice, remote).rows == 3
    assert hub.repo("org/not-there-yet").private


def test_a_remote_that_keeps_failing_leaves_the_push_pending_and_the_next_push_completes_it(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(5)))
    fault = hub.add_fault(Fault("POST", "/commit/", status=503, times=1_000))
    with pytest.raises(RemoteUnavailableError, match="running the same command again"):
        push(alice, hub_remote(hub, sleeps))
    assert len(sleeps) == 3  # four attempts, three waits

    fault.times = 0
    report = push(alice, hub_remote(hub))
    assert report.ok and report.rows == 5 and report.recovered == 0
    assert fetch(make_store("bob"), hub_remote(hub)).rows == 5


def test_many_files_go_out_in_several_commits_of_bounded_size(hub: FakeHub, make_store: MakeStore) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(30)))
    before = commits_of(hub)

    report = push(alice, hub_remote(hub, max_files_per_add=3), target_bytes=2_000)

    assert report.shards >= 8 and len(report.commits) == commits_of(hub) - before
    assert len(report.commits) == -(-(report.shards + 1) // 3)  # metadata.json + shards, 3 files a commit
    assert fetch(make_store("bob"), hub_remote(hub)).rows == 30


def test_a_download_cut_short_is_resumed_and_never_imported_truncated(hub: FakeHub, make_store: MakeStore) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(8)))
    push(alice, hub_remote(hub))
    hub.add_fault(Fault("GET", "/shards/", truncate=100))  # the connection drops 100 bytes into the body

    bob = make_store("bob")
    report = fetch(bob, hub_remote(hub))

    assert report.ok and rows(bob) == rows(alice)


def test_a_download_that_stays_short_is_reported_and_fetched_next_time(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(8)))
    push(alice, hub_remote(hub))
    shard = next(path for path in hub.files(REPO) if "/shards/" in path)
    fault = hub.add_fault(Fault("GET", "/shards/", body=hub.files(REPO)[shard][:50], times=1_000))

    bob = make_store("bob")
    report = fetch(bob, hub_remote(hub, sleeps))

    assert not report.ok and [p.path for p in report.failed] == [shard]
    assert rows(bob) == {} and len(sleeps) == 3
    fault.times = 0
    assert fetch(bob, hub_remote(hub)).rows == 8


def test_fetch_pins_the_head_it_started_from(
    hub: FakeHub, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    push(alice, hub_remote(hub))
    remote = hub_remote(hub)
    pinned = remote.head()
    fill(alice, completions(range(4, 6)))
    push(alice, hub_remote(hub))  # lands after the fetch pinned its revision
    monkeypatch.setattr(remote, "head", lambda: pinned)

    report = fetch(make_store("bob"), remote)

    assert report.revision == pinned and report.rows == 4


def test_a_listing_with_dot_dot_paths_is_rejected_and_nothing_is_downloaded_from_it(
    hub: FakeHub, make_store: MakeStore
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    genuine = next(path for path in hub.files(REPO) if "/shards/" in path)
    hostile = [
        genuine.replace("/mt-bench/", "/mt-bench/../../../../../../escaped/"),
        "completions/../../outside.jsonl.gz",
        "../top-level-escape",
    ]
    hub.put_raw(REPO, dict.fromkeys(hostile, hub.files(REPO)[genuine]))
    hub.requests.clear()

    bob = make_store("bob")
    report = fetch(bob, hub_remote(hub))

    assert sorted(p.path for p in report.rejected_paths) == sorted(hostile)
    assert all("'..'" in p.reason for p in report.rejected_paths)
    assert not any(".." in path for method, path in hub.requests if "/resolve/" in path)
    assert len(rows(bob)) == 3
    assert not (bob.root.parent / "escaped").exists() and not (bob.root.parent / "outside.jsonl.gz").exists()


def test_without_huggingface_hub_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if the `hub` extra was not installed
    with pytest.raises(SyncError, match=r"pip install 'huggingface_hub>=2.4,<3'"):
        HubRemote(REPO)


def test_a_mirror_endpoints_credentials_are_never_part_of_the_remotes_name() -> None:
    """HF_ENDPOINT=http://user:password@mirror printed the password as the remote and kept it in the sync database
    (was); the name is the same without them, so what was recorded before still matches."""
    with_credentials = HubRemote(REPO, endpoint="http://mirroruser:S3cretPw@mirror.example:8080")
    plain = HubRemote(REPO, endpoint="http://mirror.example:8080")
    assert with_credentials.url == plain.url == f"hf:http://mirror.example:8080/datasets/{REPO}"
    assert HubRemote(REPO, endpoint="HTTPS://HF-Mirror.com").url == f"hf:HTTPS://HF-Mirror.com/datasets/{REPO}"


def test_rows_pushed_to_a_branch_are_still_pushed_to_main(hub: FakeHub, make_store: MakeStore) -> None:
    """A push lands on its branch only: main must not be told it holds what went to `dev`."""
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    assert push(alice, hub_remote(hub)).rows == 4
    hub.tag(REPO, "dev")  # a branch at main's head
    fill(alice, completions(range(4, 6)))
    assert push(alice, hub_remote(hub, revision="dev")).rows == 2
    assert fetch(make_store("bob"), hub_remote(hub)).rows == 4  # main does not have them yet
    to_main = push(alice, hub_remote(hub))
    assert to_main.rows == 2 and to_main.ok
    assert fetch(make_store("carol"), hub_remote(hub)).rows == 6
    assert push(alice, hub_remote(hub)).shards == push(alice, hub_remote(hub, revision="dev")).shards == 0


def test_a_descriptor_prefix_longer_than_a_folder_name_is_compared_whole(hub: FakeHub, make_store: MakeStore) -> None:
    """Past its 16th character a prefix is checked against metadata.json: a wrong one selects nothing."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    full = QWEN.sha256()
    wrong = full[:16] + ("0" if full[16] != "0" else "1") + full[17:24]
    assert push(alice, hub_remote(hub), Selector(descriptor=wrong), dry_run=True).folders == []
    assert push(alice, hub_remote(hub), Selector(descriptor=full)).rows == 3
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub), Selector(descriptor=wrong), dry_run=True).folders == []
    assert fetch(bob, hub_remote(hub), Selector(descriptor=wrong)).rows == 0
    assert fetch(bob, hub_remote(hub), Selector(descriptor=full[:20])).rows == 3


def test_a_branch_push_sends_what_main_received_after_the_branch_was_made(hub: FakeHub, make_store: MakeStore) -> None:
    """What the bookkeeping knows main holds is not taken as held by a branch: the branch's listing decides."""
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    assert push(alice, hub_remote(hub)).rows == 4
    hub.tag(REPO, "dev")  # a branch made from main now
    fill(alice, completions(range(4, 7)))
    assert push(alice, hub_remote(hub)).rows == 3  # main only: dev was made before these

    to_dev = push(alice, hub_remote(hub, revision="dev"))

    assert to_dev.ok and to_dev.rows == 3 and len(to_dev.commits) == 1  # only what dev lacks
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="dev")).ok and rows(bob) == rows(alice)
    before = commits_of(hub)
    again = push(alice, hub_remote(hub, revision="dev"))  # unchanged: the listing shows dev has every shard
    assert again.ok and again.shards == 0 and commits_of(hub) == before


# ---------------------------------------------------------------- rows fetched at another revision, pushed to main


def listings_of(hub: FakeHub) -> int:
    return hub.count("GET", "/tree/")


def test_rows_fetched_from_a_branch_are_pushed_to_main(hub: FakeHub, make_store: MakeStore) -> None:
    """Bob fetches `exp` (main's shard and the branch's own) and pushes to main: main gets what only `exp` held,
    asked of main's listing once; the shard main already lists is not sent again. Carol, on main, gets it all."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    assert push(alice, hub_remote(hub)).rows == 3
    fill(alice, completions(range(3, 6)))
    assert push(alice, hub_remote(hub, revision="exp")).rows == 3  # made from main, gets rows 3..5
    bob = make_store("bob")
    fill(bob, completions(range(10, 12)))  # bob's own rows
    assert fetch(bob, hub_remote(hub, revision="exp")).rows == 6
    main_files, listed = set(hub.files(REPO)), listings_of(hub)

    to_main = push(bob, hub_remote(hub))

    assert to_main.ok and to_main.rows == 5  # rows 3..5 from exp and bob's 10, 11; not rows 0..2
    assert listings_of(hub) == listed + 1  # one folder: one listing of main
    assert not main_files.intersection(set(hub.files(REPO)) - main_files)
    carol = make_store("carol")
    assert fetch(carol, hub_remote(hub)).ok and rows(carol) == rows(bob)
    listed, before = listings_of(hub), commits_of(hub)
    again = push(bob, hub_remote(hub))  # settled: main's listing was recorded, exp's rows went in bob's shards
    assert again.ok and again.shards == 0 and listings_of(hub) == listed and commits_of(hub) == before
    assert fetch(bob, hub_remote(hub)).shards == 0  # a fetch from main after it imports nothing again
    assert push(bob, hub_remote(hub, revision="exp")).rows == 2  # exp lacks only bob's own rows


@pytest.mark.parametrize("at", ["tag", "commit"])
def test_rows_fetched_at_a_tag_or_commit_main_lacks_are_pushed_to_main(
    hub: FakeHub, make_store: MakeStore, at: str
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    assert push(alice, hub_remote(hub, revision="exp")).rows == 4
    revision = hub.tag(REPO, "v1", revision="exp") if at == "commit" else "v1"
    if at == "tag":
        hub.tag(REPO, "v1", revision="exp")
    del hub.repo(REPO).branches["exp"]  # only the tag or the commit holds the rows now
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision=revision)).rows == 4
    assert fetch(bob, hub_remote(hub)).shards == 0  # main has nothing

    assert push(bob, hub_remote(hub)).rows == 4

    carol = make_store("carol")
    assert fetch(carol, hub_remote(hub)).rows == 4 and rows(carol) == rows(alice)


def test_a_push_to_main_after_fetching_main_only_lists_nothing(hub: FakeHub, make_store: MakeStore) -> None:
    """What is cheap stays cheap: every shard recorded was fetched from or pushed to main, so no listing."""
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    push(alice, hub_remote(hub))
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub)).rows == 4
    fill(bob, completions(range(4, 6)))
    hub.requests.clear()

    report = push(bob, hub_remote(hub))

    assert report.ok and report.rows == 2 and listings_of(hub) == 0
    hub.requests.clear()
    assert push(bob, hub_remote(hub)).shards == 0 and listings_of(hub) == 0


def test_a_fetch_from_main_tells_the_bookkeeping_what_main_holds_of_what_a_branch_gave(
    hub: FakeHub, make_store: MakeStore
) -> None:
    """Bob fetched main's shard from `exp` first; his fetch from main skips it but records it as on main, so his
    push to main need not ask main's listing."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    hub.tag(REPO, "exp")
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="exp")).rows == 3
    fetched = fetch(bob, hub_remote(hub))
    assert fetched.shards == 0 and fetched.skipped == 1  # not imported again
    fill(bob, completions(range(3, 5)))
    hub.requests.clear()

    report = push(bob, hub_remote(hub))

    assert report.ok and report.rows == 2 and listings_of(hub) == 0


def test_a_dry_run_to_main_asks_main_but_records_nothing(hub: FakeHub, make_store: MakeStore) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub, revision="exp"))
    bob = make_store("bob")
    fetch(bob, hub_remote(hub, revision="exp"))
    before = sync_state(bob)

    assert push(bob, hub_remote(hub), dry_run=True).rows == 3

    assert sync_state(bob) == before and fetch(make_store("carol"), hub_remote(hub)).rows == 0


def as_format_1(store: Store) -> None:
    """Rewrite the store's bookkeeping as the first release would hold it: format 1's schema, the same rows, and
    no word of which revision a shard was fetched at."""
    path = bookkeeping_path(store.root)
    with closing(sqlite3.connect(path)) as conn:
        remotes = conn.execute("SELECT id, url FROM remotes").fetchall()
        shards = conn.execute(
            "SELECT id, remote_id, folder, name, state, rows, bytes, revision, updated_at FROM shards"
        ).fetchall()
        keys = conn.execute("SELECT input_hash, shard_id FROM shard_keys").fetchall()
    path.unlink()
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        for statement in FORMAT_1_SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.executemany("INSERT INTO remotes VALUES (?, ?)", remotes)
        conn.executemany("INSERT INTO shards VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", shards)
        conn.executemany("INSERT INTO shard_keys VALUES (?, ?)", keys)
        conn.execute("COMMIT")


def test_an_old_bookkeeping_sends_to_main_what_it_fetched_from_a_branch_and_asks_main_once(
    hub: FakeHub, make_store: MakeStore
) -> None:
    """A format 1 file does not say where a shard was fetched: main's listing settles it, on the first push only."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    push(alice, hub_remote(hub, revision="exp"))
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="exp")).rows == 5
    as_format_1(bob)
    listed = listings_of(hub)

    to_main = push(bob, hub_remote(hub))

    assert to_main.ok and to_main.rows == 2 and listings_of(hub) == listed + 1  # only what exp alone held
    carol = make_store("carol")
    assert fetch(carol, hub_remote(hub)).rows == 5 and rows(carol) == rows(alice)
    listed = listings_of(hub)
    assert push(bob, hub_remote(hub)).shards == 0 and listings_of(hub) == listed  # settled once


def test_an_old_bookkeeping_that_fetched_main_asks_main_once_and_sends_nothing(
    hub: FakeHub, make_store: MakeStore
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    bob = make_store("bob")
    fetch(bob, hub_remote(hub))
    as_format_1(bob)
    fill(bob, completions(range(3, 4)))
    hub.requests.clear()

    assert push(bob, hub_remote(hub)).rows == 1 and listings_of(hub) == 1
    fill(bob, completions(range(4, 5)))
    hub.requests.clear()
    assert push(bob, hub_remote(hub)).rows == 1 and listings_of(hub) == 0


@pytest.mark.parametrize(
    ("repo", "revision"), [("org/not-there", "main"), ("org/not-there", "dev"), (REPO, "no-such-branch")]
)
def test_a_repository_the_hub_answers_404_for_leaves_the_bookkeeping_as_it_was(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, repo: str, revision: str
) -> None:
    """Push and fetch (dry runs too) raise the typed 404 error and record nothing: no remote, no shard. A missing
    branch of a repository that exists is a 404 to a fetch only: a push creates it (tests below)."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))  # the bookkeeping holds one remote and its shard
    hub.tag(REPO, "dev")
    push(alice, hub_remote(hub, revision="dev"))
    fill(alice, completions(range(3, 5)))  # something new, so push does ask the remote
    before = sync_state(alice)
    missing = hub_remote(hub, sleeps, revision=revision)
    missing.repo_id = repo

    # A missing repository is made by --create-repo; a missing branch by a push to it, which the error says.
    says = "push with --create-repo" if repo != REPO else f"no revision '{revision}'.*a push to a branch .*creates it"
    for command in (push, fetch) if repo != REPO else (fetch,):
        with pytest.raises(RemoteNotFoundError, match=f"HTTP 404.*{says}") as raised:
            command(alice, missing)
        assert (repo == REPO) is ("--create-repo" not in str(raised.value))
        with pytest.raises(RemoteNotFoundError, match=f"HTTP 404.*{says}"):
            command(alice, missing, dry_run=True)

    assert sync_state(alice) == before and sleeps == []
    assert missing.pushed_to not in str(before[1])
    assert hub.count("POST", "/branch/") == 0  # no branch is made in a repository that is not there


# ---------------------------------------------------------------- a push to a branch that does not exist yet


def test_the_fake_hub_creates_branches_as_the_client_expects(hub: FakeHub) -> None:
    """The endpoint behind HfApi.create_branch: from main's head by default, 409 when the branch exists (the
    client's exist_ok swallows it), 400 for a refs/ name, 403 for a read token; the branch then reads as one."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import BadRequestError, HfHubHTTPError

    api = HfApi(endpoint=hub.endpoint, token=WRITE_TOKEN)
    hub.put_raw(REPO, {"a.txt": b"a"})
    api.create_branch(REPO, branch="exp/one", repo_type="dataset")
    assert hub.repo(REPO).branches["exp/one"] == hub.repo(REPO).branches["main"]
    assert {f.path for f in api.list_repo_tree(REPO, revision="exp/one", repo_type="dataset")} == {
        ".gitattributes", "a.txt"}  # fmt: skip
    with pytest.raises(HfHubHTTPError, match="Reference refs/heads/exp/one already exists") as exists:
        api.create_branch(REPO, branch="exp/one", repo_type="dataset")
    assert exists.value.response.status_code == 409
    api.create_branch(REPO, branch="exp/one", repo_type="dataset", exist_ok=True)
    with pytest.raises(BadRequestError, match="Invalid reference for a branch"):
        api.create_branch(REPO, branch="refs/pr/1", repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as refused:
        HfApi(endpoint=hub.endpoint, token=READ_TOKEN).create_branch(REPO, branch="other", repo_type="dataset")
    assert refused.value.response.status_code == 403 and "other" not in hub.repo(REPO).branches


def test_a_push_to_a_branch_that_does_not_exist_creates_it_from_main(hub: FakeHub, make_store: MakeStore) -> None:
    """The branch starts at main's head, gets what it lacks, and serves it: an empty store fetches every row."""
    alice = make_store("alice")
    fill(alice, completions(range(4)))
    assert push(alice, hub_remote(hub)).rows == 4
    main_head = hub.repo(REPO).branches["main"]
    fill(alice, completions(range(4, 7)))

    report = push(alice, hub_remote(hub, revision="exp"))

    assert report.ok and report.rows == 3 and len(report.commits) == 1  # main's shards are on the branch already
    assert report.created_branch is not None and report.created_branch.name == "exp"
    assert report.as_dict()["created_branch"] == {"name": "exp", "from_commit": main_head}
    assert hub.commits(REPO)[-1].parent == main_head and hub.repo(REPO).branches["main"] == main_head
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="exp")).ok and rows(bob) == rows(alice)
    assert fetch(make_store("carol"), hub_remote(hub)).rows == 4  # main did not get the branch's rows
    again = push(alice, hub_remote(hub, revision="exp"))  # the branch exists now: nothing to make, nothing to send
    assert again.ok and again.shards == 0 and again.created_branch is None and hub.count("POST", "/branch/") == 1


def test_a_first_push_from_a_store_goes_to_a_new_branch_whole(hub: FakeHub, make_store: MakeStore) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(5)))
    report = push(alice, hub_remote(hub, revision="exp"))
    assert report.ok and report.rows == 5 and report.created_branch is not None
    assert fetch(make_store("bob"), hub_remote(hub)).rows == 0  # main is as it was
    bob = make_store("bob2")
    assert fetch(bob, hub_remote(hub, revision="exp")).rows == 5 and rows(bob) == rows(alice)


def test_a_branch_deleted_after_a_push_to_it_is_made_again_with_its_rows(hub: FakeHub, make_store: MakeStore) -> None:
    """What the bookkeeping says went to the branch is not taken as held: the new branch lists main's shards only."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    assert push(alice, hub_remote(hub, revision="exp")).rows == 3
    del hub.repo(REPO).branches["exp"]  # deleted on the Hub (hf repo branch delete)

    report = push(alice, hub_remote(hub, revision="exp"))

    assert report.ok and report.rows == 3 and report.created_branch is not None
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="exp")).rows == 3 and rows(bob) == rows(alice)


def test_a_dry_run_to_a_missing_branch_says_it_would_create_it_and_creates_nothing(
    hub: FakeHub, make_store: MakeStore
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    before, commits = sync_state(alice), commits_of(hub)

    report = push(alice, hub_remote(hub, revision="exp"), dry_run=True)

    assert report.dry_run and report.rows == 2 and report.created_branch is not None
    assert report.created_branch.name == "exp"
    assert "exp" not in hub.repo(REPO).branches and hub.count("POST", "/branch/") == 0
    assert sync_state(alice) == before and commits_of(hub) == commits


def test_a_push_with_nothing_to_send_makes_no_branch(hub: FakeHub, make_store: MakeStore) -> None:
    """Main holds every row, so the branch made from it would too: nothing to send, nothing made."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    before = sync_state(alice)

    report = push(alice, hub_remote(hub, revision="exp"))

    assert report.ok and report.shards == 0 and report.created_branch is None
    assert "exp" not in hub.repo(REPO).branches and hub.count("POST", "/branch/") == 0
    assert sync_state(alice) == before
    with pytest.raises(RemoteNotFoundError):  # still no such branch to fetch from
        fetch(make_store("bob"), hub_remote(hub, revision="exp"))


@pytest.mark.parametrize(("token", "status"), [(READ_TOKEN, 403), (False, 401)])
def test_a_branch_the_hub_refuses_to_create_is_an_auth_error_and_nothing_is_recorded(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, token: str | bool, status: int
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    before, commits = sync_state(alice), commits_of(hub)

    with pytest.raises(RemoteAuthError, match=f"creating the branch 'exp': HTTP {status}"):
        push(alice, hub_remote(hub, sleeps, revision="exp", token=token))

    assert sync_state(alice) == before and sleeps == []  # refused at once, and no remote, no pending shard
    assert "exp" not in hub.repo(REPO).branches and commits_of(hub) == commits


def test_a_dry_run_records_no_remote(hub: FakeHub, make_store: MakeStore) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    Bookkeeping(alice.root).close()  # the file exists, holding no remote
    before = sync_state(alice)
    assert push(alice, hub_remote(hub), dry_run=True).rows == 3
    assert fetch(alice, hub_remote(hub), dry_run=True).shards == 0
    assert sync_state(alice) == before and before[1] == []


def test_a_branch_another_pusher_made_meanwhile_from_an_older_commit_gets_every_row(
    hub: FakeHub, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 409 to creating the branch means someone else made it, from a commit this push did not plan against:
    the push plans again against the branch as it is, so what main held when it was pinned is not taken as held."""
    old_main = hub.repo(REPO).branches["main"]  # what another pusher pinned: main before alice's push
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    assert push(alice, hub_remote(hub)).rows == 3  # main holds rows 0..2 now; alice pins this head
    fill(alice, completions(range(3, 5)))
    remote = hub_remote(hub, revision="exp")
    real_create = remote.api.create_branch

    def other_pusher_first(*args: object, **kwargs: object) -> None:
        hub.repo(REPO).branches.setdefault("exp", old_main)  # made from the older head, between pin and create
        real_create(*args, **kwargs)  # type: ignore[arg-type]  # the Hub answers 409

    monkeypatch.setattr(remote.api, "create_branch", other_pusher_first)

    report = push(alice, remote)

    assert report.ok and report.created_branch is None  # this push did not make it
    bob = make_store("bob")
    fetched = fetch(bob, hub_remote(hub, revision="exp"))
    assert fetched.ok and rows(bob) == rows(alice)  # rows 0..2 and the metadata.json reached the branch too


def test_a_branch_made_by_an_attempt_whose_answer_was_lost_counts_as_made(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry meets the 409 of its own first attempt: the branch stands at the pinned commit, as planned."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    main_head = hub.repo(REPO).branches["main"]
    remote = hub_remote(hub, sleeps, revision="exp")
    real_create = remote.api.create_branch
    calls: list[object] = []

    def reply_lost_once(*args: object, **kwargs: object) -> None:
        real_create(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(kwargs)
        if len(calls) == 1:
            raise TimeoutError("the reply was lost")

    monkeypatch.setattr(remote.api, "create_branch", reply_lost_once)

    report = push(alice, remote)

    assert report.ok and report.rows == 2 and len(sleeps) == 1
    assert report.created_branch is not None and report.created_branch.base == main_head
    assert hub.count("POST", "/branch/") == 2 and hub.repo(REPO).commits[-1].parent == main_head
    bob = make_store("bob")
    assert fetch(bob, hub_remote(hub, revision="exp")).ok and rows(bob) == rows(alice)


def test_a_branch_name_the_hub_refuses_is_one_line_with_the_hubs_reason(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps
) -> None:
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    before, commits = sync_state(alice), commits_of(hub)

    with pytest.raises(RemoteError, match=r"creating the branch 'exp/': .*Invalid reference for a branch") as refused:
        push(alice, hub_remote(hub, sleeps, revision="exp/"))

    assert "\n" not in str(refused.value) and sleeps == []  # a 400 is not retried
    assert sync_state(alice) == before and commits_of(hub) == commits


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_missing_refs_name_is_not_taken_for_a_branch_to_make(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, dry_run: bool
) -> None:
    """refs/pr/N and other refs/ names are the Hub's own: a push to an existing one commits there, but a missing
    one cannot be made as a branch, so even a dry run says so at once instead of promising to create it."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    fill(alice, completions(range(3, 5)))
    before, commits, asked = sync_state(alice), commits_of(hub), hub.count("POST", "/paths-info/")

    with pytest.raises(RemoteNotFoundError, match=r"'refs/pr/9' does not exist.*cannot create a refs/ name"):
        push(alice, hub_remote(hub, sleeps, revision="refs/pr/9"), dry_run=dry_run)

    assert sync_state(alice) == before and commits_of(hub) == commits and sleeps == []
    assert hub.count("POST", "/branch/") == 0 and hub.count("POST", "/paths-info/") == asked  # nothing planned


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_commit_given_as_the_revision_to_push_to_is_refused_before_anything(
    hub: FakeHub, make_store: MakeStore, sleeps: Sleeps, dry_run: bool
) -> None:
    """A commit resolves as a revision, so the dry run said it would push; the push then failed with a 404 that
    said the revision did not exist, and recorded a pending shard for the commit as a remote (was)."""
    alice = make_store("alice")
    fill(alice, completions(range(3)))
    push(alice, hub_remote(hub))
    commit = hub.repo(REPO).branches["main"]
    fill(alice, completions(range(3, 5)))
    before, commits = sync_state(alice), commits_of(hub)

    with pytest.raises(RemoteNotFoundError, match=rf"'{commit}' is a commit, not a branch: a push commits onto"):
        push(alice, hub_remote(hub, sleeps, revision=commit), dry_run=dry_run)

    assert sync_state(alice) == before and commits_of(hub) == commits and sleeps == []
    assert fetch(make_store("bob"), hub_remote(hub, revision=commit)).rows == 3  # a commit is for fetching
