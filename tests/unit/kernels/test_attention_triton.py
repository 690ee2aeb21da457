"""The Triton paged-attention and KV-write kernels against their PyTorch references (interpreter, or CUDA)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from infer.kernels import AttentionSpec
from infer.kernels.attention import paged_attention_ref, write_kv_ref
from tests.helpers.device import ON_CUDA, TEST_DEVICE
from tests.helpers.paged_batches import Batch, Shape
from tests.helpers.paged_batches import make_batch as make_cpu_batch

pytestmark = pytest.mark.triton

from infer.kernels.attention_triton import paged_attention_triton  # noqa: E402
from infer.kernels.kv_cache_triton import write_kv_triton  # noqa: E402

ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}


def make_batch(query_lens: Sequence[int], seq_lens: Sequence[int], shape: Shape, seed: int = 0) -> Batch:
    return make_cpu_batch(query_lens, seq_lens, shape, seed, device=TEST_DEVICE)


def check(batch: Batch, spec: AttentionSpec) -> None:
    """Same output and same cache contents as the reference."""
    *args_ref, kc_ref, vc_ref = batch.args()
    *args_tri, kc_tri, vc_tri = batch.args()
    expected = paged_attention_ref(*args_ref, kc_ref, vc_ref, batch.meta, spec)
    actual = paged_attention_triton(*args_tri, kc_tri, vc_tri, batch.meta, spec)
    atol = ATOL[batch.query.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=atol)
    assert torch.equal(kc_tri, kc_ref) and torch.equal(vc_tri, vc_ref)


# bf16: the interpreter's tl.dot is wrong for bf16, so the wrapper computes it in fp32 there
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_decode_and_prefill_in_one_call(dtype: torch.dtype) -> None:
    # decodes, a first prefill chunk, and a later chunk that reads its cached context
    query_lens, seq_lens = [1, 12, 1, 9, 1], [17, 12, 33, 30, 2]
    check(make_batch(query_lens, seq_lens, Shape(4, 2, 64, dtype=dtype)), AttentionSpec(scale=0.125))


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (6, 2), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gqa_ratios_and_head_dims(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    shape = Shape(num_heads, num_kv_heads, head_dim)
    check(make_batch([1, 7, 1], [20, 25, 5], shape, seed=head_dim + num_heads), AttentionSpec(scale=0.1))


def test_head_dim_not_a_power_of_two() -> None:
    check(make_batch([1, 5], [9, 21], Shape(2, 1, 80)), AttentionSpec(scale=0.11))


@pytest.mark.parametrize("seq_len", [15, 16, 17, 32, 33])
def test_lengths_at_block_boundaries(seq_len: int) -> None:
    # a decode and a chunk that both end at seq_len: the last block is full, just full, or just begun
    check(make_batch([1, 5], [seq_len, seq_len], Shape(2, 1, 64), seed=seq_len), AttentionSpec(scale=0.125))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sliding_window_shorter_than_the_context(dtype: torch.dtype) -> None:
    # window 7 over contexts up to 40: decodes and chunks both lose their oldest keys
    spec = AttentionSpec(scale=0.125, sliding_window=7)
    check(make_batch([1, 20, 1, 3], [40, 20, 6, 37], Shape(4, 2, 64, dtype=dtype)), spec)


def test_softcap_with_sliding_window() -> None:
    spec = AttentionSpec(scale=0.25, sliding_window=12, softcap=2.0)  # tight cap: most logits are capped
    check(make_batch([1, 14, 1], [30, 20, 9], Shape(4, 2, 64)), spec)


def test_long_prefill_chunk_uses_large_tiles() -> None:
    # 70 queries: 64-row tiles, several per sequence, plus one partial tile
    check(make_batch([70, 1], [90, 3], Shape(2, 2, 64)), AttentionSpec(scale=0.125))


def test_write_kv_skips_negative_slots_and_casts() -> None:
    batch = make_batch([3, 1], [3, 18], Shape(2, 2, 64, dtype=torch.float16))
    key, value = batch.key.float(), batch.value.float()  # fp32 into an fp16 cache
    slots = batch.meta.slot_mapping.clone()
    slots[1] = -1  # padding token
    expected = batch.k_cache.clone(), batch.v_cache.clone()
    actual = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv_ref(key, value, *expected, slots)
    write_kv_triton(key, value, *actual, slots)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
    assert not torch.equal(actual[0], batch.k_cache)


def _interpreter_overflow_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the interpreter raise on any int32 add/sub/mul overflow inside a kernel."""
    from triton.runtime import interpreter

    options = interpreter.InterpreterOptions(debug=True, sanitize_overflow=True)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", options)


def test_offsets_past_2_to_the_31_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache holds k and v interleaved per block, 2**20 + 8 blocks of 2 * 16 * 64 fp16 elements:
    # 2**31 + 2**15 elements (4 GiB) of which only the few blocks the batch owns are ever touched, so
    # the OS backs only those pages. Those blocks sit at element offsets just below and above 2**31;
    # an int32 offset would wrap there. With the interpreter's overflow checks on, any int32
    # overflow in the kernels' index arithmetic raises instead of reading the wrong memory.
    small = make_batch([1, 6, 1], [40, 20, 16], Shape(2, 1, 64, dtype=torch.float16))
    try:
        kv = torch.empty(2**20 + 8, 2, 16, 1, 64, dtype=torch.float16, device=TEST_DEVICE)
    except RuntimeError:
        pytest.skip("cannot reserve 4 GiB of virtual memory")
    k_big, v_big = kv[:, 0], kv[:, 1]
    num_small = small.k_cache.shape[0]
    # each small block's place in the big cache
    ids = torch.tensor([2**20 - 1] + [2**20 + 7 - i for i in range(num_small - 1)], device=TEST_DEVICE)
    assert k_big.stride(0) * int(ids.max()) >= 2**31 > k_big.stride(0) * int(ids.min())
    k_big[ids], v_big[ids] = small.k_cache, small.v_cache
    slots = small.meta.slot_mapping
    meta = replace(
        small.meta,
        slot_mapping=ids[slots // 16] * 16 + slots % 16,
        block_tables=ids[small.meta.block_tables.long()].to(torch.int32),
    )
    spec = AttentionSpec(scale=0.125, sliding_window=24)
    expected = paged_attention_ref(*small.args(), small.meta, spec)
    if not ON_CUDA:  # on the GPU a wrapped offset reads the wrong block (or faults) and the check below fails
        _interpreter_overflow_checks(monkeypatch)
    actual = paged_attention_triton(small.query, small.key, small.value, k_big, v_big, meta, spec)
    torch.testing.assert_close(actual, expected, atol=ATOL[torch.float16], rtol=ATOL[torch.float16])
    k_ref, v_ref = small.k_cache.clone(), small.v_cache.clone()
    write_kv_ref(small.key, small.value, k_ref, v_ref, small.meta.slot_mapping)
    assert torch.equal(k_big[ids], k_ref) and torch.equal(v_big[ids], v_ref)
