"""The default model end to end on one CUDA GPU: infer's LLM.generate against transformers on that GPU.

    python benchmarks/cuda.py        # `make test-gpu` runs it; writes docs/benchmarks/cuda.json and cuda.md
    python benchmarks/cuda.py --device cpu --num-requests 2 --max-new-tokens 4 ...   # the script's smoke test

The workload is bench-offline's (64 requests, prompts 32-512 tokens, 64-256 new
tokens, greedy, `ignore_eos`). For fp32 and bf16 each: infer's throughput on all
requests and its batch-1 decode rate; transformers one request at a time and in
left-padded batches of 16 (on the first requests, credited with every token,
padding included). Every figure comes from this one run, so the ratios compare
like with like.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from offline import (
    OUT_DIR,
    Workload,
    bench_batch1_decode,
    bench_hf_padded,
    bench_hf_sequential,
    bench_ours,
    hf_model,
    make_workload,
)

from infer import LLM
from infer.engine.config import DTYPES
from infer.engine.default_model import default_model_dir
from infer.engine.loader import load_model_config


def bench_dtype(model_dir: Path, work: Workload, dtype: str, args: argparse.Namespace) -> dict[str, float]:
    llm = LLM(str(model_dir), device=args.device, dtype=dtype, max_model_len=1024)
    bench_ours(llm, work.head(4))  # warm-up: compiles the Triton kernels for the shapes that follow
    figures = {"tok_s": bench_ours(llm, work)}
    batch1_prompt = work.prompts[0][:128]
    figures["batch1_decode_tok_s"] = max(bench_batch1_decode(llm, batch1_prompt, args.batch1_tokens) for _ in range(3))
    llm.core.block_manager.assert_no_leaks()
    del llm
    model = hf_model(model_dir, DTYPES[dtype], args.device)
    bench_hf_sequential(model, work.head(1))  # warm-up
    figures["hf_sequential_tok_s"] = bench_hf_sequential(model, work.head(args.hf_sequential))
    figures["hf_padded16_tok_s"] = bench_hf_padded(model, work.head(args.hf_batched), 16)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(dtype, json.dumps(figures), flush=True)
    return figures


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cuda.json").write_text(json.dumps(results, indent=2) + "\n")
    r = results
    lines = [
        "# The default model on CUDA",
        "",
        f"`make test-gpu` (benchmarks/cuda.py) on {r['device']}; torch {r['torch']}; model {r['model']}. "
        f"Workload: {r['num_requests']} requests, prompts 32–512 tokens, 64–256 new tokens, `ignore_eos`, greedy, "
        f"seed 0. infer runs its Triton kernels (eager PyTorch for the rest: no CUDA graphs). transformers runs "
        f"the first {r['hf_sequential_requests']} requests one at a time and the first {r['hf_batched_requests']} "
        "in left-padded batches of 16, credited with every token. All figures come from one run.",
        "",
        "| dtype | infer tok/s | transformers one at a time | infer is | transformers padded 16 | infer is "
        "| infer batch-1 decode tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, f in r["dtypes"].items():
        lines.append(
            f"| {dtype} | {f['tok_s']:.0f} "
            f"| {f['hf_sequential_tok_s']:.0f} | {f['tok_s'] / f['hf_sequential_tok_s']:.1f}× "
            f"| {f['hf_padded16_tok_s']:.0f} | {f['tok_s'] / f['hf_padded16_tok_s']:.1f}× "
            f"| {f['batch1_decode_tok_s']:.0f} |"
        )
    lines.append("")
    (out_dir / "cuda.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--hf-sequential", type=int, default=8, help="requests for the one-at-a-time baseline")
    ap.add_argument("--hf-batched", type=int, default=32, help="requests for the padded-batch baseline")
    ap.add_argument("--batch1-tokens", type=int, default=256, help="new tokens of the batch-1 decode run")
    ap.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap each request's new tokens (smoke runs)")
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, only to check the script)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: the default model)")
    args = ap.parse_args(argv)
    on_cuda = torch.device(args.device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu, to check the script)", file=sys.stderr)
        return 2
    model_dir = args.model or default_model_dir()
    work = make_workload(args.num_requests, load_model_config(model_dir).vocab_size, seed=0)
    if args.max_new_tokens is not None:
        work = Workload(work.prompts, [min(n, args.max_new_tokens) for n in work.max_new])
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(args.device) if on_cuda else platform.processor() or "CPU",
        "torch": torch.__version__,
        "model": model_dir.name,
        "num_requests": args.num_requests,
        "hf_sequential_requests": args.hf_sequential,
        "hf_batched_requests": args.hf_batched,
        "batch1_new_tokens": args.batch1_tokens,
        "dtypes": {dtype: bench_dtype(model_dir, work, dtype, args) for dtype in args.dtype},
    }
    write_report(results, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
