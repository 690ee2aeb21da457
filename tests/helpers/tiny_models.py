"""Tiny random Llama, Qwen3 and Gemma 3 checkpoints made with transformers, for reference tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 128
ARCHS = ("llama", "qwen3", "gemma3")


def _config(arch: str) -> Any:
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=1, bos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
        return tf.LlamaConfig(**common, head_dim=16, rope_parameters=rope, tie_word_embeddings=False)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32, rope_parameters={"rope_type": "default",
                              "rope_theta": 1e6}, tie_word_embeddings=True)  # fmt: skip
    if arch == "gemma3":
        layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
        return tf.Gemma3TextConfig(
            **common, head_dim=16, sliding_window=12, layer_types=layer_types, query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
        )  # fmt: skip
    raise ValueError(arch)


def make_tiny_model(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """Build a random model of `arch`, save it as safetensors into out_dir, return out_dir."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = _config(arch)
    cls = tf.Gemma3ForCausalLM if arch == "gemma3" else tf.AutoModelForCausalLM
    model = cls.from_config(cfg, torch_dtype=torch.float32) if arch != "gemma3" else cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # norms too: random scales exercise the (1 + w) rules
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
