"""Settings come from JUDGESTORE_* variables when a Settings is built, never at import."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from store import Store
from store.errors import InvalidInputError
from store.settings import Settings, SettingsKeyWarning, SyncSettings, from_environment
from store.sync import DirectoryRemote, HubRemote, open_remote
from tests.factories import QWEN, fill_small_store

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No JUDGESTORE_* and no SLURM_* variables (the shared fixture sets a few JUDGESTORE_ ones)."""
    for name in list(os.environ):
        if name.startswith(("JUDGESTORE_", "SLURM_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_a_new_user_can_live_with(bare_environment: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.store_root == Path("judgestore-data")
    assert settings.auto_upgrade is False
    assert settings.journal_policy == "auto"
    assert settings.busy_timeout_ms == 30_000
    assert settings.max_open_databases >= 1
    assert settings.created_by == getpass.getuser()
    assert str(os.getpid()) in settings.run_id
    assert Settings().run_id == settings.run_id  # one id per process


def test_every_setting_reads_its_judgestore_variable(bare_environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "JUDGESTORE_STORE_ROOT": str(tmp_path / "cache"),
        "JUDGESTORE_AUTO_UPGRADE": "1",
        "JUDGESTORE_JOURNAL_POLICY": "refuse-network",
        "JUDGESTORE_BUSY_TIMEOUT_MS": "500",
        "JUDGESTORE_LOCK_RETRIES": "2",
        "JUDGESTORE_MAX_OPEN_DATABASES": "3",
        "JUDGESTORE_CREATED_BY": "alice",
        "JUDGESTORE_RUN_ID": "nightly-7",
    }.items():
        bare_environment.setenv(name, value)
    settings = Settings()
    assert settings.store_root == tmp_path / "cache"
    assert settings.auto_upgrade is True
    assert settings.journal_policy == "refuse-network"
    assert (settings.busy_timeout_ms, settings.lock_retries, settings.max_open_databases) == (500, 2, 3)
    assert (settings.created_by, settings.run_id) == ("alice", "nightly-7")


def test_variables_without_the_prefix_are_not_read(bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv("STORE_ROOT", "/elsewhere")
    bare_environment.setenv("RUN_ID", "not-mine")
    settings = Settings()
    assert settings.store_root == Path("judgestore-data") and settings.run_id != "not-mine"


def test_arguments_override_the_environment(bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv("JUDGESTORE_BUSY_TIMEOUT_MS", "500")
    assert Settings(busy_timeout_ms=10).busy_timeout_ms == 10


def test_slurm_job_id_becomes_the_run_id(bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv("SLURM_JOB_ID", "4242")
    assert Settings().run_id == "slurm-4242"
    bare_environment.setenv("SLURM_ARRAY_JOB_ID", "4200")
    bare_environment.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert Settings().run_id == "slurm-4200_7"
    bare_environment.setenv("JUDGESTORE_RUN_ID", "explicit")
    assert Settings().run_id == "explicit"


def test_unknown_judgestore_variables_and_arguments_are_ignored(bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv("JUDGESTORE_FROM_A_NEWER_VERSION", "x")
    bare_environment.setenv("JUDGESTORE_HF_TOKEN", "secret")
    settings = Settings(not_a_setting=1)  # type: ignore[call-arg]
    assert not hasattr(settings, "from_a_newer_version") and not hasattr(settings, "not_a_setting")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a newer judgestore's variable is no misspelling: not warned of
        from_environment(Settings)


def test_a_variable_spelt_almost_like_a_setting_is_warned_of_once(bare_environment: pytest.MonkeyPatch) -> None:
    """Ignored silently, JUDGESTORE_STORE_ROOTT=x left the store in ./judgestore-data without a word (was)."""
    bare_environment.setenv("JUDGESTORE_STORE_ROOTT", "elsewhere")
    bare_environment.setattr("store.settings._warned_variables", set())
    with pytest.warns(SettingsKeyWarning, match="JUDGESTORE_STORE_ROOTT .* did you mean JUDGESTORE_STORE_ROOT") as w:
        assert from_environment(Settings).store_root == Path("judgestore-data")
        from_environment(SyncSettings)
    assert len(w) == 1
    assert w[0].filename == __file__  # the caller's line, not judgestore's own


def test_a_misspelt_variable_is_warned_of_at_the_line_that_opened_the_store(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through ``Store()`` the warning named judgestore's own store.py, one frame short (was)."""
    bare_environment.setenv("JUDGESTORE_STORE_ROOTT", "elsewhere")
    bare_environment.setattr("store.settings._warned_variables", set())
    bare_environment.chdir(tmp_path)
    with pytest.warns(SettingsKeyWarning) as w:
        Store().close()
    assert w[0].filename == __file__


def test_a_lower_case_variable_spelt_almost_like_a_setting_is_warned_of(bare_environment: pytest.MonkeyPatch) -> None:
    """The settings read names in any case, so ``judgestore_store_roott`` is as lost as its upper-case spelling;
    it was not warned of (only ``JUDGESTORE_``-prefixed names were looked at)."""
    bare_environment.setenv("judgestore_store_roott", "elsewhere")
    bare_environment.setattr("store.settings._warned_variables", set())
    with pytest.warns(SettingsKeyWarning, match="judgestore_store_roott .* did you mean JUDGESTORE_STORE_ROOT"):
        assert from_environment(Settings).store_root == Path("judgestore-data")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JUDGESTORE_JOURNAL_POLICY", "sometimes"),
        ("JUDGESTORE_BUSY_TIMEOUT_MS", "-1"),
        ("JUDGESTORE_BUSY_TIMEOUT_MS", str(2**31)),  # SQLite keeps 32 bits: it would read 0, no waiting at all
        ("JUDGESTORE_AUTO_UPGRADE", "maybe"),
        ("JUDGESTORE_LEASE_SECONDS", "0"),
        ("JUDGESTORE_LEASE_SECONDS", "inf"),  # a claim that never lapses: a dead job's work is never taken over
        ("JUDGESTORE_LEASE_SECONDS", "nan"),
        ("JUDGESTORE_LEASE_SECONDS", "1e12"),  # a deadline past year 9999 failed mid-run, after requests were sent
        ("JUDGESTORE_STORE_ROOT", " "),  # a folder named " " was made (an empty one is unset)
        ("JUDGESTORE_RUN_ID", "r\udcfe"),  # not UTF-8: the rows failed to be written, after requests were sent
        ("JUDGESTORE_CREATED_BY", "me\udcfe"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(name: str, value: str, bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("JUDGESTORE_").lower()):
        Settings()


def test_an_empty_variable_is_unset_not_the_current_folder(bare_environment: pytest.MonkeyPatch) -> None:
    """Path("") is "."; a store (or a shared folder) written into the current folder was not asked for."""
    for name in ("STORE_ROOT", "STORE_URL", "SYNC_DIR", "HUB_REPO", "BUSY_TIMEOUT_MS"):
        bare_environment.setenv(f"JUDGESTORE_{name}", "")
    assert Settings().store_root == Path("judgestore-data") and Settings().store_url is None
    assert Settings().busy_timeout_ms == 30_000 and SyncSettings().sync_dir is None
    bare_environment.setenv("JUDGESTORE_HUB_REPO", "my-org/judge-cache")
    assert isinstance(open_remote(), HubRemote) and not isinstance(open_remote(), DirectoryRemote)


@pytest.mark.parametrize(
    ("kind", "given"),
    [(Settings, {"store_root": ""}), (Settings, {"store_url": ""}), (Settings, {"store_url": " "}),
     (SyncSettings, {"sync_dir": ""})],
)  # fmt: skip
def test_a_blank_folder_or_url_given_as_an_argument_is_refused(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path, kind: type, given: dict[str, object]
) -> None:
    """`Settings(store_root="")` became Path("."), and a store's rows were written into the working directory;
    `store_url=""` was the folder store (was). A blank value is refused, as an empty --store-root is."""
    bare_environment.chdir(tmp_path)
    with pytest.raises(ValidationError, match=r"is blank: give (a folder|the server's URL)"):
        kind(**given)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_setting_expands_a_tilde(bare_environment: pytest.MonkeyPatch) -> None:
    """A shell leaves the ~ of JUDGESTORE_STORE_ROOT='~/evals' as it is: a folder named "~" was made here."""
    bare_environment.setenv("JUDGESTORE_STORE_ROOT", "~/evals")
    bare_environment.setenv("JUDGESTORE_SYNC_DIR", "~/shared")
    assert Settings().store_root == Path.home() / "evals"
    assert SyncSettings().sync_dir == Path.home() / "shared"
    bare_environment.setenv("JUDGESTORE_SYNC_DIR", " ")
    with pytest.raises(InvalidInputError, match="JUDGESTORE_SYNC_DIR: is blank"):
        from_environment(SyncSettings)
    # ~name is a folder of that name, never another user's home (expanduser failed for no such user, and moved
    # the store into one that exists)
    for name in ("~scratch", "~root/x", "data/~x"):
        bare_environment.setenv("JUDGESTORE_STORE_ROOT", name)
        assert Settings().store_root == Path(name)


def test_a_folder_a_python_caller_passes_expands_a_tilde(bare_environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Store(root="~/x") and open_remote(directory=Path("~/x")) made a folder named "~" in the working folder."""
    from store.store import Store
    from tests.factories import QWEN, completion_record

    bare_environment.setenv("HOME", str(tmp_path / "home"))
    bare_environment.chdir(tmp_path)
    with Store(root="~/evals") as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
    assert (tmp_path / "home" / "evals").is_dir() and not (tmp_path / "~").exists()
    remote = open_remote(directory=Path("~/shared"))
    assert isinstance(remote, DirectoryRemote) and remote.root == tmp_path / "home" / "shared"


def test_a_bad_store_url_in_the_environment_is_named_by_its_variable_in_python_too(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from store.store import Store

    for url in ("garbage", "sqlite:///x.db"):
        bare_environment.setenv("JUDGESTORE_STORE_URL", url)
        with pytest.raises(InvalidInputError, match=r"^JUDGESTORE_STORE_URL: "):
            Store()
    with Store(root=tmp_path / "store") as store:  # a folder named wins over the variable, as --store-root does
        assert store.root == tmp_path / "store"
    bare_environment.delenv("JUDGESTORE_STORE_URL")
    with pytest.raises(InvalidInputError, match=r"^Settings.store_url: "):  # not blamed on an unset variable
        Store(Settings(store_url="mysql://x/y"))


def test_a_user_name_that_is_not_utf8_is_not_recorded(bare_environment: pytest.MonkeyPatch) -> None:
    bare_environment.setenv("LOGNAME", "me\udcfe")
    assert Settings().created_by.startswith("uid-")


@pytest.mark.parametrize(
    ("name", "value"), [("MAX_SHARD_BYTES", "0"), ("SHARD_TARGET_BYTES", "x"), ("FETCH_BEFORE_RUN", "?")]
)
def test_a_bad_sharing_setting_is_a_typed_error_naming_the_variable(
    name: str, value: str, bare_environment: pytest.MonkeyPatch
) -> None:
    bare_environment.setenv(f"JUDGESTORE_{name}", value)
    with pytest.raises(InvalidInputError, match=f"invalid setting in the environment: JUDGESTORE_{name}") as bad:
        from_environment(SyncSettings)
    assert str(bad.value).endswith(f", got {value!r}")  # the value as given: a stray space shows
    with pytest.raises(InvalidInputError, match=f"JUDGESTORE_{name}"):
        open_remote(directory=Path("/nonexistent"))


def test_what_reads_the_environment_itself_refuses_a_bad_value_naming_the_variable(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """From Python as from the command line: an InvalidInputError naming JUDGESTORE_..., not pydantic's error
    naming the field (which `except JudgestoreError` missed)."""
    from inference.cache.model import CachedModel
    from store.descriptor import ModelDescriptor
    from store.store import Store

    bare_environment.setenv("JUDGESTORE_BUSY_TIMEOUT_MS", "abc")
    descriptor = ModelDescriptor(provider="vllm", model="m")
    said = "invalid setting in the environment: JUDGESTORE_BUSY_TIMEOUT_MS"
    with pytest.raises(InvalidInputError, match=said):
        Store(root=tmp_path / "store")
    with pytest.raises(InvalidInputError, match=said):
        CachedModel(None, descriptor, task="t", mode="off", backend_factory=list)
    assert not (tmp_path / "store").exists()


_IMPORT_EVERYTHING = """
import os
import store, store.settings, store.store, store.schema, store.repository, store.layout
from store.backends.sqlite import connections
from store import Store
from store.errors import InvalidInputError
from store.settings import Settings, SyncSettings, from_environment
from store.sync import DirectoryRemote, HubRemote, open_remote
from tests.factories import QWEN
found = [m.__name__ + "." + k for m in (store.settings, store.store, store.schema, connections, store.repository)
         for k, v in vars(m).items() if isinstance(v, Settings)]
assert not found, found
os.environ["JUDGESTORE_JOURNAL_POLICY"] = "wal"
os.environ["JUDGESTORE_BUSY_TIMEOUT_MS"] = "77"
os.environ["SLURM_JOB_ID"] = "99"
s = Settings()
print(s.journal_policy, s.busy_timeout_ms, s.run_id)
"""


def test_no_settings_instance_and_no_environment_read_at_import(bare_environment: pytest.MonkeyPatch) -> None:
    """Every module imports with an invalid value in the environment (nothing builds a Settings then),
    and a Settings built later reads the variables as they are at that moment."""
    env = {**os.environ, "JUDGESTORE_JOURNAL_POLICY": "not-a-policy"}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["wal", "77", "slurm-99"]


def test_run_ids_differ_between_processes(bare_environment: pytest.MonkeyPatch) -> None:
    probe = "from store.settings import Settings; print(Settings().run_id)"
    env = dict(os.environ)
    ids = {
        subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(ids) == 2 and Settings().run_id not in ids


def test_a_folder_given_as_an_argument_means_that_folder_even_with_a_store_url_exported(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``Settings(store_root=...)`` with JUDGESTORE_STORE_URL exported opened the server: a script's scratch store
    wrote to the team's (was). ``--store-root`` and ``Store(root=...)`` already meant the folder."""
    url = "postgresql+psycopg://nobody@/nowhere"
    bare_environment.setenv("JUDGESTORE_STORE_URL", url)
    assert Settings().store_url == url  # the environment alone: the server
    assert Settings(store_root=tmp_path / "scratch").store_url is None
    assert Settings(store_root=tmp_path, store_url="postgresql+psycopg://a@/b").store_url == "postgresql+psycopg://a@/b"
    with Store(Settings(store_root=tmp_path / "scratch")) as store:
        store.database("completions", "t", QWEN)
    assert (tmp_path / "scratch").is_dir()  # written there; the unreachable server was never asked
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"JUDGESTORE_STORE_URL={url}\n")
    bare_environment.delenv("JUDGESTORE_STORE_URL")
    assert Settings(_env_file=dotenv).store_url == url  # type: ignore[call-arg]
    assert Settings(_env_file=dotenv, store_root=tmp_path).store_url is None  # type: ignore[call-arg]


def test_an_argument_spelt_almost_like_a_setting_is_warned_of_at_the_callers_line(
    bare_environment: pytest.MonkeyPatch,
) -> None:
    """``Settings(store_rot=...)`` put the store in ./judgestore-data without a word (was)."""
    with pytest.warns(SettingsKeyWarning, match=r"Settings\(store_rot=...\) names no setting .* store_root\?") as w:
        assert Settings(store_rot="elsewhere").store_root == Path("judgestore-data")  # type: ignore[call-arg]
    assert w[0].filename == __file__
    with pytest.warns(SettingsKeyWarning, match=r"SyncSettings\(hub_rep=...\) .* did you mean hub_repo"):
        SyncSettings(hub_rep="org/name")  # type: ignore[call-arg]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no misspelling: nothing said
        Settings(not_a_setting=1, store_root=Path("x"))  # type: ignore[call-arg]


def test_a_store_url_given_as_the_folder_is_refused_without_showing_it(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """JUDGESTORE_STORE_ROOT=postgresql+psycopg://eval:pw@host/db made a local folder of that name, the password in
    it, and the job's rows went there, not to the server; ls printed the password in its title (was)."""
    url = "postgresql+psycopg://eval:S3cr3tPw@dbhost/evaldb"
    bare_environment.chdir(tmp_path)
    bare_environment.setenv("JUDGESTORE_STORE_ROOT", url)
    with pytest.raises(InvalidInputError, match="JUDGESTORE_STORE_ROOT: the store's folder is a URL") as refused:
        from_environment(Settings)
    with pytest.raises(ValidationError, match="is a URL, not a folder") as direct:
        Settings(store_root=url)
    bare_environment.delenv("JUDGESTORE_STORE_ROOT")
    with pytest.raises(InvalidInputError, match=r"the store's folder \(root\) is a URL") as opened:
        Store(root=url)
    with pytest.raises(InvalidInputError, match=r"the store's folder \(root\) is a URL"):
        Store(root=Path(url))  # a Path folds :// into :/ (it slipped through, was)
    with pytest.raises(ValidationError, match="is a URL, not a folder"):
        Settings(store_root=Path(url))
    assert Settings(store_root=Path("a:/b")).store_root == Path("a:/b")  # a colon in a folder's name is no URL
    cli = subprocess.run(
        [sys.executable, "-m", "store", "ls", "--store-root", url, "--json"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert cli.returncode == 2 and "Invalid value for '--store-root': it is a URL" in cli.stderr
    for said in (str(refused.value), str(direct.value), str(opened.value), cli.stdout + cli.stderr):
        assert "S3cr3tPw" not in said
    assert list(tmp_path.iterdir()) == []  # no folder made


def test_a_command_naming_its_store_does_not_read_a_bad_store_of_the_environment(
    bare_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """JUDGESTORE_STORE_ROOT holding a URL stopped `ls --store-root DIR` and `copy --from-root A --to-root B`, which
    never use it (was)."""
    fill_small_store(tmp_path / "a")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "JUDGESTORE_STORE_ROOT": "postgresql+psycopg://u:S3cr3tPw@h/db"}

    def judgestore(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "store", *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env)  # fmt: skip

    listed = judgestore("ls", "--store-root", str(tmp_path / "a"), "--json")
    assert listed.returncode == 0 and listed.stdout.startswith("["), listed.stderr
    copied = judgestore("copy", "--from-root", str(tmp_path / "a"), "--to-root", str(tmp_path / "b"), "--json")
    assert copied.returncode == 0 and (tmp_path / "b").is_dir(), copied.stderr
    served = judgestore("ls", "--store-url", "postgresql+psycopg://u@/db?host=/nonexistent", "--json")
    assert served.returncode == 1 and "cannot reach the server" in served.stderr, served.stderr  # it was tried
    unnamed = judgestore("ls", "--json")  # the environment's store is what it would open: refused, as before
    assert unnamed.returncode == 1 and "JUDGESTORE_STORE_ROOT: the store's folder is a URL" in unnamed.stderr
    assert not any("S3cr3tPw" in run.stdout + run.stderr for run in (listed, copied, served, unnamed))
