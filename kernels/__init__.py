"""Kernels behind one interface, `Kernels`: one backend chosen once per device and dtype (`select_kernels`).

Backends: the PyTorch references (any device), the compiled CPU kernels, Triton (CUDA).
`INFER_KERNELS=auto|torch|cpu|triton` picks one (see `backend`). This module is the
interface models import; the rest of the package is the backends' insides.
"""

from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.backend import BACKENDS, select_kernels
from infer.kernels.fused import DecoderShape, FusedDecoder, LayerWeights
from infer.kernels.ggml_blocks import BlockPlan, BlockRows, Codes, Scales, pack_ggml_blocks
from infer.kernels.int4 import Int4Weight, Int5Weight, pack_int4, pack_int4_super, pack_int5, pack_int5_super
from infer.kernels.int6 import Int6Weight, pack_int6
from infer.kernels.int8 import Int8Weight
from infer.kernels.int8g import Int8GroupWeight, pack_int8g, pack_int8g_super
from infer.kernels.interface import Kernels
from infer.kernels.packed import LinearWeight, PackedWeight, SuperScales
from infer.kernels.rotary import RopeConfig, RotaryAngles, cos_sin_cache

__all__ = [
    "BACKENDS",
    "AttentionMetadata",
    "AttentionSpec",
    "BlockPlan",
    "BlockRows",
    "Codes",
    "DecoderShape",
    "FusedDecoder",
    "Int4Weight",
    "Int5Weight",
    "Int6Weight",
    "Int8GroupWeight",
    "Int8Weight",
    "Kernels",
    "LayerWeights",
    "LinearWeight",
    "PackedWeight",
    "RopeConfig",
    "RotaryAngles",
    "Scales",
    "SuperScales",
    "cos_sin_cache",
    "pack_ggml_blocks",
    "pack_int4",
    "pack_int4_super",
    "pack_int5",
    "pack_int5_super",
    "pack_int6",
    "pack_int8g",
    "pack_int8g_super",
    "select_kernels",
]
