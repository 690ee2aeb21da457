"""Qwen2 and Qwen2.5: Llama's layout with biases on the q, k and v projections (its config has no field for
them: they are always there)."""

from __future__ import annotations

from typing import Any

from infer.engine.models.architecture import Architecture


class Qwen2(Architecture):
    model_types = ("qwen2",)
    gguf_name = "qwen2"

    def layer_traits(self, cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        return {**super().layer_traits(cfg, base), "attention_bias": True}
