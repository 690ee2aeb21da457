"""Phi-3's own rules: its config.json (RoPE over part of each head, a window over every layer, LongRoPE refused),
its GGUF metadata (rotary dimensions; the window llama.cpp does not apply), its fused checkpoint names and its
GGUF tokenizer's "▁" prefix. Parity with transformers on tiny random models, from a directory and from a GGUF
file, is in test_models.py and gguf/test_gguf_loader.py."""

from __future__ import annotations

from typing import Any

import pytest

from infer.engine.gguf.config import GGUFConfigError, gguf_model_config
from infer.engine.gguf.tokenizer import tokenizer_from_gguf
from infer.engine.models import Target, checkpoint_target
from infer.engine.models.registry import parse_model_config
from tests.helpers.gguf_tokenizers import sentencepiece_fields

# Phi-4-mini's shape, scaled down: 3/4 of each head rotates
PHI3: dict[str, Any] = {
    "model_type": "phi3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
    "max_position_embeddings": 4096, "sliding_window": 2047,
}  # fmt: skip
GGUF: dict[str, Any] = {
    "general.architecture": "phi3", "phi3.block_count": 2, "phi3.context_length": 4096,
    "phi3.embedding_length": 64, "phi3.feed_forward_length": 96, "phi3.attention.head_count": 4,
    "phi3.attention.head_count_kv": 2, "phi3.attention.layer_norm_rms_epsilon": 1e-5,
    "phi3.rope.dimension_count": 12, "phi3.rope.freq_base": 10000.0, "phi3.attention.sliding_window": 2047,
}  # fmt: skip


def test_config_json_rotates_part_of_each_head_and_windows_every_layer() -> None:
    cfg = parse_model_config(PHI3)
    assert {r.rotary_dim for r in cfg.ropes} == {12}  # 0.75 of 16
    assert cfg.sliding_windows == (2047, 2047)
    assert not (cfg.attention_bias or cfg.qk_norm or cfg.sandwich_norm or cfg.tie_word_embeddings)
    # transformers 5 writes the factor among the RoPE parameters
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    newer = parse_model_config({**PHI3, "partial_rotary_factor": None, "rope_parameters": params})
    assert newer.ropes[0].rotary_dim == 8
    assert parse_model_config({**PHI3, "sliding_window": None}).sliding_windows == (None, None)


@pytest.mark.parametrize("kind", ["longrope", "su"])
def test_longrope_is_refused_by_name(kind: str) -> None:
    scaling = {"type": kind, "short_factor": [1.0] * 6, "long_factor": [2.0] * 6}
    with pytest.raises(ValueError, match=f"unsupported rope_type '{kind}'"):
        parse_model_config({**PHI3, "rope_scaling": scaling})


def test_gguf_metadata_gives_the_rotary_dimensions_and_no_window() -> None:
    cfg = gguf_model_config(GGUF, vocab_size=100, has_output=True)
    assert cfg.model_type == "phi3" and cfg.rms_norm_eps == 1e-5
    assert {r.rotary_dim for r in cfg.ropes} == {12}
    assert cfg.sliding_windows == (None, None)  # as llama.cpp: Phi's window is off in its files
    full = gguf_model_config({k: v for k, v in GGUF.items() if k != "phi3.rope.dimension_count"}, 100, True)
    assert full.ropes[0].rotary_dim == 16


def test_a_longrope_gguf_file_is_refused_by_its_key() -> None:
    with pytest.raises(GGUFConfigError, match=r"phi3\.rope\.scaling\.attn_factor: LongRoPE"):
        gguf_model_config({**GGUF, "phi3.rope.scaling.attn_factor": 1.19}, vocab_size=100, has_output=True)


def test_fused_checkpoint_projections_land_whole() -> None:
    cfg = parse_model_config(PHI3)
    assert checkpoint_target(cfg, "model.layers.1.self_attn.qkv_proj.weight") == Target(
        "layers.1.self_attn.qkv_proj.weight"
    )
    assert checkpoint_target(cfg, "model.layers.0.mlp.gate_up_proj.weight") == Target(
        "layers.0.mlp.gate_up_proj.weight"
    )
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' for phi3"):
        checkpoint_target(cfg, "model.layers.0.self_attn.q_proj.weight")


def test_gguf_sentencepiece_prepends_the_space_mark_always() -> None:
    """A phi3 file's normalizer prepends "▁" even before a space (" hi": "▁▁hi"); a llama file's Metaspace
    does not add a second."""
    fields = sentencepiece_fields()
    tokens = fields["tokenizer.ggml.tokens"]

    def pieces(arch: str) -> list[str]:
        ids = tokenizer_from_gguf({"general.architecture": arch, **fields}, "tiny.gguf").encode(" hello")
        return [tokens[i] for i in ids[1:]]  # after the BOS

    assert pieces("phi3")[:2] == ["▁", "▁"]
    assert pieces("llama")[:2] != ["▁", "▁"]
    assert "".join(pieces("phi3")) == "▁" + "".join(pieces("llama"))
