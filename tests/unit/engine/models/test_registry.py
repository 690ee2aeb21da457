"""The registry of model families: each found by its config.json `model_type` and its GGUF `general.architecture`,
the unknown ones refused by name; and the shared code (the layers, the kernels' fused stack and its C++) asking
for traits, never for a family by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import infer.engine.models.layers
import infer.kernels.fused
from infer.engine.models.registry import (
    ARCHITECTURES,
    SUPPORTED_GGUF_NAMES,
    SUPPORTED_MODEL_TYPES,
    architecture,
    gguf_architecture,
    parse_model_config,
)
from infer.kernels.cpu import CSRC_DIR

# the decoder every family runs on: no family's name may decide anything in it
SHARED = {
    "engine/models/layers.py": Path(infer.engine.models.layers.__file__),
    "kernels/fused.py": Path(infer.kernels.fused.__file__),
    "kernels/csrc/decoder_stack.cpp": CSRC_DIR / "decoder_stack.cpp",
}
# how the families are written in prose, beside their model_type and GGUF names
FAMILY_WORDS = ("llama", "qwen", "gemma", "phi", "mistral", "smollm")


def test_every_family_is_found_by_its_names() -> None:
    for arch in ARCHITECTURES:
        assert all(architecture(t) is arch for t in arch.model_types)
        assert gguf_architecture(arch.gguf_name) is arch
    assert len(SUPPORTED_MODEL_TYPES) == sum(len(a.model_types) for a in ARCHITECTURES)  # no name twice
    assert len(SUPPORTED_GGUF_NAMES) == len(ARCHITECTURES)
    assert {"llama", "qwen2", "qwen3", "gemma3_text", "phi3"} <= set(SUPPORTED_MODEL_TYPES)


def test_an_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unsupported model_type 'mamba' in config.json \(supported: llama, "):
        architecture("mamba")
    with pytest.raises(ValueError, match="unsupported model_type None"):
        parse_model_config({"vocab_size": 10})
    assert gguf_architecture("mamba") is None
    assert gguf_architecture(3) is None


def test_a_config_is_read_by_its_own_family() -> None:
    base = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    traits = {
        t: parse_model_config({**base, "model_type": t, "sliding_window": 8, "head_dim": 16})
        for t in ("llama", "qwen2", "qwen3", "gemma3_text", "phi3")
    }
    assert [t for t, c in traits.items() if c.attention_bias] == ["qwen2"]
    assert [t for t, c in traits.items() if c.qk_norm] == ["qwen3", "gemma3_text"]
    assert [t for t, c in traits.items() if c.sandwich_norm] == ["gemma3_text"]
    assert [t for t, c in traits.items() if set(c.sliding_windows) == {8}] == ["phi3"]  # Gemma 3: a sixth global
    assert all(c.model_type == t for t, c in traits.items())


def _family_names() -> set[str]:
    names = {n for a in ARCHITECTURES for n in (*a.model_types, a.gguf_name)}
    return {n.split("_")[0] for n in names} | set(FAMILY_WORDS)


@pytest.mark.parametrize("path", SHARED)
def test_the_shared_decoder_names_no_family(path: str) -> None:
    """The layers and the fused stack read traits (`ModelConfig`, `DecoderShape`, `LayerWeights`); a family's
    name there (in code or in a comment that says which family a branch is for) is a family's rule leaking in."""
    text = SHARED[path].read_text(encoding="utf-8").lower()
    found = sorted({n for n in _family_names() if re.search(rf"\b{re.escape(n)}(\b|\d)", text)})
    assert found == [], f"{path} names {found}: make it a trait of ModelConfig, set by the family's module"
