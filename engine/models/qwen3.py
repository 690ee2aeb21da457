"""Qwen3: Llama's layout with an RMSNorm over each query and key head before RoPE (`q_norm`, `k_norm`)."""

from __future__ import annotations

from typing import Any

from infer.engine.models.architecture import Architecture


class Qwen3(Architecture):
    model_types = ("qwen3",)
    gguf_name = "qwen3"

    def layer_traits(self, cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        return {**super().layer_traits(cfg, base), "qk_norm": True}
