"""Whole tiny models with INFER_KERNELS=cpu give the reference path's greedy tokens and logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine.loader import load_model
from infer.kernels import cpu
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.mixed_steps import greedy_mixed_steps
from tests.helpers.tiny_models import ARCHS, make_tiny_model


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_the_reference_path(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_compiled_kernels()
    model_dir = make_tiny_model(arch, tmp_path / arch)
    expected_tokens, expected_logits = greedy_mixed_steps(load_model(model_dir, kernels="torch"))
    calls = []
    compiled = cpu.paged_attention

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return compiled(*args)

    monkeypatch.setattr(cpu, "paged_attention", counted)
    model = load_model(model_dir, kernels="cpu")
    model.fused = None  # the per-op path (tests/unit/kernels/test_fused.py: the fused stack gives its logits)
    tokens, logits = greedy_mixed_steps(model)
    assert len(calls) == 4 * model.cfg.num_layers  # the compiled kernel ran, every step, every layer
    assert tokens == expected_tokens and [len(t) for t in tokens] == [4, 3]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
