"""Phi-3 (its 4k models): Llama's layer, with the checkpoint's q/k/v and gate/up projections stored fused already
(`qkv_proj`, `gate_up_proj`; llama.cpp's `attn_qkv` and `ffn_up`), RoPE over a part of each head
(`partial_rotary_factor`; llama.cpp's `rope.dimension_count`), and a sliding window over every layer where
config.json names one. llama.cpp does not apply the window its files carry (`phi3.attention.sliding_window`), nor
does transformers reading them: neither does a GGUF file here. Its GGUF SentencePiece vocabulary prepends "▁"
in a normalizer. LongRoPE scaling (`rope_scaling.type` longrope / su; the files' `rope_factors_long`: Phi-3.5,
Phi-4-mini, the 128k models) is not served: such a config is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from infer.engine.model_check import LayerShapes
from infer.engine.model_config import ModelConfig, rope_config, rope_params, size
from infer.engine.models.architecture import GGUF_LAYER_NAMES, OWN_MODULES, Architecture


class Phi3(Architecture):
    model_types = ("phi3",)
    gguf_name = "phi3"
    gguf_layer_names: ClassVar[Mapping[str, str]] = {
        **GGUF_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj",
    }  # fmt: skip
    gguf_sentencepiece = "prepend"

    def layer_traits(self, cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        params = rope_params(cfg)
        factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or 1.0
        rotary_dim = int(base["head_dim"] * float(factor))
        rope = rope_config(params, float(cfg.get("rope_theta", 10000.0)), rotary_dim, base["max_position_embeddings"])
        window = size(cfg, "sliding_window") if cfg.get("sliding_window") is not None else None
        return {
            **super().layer_traits(cfg, base),
            "ropes": (rope,) * base["num_layers"],
            "sliding_windows": (window,) * base["num_layers"],
        }

    def gguf_fields(self, meta: Mapping[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
        if "phi3.rope.scaling.attn_factor" in meta:
            raise ValueError("phi3.rope.scaling.attn_factor: LongRoPE scaling is not supported")
        rotary_dim = int(meta.get("phi3.rope.dimension_count", cfg["head_dim"]))
        return {"partial_rotary_factor": rotary_dim / cfg["head_dim"]}

    def checkpoint_modules(self, cfg: ModelConfig) -> dict[str, tuple[str, int, int | None]]:
        return {m: (m, 0, None) for m in ("self_attn.qkv_proj", "mlp.gate_up_proj", *OWN_MODULES)}

    def layer_shapes(self, cfg: ModelConfig) -> LayerShapes:
        hidden = (cfg.hidden_size, "hidden_size")
        return {
            **super().layer_shapes(cfg),
            "self_attn.qkv_proj.weight": ((cfg.q_size + 2 * cfg.kv_size, "num_key_value_heads"), hidden),
            "mlp.gate_up_proj.weight": ((2 * cfg.intermediate_size, "intermediate_size"), hidden),
        }
