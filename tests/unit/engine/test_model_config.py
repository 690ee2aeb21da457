"""config.json parsing: old and new RoPE styles, Gemma 3 layer kinds, unsupported architectures."""

from __future__ import annotations

from typing import Any

import pytest

from infer.engine.models.registry import parse_model_config

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_top_level_rope_theta_and_rope_scaling_are_read() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    cfg = parse_model_config({**LLAMA, "rope_theta": 500000.0, "rope_scaling": scaling})
    assert cfg.ropes[0].theta == 500000.0
    assert cfg.ropes[0].rope_type == "llama3"
    assert cfg.ropes[0].factor == 8.0


def test_rope_parameters_style_is_read() -> None:
    cfg = parse_model_config({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}})
    assert cfg.ropes[0].theta == 1234.0


def test_gemma3_layer_kinds_and_two_rope_tables() -> None:
    cfg = parse_model_config(
        {**LLAMA, "model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 512, "head_dim": 16,
         "rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 16}
    )  # fmt: skip
    # the default pattern: every sixth layer is global
    assert cfg.sliding_windows == (512, 512, 512, 512, 512, None)
    assert {r.theta for r in cfg.ropes[:5]} == {1e4}
    assert cfg.ropes[5].theta == 1e6
    assert cfg.attn_scale == 16**-0.5
    assert cfg.embed_scale == 64**0.5


def test_unknown_model_type_is_named() -> None:
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        parse_model_config({**LLAMA, "model_type": "gpt2"})


def test_missing_field_is_named() -> None:
    cfg = dict(LLAMA)
    del cfg["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        parse_model_config(cfg)
