"""Tiny random GGUF files of each architecture, written with the `gguf` package as llama.cpp's converter lays
them out (q/k rows interleaved for llama, Gemma's norms stored as 1 + w, Phi-3's q/k/v and gate/up fused), each
weight in a chosen tensor type.

K-quant blocks cannot be made by `gguf.quants.quantize`: they are random blocks (every code and sub-block scale
pattern) with small fp16 super-block scales. transformers reading the same file is the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 256, 512, 4, 2
# NOTE: transformers reads no head size for qwen3 (its default, 128) and scales Gemma 3's queries by its default
# 1/sqrt(256) where llama.cpp takes 1/sqrt(head_dim): these sizes make the two readings agree
HEAD_DIMS = {"qwen3": 128, "gemma3": 256}
VOCAB = 256
T_NAMES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# every type somewhere: a layer's projections in these types, the next layer rotated by one
LAYER_TYPES = ("Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q4_0", "Q5_K", "Q4_1", "Q5_1", "F16", "Q3_K", "Q2_K", "BF16")
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FUSED_PROJECTIONS = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")  # phi3
# offsets of the fp16 super-block scales in each K-quant block, and its size
_K_BLOCKS = {"Q2_K": ((80, 82), 84), "Q3_K": ((108,), 110), "Q4_K": ((0, 2), 144), "Q5_K": ((0, 2), 176),
             "Q6_K": ((208,), 210), "IQ4_NL": ((0,), 18)}  # fmt: skip


def _k_blocks(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    offsets, size = _K_BLOCKS[name]
    block = 32 if name == "IQ4_NL" else 256
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for off in offsets:
        d = (rng.uniform(0.5, 1.0, blocks.shape[0]) * 2e-3 / (64 if name != "Q2_K" else 4)).astype(np.float16)
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _add(writer: object, name: str, w: np.ndarray, type_name: str, rng: np.random.Generator) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[type_name]
    if type_name == "F32":
        writer.add_tensor(name, w.astype(np.float32))  # type: ignore[attr-defined]
    elif type_name in _K_BLOCKS:
        data = _k_blocks(type_name, *w.shape, rng)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)  # type: ignore[attr-defined]
    else:
        data = quantize(w.astype(np.float32), qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)  # type: ignore[attr-defined]


def _interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of q/k rows (the inverse of what the loader undoes)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path,
    arch: str,
    num_layers: int = 2,
    types: tuple[str, ...] = LAYER_TYPES,
    embedding_type: str = "Q8_0",
    tied: bool = True,
    seed: int = 0,
) -> Path:
    """A random `arch` model (llama, qwen2, qwen3, gemma3, phi3) in one GGUF file, with a byte-level gpt2 vocabulary of
    `VOCAB` tokens (no merges beyond single bytes) so that it loads as a whole model."""
    import gguf

    rng = np.random.default_rng(seed)
    head_dim = HEAD_DIMS.get(arch, 64)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(num_layers)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0 if arch == "llama" else 1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch in ("gemma3", "phi3"):  # NOTE: llama.cpp (and transformers) apply no window to a phi3 file
        writer.add_sliding_window(8)
    if arch == "phi3":
        writer.add_rope_dimension_count(head_dim)
        writer.add_pad_token_id(VOCAB - 1)  # NOTE: transformers' Phi-3 default (32000) is past this vocabulary
    _add_vocab(writer)
    shapes = {
        "attn_q": (HEADS * head_dim, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN), "attn_output": (HIDDEN, HEADS * head_dim),
        "ffn_gate": (INTERMEDIATE, HIDDEN), "ffn_up": (INTERMEDIATE, HIDDEN), "ffn_down": (HIDDEN, INTERMEDIATE),
    }  # fmt: skip
    projections = PROJECTIONS
    if arch == "phi3":
        shapes |= {"attn_qkv": ((HEADS + 2 * KV_HEADS) * head_dim, HIDDEN), "ffn_up": (2 * INTERMEDIATE, HIDDEN)}
        projections = FUSED_PROJECTIONS
    norm_shift = 1.0 if arch == "gemma3" else 0.0  # NOTE: llama.cpp stores Gemma's norms as 1 + w
    norms = ["attn_norm", "ffn_norm"] + (["post_attention_norm", "post_ffw_norm"] if arch == "gemma3" else [])
    for i in range(num_layers):
        for j, proj in enumerate(projections):
            w = rng.normal(0.0, 0.05, shapes[proj]).astype(np.float32)
            if arch == "llama" and proj in ("attn_q", "attn_k"):
                w = _interleave(w, HEADS if proj == "attn_q" else KV_HEADS)
            _add(writer, f"blk.{i}.{proj}.weight", w, types[(i + j) % len(types)], rng)
        for norm in norms:
            writer.add_tensor(f"blk.{i}.{norm}.weight", (norm_shift + rng.normal(1.0, 0.1, HIDDEN)).astype(np.float32))
        if arch in ("qwen3", "gemma3"):
            for norm in ("attn_q_norm", "attn_k_norm"):
                writer.add_tensor(
                    f"blk.{i}.{norm}.weight", (norm_shift + rng.normal(1.0, 0.1, head_dim)).astype(np.float32)
                )
        if arch == "qwen2":
            for proj, rows in (
                ("attn_q", HEADS * head_dim),
                ("attn_k", KV_HEADS * head_dim),
                ("attn_v", KV_HEADS * head_dim),
            ):
                writer.add_tensor(f"blk.{i}.{proj}.bias", rng.normal(0.0, 0.1, rows).astype(np.float32))
    _add(writer, "token_embd.weight", rng.normal(0.0, 1.0, (VOCAB, HIDDEN)).astype(np.float32), embedding_type, rng)
    if not tied:
        _add(writer, "output.weight", rng.normal(0.0, 0.05, (VOCAB, HIDDEN)).astype(np.float32), "Q6_K", rng)
    writer.add_tensor("output_norm.weight", (norm_shift + rng.normal(1.0, 0.1, HIDDEN)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_vocab(writer: object) -> None:
    """GPT-2's byte alphabet less its last two bytes, one merge (`Ġ t`), and the end of text (and of turns)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = [*alphabet[: VOCAB - 2], "Ġt", "<|end|>"]
    w = writer
    w.add_tokenizer_model("gpt2")  # type: ignore[attr-defined]
    w.add_tokenizer_pre("default")  # type: ignore[attr-defined]
    w.add_token_list(tokens)  # type: ignore[attr-defined]
    w.add_token_types([1] * (VOCAB - 1) + [3])  # type: ignore[attr-defined]
    w.add_token_merges(["Ġ t"])  # type: ignore[attr-defined]
    w.add_eos_token_id(VOCAB - 1)  # type: ignore[attr-defined]
    w.add_bos_token_id(VOCAB - 1)  # type: ignore[attr-defined]
    w.add_add_bos_token(False)  # type: ignore[attr-defined]


# byte offsets of each type's fp16 scales inside its block: random bytes there could be inf or NaN
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
}  # fmt: skip


def random_blocks(qtype: object, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes per row] uint8 of ggml type `qtype` (a GGMLQuantizationType): random blocks (every code and
    sub-block scale pattern) whose fp16 scales are finite, of either sign, some tiny."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    assert isinstance(qtype, GGMLQuantizationType)
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype.name]:
        scales = (rng.standard_normal(blocks.shape[0]) * 10.0 ** rng.integers(-6, 1, blocks.shape[0])).astype(
            np.float16
        )
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)
