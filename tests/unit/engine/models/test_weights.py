"""Checkpoint names to our parameters: fused rows, skipped tensors, and names an architecture does not have."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer.engine.models import Target, checkpoint_target
from infer.engine.models.registry import parse_model_config

LLAMA = parse_model_config(
    {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}
)  # fmt: skip


def test_q_k_v_and_gate_up_land_in_rows_of_one_fused_projection() -> None:
    q, kv, inter = LLAMA.q_size, LLAMA.kv_size, LLAMA.intermediate_size
    targets = [checkpoint_target(LLAMA, f"model.layers.1.self_attn.{p}_proj.weight") for p in "qkv"]
    assert targets == [
        Target("layers.1.self_attn.qkv_proj.weight", 0, q),
        Target("layers.1.self_attn.qkv_proj.weight", q, kv),
        Target("layers.1.self_attn.qkv_proj.weight", q + kv, kv),
    ]
    assert checkpoint_target(LLAMA, "model.layers.0.self_attn.k_proj.bias") == Target(
        "layers.0.self_attn.qkv_proj.bias", q, kv
    )
    assert checkpoint_target(LLAMA, "model.layers.0.mlp.up_proj.weight") == Target(
        "layers.0.mlp.gate_up_proj.weight", inter, inter
    )


def test_plain_tensors_keep_their_names() -> None:
    assert checkpoint_target(LLAMA, "model.layers.0.mlp.down_proj.weight") == Target("layers.0.mlp.down_proj.weight")
    assert checkpoint_target(LLAMA, "model.layers.1.input_layernorm.weight") == Target(
        "layers.1.input_layernorm.weight"
    )
    assert checkpoint_target(LLAMA, "lm_head.weight") == Target("lm_head.weight")
    assert checkpoint_target(LLAMA, "model.embed_tokens.weight") == Target("embed_tokens")


def test_tensors_that_carry_nothing_we_use_are_skipped() -> None:
    tied = replace(LLAMA, tie_word_embeddings=True)
    assert checkpoint_target(tied, "lm_head.weight") is None
    assert checkpoint_target(LLAMA, "model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert checkpoint_target(LLAMA, "vision_tower.encoder.layers.0.mlp.fc1.weight") is None


@pytest.mark.parametrize(
    "name", ["model.layers.2.mlp.down_proj.weight", "model.layers.0.mlp.experts.weight", "model.wte.weight"]
)
def test_a_name_this_architecture_does_not_have_is_an_error(name: str) -> None:
    with pytest.raises(ValueError, match=f"unexpected tensor '{name}' for llama"):
        checkpoint_target(LLAMA, name)
