"""ggml's quantized blocks (a GGUF file's tensors) packed straight into int4, int5, int6 or int8g by the compiled op.

`pack_ggml_blocks` takes the raw blocks of one or more tensors (the row blocks of one weight: q, k, v; gate, up),
the row order of the output, and a `BlockPlan` (which format, group, how scales are stored), and returns the
packed weight in one pass (`csrc/ggml_pack.cpp`): the same bytes as decoding the blocks into codes and scales
(engine/gguf/quants.py) and packing those with `pack_int4*` / `pack_int5*` / `pack_int6` / `pack_int8g*`, its test
oracle and the fallback where the compiled kernels are not built (it returns None then).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from infer.kernels import cpu
from infer.kernels.int4 import GROUP as INT4_GROUP
from infer.kernels.int4 import Int4Weight, Int5Weight
from infer.kernels.int6 import GROUP as INT6_GROUP
from infer.kernels.int6 import Int6Weight
from infer.kernels.int8g import GROUPS, Int8GroupWeight
from infer.kernels.packed import SUPER_SCALES, PackedWeight

Scales = Literal["fp16", "fp32", "two_level"]
Codes = Literal["int4", "int5", "int6", "int8g"]
_FORMATS = {"int4": 0, "int8g": 1, "int5": 2, "int6": 3}  # csrc/ggml_pack.cpp: Format
_SCALES = {"fp16": (0, torch.float16), "fp32": (1, torch.float32), "two_level": (2, SUPER_SCALES)}  # ggml_pack.cpp


@dataclass(frozen=True)
class BlockPlan:
    """How a weight is packed: int4 or int5 (groups of 32, with minimums), int6 (Q6_K's: groups of 16, symmetric,
    two-level scales) or int8g, and how its scales are stored."""

    codes: Codes
    group: int  # 16 or 32 inputs a scale
    scales: Scales  # as fp16 or fp32 values per group, or two-level (fp16 per 256 inputs times int8 per group)
    has_min: bool

    def __post_init__(self) -> None:
        if self.codes not in _FORMATS:
            raise ValueError(f"codes are int4, int5, int6 or int8g, not {self.codes!r}")
        if self.codes == "int6":
            if (self.group, self.has_min, self.scales) != (INT6_GROUP, False, "two_level"):
                raise ValueError(f"no packed format for {self}")
        elif self.group not in GROUPS or (self.codes != "int8g" and (self.group != INT4_GROUP or not self.has_min)):
            raise ValueError(f"no packed format for {self}")
        if self.scales not in _SCALES:
            raise ValueError(f"scales are stored as fp16, fp32 or two_level, not {self.scales!r}")

    @property
    def scale_dtype(self) -> torch.dtype:  # as the formats name it: fp16, fp32 or SUPER_SCALES (two-level)
        return _SCALES[self.scales][1]


@dataclass(frozen=True)
class BlockRows:
    """The raw blocks of a `[rows, cols]` tensor of one ggml type (a view of the file is fine: it is only read)."""

    data: np.ndarray  # uint8 bytes, rows * cols / block * block bytes
    ggml_type: int  # ggml's type id (Q4_0 = 2 ... Q6_K = 14)


def pack_ggml_blocks(
    parts: Sequence[BlockRows],
    order: np.ndarray,  # [N] int64: output channel n is row order[n] of the parts stacked
    cols: int,
    plan: BlockPlan,
) -> PackedWeight | None:
    """The weight packed per `plan`, or None where the compiled kernels are not built here. ValueError for blocks
    that do not fit the plan or hold a scale it cannot store (not finite; beyond fp16's range when fp16)."""
    if not cpu.load():
        return None
    with warnings.catch_warnings():  # NOTE: read-only views of the file's map: the op only reads them
        warnings.simplefilter("ignore", UserWarning)
        raws = [torch.from_numpy(np.ascontiguousarray(p.data).reshape(-1).view(np.uint8)) for p in parts]
    rows = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
    try:
        packed = torch.ops.infer_cpu.ggml_pack(
            raws, [p.ggml_type for p in parts], rows, cols, _FORMATS[plan.codes], plan.group,
            _SCALES[plan.scales][0], plan.has_min,
        )  # fmt: skip
    except RuntimeError as e:
        raise ValueError(str(e).splitlines()[0]) from None
    n = int(rows.numel())
    if plan.codes == "int6":
        return Int6Weight(packed, n, cols)
    if plan.codes != "int8g":
        return (Int4Weight if plan.codes == "int4" else Int5Weight)(packed, n, cols)
    return Int8GroupWeight(packed, n, cols, plan.group, plan.has_min, plan.scale_dtype)
