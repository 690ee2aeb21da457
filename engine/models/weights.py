"""Checkpoint names to our parameters: renaming and fusing done once, at load time.

Which checkpoint modules land in rows of which of our projections, and how a tensor's values convert, is the
model's architecture's (`Architecture.checkpoint_modules`, `.convert`); the names around them are shared (a
multimodal checkpoint may nest the text model under `language_model`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from infer.engine.model_config import ModelConfig
from infer.engine.models.registry import architecture


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


def _layer_target(cfg: ModelConfig, layer: str, rest: str) -> Target | None:
    module, _, kind = rest.rpartition(".")  # e.g. self_attn.q_proj, weight
    ours = architecture(cfg.model_type).checkpoint_modules(cfg).get(module)
    if ours is not None:
        param, start, rows = ours
        return Target(f"layers.{layer}.{param}.{kind}", start, rows)
    if rest.endswith("norm.weight"):
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
    return architecture(cfg.model_type).convert(target.param, tensor)
