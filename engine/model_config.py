"""The facts a model needs, read once from a Hugging Face `config.json`: `ModelConfig` and the readers every
architecture shares (sizes, RoPE, the common fields). What one family reads beyond them is its own module's
(`engine/models/<family>.py`), found by `model_type` in `engine/models/registry.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer.kernels import RopeConfig

# NOTE: bounds far past every real model's, so that a config that lies cannot make parsing itself allocate (a tuple
# per layer) before its tensors are compared with it (`model_check.check_tensors`)
SIZE_BOUNDS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "max_position_embeddings": 1 << 30,
    "sliding_window": 1 << 30,
}


class ModelCheckError(ValueError):
    """A config field that does not fit the rest of the model."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # its architecture's own name (`Architecture.model_types[0]`)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    ropes: tuple[RopeConfig, ...]  # one per layer
    sliding_windows: tuple[int | None, ...]  # one per layer
    attn_scale: float
    # layer traits (each architecture's module sets them; the shared layers read only these)
    hidden_act: str = "silu"  # silu | gelu_pytorch_tanh
    attention_bias: bool = False  # q/k/v biases
    qk_norm: bool = False  # an RMSNorm over each query and key head before RoPE
    sandwich_norm: bool = False  # norms after attention and around the feed-forward, not one before it
    embed_scale: float = 1.0  # token embeddings times this
    attn_softcap: float | None = None  # attention scores through cap * tanh(s / cap)
    final_softcap: float | None = None  # logits likewise
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _eos_ids(raw: Any) -> tuple[int, ...]:
    if raw is None:
        return ()
    return tuple(raw) if isinstance(raw, list) else (int(raw),)


def rope_config(params: dict[str, Any], theta: float, rotary_dim: int, max_pos: int) -> RopeConfig:
    """One RoPE table from its parameters (`rope_params`); `theta` where they name no base."""
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    return RopeConfig(
        theta=float(params.get("rope_theta", theta)),
        rotary_dim=rotary_dim,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", max_pos)),
    )


def rope_params(cfg: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """The RoPE parameters of a config (of its layer type `key`, where they are given per layer type).
    NOTE: transformers 5 writes `rope_parameters` (per layer type for Gemma 3); older configs `rope_scaling`."""
    params = cfg.get("rope_parameters") or {}
    if key is not None and key in params:
        params = params[key] or {}
    elif key is not None and any(isinstance(v, dict) for v in params.values()):
        params = {}
    scaling = cfg.get("rope_scaling") or {}
    if key == "sliding_attention":
        scaling = {}
    return {**scaling, **params}


def size(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """`cfg[key]`, a whole number in 1..SIZE_BOUNDS[key] (`default` when missing or null, KeyError when none)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        value = default
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 1 <= value <= SIZE_BOUNDS[key]:
        raise ModelCheckError(key, f"{value!r} is not a whole number in 1..{SIZE_BOUNDS[key]}")
    return int(value)


def _head_dim(cfg: dict[str, Any], num_heads: int) -> int:
    if cfg.get("head_dim"):
        return size(cfg, "head_dim")
    hidden = size(cfg, "hidden_size")
    if hidden % num_heads:
        raise ModelCheckError("num_attention_heads", f"{num_heads} heads do not divide hidden_size {hidden}")
    return hidden // num_heads


def common_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `ModelConfig` fields every architecture reads alike (sizes, eps, special ids)."""
    num_heads = size(cfg, "num_attention_heads")
    return {
        "model_type": cfg["model_type"],
        "vocab_size": size(cfg, "vocab_size"),
        "hidden_size": size(cfg, "hidden_size"),
        "intermediate_size": size(cfg, "intermediate_size"),
        "num_layers": size(cfg, "num_hidden_layers"),
        "num_heads": num_heads,
        "num_kv_heads": size(cfg, "num_key_value_heads", num_heads),
        "head_dim": _head_dim(cfg, num_heads),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": size(cfg, "max_position_embeddings", 8192),
        "eos_token_ids": _eos_ids(cfg.get("eos_token_id")),
        "bos_token_id": cfg.get("bos_token_id"),
    }
