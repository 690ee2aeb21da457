"""The fused decoder stack of the compiled CPU backend: every decoder layer of a step in one C++ call.

The model hands its layers over once, at load (`Kernels.fuse_decoder`); a backend that fuses returns a
`FusedDecoder`, the others None and the model runs its layers op by op. The C++ stack
(`csrc/decoder_stack.cpp`) calls the same kernels as the per-op path of `CompiledCpuKernels`, in the same
order, so its hidden states are bit-identical to it, for decode tokens and prefill chunks alike; what it
saves is the Python and the dispatch around ~12 ops a layer.

It knows no model family: what differs between them reaches it as traits (sandwich norms, gelu or silu, q/k
norms and biases where a layer has them, each layer's attention scale, soft-cap, window and RoPE table).
It takes fp32 activations (the compiled norms and RoPE are fp32 only) with fp32 weights or any packed format
(`PackedWeight.format_id`, `fused_args`), mixed freely across a layer's projections; a model in another dtype,
or a weight it does not know, is not fused (`fusable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.packed import NO_TENSOR, LinearWeight, PackedWeight, bias_arg

FLOAT_FORMAT = 0  # csrc/decoder_stack.cpp: Format; packed formats carry theirs (`PackedWeight.format_id`)


@dataclass(frozen=True)
class DecoderShape:
    """What every layer shares."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    sandwich: bool  # norms after attention and around the feed-forward (four a layer), not one before it
    gelu: bool  # gelu_tanh(gate) * up; else silu(gate) * up
    rope_caches: tuple[torch.Tensor, ...]  # [max_positions, rotary_dim] fp32 each (cos | sin)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights, as the per-op path uses them."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: LinearWeight
    qkv_bias: torch.Tensor | None
    o: LinearWeight
    gate_up: LinearWeight
    down: LinearWeight
    attention: AttentionSpec
    rope: int  # index into DecoderShape.rope_caches
    q_norm: torch.Tensor | None = None  # per-head q/k norms before RoPE, where the model has them
    k_norm: torch.Tensor | None = None
    pre_ffn_norm: torch.Tensor | None = None  # the sandwich's norms around the feed-forward (`DecoderShape.sandwich`)
    post_ffn_norm: torch.Tensor | None = None

    @property
    def linears(self) -> tuple[LinearWeight, ...]:
        return self.qkv, self.o, self.gate_up, self.down


def _weight_format(weight: object) -> int | None:  # object: anything a model may hold
    if isinstance(weight, PackedWeight):
        return weight.format_id
    if not isinstance(weight, torch.Tensor):  # a weight the stack does not know: the model runs op by op
        return None
    if weight.dtype == torch.float32 and weight.is_contiguous() and not weight.requires_grad:
        return FLOAT_FORMAT
    return None


def fusable(shape: DecoderShape, layers: Sequence[LayerWeights]) -> bool:
    """Whether the stack takes these layers: fp32 norms and tables on the CPU, every weight in a known format."""
    norms = [n for layer in layers for n in (layer.input_norm, layer.post_attention_norm)]
    return all(c.dtype == torch.float32 and c.device.type == "cpu" for c in (*shape.rope_caches, *norms)) and all(
        _weight_format(w) is not None for layer in layers for w in layer.linears
    )


def _linear_args(weight: LinearWeight, bias: torch.Tensor | None) -> tuple[list[torch.Tensor], int, int]:
    """(weight, aux, bias) tensors, format, out_features."""
    if isinstance(weight, PackedWeight):
        return weight.fused_args(bias), weight.format_id, weight.out_features
    if not isinstance(weight, torch.Tensor):  # `fusable` turned the model down
        raise TypeError(f"the fused stack takes fp32 and packed weights, not {type(weight).__name__}")
    return [weight, NO_TENSOR, bias_arg(bias)], FLOAT_FORMAT, weight.shape[0]


class FusedDecoder:
    """The C++ stack over a model's layers; call it with a step's hidden states."""

    def __init__(self, shape: DecoderShape, layers: Sequence[LayerWeights]) -> None:
        self._stack: Any = torch.classes.infer_cpu.DecoderStack(
            shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.eps, shape.sandwich, shape.gelu,
            list(shape.rope_caches),
        )  # fmt: skip
        for layer in layers:
            self._add(layer)
        self._caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _add(self, layer: LayerWeights) -> None:
        norms = [layer.input_norm, layer.post_attention_norm, layer.q_norm, layer.k_norm, layer.pre_ffn_norm,
                 layer.post_ffn_norm]  # fmt: skip
        tensors: list[torch.Tensor] = []
        formats, out_features = [], []
        for weight, bias in zip(layer.linears, (layer.qkv_bias, None, None, None), strict=True):
            args, fmt, n = _linear_args(weight, bias)
            tensors += args
            formats.append(fmt)
            out_features.append(n)
        spec = layer.attention
        self._stack.add_layer(
            [NO_TENSOR if n is None else n.contiguous() for n in norms], tensors, formats, out_features,
            [spec.scale, spec.softcap or 0.0], spec.sliding_window or 0, layer.rope,
        )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,  # [num_tokens, hidden] fp32
        positions: torch.Tensor,  # [num_tokens] int64
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer
    ) -> torch.Tensor:  # [num_tokens, hidden]: after the last layer, before the final norm
        if kv_caches is not self._caches:  # NOTE: bound once per runner (its list), not passed every step
            self._stack.set_caches([k for k, _ in kv_caches], [v for _, v in kv_caches])
            self._caches = kv_caches
        out: torch.Tensor = torch.ops.infer_cpu.decoder_stack(
            self._stack, x, positions, meta.slot_mapping, meta.block_tables, meta.query_start_loc, meta.seq_lens
        )
        return out
