"""Real model sizes on one CUDA GPU, with no files carried: `make bench-gpu`.

    python benchmarks/cuda.py                  # on a GPU: writes docs/benchmarks/cuda.json and cuda.md
    python benchmarks/cuda.py --gguf F.gguf    # also a GGUF file, its tensors dequantized to bf16
    python benchmarks/cuda.py --device cpu --tiny --out-dir /tmp/x ...   # the dry run (make test's test of it)

Each model is a real shape with random bf16 weights drawn on the device (cuda_models.py: SmolLM2-135M,
Qwen2.5-1.5B, Llama-3.2-1B, Llama-3.1-8B), written to a temporary model directory that infer loads as any model.
For each, with CUDA graphs on and then off (`cuda_graphs`): decode tok/s at every captured batch size, batch-1
decode tok/s (and, beside the card's HBM bandwidth, the share of the limit that reading the weights once a token
sets), the host's share of a decode step at batch 1 and 16 (1 - the GPU's kernel time over the wall time, from
torch.profiler), and the greedy tokens and logprobs of a few prompts, which must be identical on and off. Then
transformers on the same device over the same tensors: batch-1 decode and left-padded batches of 16. Then
`infer serve` on the model directory (graphs on) driven by `infer bench`'s load generator over gRPC: one stream
and `--concurrency` streams (16 for SmolLM2, 64 for Qwen2.5-1.5B). Every figure comes from this one run.

The run keeps to `--budget-s`: a part that would start past it is not run, and the report says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cuda_models
import cuda_report
import torch
from offline import Workload as OfflineWork
from offline import bench_batch1_decode, bench_hf_padded, measure_bandwidth_bytes_s
from serving_servers import infer_server

from infer import LLM, SamplingParams
from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import summarize
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import FIRST_ID, RequestSpec, Workload

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
# HBM bandwidth of each card (the vendors' data sheets), by a word of torch.cuda.get_device_name
CARD_BANDWIDTH = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12))
# the server runs of each shape: (one stream, N concurrent) with N from --concurrency, in this order
SERVED = ("smollm2-135m", "qwen2.5-1.5b")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes the engine captures: engine/cuda_graphs.py's where it has them, else issue 39's
    rule (1, 2, 4, 8, then every 8 up to max_num_seqs)."""
    try:
        from infer.engine.cuda_graphs import capture_sizes as engine_sizes
    except ImportError:
        return [b for b in (1, 2, 4, 8) if b <= max_num_seqs] + list(range(16, max_num_seqs + 1, 8))
    return list(engine_sizes(max_num_seqs))


@dataclass
class Budget:
    """The run's time: a part starts only while some is left; what did not start is noted."""

    seconds: float
    start: float = field(default_factory=time.monotonic)
    skipped: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, what: str) -> bool:
        if self.left() > 0:
            return True
        self.skipped.append(what)
        print(f"skipped (time budget): {what}", flush=True)
        return False


@dataclass(frozen=True)
class Settings:
    device: str
    max_num_seqs: int
    max_model_len: int
    prompt_tokens: int  # each prompt of the batch-size sweep and the host-share runs
    new_tokens: int  # tokens of each timed sweep run (its decode steps: new_tokens - 1)
    batch1_tokens: int  # tokens of the batch-1 stream
    server_tokens: int  # new tokens of each served request
    hf_requests: int  # requests of transformers' padded batches of 16

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def num_blocks(self) -> int:  # every running sequence at the longest length, and one more
        return (self.max_num_seqs + 1) * -(-self.max_model_len // 16)

    @property
    def max_batched_tokens(self) -> int:  # a whole batch of sweep prompts in one prefill step
        return max(256, self.max_num_seqs * self.prompt_tokens)

    def engine(self, graphs: bool) -> dict[str, Any]:
        return {"device": self.device, "dtype": "bfloat16", "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs, "num_blocks": self.num_blocks, "cuda_graphs": graphs,
                "max_num_batched_tokens": self.max_batched_tokens, "enable_prefix_caching": False,
                **({} if self.on_cuda else {"cpu_threads": 1})}  # fmt: skip

    def serve_flags(self, model: str, quantization: str) -> tuple[str, ...]:
        return ("--model", model, "--device", self.device, "--dtype", "bfloat16", "--quantization", quantization,
                "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
                "--num-blocks", str(self.num_blocks), "--max-num-batched-tokens", str(self.max_batched_tokens),
                "--no-enable-prefix-caching", "--cuda-graphs")  # fmt: skip


def prompts_of(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab) for _ in range(length)] for _ in range(n)]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def greedy(n: int, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=logprobs)


