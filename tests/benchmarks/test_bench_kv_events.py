"""`make bench-kv-events` is not a test, but its script must keep running: a tiny run on a tiny random model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny_models import make_servable_model

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "kv_events.py"


def test_a_tiny_run_writes_both_reports(tmp_path: Path) -> None:
    model = make_servable_model(tmp_path / "tiny-llama", num_hidden_layers=1)
    args = ["--model", str(model), "--rounds", "2", "--requests", "6", "--concurrency", "3", "--max-tokens", "4"]
    args += ["--document-tokens", "32", "--question-tokens", "8", "--num-blocks", "40", "--out-dir", str(tmp_path)]
    subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "kv-events.json").read_text())
    assert len(result["rounds"]) == 2 and result["ratio"] > 0
    for row in result["rounds"]:
        assert row["on"]["steps"] == row["off"]["steps"] > 0  # the same work both ways
        assert row["on"]["batches_published"] > 1 and row["on"]["events_dropped"] == 0
        assert row["off"]["batches_published"] == 0
    assert "**Median on / off:" in (tmp_path / "kv-events.md").read_text()
