"""Offline throughput: infer's LLM.generate vs transformers on the same model, workload and machine.

Writes docs/benchmarks/offline.json and docs/benchmarks/offline.md. Every figure
comes from this one run, so the ratios compare like with like. The transformers
baselines run on a subset of the requests (they are slow) and are credited with
every token they generate, padding waste excluded, which favours them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matrix_report
import offline_matrix
import torch
from offline_peers import PRECISIONS, bench_llama, bench_precisions

from infer import LLM, SamplingParams
from infer.engine.default_model import default_model_dir

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_new: list[int]

    @property
    def num_new_tokens(self) -> int:
        return sum(self.max_new)

    def head(self, n: int) -> Workload:
        return Workload(self.prompts[:n], self.max_new[:n])


def make_workload(num_requests: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    lengths = [rng.randint(32, 512) for _ in range(num_requests)]
    prompts = [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]
    return Workload(prompts, [rng.randint(64, 256) for _ in range(num_requests)])


def bench_ours(llm: LLM, work: Workload) -> float:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in work.max_new]
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params)
    elapsed = time.perf_counter() - start
    assert sum(len(o.token_ids) for o in outs) == work.num_new_tokens
    return work.num_new_tokens / elapsed


def bench_batch1_decode(llm: LLM, prompt: list[int], num_new: int) -> float:
    """Decode tok/s of one request: time from its first to its last token."""
    stamps = []
    for _ in llm.stream(prompt, SamplingParams(max_tokens=num_new, temperature=0, ignore_eos=True)):
        stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def measure_bandwidth_bytes_s(num_bytes: int = 1 << 29) -> float:
    """Read bandwidth over a buffer larger than any cache: the faster of a fp32 sum and a
    matrix-vector product (how decode reads weights), best of 3 each."""
    buf = torch.ones(num_bytes // 4)
    matrix, vector = buf.view(-1, 1024), torch.ones(1024)
    best = float("inf")
    for read in (buf.sum, lambda: torch.mv(matrix, vector)):
        for _ in range(3):
            start = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - start)
    return num_bytes / best


def bench_batch1_against_ceiling(llm: LLM, prompt: list[int], num_new: int, rounds: int) -> tuple[float, float]:
    """Batch-1 decode tok/s and read bandwidth, measured back to back in each round; the round with
    the best ratio counts (the host's bandwidth varies with what else runs on it, so a tok/s and a
    bandwidth taken minutes apart do not compare)."""
    pairs = []
    for _ in range(rounds):
        bandwidth = measure_bandwidth_bytes_s()
        pairs.append((bench_batch1_decode(llm, prompt, num_new), max(bandwidth, measure_bandwidth_bytes_s())))
    return max(pairs, key=lambda pair: pair[0] / pair[1])


def hf_model(model_dir: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def _hf_device(model: Any) -> torch.device:
    device: torch.device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize()
    return device


@torch.inference_mode()
def bench_hf_sequential(model: Any, work: Workload) -> float:
    start, generated, device = time.perf_counter(), 0, _hf_device(model)
    for prompt, n in zip(work.prompts, work.max_new, strict=True):
        ids = torch.tensor([prompt], device=device)
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        generated += out.shape[1] - len(prompt)
    _hf_device(model)
    return generated / (time.perf_counter() - start)


@torch.inference_mode()
def bench_hf_padded(model: Any, work: Workload, batch: int) -> float:
    start, generated, device = time.perf_counter(), 0, _hf_device(model)
    for i in range(0, len(work.prompts), batch):
        prompts, news = work.prompts[i : i + batch], work.max_new[i : i + batch]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        n = max(news)
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        generated += n * len(prompts)
    _hf_device(model)
    return generated / (time.perf_counter() - start)


@torch.inference_mode()
def bench_hf_continuous(model: Any, work: Workload) -> float:
    from transformers import GenerationConfig

    n = max(work.max_new)
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    outs = model.generate_batch(inputs=work.prompts, generation_config=config, warmup=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.generated_tokens) for o in outs.values()) / elapsed


def _peer_lines(r: dict[str, Any]) -> list[str]:
    """infer's best option against llama.cpp, both figures of this run; a note when llama-server did not run."""
    llama = r.get("llama", {})
    if "skipped" in llama:
        return ["", f"llama.cpp: not run ({llama['skipped']})."]
    if "tok_s" not in llama:
        return []
    notes = ["", *(f"llama.cpp: {note}." for note in llama.get("notes", []))]
    ours = {"fp32": (r["ours_tok_s"], r["batch1_decode_tok_s"])}
    ours |= {k: (v["tok_s"], v["batch1_decode_tok_s"]) for k, v in r.get("precisions", {}).items()}
    best_tput, best_b1 = max(ours, key=lambda k: ours[k][0]), max(ours, key=lambda k: ours[k][1])
    return [
        *notes,
        "",
        "| infer (best option) / llama.cpp | ratio |",
        "|---|---:|",
        f"| throughput, the whole workload ({best_tput}) | {ours[best_tput][0] / llama['tok_s']:.2f}× |",
        f"| batch-1 decode ({best_b1}) | {ours[best_b1][1] / llama['batch1_decode_tok_s']:.2f}× |",
    ]


