"""A GGUF file's tensors into our model: names mapped once, each tensor keeping the bits it was shipped with.

`fill_model` puts every tensor of the file into a freshly built `CausalLM`:
- float tensors (F32, F16, BF16: norms, biases, float weights) are copied into the model's parameters;
- quantized weights of the linear layers are decoded into grouped form (`quants.decode`, exact) and packed into
  one of the kernels' formats without a second rounding: all-4-bit parts (Q4_0, Q4_1, Q4_K) into int4, parts of
  at most 5 bits (Q5_0, Q5_1, Q5_K beside those) into int5, all-Q6_K parts into int6, the
  rest (and fused projections whose parts differ, e.g. a Q4_K q/k beside a Q6_K v) into the 8-bit grouped format,
  whose int8 codes hold every type's codes; scales and minimums stay fp16 where the file's were, fp32 where
  K-quant sub-block scales were folded in;
- a quantized token embedding stays packed (rows dequantized per step); a tied LM head reads the same table.
With `keep=False` every tensor is dequantized to float parameters instead (`--quantization none`, int8, int4).

The tensor names are the file's architecture's (`Architecture.gguf_layer_names`); where llama.cpp interleaves
the two rotary halves of each head's q and k rows (`gguf_interleaved_qk`: the `llama` architecture), those rows
are put back in Hugging Face order (a row permutation: codes and scales move with their rows).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from infer.engine.gguf.quants import EXACT_TYPES, Grouped, decode, float_tensor, form, is_float
from infer.engine.models import CausalLM, Linear, Target, checkpoint_target
from infer.engine.models.registry import gguf_architecture
from infer.kernels import (
    BlockPlan,
    BlockRows,
    Codes,
    PackedWeight,
    Scales,
    SuperScales,
    pack_ggml_blocks,
    pack_int4,
    pack_int4_super,
    pack_int5,
    pack_int5_super,
    pack_int6,
    pack_int8g,
    pack_int8g_super,
)

logger = logging.getLogger(__name__)

SUPER_BLOCK = 256  # inputs a K-quant super-block scale covers

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFWeightError(ValueError):
    """A tensor the model cannot take; the message names it."""


@dataclass(frozen=True)
class FileTensor:
    """One tensor of the file, in torch's dimension order (slowest first)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # the file's bytes or values (a view of its memory map)
    pages: tuple[mmap.mmap, int, int] | None = None  # the map, the first byte and the length of `data` in it

    def drop_pages(self) -> None:
        """Once copied into the model: let the kernel drop the file's pages from this process (they stay in the
        page cache), so that the peak memory of a load is the model's, not the model's plus the file's."""
        if self.pages is None:
            return
        file_map, start, length = self.pages
        first = start - start % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):  # NOTE: advice only; a platform without it keeps the pages
            file_map.madvise(mmap.MADV_DONTNEED, first, start + length - first)

    @property
    def is_float(self) -> bool:
        return is_float(self.tensor_type)

    def as_float(self) -> np.ndarray:  # float32 in `shape`
        if self.is_float:
            return float_tensor(self.data, self.tensor_type, self.shape)
        return self.grouped().dequantize().reshape(self.shape)

    @property
    def rows(self) -> int:  # the rows of its [rows, cols] form (1 for a vector)
        return int(np.prod(self.shape[:-1]))

    def grouped(self) -> Grouped:
        try:
            return decode(self.data, self.tensor_type, self.rows, self.shape[-1])
        except ValueError as e:
            raise GGUFWeightError(f"tensor {self.name!r}: {e}") from None


def hf_name(arch: str, name: str) -> str:
    """The Hugging Face checkpoint name of GGUF tensor `name`; GGUFWeightError for one we do not know."""
    stem, _, suffix = name.rpartition(".")
    parts = stem.split(".")
    family = gguf_architecture(arch)
    layer_names = family.gguf_layer_names if family is not None else {}
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{suffix}"
    raise GGUFWeightError(f"unexpected tensor {name!r} for architecture {arch!r}")


