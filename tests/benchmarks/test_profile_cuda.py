"""benchmarks/profile_cuda.py runs on a GPU, by hand (make bench-gpu measures the host's share of a step itself); here a
tiny CPU run proves the script and its report, in make test-slow (7 s: make test is at its 10 minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "profile_cuda.py"


@pytest.mark.slow
def test_a_tiny_cpu_run_writes_both_reports(tmp_path: Path) -> None:
    args = ["--device", "cpu", "--dtype", "float32", "--batch", "1", "2", "--num-layers", "2", "--new-tokens", "3"]
    subprocess.run([sys.executable, str(SCRIPT), *args, "--out-dir", str(tmp_path)], check=True, timeout=300)
    rows = json.loads((tmp_path / "profile-cuda.json").read_text())["rows"]
    assert [(r["dtype"], r["batch"]) for r in rows] == [("float32", 1), ("float32", 2)]
    assert all(r["wall_ms_per_step"] > 0 and r["tok_s"] > 0 for r in rows)
    assert all(r["kernels_per_step"] == 0 for r in rows)  # no CUDA kernels on the CPU
    table = [line for line in (tmp_path / "profile-cuda.md").read_text().splitlines() if line.startswith("| float32 |")]
    assert len(table) == 2
