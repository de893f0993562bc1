"""A Hub model id always resolves to a pinned descriptor: local cache first, else the Hub, else a clear refusal.

The Hub is the fake one the sync tests use: an HTTP server on loopback that
speaks the real ``huggingface_hub`` client's protocol. A socket guard makes
sure nothing else is reached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.backends.vllm.model_source import cached_commit, resolve_model
from inference.backends.vllm.tiny_model import CHATML_TEMPLATE
from inference.cli.generate import register
from store.cli.app import build_app
from store.descriptor import sha256_hex
from store.errors import InvalidInputError, ModelFolderNotFoundError, ModelNotFoundError, UnpinnedModelError
from tests import socket_guard
from tests.factories import file_digests
from tests.fake_hub import FakeHub, point_client_at

REPO = "org/tiny-chat"
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    socket_guard.install()
    yield
    socket_guard.uninstall()


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    return tmp_path / "hf-home"


@pytest.fixture
def hub(tiny_model_dir: Path, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake Hub holding the tiny model's files (weights included) as model repo ``org/tiny-chat``."""
    with FakeHub(lfs_patterns=("*.safetensors",)) as fake:
        fake.create_repo(REPO, repo_type="model")
        files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
        fake.put_raw(REPO, dict(files), repo_type="model")
        point_client_at(monkeypatch, hf_home, endpoint=fake.endpoint)
        yield fake


def main_commit(hub: FakeHub) -> str:
    commit = hub.repo(REPO, "model").resolve("main")
    assert commit is not None
    return commit.oid


def test_a_never_downloaded_id_is_pinned_through_the_hub_without_its_weights(hub: FakeHub, hf_home: Path) -> None:
    source = resolve_model(REPO)
    assert source.revision == main_commit(hub) and source.pinned and source.name == REPO
    assert source.files is not None and (source.files / "tokenizer_config.json").is_file()
    assert hub.count("GET", "model.safetensors") == 0  # only the small files the key needs
    assert not (source.files / "model.safetensors").exists()

    descriptor = descriptor_from_vllm(REPO)
    assert descriptor.revision == main_commit(hub)
    assert descriptor.chat_template_sha256 == sha256_hex(CHATML_TEMPLATE.encode())
    assert not descriptor.unpinned


def test_the_local_cache_answers_first_and_never_asks_the_hub(hub: FakeHub, hf_home: Path) -> None:
    pinned = descriptor_from_vllm(REPO)
    cache = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    (cache / "refs").mkdir(parents=True, exist_ok=True)
    (cache / "refs" / "main").write_text(pinned.revision or "")  # what a real download leaves behind
    before = len(hub.requests)
    assert descriptor_from_vllm(REPO).sha256() == pinned.sha256()
    assert len(hub.requests) == before


def test_a_branch_that_moved_on_the_hub_gives_a_new_descriptor(hub: FakeHub, hf_home: Path) -> None:
    first = descriptor_from_vllm(REPO)
    config = json.loads(hub.files(REPO, "model")["tokenizer_config.json"])
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    hub.put_raw(REPO, {"tokenizer_config.json": json.dumps(config).encode()}, repo_type="model")

    moved = descriptor_from_vllm(REPO)
    assert moved.revision == main_commit(hub) != first.revision
    assert moved.chat_template_sha256 == sha256_hex(config["chat_template"].encode())
    assert moved.sha256() != first.sha256()
    # Resolving fetched files by commit: the cache never froze the branch at the old commit.
    assert cached_commit(REPO, None, hf_home / "hub") is None


def test_a_tag_resolves_to_its_commit(hub: FakeHub) -> None:
    tagged = hub.tag(REPO, "v1.0", repo_type="model")
    hub.put_raw(REPO, {"README.md": b"moved on"}, repo_type="model")
    assert main_commit(hub) != tagged
    assert resolve_model(REPO, "v1.0").revision == tagged
    assert descriptor_from_vllm(REPO, engine_kwargs={"revision": "v1.0"}).revision == tagged
    assert descriptor_from_vllm(REPO, engine_kwargs={"revision": tagged}).revision == tagged


def test_the_tokenizer_of_another_revision_is_in_the_key(hub: FakeHub) -> None:
    """The model at one commit, its tokenizer at another (engine kwarg tokenizer_revision): the tokenizer's
    revision must reach the key, or a run with another tokenizer would hit the first run's rows."""
    first = main_commit(hub)
    config = json.loads(hub.files(REPO, "model")["tokenizer_config.json"])
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    second = hub.put_raw(REPO, {"tokenizer_config.json": json.dumps(config).encode()}, repo_type="model")
    assert second != first
    own = descriptor_from_vllm(REPO, engine_kwargs={"revision": first})
    same = descriptor_from_vllm(REPO, engine_kwargs={"revision": first, "tokenizer_revision": first})
    other = descriptor_from_vllm(REPO, engine_kwargs={"revision": first, "tokenizer_revision": second})
    assert same.sha256() == own.sha256()
    assert other.sha256() != own.sha256() and other.engine.get("tokenizer_revision") == second


