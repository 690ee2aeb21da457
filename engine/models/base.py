"""A decoder-only transformer over a flat token layout, shared by Llama, Qwen3 and Gemma 3.

Tokens of all sequences in a step are concatenated: `[num_tokens, hidden]`,
explicit positions, no padding. Every op runs on the model's kernel backend
(`infer.kernels.Kernels`, chosen once at load); the KV cache and the step's
attention metadata are passed in, never global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from infer.engine.config import Quantization
from infer.engine.model_config import ModelConfig
from infer.engine.models.layers import Linear, RMSNorm, empty_param
from infer.kernels import (
    AttentionMetadata,
    AttentionSpec,
    DecoderShape,
    FusedDecoder,
    Kernels,
    LayerWeights,
    PackedWeight,
    RotaryAngles,
    cos_sin_cache,
)


@dataclass(frozen=True)
class StepInput:
    """What one forward pass reads besides the weights; per-step work shared by the layers is done once here."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attn: AttentionMetadata  # from the model's `kernels.prepare_attention`: what its attention reads
    rope: tuple[RotaryAngles, ...]  # per RoPE table of the model (CausalLM.rope_angles)
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [num_blocks, block_size, kv_heads, hd]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, kernels: Kernels) -> None:
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, kernels, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, kernels)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, kernels) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, kernels) if cfg.qk_norm else None
        self.spec = AttentionSpec(cfg.attn_scale, cfg.sliding_windows[layer], cfg.attn_softcap)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        step: StepInput,
        rope: RotaryAngles,  # this layer's RoPE table at the step's positions
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:  # [num_tokens, hidden]
        cfg, kernels = self.cfg, self.kernels
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        num_heads, num_kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        v = qkv[:, cfg.q_size + cfg.kv_size :].view(-1, num_kv_heads, head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(qkv[:, : cfg.q_size].view(-1, num_heads, head_dim))  # [num_tokens, heads, head_dim]
            k = self.k_norm(qkv[:, cfg.q_size : cfg.q_size + cfg.kv_size].view(-1, num_kv_heads, head_dim))
            q = kernels.apply_rotary(q, rope)
            k = kernels.apply_rotary(k, rope)
        else:
            # one rotation for q and k together: they are adjacent in the fused projection
            qk = qkv[:, : cfg.q_size + cfg.kv_size].view(-1, num_heads + num_kv_heads, head_dim)
            q, k = torch.split(kernels.apply_rotary(qk, rope), [num_heads, num_kv_heads], dim=1)
        out = kernels.paged_attention(q, k, v, kv_cache[0], kv_cache[1], step.attn, self.spec)
        o: torch.Tensor = self.o_proj(out.reshape(-1, cfg.q_size))
        return o


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported activation {cfg.hidden_act!r} (silu, gelu_pytorch_tanh)")
        self.kernels = kernels
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, kernels)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, kernels)
        self.is_gelu = cfg.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        act = self.kernels.gelu_tanh_and_mul(gate_up) if self.is_gelu else self.kernels.silu_and_mul(gate_up)
        out: torch.Tensor = self.down_proj(act)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, kernels: Kernels) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn, self.mlp = Attention(cfg, layer, kernels), MLP(cfg, kernels)
        self.input_layernorm = RMSNorm(hidden, eps, kernels)
        self.post_attention_layernorm = RMSNorm(hidden, eps, kernels)
        self.sandwich = cfg.sandwich_norm
        if cfg.sandwich_norm:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps, kernels)
            self.post_feedforward_layernorm = RMSNorm(hidden, eps, kernels)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        step: StepInput,
        rope: RotaryAngles,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        attn: torch.Tensor = self.self_attn(self.input_layernorm(x), step, rope, kv_cache)
        if not self.sandwich:
            # pre-norm (Llama, Qwen3)
            normed, h = self.post_attention_layernorm.add_and_norm(attn, x)
            mlp_out: torch.Tensor = self.mlp(normed)
            return h + mlp_out
        # sandwich norms (Gemma 3)
        residual: torch.Tensor = x + self.post_attention_layernorm(attn)
        ffn: torch.Tensor = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(residual)))
        return residual + ffn

    def weights(self, rope: int) -> LayerWeights:
        """This layer as the kernels' fused stack takes it; `rope`: its RoPE table's index."""
        attn, mlp = self.self_attn, self.mlp
        pre_ffn = self.pre_feedforward_layernorm.weight if self.sandwich else None
        post_ffn = self.post_feedforward_layernorm.weight if self.sandwich else None
        return LayerWeights(
            self.input_layernorm.weight, self.post_attention_layernorm.weight, attn.qkv_proj.weight,
            attn.qkv_proj.bias, attn.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight, attn.spec, rope,
            q_norm=attn.q_norm.weight if attn.q_norm is not None else None,
            k_norm=attn.k_norm.weight if attn.k_norm is not None else None,
            pre_ffn_norm=pre_ffn, post_ffn_norm=post_ffn,
        )  # fmt: skip


class CausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head; HF-compatible parameter names."""

    embed_scale: torch.Tensor  # [] in the model's dtype (a buffer)

    def __init__(self, cfg: ModelConfig, kernels: Kernels, max_positions: int | None = None) -> None:
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        self.embed_tokens = empty_param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, kernels) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, kernels, weight=tied)
        # one RoPE table per distinct config (Gemma 3 has a local and a global one)
        ropes = sorted(set(cfg.ropes), key=cfg.ropes.index)
        self.rope_index = [ropes.index(r) for r in cfg.ropes]
        num_positions = max_positions or cfg.max_position_embeddings
        self.rope_caches = [cos_sin_cache(r, num_positions) for r in ropes]
        # NOTE: a buffer made once (moved and cast with the model), not a tensor made in every forward pass
        self.register_buffer("embed_scale", torch.tensor(cfg.embed_scale), persistent=False)
        self.fused: FusedDecoder | None = None  # the kernels' fused stack over the layers (`fuse`)
        self.embed_packed: PackedWeight | None = None  # the token embedding kept packed (`keep_embedding_packed`)

    def keep_embedding_packed(self, table: PackedWeight) -> None:
        """Look tokens up in `table` (a quantized file's own embedding, `[vocab, hidden]`), dequantizing only the
        step's rows; a tied LM head multiplies by the same table. The float table is dropped unfilled."""
        if table.shape != tuple(self.embed_tokens.shape):
            raise ValueError(f"an embedding table of shape {table.shape}, expected {tuple(self.embed_tokens.shape)}")
        self.embed_packed = table
        self.embed_tokens = empty_param(0, self.cfg.hidden_size)
        if self.cfg.tie_word_embeddings:
            self.lm_head.use_packed(table)

    def to_device(self, device: torch.device, dtype: torch.dtype) -> CausalLM:
        self.to(device=device, dtype=dtype)
        self.rope_caches = [c.to(device) for c in self.rope_caches]
        return self

    def quantize(self, quantization: Quantization) -> CausalLM:
        """Weight-only quantization of every linear layer: the projections and the LM head each by the method
        `quantization` names for them (a tied head gets its own packed copy); norms and the embedding table keep
        the model dtype. `none` leaves a layer as it is."""
        for module in self.modules():
            if isinstance(module, Linear):
                method = quantization.lm_head if module is self.lm_head else quantization.layers
                if method != "none":
                    module.quantize(method)
        return self

    def fuse(self) -> CausalLM:
        """Once the weights are placed and packed: hand the layers to the kernels' fused stack, where the
        backend has one that takes them (`Kernels.fuse_decoder`); `forward` then runs them in one call."""
        cfg = self.cfg
        shape = DecoderShape(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.sandwich_norm,
            cfg.hidden_act == "gelu_pytorch_tanh", tuple(self.rope_caches),
        )  # fmt: skip
        layers = [cast(DecoderLayer, layer).weights(self.rope_index[i]) for i, layer in enumerate(self.layers)]
        self.fused = self.kernels.fuse_decoder(shape, layers)
        return self

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """The attention window of every layer (None = global)."""
        return tuple(self.cfg.sliding_windows)

    def rope_angles(self, positions: torch.Tensor) -> tuple[RotaryAngles, ...]:  # positions: [num_tokens] int64
        """Each RoPE table looked up at the step's positions: once per step, for every layer."""
        return tuple(RotaryAngles.lookup(positions, cache) for cache in self.rope_caches)

    def forward(self, step: StepInput) -> torch.Tensor:  # [num_tokens, hidden]
        if self.embed_packed is not None:
            x = self.embed_packed.rows(step.input_ids).to(self.norm.weight.dtype)
        else:
            x = F.embedding(step.input_ids, self.embed_tokens)
        if self.cfg.embed_scale != 1.0:
            x = x * self.embed_scale.to(x.dtype)  # the scale rounded to the model's dtype, as Gemma's is
        if self.fused is not None:
            x = self.fused(x, step.positions, step.attn, step.kv_caches)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, step, step.rope[self.rope_index[i]], step.kv_caches[i])
        hidden: torch.Tensor = self.norm(x)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] fp32
        logits: torch.Tensor = self.lm_head(hidden).float()
        if self.cfg.final_softcap is not None:
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        return logits
