"""Where a decode step's time goes on CUDA: the GPU's kernel time against the wall time of a step.

    python benchmarks/profile_cuda.py            # `make test-gpu` runs it; writes docs/benchmarks/profile-cuda.md/.json
    python benchmarks/profile_cuda.py --device cpu --num-layers 2 --new-tokens 4 --out-dir /tmp/x   # checks the script

The model has the default model's shape (SmolLM2-135M: 30 layers, hidden 576) with random weights, so the script
needs no model files; a decode step's work does not depend on the weights' values. For batch 1 and 16 (prompts of
128 random tokens, `--new-tokens` greedy tokens each, `ignore_eos`) and each dtype:

- wall ms / step: an unprofiled `LLM.generate`'s time over its decode steps;
- GPU ms / step: the summed duration of every CUDA kernel torch.profiler records in a second, profiled run, over
  the same steps (kernels do not overlap on one stream, so this is the time the GPU was busy);
- kernels / step, and the host's share: 1 - GPU ms / wall ms, the time the GPU waited for the host to launch work.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from infer import LLM, SamplingParams

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
PROMPT_TOKENS = 128
# SmolLM2-135M-Instruct's shape (the default model)
SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def write_random_model(out_dir: Path, num_layers: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(**{**SHAPE, "num_hidden_layers": num_layers}, bos_token_id=0, eos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    vocab = {f"t{i}": i for i in range(SHAPE["vocab_size"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="t0", eos_token="t1").save_pretrained(out_dir)
    return out_dir


def decode_steps(llm: LLM, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds of the decode steps: a run of `new_tokens` less a run of one token (the prefill and its first)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, first)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start - prefill


def profile_config(llm: LLM, batch: int, new_tokens: int, device: str) -> dict[str, float]:
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(2, SHAPE["vocab_size"], (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(batch)]
    decode_steps(llm, prompts, 8)  # warm-up: compiles the kernels for these shapes
    steps = new_tokens - 1
    wall = min(decode_steps(llm, prompts, new_tokens) for _ in range(3)) / steps
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    with torch.profiler.profile(activities=activities) as prof:
        llm.generate(prompts, params)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.time_range.elapsed_us() for e in kernels)
    # the profiled run also prefills: its kernels are counted over all its steps, prefill included
    gpu = gpu_us / 1e6 / new_tokens
    return {
        "wall_ms_per_step": wall * 1e3,
        "gpu_ms_per_step": gpu * 1e3,
        "kernels_per_step": len(kernels) / new_tokens,
        "host_share": max(0.0, 1 - gpu / wall),
        "tok_s": batch / wall,
    }


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profile-cuda.json").write_text(json.dumps(results, indent=2) + "\n")
    r = results
    lines = [
        "# A decode step on CUDA: GPU time against wall time",
        "",
        f"`make test-gpu` (benchmarks/profile_cuda.py) on {r['device']}; torch {r['torch']}. The default model's "
        f"shape with random weights; prompts of {PROMPT_TOKENS} tokens, {r['new_tokens']} new tokens each, greedy. "
        "GPU ms: the summed kernel time torch.profiler recorded, per step; host share: 1 - GPU ms / wall ms.",
        "",
        "| dtype | batch | wall ms / step | GPU ms / step | kernels / step | host share | tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['dtype']} | {row['batch']} | {row['wall_ms_per_step']:.2f} | {row['gpu_ms_per_step']:.2f} "
            f"| {row['kernels_per_step']:.0f} | {row['host_share']:.0%} | {row['tok_s']:.0f} |"
        )
    lines.append("")
    (out_dir / "profile-cuda.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, only to check the script)")
    ap.add_argument(
        "--num-layers", type=int, default=SHAPE["num_hidden_layers"], help="fewer: only to check the script"
    )
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu, to check the script)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model(Path(tmp), args.num_layers)
        for dtype in args.dtype:
            llm = LLM(str(model_dir), device=args.device, dtype=dtype, max_model_len=512)
            for batch in args.batch:
                row = {"dtype": dtype, "batch": batch, **profile_config(llm, batch, args.new_tokens, args.device)}
                print(json.dumps(row), flush=True)
                rows.append(row)
            llm.core.block_manager.assert_no_leaks()
            del llm
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "CPU"
    write_report(
        {"device": device, "torch": torch.__version__, "new_tokens": args.new_tokens, "rows": rows}, args.out_dir
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
