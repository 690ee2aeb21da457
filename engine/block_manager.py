"""The KV block pool: per-request block tables, reference counts and the prefix cache.

A full block is identified by the hash of its tokens chained to its parent
block's hash. Freed blocks keep their hash and stay findable until they are
evicted, least recently freed first. Methods come in check/act pairs.
An optional `BlockEvents` hears of every block the prefix cache stores
and evicts (KV-cache events: engine/kv_events.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class BlockAccountingError(RuntimeError):
    """A double free, a leak or a negative reference count: a bug, never user error."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockEvents(Protocol):
    """Told of each change to the prefix cache, on the step's thread (`KVEventPublisher`)."""

    def block_stored(self, block_hash: int, parent_hash: int | None, token_ids: Sequence[int]) -> None: ...

    def block_removed(self, block_hash: int) -> None: ...


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, events: BlockEvents | None = None
    ) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        self.enable_prefix_caching, self.events = enable_prefix_caching, events
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: dict[int, None] = dict.fromkeys(range(num_blocks))  # LRU order, evict first
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.tables: dict[str, list[int]] = {}
        self.hashes: dict[str, list[int]] = {}  # chain hashes of each request's full blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def block_table(self, request_id: str) -> list[int]:
        return self.tables[request_id]

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # prefix cache
    def find_cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix; never the last token (its logits are needed)."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        parent: int | None = None
        bs = self.block_size
        for start in range(0, len(token_ids) - 1 - bs + 1, bs):
            tokens = tuple(token_ids[start : start + bs])
            block_id = self.cached.get(hash((parent, tokens)))
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break  # a miss, or a hash collision caught by comparing tokens
            found.append(block_id)
            parent = self.blocks[block_id].block_hash
        return found

    def cache_blocks(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the request's blocks that became full with computed tokens."""
        if not self.enable_prefix_caching:
            return
        hashes, table, bs = self.hashes[request_id], self.tables[request_id], self.block_size
        for index in range(len(hashes), num_computed_tokens // bs):
            parent = hashes[-1] if hashes else None
            tokens = tuple(token_ids[index * bs : (index + 1) * bs])
            block_hash = hash((parent, tokens))
            hashes.append(block_hash)
            block = self.blocks[table[index]]
            if block.block_hash is None and block_hash not in self.cached:
                block.block_hash, block.token_ids = block_hash, tokens
                self.cached[block_hash] = block.block_id
                if self.events is not None:
                    self.events.block_stored(block_hash, parent, tokens)

    # allocation
    def can_allocate(self, cached_blocks: Sequence[int], num_tokens: int) -> bool:
        num_new = max(0, self._num_blocks_for(num_tokens) - len(cached_blocks))
        num_revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        return num_new + num_revived <= self.num_free_blocks

    def allocate(self, request_id: str, cached_blocks: Sequence[int], num_tokens: int) -> None:
        """A new table: the cached prefix blocks, then fresh blocks up to num_tokens."""
        if request_id in self.tables:
            raise BlockAccountingError(f"request {request_id!r} already holds blocks")
        assert self.can_allocate(cached_blocks, num_tokens)
        for block_id in cached_blocks:
            self._take(block_id)
        self.tables[request_id] = list(cached_blocks)
        self.hashes[request_id] = [self.blocks[b].block_hash or 0 for b in cached_blocks]
        self.append(request_id, num_tokens)

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        """Whether the table can grow to cover num_tokens tokens in all."""
        num_new = self._num_blocks_for(num_tokens) - len(self.tables[request_id])
        return num_new <= self.num_free_blocks

    def append(self, request_id: str, num_tokens: int) -> None:
        table = self.tables[request_id]
        num_new = self._num_blocks_for(num_tokens) - len(table)
        if num_new > self.num_free_blocks:
            raise BlockAccountingError(f"append for {request_id!r} without can_append")
        for _ in range(num_new):
            table.append(self._take_fresh())

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Free the table's blocks past those that cover num_tokens (rejected speculative tokens' KV)."""
        table = self.tables[request_id]
        keep = self._num_blocks_for(num_tokens)
        if keep < len(self.hashes[request_id]):
            raise BlockAccountingError(f"truncate of {request_id!r} into its full, hashed blocks")
        while len(table) > keep:
            self._release(table.pop())

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table is None:
            raise BlockAccountingError(f"double free: request {request_id!r} holds no blocks")
        self.hashes.pop(request_id)
        # tail first, so a sequence's last blocks are evicted before its prefix
        for block_id in reversed(table):
            self._release(block_id)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count < 0:
            raise BlockAccountingError(f"block {block_id} freed more often than taken")
        if block.ref_count == 0:
            self.free_ids[block_id] = None

    def assert_no_leaks(self) -> None:
        held = [b.block_id for b in self.blocks if b.ref_count != 0]
        if held or self.tables or len(self.free_ids) != self.num_blocks:
            raise BlockAccountingError(f"leaked blocks {held[:8]} held by {sorted(self.tables)[:8]}")

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        block_id = next(iter(self.free_ids))
        del self.free_ids[block_id]
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # evict: the block's old content is about to be overwritten
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                if self.events is not None:
                    self.events.block_removed(block.block_hash)
            block.block_hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id
