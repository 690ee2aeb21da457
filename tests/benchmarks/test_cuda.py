"""benchmarks/cuda.py runs on a GPU (make test-gpu); here a tiny CPU run proves the script and its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny_models import make_servable_model

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "cuda.py"


def test_a_tiny_cpu_run_writes_both_reports(tmp_path: Path) -> None:
    model = make_servable_model(tmp_path / "model", num_hidden_layers=2)  # the script's logic, not a model's speed
    args = [
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--num-requests",
        "2",
        "--max-new-tokens",
        "3",
        "--model",
        str(model),
    ]
    args += ["--hf-sequential", "1", "--hf-batched", "2", "--batch1-tokens", "3", "--out-dir", str(tmp_path)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, timeout=300)
    figures = json.loads((tmp_path / "cuda.json").read_text())["dtypes"]["float32"]
    for key in ("tok_s", "batch1_decode_tok_s", "hf_sequential_tok_s", "hf_padded16_tok_s"):
        assert figures[key] > 0, key
    [row] = [line for line in (tmp_path / "cuda.md").read_text().splitlines() if line.startswith("| float32 |")]
    assert row.count("×") == 2  # infer against each transformers baseline
