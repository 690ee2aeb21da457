"""The compiled CPU paged attention and KV write against their PyTorch references."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from infer.kernels import AttentionSpec, cpu
from infer.kernels.attention import paged_attention_ref, write_kv_ref
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.paged_batches import Batch, Shape, make_batch

pytestmark = pytest.mark.usefixtures("compiled_kernels")

ATOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module")
def compiled_kernels() -> None:
    require_compiled_kernels()


def check(batch: Batch, spec: AttentionSpec) -> None:
    """Same output and same cache contents as the reference."""
    *args_ref, kc_ref, vc_ref = batch.args()
    *args_cpu, kc_cpu, vc_cpu = batch.args()
    expected = paged_attention_ref(*args_ref, kc_ref, vc_ref, batch.meta, spec)
    actual = cpu.paged_attention(*args_cpu, kc_cpu, vc_cpu, batch.meta, spec)
    atol = ATOL[batch.query.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=atol)
    assert torch.equal(kc_cpu, kc_ref) and torch.equal(vc_cpu, vc_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_decode_and_prefill_in_one_call(dtype: torch.dtype) -> None:
    # decodes, a first prefill chunk, and a later chunk that reads its cached context
    query_lens, seq_lens = [1, 12, 1, 9, 1], [17, 12, 33, 30, 2]
    check(make_batch(query_lens, seq_lens, Shape(4, 2, 64, dtype=dtype)), AttentionSpec(scale=0.125))


# head_dim 64, 128 and 256 take the AVX-512 inner loop where the build has it; 80 and 32 the plain loops
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (9, 3), (8, 1)])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
def test_gqa_ratios_and_head_dims(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    shape = Shape(num_heads, num_kv_heads, head_dim)
    check(make_batch([1, 7, 1, 40], [20, 25, 5, 70], shape, seed=head_dim + num_heads), AttentionSpec(scale=0.1))


@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("seq_len", [15, 16, 17, 32, 33, 65])
def test_lengths_at_block_boundaries(block_size: int, seq_len: int) -> None:
    # a decode and a chunk that both end at seq_len: the last block is full, just full, or just begun
    shape = Shape(4, 2, 64, block_size=block_size)
    check(make_batch([1, 5], [seq_len, seq_len], shape, seed=seq_len), AttentionSpec(scale=0.125))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 7, 33])
def test_sliding_window(dtype: torch.dtype, window: int) -> None:
    # decodes and chunks (one longer than a 16-token work item) lose their oldest keys
    spec = AttentionSpec(scale=0.125, sliding_window=window)
    check(make_batch([1, 20, 1, 3, 37], [40, 20, 6, 37, 90], Shape(6, 2, 64, dtype=dtype)), spec)


@pytest.mark.parametrize("head_dim", [64, 80])
def test_softcap_with_and_without_a_window(head_dim: int) -> None:
    batch = make_batch([1, 14, 1, 30], [30, 20, 9, 50], Shape(6, 2, head_dim))
    check(batch, AttentionSpec(scale=0.25, softcap=2.0))  # tight cap: most logits are capped
    check(batch, AttentionSpec(scale=0.25, sliding_window=12, softcap=2.0))


@pytest.mark.parametrize("seed", range(6))
def test_random_mixed_batches(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_seqs = int(torch.randint(1, 12, (1,), generator=gen))
    seq_lens = torch.randint(1, 120, (num_seqs,), generator=gen).tolist()
    query_lens = [1 if torch.rand(1, generator=gen) < 0.6 else int(torch.randint(1, n + 1, (1,), generator=gen))
                  for n in seq_lens]  # fmt: skip
    kv_heads, group = [(1, 8), (3, 3), (2, 1)][seed % 3]
    window = [None, 9, 50][seed % 3]
    shape = Shape(kv_heads * group, kv_heads, [64, 128, 48][seed % 3], block_size=[16, 8, 32][seed % 3])
    check(make_batch(query_lens, seq_lens, shape, seed=seed), AttentionSpec(scale=0.09, sliding_window=window))


def test_decode_only_batch_of_64() -> None:
    seq_lens = [30 + 7 * i for i in range(64)]
    check(make_batch([1] * 64, seq_lens, Shape(9, 3, 64)), AttentionSpec(scale=0.125))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_skips_negative_slots_and_casts(dtype: torch.dtype) -> None:
    # the write that paged_attention does first (its output aside): only the caches are compared
    batch = make_batch([3, 1], [3, 18], Shape(2, 2, 64, dtype=dtype))
    key, value = batch.key.float(), batch.value.float()  # fp32 into the cache's dtype
    slots = batch.meta.slot_mapping.clone()
    slots[1] = -1  # padding token
    expected = batch.k_cache.clone(), batch.v_cache.clone()
    actual = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv_ref(key, value, *expected, slots)
    meta = replace(batch.meta, slot_mapping=slots)
    cpu.paged_attention(batch.query, key, value, *actual, meta, AttentionSpec(scale=0.125))
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
    assert not torch.equal(actual[0], batch.k_cache)
