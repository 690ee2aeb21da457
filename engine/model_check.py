"""A model checked once at load, before any layer is built: its config against itself, against the tensors the
checkpoint actually holds, and against its tokenizer. Every failure is a `ModelCheckError` naming the config
field that does not fit (`field`) and what it does not fit (`detail`); a GGUF file's loader renames the field to
the file's key.

- the config alone (`check_config`): query heads a multiple of the key/value heads, an even head size (RoPE turns
  pairs), RoPE bases and scaling factors finite and positive, norms' epsilon, windows, softcaps and the query
  scale sane, and the eos/bos ids rows of the embedding;
- the tensors (`check_tensors`, by checkpoint name and shape, from the file's header: nothing is read): one set of
  layers for each of `num_hidden_layers` and none past it, and every known tensor the shape the config implies,
  so that the model built next takes no more memory than the file's tensors;
- the tokenizer (`check_vocab`): no id past the embedding's rows. NOTE: fewer ids than rows is fine (padded
  embeddings: Qwen2.5's 151,936 rows for 151,665 ids).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from infer.engine.model_config import ModelCheckError

if TYPE_CHECKING:
    from infer.engine.model_config import ModelConfig

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
_GLOBAL = re.compile(r"(?:^|\.)(embed_tokens|lm_head|norm)\.weight$")


def _require(ok: bool, field: str, detail: str) -> None:
    if not ok:
        raise ModelCheckError(field, detail)


def _positive(value: float | None) -> bool:
    return value is not None and isinstance(value, int | float) and math.isfinite(value) and value > 0


def check_config(cfg: ModelConfig) -> None:
    """The config's own consistency (the sizes' bounds are `parse_model_config`'s)."""
    _require(cfg.num_heads % cfg.num_kv_heads == 0, "num_key_value_heads",
             f"{cfg.num_heads} query heads are not a multiple of {cfg.num_kv_heads} key/value heads")  # fmt: skip
    _require(cfg.head_dim % 2 == 0, "head_dim", f"{cfg.head_dim} is odd (RoPE turns pairs of values)")
    _require(len(cfg.ropes) == len(cfg.sliding_windows) == cfg.num_layers, "layer_types",
             f"{len(cfg.ropes)} layer types for {cfg.num_layers} layers")  # fmt: skip
    for rope in set(cfg.ropes):
        _require(_positive(rope.theta) and rope.theta > 1, "rope_theta", f"{rope.theta} is not a finite base > 1")
        _require(0 < rope.rotary_dim <= cfg.head_dim and rope.rotary_dim % 2 == 0, "head_dim",
                 f"{rope.rotary_dim} rotary dimensions for heads of {cfg.head_dim}")  # fmt: skip
        _require(_positive(rope.factor), "rope_scaling.factor", f"{rope.factor} is not a finite factor > 0")
        if rope.rope_type == "llama3":
            low, high = rope.low_freq_factor, rope.high_freq_factor
            _require(_positive(low) and _positive(high) and high > low, "rope_scaling.high_freq_factor",
                     f"{high} must be finite and more than low_freq_factor {low}")  # fmt: skip
            _require(rope.original_max_position_embeddings > 0, "rope_scaling.original_max_position_embeddings",
                     f"{rope.original_max_position_embeddings} is not a number of positions")  # fmt: skip
    eps = cfg.rms_norm_eps
    _require(math.isfinite(eps) and 0 <= eps < 1, "rms_norm_eps", f"{eps} is not in [0, 1)")
    for window in {w for w in cfg.sliding_windows if w is not None}:
        _require(window > 0, "sliding_window", f"{window} is not a number of positions")
    _require(_positive(cfg.attn_scale), "query_pre_attn_scalar", f"a query scale of {cfg.attn_scale}")
    for field, cap in (("attn_logit_softcapping", cfg.attn_softcap), ("final_logit_softcapping", cfg.final_softcap)):
        _require(cap is None or _positive(cap), field, f"{cap} is not a finite cap > 0")
    for field, ids in (("eos_token_id", cfg.eos_token_ids), ("bos_token_id", (cfg.bos_token_id,))):
        for token_id in ids:
            _require(token_id is None or _is_id(token_id, cfg.vocab_size), field,
                     f"{token_id} is not an id of the {cfg.vocab_size} rows of the embedding")  # fmt: skip


