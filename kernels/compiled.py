"""The compiled CPU backend: the C++ kernels of `csrc/` (built and loaded by `cpu.py`) where the profile said
the reference is the bottleneck, the reference for the rest.

- attention: fp32 and bf16 caches (no per-step plan: the kernel walks the block tables itself);
- RMSNorm, residual-add + RMSNorm, RoPE: fp32 (bf16 stays on the reference, which rounds as transformers does);
- `linear`: a packed weight runs its own compiled op (`PackedWeight.linear_compiled`): int8 `int8_linear`
  (`int8.py` describes the packing), int4 `int4_linear` and int8g `int8g_linear` (`int4.py`, `int8g.py`: inputs
  quantized to int16 per group, integer dot products); in an fp32 or bf16 model a float weight runs
  `dense_linear` at any row count; an fp16 model's runs `F.linear`;
- the fused decoder stack (`fused.py`) for fp32 models: the same kernels, every layer in one C++ call.

Which ops run compiled is decided once, by the model's dtype, when the backend is built: no op looks at its
tensors to choose (the compiled ops check theirs and raise; nothing falls back silently).

Batch invariance: every op here computes a row (a token) the same way whatever else is in the call, so a
request's tokens never depend on its batch. torch's GEMM breaks that (it picks its kernel and its reduction
split by row count, e.g. a matrix-vector path for one row), so no float linear goes through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from infer.kernels import cpu
from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.fused import DecoderShape, FusedDecoder, LayerWeights, fusable
from infer.kernels.packed import LinearWeight, PackedWeight
from infer.kernels.reference import ReferenceKernels, over_rows
from infer.kernels.rotary import RotaryAngles

DENSE_DTYPES = (torch.float32, torch.bfloat16)


class CompiledCpuKernels(ReferenceKernels):
    name = "cpu"
    title = "compiled CPU"

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        if device.type != "cpu" or not cpu.load():
            raise RuntimeError(f"the compiled CPU kernels need device cpu and a build ({cpu.library_path()})")
        super().__init__(device, dtype)
        # NOTE: which ops are compiled is decided here, once, by the model's dtype; no op looks at its tensors
        # (the compiled ops check what they are given and raise, they never fall back). None has a backward:
        # the engine runs under torch.inference_mode.
        self.compiled_attention = dtype in cpu.COMPILED_DTYPES
        # bf16 norms and RoPE stay on the reference, which rounds as transformers does
        self.compiled_elementwise = dtype == torch.float32
        self.compiled_dense = dtype in DENSE_DTYPES

    def prepare_attention(
        self, meta: AttentionMetadata, cache: torch.Tensor, sliding_windows: Iterable[int | None]
    ) -> AttentionMetadata:
        if self.compiled_attention:
            return meta
        return super().prepare_attention(meta, cache, sliding_windows)

    def paged_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        spec: AttentionSpec,
    ) -> torch.Tensor:
        if self.compiled_attention:
            return cpu.paged_attention(query, key, value, k_cache, v_cache, meta, spec)
        return super().paged_attention(query, key, value, k_cache, v_cache, meta, spec)

    def apply_rotary(self, x: torch.Tensor, angles: RotaryAngles, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.compiled_elementwise:
            return cpu.rotary(x, angles.positions, angles.cache, out)
        return super().apply_rotary(x, angles, out)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.compiled_elementwise:
            return cpu.rms_norm(x, weight, eps)
        return super().rms_norm(x, weight, eps)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.compiled_elementwise:
            return cpu.fused_add_rms_norm(x, residual, weight, eps)
        return super().fused_add_rms_norm(x, residual, weight, eps)

    def linear(self, x: torch.Tensor, weight: LinearWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if isinstance(weight, PackedWeight):
            return over_rows(x, weight.out_features, weight.linear_compiled(x2, bias))
        if self.compiled_dense:
            return over_rows(x, weight.shape[0], torch.ops.infer_cpu.dense_linear(x2, weight, bias))
        return super().linear(x, weight, bias)

    def fuse_decoder(self, shape: DecoderShape, layers: Sequence[LayerWeights]) -> FusedDecoder | None:
        if self.dtype != torch.float32 or not fusable(shape, layers):
            return None
        return FusedDecoder(shape, layers)
