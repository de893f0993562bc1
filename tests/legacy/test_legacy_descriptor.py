"""Legacy descriptors map onto the descriptor a live run computes (inference/legacy/settings.py, legacy.py).

The reference is always the live path itself: ``ModelSpec(...).descriptor``
with the settings a user would pass today. A mapping that differs from it by
one bit would import rows that never hit again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.backends.vllm.descriptor import backend_version
from inference.legacy.mapper import LegacyDescriptorMapper, parse_assumed_models
from inference.legacy.settings import LEGACY_EXECUTION_ONLY, live_spec, map_legacy_descriptor
from inference.legacy.user_descriptor import load_user_descriptor
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, LegacyMappingError
from store.layout import read_metadata, walk
from store.legacy.detect import detect
from store.legacy.metadata import read_legacy_metadata
from tests.inference.conftest import TINY_ENGINE_KWARGS
from tests.legacy import builders as b
from tests.legacy.conftest import run_import

LEGACY_ENGINE = {k: v for k, v in TINY_ENGINE_KWARGS.items() if k not in LEGACY_EXECUTION_ONLY}


def s3(model: str, kwargs: dict[str, Any], tmp_path: Path, **extra: Any) -> Any:
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(b.s3_metadata(model, kwargs, backend_version=backend_version(), **extra)))
    return read_legacy_metadata(path)


def live(model: Path | str, **settings: Any) -> ModelDescriptor:
    return ModelSpec(model=str(model), **settings).descriptor


def test_s3_kwargs_map_to_the_live_descriptor(tiny_model: Path, tmp_path: Path) -> None:
    """Engine kwargs (legacy execution-only ones already dropped, judgestore's dropped too), sampling kwargs
    spelled as ints, the engine seed: the same descriptor as the live spec with floats and execution settings."""
    legacy_kwargs = {**LEGACY_ENGINE, "max_tokens": 8, "temperature": 0, "top_p": 1, "chat_template": None}
    descriptor, spec, _ = map_legacy_descriptor(s3(str(tiny_model), legacy_kwargs, tmp_path))
    expected = live(
        tiny_model,
        engine_kwargs=TINY_ENGINE_KWARGS,
        sampling={"temperature": 0.0, "top_p": 1.0, "max_tokens": 8},
    )
    assert descriptor == expected and descriptor.sha256() == expected.sha256()
    assert descriptor.engine == {"dtype": "float32", "max_model_len": 256, "seed": 0}
    assert descriptor.revision is not None and descriptor.revision.startswith("sha256:")
    assert descriptor.chat_template_sha256 is not None  # the tiny model's own ChatML template
    assert spec.descriptor == expected


def test_the_live_settings_line_builds_the_imported_descriptor_a_schemas_order_kept(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The line said every object's keys sorted: a run built from it computed another descriptor (the schema's
    properties reversed) and missed the imported rows (was)."""
    from inference.legacy.settings import settings_line

    schema = {"type": "object", "properties": {"score": {"type": "integer"}, "reason": {"type": "string"}}}
    legacy_kwargs = {"max_tokens": 8, "temperature": 0, "structured_outputs": {"json": schema}}
    descriptor, spec, _ = map_legacy_descriptor(s3(str(tiny_model), legacy_kwargs, tmp_path))
    line = orjson.loads(settings_line(spec))
    again = ModelSpec(model=line["model"], sampling=line["sampling"], engine_kwargs=line["engine_kwargs"])
    assert again.descriptor.hash16() == descriptor.hash16()
    assert list(line["sampling"]["structured_outputs"]["json"]["properties"]) == ["score", "reason"]


def test_missing_temperature_and_top_p_mean_the_legacy_defaults(tiny_model: Path, tmp_path: Path) -> None:
    descriptor, _, _ = map_legacy_descriptor(s3(str(tiny_model), {"max_tokens": 16, "top_p": None}, tmp_path))
    assert (descriptor.sampling.temperature, descriptor.sampling.top_p) == (0.6, 0.95)
    assert descriptor == live(tiny_model, sampling={"temperature": 0.6, "top_p": 0.95, "max_tokens": 16})


def test_an_inline_chat_template_and_thinking_settings_map_to_their_live_spelling(
    tiny_model: Path, tmp_path: Path
) -> None:
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    kwargs = {
        "max_tokens": 8,
        "temperature": 0.0,
        "chat_template": template,
        "disable_thinking": True,
        "thinking_token_budget": 128,
        "chat_template_kwargs": {"reasoning_effort": "low"},
    }
    descriptor, _, _ = map_legacy_descriptor(s3(str(tiny_model), kwargs, tmp_path))
    template_file = tmp_path / "template.jinja"
    template_file.write_text(template)
    expected = live(
        tiny_model,
        sampling={"temperature": 0.0, "top_p": 0.95, "max_tokens": 8},
        chat_template=str(template_file),  # a file with the same text hashes alike
        chat_template_kwargs={"reasoning_effort": "low"},
        enable_thinking=False,
        thinking_token_budget=128,
    )
    assert descriptor == expected
    own_template, _, _ = map_legacy_descriptor(s3(str(tiny_model), {**kwargs, "chat_template": None}, tmp_path))
    assert own_template.chat_template_sha256 != descriptor.chat_template_sha256


def test_backend_version_is_the_legacy_one(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(b.s3_metadata(str(tiny_model), {"max_tokens": 8}, backend_version="0.10.1")))
    descriptor, _, _ = map_legacy_descriptor(read_legacy_metadata(path))
    assert descriptor.backend_version == "0.10.1"


@pytest.mark.parametrize("recorded", [10, "", " ", {"vllm": "0.10.1"}])
def test_a_backend_version_that_is_no_version_string_is_refused_not_read_as_none_recorded(
    tiny_model: Path, tmp_path: Path, recorded: Any
) -> None:
    doc = b.s3_metadata(str(tiny_model), {"max_tokens": 8}, backend_version=None)
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps({**doc, "backend_version": recorded}))
    with pytest.raises(LegacyMappingError, match=r"backend_version .* is not a version \(a string"):
        map_legacy_descriptor(read_legacy_metadata(path))
    path.write_text(json.dumps({**doc, "backend_version": None}))  # recorded as none: no version, as before
    assert map_legacy_descriptor(read_legacy_metadata(path))[0].backend_version is None


