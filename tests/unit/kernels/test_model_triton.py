"""A whole tiny model with INFER_KERNELS=triton (interpreter, or CUDA) gives the torch path's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine.config import EngineConfig
from infer.engine.loader import load_model
from tests.helpers.device import TEST_DEVICE
from tests.helpers.mixed_steps import greedy_mixed_steps
from tests.helpers.tiny_models import ARCHS, make_tiny_model

pytestmark = pytest.mark.triton

from infer.kernels import attention_triton  # noqa: E402
from infer.kernels.attention_triton import paged_attention_triton  # noqa: E402


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_the_torch_path(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, config = make_tiny_model(arch, tmp_path / arch), EngineConfig(device=str(TEST_DEVICE))
    monkeypatch.setenv("INFER_KERNELS", "torch")
    expected_tokens, expected_logits = greedy_mixed_steps(load_model(model_dir, config))
    launches = []

    def counted(*args: Any) -> torch.Tensor:
        launches.append(1)
        out: torch.Tensor = paged_attention_triton(*args)
        return out

    monkeypatch.setattr(attention_triton, "paged_attention_triton", counted)
    monkeypatch.setenv("INFER_KERNELS", "triton")
    model = load_model(model_dir, config)
    assert model.kernels.name == "triton"
    tokens, logits = greedy_mixed_steps(model)
    assert len(launches) == 4 * model.cfg.num_layers  # the Triton kernel ran, every step, every layer
    assert tokens == expected_tokens and [len(t) for t in tokens] == [4, 3]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
