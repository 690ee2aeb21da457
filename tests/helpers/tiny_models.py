"""Tiny random Llama, Qwen2, Qwen3, Gemma 3 and Phi-3 checkpoints made with transformers, for reference tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

VOCAB = 128
SERVABLE_VOCAB = 320  # the tokenizer's: 256 bytes, 3 specials, merges
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")


def _config(arch: str, **overrides: Any) -> Any:
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=1, bos_token_id=2, pad_token_id=0,
    ) | overrides  # fmt: skip
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
        return tf.LlamaConfig(**common, head_dim=16, rope_parameters=rope, tie_word_embeddings=False)
    if arch == "qwen2":  # q/k/v biases, an untied head
        return tf.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                              tie_word_embeddings=False)  # fmt: skip
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32, rope_parameters={"rope_type": "default",
                              "rope_theta": 1e6}, tie_word_embeddings=True)  # fmt: skip
    if arch == "gemma3":
        layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
        return tf.Gemma3TextConfig(
            **common, head_dim=16, sliding_window=12, layer_types=layer_types, query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
        )  # fmt: skip
    if arch == "phi3":  # fused q/k/v and gate/up in the checkpoint, RoPE over half of each head, a window
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        return tf.Phi3Config(**common, rope_parameters=rope, sliding_window=12, tie_word_embeddings=False)
    raise ValueError(arch)


def make_tiny_model(arch: str, out_dir: Path, seed: int = 0, **config: Any) -> Path:
    """Build a random model of `arch`, save it as safetensors into out_dir, return out_dir.

    `config`: overrides of the transformers config (vocab_size, num_hidden_layers, ...)."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = _config(arch, **config)
    cls = tf.Gemma3ForCausalLM if arch == "gemma3" else tf.AutoModelForCausalLM
    model = cls.from_config(cfg, torch_dtype=torch.float32) if arch != "gemma3" else cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # norms too: random scales exercise the (1 + w) rules
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def make_servable_model(out_dir: Path, num_hidden_layers: int = 4, max_position_embeddings: int = 1024) -> Path:
    """A random Llama with a tiny byte-level tokenizer (and ChatML template): a model directory `infer serve`
    loads in a second. Its text is gibberish; use `ignore_eos` for a fixed length."""
    from tests.helpers.fake_engine import CHATML, SPECIALS
    from tests.helpers.tiny_tokenizer import train_byte_bpe

    tokenizer = train_byte_bpe(SERVABLE_VOCAB, SPECIALS)
    make_tiny_model(
        "llama", out_dir, vocab_size=SERVABLE_VOCAB, num_hidden_layers=num_hidden_layers,
        max_position_embeddings=max_position_embeddings, eos_token_id=tokenizer.token_to_id("<|im_end|>"),
    )  # fmt: skip
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (out_dir / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    return out_dir