@pytest.mark.parametrize(
    ("extra", "kwargs", "reason"),
    [
        ({"provider": "OpenRouter"}, {}, "provider 'OpenRouter' has no live descriptor rules"),
        ({"endpoint": "http://localhost:8000/v1"}, {}, "served through the endpoint"),
        ({"input_mode": "auto"}, {}, "input_mode 'auto'"),
        ({"sampling_v2": {}}, {}, "fields ['sampling_v2'] that judgestore does not know"),
        ({}, {"chat_template": 3}, "chat_template is not a string"),
        ({}, {"max_tokens": None}, "max_tokens is not recorded; pass --assume-setting max_tokens=N"),
        ({}, {"max_tokens": -3}, "max_tokens -3: a live run needs at least 1"),
        ({}, {"max_tokens": 0.0}, "max_tokens 0.0: a live run needs at least 1"),
    ],
)
def test_what_the_live_rules_cannot_reproduce_is_refused(
    tiny_model: Path, tmp_path: Path, extra: dict[str, Any], kwargs: dict[str, Any], reason: str
) -> None:
    provider = extra.pop("provider", "VLLM")
    with pytest.raises(LegacyMappingError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        map_legacy_descriptor(s3(str(tiny_model), kwargs, tmp_path, provider=provider, **extra))


def test_s2_descriptors_map_with_the_same_rules(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    doc = {
        "descriptor_schema_version": "judgearena-inference-descriptor/v1",
        "model_spec": f"VLLM/{tiny_model}",
        "model": str(tiny_model),
        "input_mode": "chat",
        "chat_template": None,
        "chat_template_kwargs": {"enable_thinking": False},
        "sampling": {"temperature": 0, "max_tokens": 8.0},
        "engine_settings": {"dtype": "float32", "max_model_len": 256.0, "gpu_memory_utilization": 0.9},
        "vllm_version": backend_version(),
    }
    path.write_text(json.dumps(doc))
    descriptor, _, _ = map_legacy_descriptor(read_legacy_metadata(path))
    expected = live(
        tiny_model,
        engine_kwargs={"dtype": "float32", "max_model_len": 256},
        sampling={"temperature": 0.0, "top_p": 0.95, "max_tokens": 8},
        enable_thinking=False,
    )
    assert descriptor == expected


def test_assumed_settings_fill_only_what_was_not_recorded(tiny_model: Path, tmp_path: Path) -> None:
    metadata = s3(str(tiny_model), {"max_tokens": 8, "temperature": 0}, tmp_path)
    spec, notes = live_spec(metadata, assumed={"logprobs": 3})
    assert spec.sampling["logprobs"] == 3 and notes == ["logprobs=3"]
    assert live_spec(metadata, assumed={"max_tokens": 8})[1] == []  # recorded, same value: nothing assumed
    with pytest.raises(LegacyMappingError, match="records max_tokens=8 but --assume-setting says 9"):
        live_spec(metadata, assumed={"max_tokens": 9})
    unrecorded = s3(str(tiny_model), {"temperature": 0, "max_tokens": None}, tmp_path)
    spec, notes = live_spec(unrecorded, assumed={"max_tokens": 512})
    assert spec.sampling["max_tokens"] == 512 and notes == ["max_tokens=512"]


def _tree_with(legacy_root: Path, model: str, kwargs: dict[str, Any], task: str = "t") -> Path:
    metadata = b.s3_metadata(model, kwargs, backend_version=backend_version())
    folder = b.legacy_folder(legacy_root, "completions", task, "VLLM", model, metadata)
    text = b.rendered_messages([{"role": "user", "content": f"hi from {task}"}])
    row = {
        "input_hash": b.sha(text),
        "input_text": text,
        "completion": "hello",
        "benchmark": task,
        "instruction_id": "0",
        "model": model,
        "pushed_by": "u",
        "pushed_at": "2026-01-01T00:00:00",
        "run_id": "r",
    }
    return b.create_db(folder / "completions.db", b.S4C_DDL, [row])


def test_without_an_assumption_the_source_is_skipped_and_says_what_to_pass(
    tiny_model: Path, legacy_root: Path, store_root: Path
) -> None:
    _tree_with(legacy_root, str(tiny_model), {"max_tokens": 8})
    detections = detect([legacy_root]).detections
    report = run_import([legacy_root], store_root, LegacyDescriptorMapper(detections=detections))
    (reason,) = report.sources[0].skipped
    assert "does not record the resolved revision or chat template" in reason
    assert f"--assume-current-model '{tiny_model}'" in reason
    assert not store_root.exists()


def test_a_source_whose_settings_no_live_run_computes_is_skipped_with_its_reason_and_nothing_written(
    tiny_model: Path, legacy_root: Path, store_root: Path
) -> None:
    _tree_with(legacy_root, str(tiny_model), {"max_tokens": -3, "temperature": 0})
    detections = detect([legacy_root]).detections
    mapper = LegacyDescriptorMapper(
        assume_current_model=parse_assumed_models([f"{tiny_model}={tiny_model}"]), detections=detections
    )
    report = run_import([legacy_root], store_root, mapper)
    (reason,) = report.sources[0].skipped
    assert "max_tokens -3: a live run needs at least 1" in reason
    assert report.totals()["imported"] == 0 and not store_root.exists()


def test_the_assumption_is_recorded_in_metadata_json(tiny_model: Path, legacy_root: Path, store_root: Path) -> None:
    _tree_with(legacy_root, "org/old-name", {"max_tokens": 8})
    detections = detect([legacy_root]).detections
    mapper = LegacyDescriptorMapper(
        assume_current_model=parse_assumed_models([f"org/old-name={tiny_model}"]), detections=detections
    )
    report = run_import([legacy_root], store_root, mapper)
    assert report.totals()["imported"] == 1
    (location,) = walk(store_root)
    metadata = read_metadata(location.folder(store_root))
    assert metadata.descriptor.model == tiny_model.name
    assert metadata.descriptor == live(tiny_model, sampling={"temperature": 0.6, "top_p": 0.95, "max_tokens": 8})
    (assumption,) = metadata.assumptions
    assert "recorded no revision or chat template for 'org/old-name'" in assumption
    assert str(metadata.descriptor.revision) in assumption
    assert any("live settings that hit these rows" in note for note in report.sources[0].notes)


@pytest.mark.parametrize(
    ("assumed", "logprobs"),
    [("logprobs", 3), ("completions:logprobs", 3), ("judgements:logprobs", None)],
)
def test_a_setting_assumed_for_one_role_leaves_the_other_roles_sources_as_recorded(
    tiny_model: Path, legacy_root: Path, store_root: Path, assumed: str, logprobs: int | None
) -> None:
    """A judge's setting, given for a whole data folder, keyed its completion caches apart: no live run hit them."""
    _tree_with(legacy_root, str(tiny_model), {"max_tokens": 8})  # a completions cache
    mapper = LegacyDescriptorMapper(
        assume_current_model=parse_assumed_models([str(tiny_model)]),
        assume_settings={assumed: 3},
        detections=detect([legacy_root]).detections,
    )
    report = run_import([legacy_root], store_root, mapper)
    if logprobs:  # keyed as asking for logprobs, which a completions cache never kept: served short, so skipped
        assert (report.totals()["imported"], report.totals()["skipped"]) == (0, 1)
        assert "no top_logprobs, where the descriptor asks for 3 per position" in str(report.as_dict())
        return
    assert report.totals()["imported"] == 1
    (location,) = walk(store_root)
    sampling = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 8}
    assert read_metadata(location.folder(store_root)).descriptor == live(tiny_model, sampling=sampling)


def test_a_setting_assumed_for_what_is_no_role_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="'judge' is no role; give KEY=VALUE, or ROLE:KEY=VALUE"):
        LegacyDescriptorMapper(assume_settings={"judge:logprobs": 3})


