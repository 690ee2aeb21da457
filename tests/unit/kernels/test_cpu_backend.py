"""Choosing the compiled CPU kernels or the references: forced fallback, a missing build, INFER_KERNELS=cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infer import kernels
from infer.kernels import AttentionSpec, cpu, set_kernel_backend
from infer.kernels.attention import paged_attention_ref
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.paged_batches import Shape, make_batch

SPEC = AttentionSpec(scale=0.125)


def _refuse(*args: object, **kwargs: object) -> torch.Tensor:
    raise AssertionError("the compiled kernel ran")


def test_forced_fallback_runs_the_reference(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    monkeypatch.setenv("INFER_KERNELS", "torch")
    set_kernel_backend(None)
    monkeypatch.setattr(cpu, "paged_attention", _refuse)
    batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
    *args, kc, vc = batch.args()
    out = kernels.paged_attention(*args, kc, vc, batch.meta, SPEC)
    assert torch.equal(out, paged_attention_ref(*batch.args(), batch.meta, SPEC))


def test_auto_runs_the_compiled_kernel_on_cpu_tensors(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    require_compiled_kernels()
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    set_kernel_backend(None)
    calls = []
    compiled = cpu.paged_attention
    monkeypatch.setattr(cpu, "paged_attention", lambda *a: calls.append(1) or compiled(*a))
    batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
    kernels.paged_attention(*batch.args(), batch.meta, SPEC)
    assert calls == [1]


_WITHOUT_BUILD = """
import logging, torch
logging.basicConfig(level=logging.WARNING)
from infer import kernels
from infer.kernels.attention import paged_attention_ref
from tests.helpers.paged_batches import make_batch, Shape
spec = kernels.AttentionSpec(scale=0.125)
batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
for _ in range(2):
    out = kernels.paged_attention(*batch.args(), batch.meta, spec)
    assert torch.equal(out, paged_attention_ref(*batch.args(), batch.meta, spec))
print("reference ran")
"""


def test_a_missing_build_falls_back_and_says_so_once(tmp_path: Path) -> None:
    env = {**os.environ, "INFER_KERNEL_CACHE": str(tmp_path), "INFER_KERNELS": "auto"}
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", _WITHOUT_BUILD], env=env, cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "reference ran"
    assert run.stderr.count("compiled CPU kernels not built") == 1


def test_infer_kernels_cpu_without_a_build_is_an_error(tmp_path: Path) -> None:
    env = {**os.environ, "INFER_KERNEL_CACHE": str(tmp_path), "INFER_KERNELS": "cpu"}
    code = "from infer.kernels import kernel_backend; kernel_backend()"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "INFER_KERNELS=cpu but the compiled CPU kernels are not built" in run.stderr
