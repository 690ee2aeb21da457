"""Rotary position embeddings with explicit positions: tables and the PyTorch reference."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeConfig:
    """One RoPE table: base, rotated dims, and the scaling of its frequencies."""

    theta: float
    rotary_dim: int
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "linear", "llama3"):
            raise ValueError(f"unsupported rope_type {self.rope_type!r} (default, linear, llama3)")


def inverse_frequencies(rope: RopeConfig) -> torch.Tensor:  # [rotary_dim // 2] fp32
    exponents = torch.arange(0, rope.rotary_dim, 2, dtype=torch.int64).float() / rope.rotary_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def cos_sin_cache(rope: RopeConfig, max_positions: int) -> torch.Tensor:
    """[max_positions, rotary_dim] fp32: cos in the first half, sin in the second."""
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inverse_frequencies(rope))
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@dataclass(frozen=True)
class RotaryAngles:
    """One RoPE table at a step's positions, once per step: every layer using the table shares it."""

    positions: torch.Tensor  # [num_tokens] int64
    cache: torch.Tensor  # [max_positions, rotary_dim] from cos_sin_cache

    @classmethod
    def lookup(cls, positions: torch.Tensor, cache: torch.Tensor) -> RotaryAngles:
        return cls(positions, cache)

    @functools.cached_property
    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:  # [num_tokens, 1, rotary_dim] each
        """(cos, cos) and (-sin, sin) at the positions, to rotate with one multiply-add; looked up on first use
        (NOTE: only the reference rotates with them: the compiled and Triton kernels read the table)."""
        cos, sin = self.cache[self.positions].unsqueeze(1).chunk(2, dim=-1)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rotary_ref(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cache: torch.Tensor,  # [max_positions, rotary_dim] from cos_sin_cache
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; `x` rotates in place
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], neox (half-split) rotation
    """Rotate `x` by the angles of its tokens' positions; into `out` when given."""
    return rotate_ref(x, RotaryAngles.lookup(positions, cache), out)


def rotate_ref(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    angles: RotaryAngles,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; `x` rotates in place
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """`apply_rotary_ref` with the angles already looked up."""
    rotated = _rotate(x, angles)
    return rotated if out is None else out.copy_(rotated)


def _rotate(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    angles: RotaryAngles,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    cos, sin = angles.cos_sin  # [num_tokens, 1, rotary_dim] each
    rotary_dim = angles.cache.shape[-1]
    rot, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    x1, x2 = rot.chunk(2, dim=-1)
    # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), as x * (cos, cos) + (x2, x1) * (-sin, sin)
    rotated = (rot * cos + torch.cat([x2, x1], dim=-1) * sin).to(x.dtype)
    return rotated if rest.shape[-1] == 0 else torch.cat([rotated, rest], dim=-1)