def test_a_user_descriptor_is_never_spread_over_two_legacy_descriptors(
    tiny_model: Path, legacy_root: Path, store_root: Path, tmp_path: Path
) -> None:
    _tree_with(legacy_root, str(tiny_model), {"max_tokens": 8}, task="a")
    _tree_with(legacy_root, str(tiny_model), {"max_tokens": 16}, task="b")
    descriptor_file = tmp_path / "d.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="m").model_dump_json())
    detections = detect([legacy_root]).detections
    mapper = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=detections)
    report = run_import([legacy_root], store_root, mapper)
    for source in report.sources:
        (reason,) = source.skipped
        assert "--descriptor applies to one legacy descriptor" in reason
    single = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=detections[:1])
    assert run_import([detections[0].path], store_root, single).totals()["imported"] == 1


def test_a_user_descriptor_is_never_spread_over_the_s1_folders_of_two_models(
    legacy_root: Path, store_root: Path, tmp_path: Path
) -> None:
    """An S1 metadata.json names its model: two folders of two models went in under one --descriptor, one model's
    answers then hits of the other's run, exit 0 (was)."""
    for model in ("llama-3-8b", "qwen-7b"):
        folder = legacy_root / "s1" / model
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text(json.dumps({"model": model, "arena": "mt-bench"}))
        b.create_db(folder / "judgements.db", b.S1J_DDL, [
            {"instruction_index": 0, "model_A": "a", "model_B": "b", "judge_input": f"p {model}", "judge_output": "A"}
        ])  # fmt: skip
    descriptor_file = tmp_path / "d.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="m").model_dump_json())
    detections = detect([legacy_root]).detections
    mapper = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=detections)
    report = run_import([legacy_root], store_root, mapper, task="t")
    assert report.totals()["imported"] == 0 and len(report.sources) == 2
    for source in report.sources:
        (reason,) = source.skipped
        assert "--descriptor applies to one legacy descriptor" in reason
    one = [d for d in detections if "qwen" in str(d.path)]
    single = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=one)
    assert run_import([one[0].path.parent], store_root, single, task="t").totals()["imported"] == 1


