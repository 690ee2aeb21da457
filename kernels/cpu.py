"""The compiled CPU kernels: where they are built, loading them, and thin wrappers over their ops.

The C++ sources in `kernels/csrc/` (package data: they ship in the wheel) are
built ahead of time by `python -m infer.kernels.cpu_build` (run by `make setup`
and `make test`) with `-march=native` for the machine that builds them, or with
`--portable` for a set of x86-64 feature levels (an image built on one CPU runs
on another). Libraries land in `<cache>/<tag>/`: the native tag hashes the
sources, the torch version and this CPU's feature flags; a portable tag hashes
the sources and the torch version and names its level. When a backend is
chosen for the CPU (`backend.select_kernels`, at engine start) the native build
is loaded if there is one, else the best level this CPU supports.
A changed source, another CPU without a matching level, missing sources or a
library that does not load: the PyTorch references run instead, and the log
says so once. Nothing here raises into a request.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from infer.kernels.attention import AttentionMetadata, AttentionSpec

logger = logging.getLogger(__name__)

CSRC_DIR = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "paged_attention.cpp", "int8_linear.cpp", "int4_linear.cpp", "int6_linear.cpp", "int8g_linear.cpp",
    "dense_linear.cpp", "rms_norm.cpp", "ggml_pack.cpp", "rotary.cpp", "decoder_stack.cpp",
)  # fmt: skip
LIBRARY_NAME = "infer_cpu"


def cache_root() -> Path:
    """`$INFER_KERNEL_CACHE`, else `$XDG_CACHE_HOME/infer/kernels` (XDG_CACHE_HOME defaults to `~/.cache`)."""
    explicit = os.environ.get("INFER_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infer" / "kernels"


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (`/proc/cpuinfo`); empty where that file does not exist."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@dataclass(frozen=True)
class Level:
    """A portable build: compiled for an x86-64 feature level, loaded on any CPU that has `required_flags`."""

    name: str
    cflags: tuple[str, ...]
    required_flags: frozenset[str]


_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
# best first: the first level whose flags this CPU has is the one loaded
LEVELS = (
    Level("x86-64-v4-bf16", ("-march=x86-64-v4", "-mavx512bf16", "-mtune=generic"), _V4 | {"avx512_bf16"}),
    Level("x86-64-v4", ("-march=x86-64-v4", "-mtune=generic"), _V4),
    Level("x86-64-v3", ("-march=x86-64-v3", "-mtune=generic"), _V3),
)


def portable_levels() -> tuple[Level, ...]:
    """The levels `cpu_build --portable` builds on this machine's architecture (none off x86-64)."""
    return LEVELS if platform.machine() in ("x86_64", "AMD64") else ()


def _source_digest() -> str:
    """Sources, torch version and architecture: what every build depends on. OSError without the sources."""
    digest = hashlib.sha256()
    for name in sorted(p.name for p in CSRC_DIR.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(name.encode() + (CSRC_DIR / name).read_bytes())
    digest.update(f"{torch.__version__} {platform.machine()}".encode())
    return digest.hexdigest()


@functools.cache
def build_tag() -> str:
    """The native build's tag: sources, torch version, machine and this CPU's features."""
    flags = " ".join(sorted(cpu_flags()))
    return hashlib.sha256(f"{_source_digest()} {flags}".encode()).hexdigest()[:16]


@functools.cache
def level_tag(level: Level) -> str:
    """A portable build's tag: sources, torch version, machine, and the level's name."""
    return f"{_source_digest()[:16]}-{level.name}"


def build_dir() -> Path:
    return cache_root() / build_tag()


def library_path(level: Level | None = None) -> Path:
    """Where the native build (or the portable build of `level`) lives."""
    tag = build_tag() if level is None else level_tag(level)
    return cache_root() / tag / f"{LIBRARY_NAME}.so"


def candidates() -> list[Path]:
    """The libraries this CPU could load, in order of preference: native, then the best supported level."""
    flags = cpu_flags()
    return [library_path()] + [library_path(lv) for lv in portable_levels() if lv.required_flags <= flags]


@functools.cache
def load() -> bool:
    """Load the compiled kernels once; False (and one log line) when none is built here or none loads."""
    try:
        found = [p for p in candidates() if p.is_file()]
    except (OSError, RuntimeError) as e:  # NOTE: without the sources (no package data) no build can be named
        logger.warning("compiled CPU kernels unavailable (%s): the PyTorch references run", e)
        return False
    if not found:
        logger.warning(
            "compiled CPU kernels not built for this source and CPU (%s): the PyTorch references run; "
            "`make setup` or `python -m infer.kernels.cpu_build` builds them",
            cache_root(),
        )
        return False
    try:
        torch.ops.load_library(str(found[0]))  # type: ignore[no-untyped-call]
    except (OSError, RuntimeError) as e:
        logger.warning("compiled CPU kernels at %s did not load (%s): the PyTorch references run", found[0], e)
        return False
    logger.info("compiled CPU kernels loaded from %s", found[0])
    return True


COMPILED_DTYPES = (torch.float32, torch.bfloat16)  # what the compiled attention takes


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    spec: AttentionSpec,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """The compiled twin of `attention.paged_attention_ref`: writes this step's K/V, then attends."""
    key, value = _rows(key, k_cache.dtype), _rows(value, k_cache.dtype)
    out: torch.Tensor = torch.ops.infer_cpu.paged_attention(
        query, key, value, k_cache, v_cache, meta.slot_mapping.long(), meta.block_tables.int().contiguous(),
        meta.query_start_loc.int(), meta.seq_lens.int(), spec.scale, spec.sliding_window or 0, spec.softcap or 0.0,
    )  # fmt: skip
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The compiled twin of `norm.rms_norm_ref` for fp32 [T, n] or [T, heads, n] rows (it checks them)."""
    out: torch.Tensor = torch.ops.infer_cpu.rms_norm(x, weight.contiguous(), eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled twin of `norm.fused_add_rms_norm_ref` for fp32 [T, hidden] rows: (normed, x + residual)."""
    normed, summed = torch.ops.infer_cpu.fused_add_rms_norm(x, residual, weight.contiguous(), eps)
    return normed, summed


def rotary(
    x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The compiled twin of `rotary.apply_rotary_ref` for fp32 [T, heads, head_dim]; `out` may be `x`."""
    rotated: torch.Tensor = torch.ops.infer_cpu.rotary(x, positions, cache, out)
    return rotated


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()