def write_report(results: dict[str, Any], out_dir: Path = OUT_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "offline.json").write_text(json.dumps(results, indent=2) + "\n")
    r = results
    rows = [("infer `LLM.generate` (continuous batching)", r["ours_tok_s"], "all requests")]
    if "ours_reference_tok_s" in r:
        rows.append(("infer, PyTorch reference kernels (`INFER_KERNELS=torch`)", r["ours_reference_tok_s"], "all"))
    for name in PRECISIONS:
        if name in r.get("precisions", {}):
            rows.append((f"infer `LLM.generate`, {name} weights", r["precisions"][name]["tok_s"], "all"))
    if "tok_s" in r.get("llama", {}):
        rows.append((f"llama.cpp `llama-server -np {r['llama']['slots']}` (Q4_1), OpenAI HTTP", r["llama"]["tok_s"],
                     "all"))  # fmt: skip
    if "hf_sequential_tok_s" in r:
        rows += [
            (
                "transformers `generate`, one at a time",
                r["hf_sequential_tok_s"],
                f"first {r['hf_sequential_requests']}",
            ),
            (
                "transformers `generate`, left-padded batches of 16",
                r["hf_padded16_tok_s"],
                f"first {r['hf_padded_requests']}",
            ),
            (
                "transformers `generate_batch` (continuous)",
                r["hf_continuous_tok_s"],
                f"first {r['hf_continuous_requests']}",
            ),
        ]
    lines = [
        "# Offline throughput",
        "",
        f"Measured by `make bench-offline` on {r['machine']}, {r['threads']} torch threads, fp32, model "
        f"{r['model']}. Workload: {r['num_requests']} requests, prompts 32–512 tokens, {r['new_tokens']} new tokens, "
        "`ignore_eos`, greedy, seed 0. All figures come from one run. infer runs the "
        f"{r.get('kernels', 'PyTorch references')}.",
        "",
        "| system | output tok/s | requests | infer is |",
        "|---|---:|---|---:|",
    ]
    for name, tok_s, subset in rows:
        lines.append(f"| {name} | {tok_s:.1f} | {subset} | {r['ours_tok_s'] / tok_s:.1f}× |")
    lines += [
        "",
        "| batch-1 decode | tok/s |",
        "|---|---:|",
        f"| infer, 1 request (128 prompt + {r['batch1_new_tokens']} new, the best of {r['batch1_rounds']} rounds) "
        f"| {r['batch1_decode_tok_s']:.1f} |",
        f"| memory-bandwidth ceiling ({r['bandwidth_gib_s']:.1f} GiB/s best read around that run "
        f"÷ {r['weight_bytes'] / 1e6:.0f} MB of weights) "
        f"| {r['bandwidth_ceiling_tok_s']:.1f} |",
        f"| infer as a share of the ceiling | {100 * r['batch1_decode_tok_s'] / r['bandwidth_ceiling_tok_s']:.0f}% |",
    ]
    if "batch1_reference_tok_s" in r:
        lines.append(f"| infer, 1 request, PyTorch reference kernels (one round) | {r['batch1_reference_tok_s']:.1f} |")
    for name, figures in r.get("precisions", {}).items():
        lines.append(f"| infer, 1 request, {name} weights (one round) | {figures['batch1_decode_tok_s']:.1f} |")
    if "tok_s" in r.get("llama", {}):
        lines.append(f"| llama.cpp `llama-server`, 1 request over HTTP (1 / mean time per token) "
                     f"| {r['llama']['batch1_decode_tok_s']:.1f} |")  # fmt: skip
    lines += _peer_lines(r)
    lines += [
        "",
    ]
    if "matrix" in r:
        lines += matrix_report.markdown(r["matrix"], "offline")
    if len(rows) > 1:
        lines += [
            "The transformers baselines run on the first requests of the same workload (they take minutes per "
            "request batch on this CPU) and are credited with every token they generate, padding included.",
            "",
        ]
    (out_dir / "offline.md").write_text("\n".join(lines))


