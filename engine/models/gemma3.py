"""Gemma 3 (its text model): sandwich norms, q/k norms, a scaled embedding, tanh soft-capping, sliding-window
layers with their own RoPE table beside the global ones, and RMSNorm weights stored as offsets from 1.

llama.cpp keeps some of its facts in code rather than in the file; they are filled in as it does: the
sliding-window pattern (every sixth layer global), the local RoPE base (10,000) and the query scale
(1/sqrt(head_dim)). Its GGUF files name the norm before the feed-forward `ffn_norm`, split no words in their
SentencePiece vocabulary and add no prefix space."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from infer.engine.model_config import rope_config, rope_params, size
from infer.engine.models.architecture import GGUF_LAYER_NAMES, Architecture, required, short_float

GGUF_SLIDING_PATTERN = 6  # llama.cpp: every sixth layer attends globally
GGUF_LOCAL_ROPE_BASE = 10000.0


class Gemma3(Architecture):
    model_types = ("gemma3_text", "gemma3")
    gguf_name = "gemma3"
    gguf_layer_names: ClassVar[Mapping[str, str]] = {**GGUF_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm"}
    gguf_sentencepiece = "whole"
    norm_offset = 1.0

    def text_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        if cfg.get("model_type") == "gemma3":  # multimodal Gemma 3: serve its text model
            return {**cfg["text_config"], "model_type": "gemma3_text"}
        return cfg

    def layer_traits(self, cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        num_layers, head_dim, max_pos = base["num_layers"], base["head_dim"], base["max_position_embeddings"]
        pattern = int(cfg.get("sliding_window_pattern", 6))
        layer_types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
        ]
        local = rope_config(rope_params(cfg, "sliding_attention"), cfg.get("rope_local_base_freq", 10000.0),
                            head_dim, max_pos)  # fmt: skip
        global_theta = cfg.get("rope_theta", 1_000_000.0)
        global_ = rope_config(rope_params(cfg, "full_attention"), global_theta, head_dim, max_pos)
        is_sliding = [t == "sliding_attention" for t in layer_types]
        return {
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "ropes": tuple(local if s else global_ for s in is_sliding),
            "sliding_windows": tuple(size(cfg, "sliding_window") if s else None for s in is_sliding),
            "attn_scale": float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
            "hidden_act": cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
            "attention_bias": bool(cfg.get("attention_bias", False)),
            "qk_norm": True,
            "sandwich_norm": True,
            "embed_scale": float(base["hidden_size"]) ** 0.5,
            "attn_softcap": cfg.get("attn_logit_softcapping"),
            "final_softcap": cfg.get("final_logit_softcapping"),
        }

    def gguf_fields(self, meta: Mapping[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
        sliding = _sliding_layers(meta, cfg["num_hidden_layers"])
        # NOTE: the file's RoPE scaling is the global layers' alone: moved into their parameters
        global_rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"], **cfg.pop("rope_scaling", {})}
        local_base = short_float(meta.get("gemma3.rope.freq_base_swa", GGUF_LOCAL_ROPE_BASE))
        return {
            "sliding_window": int(required(meta, "gemma3.attention.sliding_window")),
            "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
            "query_pre_attn_scalar": cfg["head_dim"],
            "rope_parameters": {
                "full_attention": global_rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
            },
            "hidden_activation": "gelu_pytorch_tanh",
            "attn_logit_softcapping": meta.get("gemma3.attn_logit_softcapping"),
            "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
        }


def _sliding_layers(meta: Mapping[str, Any], num_layers: int) -> list[bool]:
    """Which layers attend in a window: `gemma3.attention.sliding_window_pattern` (a period, or a flag per
    layer) where the file has it, else llama.cpp's period of six."""
    pattern = meta.get("gemma3.attention.sliding_window_pattern", GGUF_SLIDING_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(f"gemma3.attention.sliding_window_pattern: {len(pattern)} flags, {num_layers} layers")
        return [bool(p) for p in pattern]
    return [(i + 1) % int(pattern) != 0 for i in range(num_layers)]
