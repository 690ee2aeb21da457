"""A model directory's config checked once at load: against itself (heads, RoPE, sizes, special ids), against
the weight files' shapes before a layer is built, and against its tokenizer; each refusal names the field."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from infer.engine.config import EngineConfig
from infer.engine.loader import ModelLoadError, load_engine, load_model
from infer.engine.model_check import check_tensors
from infer.engine.model_config import ModelCheckError
from infer.engine.models.registry import parse_model_config

LLAMA: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
GEMMA: dict[str, Any] = {**LLAMA, "model_type": "gemma3_text", "sliding_window": 8, "head_dim": 16}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": 4_000_000_000}, "num_hidden_layers"),
        ({"vocab_size": 1 << 40}, "vocab_size"),
        ({"hidden_size": -64}, "hidden_size"),
        ({"num_attention_heads": "4"}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_attention_heads": 3}, "num_attention_heads"),  # 64 / 3: no head size
        ({"head_dim": 15}, "head_dim"),
        ({"rope_theta": 0.0}, "rope_theta"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}},
         "rope_scaling.high_freq_factor"),
        ({"rms_norm_eps": float("inf")}, "rms_norm_eps"),
        ({"eos_token_id": 100}, "eos_token_id"),
        ({"bos_token_id": -1}, "bos_token_id"),
    ],
)  # fmt: skip
def test_a_config_that_contradicts_itself_names_the_field(change: dict[str, Any], field: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ModelCheckError, match=f"^{field}: ") as err:
        parse_model_config({**LLAMA, **change})
    assert err.value.field == field and time.perf_counter() - start < 0.1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"query_pre_attn_scalar": -16}, "query_pre_attn_scalar|cannot be used"),
        ({"sliding_window": 0}, "sliding_window"),
    ],
)
def test_gemma_scales_and_windows_are_checked(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_model_config({**GEMMA, **change})


def _shapes(layers: int, hidden: int = 64) -> list[tuple[str, str, tuple[int, ...]]]:
    names = {"self_attn.q_proj.weight": (64, hidden), "self_attn.k_proj.weight": (32, hidden),
             "mlp.down_proj.weight": (hidden, 128)}  # fmt: skip
    out = [("model.embed_tokens.weight", "model.embed_tokens.weight", (100, hidden))]
    for i in range(layers):
        out += [(f"model.layers.{i}.{n}", f"model.layers.{i}.{n}", s) for n, s in names.items()]
    return out


def test_tensors_are_checked_against_the_config() -> None:
    cfg = parse_model_config(LLAMA)
    check_tensors(cfg, _shapes(2))
    with pytest.raises(ModelCheckError, match=r"num_hidden_layers: 2 layers, but the file has tensor 'model.layers.2"):
        check_tensors(cfg, _shapes(3))
    with pytest.raises(ModelCheckError, match="num_hidden_layers: 2 layers, but the file has no tensor of layer 1"):
        check_tensors(cfg, _shapes(1))
    with pytest.raises(ModelCheckError, match=r"hidden_size: tensor 'model.embed_tokens.weight' has shape"):
        check_tensors(cfg, _shapes(2, hidden=32))


TOKENS = 320  # the tokenizer's ids: 256 bytes, one special, merges


def _directory(d: Path, vocab_size: int) -> Path:
    """A one-layer Llama of `vocab_size` rows (random weights, written here: no transformers) with a tokenizer
    of `TOKENS` ids."""
    import torch
    from safetensors.torch import save_file

    from tests.helpers.tiny_tokenizer import train_byte_bpe

    d.mkdir(parents=True)
    cfg = {**LLAMA, "vocab_size": vocab_size, "num_hidden_layers": 1, "eos_token_id": 0}
    (d / "config.json").write_text(json.dumps(cfg))
    shapes = {"model.embed_tokens.weight": (vocab_size, 64), "model.norm.weight": (64,),
              "lm_head.weight": (vocab_size, 64)}  # fmt: skip
    layer = {"self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (32, 64),
             "self_attn.v_proj.weight": (32, 64), "self_attn.o_proj.weight": (64, 64),
             "mlp.gate_proj.weight": (128, 64), "mlp.up_proj.weight": (128, 64), "mlp.down_proj.weight": (64, 128),
             "input_layernorm.weight": (64,), "post_attention_layernorm.weight": (64,)}  # fmt: skip
    shapes.update({f"model.layers.0.{name}": shape for name, shape in layer.items()})
    save_file({name: torch.randn(shape) * 0.1 for name, shape in shapes.items()}, str(d / "model.safetensors"))
    train_byte_bpe(TOKENS, ["<|im_end|>"]).save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _directory(tmp_path_factory.mktemp("dir") / "m", TOKENS)


def _edited(model: Path, tmp_path: Path, **changes: Any) -> Path:
    d = Path(shutil.copytree(model, tmp_path / "m"))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))
    return d


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_hidden_layers": 1000}, "num_hidden_layers: 1000 layers, but the file has no tensor of layer 1"),
        ({"vocab_size": 1 << 23}, r"vocab_size: tensor '(model.embed_tokens|lm_head).weight' has shape"),
        ({"intermediate_size": 1 << 19}, "intermediate_size: tensor 'model.layers.0.mlp"),
    ],
)
def test_a_directory_whose_config_lies_is_refused_before_a_layer_is_built(
    model_dir: Path, tmp_path: Path, change: dict[str, Any], match: str
) -> None:
    d = _edited(model_dir, tmp_path, **change)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=match):
        load_model(d)
    assert time.perf_counter() - start < 1.0


def test_a_directory_that_fits_loads(model_dir: Path) -> None:
    _, _, tokenizer, info = load_engine(EngineConfig(model=str(model_dir), num_blocks=8))
    assert info.vocab_size == tokenizer.vocab_size == TOKENS


def test_a_tokenizer_larger_than_the_embedding_is_refused_at_load(tmp_path: Path) -> None:
    d = _directory(tmp_path / "small", TOKENS - 64)
    with pytest.raises(
        ModelLoadError, match=f"tokenizer.json: vocab_size: the tokenizer has {TOKENS} ids, .* {TOKENS - 64} rows"
    ):
        load_engine(EngineConfig(model=str(d), num_blocks=8))


def test_a_vision_towers_layers_are_not_the_text_models(model_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    d = Path(shutil.copytree(model_dir, tmp_path / "m"))
    save_file({"vision_tower.encoder.layers.5.mlp.fc1.weight": torch.zeros(4, 4)}, str(d / "vision.safetensors"))
    _, _, _, info = load_engine(EngineConfig(model=str(d), num_blocks=8))  # multimodal Gemma 3 checkpoints hold these
    assert info.vocab_size == TOKENS
