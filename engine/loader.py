"""Load a Hugging Face model directory: config, safetensors weights (one file or sharded)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from infer.engine.model_config import ModelConfig, parse_model_config
from infer.engine.models import CausalLM
from infer.engine.models.quantize import quantize_model
from infer.engine.models.weights import Target, checkpoint_to_params, convert_tensor
from infer.kernels.cpu import cpu_flags

logger = logging.getLogger(__name__)


def cpu_has_bf16_dot() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), so bf16 weights pay off."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


class ModelLoadError(ValueError):
    """A model directory we cannot load; the message names the file or tensor."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"missing file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data


def load_model_config(model_dir: Path) -> ModelConfig:
    cfg = read_json(model_dir / "config.json")
    generation = model_dir / "generation_config.json"
    if generation.is_file() and read_json(generation).get("eos_token_id") is not None:
        cfg["eos_token_id"] = read_json(generation)["eos_token_id"]
    try:
        return parse_model_config(cfg)
    except ValueError as e:
        raise ModelLoadError(f"{model_dir / 'config.json'}: {e}") from None


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise ModelLoadError(f"{index.name} lists missing weight files: {', '.join(missing)}")
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    return files


def _copy_into(param: torch.Tensor, target: Target, tensor: torch.Tensor, name: str) -> None:
    dest = param if target.num_rows is None else param.narrow(0, target.row_start, target.num_rows)
    if tuple(dest.shape) != tuple(tensor.shape):
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)} for this config"
        )
    dest.copy_(tensor)


def _load_weights(model: CausalLM, files: list[Path]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    rows_loaded: dict[str, int] = dict.fromkeys(params, 0)
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = checkpoint_to_params(model.cfg, name)
                if target is False:
                    continue
                if target is None or target is True or target.param not in params:
                    arch = model.cfg.model_type
                    raise ModelLoadError(f"unexpected tensor {name!r} in {path.name} for {arch}")
                tensor = convert_tensor(model.cfg, target, f.get_tensor(name))
                _copy_into(params[target.param], target, tensor, name)
                rows_loaded[target.param] += target.num_rows or params[target.param].shape[0]
    if model.cfg.tie_word_embeddings:
        rows_loaded["lm_head"] = rows_loaded["embed_tokens"]
    missing = [n for n, p in params.items() if rows_loaded[n] != p.shape[0]]
    if missing:
        raise ModelLoadError(f"weights missing from checkpoint: {', '.join(sorted(missing)[:5])}")


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_positions: int | None = None,
    quantization: str = "none",
) -> CausalLM:
    """Build the model a directory describes and fill it from its safetensors files (then quantize it)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory not found: {model_dir}")
    cfg = load_model_config(model_dir)
    files = weight_files(model_dir)
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not cpu_has_bf16_dot():
        logger.warning("this CPU has no bf16 dot products (avx512_bf16/amx_bf16): bf16 runs slower than fp32")
    with torch.device("cpu"):
        model = CausalLM(cfg, max_positions=max_positions)
    _load_weights(model, files)
    return quantize_model(model.to_device(torch.device(device), dtype).eval(), quantization)
