"""Where a decode step's time goes, and how much of it is host work: a model on the compiled CPU kernels (the
default model, or `--model DIR|FILE.gguf`).

For batch 1 and 16 (contexts of 256 tokens), fp32, int8 and int4 weights, the fused decoder stack and the unfused
per-op path, in one run. A step is what the engine does for a decode step: `ModelRunner.execute` (prepare,
forward, logits) and the sampler (greedy rows). For each configuration:

- step ms: the best of `--steps` unprofiled steps;
- host ms: under torch.profiler, a step's wall time less the self time of its compute kernels, the least over
  the profiled steps. Kernels: our compiled kernels (every `infer_cpu::` event but the fused stack's own glue,
  whose kernels are recorded as child events) and torch's ops that read or write tensor data (every aten op
  but views, shape changes and allocations). Host: Python, op dispatch, tensor bookkeeping, the runner's
  `prepare`, the sampler's glue, and the profiler's own cost per event (so an upper bound);
- host ms (step - kernels): the best unprofiled step less the least kernel time of a profiled step: host
  work without the profiler's cost per event (an estimate: the two come from different steps);
- kernel ms = step ms - host ms;
- ops / layer: ops Python dispatches per step (the profiler's top-level events), over the layers;
- parallel regions / layer: OpenMP fork/joins per step (`GOMP_parallel` calls, counted by a shim this script
  compiles and preloads), over the layers.

Writes docs/benchmarks/profile.md.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from infer.engine.config import EngineConfig
from infer.engine.default_model import default_model_dir
from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from infer.engine.sampler import SamplingBatch, SamplingRow
from infer.engine.sampling_params import SamplingParams

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "profile.md"
CONTEXT = 256
BATCHES = (1, 16)
PRECISIONS = ("none", "int8", "int4", "auto")  # auto: a GGUF file's own bits
# aten ops that only make views, change shapes or allocate: host work however long they take
NOT_KERNELS = frozenset((
    "view", "reshape", "_reshape_alias", "slice", "select", "as_strided", "t", "transpose", "unsqueeze", "squeeze",
    "split", "chunk", "narrow", "expand", "alias", "detach", "empty", "empty_strided", "empty_like", "resize_",
    "lift_fresh", "item", "_local_scalar_dense", "to", "contiguous", "unbind", "permute", "_unsafe_view",
    "split_with_sizes", "numpy_T", "dim",
))  # fmt: skip
STACK_GLUE = "infer_cpu::decoder_stack"  # the fused stack's own event: its kernels are child events

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
static long regions;
typedef void (*parallel_fn)(void (*)(void*), void*, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
  static parallel_fn real;
  if (!real) real = (parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  __atomic_add_fetch(&regions, 1, __ATOMIC_RELAXED);
  real(fn, data, n, flags);
}
long infer_parallel_regions(void) { return regions; }
"""


def _preload_shim() -> None:
    """Re-run this script with a GOMP_parallel counter preloaded (once; without a C compiler, go on without)."""
    if os.environ.get("INFER_PROFILE_SHIM"):
        return
    work = Path(tempfile.mkdtemp(prefix="infer-profile-"))
    (work / "shim.c").write_text(SHIM_SOURCE)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(work / "shim.so"), str(work / "shim.c"),
                            "-ldl"], capture_output=True)  # fmt: skip
    if built.returncode != 0:
        print("no C compiler: parallel regions are not counted", file=sys.stderr)
        return
    env = dict(os.environ, INFER_PROFILE_SHIM=str(work / "shim.so"))
    env["LD_PRELOAD"] = " ".join(p for p in (str(work / "shim.so"), env.get("LD_PRELOAD", "")) if p)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _region_counter() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None).infer_parallel_regions
    except AttributeError:
        return None
    fn.restype = ctypes.c_long
    return lambda: int(fn())


@dataclass(frozen=True)
class Figures:
    step_ms: float
    host_ms: float
    host_unprofiled_ms: float
    ops_per_step: float
    regions_per_step: float | None
    top: list[tuple[str, float]]  # (op, self ms per step), most first

    @property
    def kernel_ms(self) -> float:
        return self.step_ms - self.host_ms


def decode_work(batch: int, block_size: int) -> list[SeqWork]:
    per_seq = CONTEXT // block_size + 1
    return [SeqWork([100 + i], CONTEXT, list(range(i * per_seq, (i + 1) * per_seq)), True) for i in range(batch)]


def is_kernel(name: str) -> bool:
    if name.startswith("infer_cpu::"):
        return name != STACK_GLUE
    return name.startswith("aten::") and name.removeprefix("aten::") not in NOT_KERNELS


@contextmanager
def fused(model: CausalLM, on: bool) -> Iterator[None]:
    """The model with its fused decoder stack on or off (off: the per-op path)."""
    kept = model.fused
    model.fused = kept if on else None
    try:
        yield
    finally:
        model.fused = kept


