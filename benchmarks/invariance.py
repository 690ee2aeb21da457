"""What batch invariance costs: decode-step milliseconds at batch 1, 16 and 64 in each precision.

One process measures one checkout (the `infer` its interpreter imports): for each precision (fp32,
bf16, int8) the default model on the default kernels, decode steps over contexts of 256 tokens, the
best of `--steps` steps per batch size. `--compare PYTHON` also runs this script under another
interpreter (another checkout's venv: main before the change), alternating the two round by round
(a shared machine's speed drifts), and writes the medians to docs/benchmarks/invariance.{json,md}.

    .venv/bin/python benchmarks/invariance.py --compare /work/main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
CONTEXT = 256
BATCHES = (1, 16, 64)
PRECISIONS = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantization": "int8"}}


def measure(steps: int) -> dict[str, dict[str, float]]:
    """{precision: {batch: best ms per decode step}} for the `infer` this interpreter imports."""
    import torch

    from infer.engine.config import EngineConfig
    from infer.engine.default_model import default_model_dir
    from infer.engine.loader import load_model
    from infer.engine.runner import ModelRunner, SeqWork

    out: dict[str, dict[str, float]] = {}
    for name, settings in PRECISIONS.items():
        model = load_model(default_model_dir(), EngineConfig(max_model_len=1024, **settings))
        out[name] = {}
        for batch in BATCHES:
            per_seq = CONTEXT // 16 + 1
            runner = ModelRunner(model, num_blocks=batch * per_seq, block_size=16)
            work = [
                SeqWork([100 + i], CONTEXT, list(range(i * per_seq, (i + 1) * per_seq)), True) for i in range(batch)
            ]
            best = float("inf")
            with torch.inference_mode():
                for i in range(steps + 2):  # two warm-up steps
                    start = time.perf_counter()
                    runner.execute(work)
                    if i >= 2:
                        best = min(best, time.perf_counter() - start)
            out[name][str(batch)] = best * 1e3
        del model
    return out


def compare(other: str, rounds: int, steps: int) -> dict[str, Any]:
    """Rounds of (other, this) measured in turn, each in a fresh process; the medians per cell."""
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    for _ in range(rounds):
        for label, python in (("before", other), ("after", sys.executable)):
            argv = [python, __file__, "--steps", str(steps)]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    med = {
        label: {p: {b: statistics.median(r[p][b] for r in rs) for b in map(str, BATCHES)} for p in PRECISIONS}
        for label, rs in runs.items()
    }
    threads = os.environ.get("OMP_NUM_THREADS", "all cores")
    return {
        "context_tokens": CONTEXT,
        "rounds": rounds,
        "steps": steps,
        "threads": threads,
        "median_ms": med,
        "runs": runs,
    }


def write_report(r: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "invariance.json").write_text(json.dumps(r, indent=2) + "\n")
    before, after = r["median_ms"]["before"], r["median_ms"]["after"]
    lines = [
        "# What batch invariance costs",
        "",
        "Measured by `python benchmarks/invariance.py --compare <main's python>`: ms per decode step of the default",
        f"model over contexts of {r['context_tokens']} tokens (best of {r['steps']} steps; median of {r['rounds']}",
        f"rounds, before and after measured in turn), compiled CPU kernels, threads: {r['threads']}.",
        "",
        "| precision | batch | before ms | after ms | after / before |",
        "|---|---|---|---|---|",
    ]
    for p in PRECISIONS:
        for b in map(str, BATCHES):
            lines.append(f"| {p} | {b} | {before[p][b]:.2f} | {after[p][b]:.2f} | {after[p][b] / before[p][b]:.2f} |")
    lines += [
        "",
        "What changed (docs/kernels.md, Batch invariance): every fp32 and bf16 linear runs `dense_linear` (one",
        "accumulator per row and channel, one fixed reduction tree) instead of torch's GEMM above 4 rows (fp32) or",
        "at any rows (bf16); the int8 kernel sums two accumulators per row and channel at every row count (a",
        "single row had four) and walks two strips at once for one row. The machine and its load decide the",
        "absolute numbers; compare the ratios of one run.",
    ]
    if r.get("note"):
        lines += ["", str(r["note"])]
    (out_dir / "invariance.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compare", metavar="PYTHON", help="another checkout's interpreter: the 'before' side")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--note", default="", help="a line on the conditions of the run, for the report")
    args = ap.parse_args()
    if args.compare is None:
        print(json.dumps(measure(args.steps)))
        return
    result = compare(args.compare, args.rounds, args.steps)
    result["note"] = args.note
    write_report(result, args.out_dir)
    print(json.dumps(result["median_ms"], indent=2))


if __name__ == "__main__":
    main()
