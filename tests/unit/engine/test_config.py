"""EngineConfig's value types (engine/config.py): what a quantization method does to each layer."""

from __future__ import annotations

import pytest

from infer.engine.config import Quantization


@pytest.mark.parametrize(
    ("method", "layers", "lm_head"), [("none", "none", "none"), ("int8", "int8", "int8"), ("int4", "int4", "int8")]
)
def test_an_int4_model_keeps_an_int8_lm_head(method: str, layers: str, lm_head: str) -> None:
    # as llama.cpp's Q4_1 files keep their output tensor Q8_0 (an int4 head: +5% perplexity on SmolLM2-135M)
    assert Quantization.of(method) == Quantization(layers, lm_head)
