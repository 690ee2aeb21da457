"""Block manager: allocation, exhaustion, reuse, double free, prefix cache."""

from __future__ import annotations

import pytest

from infer.engine.block_manager import BlockAccountingError, BlockManager


def test_allocate_covers_tokens_and_free_returns_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", [], 9)
    assert len(bm.block_table("a")) == 3
    assert bm.num_used_blocks == 3
    bm.free("a")
    bm.assert_no_leaks()


def test_exhaustion_is_checked_before_acting() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.can_allocate([], 16)
    assert not bm.can_allocate([], 17)
    bm.allocate("a", [], 12)
    assert bm.can_append("a", 16)
    assert not bm.can_append("a", 17)
    with pytest.raises(BlockAccountingError):
        bm.append("a", 17)


def test_freed_blocks_are_reused() -> None:
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    bm.allocate("a", [], 8)
    first = set(bm.block_table("a"))
    bm.free("a")
    bm.allocate("b", [], 8)
    assert set(bm.block_table("b")) == first


def test_double_free_is_detected() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.allocate("a", [], 4)
    bm.free("a")
    with pytest.raises(BlockAccountingError, match="double free"):
        bm.free("a")


def test_leak_is_detected() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.allocate("a", [], 4)
    with pytest.raises(BlockAccountingError, match="leaked"):
        bm.assert_no_leaks()


def test_prefix_cache_hit_shares_blocks_and_never_covers_the_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(12))
    bm.allocate("a", [], 12)
    bm.cache_blocks("a", tokens, 12)
    # 12 tokens = 3 full blocks, but the last token must be recomputed: only 2 are hits
    hit = bm.find_cached_prefix(tokens)
    assert hit == bm.block_table("a")[:2]
    bm.allocate("b", hit, 12)
    assert bm.block_table("b")[:2] == hit
    assert bm.num_used_blocks == 4  # 3 of a's + 1 new for b
    bm.free("a")
    bm.free("b")
    bm.assert_no_leaks()


def test_prefix_cache_survives_free_until_evicted() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    tokens = [5, 6, 7, 8, 9]
    bm.allocate("a", [], 5)
    bm.cache_blocks("a", tokens, 5)
    bm.free("a")
    assert bm.find_cached_prefix(tokens) != []
    assert bm.can_allocate(bm.find_cached_prefix(tokens), 5)
    # a different request takes every block: the cached ones are evicted
    bm.allocate("b", [], 6)
    bm.cache_blocks("b", [1, 1, 1, 1, 1, 1], 6)
    assert bm.find_cached_prefix(tokens) == []
    bm.free("b")
    bm.assert_no_leaks()


def test_different_prefix_misses() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("a", [], 4)
    bm.cache_blocks("a", [1, 2, 3, 4], 4)
    assert bm.find_cached_prefix([1, 2, 9, 9, 9]) == bm.block_table("a")[:1]
    assert bm.find_cached_prefix([9, 2, 3, 4, 5]) == []
    bm.free("a")


def test_truncate_frees_the_blocks_past_the_tokens_kept() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", [], 13)  # 4 blocks
    bm.truncate("a", 6)
    assert len(bm.block_table("a")) == 2 and bm.num_free_blocks == 6
    bm.truncate("a", 8)  # nothing past 8 tokens: a no-op
    assert len(bm.block_table("a")) == 2
    bm.free("a")
    bm.assert_no_leaks()


def test_truncate_never_drops_cached_full_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", [], 9)
    bm.cache_blocks("a", list(range(9)), 8)  # two full blocks hashed
    with pytest.raises(BlockAccountingError, match="truncate"):
        bm.truncate("a", 4)
