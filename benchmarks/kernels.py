"""Time each Triton kernel against its PyTorch reference, on shapes of a Llama-3-8B-sized layer.

    python benchmarks/kernels.py                 # on a CUDA machine; --dtype fp16 bf16 fp32 (one or more)
    python benchmarks/kernels.py --smoke         # tiny shapes, CPU, Triton's interpreter

Each row runs both implementations on the same inputs, reports the largest
difference between them, and the mean time of one call: wall clock over
`--reps` calls between two CUDA syncs, after a warm-up call that also
compiles. On CUDA it writes docs/benchmarks/kernels.json and kernels.md
(`--out-dir` elsewhere). `--smoke` only proves the script and the kernels run;
interpreter timings mean nothing, and it writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

Fn = Callable[[], torch.Tensor]
HEADER = "| kernel | max abs diff | triton ms | torch ms | speedup |"
OUT_DIR = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Sizes:
    num_tokens: int  # rows for the elementwise kernels
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    decode_seqs: int  # decode batch size
    context_len: int  # tokens already cached per sequence
    chunk_len: int  # prefill chunk length
    block_size: int = 16


FULL = Sizes(4096, 32, 8, 128, 4096, 14336, decode_seqs=64, context_len=1024, chunk_len=512)
SMOKE = Sizes(8, 4, 2, 64, 64, 128, decode_seqs=2, context_len=20, chunk_len=6)


@dataclass(frozen=True)
class Case:
    name: str
    triton: Fn
    torch: Fn


def _attention_case(name: str, s: Sizes, query_lens: list[int], dtype: torch.dtype, dev: str) -> Case:
    from infer.kernels import AttentionMetadata, AttentionSpec
    from infer.kernels.attention import paged_attention_ref
    from infer.kernels.attention_triton import paged_attention_triton

    seq_lens = [s.context_len + n for n in query_lens]
    blocks_per_seq = -(-max(seq_lens) // s.block_size)
    num_blocks = blocks_per_seq * len(seq_lens)
    tables = torch.randperm(num_blocks).view(len(seq_lens), blocks_per_seq)
    positions = [p for n, total in zip(query_lens, seq_lens, strict=True) for p in range(total - n, total)]
    rows = [i for i, n in enumerate(query_lens) for _ in range(n)]
    bs = s.block_size
    slots = [int(tables[i, p // bs]) * bs + p % bs for i, p in zip(rows, positions, strict=True)]
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=dev),
        block_tables=tables.to(device=dev, dtype=torch.int32),
        query_start_loc=starts.to(device=dev, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, device=dev, dtype=torch.int32),
        query_lens=tuple(query_lens),
        context_lens=tuple(seq_lens),
    )
    t = len(positions)
    q = torch.randn(t, s.num_heads, s.head_dim, device=dev, dtype=dtype)
    k, v = (torch.randn(t, s.num_kv_heads, s.head_dim, device=dev, dtype=dtype) for _ in range(2))
    cache = (num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
    kc, vc = (torch.randn(cache, device=dev, dtype=dtype) for _ in range(2))
    spec = AttentionSpec(scale=s.head_dim**-0.5)
    return Case(
        f"{name} ({len(query_lens)} seqs, {t} tokens, ctx {s.context_len})",
        lambda: paged_attention_triton(q, k, v, kc, vc, meta, spec),
        lambda: paged_attention_ref(q, k, v, kc, vc, meta, spec),
    )


def _elementwise_cases(s: Sizes, dtype: torch.dtype, dev: str) -> list[Case]:
    from infer.kernels import activation, activation_triton, norm, norm_triton, rotary, rotary_triton

    x = torch.randn(s.num_tokens, s.hidden, device=dev, dtype=dtype)
    res, w = torch.randn_like(x), torch.randn(s.hidden, device=dev, dtype=dtype)
    q = torch.randn(s.num_tokens, s.num_heads, s.head_dim, device=dev, dtype=dtype)
    pos = torch.randint(0, 8192, (s.num_tokens,), device=dev)
    cos_sin = rotary.cos_sin_cache(rotary.RopeConfig(500000.0, s.head_dim), 8192).to(dev)
    gate_up = torch.randn(s.num_tokens, 2 * s.intermediate, device=dev, dtype=dtype)
    return [
        Case(f"rms_norm [{s.num_tokens}, {s.hidden}]",
             lambda: norm_triton.rms_norm_triton(x, w, 1e-5), lambda: norm.rms_norm_ref(x, w, 1e-5)),
        Case(f"fused_add_rms_norm [{s.num_tokens}, {s.hidden}]",
             lambda: norm_triton.fused_add_rms_norm_triton(x, res, w, 1e-5)[0],
             lambda: norm.fused_add_rms_norm_ref(x, res, w, 1e-5)[0]),
        Case(f"apply_rotary [{s.num_tokens}, {s.num_heads}, {s.head_dim}]",
             lambda: rotary_triton.apply_rotary_triton(q, pos, cos_sin),
             lambda: rotary.apply_rotary_ref(q, pos, cos_sin)),
        Case(f"silu_and_mul [{s.num_tokens}, 2 * {s.intermediate}]",
             lambda: activation_triton.silu_and_mul_triton(gate_up),
             lambda: activation.silu_and_mul_ref(gate_up)),
        Case(f"gelu_tanh_and_mul [{s.num_tokens}, 2 * {s.intermediate}]",
             lambda: activation_triton.gelu_tanh_and_mul_triton(gate_up),
             lambda: activation.gelu_tanh_and_mul_ref(gate_up)),
    ]  # fmt: skip


def cases(s: Sizes, dtype: torch.dtype, dev: str) -> list[Case]:
    return [
        _attention_case("paged_attention decode", s, [1] * s.decode_seqs, dtype, dev),
        _attention_case("paged_attention prefill", s, [s.chunk_len] * 4, dtype, dev),
        _attention_case("paged_attention mixed", s, [1] * (s.decode_seqs - 1) + [s.chunk_len], dtype, dev),
        *_elementwise_cases(s, dtype, dev),
    ]


def time_ms(fn: Fn, reps: int) -> float:
    """Mean milliseconds per call, after one warm-up call (which also compiles)."""
    fn()
    sync = torch.cuda.is_available()
    if sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / reps


def run(sizes: Sizes, dtype: torch.dtype, dev: str, reps: int) -> list[dict[str, Any]]:
    rows = []
    for case in cases(sizes, dtype, dev):
        diff = (case.triton().float() - case.torch().float()).abs().max().item()
        t_triton, t_torch = time_ms(case.triton, reps), time_ms(case.torch, reps)
        rows.append({"kernel": case.name, "max_abs_diff": diff, "triton_ms": t_triton, "torch_ms": t_torch})
        print(f"{case.name:<58} {diff:>10.2e} {t_triton:>10.3f} {t_torch:>10.3f} {t_torch / t_triton:>7.2f}x")
    return rows


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernels.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Triton kernels against their PyTorch references",
        "",
        f"`make test-gpu` (benchmarks/kernels.py) on {results['device']}; torch {results['torch']}, "
        f"triton {results['triton']}. Shapes of a Llama-3-8B-sized layer (32 query heads, 8 KV heads, "
        "head_dim 128, hidden 4096, intermediate 14336, 16-token blocks); decode: 64 sequences with 1024 "
        "cached tokens; prefill: 4 chunks of 512 over 1024 cached; mixed: 63 decodes and one chunk. "
        f"Mean of {results['reps']} calls after a warm-up that compiles; speedup = torch / triton.",
        "",
    ]
    for dtype, rows in results["dtypes"].items():
        lines += [f"## {dtype}", "", HEADER, "|---|---|---|---|---|"]
        for r in rows:
            speedup = r["torch_ms"] / r["triton_ms"]
            lines.append(
                f"| {r['kernel']} | {r['max_abs_diff']:.1e} | {r['triton_ms']:.3f} | {r['torch_ms']:.3f} "
                f"| {speedup:.2f}x |"
            )
        lines.append("")
    (out_dir / "kernels.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["bf16"])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under the interpreter")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where kernels.json and kernels.md go")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke, to check the script on the CPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    print(f"{'kernel':<58} {'max |diff|':>10} {'triton ms':>10} {'torch ms':>10} {'speedup':>8}")
    if args.smoke:
        run(SMOKE, torch.float32, "cpu", 1)
        return 0
    import triton

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "host": platform.node(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "reps": args.reps,
        "dtypes": {name: run(FULL, DTYPES[name], "cuda", args.reps) for name in args.dtype},
    }
    write_report(results, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
