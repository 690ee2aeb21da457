"""The compiled backend's fused decoder stack: the per-op path's logits, bit for bit, in one call a step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from infer.engine.config import EngineConfig
from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from infer.kernels import (
    PackedWeight,
    SuperScales,
    pack_int4,
    pack_int4_super,
    pack_int5,
    pack_int5_super,
    pack_int6,
    pack_int8g,
    pack_int8g_super,
)
from infer.kernels.int4 import quantize_int4
from infer.kernels.int8g import quantize_int8g
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.mixed_steps import greedy_mixed_steps
from tests.helpers.tiny_models import ARCHS, make_tiny_model


def per_op(model: CausalLM) -> CausalLM:
    """The model with its layers run op by op from now on (its fused stack dropped)."""
    model.fused = None
    return model


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_logits_equal_the_per_op_path_bit_for_bit(arch: str, quantization: str, tmp_path: Path) -> None:
    require_compiled_kernels()
    model = load_model(make_tiny_model(arch, tmp_path / arch), EngineConfig(quantization=quantization), "cpu")
    assert model.fused is not None  # Llama, Qwen3's q/k norms, Gemma 3's sandwich norms and windows: all fused
    # prefill chunks, decode tokens beside a prefill chunk, then decode only
    tokens, logits = greedy_mixed_steps(model)
    expected_tokens, expected_logits = greedy_mixed_steps(per_op(model))  # NOTE: after the fused run
    assert tokens == expected_tokens
    assert torch.equal(logits, expected_logits)


def _int4_fp32(w: torch.Tensor) -> PackedWeight:
    """int4 with scales that fp16 cannot hold (as K-quants' d * sc)."""
    q = quantize_int4(w)
    n, k = w.shape
    d, m = q.scales()
    return pack_int4(q.codes()[:n, :k], d[:n] * (1 + 2**-14), m[:n], torch.float32)


def _int8g_with_min(w: torch.Tensor, group: int) -> PackedWeight:
    """Asymmetric 8-bit groups (as Q5_1, Q5_K): w = d * q + m, fp32 scales."""
    n, k = w.shape
    wg = w.float().view(n, k // group, group)
    lo, hi = wg.amin(dim=2), wg.amax(dim=2)
    d = ((hi - lo) / 255).clamp(min=1e-8)
    m = lo + 128 * d
    q = torch.round((wg - m[..., None]) / d[..., None]).clamp(-128, 127).to(torch.int8).view(n, k)
    return pack_int8g(q, d, m, group, torch.float32)


def _int5(w: torch.Tensor) -> PackedWeight:
    """Asymmetric 5-bit groups of 32 (as Q5_1, or Q5_0 with codes + 16), fp16 scales."""
    n, k = w.shape
    wg = w.float().view(n, k // 32, 32)
    m = wg.amin(dim=2).half().float()
    d = ((wg.amax(dim=2) - m) / 31).clamp(min=1e-4).half().float()
    q = torch.round((wg - m[..., None]) / d[..., None]).clamp(0, 31).to(torch.uint8).view(n, k)
    return pack_int5(q, d, m, torch.float16)


# one format a projection, rotated layer by layer: each projection meets each format
MIXED = (
    lambda w: quantize_int8g(w, 32),  # symmetric, fp16 scales (Q8_0)
    _int4_fp32,
    _int5,
    lambda w: _int8g_with_min(w, 32),
    lambda w: _int8g_with_min(w, 16),  # groups of 16 (Q2_K)
    lambda w: quantize_int8g(w, 16),
)


def _two_level(w: torch.Tensor, group: int, has_min: bool, codes: tuple[int, int], int6: bool = False) -> PackedWeight:
    """w rounded as a K-quant is (codes in lo..hi, a 6-bit scale and minimum per group against fp16 ones per 256
    inputs) and packed with those scales (Q6_K's in int6 where `int6`, else in 8-bit groups); a weight whose
    in_features are no multiple of 256 gets the same products in fp32, as the GGUF loader falls back."""
    n, k = w.shape
    lo, hi = codes
    wg = w.float().view(n, k // group, group)
    d = (wg.amax(dim=2) - wg.amin(dim=2)) / (hi - lo) if has_min else wg.abs().amax(dim=2) / hi
    per = 256 // group
    if k % 256 != 0:  # the fallback: fp32 scales, no two levels
        m = wg.amin(dim=2) - lo * d if has_min else None
        q = torch.round((wg - (0 if m is None else m[..., None])) / d[..., None]).clamp(lo, hi)
        return _pack(q.view(n, k), d, m, group)
    d_super = (d.view(n, -1, per).amax(dim=2) / 63).clamp(min=2**-14).half().float()
    d_sub = torch.round(d / d_super.repeat_interleave(per, dim=1)).clamp(1, 63).to(torch.int8)
    m_sub = m_super = None
    d_q = d_super.repeat_interleave(per, dim=1) * d_sub.float()
    m_q = torch.zeros_like(d_q)
    if has_min:
        m = wg.amin(dim=2) - lo * d_q
        m_super = (m.abs().view(n, -1, per).amax(dim=2) / 63).clamp(min=2**-14).half().float()
        m_sub = torch.round(m / m_super.repeat_interleave(per, dim=1)).clamp(-63, 63).to(torch.int8)
        m_q = m_super.repeat_interleave(per, dim=1) * m_sub.float()
    q = torch.round((wg - m_q[..., None]) / d_q[..., None]).clamp(lo, hi).view(n, k)
    scales = SuperScales(d_sub, d_super, m_sub, m_super)
    if hi == 15:
        return pack_int4_super(q.to(torch.uint8), scales)
    if (lo, hi) == (0, 31) and has_min:
        return pack_int5_super(q.to(torch.uint8), scales)
    if int6:  # Q6_K's codes - 32..31 as int6 holds them: + 32
        return pack_int6((q + 32).to(torch.uint8), scales)
    return pack_int8g_super(q.to(torch.int8), scales, group)


def _pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, group: int) -> PackedWeight:
    if m is not None and group == 32 and int(q.min()) >= 0 and int(q.max()) <= 31:
        return (pack_int4 if int(q.max()) <= 15 else pack_int5)(q.to(torch.uint8), d, m, torch.float32)
    return pack_int8g(q.to(torch.int8), d, m, group, torch.float32)


# K-quants' two-level forms, rotated as MIXED: Q4_K (int4), Q6_K (8-bit groups, as beside other types), Q5_K
# (int5), Q2_K, Q3_K (8-bit), Q6_K alone (int6)
TWO_LEVEL = (
    lambda w: _two_level(w, 32, True, (0, 15)),
    lambda w: _two_level(w, 16, False, (-32, 31)),
    lambda w: _two_level(w, 32, True, (0, 31)),
    lambda w: _two_level(w, 16, True, (0, 3)),
    lambda w: _two_level(w, 16, False, (-4, 3)),
    lambda w: _two_level(w, 16, False, (-32, 31), int6=True),
)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_logits_equal_the_per_op_path_with_two_level_scales(arch: str, tmp_path: Path) -> None:
    require_compiled_kernels()
    model_dir = make_tiny_model(arch, tmp_path / arch, hidden_size=256, intermediate_size=512)
    model = load_model(model_dir, EngineConfig(quantization="none"), "cpu")
    num_two_level = 0
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for j, linear in enumerate((attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            assert isinstance(linear.weight, torch.Tensor)
            packed = TWO_LEVEL[(i + j) % len(TWO_LEVEL)](linear.weight.detach())
            num_two_level += getattr(packed, "scale_dtype", None) == torch.int8
            linear.use_packed(packed)
    assert num_two_level >= 3 * len(model.layers)  # all but o_proj where heads * head_dim is not 256
    assert model.fuse().fused is not None
    tokens, logits = greedy_mixed_steps(model)
    expected_tokens, expected_logits = greedy_mixed_steps(per_op(model))
    assert tokens == expected_tokens
    assert torch.equal(logits, expected_logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_logits_equal_the_per_op_path_with_every_packed_format_mixed(arch: str, tmp_path: Path) -> None:
    require_compiled_kernels()
    model = load_model(make_tiny_model(arch, tmp_path / arch), EngineConfig(quantization="none"), "cpu")
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for j, linear in enumerate((attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            assert isinstance(linear.weight, torch.Tensor)
            linear.use_packed(MIXED[(i + j) % len(MIXED)](linear.weight.detach()))
    assert model.fuse().fused is not None
    tokens, logits = greedy_mixed_steps(model)
    expected_tokens, expected_logits = greedy_mixed_steps(per_op(model))
    assert tokens == expected_tokens
    assert torch.equal(logits, expected_logits)


def test_the_default_model_decodes_a_batch_with_the_per_op_logits(default_model_dir: Path) -> None:
    require_compiled_kernels()
    model = load_model(default_model_dir, EngineConfig(max_model_len=256), "cpu")
    assert model.fused is not None
    prompts = [list(range(100 + i, 140 + 3 * i)) for i in range(3)]  # 40, 43, 46 tokens

    def run(m: CausalLM) -> torch.Tensor:
        runner = ModelRunner(m, num_blocks=16, block_size=16)
        tables = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        runner.execute([SeqWork(p, 0, t, True) for p, t in zip(prompts, tables, strict=True)])
        # decode: one token each (a batch of 3); then 5 rows, two of them a chunk
        decode = runner.execute([SeqWork([7], len(p), t, True) for p, t in zip(prompts, tables, strict=True)])
        mixed = runner.execute(
            [SeqWork([8], len(prompts[0]) + 1, tables[0], True), SeqWork([9, 10, 11, 12], len(prompts[1]) + 1,
             tables[1], True)]
        )  # fmt: skip
        return torch.cat([decode, mixed])

    fused = run(model)
    assert torch.equal(fused, run(per_op(model)))


def test_backends_without_a_stack_and_models_it_does_not_take_run_op_by_op(tmp_path: Path) -> None:
    require_compiled_kernels()
    model_dir = make_tiny_model("llama", tmp_path / "llama")
    assert load_model(model_dir, kernels="torch").fused is None  # the reference has no fused stack
    assert load_model(model_dir, EngineConfig(dtype="bfloat16"), "cpu").fused is None  # fp32 only
    model = load_model(model_dir, kernels="cpu")
    assert model.fused is not None
    down = model.layers[1].mlp.down_proj
    del down.weight  # NOTE: as Linear.quantize does: a packed weight is no parameter
    down.weight = object()  # a packed format the stack does not know
    assert model.fuse().fused is None


def test_the_stack_lets_other_python_threads_run(tmp_path: Path) -> None:
    require_compiled_kernels()
    model = load_model(make_tiny_model("llama", tmp_path / "llama", hidden_size=512, intermediate_size=2048,
                                       num_hidden_layers=8), kernels="cpu")  # fmt: skip
    assert model.fused is not None
    runner = ModelRunner(model, num_blocks=64, block_size=16)
    ticks = 0
    done = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        step = runner.prepare([SeqWork(list(range(3, 120)) * 2, 0, list(range(16)), True)]).step
        x = torch.randn(step.input_ids.shape[0], 512)
        with torch.inference_mode():
            before = ticks
            model.fused(x, step.positions, step.attn, step.kv_caches)
            during = ticks - before
    finally:
        done.set()
        ticker.join()
    assert during > 0  # NOTE: the GIL is released for the whole stack, as for any torch op
