"""`make bench-offline` is not a test, but its script must keep running: a short run of it, infer's side only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "offline.py"


def test_a_short_run_writes_both_reports(default_model_dir: Path, tmp_path: Path) -> None:
    args = ["--num-requests", "3", "--max-new-tokens", "4", "--batch1-tokens", "4", "--batch1-rounds", "1"]
    # NOTE: llama-server exists only where `make peers` built it; one lower precision keeps the loop run (each is
    # a model load)
    skips = ["--skip-hf", "--skip-llama", "--skip-matrix", "--skip-reference", "--precisions", "int8"]
    subprocess.run([sys.executable, str(SCRIPT), *args, *skips, "--out-dir", str(tmp_path)], check=True)
    results = json.loads((tmp_path / "offline.json").read_text())
    for key in ("ours_tok_s", "batch1_decode_tok_s", "bandwidth_ceiling_tok_s"):
        assert results[key] > 0, key
    assert results["num_requests"] == 3 and results["new_tokens"] == "64–256 capped at 4"
    report = (tmp_path / "offline.md").read_text()
    assert "| infer `LLM.generate` (continuous batching) |" in report
    assert not any(line.startswith("| transformers") for line in report.splitlines())  # --skip-hf
    assert "128 prompt + 4 new, the best of 1 rounds" in report
    assert set(results["precisions"]) == {"int8"}  # --precisions
    assert results["precisions"]["int8"]["tok_s"] > 0 and results["precisions"]["int8"]["batch1_decode_tok_s"] > 0
    assert "| infer `LLM.generate`, int8 weights |" in report


@pytest.mark.slow  # minutes on 2 shared cores: two LLMs, four loads each, 700-token grounded prompts
def test_a_short_peer_comparison_measures_every_load_of_every_variant(default_model_dir: Path, tmp_path: Path) -> None:
    args = ["--num-requests", "2", "--max-new-tokens", "4", "--batch1-tokens", "4", "--batch1-rounds", "1",
            "--skip-hf", "--skip-reference", "--skip-precisions", "--skip-llama", "--matrix-rounds", "1",
            "--matrix-batch1", "1", "--matrix-concurrent", "2", "--matrix-precisions", "fp32,int8"]  # fmt: skip
    subprocess.run([sys.executable, str(SCRIPT), *args, "--out-dir", str(tmp_path)], check=True)
    matrix = json.loads((tmp_path / "offline.json").read_text())["matrix"]
    (figures,) = matrix["rounds"]
    assert {"fp32", "int8"} <= set(figures) and "llama" not in figures  # --skip-llama
    for system in figures.values():
        assert set(system) == {"grounded/batch1", "grounded/c16", "random/batch1", "random/c16"}
        assert all(f["output_tok_s"] > 0 for f in system.values())
        assert system["grounded/batch1"]["decode_tok_s"] > 0 and system["random/batch1"]["ttft_p50_s"] > 0
    report = (tmp_path / "offline.md").read_text()
    assert "## infer against llama-server: every precision, two workloads" in report
    assert "| speculation on / off, batch-1 output tok/s, grounded (offline) | ≥ 1.8× |" in report
    assert "| int8 | " in report