def decode_step_s(llm: LLM, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds of one decode step of this batch: the quicker of two runs of `new_tokens` less the quicker of two
    runs of one token (the prefill and its token), over the decode steps between."""

    def run(n: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, greedy(n))
        return time.perf_counter() - start

    one, full = min(run(1), run(1)), min(run(new_tokens), run(new_tokens))
    return max(full - one, 1e-9) / (new_tokens - 1)  # NOTE: floored: on a noisy host the difference can be < 0


def gpu_kernel_s(run: Callable[[], object], device: str) -> tuple[float, int] | None:
    """The summed duration and count of the CUDA kernels torch.profiler records while `run` runs (kernels do not
    overlap on one stream: the time the GPU was busy); None on a device without kernels to record."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not on_cuda:
        return None
    return sum(e.time_range.elapsed_us() for e in kernels) / 1e6, len(kernels)


def host_share(llm: LLM, prompts: list[list[int]], new_tokens: int, wall_step_s: float, device: str) -> dict[str, Any]:
    """The host's share of a decode step: 1 - GPU kernel time / wall time, each per decode step (the profiled
    runs of `new_tokens` and of one token differ by the decode steps)."""
    long = gpu_kernel_s(lambda: llm.generate(prompts, greedy(new_tokens)), device)
    short = gpu_kernel_s(lambda: llm.generate(prompts, greedy(1)), device)
    if long is None or short is None:
        return {"host_share": None, "gpu_ms_per_step": None, "kernels_per_step": None, "why": "no CUDA kernels"}
    steps = new_tokens - 1
    gpu_step_s = max(0.0, long[0] - short[0]) / steps
    if long[1] <= short[1]:  # NOTE: a profiler blind to the decode's kernels (replayed graphs?) is not 100% host
        why = "the profiler saw no decode kernels"
        return {"host_share": None, "gpu_ms_per_step": None, "kernels_per_step": 0, "why": why}
    return {"host_share": max(0.0, 1 - gpu_step_s / wall_step_s), "gpu_ms_per_step": gpu_step_s * 1e3,
            "kernels_per_step": (long[1] - short[1]) / steps}  # fmt: skip


def parity_outputs(llm: LLM, vocab: int, prompt_tokens: int, new_tokens: int) -> list[dict[str, Any]]:
    """Greedy tokens and their logprobs: three prompts of different lengths in one batch (3 rows: padded to 4
    with graphs), then the first alone."""
    lengths = (prompt_tokens // 2 + 5, prompt_tokens, prompt_tokens + prompt_tokens // 2 + 5)
    prompts = [prompts_of(1, n, vocab, seed=n)[0] for n in lengths]
    outs = llm.generate(prompts, greedy(new_tokens, logprobs=0)) + llm.generate(prompts[:1], greedy(new_tokens, 0))
    return [{"tokens": o.token_ids, "logprobs": [lp.logprob for lp in o.logprobs or []]} for o in outs]


def compare_parity(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict[str, Any]:
    tokens_equal = all(a["tokens"] == b["tokens"] for a, b in zip(on, off, strict=True))
    diffs = [
        abs(x - y) for a, b in zip(on, off, strict=True) for x, y in zip(a["logprobs"], b["logprobs"], strict=False)
    ]
    max_diff = max(diffs, default=0.0)
    return {"tokens_equal": tokens_equal, "max_logprob_diff": max_diff, "identical": tokens_equal and max_diff == 0.0}


def graph_stats(llm: LLM) -> dict[str, Any] | None:
    """What the engine captured (ModelInfo.cuda_graphs: sizes, seconds, pool bytes); None where it says nothing."""
    stats = getattr(llm.core.model_info, "cuda_graphs", None)
    if stats is None:
        return None
    return {"sizes": list(stats.sizes), "capture_s": stats.capture_s, "memory_bytes": stats.memory_bytes}


def free_device() -> None:
    """The device memory of what was dropped back to the driver (the next model's room)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def bench_engine(key: str, model: str, vocab: int, graphs: bool, s: Settings, budget: Budget,
                 quant: str) -> dict[str, Any]:  # fmt: skip
    """One engine (graphs on or off) on the model: the batch-size sweep, batch 1, host share, parity outputs."""
    start = time.perf_counter()
    llm = LLM(model, quantization=quant, **s.engine(graphs))
    out: dict[str, Any] = {"load_s": time.perf_counter() - start, "sizes": {}, "host": {}, "graphs": graph_stats(llm)}
    prompts = prompts_of(s.max_num_seqs, s.prompt_tokens, vocab, seed=1)
    llm.generate(prompts, greedy(3))  # warm-up: compiles the kernels for the largest batch and for one row
    llm.generate(prompts[:1], greedy(3))
    for b in capture_sizes(s.max_num_seqs):
        if not budget.allows(f"{key}: graphs {'on' if graphs else 'off'}, batch {b} and larger"):
            break
        step = decode_step_s(llm, prompts[:b], s.new_tokens)
        out["sizes"][b] = {"step_ms": step * 1e3, "tok_s": b / step}
    out["batch1_decode_tok_s"] = bench_batch1_decode(llm, prompts[0], s.batch1_tokens)
    for b in (1, 16):
        if b in out["sizes"]:
            wall = out["sizes"][b]["step_ms"] / 1e3
            out["host"][b] = host_share(llm, prompts[:b], s.new_tokens, wall, s.device)
    out["parity"] = parity_outputs(llm, vocab, s.prompt_tokens, s.new_tokens)
    llm.core.block_manager.assert_no_leaks()
    del llm
    free_device()
    return out


@torch.inference_mode()
def hf_decode_step_s(model: Any, prompt: list[int], new_tokens: int, device: str) -> float:
    ids = torch.tensor([prompt], device=device)

    def run(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync(device)
        return time.perf_counter() - start

    run(2)  # warm-up
    return (run(new_tokens) - run(1)) / (new_tokens - 1)


def server_workload(concurrency: int, s: Settings, vocab: int, seed: int) -> Workload:
    n = max(4, 2 * concurrency)  # each stream runs two requests: the measured stretch is the full batch
    specs = tuple(RequestSpec(tuple(p), s.server_tokens) for p in prompts_of(n, s.prompt_tokens, vocab, seed))
    desc = f"{n} requests, {s.prompt_tokens}-token prompts, {s.server_tokens} new tokens, {concurrency} at once"
    return Workload(f"c{concurrency}", desc, specs, concurrency=concurrency)


def bench_server(key: str, model: str, quant: str, vocab: int, concurrencies: list[int], s: Settings,
                 budget: Budget, log_dir: Path, out: dict[str, Any]) -> None:  # fmt: skip
    """`infer serve` on the model (graphs on), driven over gRPC: output tok/s at each concurrency, into `out`."""
    with infer_server(key, s.serve_flags(model, quant), log_dir) as server:
        out["ready_s"] = server.ready_s
        for c in concurrencies:
            if not budget.allows(f"{key}: the server at {c} concurrent"):
                continue
            work = server_workload(c, s, vocab, seed=100 + c)

            async def drive(work: Workload = work, c: int = c) -> Any:
                target = make_target("grpc", server.grpc or "")
                try:
                    return await run_load(target, work, LoadPlan(concurrency=c, warmup=1, progress=False))
                finally:
                    await target.close()

            results = asyncio.run(drive())
            failed = [f"{r.status} {r.error}" for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{key} at {c} concurrent: {len(failed)} request(s) failed, first: {failed[0]}")
            summary = summarize(results)
            out[str(c)] = {"output_tok_s": summary.output_tokens_per_s, "ttft_p50_s": summary.ttft_s.p50,
                           "tpot_mean_s": summary.tpot_s.mean, "requests": len(results)}  # fmt: skip
            print(f"  {key} server {c} concurrent: {json.dumps(out[str(c)])}", flush=True)


def card_bandwidth(device: str) -> tuple[float, str]:
    """Bytes/s of the device's memory and where the figure comes from: the data sheet of a known card, else a
    measured read (the host's, on the CPU)."""
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(device)
        for word, bandwidth in CARD_BANDWIDTH:
            if word in name:
                return bandwidth, f"{name}'s data sheet"
        buf = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        copy = torch.empty_like(buf)
        sync(device)
        start = time.perf_counter()
        for _ in range(10):
            copy.copy_(buf)
        sync(device)
        return 2 * 10 * buf.numel() / (time.perf_counter() - start), "a device-to-device copy, measured"
    return measure_bandwidth_bytes_s(1 << 24), "the host's read bandwidth, measured"


@dataclass(frozen=True)
class ModelSpec:
    """One model of the run: a shape to draw, or a GGUF file to dequantize."""

    key: str
    label: str
    shape: cuda_models.Shape | None = None
    gguf: Path | None = None
    num_layers: int | None = None  # a prefix of the shape's layers (None: all)


@contextlib.contextmanager
def materialized(spec: ModelSpec, s: Settings, tiny: bool, tmp: Path) -> Iterator[dict[str, Any]]:
    """The model on disk for infer, its config, its decode bytes, and transformers' model over the same tensors
    (built when asked: `hf()`); the directory and the tensors are gone after."""
    start = time.perf_counter()
    gguf = spec.gguf
    if gguf is not None:
        yield {"path": str(gguf), "quant": "none", "hf": lambda: gguf_hf_model(gguf, s.device), "config": None,
               "build_s": 0.0}  # fmt: skip
        return
    assert spec.shape is not None
    config = cuda_models.config_json(spec.shape, tiny, spec.num_layers)
    held = {"weights": cuda_models.random_weights(config, s.device)}  # dropped on the way out: the device's room
    model_dir = cuda_models.write_model_dir(tmp / spec.key, config, held["weights"])
    try:
        yield {"path": str(model_dir), "quant": "auto", "config": config, "build_s": time.perf_counter() - start,
               "decode_bytes": cuda_models.decode_bytes(config, held["weights"]),
               "hf": lambda: cuda_models.hf_model(config, held["weights"])}  # fmt: skip
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
        held.clear()
        free_device()


def gguf_hf_model(path: Path, device: str) -> Any:
    import transformers  # NOTE: transformers reads GGUF files with the `gguf` package (absent: no baseline)

    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    return model.to(device).eval()


def bench_model(spec: ModelSpec, s: Settings, args: argparse.Namespace, budget: Budget, tmp: Path,
                res: dict[str, Any]) -> None:  # fmt: skip
    """Every part of one model, its figures put in `res` as each part ends (a part that raises keeps the ones
    before it)."""
    res.update({"label": spec.label, "num_layers": spec.num_layers, "engines": {}})
    with materialized(spec, s, args.tiny, tmp) as m:
        res["build_s"] = m["build_s"]
        print(f"[{budget.elapsed():.0f} s] {spec.key}: made in {m['build_s']:.1f} s", flush=True)
        vocab = int(m["config"]["vocab_size"]) if m["config"] else _gguf_vocab(m["path"])
        for graphs in (True, False):
            name = "graphs_on" if graphs else "graphs_off"
            if budget.allows(f"{spec.key}: the engine with graphs {'on' if graphs else 'off'}"):
                try:
                    res["engines"][name] = bench_engine(spec.key, m["path"], vocab, graphs, s, budget, m["quant"])
                except Exception as e:  # NOTE: graphs that fail to capture must not cost the eager figures
                    traceback.print_exc()
                    res["engines"][name] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
                    free_device()
                shown = {k: v for k, v in res["engines"][name].items() if k != "parity"}
                print(f"[{budget.elapsed():.0f} s] {spec.key} {name}: {json.dumps(shown)}", flush=True)
        engines = res["engines"]
        if all("parity" in engines.get(n, {}) for n in ("graphs_on", "graphs_off")):
            res["parity"] = compare_parity(engines["graphs_on"].pop("parity"), engines["graphs_off"].pop("parity"))
        for e in engines.values():
            e.pop("parity", None)
        if m.get("decode_bytes") is not None:
            res["decode_bytes"] = m["decode_bytes"]
        elif "graphs_on" in engines or "graphs_off" in engines:
            res["decode_bytes"] = _gguf_decode_bytes(m["path"])
        if budget.allows(f"{spec.key}: transformers"):
            res["hf"] = bench_hf(m["hf"], spec.key, vocab, s, args)
        if spec.key in SERVED and not args.no_server and budget.allows(f"{spec.key}: the server"):
            concurrency = args.concurrency[SERVED.index(spec.key)]
            res["server"] = {}
            bench_server(spec.key, m["path"], m["quant"], vocab, [1, concurrency], s, budget, args.log_dir,
                         res["server"])  # fmt: skip


def bench_hf(build: Callable[[], Any], key: str, vocab: int, s: Settings, args: argparse.Namespace) -> dict[str, Any]:
    try:
        model = build()
    except Exception as e:  # NOTE: the report says why there is no baseline (e.g. no `gguf` package for a GGUF)
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    out = {"batch1_decode_tok_s": 1 / hf_decode_step_s(model, prompts_of(1, s.prompt_tokens, vocab, 1)[0],
                                                       s.new_tokens, s.device)}  # fmt: skip
    if key in SERVED:  # the same requests as the server's concurrent run, the first hf_requests of them
        concurrency = args.concurrency[SERVED.index(key)]
        work = server_workload(concurrency, s, vocab, seed=100 + concurrency)
        head = work.requests[: s.hf_requests]
        offline = OfflineWork([list(r.prompt) for r in head], [r.max_tokens for r in head])
        out["padded16_tok_s"] = bench_hf_padded(model, offline, 16)
    print(f"{key} transformers: {json.dumps(out)}", flush=True)
    del model
    free_device()
    return out


def _gguf_vocab(path: str) -> int:
    from infer.engine.loader import gguf_config, open_source

    return gguf_config(open_source(Path(path))).vocab_size


def _gguf_decode_bytes(path: str) -> int:
    """A GGUF model's decode bytes as bf16: its tensors' element counts (the embedding's when the head is
    tied), 2 bytes each."""
    from infer.engine.loader import gguf_config, open_source

    source = open_source(Path(path))
    cfg = gguf_config(source)
    total = sum(math.prod(t.shape) for t in source.tensors)
    if not cfg.tie_word_embeddings:
        total -= cfg.vocab_size * cfg.hidden_size
    return 2 * total


def parse_layers(values: list[str]) -> dict[str, int]:
    out = {}
    for v in values:
        key, _, n = v.partition("=")
        if key not in cuda_models.SHAPES or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"--layers {v}: expected SHAPE=N with SHAPE one of {', '.join(cuda_models.SHAPES)}")
        out[key] = int(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, only to check the script: the dry run)")
    ap.add_argument("--tiny", action="store_true", help="tiny versions of the shapes (the dry run)")
    ap.add_argument("--models", nargs="*", choices=list(cuda_models.SHAPES), default=list(cuda_models.SHAPES))
    ap.add_argument("--gguf", nargs="*", type=Path, default=[], help="GGUF files, dequantized to bf16")
    ap.add_argument("--layers", nargs="*", default=[], help="SHAPE=N: only the first N layers of that shape")
    ap.add_argument("--concurrency", nargs=2, type=int, default=[16, 64], metavar=("SMOLLM2", "QWEN"),
                    help="the concurrent streams of the SmolLM2 and the Qwen2.5-1.5B server runs")  # fmt: skip
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens of each timed run of the size sweep")
    ap.add_argument("--batch1-tokens", type=int, default=128)
    ap.add_argument("--server-tokens", type=int, default=128)
    ap.add_argument("--hf-requests", type=int, default=32, help="requests of transformers' padded batches")
    ap.add_argument("--no-server", action="store_true", help="no `infer serve` runs")
    ap.add_argument("--budget-s", type=float, default=240.0, help="no part starts after this many seconds")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: docs/benchmarks on CUDA, else a temp dir")
    args = ap.parse_args(argv)
    on_cuda = torch.device(args.device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu --tiny, the dry run)", file=sys.stderr)
        return 2
    layers = parse_layers(args.layers)
    s = Settings(args.device, args.max_num_seqs, args.max_model_len, args.prompt_tokens, args.new_tokens,
                 args.batch1_tokens, args.server_tokens, args.hf_requests)  # fmt: skip
    specs = [ModelSpec(k, cuda_models.SHAPES[k].label, shape=cuda_models.SHAPES[k], num_layers=layers.get(k))
             for k in args.models]  # fmt: skip
    specs += [ModelSpec(f"gguf:{g.name}", f"{g.name} (GGUF, dequantized to bf16)", gguf=g.resolve()) for g in args.gguf]
    budget = Budget(args.budget_s)
    bandwidth, bandwidth_source = card_bandwidth(args.device)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(args.device) if on_cuda else platform.processor() or "CPU",
        "versions": _versions(),
        "tiny": args.tiny,
        "bandwidth_bytes_s": bandwidth,
        "bandwidth_source": bandwidth_source,
        "settings": {
            **vars(s),
            "capture_sizes": capture_sizes(s.max_num_seqs),
            "concurrency": args.concurrency,
            "budget_s": args.budget_s,
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp, _restored_threads():
        args.log_dir = Path(tmp)
        for spec in specs:
            if budget.allows(f"{spec.key}: all of it"):
                res = results["models"][spec.key] = {}
                try:
                    bench_model(spec, s, args, budget, Path(tmp), res)
                except Exception as e:  # NOTE: one run on a lent GPU: the other models and the report go on
                    traceback.print_exc()
                    res["error"] = f"{type(e).__name__}: {e}"[-2000:]
                    free_device()
        results["elapsed_s"] = budget.elapsed()
        results["skipped"] = budget.skipped
        out_dir = args.out_dir or (OUT_DIR if on_cuda else Path(tmp) / "report")
        cuda_report.write_report(results, out_dir)
        print((out_dir / "cuda.md").read_text())
    return 0


@contextlib.contextmanager
def _restored_threads() -> Iterator[None]:
    """torch's thread count as it was (a CPU engine here runs on one thread: `cpu_threads` sets torch's)."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _versions() -> dict[str, str]:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    with contextlib.suppress(ImportError):
        import triton

        out["triton"] = triton.__version__
    return out


if __name__ == "__main__":
    sys.exit(main())
