"""Where a decode step's time goes: torch.profiler over decode steps of the default model.

For batch 1 and batch 64 (contexts of 256 tokens), fp32, on the PyTorch
reference kernels (`INFER_KERNELS=torch`) and on the compiled CPU kernels, in
one run: milliseconds per step and the ops with the most self time. Writes
docs/benchmarks/profile.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from infer.engine.config import EngineConfig
from infer.engine.default_model import default_model_dir
from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "profile.md"
CONTEXT = 256


def decode_work(batch: int, block_size: int) -> list[SeqWork]:
    per_seq = CONTEXT // block_size + 1
    return [SeqWork([100 + i], CONTEXT, list(range(i * per_seq, (i + 1) * per_seq)), True) for i in range(batch)]


@torch.inference_mode()
def profile_steps(model: CausalLM, batch: int, steps: int) -> tuple[float, list[tuple[str, float]]]:
    """(ms per step unprofiled, best of `steps`; [(op, self ms per step)] from a profiled run)."""
    runner = ModelRunner(model, num_blocks=batch * (CONTEXT // 16 + 1), block_size=16)
    work = decode_work(batch, 16)
    for _ in range(2):
        runner.execute(work)  # warm-up: workspaces, first-call loading
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        runner.execute(work)
        best = min(best, time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.execute(work)
    ops = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in prof.key_averages()]
    return best * 1e3, sorted(ops, key=lambda op: -op[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    backends = ("torch", "cpu")
    models = {b: load_model(default_model_dir(), EngineConfig(max_model_len=1024), kernels=b) for b in backends}
    lines = [
        "# Decode-step profile",
        "",
        f"Measured by `python benchmarks/profile_step.py` ({torch.get_num_threads()} threads, fp32, SmolLM2-135M, "
        f"contexts of {CONTEXT} tokens): ms per step (best of {args.steps}, unprofiled), then the ops with the "
        "most self time per step under torch.profiler. Both kernel sets in one run.",
        "",
    ]
    for batch in (1, 64):
        for backend in backends:
            step_ms, ops = profile_steps(models[backend], batch, args.steps)
            total = sum(ms for _, ms in ops)
            name = "PyTorch references" if backend == "torch" else "compiled CPU kernels"
            lines += [f"## batch {batch}, {name}: {step_ms:.1f} ms per step", "", "| op | self ms / step | share |"]
            lines += ["|---|---:|---:|"]
            lines += [f"| `{op}` | {ms:.2f} | {100 * ms / total:.0f}% |" for op, ms in ops[: args.top]]
            lines.append("")
            print(f"batch {batch} {backend}: {step_ms:.1f} ms/step", flush=True)
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
