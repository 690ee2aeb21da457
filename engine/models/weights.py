"""Checkpoint names to our parameters: renaming and fusing done once, at load time.

Llama and Qwen3 checkpoints map one to one except that q/k/v and gate/up
projections are fused into one matrix each. Gemma 3 also stores its RMSNorm
weights as offsets from 1 and may nest the text model under `language_model`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from infer.engine.model_config import ModelConfig


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a parameter, and rows of it for fused projections."""

    param: str
    row_start: int = 0
    num_rows: int | None = None  # None: the whole parameter


# checkpoint tensors that carry nothing we use
_IGNORED = re.compile(r"(rotary_emb\.inv_freq$|^(model\.)?(vision_tower|multi_modal_projector)\.)")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def _strip_prefix(name: str) -> str:
    for prefix in ("model.language_model.", "language_model.model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name.removeprefix("language_model.")


# checkpoint modules stored as rows of one of our fused projections: (our module, first row, number of rows)
def _fused_rows(cfg: ModelConfig) -> dict[str, tuple[str, int, int]]:
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
    }


def _layer_target(cfg: ModelConfig, layer: str, rest: str) -> Target | None:
    module, _, kind = rest.rpartition(".")  # e.g. self_attn.q_proj, weight
    fused = _fused_rows(cfg).get(module)
    if fused is not None:
        param, start, rows = fused
        return Target(f"layers.{layer}.{param}.{kind}", start, rows)
    if module in ("self_attn.o_proj", "mlp.down_proj") or rest.endswith("norm.weight"):
        return Target(f"layers.{layer}.{rest}")
    return None


def checkpoint_target(cfg: ModelConfig, name: str) -> Target | None:
    """Where checkpoint tensor `name` goes; None for a tensor that carries nothing we use (rotary tables,
    a vision tower, the LM head of tied embeddings). ValueError for a name this architecture does not have."""
    if _IGNORED.search(name):
        return None
    short = _strip_prefix(name)
    if short == "lm_head.weight":
        return None if cfg.tie_word_embeddings else Target("lm_head.weight")
    if short == "embed_tokens.weight":
        return Target("embed_tokens")
    if short == "norm.weight":
        return Target("norm.weight")
    m = _LAYER.match(short)
    target = None if m is None or int(m.group(1)) >= cfg.num_layers else _layer_target(cfg, m.group(1), m.group(2))
    if target is None:
        raise ValueError(f"unexpected tensor {name!r} for {cfg.model_type}")
    return target


def convert_tensor(cfg: ModelConfig, target: Target, tensor: torch.Tensor) -> torch.Tensor:
    """Per-architecture value conversion, applied once at load."""
    if cfg.model_type == "gemma3_text" and target.param.endswith("norm.weight"):
        # Gemma scales by (1 + weight); store the sum so one RMSNorm serves all models
        return tensor.float() + 1.0
    return tensor
