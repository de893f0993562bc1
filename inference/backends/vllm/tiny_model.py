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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB_SIZE = 512
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 4
HEAD_DIM = 32
MAX_POSITIONS = 512
INITIALIZER_RANGE = 0.3

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
_CORPUS = """\
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
    tokenizer.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    ids: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(tok)
        assert token_id is not None, "a trainer always puts its special tokens in the vocabulary"
        ids[tok] = token_id
    return ids


def _weights(seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape) * INITIALIZER_RANGE).astype(np.float32)

    q_size, kv_size = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(VOCAB_SIZE, HIDDEN_SIZE)}
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_size, HIDDEN_SIZE)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_size, HIDDEN_SIZE)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_size, HIDDEN_SIZE)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN_SIZE, q_size)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN_SIZE, INTERMEDIATE_SIZE)
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN_SIZE, dtype=np.float32)
    tensors["lm_head.weight"] = normal(VOCAB_SIZE, HIDDEN_SIZE)
    return tensors


def build_tiny_model(dest: Path, seed: int = 0) -> Path:
    """Write the tiny model into ``dest`` (created if needed) and return ``dest``.

    Existing files of the same names are overwritten; nothing else in ``dest``
    is touched. Takes well under a second and needs no network.
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
            "hidden_size": HIDDEN_SIZE,
            "intermediate_size": INTERMEDIATE_SIZE,
            "num_hidden_layers": NUM_LAYERS,
            "num_attention_heads": NUM_HEADS,
            "num_key_value_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITIONS,
            "initializer_range": INITIALIZER_RANGE,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": ids[IM_START],
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "torch_dtype": "float32",
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
            "model_max_length": MAX_POSITIONS,
        },
    )
    _dump_json(
        dest / "special_tokens_map.json",
        {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END]},
    )
    save_file(_weights(seed), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
