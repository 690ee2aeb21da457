"""A whole tiny model with INFER_KERNELS=triton (interpreter, or CUDA) gives the torch path's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine.config import EngineConfig
from infer.engine.cuda_graphs import EagerGraphs
from infer.engine.loader import load_model
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.device import TEST_DEVICE
from tests.helpers.dispatch import Allocations
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


def test_a_padded_decode_step_makes_no_tensor_and_waits_for_nothing(tmp_path: Path) -> None:
    """What a CUDA graph captures: a decode step of a captured size on the Triton kernels reads its inputs where
    they were, makes no tensor from the host and never waits for a value on the host (EagerGraphs runs the
    same step as the graph would)."""
    model_dir = make_tiny_model("gemma3", tmp_path, vocab_size=64)  # sliding windows, soft-capping, embed scale
    model = load_model(model_dir, EngineConfig(device=str(TEST_DEVICE), kernels="triton"))
    runner = ModelRunner(model, num_blocks=16, block_size=4, max_num_seqs=4, max_model_len=32)
    runner.use_graphs(EagerGraphs([4]))
    runner.execute([SeqWork([3, 4, 5, 6, 7], 0, [0, 1], True), SeqWork([8, 9], 0, [2], True)])
    work = [SeqWork([10], 5, [0, 1], True), SeqWork([11], 2, [2], True)]
    prepared = runner.prepare(work, pad_to=4)
    assert runner.graphs is not None
    with torch.inference_mode(), Allocations() as counted:
        runner.graphs.run(4, prepared.step)
    assert counted.made == [] and counted.waited == [], (counted.made, counted.waited)
