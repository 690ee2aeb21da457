"""Loader errors name the problem: missing files, wrong shapes, missing tensors, unknown models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from infer.engine.loader import ModelLoadError, load_model
from tests.helpers.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="model directory not found"):
        load_model(tmp_path / "nope")


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"missing file: .*config\.json"):
        load_model(tmp_path)


def test_missing_weights(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        load_model(d)


def test_wrong_shape_is_named(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.down_proj\.weight.*shape \(3, 3\)"):
        load_model(d)


def test_missing_tensor_is_named(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"weights missing from checkpoint: layers\.0\.self_attn\.qkv_proj"):
        load_model(d)


def test_unknown_model_type(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(ModelLoadError, match="unsupported model_type 'mamba'"):
        load_model(d)


def test_sharded_checkpoint_with_index(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, d / file)
    weight_map = {n: f for f, part in shards.items() for n in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = load_model(d)
    assert torch.equal(model.norm.weight, tensors["model.norm.weight"])
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing weight files: model-00002-of-00002"):
        load_model(d)
