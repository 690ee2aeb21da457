"""benchmarks/kernels.py cannot time anything here (no CUDA); its --smoke mode proves it still runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.helpers.device import ON_CUDA

# under make test-gpu the kernels are compiled, not interpreted, and the benchmark itself runs on the GPU
pytestmark = [pytest.mark.triton, pytest.mark.skipif(ON_CUDA, reason="make test-gpu runs the full benchmark")]

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "kernels.py"


def test_benchmark_smoke_run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("benchmark_kernels", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 8  # three attention batches, five elementwise kernels
    assert all(float(row.split()[-4]) < 1e-4 for row in rows)  # max |diff| per kernel