@torch.inference_mode()
def measure(model: CausalLM, batch: int, steps: int, threads: int) -> Figures:
    runner = ModelRunner(model, num_blocks=batch * (CONTEXT // 16 + 1), block_size=16)
    work = decode_work(batch, 16)
    rows = SamplingBatch([SamplingRow(SamplingParams(temperature=0.0), [1], [], None) for _ in range(batch)])

    def step() -> None:
        runner.step(work, rows)

    for _ in range(3):
        step()  # warm-up: workspaces, first-call loading
    count = _region_counter()
    torch.set_num_threads(2)  # NOTE: fork/joins on 2 threads, whatever `threads` the timing runs on
    before = count() if count else 0
    step()
    regions = float(count() - before) if count else None
    torch.set_num_threads(threads)
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("step"):
                step()
    events = prof.events()
    marks = [e for e in events if e.name == "step"]
    top_level = [e for e in events if e.cpu_parent is not None and e.cpu_parent.name == "step"]
    kernel_us = [0.0] * len(marks)
    for e in events:
        if is_kernel(e.name):
            i = next(i for i, m in enumerate(marks) if m.time_range.start <= e.time_range.start <= m.time_range.end)
            kernel_us[i] += e.self_cpu_time_total
    # NOTE: host time is taken within each profiled step (its wall time less its kernels' time), the least of
    # all steps: on a shared machine a step's kernels and its host work are slowed by others at other moments
    host_us = min(m.time_range.end - m.time_range.start - k for m, k in zip(marks, kernel_us, strict=True))
    ops = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in prof.key_averages() if e.key != "step"]
    top = sorted(ops, key=lambda o: -o[1])
    unprofiled_us = max(0.0, best * 1e6 - min(kernel_us))
    return Figures(best * 1e3, host_us / 1e3, unprofiled_us / 1e3, len(top_level) / steps, regions, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="threads the steps are timed on")
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, help="default: none int8 int4 (a GGUF: auto)")
    ap.add_argument("--model", type=Path, help="a model directory or GGUF file (default: the default model)")
    ap.add_argument("--out", type=Path, help="default: docs/benchmarks/profile.md (profile-<model>.md with --model)")
    args = ap.parse_args()
    model_path = args.model or default_model_dir()
    gguf = model_path.suffix == ".gguf"
    args.precisions = args.precisions or (["auto"] if gguf else ["none", "int8", "int4"])
    args.out = args.out or (OUT if args.model is None else OUT.with_name(f"profile-{model_path.stem}.md"))
    _preload_shim()
    models = {q: load_model(model_path, EngineConfig(max_model_len=1024, quantization=q), kernels="cpu")
              for q in args.precisions}  # fmt: skip
    layers = next(iter(models.values())).cfg.num_layers
    results: dict[tuple[int, str, bool], Figures] = {}
    for batch in BATCHES:
        for q in args.precisions:
            for on in (False, True):
                if on and models[q].fused is None:
                    continue
                with fused(models[q], on):
                    results[batch, q, on] = f = measure(models[q], batch, args.steps, args.threads)
                print(f"batch {batch} {q} {'fused' if on else 'per-op'}: {f.step_ms:.2f} ms/step, "
                      f"host {f.host_ms:.2f} ms ({f.host_unprofiled_ms:.2f} unprofiled)", flush=True)  # fmt: skip
    args.out.write_text("\n".join(report(results, layers, args, model_path.name)) + "\n")


def report(
    results: dict[tuple[int, str, bool], Figures], layers: int, args: argparse.Namespace, model: str
) -> list[str]:
    lines = [
        "# Decode-step profile",
        "",
        f"Measured by `make profile-step` (`benchmarks/profile_step.py --threads {args.threads}`; {model} "
        f"({layers} layers), compiled CPU kernels, contexts of {CONTEXT} tokens, greedy sampling). A step is "
        f"`ModelRunner.execute` and the sampler; step ms is the best of {args.steps} unprofiled steps on "
        f"{args.threads} thread(s). Host ms: under torch.profiler, a step's wall time less the self time of its "
        "compute kernels (our compiled kernels and torch's ops that touch tensor data; not views, shape changes "
        f"or allocations), the least of {args.steps} steps: Python, op dispatch, tensor bookkeeping, `prepare`, "
        "the sampler's glue, and the profiler's own cost per event (an upper bound). Kernel ms = step - host. "
        "Ops: the ops Python dispatches. Parallel regions: OpenMP fork/joins on 2 threads (`GOMP_parallel` "
        "calls, counted by a preloaded shim). Host ms (step - kernels): the best unprofiled step less the least "
        "kernel time of a profiled step, host work without the profiler's cost per event (an estimate).",
        "",
        "| batch | weights | path | step ms | kernel ms | host ms | host ms (step - kernels) | ops / layer | "
        "parallel regions / layer |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (batch, q, on), f in results.items():
        regions = "n/a" if f.regions_per_step is None else f"{f.regions_per_step / layers:.1f}"
        lines.append(
            f"| {batch} | {_weights(q)} | {'fused' if on else 'per-op'} | {f.step_ms:.2f} | "
            f"{f.kernel_ms:.2f} | {f.host_ms:.2f} | {f.host_unprofiled_ms:.2f} | {f.ops_per_step / layers:.1f} | "
            f"{regions} |"
        )
    for (batch, q, on), f in results.items():
        total = sum(ms for _, ms in f.top)
        name = f"batch {batch}, {_weights(q)}, {'fused' if on else 'per-op'}"
        lines += ["", f"## {name}: self time per step (profiled)", "", "| op | self ms / step | share |"]
        lines += ["|---|---:|---:|"]
        lines += [f"| `{op}` | {ms:.3f} | {100 * ms / total:.0f}% |" for op, ms in f.top[: args.top]]
    return lines


def _weights(quantization: str) -> str:
    return {"none": "fp32", "auto": "the file's"}.get(quantization, quantization)


if __name__ == "__main__":
    main()
