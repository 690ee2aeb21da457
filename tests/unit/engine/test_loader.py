"""Loading: errors name the problem (missing files, wrong shapes, missing tensors, unknown models); config.json is
read once; the model runs on the kernel backend chosen when it was loaded."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from infer.engine import loader
from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.loader import ModelLoadError, load_model
from infer.engine.model_config import ModelConfig
from infer.engine.models import Linear
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.tiny_gguf import write_tiny_gguf
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


def test_max_model_len_beyond_the_model_is_refused_before_the_weights_are_read(llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(llama_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"max_model_len: must be <= the model's max_position_embeddings \(256\)"):
        load_model(d, EngineConfig(max_model_len=257))


def test_the_model_runs_on_the_backend_chosen_at_load(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", "torch")
    model = load_model(llama_dir)
    assert model.kernels.name == "torch" and model.kernels.dtype == torch.float32
    assert all(m.kernels is model.kernels for m in model.modules() if isinstance(m, Linear))
    monkeypatch.setenv("INFER_KERNELS", "nonsense")  # read when the model loads, never again
    logits = ModelRunner(model, num_blocks=4, block_size=4).execute([SeqWork([5, 6, 7], 0, [2], True)])
    assert logits.shape == (1, 128)


def test_the_configs_kernels_choose_the_backend_over_the_environment(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFER_KERNELS", "nonsense")  # the environment is only the default
    assert load_model(llama_dir, EngineConfig(kernels="torch")).kernels.name == "torch"
    monkeypatch.setenv("INFER_KERNELS", "torch")
    assert load_model(llama_dir, EngineConfig()).kernels.name == "torch"
    with pytest.raises(ValueError, match="kernels: must be one of auto, torch, cpu, triton"):
        EngineConfig(kernels="cuda")


def test_a_backend_that_cannot_run_is_refused_naming_the_setting_that_chose_it(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EngineConfig.kernels (`--kernels`) is `kernels=` in the error; INFER_KERNELS read by the kernels is itself."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    with pytest.raises(RuntimeError, match=r"^kernels=triton runs on CUDA, or on cpu under TRITON_INTERPRET=1$"):
        load_model(llama_dir, EngineConfig(kernels="triton"))
    monkeypatch.setenv("INFER_KERNELS", "triton")
    with pytest.raises(RuntimeError, match=r"^INFER_KERNELS=triton runs on CUDA, or on cpu under TRITON_INTERPRET=1$"):
        load_model(llama_dir, EngineConfig())


def test_an_engine_reads_config_json_once_and_reports_its_kernels(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = []
    real = loader.parse_model_config

    def counted(raw: dict[str, Any]) -> ModelConfig:
        parsed.append(raw["model_type"])
        return real(raw)

    monkeypatch.setattr(loader, "parse_model_config", counted)
    read: list[str] = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda path, *a, **k: read.append(path.name) or read_text(path, *a, **k))
    monkeypatch.setenv("INFER_KERNELS", "torch")
    core = EngineCore.from_config(EngineConfig(model=str(default_model_dir), max_model_len=256, num_blocks=32))
    assert parsed == ["llama"]
    assert read.count("config.json") == 1  # the tokenizer takes its eos ids from the parsed model config
    assert read.count("generation_config.json") == 1  # the loader's parse holds its eos ids too
    assert core.model_info.kernels == "torch" and core.config.max_model_len == 256


def test_eos_ids_of_config_and_generation_config_both_count(llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(llama_dir, tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert loader.load_model_config(model_dir).eos_token_ids == (7, 5)


@pytest.mark.parametrize("was_enabled", [True, False])
def test_a_load_runs_without_the_cyclic_collector_and_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, was_enabled: bool
) -> None:
    """A load makes millions of objects and no cyclic garbage (Gemma 3's vocabulary and merges): the collector's
    passes over everything alive then were a quarter of its tokenizer's time."""
    model = write_tiny_gguf(tmp_path / "m.gguf", "gemma3", num_layers=1)
    seen: dict[str, bool] = {}
    for name in ("load_gguf_model", "gguf_tokenizer", "ModelRunner"):
        real = getattr(loader, name)

        def recording(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            seen[_name] = gc.isenabled()
            return _real(*args, **kwargs)

        monkeypatch.setattr(loader, name, recording)
    (gc.enable if was_enabled else gc.disable)()
    try:
        loader.load_engine(EngineConfig(model=str(model), max_model_len=64, num_blocks=8))
        assert gc.isenabled() == was_enabled
    finally:
        gc.enable()
    assert seen == {"load_gguf_model": False, "gguf_tokenizer": False, "ModelRunner": False}
