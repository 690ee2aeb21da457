"""A GGUF file's model config, checked before a layer is built; every failure a `GGUFConfigError` naming the key.

`checked_config(meta, tensors)`, in order:
1. the hyperparameters llama.cpp reads (`<arch>.block_count`, `.embedding_length`, ...): whole numbers or finite
   floats in bounds, not strings, lists or infinities;
2. the vocabulary against the embedding: no more tokens (`tokenizer.ggml.tokens`) than `token_embd.weight` has
   rows (a prompt could name an id the model has no row for), and every special id (`tokenizer.ggml.*_token_id`)
   one of the tokens;
3. the config those give (`config.py`), checked with the directory's rules (`model_check.py`: heads, RoPE, sizes)
   and against the tensors' shapes: `<arch>.block_count` layers, no more and no fewer, each the size the keys say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from infer.engine.gguf.config import GGUFConfigError, architecture, hf_config
from infer.engine.gguf.weights import FileTensor, GGUFWeightError, hf_name
from infer.engine.model_check import check_tensors
from infer.engine.model_config import SIZE_BOUNDS, ModelCheckError, ModelConfig
from infer.engine.models.registry import architecture as family
from infer.engine.models.registry import parse_model_config

# `<arch>.` keys that are whole numbers -> the bound of each (`model_config.SIZE_BOUNDS`: checked here too, before
# `config.py` builds a list per layer)
WHOLE_KEYS = {
    "block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim", "attention.value_length": "head_dim",
    "attention.sliding_window": "sliding_window", "attention.sliding_window_pattern": "num_hidden_layers",
}  # fmt: skip
FLOAT_KEYS = (
    "rope.freq_base", "rope.freq_base_swa", "rope.scaling.factor", "attention.layer_norm_rms_epsilon",
    "attn_logit_softcapping", "final_logit_softcapping",
)  # fmt: skip
# `model_check`'s field names -> the key of the file each comes from (`<arch>.` before those without a dot)
_KEYS = {
    "vocab_size": "token_embd.weight", "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length", "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length", "query_pre_attn_scalar": "attention.key_length",
    "max_position_embeddings": "context_length", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base", "rope_scaling.factor": "rope.scaling.factor",
    "sliding_window": "attention.sliding_window", "layer_types": "attention.sliding_window_pattern",
    "attn_logit_softcapping": "attn_logit_softcapping", "final_logit_softcapping": "final_logit_softcapping",
    "eos_token_id": "tokenizer.ggml.eos_token_id", "bos_token_id": "tokenizer.ggml.bos_token_id",
}  # fmt: skip


def file_key(arch: str, field: str) -> str:
    """The file's key for a `model_check` field (`num_hidden_layers` -> `llama.block_count`)."""
    key = _KEYS.get(field, field)
    return key if key.startswith(("tokenizer.", "token_embd.")) else f"{arch}.{key}"


def checked_config(meta: Mapping[str, Any], tensors: Sequence[FileTensor]) -> ModelConfig:
    """The model config of a GGUF file whose metadata is `meta` and tensors `tensors` (see the module doc)."""
    for key in ("general.architecture", "tokenizer.ggml.model"):
        if not isinstance(meta.get(key, ""), str):
            raise GGUFConfigError(f"{key}: {_shown(meta[key])} is not a name")
    arch = architecture(meta)
    _check_kinds(meta, arch)
    embedding = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embedding is None or len(embedding.shape) != 2:
        raise GGUFConfigError("token_embd.weight: missing, or not a [rows, hidden] table")
    _check_vocab(meta, embedding.shape[0])
    has_output = any(t.name == "output.weight" for t in tensors)
    try:
        cfg = parse_model_config(hf_config(meta, embedding.shape[0], has_output))
        shapes = family(cfg.model_type).layer_shapes(cfg)
        check_tensors(cfg, [(_checkpoint_name(arch, t.name), t.name, t.shape) for t in tensors], shapes)
    except ModelCheckError as e:
        raise GGUFConfigError(f"{file_key(arch, e.field)}: {e.detail}") from None
    except (TypeError, ValueError, ArithmeticError) as e:
        if isinstance(e, GGUFConfigError):
            raise
        raise GGUFConfigError(str(e)) from None
    return cfg


def _checkpoint_name(arch: str, name: str) -> str:
    try:
        return hf_name(arch, name)
    except GGUFWeightError:  # NOTE: the weight loader refuses it; it sizes nothing
        return name


def _check_kinds(meta: Mapping[str, Any], arch: str) -> None:
    for name, field in WHOLE_KEYS.items():
        key, value, bound = f"{arch}.{name}", meta.get(f"{arch}.{name}"), SIZE_BOUNDS[field]
        if name.endswith("_pattern") and isinstance(value, list):  # NOTE: a flag per layer: config.py counts them
            continue
        if value is not None and (type(value) is not int or not 1 <= value <= bound):
            raise GGUFConfigError(f"{key}: {_shown(value)} is not a whole number in 1..{bound}")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling is not None and not isinstance(scaling, str):
        raise GGUFConfigError(f"{arch}.rope.scaling.type: {_shown(scaling)} is not a name")
    for key in (f"{arch}.{k}" for k in FLOAT_KEYS):
        value = meta.get(key)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value) or value < 0):
            raise GGUFConfigError(f"{key}: {_shown(value)} is not a finite number >= 0")


def _check_vocab(meta: Mapping[str, Any], rows: int) -> None:
    tokens = meta.get("tokenizer.ggml.tokens")
    num_tokens = len(tokens) if isinstance(tokens, list) else rows
    if num_tokens > rows:
        raise GGUFConfigError(f"tokenizer.ggml.tokens: {num_tokens} tokens, but token_embd.weight has only {rows} rows")
    for key in (k for k in meta if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")):  # bos, eos, fim_*
        value = meta[key]
        if value is not None and (type(value) is not int or not 0 <= value < num_tokens):
            raise GGUFConfigError(f"{key}: {_shown(value)} is not one of the {num_tokens} token ids")


def _shown(value: Any) -> str:
    """A value for a message, never a whole vocabulary."""
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
