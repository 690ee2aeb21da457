"""Lower precision at load time (int8, int4, bf16 weights and KV): which weights change, how close the model stays."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from infer.engine.config import EngineConfig
from infer.engine.llm import LLM
from infer.engine.loader import load_model
from infer.engine.runner import ModelRunner, SeqWork
from infer.engine.sampling_params import SamplingParams
from infer.kernels import Int4Weight, Int8Weight
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.tiny_models import ARCHS, VOCAB, make_tiny_model


def _logits(model_dir: Path, quantization: str = "none", dtype: str = "float32") -> torch.Tensor:
    model = load_model(model_dir, EngineConfig(dtype=dtype, quantization=quantization))
    runner = ModelRunner(model, num_blocks=8, block_size=4)
    ids = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        step = runner.prepare([SeqWork(ids, 0, [5, 1, 6], True)]).step
        return model.compute_logits(model(step)).float()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("quantization", "dtype"), [("int8", "float32"), ("none", "bfloat16")])
def test_lower_precision_stays_close_to_fp32(arch: str, quantization: str, dtype: str, tmp_path: Path) -> None:
    model_dir = make_tiny_model(arch, tmp_path / arch)
    exact, lower = _logits(model_dir), _logits(model_dir, quantization, dtype)
    assert float((lower - exact).norm() / exact.norm()) < 0.05
    assert float((lower.argmax(-1) == exact.argmax(-1)).float().mean()) >= 0.75


@pytest.mark.parametrize("arch", ARCHS)
def test_int4_stays_close_to_fp32(arch: str, tmp_path: Path) -> None:
    model_dir = make_tiny_model(arch, tmp_path / arch)
    exact, lower = _logits(model_dir), _logits(model_dir, "int4")
    # NOTE: the tiny models' weights are random, not trained: int4 moves their logits 17-19% (int8: 1.4-1.6%)
    assert float((lower - exact).norm() / exact.norm()) < 0.3
    assert float((lower.argmax(-1) == exact.argmax(-1)).float().mean()) >= 0.75


def _greedy_chat(
    model_dir: Path, kernels: str, quantization: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], str]:
    monkeypatch.setenv("INFER_KERNELS", kernels)
    llm = LLM(str(model_dir), quantization=quantization)
    ids = llm.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}], True)
    out = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0.0))[0]
    return out.token_ids, out.text


def test_int4_compiled_greedy_on_the_default_model_answers_like_the_reference_backend(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: the first compiled kernel (int8 inputs per group of 32) answered "L'Étoile, la Marseillaise, ..."
    require_compiled_kernels()
    fp32, _ = _greedy_chat(default_model_dir, "cpu", "none", monkeypatch)
    reference, _ = _greedy_chat(default_model_dir, "torch", "int4", monkeypatch)
    compiled, text = _greedy_chat(default_model_dir, "cpu", "int4", monkeypatch)
    pairs = zip(compiled, fp32, strict=False)
    agree = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(compiled), len(fp32)))
    print(f"int4 compiled: {text!r}, {agree} of {len(fp32)} tokens before the first difference with fp32")
    assert "Paris" in text
    assert compiled == reference


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: a tied LM head
@pytest.mark.parametrize(("method", "packed"), [("int8", Int8Weight), ("int4", Int4Weight)])
def test_quantization_replaces_the_projections_and_lm_head_only(
    arch: str, method: str, packed: type, tmp_path: Path
) -> None:
    model = load_model(make_tiny_model(arch, tmp_path / arch), EngineConfig(quantization=method))
    layer = model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(linear.weight, packed)
    assert isinstance(model.lm_head.weight, Int8Weight)  # int4 too: the LM head stays int8, as in llama.cpp's Q4_1
    assert isinstance(model.embed_tokens, nn.Parameter) and model.embed_tokens.dtype == torch.float32
    assert not any(p.dim() == 2 and p is not model.embed_tokens for p in model.parameters())


def test_unknown_quantization_is_refused() -> None:
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="fp8")
