"""Choosing the compiled CPU kernels or the references: forced fallback, a missing build, INFER_KERNELS=cpu."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer.kernels import AttentionSpec, cpu, select_kernels
from infer.kernels.attention import paged_attention_ref
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.paged_batches import Shape, make_batch

SPEC = AttentionSpec(scale=0.125)


def _refuse(*args: object, **kwargs: object) -> torch.Tensor:
    raise AssertionError("the compiled kernel ran")


def test_forced_fallback_runs_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", "torch")
    kernels = select_kernels("cpu", torch.float32)
    monkeypatch.setattr(cpu, "paged_attention", _refuse)
    batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
    *args, kc, vc = batch.args()
    out = kernels.paged_attention(*args, kc, vc, batch.meta, SPEC)
    assert torch.equal(out, paged_attention_ref(*batch.args(), batch.meta, SPEC))


def test_auto_runs_the_compiled_kernel_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    require_compiled_kernels()
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    kernels = select_kernels("cpu", torch.float32)
    assert kernels.name == "cpu"
    calls = []
    compiled = cpu.paged_attention
    monkeypatch.setattr(cpu, "paged_attention", lambda *a: calls.append(1) or compiled(*a))
    batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
    kernels.paged_attention(*batch.args(), batch.meta, SPEC)
    assert calls == [1]


_WITHOUT_BUILD = """
import logging, torch
logging.basicConfig(level=logging.WARNING)
from infer.kernels import AttentionSpec, select_kernels
from infer.kernels.attention import paged_attention_ref
from tests.helpers.paged_batches import make_batch, Shape
spec = AttentionSpec(scale=0.125)
batch = make_batch([1, 6], [20, 6], Shape(4, 2, 64))
for _ in range(2):
    kernels = select_kernels("cpu", torch.float32)
    out = kernels.paged_attention(*batch.args(), batch.meta, spec)
    assert torch.equal(out, paged_attention_ref(*batch.args(), batch.meta, spec))
print("reference ran", kernels.name)
"""


def test_a_missing_build_falls_back_and_says_so_once(tmp_path: Path) -> None:
    env = {**os.environ, "INFER_KERNEL_CACHE": str(tmp_path), "INFER_KERNELS": "auto"}
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", _WITHOUT_BUILD], env=env, cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "reference ran torch"
    assert run.stderr.count("compiled CPU kernels not built") == 1


def test_infer_kernels_cpu_without_a_build_is_an_error(tmp_path: Path) -> None:
    env = {**os.environ, "INFER_KERNEL_CACHE": str(tmp_path), "INFER_KERNELS": "cpu"}
    code = "import torch; from infer.kernels import select_kernels; select_kernels('cpu', torch.float32)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "INFER_KERNELS=cpu but the compiled CPU kernels are not built" in run.stderr


@pytest.fixture
def fresh_load(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`cpu.load` and the tags recomputed in this test, and again after it (the real build loads back)."""

    def clear() -> None:
        for cached in (cpu.load, cpu.build_tag, cpu.level_tag):
            cached.cache_clear()

    clear()
    yield
    monkeypatch.undo()
    clear()


def test_missing_sources_fall_back_without_raising(
    monkeypatch: pytest.MonkeyPatch, fresh_load: None, caplog: pytest.LogCaptureFixture
) -> None:
    # an install without the C++ sources (they were not package data): the references, never an exception
    monkeypatch.setattr(cpu, "CSRC_DIR", Path("/nonexistent/infer/kernels/csrc"))
    with caplog.at_level("WARNING", logger="infer.kernels.cpu"):
        assert cpu.load() is False
    assert "compiled CPU kernels unavailable" in caplog.text and "PyTorch references run" in caplog.text


def test_a_library_that_does_not_load_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_load: None, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("INFER_KERNEL_CACHE", str(tmp_path))
    broken = cpu.library_path()
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a shared library")
    with caplog.at_level("WARNING", logger="infer.kernels.cpu"):
        assert cpu.load() is False
    assert f"compiled CPU kernels at {broken} did not load" in caplog.text


_V3_FLAGS = frozenset({"sse2", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_V4_FLAGS = _V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("flags", "levels"),
    [
        (frozenset({"sse2"}), []),
        (_V3_FLAGS, ["x86-64-v3"]),
        (_V4_FLAGS, ["x86-64-v4", "x86-64-v3"]),
        (_V4_FLAGS | {"avx512_bf16"}, ["x86-64-v4-bf16", "x86-64-v4", "x86-64-v3"]),
    ],
)
def test_a_cpu_loads_its_native_build_first_then_the_best_level_it_supports(
    monkeypatch: pytest.MonkeyPatch, fresh_load: None, flags: frozenset[str], levels: list[str]
) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    native, *portable = cpu.candidates()
    assert native == cpu.library_path()
    assert [p.parent.name.split("-", 1)[1] for p in portable] == levels


def test_portable_builds_are_named_by_level_not_by_this_cpu(monkeypatch: pytest.MonkeyPatch, fresh_load: None) -> None:
    level = cpu.LEVELS[0]
    before = cpu.library_path(level), cpu.library_path()
    cpu.build_tag.cache_clear()
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"sse2"}))
    assert cpu.library_path(level) == before[0]  # the same build on any CPU
    assert cpu.library_path() != before[1]  # a native build belongs to one CPU


_COMPILED_KERNEL_TESTS = [
    f"tests/unit/kernels/test_{name}_cpu.py" for name in ("attention", "int8", "int4", "linear", "norm")
]


@pytest.mark.slow
def test_every_portable_level_builds_and_agrees_with_the_references(tmp_path: Path) -> None:
    """`cpu_build --portable` (what the image runs) builds every level; each level this CPU can run passes the
    compiled-kernel tests alone in its cache (its plain loops where it lacks AVX-512), so a CPU of that level
    gets correct kernels. Minutes: run by `make test-slow`."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    root = Path(__file__).resolve().parents[3]
    built = tmp_path / "all"
    build = [sys.executable, "-m", "infer.kernels.cpu_build", "--portable", "--strict"]
    subprocess.run(build, env={**os.environ, "INFER_KERNEL_CACHE": str(built)}, cwd=root, check=True, timeout=1800)
    libraries = {p.parent.name.split("-", 1)[1]: p for p in built.glob("*/infer_cpu.so")}
    assert sorted(libraries) == sorted(level.name for level in cpu.portable_levels())
    for level in cpu.portable_levels():
        if not level.required_flags <= cpu.cpu_flags():
            continue
        alone = tmp_path / level.name / libraries[level.name].parent.name
        alone.mkdir(parents=True)
        shutil.copy(libraries[level.name], alone)
        env = {**os.environ, "INFER_KERNEL_CACHE": str(tmp_path / level.name), "INFER_KERNELS": "cpu"}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_COMPILED_KERNEL_TESTS],
            env=env, cwd=root, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert run.returncode == 0, f"{level.name}:\n{run.stdout[-4000:]}"