def _unpermute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's interleaved rotary halves of q/k rows, back in Hugging Face order (any trailing shape)."""
    n = rows.shape[0]
    return rows.reshape(num_heads, n // num_heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _permuted_heads(model: CausalLM, arch: str, hf: str) -> int | None:
    family = gguf_architecture(arch)
    if family is None or not family.gguf_interleaved_qk:
        return None
    if hf.endswith("self_attn.q_proj.weight"):
        return model.cfg.num_heads
    if hf.endswith("self_attn.k_proj.weight"):
        return model.cfg.num_kv_heads
    return None


@dataclass(frozen=True)
class _Part:
    target: Target
    tensor: FileTensor
    heads: int | None  # rows to un-permute with this many heads (llama q/k), else None

    @property
    def rows(self) -> int:
        return self.tensor.rows

    def as_float(self) -> np.ndarray:
        w = self.tensor.as_float()
        return w if self.heads is None else _unpermute(w, self.heads)

    def grouped(self) -> Grouped:
        g = self.tensor.grouped()
        if self.heads is None:
            return g
        order = _unpermute(np.arange(g.shape[0]), self.heads)  # NOTE: rows move with their codes and scales
        return Grouped(
            g.codes[order], g.scale[order], None if g.minimum is None else g.minimum[order], g.group, g.exact,
            None if g.super is None else g.super.rows(order),
        )  # fmt: skip


def block_plan(types: Sequence[GGMLQuantizationType], cols: int) -> BlockPlan:
    """How row blocks of one weight (q, k, v; gate, up) of these types are packed, exactly, from the types alone:
    int4 when every part is 4-bit in groups of 32, int5 when every part is at most 5-bit in groups of 32, int6 when
    every part is Q6_K (so a step reads the file's bytes, not 8 bits a weight), else the 8-bit grouped format at the
    finest group of the parts;
    scales stored the K-quant way (fp16 per 256 inputs times 8 bits per group) where every part is a K-quant, as
    fp16 where every part's are fp16 values, else as fp32."""
    forms = [form(t) for t in types]
    bits = max(f.bits for f in forms)
    two_level = all(f.two_level for f in forms) and cols % SUPER_BLOCK == 0
    if bits == 6 and not (two_level and all(f.bits == 6 and not f.has_min for f in forms)):
        bits = 8  # NOTE: int6 holds Q6_K alone (symmetric, groups of 16); a Q6_K beside other types takes int8g
    codes: Codes = "int4" if bits == 4 else "int5" if bits == 5 else "int6" if bits == 6 else "int8g"
    scales: Scales = "two_level" if two_level else "fp16" if all(f.fp16_scales for f in forms) else "fp32"
    if codes == "int6":
        return BlockPlan(codes, 16, scales, has_min=False)
    has_min = codes != "int8g" or any(f.has_min for f in forms)
    return BlockPlan(codes, 32 if codes != "int8g" else min(f.group for f in forms), scales, has_min)


def pack_grouped(parts: Sequence[Grouped], plan: BlockPlan) -> PackedWeight:
    """Decoded row blocks of one weight packed per `plan` (`block_plan` of their types): the reference of
    `pack_ggml_blocks`, and the path for types it does not read (rounded ones) or where it is not built."""
    sup = _super_scales(parts, plan.group) if plan.scales == "two_level" else None
    if plan.scales == "two_level" and sup is None:
        raise ValueError("two-level scales need K-quants in every part")
    dtype = plan.scale_dtype  # fp16 or fp32 where not two-level
    if plan.codes == "int6":  # Q6_K's signed codes (-32..31) + 32
        assert sup is not None
        return pack_int6(torch.from_numpy((_joined([p.codes for p in parts]) + np.int8(32)).view(np.uint8)), sup)
    if plan.codes != "int8g":
        parts = [_unsigned(p) for p in parts]
        codes = torch.from_numpy(_joined([p.codes for p in parts]).view(np.uint8))
        if sup is not None:
            return (pack_int4_super if plan.codes == "int4" else pack_int5_super)(codes, sup)
        d, m = _per_group(parts, plan.group)
        assert m is not None
        return (pack_int4 if plan.codes == "int4" else pack_int5)(codes, d, m, dtype)
    codes8 = torch.from_numpy(_joined([p.codes for p in parts]))
    if sup is not None:
        return pack_int8g_super(codes8, sup, plan.group)
    d, m = _per_group(parts, plan.group)
    return pack_int8g(codes8, d, m, plan.group, dtype)


def _unsigned(p: Grouped) -> Grouped:
    """Q5_0's signed codes (-16..15) as int5 takes them: codes + 16, minimum -16 d (exact: w = d q either way)."""
    if p.minimum is not None:
        return p
    return Grouped(p.codes + np.int8(16), p.scale, p.scale * np.float32(-16), p.group, p.exact, p.super)


def _per_group(parts: Sequence[Grouped], group: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every part's scales (and minimums: zeros for a symmetric part beside others) at `group` inputs a group."""
    scales, minimums = [], []
    for p in parts:
        repeat = p.group // group  # a group of 32 is two groups of 16 with the same scale
        scales.append(np.repeat(p.scale, repeat, axis=1))
        minimums.append(np.zeros_like(scales[-1]) if p.minimum is None else np.repeat(p.minimum, repeat, axis=1))
    symmetric = all(p.minimum is None for p in parts)
    d = torch.from_numpy(_joined(scales))
    return d, None if symmetric else torch.from_numpy(_joined(minimums))


def _super_scales(parts: Sequence[Grouped], group: int) -> SuperScales | None:
    """The parts' two-level K-quant scales at `group` inputs a group, when every part has them."""
    sups = [p.super for p in parts]
    if any(s is None for s in sups) or parts[0].shape[1] % SUPER_BLOCK:
        return None
    has_min = any(s.m is not None for s in sups if s is not None)
    d, d_sub, m, m_sub = [], [], [], []
    for p, s in zip(parts, sups, strict=True):
        assert s is not None
        repeat = p.group // group
        d.append(s.d)
        d_sub.append(np.repeat(s.d_sub, repeat, axis=1))
        m.append(np.zeros_like(s.d) if s.m is None else s.m)
        m_sub.append(np.zeros_like(d_sub[-1]) if s.m_sub is None else np.repeat(s.m_sub, repeat, axis=1))
    return SuperScales(_cat(d_sub), _cat(d), _cat(m_sub) if has_min else None, _cat(m) if has_min else None)


def _cat(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(_joined(arrays))


def _joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Row blocks as one array; NOTE: one block is used as it is (a copy of a 262k-row embedding is ~170 MB)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _packable(param: str) -> bool:
    return param.endswith("proj.weight") or param in ("lm_head.weight", "embed_tokens")


def _fill_float(param: torch.Tensor, parts: Sequence[_Part]) -> None:
    for part in parts:
        t = part.target
        dest = param if t.num_rows is None else param.narrow(0, t.row_start, t.num_rows)
        values = part.as_float()
        w = torch.from_numpy(values if values.flags.writeable else values.copy())  # NOTE: a view of the file
        if tuple(dest.shape) != tuple(w.shape):
            raise GGUFWeightError(
                f"tensor {part.tensor.name!r} has shape {tuple(w.shape)}, expected {tuple(dest.shape)} for this model"
            )
        dest.copy_(w)


def _pack(parts: Sequence[_Part], shape: tuple[int, ...]) -> PackedWeight:
    ordered = sorted(parts, key=lambda p: p.target.row_start)
    names = ", ".join(p.tensor.name for p in ordered)
    for p in ordered:
        if p.tensor.shape[-1] != shape[1]:
            raise GGUFWeightError(f"tensor {p.tensor.name!r} has {p.tensor.shape[-1]} columns, expected {shape[1]}")
    rows = sum(p.rows for p in ordered)
    if rows != shape[0]:
        raise GGUFWeightError(f"{names}: {rows} rows, expected {shape[0]}")
    plan = block_plan([p.tensor.tensor_type for p in ordered], shape[1])
    try:
        try:
            return _pack_with(ordered, plan)
        except ValueError:
            if plan.scales != "fp16":
                raise
            return _pack_with(ordered, replace(plan, scales="fp32"))  # NOTE: Q4_0's -8 d beyond fp16's range
    except ValueError as e:
        raise GGUFWeightError(f"{names}: {e}") from None


def _pack_with(parts: Sequence[_Part], plan: BlockPlan) -> PackedWeight:
    """Straight from the file's blocks where the compiled packer reads every part's type, else decoded first."""
    if all(p.tensor.tensor_type in EXACT_TYPES for p in parts):
        blocks = [BlockRows(p.tensor.data, int(p.tensor.tensor_type)) for p in parts]
        packed = pack_ggml_blocks(blocks, _row_order(parts), parts[0].tensor.shape[-1], plan)
        if packed is not None:
            return packed
    return pack_grouped([p.grouped() for p in parts], plan)


def _row_order(parts: Sequence[_Part]) -> np.ndarray:
    """Output row -> row of the parts stacked: each part's rows in turn, llama's q/k rows un-permuted."""
    orders, start = [], 0
    for p in parts:
        local = np.arange(start, start + p.rows, dtype=np.int64)
        orders.append(local if p.heads is None else _unpermute(local, p.heads))
        start += p.rows
    return np.concatenate(orders)


def _collect(model: CausalLM, arch: str, tensors: Sequence[FileTensor]) -> dict[str, list[_Part]]:
    params = dict(model.named_parameters(remove_duplicate=False))
    by_param: dict[str, list[_Part]] = defaultdict(list)
    for tensor in tensors:
        hf = hf_name(arch, tensor.name)
        try:
            target = checkpoint_target(model.cfg, hf)
        except ValueError:
            raise GGUFWeightError(f"unexpected tensor {tensor.name!r} for {model.cfg.model_type}") from None
        if target is None:
            continue
        if target.param not in params:
            raise GGUFWeightError(f"unexpected tensor {tensor.name!r} for {model.cfg.model_type}")
        by_param[target.param].append(_Part(target, tensor, _permuted_heads(model, arch, hf)))
    if model.cfg.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    missing = sorted(n for n, p in params.items() if sum(_rows(q, p) for q in by_param.get(n, [])) != p.shape[0])
    if missing:
        raise GGUFWeightError(f"tensors missing from the file: {', '.join(missing[:5])}")
    return by_param


def _num_bytes(parts: Sequence[_Part]) -> int:
    return sum(p.tensor.data.nbytes for p in parts)


def drop_all_pages(tensors: Sequence[FileTensor]) -> None:
    """The whole file's pages out of this process: NOTE: reading a tensor maps its neighbours' cached pages too
    (the kernel's fault-around), which the tensor-by-tensor drops do not cover (~6 MB of Gemma 3 270M's file)."""
    for file_map in {id(t.pages[0]): t.pages[0] for t in tensors if t.pages is not None}.values():
        with contextlib.suppress(OSError, ValueError):  # advice only, as in `drop_pages`
            file_map.madvise(mmap.MADV_DONTNEED)


def _rows(part: _Part, param: torch.Tensor) -> int:
    return part.target.num_rows if part.target.num_rows is not None else param.shape[0]


def fill_model(model: CausalLM, arch: str, tensors: Sequence[FileTensor], keep: bool) -> None:
    """Every tensor of the file into `model` (see the module doc); GGUFWeightError naming a tensor that does not
    fit. `keep`: quantized linear weights and the embedding stay in their bits; else all become floats."""
    params = dict(model.named_parameters(remove_duplicate=False))
    # NOTE: largest first: while a weight is packed, its file pages and its packed copy are both resident; the
    # largest (a 262k-row embedding, 170 MB) then comes while the model is not, and its pages go before the next
    collected = sorted(_collect(model, arch, tensors).items(), key=lambda item: -_num_bytes(item[1]))
    for name, parts in collected:
        param = params[name]
        if keep and _packable(name) and not any(p.tensor.is_float for p in parts):
            packed = _pack(parts, tuple(param.shape))
            if name == "embed_tokens":
                model.keep_embedding_packed(packed)
            else:
                module = model.get_submodule(name.removesuffix(".weight"))
                assert isinstance(module, Linear)
                module.use_packed(packed)
        else:
            _fill_float(param, parts)
        for part in parts:
            part.tensor.drop_pages()
    drop_all_pages(tensors)
    rounded = sorted({t.tensor_type.name for t in tensors if not t.is_float and t.tensor_type not in EXACT_TYPES})
    if keep and rounded:
        logger.warning("tensor types with no exact grouped form (%s): rounded to int8 codes per group of 32",
                       ", ".join(rounded))  # fmt: skip
