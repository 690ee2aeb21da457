"""benchmarks/cuda_models.py: the real shapes' configs, random weights written as a model directory infer loads
tensor for tensor (across shards), transformers over the same tensors, and the bytes a decode step reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import cuda_models

from infer.engine.config import EngineConfig
from infer.engine.loader import load_model, load_model_config
from infer.engine.model_config import ModelConfig


def _parsed(config: dict[str, Any], tmp_path: Path) -> ModelConfig:
    """What infer reads of this config.json."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_model_config(tmp_path)


def test_each_shape_is_its_published_config(tmp_path: Path) -> None:
    qwen, llama8 = cuda_models.SHAPES["qwen2.5-1.5b"], cuda_models.SHAPES["llama-3.1-8b"]
    cfg = _parsed(cuda_models.config_json(qwen), tmp_path)
    dims = (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size)
    assert dims == (1536, 28, 12, 2, 151936)
    assert cfg.attention_bias and cfg.tie_word_embeddings  # Qwen2: q/k/v biases, one table for embedding and head
    cfg = _parsed(cuda_models.config_json(llama8), tmp_path)
    assert (cfg.intermediate_size, cfg.head_dim, cfg.tie_word_embeddings) == (14336, 128, False)
    assert cfg.ropes[0].rope_type == "llama3" and cfg.ropes[0].factor == 8.0
    tiny = _parsed(cuda_models.config_json(llama8, tiny=True), tmp_path)
    assert tiny.ropes[0].rope_type == "llama3" and not tiny.tie_word_embeddings and tiny.hidden_size == 64
    assert cuda_models.config_json(llama8, num_layers=3)["num_hidden_layers"] == 3


@pytest.mark.parametrize("key", ["qwen2.5-1.5b", "llama-3.1-8b"])  # tied with biases; untied
def test_infer_loads_the_written_directory_tensor_for_tensor(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_models, "SHARD_BYTES", 40_000)  # several shards and their index
    config = cuda_models.config_json(cuda_models.SHAPES[key], tiny=True)
    weights = cuda_models.random_weights(config, "cpu")
    model_dir = cuda_models.write_model_dir(tmp_path / key, config, weights)
    assert len(list(model_dir.glob("model-*.safetensors"))) > 2
    model = load_model(model_dir, EngineConfig(dtype="bfloat16", max_model_len=32, kernels="torch"))
    assert torch.equal(model.embed_tokens, weights["model.embed_tokens.weight"])
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    assert torch.equal(model.lm_head.weight, head)  # the last shard's
    assert torch.equal(model.layers[1].mlp.down_proj.weight, weights["model.layers.1.mlp.down_proj.weight"])


def test_decode_bytes_count_a_tied_table_once_and_an_untied_one_as_the_head_only() -> None:
    for key, tied in (("smollm2-135m", True), ("llama-3.1-8b", False)):
        config = cuda_models.config_json(cuda_models.SHAPES[key], tiny=True)
        weights = cuda_models.random_weights(config, "cpu")
        every = sum(t.numel() * 2 for t in weights.values())
        table = weights["model.embed_tokens.weight"].numel() * 2
        assert cuda_models.decode_bytes(config, weights) == (every if tied else every - table)
        assert ("lm_head.weight" in weights) is not tied


def test_transformers_runs_on_the_same_tensors() -> None:
    config = cuda_models.config_json(cuda_models.SHAPES["qwen2.5-1.5b"], tiny=True)
    weights = cuda_models.random_weights(config, "cpu")
    model = cuda_models.hf_model(config, weights)
    assert model.model.embed_tokens.weight.data_ptr() == weights["model.embed_tokens.weight"].data_ptr()
    assert model.lm_head.weight.data_ptr() == weights["model.embed_tokens.weight"].data_ptr()  # tied
    q = model.model.layers[0].self_attn.q_proj
    assert q.bias is not None and torch.equal(q.bias, weights["model.layers.0.self_attn.q_proj.bias"])
