"""A GGUF file's hyperparameters as a `ModelConfig`: the `<arch>.*` metadata keys, read as llama.cpp reads them.

The metadata is turned into the fields of a Hugging Face `config.json` and parsed by the same code as one, so a
GGUF file and the directory transformers would convert it to give the same `ModelConfig`. The keys every
architecture shares are read here; the rest by the file's architecture (`Architecture.gguf_fields`, found by
`general.architecture` in `engine/models/registry.py`), which fills in, as llama.cpp does, the facts llama.cpp
keeps in code rather than in the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.model_config import ModelConfig
from infer.engine.models.architecture import Architecture, short_float
from infer.engine.models.registry import SUPPORTED_GGUF_NAMES, gguf_architecture, parse_model_config

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


def family(meta: Mapping[str, Any]) -> Architecture:
    """The model family `general.architecture` names; GGUFConfigError for one we do not serve."""
    arch = meta.get("general.architecture")
    found = gguf_architecture(arch)
    if found is None:
        supported = ", ".join(SUPPORTED_GGUF_NAMES)
        raise GGUFConfigError(f"general.architecture: unsupported {arch!r} (supported: {supported})")
    return found


def architecture(meta: Mapping[str, Any]) -> str:
    """`general.architecture`, a family we serve (`family`)."""
    return family(meta).gguf_name


def _field(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise GGUFConfigError(f"missing metadata field {key!r}")
    return meta[key]


def hf_config(meta: Mapping[str, Any], vocab_size: int, has_output: bool) -> dict[str, Any]:
    """The `config.json` fields transformers would write for this file. `vocab_size`: rows of the token
    embedding; `has_output`: whether the file has its own `output.weight` (else the embedding is tied)."""
    kind = family(meta)
    arch = kind.gguf_name

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default) if default is not None else _field(meta, f"{arch}.{key}")

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // num_heads)
    rope_theta = short_float(get("rope.freq_base", 10000.0))
    cfg: dict[str, Any] = {
        "model_type": kind.model_types[0],
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
    cfg.update(kind.gguf_fields(meta, cfg))
    return cfg


def _rope_scaling(meta: Mapping[str, Any], arch: str) -> dict[str, Any]:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or factor in (None, 1.0):
        return {}
    if kind != "linear":
        raise GGUFConfigError(f"{arch}.rope.scaling.type: unsupported {kind!r} (supported: linear)")
    return {"rope_type": "linear", "factor": short_float(factor)}


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