def reference_llm(model_dir: Path) -> LLM:
    """The engine on the PyTorch reference kernels: INFER_KERNELS=torch while it starts (the backend is chosen then)."""
    before = os.environ.get("INFER_KERNELS")
    os.environ["INFER_KERNELS"] = "torch"
    try:
        return LLM(str(model_dir), max_model_len=1024)
    finally:
        if before is None:
            del os.environ["INFER_KERNELS"]
        else:
            os.environ["INFER_KERNELS"] = before


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"not one of {', '.join(PRECISIONS)}: {text!r}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--hf-sequential", type=int, default=6, help="requests for the one-at-a-time baseline")
    ap.add_argument("--hf-batched", type=int, default=16, help="requests for the batched baselines")
    ap.add_argument("--skip-hf", action="store_true", help="only infer's own figures")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap each request's new tokens (smoke runs)")
    ap.add_argument("--batch1-tokens", type=int, default=128, help="new tokens of the batch-1 decode run")
    ap.add_argument("--batch1-rounds", type=int, default=5, help="batch-1 runs, each between two bandwidth reads")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--skip-reference", action="store_true", help="skip infer on the PyTorch reference kernels")
    ap.add_argument("--skip-precisions", action="store_true", help="skip infer with bf16, int8 and int4 weights")
    ap.add_argument("--precisions", type=_names, default=tuple(PRECISIONS),
                    help=f"which lower precisions, comma-separated (default: {','.join(PRECISIONS)})")  # fmt: skip
    ap.add_argument("--skip-llama", action="store_true", help="skip llama.cpp's llama-server")
    offline_matrix.add_arguments(ap)
    args = ap.parse_args()
    model_dir = default_model_dir()
    llm = LLM(str(model_dir), max_model_len=1024)
    work = make_workload(args.num_requests, llm.core.model_info.vocab_size, seed=0)
    if args.max_new_tokens is not None:
        work = Workload(work.prompts, [min(n, args.max_new_tokens) for n in work.max_new])
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.core.runner.model.parameters())
    results: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "threads": torch.get_num_threads(),
        "model": model_dir.name,
        "num_requests": args.num_requests,
        "weight_bytes": weight_bytes,
        "new_tokens": "64–256" if args.max_new_tokens is None else f"64–256 capped at {args.max_new_tokens}",
        "batch1_new_tokens": args.batch1_tokens,
        "batch1_rounds": args.batch1_rounds,
    }
    bench_ours(llm, work.head(4))  # warm-up
    results["ours_tok_s"] = bench_ours(llm, work)
    # best of several: one 128-token run is short enough for other work on the machine to skew it
    results["batch1_decode_tok_s"], bandwidth = bench_batch1_against_ceiling(
        llm, work.prompts[0][:128], args.batch1_tokens, args.batch1_rounds
    )
    results["bandwidth_gib_s"] = bandwidth / 2**30
    results["bandwidth_ceiling_tok_s"] = bandwidth / weight_bytes
    compiled = llm.core.model_info.kernels == "cpu"
    results["kernels"] = "compiled CPU kernels" if compiled else "PyTorch references"
    slots, tokenizer = llm.core.config.max_num_seqs, llm.tokenizer
    del llm
    if not args.skip_reference and compiled:
        # the same engine on the references (INFER_KERNELS=torch), in this run: the compiled kernels' gain
        reference = reference_llm(model_dir)
        results["ours_reference_tok_s"] = bench_ours(reference, work)
        results["batch1_reference_tok_s"] = bench_batch1_decode(reference, work.prompts[0][:128], args.batch1_tokens)
        del reference
    batch1_prompt = work.prompts[0][:128]
    if not args.skip_precisions:
        results["precisions"] = bench_precisions(
            model_dir, work.prompts, work.max_new, lambda llm: bench_ours(llm, work),
            lambda llm: bench_batch1_decode(llm, batch1_prompt, args.batch1_tokens), args.precisions,
        )  # fmt: skip
    if not args.skip_llama:
        results["llama"] = bench_llama(work.prompts, work.max_new, slots, batch1_prompt, args.batch1_tokens)
    if not args.skip_matrix:
        results["matrix"] = offline_matrix.run_from_args(args, model_dir, tokenizer)
        results["goals"] = matrix_report.goals(results["matrix"]["rounds"], results["matrix"]["precisions"], "offline")
    if not args.skip_hf:
        model = hf_model(model_dir)
        results["hf_sequential_requests"] = args.hf_sequential
        results["hf_sequential_tok_s"] = bench_hf_sequential(model, work.head(args.hf_sequential))
        results["hf_padded_requests"] = results["hf_continuous_requests"] = args.hf_batched
        results["hf_padded16_tok_s"] = bench_hf_padded(model, work.head(args.hf_batched), 16)
        results["hf_continuous_tok_s"] = bench_hf_continuous(model, work.head(args.hf_batched))
    print(json.dumps(results, indent=2))
    write_report(results, args.out_dir)


if __name__ == "__main__":
    main()
