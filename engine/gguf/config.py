"""A GGUF file's hyperparameters as a `ModelConfig`: the `<arch>.*` metadata keys, read as llama.cpp reads them.

The metadata is turned into the fields of a Hugging Face `config.json` and parsed by the same code as one, so a
GGUF file and the directory transformers would convert it to give the same `ModelConfig`. Facts that llama.cpp
keeps in code rather than in the file are filled in as it does: Gemma 3's sliding-window pattern (every sixth
layer global), its local RoPE base (10,000) and its query scale (1/sqrt(head_dim)).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.model_config import ModelConfig, parse_model_config

# llama.cpp's architecture name -> our model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
GEMMA3_SLIDING_PATTERN = 6  # llama.cpp: every sixth Gemma 3 layer attends globally
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# end-of-generation: the ids the file names, and tokens by their text (as llama.cpp's llama-vocab.cpp finds them)
EOG_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id", "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id")
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})  # fmt: skip
FIM_EOG_TEXTS = frozenset({  # a code model's padding, repository and file separators
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
})  # fmt: skip


class GGUFConfigError(ValueError):
    """The metadata does not describe a model we serve; the message names the field."""


def short_float(value: float) -> float:
    """GGUF stores float32: 1e-6 reads back as 9.99999997e-07; keep the digits float32 actually has."""
    return float(f"{float(value):.7g}")


def architecture(meta: Mapping[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(ARCHITECTURES)
        raise GGUFConfigError(f"general.architecture: unsupported {arch!r} (supported: {supported})")
    return str(arch)


def _field(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise GGUFConfigError(f"missing metadata field {key!r}")
    return meta[key]


def hf_config(meta: Mapping[str, Any], vocab_size: int, has_output: bool) -> dict[str, Any]:
    """The `config.json` fields transformers would write for this file. `vocab_size`: rows of the token
    embedding; `has_output`: whether the file has its own `output.weight` (else the embedding is tied)."""
    arch = architecture(meta)

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default) if default is not None else _field(meta, f"{arch}.{key}")

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // num_heads)
    rope_theta = short_float(get("rope.freq_base", 10000.0))
    cfg: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": short_float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "tie_word_embeddings": not has_output,
        "eos_token_id": eos_token_ids(meta),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
    }
    scaling = _rope_scaling(meta, arch)
    if scaling:
        cfg["rope_scaling"] = scaling
    if arch == "gemma3":
        cfg.update(_gemma3(meta, cfg))
    return cfg


def _rope_scaling(meta: Mapping[str, Any], arch: str) -> dict[str, Any]:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or factor in (None, 1.0):
        return {}
    if kind != "linear":
        raise GGUFConfigError(f"{arch}.rope.scaling.type: unsupported {kind!r} (supported: linear)")
    return {"rope_type": "linear", "factor": short_float(factor)}


def _sliding_layers(meta: Mapping[str, Any], num_layers: int) -> list[bool]:
    """Which layers attend in a window: `gemma3.attention.sliding_window_pattern` (a period, or a flag per
    layer) where the file has it, else llama.cpp's period of six."""
    pattern = meta.get("gemma3.attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise GGUFConfigError(f"gemma3.attention.sliding_window_pattern: {len(pattern)} flags, {num_layers} layers")
        return [bool(p) for p in pattern]
    return [(i + 1) % int(pattern) != 0 for i in range(num_layers)]


def _gemma3(meta: Mapping[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    sliding = _sliding_layers(meta, cfg["num_hidden_layers"])
    layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    global_rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"], **cfg.pop("rope_scaling", {})}
    local_base = short_float(meta.get("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE))
    return {
        "sliding_window": int(_field(meta, "gemma3.attention.sliding_window")),
        "layer_types": layer_types,
        "query_pre_attn_scalar": cfg["head_dim"],
        "rope_parameters": {
            "full_attention": global_rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        },
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": meta.get("gemma3.attn_logit_softcapping"),
        "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
    }


def eos_token_ids(meta: Mapping[str, Any]) -> list[int]:
    """Every id that ends a generation, as llama.cpp finds them (its end-of-generation set): the eos, end-of-turn
    and end-of-message ids and the FIM separators the file names (`tokenizer.ggml.*_token_id`), and the tokens
    spelled as a known turn or text end (Gemma's `<end_of_turn>`, ChatML's `<|im_end|>`, `<|endoftext|>`, ...) or
    a code model's FIM separator (`<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>`: the end of a file). With both
    `<|return|>` and `<|call|>` (gpt-oss), `<|end|>` ends a message, not the generation. The eos id first."""
    ids = [meta[f"tokenizer.ggml.{key}"] for key in EOG_KEYS if meta.get(f"tokenizer.ggml.{key}") is not None]
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        spelled = {t: i for i, t in enumerate(tokens) if t in EOG_TEXTS or t in FIM_EOG_TEXTS}  # a later one wins
        if "<|return|>" in spelled and "<|call|>" in spelled:
            spelled.pop("<|end|>", None)
        ids += sorted(spelled.values())
    return list(dict.fromkeys(int(i) for i in ids))


def gguf_model_config(meta: Mapping[str, Any], vocab_size: int, has_output: bool) -> ModelConfig:
    try:
        return parse_model_config(hf_config(meta, vocab_size, has_output))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, GGUFConfigError):
            raise
        raise GGUFConfigError(str(e)) from None
