"""A KV-cache events subscriber as a router runs one (llm-d's pkg/kvevents): live batches on a SUB socket,
gaps filled from the replay socket, and an index of one pod's blocks rebuilt from the events alone."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

END_SEQ = (1 << 64) - 1  # the replay's end marker, -1 in 8 big-endian bytes


def to_signed(wire_hash: int) -> int:
    """A published hash back as the prefix cache's Python hash (signed 64 bits)."""
    return wire_hash - (1 << 64) if wire_hash >= 1 << 63 else wire_hash


@dataclass
class BlockIndex:
    """What one pod holds, from its events only: hash -> (parent hash, the block's tokens). `strict`: a removal
    of a block never stored is an error (a subscriber that missed events ignores it, as llm-d's router does)."""

    strict: bool = True
    block_size: int = 0
    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)
    by_content: dict[tuple[int | None, tuple[int, ...]], int] = field(default_factory=dict)
    num_cleared: int = 0
    num_removed: int = 0

    def apply(self, payload: bytes) -> None:
        ts, events, dp_rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and dp_rank == 0
        for event in events:
            tag, *rest = event
            if tag == "BlockStored":
                self._stored(*rest)
            elif tag == "BlockRemoved":
                for h in rest[0]:
                    assert h in self.blocks or not self.strict, f"block {h} removed, never stored"
                    if h in self.blocks:
                        del self.by_content[self.blocks.pop(h)]
                    self.num_removed += 1
            else:
                assert tag == "AllBlocksCleared" and rest == []
                self.blocks.clear()
                self.by_content.clear()
                self.num_cleared += 1

    def _stored(self, hashes: list[int], parent: int | None, token_ids: list[int], block_size: int, *tail: Any) -> None:
        assert list(tail) == [None, None, None]  # lora_id, medium, lora_name
        assert len(token_ids) == len(hashes) * block_size
        self.block_size = block_size
        for i, h in enumerate(hashes):
            tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
            assert h not in self.blocks, "stored twice without a removal"
            self.blocks[h] = (parent, tokens)
            self.by_content[parent, tokens] = h
            parent = h

    def longest_prefix(self, token_ids: Sequence[int]) -> int:
        """Blocks of token_ids this pod holds from the start (the precise scorer's question)."""
        parent: int | None = None
        bs, n = self.block_size, 0
        while bs and (n + 1) * bs <= len(token_ids):
            h = self.by_content.get((parent, tuple(token_ids[n * bs : (n + 1) * bs])))
            if h is None:
                break
            parent, n = h, n + 1
        return n


class Subscriber:
    """A SUB socket on a publisher, and a DEALER for its replay socket (the llm-d router's pair)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, rcvhwm: int = 1000, rcvbuf: int = -1) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.RCVBUF, rcvbuf)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.batches: dict[int, bytes] = {}  # seq -> payload, live or replayed
        self.live_seqs: list[int] = []
        self.topics: set[bytes] = set()

    def read_live(self, timeout_ms: int = 0) -> int:
        """Take the batches waiting on the SUB socket (waiting up to timeout_ms for the first); how many."""
        n = 0
        while self.sub.poll(timeout_ms if n == 0 else 0):
            topic, seq, payload = self.sub.recv_multipart()
            self.topics.add(topic)
            self.batches[int.from_bytes(seq, "big")] = payload
            self.live_seqs.append(int.from_bytes(seq, "big"))
            n += 1
        return n

    def replay(self, start: int | bytes) -> list[int]:
        """Ask for the batches from `start` on (raw bytes: a malformed request); their numbers, as sent."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", start if isinstance(start, bytes) else start.to_bytes(8, "big")])
        seqs: list[int] = []
        try:
            while True:
                assert dealer.poll(30_000), "the replay socket did not answer"
                empty, topic, seq_bytes, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                assert empty == b""
                if seq == END_SEQ:
                    assert topic == payload == b""
                    return seqs
                self.topics.add(topic)
                self.batches[seq] = payload
                seqs.append(seq)
        finally:
            dealer.close(linger=0)

    def catch_up(self, last_seq: int, timeout_s: float = 60) -> None:
        """Read live batches and replay what is missing until `last_seq` is in, then fill the gaps before it from
        the replay socket (those it still holds), answer after answer."""
        deadline = time.monotonic() + timeout_s
        while last_seq not in self.batches:
            assert time.monotonic() < deadline, f"batch {last_seq} never arrived (have {sorted(self.batches)[-3:]})"
            if self.read_live(100) == 0 and self.replay_endpoint is not None:
                self.replay(min(seq for seq in range(last_seq + 1) if seq not in self.batches))
        start = next((seq for seq in range(last_seq + 1) if seq not in self.batches), None)
        while start is not None and self.replay_endpoint is not None and (got := self.replay(start)):
            # an answer holds a bounded number of batches: ask again after the last one
            start = next((seq for seq in range(max(got) + 1, last_seq + 1) if seq not in self.batches), None)

    def index(self) -> BlockIndex:
        """The pod's blocks from every batch in order; the numbers must have no gap."""
        seqs = sorted(self.batches)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a sequence gap"
        index = BlockIndex()
        for seq in seqs:
            index.apply(self.batches[seq])
        return index

    def close(self) -> None:
        self.ctx.destroy(linger=0)
