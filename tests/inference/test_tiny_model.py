"""The random Llama builder at other sizes (``ModelShape``): what ``bench/gpu_bench.py`` builds at ~1B parameters."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from inference.backends.base import EngineRequest
from inference.backends.vllm.backend import create_vllm_backend
from inference.backends.vllm.descriptor import descriptor_from_vllm
from inference.backends.vllm.tiny_model import LLAMA_1B, TINY, VOCAB_SIZE, ModelShape, build_tiny_model
from tests.inference.conftest import TINY_ENGINE_KWARGS

# Grouped-query attention (2 key-value heads for 4), three layers, a longer context: every field unlike TINY's.
SMALL_GQA = ModelShape(
    hidden_size=96,
    intermediate_size=160,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    max_positions=1024,
    initializer_range=0.05,
    dtype="float32",
)


def weights(folder: Path) -> dict[str, object]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("shape", [TINY, SMALL_GQA, dataclasses.replace(SMALL_GQA, dtype="float16")])
def test_the_folder_holds_the_shapes_weights_and_config(tmp_path: Path, shape: ModelShape) -> None:
    folder = build_tiny_model(tmp_path / "m", shape=shape)
    tensors = weights(folder)
    assert sum(t.size for t in tensors.values()) == shape.parameters  # type: ignore[attr-defined]
    assert {str(t.dtype) for t in tensors.values()} == {shape.dtype}  # type: ignore[attr-defined]
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (q, shape.hidden_size)  # type: ignore[attr-defined]
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (kv, shape.hidden_size)  # type: ignore[attr-defined]
    assert f"model.layers.{shape.num_layers - 1}.mlp.down_proj.weight" in tensors
    assert f"model.layers.{shape.num_layers}.mlp.down_proj.weight" not in tensors
    spread = float(tensors["model.layers.0.mlp.up_proj.weight"].astype("float64").std())  # type: ignore[attr-defined]
    assert spread == pytest.approx(shape.initializer_range, rel=0.1)

    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        shape.num_layers,
        shape.hidden_size,
        shape.intermediate_size,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
    )
    assert (config["max_position_embeddings"], config["torch_dtype"]) == (shape.max_positions, shape.dtype)
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == shape.max_positions
    assert config["vocab_size"] == VOCAB_SIZE  # the tokenizer is the same at every size


def test_the_1b_shape_is_llama_3_2_1b_s_body() -> None:
    # Llama 3.2 1B: 1,235,814,400 parameters, with one (tied) 128,256 x 2048 embedding; ours has two of 512 x 2048.
    assert LLAMA_1B.parameters - 2 * VOCAB_SIZE * LLAMA_1B.hidden_size == 1_235_814_400 - 128_256 * 2048


def test_the_same_seed_and_shape_build_the_same_bytes(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", seed=3, shape=SMALL_GQA)
    b = build_tiny_model(tmp_path / "b", seed=3, shape=SMALL_GQA)
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    c = build_tiny_model(tmp_path / "c", seed=4, shape=SMALL_GQA)
    assert (c / "model.safetensors").read_bytes() != (a / "model.safetensors").read_bytes()


@pytest.mark.engine
def test_vllm_loads_a_scaled_shape_and_generates_through_judgestore(tmp_path: Path, vllm_env: None) -> None:
    pytest.importorskip("vllm", reason="the real-engine tests need vLLM installed (bash .ci/setup installs it)")
    folder = build_tiny_model(tmp_path / "gqa", shape=SMALL_GQA)
    descriptor = descriptor_from_vllm(
        str(folder), engine_kwargs=TINY_ENGINE_KWARGS, sampling={"temperature": 0, "max_tokens": 8}
    )
    with create_vllm_backend(descriptor, TINY_ENGINE_KWARGS, model=str(folder)) as backend:
        config = backend._llm.llm_engine.model_config.hf_config  # what vLLM built, not what the folder says
        assert (config.num_hidden_layers, config.num_key_value_heads) == (3, 2)
        prompts = ["What is the capital of France?", "Write a short poem about the sea."]
        first, second = backend.generate(
            [EngineRequest({"type": "messages", "messages": [{"role": "user", "content": p}]}, 0) for p in prompts]
        )
    assert 0 < first.usage["completion_tokens"] <= 8 and 0 < second.usage["completion_tokens"] <= 8
    assert first.text != second.text  # the answer depends on the prompt at this size too
