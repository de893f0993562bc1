"""A tiny, random Llama that vLLM can load: for tests and the README demo.

Contract: :func:`build_tiny_model` writes, with no network, a model folder
(``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``)
that ``vllm.LLM(model=folder)`` loads in a couple of seconds on a CPU:

* 2 Llama layers, hidden size 64, 4 attention heads of dimension 32 (vLLM's
  CPU attention wants a head size that is a multiple of 32, so ``head_dim`` is
  set explicitly rather than derived as 64 / 4), 4 key-value heads, MLP 128,
  vocabulary 512, float32 weights.
* Weights are drawn with a large ``initializer_range`` (0.3) so the logits
  depend visibly on the prompt: two prompts give two different completions.
* A byte-level BPE tokenizer (vocabulary 512) trained locally on a built-in
  corpus, with a ChatML chat template (``<|im_start|>role\\ncontent<|im_end|>\\n``)
  and ``<|im_end|>`` as end of sequence.

The folder is byte-identical from run to run for the same ``seed``; different
seeds give different weights (the tokenizer is the same), so two seeds are two
distinguishable "models". numpy, safetensors and tokenizers are imported inside
the function, so importing this module costs nothing.

``shape`` scales the same recipe up: :data:`LLAMA_1B` is Llama 3.2 1B's body
(16 layers, hidden 2048, MLP 8192, 32 heads, 8 key-value heads) with the same
512-token vocabulary and float16 weights, about 0.98 billion parameters, for
measuring throughput on a GPU (``bench/gpu_bench.py``) without downloading a
model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

VOCAB_SIZE = 512


@dataclass(frozen=True)
class ModelShape:
    """The size of the random Llama: everything but the vocabulary (the tokenizer is always the same)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    initializer_range: float
    dtype: Literal["float32", "float16"]

    @property
    def parameters(self) -> int:
        """How many weights the model has, embeddings and norms included."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = 2 * q * self.hidden_size + 2 * kv * self.hidden_size
        layer = attention + 3 * self.intermediate_size * self.hidden_size + 2 * self.hidden_size
        return self.num_layers * layer + 2 * VOCAB_SIZE * self.hidden_size + self.hidden_size


TINY = ModelShape(
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=4,
    head_dim=32,
    max_positions=512,
    initializer_range=0.3,
    dtype="float32",
)
# Llama 3.2 1B's body. Its usual initializer_range (0.02) keeps float16 activations finite through 16 layers.
LLAMA_1B = ModelShape(
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    max_positions=4096,
    initializer_range=0.02,
    dtype="float16",
)

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Enough varied English (and a little of everything a prompt may hold) for 253
# byte-pair merges, so the trained vocabulary fills all 512 ids.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A judge reads two answers and decides which one is better.
Question: what is the capital of France? Answer: Paris is the capital of France, and Berlin is the capital of Germany.
Write a short poem about the sea. The sea is wide, the sea is deep, the waves roll in while sailors sleep.
Explain why the sky is blue. Sunlight is scattered by the molecules of the air, and blue light is scattered most.
User: Hello! How are you today? Assistant: I am fine, thank you. How can I help you with your question?
Rate the following response on a scale from 1 to 10, then explain your rating in one or two sentences.
def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 2024 3.14159 -42 1e-5; symbols: ( ) [ ] { } < > = + - * / % & | ! ? : ; , .
Once upon a time there was a small model that learned to answer questions about science, history and cooking.
To bake bread you need flour, water, salt and yeast; knead the dough, let it rise, then bake it until golden.
The system prompt says: you are a helpful, honest and harmless assistant. Think step by step before answering.
Assistant A gives a correct and complete answer. Assistant B makes a mistake in the second step. Verdict: [[A]].
Il fait beau aujourd'hui. Das Wetter ist heute schön. Hoy hace buen tiempo. Oggi fa bel tempo.
"""


def _dump_json(path: Path, value: Any) -> None:
    # sort_keys and a fixed indent make the bytes a function of the value only.
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _train_tokenizer(dest: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    ids: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(tok)
        assert token_id is not None, "a trainer always puts its special tokens in the vocabulary"
        ids[tok] = token_id
    return ids


def _weights(seed: int, shape: ModelShape) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    dtype = np.dtype(shape.dtype)
    hidden = shape.hidden_size

    def normal(*dims: int) -> Any:
        return (rng.standard_normal(dims) * shape.initializer_range).astype(dtype)

    def ones() -> Any:
        return np.ones(hidden, dtype=dtype)

    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(VOCAB_SIZE, hidden)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_size, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_size, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_size, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, q_size)
        tensors[p + "mlp.gate_proj.weight"] = normal(shape.intermediate_size, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(shape.intermediate_size, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, shape.intermediate_size)
        tensors[p + "input_layernorm.weight"] = ones()
        tensors[p + "post_attention_layernorm.weight"] = ones()
    tensors["model.norm.weight"] = ones()
    tensors["lm_head.weight"] = normal(VOCAB_SIZE, hidden)
    return tensors


def build_tiny_model(dest: Path, seed: int = 0, shape: ModelShape = TINY) -> Path:
    """Write the tiny model (or one of ``shape``) into ``dest`` (created if needed) and return ``dest``.

    Existing files of the same names are overwritten; nothing else in ``dest``
    is touched. The tiny model takes well under a second; :data:`LLAMA_1B`
    about half a minute and 2 GB. Needs no network.
    """
    from safetensors.numpy import save_file

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ids = _train_tokenizer(dest)
    eos_id, pad_id = ids[IM_END], ids[ENDOFTEXT]

    _dump_json(
        dest / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB_SIZE,
            "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": shape.max_positions,
            "initializer_range": shape.initializer_range,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": ids[IM_START],
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "torch_dtype": shape.dtype,
        },
    )
    _dump_json(
        dest / "generation_config.json",
        {"bos_token_id": ids[IM_START], "eos_token_id": eos_id, "pad_token_id": pad_id},
    )
    _dump_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHATML_TEMPLATE,
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "additional_special_tokens": [IM_START, IM_END],
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": shape.max_positions,
        },
    )
    _dump_json(
        dest / "special_tokens_map.json",
        {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END]},
    )
    save_file(_weights(seed, shape), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