def test_unknown_models_and_revisions_are_typed_errors(hub: FakeHub) -> None:
    with pytest.raises(ModelNotFoundError, match="neither a local folder nor a model on the Hub"):
        resolve_model("org/no-such-model")
    with pytest.raises(ModelNotFoundError, match="no revision 'v9'"):
        resolve_model(REPO, "v9")


def test_offline_and_never_downloaded_is_refused_with_the_ways_out(
    hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_client_at(monkeypatch, hf_home, offline=True)
    with pytest.raises(UnpinnedModelError) as caught:
        descriptor_from_vllm(REPO)
    message = str(caught.value)
    for way_out in ("HF_HUB_OFFLINE", "hf download", "--revision", "--allow-unpinned"):
        assert way_out in message


def test_an_unreachable_hub_is_refused_too(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    point_client_at(monkeypatch, hf_home, endpoint="http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(UnpinnedModelError, match="cannot be asked"):
        descriptor_from_vllm(REPO)


def test_unpinned_is_explicit_and_never_shares_rows_with_pinned(
    hub: FakeHub, hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = descriptor_from_vllm(REPO)
    point_client_at(monkeypatch, hf_home / "elsewhere", offline=True)  # another machine, offline, nothing cached
    unpinned = descriptor_from_vllm(REPO, allow_unpinned=True)
    assert unpinned.unpinned and unpinned.revision == "unpinned:main"
    assert unpinned.chat_template_sha256 is None
    assert unpinned.sha256() != pinned.sha256()
    assert descriptor_from_vllm(REPO, allow_unpinned=True, engine_kwargs={"revision": "v2"}).revision == "unpinned:v2"


def test_generate_refuses_an_unpinnable_model_before_planning(
    tmp_path: Path, hf_home: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_client_at(monkeypatch, hf_home, offline=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    result = CliRunner().invoke(
        build_app(register), ["generate", "--model", REPO, "--task", "t", "-i", str(prompts), "--json"]
    )
    assert result.exit_code == 1
    error = json.loads(result.stderr)
    assert error["type"] == "UnpinnedModelError" and "--allow-unpinned" in error["error"]
    assert "Traceback" not in result.output
    assert file_digests(store_root) == {}  # nothing planned, nothing written


@pytest.mark.parametrize(
    "spelling", ["./models/does-not-exist", "../does-not-exist", "/no/such/folder", "~/no-such-model", "models/gone"]
)
def test_a_path_that_is_not_a_folder_is_no_such_folder_never_a_hub_id(
    spelling: str, tmp_path: Path, hf_home: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_client_at(monkeypatch, hf_home, offline=True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # "models/gone": its parent folder exists, so it is a path
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    result = CliRunner().invoke(
        build_app(register), ["generate", "--model", spelling, "--task", "t", "-i", str(prompts), "--json"]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    error = json.loads(result.stderr)
    assert error == {"error": f"no such model folder: {spelling}", "type": "ModelFolderNotFoundError"}
    assert file_digests(store_root) == {}
    with pytest.raises(ModelFolderNotFoundError, match="no such model folder"):
        resolve_model(spelling)


@pytest.mark.parametrize("spelling", [" {folder}", "{folder} ", " org/model"])
def test_a_model_with_whitespace_around_it_is_refused_as_a_quoting_slip_never_a_hub_id(
    spelling: str, tmp_path: Path, hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """' /models/m' was taken for a Hub id: refused as unpinned, with advice about the Hugging Face cache (was)."""
    point_client_at(monkeypatch, hf_home, offline=True)
    (tmp_path / "m").mkdir()
    model = spelling.format(folder=tmp_path / "m")
    with pytest.raises(ModelFolderNotFoundError, match="starts or ends with whitespace"):
        resolve_model(model)


def test_a_folder_of_json_files_without_a_config_is_not_a_model_folder(tmp_path: Path) -> None:
    """A folder holding some *.json (a run's output) but no config.json reached vLLM, which refused it in several
    lines blamed on --engine-arg (was)."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    with pytest.raises(InvalidInputError, match=r"outputs: no config.json, so not a model folder"):
        resolve_model(str(folder))
    (folder / "params.json").write_text("{}")  # Mistral's own format names its config so
    assert resolve_model(str(folder)) is not None


def test_a_file_is_not_a_model_folder_and_a_hub_id_is_still_a_hub_id(
    tmp_path: Path, hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_client_at(monkeypatch, hf_home, offline=True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    with pytest.raises(ModelFolderNotFoundError, match=r"weights.safetensors is a file, not a model folder"):
        resolve_model("./weights.safetensors")
    with pytest.raises(UnpinnedModelError, match="hf download org/never-seen"):  # no folder "org" here: a Hub id
        resolve_model("org/never-seen")
