"""benchmarks/cuda.py runs on a GPU (make test-gpu); here a tiny CPU run proves the script and its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "cuda.py"


def test_a_tiny_cpu_run_writes_both_reports(default_model_dir: Path, tmp_path: Path) -> None:
    args = ["--device", "cpu", "--dtype", "float32", "--num-requests", "2", "--max-new-tokens", "3"]
    args += ["--hf-sequential", "1", "--hf-batched", "2", "--batch1-tokens", "3", "--out-dir", str(tmp_path)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, timeout=300)
    figures = json.loads((tmp_path / "cuda.json").read_text())["dtypes"]["float32"]
    for key in ("tok_s", "batch1_decode_tok_s", "hf_sequential_tok_s", "hf_padded16_tok_s"):
        assert figures[key] > 0, key
    [row] = [line for line in (tmp_path / "cuda.md").read_text().splitlines() if line.startswith("| float32 |")]
    assert row.count("×") == 2  # infer against each transformers baseline
