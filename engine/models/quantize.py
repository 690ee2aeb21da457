"""Load-time weight quantization: the projections and the LM head to weight-only int8.

Each decoder layer's fused QKV, output, gate-up and down projections and the
LM head become `Int8Weight`s (per-output-channel scales); norms and the
embedding table stay in the model dtype (an embedding lookup reads one row per
token). A tied LM head gets its own int8 copy, so the embedding keeps full
precision.
"""

from __future__ import annotations

from torch import nn

from infer.engine.config import QUANTIZATIONS
from infer.engine.models.base import CausalLM
from infer.kernels.int8 import quantize_int8

_LAYER_WEIGHTS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


def _replace(module: nn.Module, name: str) -> None:
    weight = getattr(module, name)
    module._parameters.pop(name, None)
    setattr(module, name, quantize_int8(weight))


def quantize_model(model: CausalLM, method: str) -> CausalLM:
    """Quantize `model`'s linear weights in place (`none` leaves it as it is)."""
    if method not in QUANTIZATIONS:
        raise ValueError(f"quantization {method!r}: expected one of {', '.join(QUANTIZATIONS)}")
    if method == "none":
        return model
    if model.embed_tokens.device.type != "cpu":
        raise ValueError("int8 quantization runs on the CPU only")
    for layer in model.layers:
        for child, name in _LAYER_WEIGHTS:
            _replace(getattr(layer, child), name)
    _replace(model, "lm_head")
    return model
