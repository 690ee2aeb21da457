"""`make bench-structured` is not a test, but its script must keep running: a short run of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "structured.py"


@pytest.mark.slow  # a minute on 2 shared cores: 16 requests a run, three runs
def test_a_short_run_writes_both_reports(default_model_dir: Path, tmp_path: Path) -> None:
    args = ["--rounds", "1", "--max-tokens", "6", "--mask-steps", "2", "--out-dir", str(tmp_path)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True)
    results = json.loads((tmp_path / "structured.json").read_text())
    summary = results["summary"]
    assert summary["constrained_tok_s"] > 0 and summary["unconstrained_tok_s"] > 0 and summary["ratio"] > 0
    assert summary["num_outputs"] == 16 and results["max_tokens"] == 6
    assert set(results["compile"]["schemas"]) == {"nested", "array", "enum", "bounds", "optional"}
    assert results["compile"]["start_ms"] > 0 and results["mask"]["fill_us"] > 0
    report = (tmp_path / "structured.md").read_text()
    assert "| constrained (JSON schema) |" in report and "| nested |" in report
