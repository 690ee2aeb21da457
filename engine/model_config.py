"""The architecture facts a model needs, read once from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer.engine.model_check import ModelCheckError, check_config
from infer.kernels import RopeConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text", "gemma3")
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


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # llama | qwen2 | qwen3 | gemma3_text
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
    hidden_act: str = "silu"  # silu | gelu_pytorch_tanh
    attention_bias: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False  # Gemma: extra post-attention and pre/post feed-forward norms
    embed_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
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


def _rope(params: dict[str, Any], theta: float, rotary_dim: int, max_pos: int) -> RopeConfig:
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


def _rope_params(cfg: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters` (per layer type for Gemma 3); older configs `rope_scaling`
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


def _common(cfg: dict[str, Any]) -> dict[str, Any]:
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
        # Qwen2 has q/k/v biases and no `attention_bias` field
        "attention_bias": bool(cfg.get("attention_bias", cfg["model_type"] == "qwen2")),
        "eos_token_ids": _eos_ids(cfg.get("eos_token_id")),
        "bos_token_id": cfg.get("bos_token_id"),
    }


def _llama_like(cfg: dict[str, Any], default_tie: bool) -> ModelConfig:
    base = _common(cfg)
    rope = _rope(
        _rope_params(cfg),
        float(cfg.get("rope_theta", 10000.0)),
        base["head_dim"],
        base["max_position_embeddings"],
    )
    num_layers = base["num_layers"]
    window = size(cfg, "sliding_window") if cfg.get("use_sliding_window") else None
    return ModelConfig(
        **base,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", default_tie)),
        ropes=(rope,) * num_layers,
        sliding_windows=(window,) * num_layers,
        attn_scale=base["head_dim"] ** -0.5,
        hidden_act=cfg.get("hidden_act", "silu"),
        qk_norm=cfg["model_type"] == "qwen3",
    )


def _gemma3(cfg: dict[str, Any]) -> ModelConfig:
    base = _common(cfg)
    base["model_type"] = "gemma3_text"
    num_layers, head_dim, max_pos = base["num_layers"], base["head_dim"], base["max_position_embeddings"]
    pattern = int(cfg.get("sliding_window_pattern", 6))
    layer_types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
    ]
    local = _rope(_rope_params(cfg, "sliding_attention"), cfg.get("rope_local_base_freq", 10000.0),
                  head_dim, max_pos)  # fmt: skip
    global_theta = cfg.get("rope_theta", 1_000_000.0)
    global_ = _rope(_rope_params(cfg, "full_attention"), global_theta, head_dim, max_pos)
    is_sliding = [t == "sliding_attention" for t in layer_types]
    return ModelConfig(
        **base,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        ropes=tuple(local if s else global_ for s in is_sliding),
        sliding_windows=tuple(size(cfg, "sliding_window") if s else None for s in is_sliding),
        attn_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
        hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        qk_norm=True,
        sandwich_norm=True,
        embed_scale=float(base["hidden_size"]) ** 0.5,
        attn_softcap=cfg.get("attn_logit_softcapping"),
        final_softcap=cfg.get("final_logit_softcapping"),
    )


def parse_model_config(cfg: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from a parsed `config.json`; ValueError for what we cannot serve (`ModelCheckError`,
    naming the field, for sizes past their bounds or a config that contradicts itself: `model_check.py`)."""
    model_type = cfg.get("model_type")
    if model_type == "gemma3":
        # multimodal Gemma 3: serve its text model
        cfg = {**cfg["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ValueError(f"unsupported model_type {model_type!r} in config.json (supported: {supported})")
    try:
        parsed = _gemma3(cfg) if model_type == "gemma3_text" else _llama_like(cfg, default_tie=False)
    except KeyError as e:
        raise ValueError(f"config.json is missing required field {e.args[0]!r}") from None
    except (TypeError, ArithmeticError) as e:  # a value of the wrong kind (a list, null, a negative query scale)
        raise ValueError(f"config.json holds a value that cannot be used: {e}") from None
    check_config(parsed)
    return parsed