def _s0_of(root: Path, judge: str, verdict: str) -> Path:
    row = {"benchmark": "mt", "instruction_id": "1", "model_a": "a", "model_b": "b", "judge": judge,
           "judge_input": "the same judge prompt", "judge_completion": verdict,
           "date": "2025-12-31T23:59:59"}  # fmt: skip
    return b.create_db(root / "cache" / "db" / "mt" / f"{judge}.db", b.S0_DDL, [row])


def test_a_user_descriptor_is_never_spread_over_the_s0_files_of_two_judges(
    legacy_root: Path, store_root: Path, tmp_path: Path
) -> None:
    """Was: both imported under the one descriptor, the second judge's verdict a "conflict" of the first's, and
    that source still "imported"."""
    gpt4, llama = _s0_of(legacy_root, "gpt-4", "[[A]]"), _s0_of(legacy_root, "llama-70b", "[[B]]")
    descriptor_file = tmp_path / "d.json"
    descriptor_file.write_text(ModelDescriptor(provider="vllm", model="gpt-4").model_dump_json())
    detections = detect([legacy_root]).detections
    assert sorted(d.judges for d in detections) == [("gpt-4",), ("llama-70b",)]
    mapper = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=detections)
    report = run_import([legacy_root], store_root, mapper, task="mt")
    assert report.totals()["imported"] == 0 and not report.ok and not list(walk(store_root))
    for source in report.sources:
        (reason,) = source.skipped
        assert "--descriptor names one judge, and the S0 files given hold the verdicts of several ('gpt-4', " in reason
    one = detect([gpt4]).detections
    alone = LegacyDescriptorMapper(user_descriptor=load_user_descriptor(descriptor_file), detections=one)
    assert run_import([gpt4], store_root, alone, task="mt").totals()["imported"] == 1
    assert llama.exists()


