"""Batch invariance of the kernels: every row of a call of 7, 9 or 33 rows is bit-identical to that row alone.

A request's tokens must never depend on what else is in its batch. Each op of a backend that promises it
(the compiled CPU backend) computes a row the same way whatever the number of rows in the call and
wherever the row sits in it: checked here op by op, with `torch.equal`, not a tolerance, for every row of
each call, so every position of the kernels' full register tiles (4 rows for dense, up to 8 for int4, int5,
int6, int8g) and of their leftover tiles is compared with the row alone (tests/mutants: a full tile moved by one
ulp fails here).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from infer.kernels import (
    AttentionSpec,
    Int5Weight,
    Int6Weight,
    Kernels,
    RopeConfig,
    RotaryAngles,
    SuperScales,
    cos_sin_cache,
    pack_int5,
    pack_int6,
    select_kernels,
)
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.paged_batches import metadata, random_tables

# rows in a batched call: a leftover tile alone (7), full tiles and a row left over (9, 33)
ROW_COUNTS = (7, 9, 33)
NUM_POOL_ROWS = max(ROW_COUNTS)
# a weight format: (dtype of x and the float weight, quantization or None); a new format is one more entry
FORMATS = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "int8": (torch.float32, "int8"),
    "int4": (torch.float32, "int4"),
    "int5": (torch.float32, "int5"),
    "int6": (torch.float32, "int6"),
    "int8g": (torch.float32, "int8g"),
}
# (N, K): the default model's, odd tails, an odd N at two super-blocks (int6 takes K a multiple of 256 only)
LINEAR_SHAPES = [(960, 576), (576, 1536), (101, 37), (49, 70), (101, 512)]


@pytest.fixture
def kernels() -> Callable[[torch.dtype], Kernels]:
    require_compiled_kernels()
    return lambda dtype: select_kernels("cpu", dtype, "cpu")


def rows_alike(op: Callable[[list[int]], torch.Tensor]) -> None:
    """`op(rows)` (the pool rows to compute, in order) gives every row of a call the bits of that row alone.

    Each call of n rows (ROW_COUNTS) holds pool rows 1..n-1 then row 0: each row is compared at its position,
    so rows sit at every position of full tiles and of the leftover one, and row 0 at another offset each time.
    """
    alone = [op([i])[0] for i in range(NUM_POOL_ROWS)]
    for n in ROW_COUNTS:
        rows = [*range(1, n), 0]
        out = op(rows)
        for position, row in enumerate(rows):
            diff = (out[position].float() - alone[row].float()).abs().max().item()
            assert torch.equal(out[position], alone[row]), f"{n} rows, position {position}: max diff {diff}"


def _int5(weight: torch.Tensor) -> Int5Weight:
    """An int5 weight of `weight`'s shape (Q5_1-like groups of 32): random codes, d and m (GGUF's format)."""
    n, k = weight.shape
    gen = torch.Generator().manual_seed(n + k)
    codes = torch.randint(0, 32, (n, k), generator=gen, dtype=torch.uint8)
    groups = -(-k // 32)
    d, m = torch.rand(n, groups, generator=gen) / 16, torch.randn(n, groups, generator=gen) / 4
    return pack_int5(codes, d, m, torch.float16)


def _int6(weight: torch.Tensor) -> Int6Weight:
    """An int6 weight of `weight`'s shape (Q6_K's): random codes, d_sub over int8's range, small fp16 d_super."""
    n, k = weight.shape
    gen = torch.Generator().manual_seed(n + k)
    codes = torch.randint(0, 64, (n, k), generator=gen, dtype=torch.uint8)
    d_sub = torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8)
    d_super = (torch.rand(n, k // 256, generator=gen) / 256 / k**0.5).half().float()
    return pack_int6(codes, SuperScales(d_sub, d_super))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("n", "k"), LINEAR_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_rows_do_not_depend_on_the_row_count(
    kernels: Callable[[torch.dtype], Kernels], fmt: str, n: int, k: int, with_bias: bool
) -> None:
    dtype, method = FORMATS[fmt]
    if method == "int6" and k % 256:
        pytest.skip("int6 takes in_features a multiple of 256")
    ks = kernels(dtype)
    gen = torch.Generator().manual_seed(n * k)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    special = {"int5": _int5, "int6": _int6}
    packed = weight if method is None else special[method](weight) if method in special else ks.quantize(weight, method)
    bias = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    pool = torch.randn(NUM_POOL_ROWS, k, generator=gen).to(dtype)
    with torch.inference_mode():
        rows_alike(lambda rows: ks.linear(pool[rows], packed, bias))


def test_int8_linear_with_bf16_inputs_is_row_invariant(kernels: Callable[[torch.dtype], Kernels]) -> None:
    ks = kernels(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    packed = ks.quantize(torch.randn(200, 96, generator=gen), "int8")
    pool = torch.randn(NUM_POOL_ROWS, 96, generator=gen).bfloat16()
    with torch.inference_mode():
        rows_alike(lambda rows: ks.linear(pool[rows], packed))


def test_int8_linear_rounds_subnormal_inputs_alike(kernels: Callable[[torch.dtype], Kernels]) -> None:
    # K = 37: the end of each row is converted by scalar code; a subnormal there once rounded differently
    # depending on whether the flat [M * K] split into vector and scalar parts fell before or after it
    ks = kernels(torch.float32)
    gen = torch.Generator().manual_seed(4)
    packed = ks.quantize(torch.randn(32, 37, generator=gen), "int8")
    pool = torch.randn(NUM_POOL_ROWS, 37, generator=gen)
    pool[:, 30:] = 1e-39  # fp32 subnormals: bf16 keeps them, a flush-to-zero conversion does not
    with torch.inference_mode():
        rows_alike(lambda rows: ks.linear(pool[rows], packed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_and_activations_rows_do_not_depend_on_the_row_count(
    kernels: Callable[[torch.dtype], Kernels], dtype: torch.dtype
) -> None:
    ks = kernels(dtype)
    gen = torch.Generator().manual_seed(5)
    pool = torch.randn(NUM_POOL_ROWS, 2, 576, generator=gen).to(dtype)  # [rows, (x, residual), hidden]
    weight = torch.randn(576, generator=gen).to(dtype)
    with torch.inference_mode():
        rows_alike(lambda rows: ks.rms_norm(pool[rows, 0], weight, 1e-5))
        rows_alike(lambda rows: torch.cat(ks.fused_add_rms_norm(pool[rows, 0], pool[rows, 1], weight, 1e-5), -1))
        rows_alike(lambda rows: ks.silu_and_mul(pool[rows].flatten(1)))
        rows_alike(lambda rows: ks.gelu_tanh_and_mul(pool[rows].flatten(1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rows_do_not_depend_on_the_row_count(
    kernels: Callable[[torch.dtype], Kernels], dtype: torch.dtype
) -> None:
    ks = kernels(dtype)
    gen = torch.Generator().manual_seed(6)
    cache = cos_sin_cache(RopeConfig(theta=100000.0, rotary_dim=64), 1000)
    pool = torch.randn(NUM_POOL_ROWS, 9, 64, generator=gen).to(dtype)
    positions = torch.randint(0, 1000, (NUM_POOL_ROWS,), generator=gen)
    with torch.inference_mode():
        rows_alike(lambda rows: ks.apply_rotary(pool[rows], RotaryAngles.lookup(positions[rows], cache)))


# (heads, KV heads, head_dim): GQA 3; one KV head of 4 (Gemma 3: a decode alone is split between the threads by
# its query heads, beside others it is not), at the AVX-512 loop's head_dim 256 (Gemma 3's) and 128 and the plain
# loops' 80
ATTENTION_SHAPES = [(9, 3, 64), (4, 1, 256), (4, 1, 128), (4, 1, 80)]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_rows_do_not_depend_on_the_batch(
    kernels: Callable[[torch.dtype], Kernels], dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    """A decode token (row 0 of the pool) attends alike alone and beside other decodes and a prefill chunk, on 2
    threads as on 1."""
    ks = kernels(dtype)
    gen = torch.Generator().manual_seed(7)
    (heads, kv_heads, head_dim), bs = shape, 16
    seq_lens = [int(n) for n in torch.randint(1, 120, (NUM_POOL_ROWS,), generator=gen)]
    seq_lens[1] = 70  # a prefill chunk of 20 tokens in every call but the first
    query_lens = [20 if i == 1 else 1 for i in range(len(seq_lens))]
    tables = random_tables(seq_lens, bs, sum(-(-n // bs) for n in seq_lens), gen)
    k_cache = torch.randn(sum(len(t) for t in tables), bs, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype)
    qkv = [
        torch.randn(n, h, head_dim, generator=gen).to(dtype) for n in query_lens for h in (heads, kv_heads, kv_heads)
    ]

    def op(rows: list[int]) -> torch.Tensor:
        meta = metadata([query_lens[i] for i in rows], [seq_lens[i] for i in rows], [tables[i] for i in rows], bs)
        q, k, v = (torch.cat([qkv[3 * i + j] for i in rows]) for j in range(3))
        meta = ks.prepare_attention(meta, k_cache, [None])
        out = ks.paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, AttentionSpec(head_dim**-0.5))
        ends = meta.query_start_loc[1:].tolist()
        return out[[e - 1 for e in ends]]  # the last token of each sequence

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.inference_mode():
            rows_alike(op)
            two = op([0])
            torch.set_num_threads(1)
            assert torch.equal(op([0]), two)
    finally:
        torch.set_num_threads(threads)
