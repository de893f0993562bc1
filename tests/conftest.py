"""Fixtures every test shares: an isolated store root, a store, a descriptor."""

from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from inference.backends.vllm.engine_logs import ENGINE_QUIET_ENV
from store.descriptor import ModelDescriptor
from store.settings import Settings
from store.store import Store
from tests.built_once import built_once
from tests.fake_openai import FakeOpenAI
from tests.pg_server import Cluster, running_cluster, server_bin


@pytest.fixture(scope="session")
def _vllm_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One vLLM cache folder for the whole run, shared by every test process."""
    return built_once(tmp_path_factory, "vllm-cache", lambda folder: None)


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _vllm_cache_root: Path) -> None:
    """No test touches a real store: the default root points into the test's temp folder."""
    for name in list(os.environ):
        if name.startswith("JUDGESTORE_"):
            monkeypatch.delenv(name)
    # A command run in-process quiets the engine through os.environ (engine_logs.quiet_engine) for good; a later
    # test's subprocess must not inherit that (a worker of pytest-xdist runs many tests in one process).
    for name in ENGINE_QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUDGESTORE_STORE_ROOT", str(tmp_path / "store"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a server store's side files
    # vLLM keeps its cache under XDG_CACHE_HOME unless told otherwise. In it, what it learns of a model class by
    # importing it in a subprocess of its own (vLLM and torch again, about 10 s): kept for the run, each engine after
    # the first skips that subprocess.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(_vllm_cache_root))
    monkeypatch.setenv("JUDGESTORE_RUN_ID", "test-run")
    monkeypatch.setenv("JUDGESTORE_CREATED_BY", "tester")


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> Iterator[Store]:
    with Store(Settings(), root=store_root) as s:
        yield s


@pytest.fixture
def descriptor() -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0, "max_tokens": 64})


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the commands the tests start, however the run itself was started.

    A shell starts a background job with SIGINT ignored, and a process keeps
    an ignored signal across ``exec``: started that way (``pytest &``, a CI
    runner's job), every command a test starts would ignore the Ctrl-C the
    test sends it, and exit 0 instead of 130.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------- the slow modules first

# The modules that took longest in a whole run (`pytest --durations=80`, 2 workers, 2026-12-01), longest first:
# each starts vLLM, its server or many processes several times.
SLOWEST_MODULES = (
    "tests/inference/test_cli.py",
    "tests/inference/test_cached_engine.py",
    "tests/inference/test_cache_commands.py",
    "tests/inference/test_shared_batch.py",
    "tests/inference/test_adopt_engine.py",
    "tests/test_examples.py",
    "tests/inference/test_postgres_engine.py",
    "tests/inference/test_openai_server.py",
    "tests/test_bad_stores.py",
    "tests/test_conftest.py",
)
ENGINE_FIXTURES = frozenset({"tiny_model_dir", "tiny_model_dir_b"})  # a test that starts vLLM (10-45 s each)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest modules run first, then the other modules whose tests start vLLM, then the rest.

    pytest-xdist's ``--dist loadfile`` hands whole modules to the workers in
    this order (``--no-loadscope-reorder``; by default it hands out the
    modules with the most tests first, and the vLLM modules, with few tests
    each, came last: one worker ran them alone for minutes while the other had
    nothing left). First, they start at once and the quick modules fill the
    end. Tests keep their order within a module; a module missing from
    :data:`SLOWEST_MODULES` only runs later than it could.
    """

    def module_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    engine_modules = {module_of(item) for item in items if ENGINE_FIXTURES & set(item.fixturenames)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = module_of(item)
        if module in SLOWEST_MODULES:
            return (0, SLOWEST_MODULES.index(module))
        return (1 if module in engine_modules else 2, 0)

    items.sort(key=rank)  # stable: modules of one rank keep their collection order


# ---------------------------------------------------------------- where every test must run

NO_SKIPS = "JS_TEST_NO_SKIPS"  # CI sets it: a test skipped there (no server, no vLLM, no mount) fails instead


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``JS_TEST_NO_SKIPS``, a skipped test is reported failed, with the reason it was skipped."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get(NO_SKIPS) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped ({reason}), but {NO_SKIPS} says every test must run here"


@pytest.hookimpl(wrapper=True)
def pytest_collectreport(report: pytest.CollectReport) -> Iterator[None]:
    """Under ``JS_TEST_NO_SKIPS``, a module skipped while it is collected (a module-level ``importorskip``) fails.

    Its tests never become items, so the hook above never sees them: without this, they would vanish with exit 0.
    A wrapper changes the report before any other implementation sees it (pytest's session counts it as the
    collection error it now is, and stops with a non-zero exit).
    """
    if report.skipped and os.environ.get(NO_SKIPS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"{report.nodeid} was skipped while collected ({reason}), but {NO_SKIPS} says every test must run here"
        )
    return (yield)


# ---------------------------------------------------------------- a PostgreSQL server, started by the tests


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster for the session (tests/pg_server.py); skipped only without its binaries."""
    missing = None
    if server_bin() is None:
        missing = "PostgreSQL's server binaries are not installed (apt-get install postgresql; .ci/setup does it)"
    elif importlib.util.find_spec("psycopg") is None:
        missing = "the psycopg driver is not installed (pip install 'psycopg[binary]>=3.2')"
    if missing is not None:
        pytest.skip(missing)  # a failure where every test must run (NO_SKIPS)
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of an empty database of its own on the test cluster, dropped when the test ends."""
    name = pg_cluster.new_database()
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


# ---------------------------------------------------------------- a model behind an OpenAI-compatible server

OPENAI_KEY = "sk-test-0123456789abcdef0123456789"  # what the fake server demands, from $JUDGE_KEY


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible server on loopback (tests/fake_openai.py); its key is in ``$JUDGE_KEY``."""
    pytest.importorskip("openai", reason="the hosted backend needs the openai client (pip install 'openai>=1.50')")
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUDGE_KEY", OPENAI_KEY)
    with FakeOpenAI(api_key=OPENAI_KEY) as server:
        yield server


@pytest.fixture
def chat_prompts(tmp_path: Path) -> Path:
    """Five chat requests (``instruction_id`` 0 to 4) in a JSONL file."""
    path = tmp_path / "prompts.jsonl"
    rows = [{"instruction_id": str(i), "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(5)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path