def test_user_descriptor_files(tiny_model: Path, tmp_path: Path) -> None:
    vllm_form = tmp_path / "vllm.json"
    vllm_form.write_bytes(
        orjson.dumps(
            {
                "vllm": {
                    "model": str(tiny_model),
                    "engine_kwargs": TINY_ENGINE_KWARGS,
                    "sampling": {"temperature": 0, "max_tokens": 8},
                }
            }
        )
    )
    loaded = load_user_descriptor(vllm_form)
    assert loaded.descriptor == live(
        tiny_model, engine_kwargs=TINY_ENGINE_KWARGS, sampling={"temperature": 0, "max_tokens": 8}
    )
    assert "resolved from" in loaded.assumption
    # The vLLM that made the rows: named by the file, or said to be assumed (it was stamped silently, was)
    installed = loaded.descriptor.backend_version
    assert f"made by vLLM {installed}, the version installed here (the file names none" in loaded.assumption
    older = tmp_path / "older.json"
    older.write_bytes(
        orjson.dumps({"vllm": orjson.loads(vllm_form.read_bytes())["vllm"] | {"backend_version": "0.8.5"}})
    )
    made_by_older = load_user_descriptor(older)
    assert made_by_older.descriptor.backend_version == "0.8.5" and "made by vLLM 0.8.5, as the file says" in (
        made_by_older.assumption
    )
    assert made_by_older.descriptor.model_dump() | {"backend_version": installed} == loaded.descriptor.model_dump()
    older.write_bytes(orjson.dumps({"vllm": {"model": str(tiny_model), "backend_version": 8}}))
    with pytest.raises(InvalidInputError, match=r"older.json: backend_version must be a vLLM version"):
        load_user_descriptor(older)
    metadata_form = tmp_path / "metadata.json"
    metadata_form.write_bytes(orjson.dumps({"descriptor": orjson.loads(loaded.descriptor.canonical_json())}))
    assert load_user_descriptor(metadata_form).descriptor == loaded.descriptor
    bad = tmp_path / "bad.json"
    bad.write_text('{"provider": "vllm"}')
    with pytest.raises(InvalidInputError, match=r"bad.json: not a judgestore descriptor"):
        load_user_descriptor(bad)
    # Only the settings a legacy run could have had: a label or an opt-out of pinning is not a vLLM setting.
    bad.write_text(orjson.dumps({"vllm": {"model": str(tiny_model), "allow_unpinned": True}}).decode())
    with pytest.raises(InvalidInputError, match=r"bad.json: invalid vLLM settings \(unknown keys \['allow_unpinned'\]"):
        load_user_descriptor(bad)
    with pytest.raises(InvalidInputError, match="expects MODEL or LEGACY=CURRENT"):
        parse_assumed_models(["=x"])
    # A Hub model this machine cannot pin: advice that works for an import (it advised --allow-unpinned, which
    # import does not take, was)
    bad.write_text(orjson.dumps({"vllm": {"model": "nobody/never-cached", "sampling": {"max_tokens": 8}}}).decode())
    with pytest.raises(InvalidInputError, match=r"bad.json: .*nobody/never-cached cannot be pinned") as refused:
        load_user_descriptor(bad)
    assert "hf download nobody/never-cached" in str(refused.value) and "--descriptor FILE" in str(refused.value)
    assert "--allow-unpinned" not in str(refused.value)
