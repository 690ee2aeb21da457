"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer.engine import default_model


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model's HF directory in the real user cache: converted on the first run, reused after."""
    return default_model.default_model_dir()
