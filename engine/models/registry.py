"""Every model family we serve, found by a config.json's `model_type` or a GGUF file's `general.architecture`.

Adding a family: its module beside this one (an `Architecture` subclass) and one entry in `ARCHITECTURES`.
"""

from __future__ import annotations

from typing import Any

from infer.engine.model_check import check_config
from infer.engine.model_config import ModelConfig
from infer.engine.models.architecture import Architecture
from infer.engine.models.gemma3 import Gemma3
from infer.engine.models.llama import Llama
from infer.engine.models.phi3 import Phi3
from infer.engine.models.qwen2 import Qwen2
from infer.engine.models.qwen3 import Qwen3

ARCHITECTURES: tuple[Architecture, ...] = (Llama(), Qwen2(), Qwen3(), Gemma3(), Phi3())
_BY_MODEL_TYPE = {model_type: arch for arch in ARCHITECTURES for model_type in arch.model_types}
_BY_GGUF_NAME = {arch.gguf_name: arch for arch in ARCHITECTURES}
SUPPORTED_MODEL_TYPES = tuple(_BY_MODEL_TYPE)
SUPPORTED_GGUF_NAMES = tuple(_BY_GGUF_NAME)


def architecture(model_type: object) -> Architecture:
    """The family of a config.json's `model_type` (a `ModelConfig.model_type` too); ValueError naming the ones
    we serve."""
    arch = _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ValueError(f"unsupported model_type {model_type!r} in config.json (supported: {supported})")
    return arch


def gguf_architecture(name: object) -> Architecture | None:
    """The family of a GGUF file's `general.architecture`; None for one we do not serve."""
    return _BY_GGUF_NAME.get(name) if isinstance(name, str) else None


def parse_model_config(cfg: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from a parsed `config.json`; ValueError for what we cannot serve (`ModelCheckError`,
    naming the field, for sizes past their bounds or a config that contradicts itself: `model_check.py`)."""
    arch = architecture(cfg.get("model_type"))
    try:
        parsed = arch.config(arch.text_config(cfg))
    except KeyError as e:
        raise ValueError(f"config.json is missing required field {e.args[0]!r}") from None
    except (TypeError, ArithmeticError) as e:  # a value of the wrong kind (a list, null, a negative query scale)
        raise ValueError(f"config.json holds a value that cannot be used: {e}") from None
    check_config(parsed)
    return parsed
