"""benchmarks/cuda.py runs on a GPU (make bench-gpu); here its dry run (`--device cpu --tiny`) proves the script
and its report: every goal row of issue 39 present, every figure the CPU can give finite."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _script() -> ModuleType:
    # NOTE: loaded under another name: `cuda` is also the top-level package of NVIDIA's cuda-python
    spec = importlib.util.spec_from_file_location("bench_cuda", BENCH / "cuda.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_cuda"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


TINY = ["--device", "cpu", "--tiny", "--max-num-seqs", "2", "--new-tokens", "2", "--batch1-tokens", "2",
        "--server-tokens", "2", "--hf-requests", "2", "--prompt-tokens", "4", "--max-model-len", "32"]  # fmt: skip
GOALS = ("host share of a batch-1 decode step", "batch-1 decode, smollm2", "concurrent through the server, smollm2",
         "share of the HBM bandwidth limit", "against transformers' padded batches of 16",
         "greedy tokens and logprobs")  # fmt: skip


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def test_the_dry_run_of_the_goal_models_writes_every_goal_row(tmp_path: Path) -> None:
    cuda = _script()
    args = [*TINY, "--models", "smollm2-135m", "qwen2.5-1.5b", "--concurrency", "2", "2", "--no-server"]
    assert cuda.main([*args, "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "cuda.json").read_text())
    assert [g["name"] for g in results["goals"]] == [next(g["name"] for g in results["goals"] if w in g["name"])
                                                     for w in GOALS]  # fmt: skip
    measured = {g["name"]: g for g in results["goals"]}
    for name, g in measured.items():  # on the CPU: no kernels to time, no server asked for; the rest measured
        if "host share" in name or "server" in name:
            assert g["passed"] is None and g["shown"].startswith("not measured: "), name
        else:
            assert g["passed"] is not None and math.isfinite(g["value"]), name
    for key in ("smollm2-135m", "qwen2.5-1.5b"):
        model = results["models"][key]
        assert model["parity"]["identical"]  # the CPU ignores cuda_graphs: the same engine twice
        assert model["decode_bytes"] > 0 and _finite(model["hf"]["batch1_decode_tok_s"])
        for engine in ("graphs_on", "graphs_off"):
            figures = model["engines"][engine]
            assert sorted(figures["sizes"]) == ["1", "2"]  # the capture sizes up to max_num_seqs
            assert all(_finite(f["tok_s"]) for f in figures["sizes"].values())
            assert _finite(figures["batch1_decode_tok_s"])
            assert figures["host"]["1"]["host_share"] is None  # the profiler ran; the CPU has no CUDA kernels
    assert _finite(results["models"]["qwen2.5-1.5b"]["hf"]["padded16_tok_s"])
    report = (tmp_path / "cuda.md").read_text()
    assert report.count("| smollm2-135m (bf16)") + report.count("| batch-1 decode, smollm2") >= 1
    assert all(any(w in line for line in report.splitlines() if line.startswith("| ")) for w in GOALS)


def test_a_model_that_fails_keeps_its_figures_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _script()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("server exited with 1; log x:\nTraceback ...")

    engine = cuda.bench_engine

    def eager_only(key: str, model: str, vocab: int, graphs: bool, *rest: object) -> object:
        if graphs and key == "llama-3.2-1b":
            raise RuntimeError("capture failed")
        return engine(key, model, vocab, graphs, *rest)

    monkeypatch.setattr(cuda, "bench_server", broken)
    monkeypatch.setattr(cuda, "bench_engine", eager_only)
    args = [*TINY, "--max-num-seqs", "1", "--models", "smollm2-135m", "llama-3.2-1b", "--concurrency", "2", "2"]
    assert cuda.main([*args, "--out-dir", str(tmp_path)]) == 0
    models = json.loads((tmp_path / "cuda.json").read_text())["models"]
    assert models["smollm2-135m"]["error"].startswith("RuntimeError: server exited with 1")
    assert _finite(models["smollm2-135m"]["engines"]["graphs_off"]["batch1_decode_tok_s"])  # measured before it
    llama = models["llama-3.2-1b"]  # its graphs failed: the eager engine and transformers measured, no parity
    assert "error" not in llama and "parity" not in llama and _finite(llama["hf"]["batch1_decode_tok_s"])
    assert _finite(llama["engines"]["graphs_off"]["batch1_decode_tok_s"])
    report = (tmp_path / "cuda.md").read_text()
    assert "- `smollm2-135m: RuntimeError: server exited with 1; log x:`" in report
    assert "- `llama-3.2-1b, graphs_on: RuntimeError: capture failed`" in report


@pytest.mark.slow  # every shape, with `infer serve` started for the two goal models (~30 s on 2 cores)
def test_the_whole_dry_run_serves_and_measures_every_shape(tmp_path: Path) -> None:
    cuda = _script()
    assert cuda.main([*TINY, "--concurrency", "2", "2", "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "cuda.json").read_text())
    assert list(results["models"]) == ["smollm2-135m", "qwen2.5-1.5b", "llama-3.2-1b", "llama-3.1-8b"]
    assert all(m["parity"]["identical"] for m in results["models"].values())
    for key in ("smollm2-135m", "qwen2.5-1.5b"):
        server = results["models"][key]["server"]
        assert _finite(server["1"]["output_tok_s"]) and _finite(server["2"]["output_tok_s"])
    served = [g for g in results["goals"] if "server" in g["name"]]
    assert all(g["passed"] is not None for g in served)
    assert not results["skipped"]


def test_parity_is_identical_only_with_the_same_tokens_and_bit_equal_logprobs() -> None:
    cuda = _script()
    on = [{"tokens": [5, 6], "logprobs": [-0.5, -1.25]}, {"tokens": [7], "logprobs": [-2.0]}]
    assert cuda.compare_parity(on, [dict(o) for o in on])["identical"]
    other_token = [on[0], {"tokens": [8], "logprobs": [-2.0]}]
    assert cuda.compare_parity(on, other_token) == {"tokens_equal": False, "max_logprob_diff": 0.0,
                                                    "identical": False}  # fmt: skip
    nudged = [{"tokens": [5, 6], "logprobs": [-0.5, -1.25 - 2**-20]}, on[1]]
    assert cuda.compare_parity(on, nudged) == {"tokens_equal": True, "max_logprob_diff": 2**-20, "identical": False}


def test_the_sweep_covers_every_capture_size() -> None:
    assert _script().capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_host_share_is_the_decode_steps_kernel_time_against_their_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _script()
    profiled = iter([(0.0325, 10 + 31 * 300), (0.0015, 10)])  # the 32-token run, then the 1-token one
    monkeypatch.setattr(cuda, "gpu_kernel_s", lambda run, device: next(profiled))
    share = cuda.host_share(None, [[1]], 32, 0.004, "cuda")  # 1 ms of kernels in a 4 ms step
    assert share["host_share"] == pytest.approx(0.75) and share["kernels_per_step"] == 300
    blind = iter([(0.0015, 10), (0.0015, 10)])  # graph replays the profiler does not see: no decode kernels
    monkeypatch.setattr(cuda, "gpu_kernel_s", lambda run, device: next(blind))
    assert cuda.host_share(None, [[1]], 32, 0.004, "cuda")["host_share"] is None
