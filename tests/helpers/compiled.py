"""Tests of the compiled CPU kernels: skip only where no C++ compiler exists (CI builds them)."""

from __future__ import annotations

import os
import shutil

import pytest

from infer.kernels import cpu


def require_compiled_kernels() -> None:
    """Load the compiled kernels; skip without a compiler, fail when a compiler exists but they are not built."""
    if cpu.load():
        return
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the compiled CPU kernels cannot be built here")
    pytest.fail(f"compiled CPU kernels not built at {cpu.library_path()}: run `make setup`")
