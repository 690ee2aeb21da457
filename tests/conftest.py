"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infer.engine import default_model
from infer.engine.gguf import merge_cache
from tests.helpers.device import cuda_missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test-gpu` on a machine without CUDA: every test is skipped, with the reason."""
    if cuda_missing():
        skip = pytest.mark.skip(reason="INFER_TEST_DEVICE=cuda but torch sees no CUDA device")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model's HF directory in the real user cache: converted on the first run, reused after."""
    return default_model.default_model_dir()


@pytest.fixture(scope="session", autouse=True)
def merges_cached_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tokenizer merges the tests rebuild (random vocabularies) go to a folder of this run, not the user's
    cache (servers started as subprocesses still use theirs)."""
    folder = tmp_path_factory.mktemp("tokenizers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(merge_cache, "cache_dir", lambda: folder)
        yield