def _is_id(token_id: object, vocab_size: int) -> bool:
    return isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < vocab_size


LayerShapes = dict[str, tuple[tuple[int, str], ...]]  # a layer's checkpoint tensor -> (size, its field) per dim


def layer_shapes(cfg: ModelConfig) -> LayerShapes:
    """A layer's checkpoint tensors (after `layers.N.`) under their usual names, each dimension with the field it
    comes from; an architecture that names or fuses them otherwise adds its own (`Architecture.layer_shapes`)."""
    hidden, inter = (cfg.hidden_size, "hidden_size"), (cfg.intermediate_size, "intermediate_size")
    q, kv = (cfg.q_size, "num_attention_heads"), (cfg.kv_size, "num_key_value_heads")
    head = (cfg.head_dim, "head_dim")
    return {
        "self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
        "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
        "self_attn.q_norm.weight": (head,), "self_attn.k_norm.weight": (head,),
        "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
        "pre_feedforward_layernorm.weight": (hidden,), "post_feedforward_layernorm.weight": (hidden,),
    }  # fmt: skip


def _global_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, str], ...]]:
    vocab, hidden = (cfg.vocab_size, "vocab_size"), (cfg.hidden_size, "hidden_size")
    return {"embed_tokens": (vocab, hidden), "lm_head": (vocab, hidden), "norm": (hidden,)}


def check_tensors(
    cfg: ModelConfig, tensors: Iterable[tuple[str, str, tuple[int, ...]]], shapes: LayerShapes | None = None
) -> None:
    """`tensors`: (checkpoint name, the name the file gives it, shape) of every tensor, read from the file's
    header; `shapes`: a layer's tensors (`layer_shapes` when None). Names this does not know are left to the
    weight loader, which refuses them."""
    per_layer = shapes if shapes is not None else layer_shapes(cfg)
    global_shapes = _global_shapes(cfg)
    layers: set[int] = set()
    for name, shown, shape in tensors:
        layer = _LAYER.search(name)
        if layer is not None:
            layers.add(int(layer.group(1)))
            _require(int(layer.group(1)) < cfg.num_layers, "num_hidden_layers",
                     f"{cfg.num_layers} layers, but the file has tensor {shown!r}")  # fmt: skip
            expected = per_layer.get(layer.group(2))
        else:
            found = _GLOBAL.search(name)
            expected = None if found is None else global_shapes[found.group(1)]
        if expected is not None:
            _check_shape(cfg, shown, shape, expected)
    missing = sorted(set(range(cfg.num_layers)) - layers)
    _require(not missing, "num_hidden_layers",
             f"{cfg.num_layers} layers, but the file has no tensor of layer {missing[0] if missing else 0}"
             f" ({len(layers)} layers have tensors)")  # fmt: skip


def _check_shape(cfg: ModelConfig, shown: str, shape: tuple[int, ...], expected: tuple[tuple[int, str], ...]) -> None:
    want = tuple(size for size, _ in expected)
    if tuple(shape) == want:
        return
    field = next((f for (size, f), got in zip(expected, shape, strict=False) if size != got), expected[0][1])
    detail = f"tensor {shown!r} has shape {tuple(shape)}, the config implies {want}"
    if field in ("num_attention_heads", "num_key_value_heads"):  # NOTE: rows of heads times the head size
        heads = cfg.num_heads if field == "num_attention_heads" else cfg.num_kv_heads
        detail += f" ({heads} heads of head_dim {cfg.head_dim})"
    raise ModelCheckError(field, detail)


def check_vocab(cfg: ModelConfig, num_ids: int) -> None:
    """A tokenizer that makes ids 0..num_ids-1: each must be a row of the embedding (and of the LM head)."""
    detail = f"the tokenizer has {num_ids} ids, but the embedding has only {cfg.vocab_size} rows"
    _require(num_ids <= cfg.vocab_size, "vocab_size", detail)


def check_special_ids(cfg: ModelConfig, ids: Mapping[str, Iterable[int]]) -> None:
    """The tokenizer's special ids (`{"eos": [...], ...}`): each a row of the embedding."""
    for kind, values in ids.items():
        for token_id in values:
            _require(_is_id(token_id, cfg.vocab_size), f"{kind}_token_id",
                     f"{token_id} is not an id of the {cfg.vocab_size} rows of the embedding")  # fmt: skip
