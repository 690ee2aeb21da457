"""What makes a model family itself, read once at load: `Architecture`, whose defaults are the Llama-like ones.

A family is one subclass in its own module beside this one (`llama.py`, `gemma3.py`, ...) and one entry in
`registry.py`. It says how its config reads from a Hugging Face `config.json` (`config`, `layer_traits`)
and from GGUF metadata (`gguf_fields`), its weight names in both (`checkpoint_modules`, `gguf_layer_names`,
`layer_shapes`) and how its tensors convert (`convert`), and its tokenizer quirks (`gguf_sentencepiece`). The
layers (`base.py`) and the kernels' fused stack are shared: they read the traits of `ModelConfig` (biases, q/k
norms, sandwich norms, embedding scale, soft-capping, sliding windows, RoPE tables), never a family's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch

from infer.engine.model_check import LayerShapes, layer_shapes
from infer.engine.model_config import ModelConfig, common_fields, rope_config, rope_params, size

# llama.cpp's per-layer tensor names (after `blk.N.`) -> the checkpoint's modules (after `model.layers.N.`)
GGUF_LAYER_NAMES: Mapping[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# modules our layers hold as they are (after `layers.N.`), besides the norms
OWN_MODULES = ("self_attn.o_proj", "mlp.down_proj")
# how a GGUF SentencePiece vocabulary splits text: Metaspace with llama.cpp's prefix space; whole text with no
# prefix space (Gemma); "▁" prepended by a normalizer, always (Phi-3)
SentencePieceStyle = Literal["metaspace", "whole", "prepend"]


def short_float(value: float) -> float:
    """GGUF stores float32: 1e-6 reads back as 9.99999997e-07; keep the digits float32 actually has."""
    return float(f"{float(value):.7g}")


def required(meta: Mapping[str, Any], key: str) -> Any:
    """`meta[key]`; ValueError naming the key when the file lacks it."""
    if key not in meta:
        raise ValueError(f"missing metadata field {key!r}")
    return meta[key]


class Architecture:
    """One model family. The defaults: pre-norm decoder layers, q/k/v and gate/up checkpoint projections fused
    into one matrix each, one RoPE table, no biases, no q/k norms, and llama.cpp's usual tensor names."""

    model_types: ClassVar[tuple[str, ...]]  # the `model_type`s of config.json it reads; its own name first
    gguf_name: ClassVar[str]  # the GGUF file's `general.architecture`
    gguf_layer_names: ClassVar[Mapping[str, str]] = GGUF_LAYER_NAMES
    gguf_interleaved_qk: ClassVar[bool] = False  # llama.cpp interleaves the rotary halves of q/k rows
    gguf_sentencepiece: ClassVar[SentencePieceStyle] = "metaspace"
    norm_offset: ClassVar[float] = 0.0  # the checkpoint's norm weights w scale by (norm_offset + w)

    def text_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """The part of config.json that describes the text decoder (a multimodal config nests it)."""
        return cfg

    def config(self, cfg: dict[str, Any]) -> ModelConfig:
        """The model config of a Hugging Face `config.json` (its text part), unchecked (`registry` checks it)."""
        base = common_fields(cfg)
        return ModelConfig(**{**base, "model_type": self.model_types[0], **self.layer_traits(cfg, base)})

    def layer_traits(self, cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """The `ModelConfig` fields beyond `common_fields` (`base`): RoPE tables, windows, query scale, traits."""
        num_layers, head_dim = base["num_layers"], base["head_dim"]
        rope = rope_config(rope_params(cfg), float(cfg.get("rope_theta", 10000.0)), head_dim,
                           base["max_position_embeddings"])  # fmt: skip
        window = size(cfg, "sliding_window") if cfg.get("use_sliding_window") else None
        return {
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "ropes": (rope,) * num_layers,
            "sliding_windows": (window,) * num_layers,
            "attn_scale": head_dim**-0.5,
            "hidden_act": cfg.get("hidden_act", "silu"),
            "attention_bias": bool(cfg.get("attention_bias", False)),
        }

    def gguf_fields(self, meta: Mapping[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
        """The config.json fields of this family beyond the common ones (`gguf/config.py`'s `hf_config`), read
        from the file's metadata `meta` as llama.cpp reads them (a common field of `cfg` it replaces may be taken
        out of it); ValueError naming a key that does not fit."""
        return {}

    def checkpoint_modules(self, cfg: ModelConfig) -> dict[str, tuple[str, int, int | None]]:
        """A layer's checkpoint modules (after `layers.N.`, norms aside) -> (our module, its first row, the number
        of rows: None for all of them)."""
        q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
        return {
            "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
            "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
            "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
            "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
            "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
            **{m: (m, 0, None) for m in OWN_MODULES},
        }

    def layer_shapes(self, cfg: ModelConfig) -> LayerShapes:
        """A layer's checkpoint tensors and their shapes, checked before a layer is built (`model_check.py`)."""
        return layer_shapes(cfg)

    def convert(self, param: str, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint tensor's values for our parameter `param`, converted once at load."""
        if self.norm_offset and param.endswith("norm.weight"):
            return tensor.float() + self.norm_offset  # stored so that one RMSNorm (x * w) serves every family
        return tensor
