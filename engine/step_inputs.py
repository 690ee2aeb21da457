"""A step's inputs in one buffer on the model's device, at places fixed at start: one host-to-device copy a step.

Every integer and float a forward pass and its sampler read (token ids, positions, KV slots, block tables,
sequence starts and lengths, the rows that sample and each sampled row's temperature, top-k, top-p and
min-p) has a region of its own in one byte buffer. A step writes the host copy (numpy views of a pinned
buffer), sends it in one non-blocking copy, and reads device views that start at the same address every
step: a decode step replayed from a CUDA graph reads its inputs where the graph was captured. On the CPU
the host buffer is the device buffer (no copy at all).

Each region has room for the largest step sized at start; a step that needs more grows every region (new
storage: never while CUDA graphs hold the old addresses, which `freeze` forbids).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

_ALIGN = 64  # bytes between regions: each starts aligned for any dtype and a vector load


@dataclass(frozen=True)
class Region:
    name: str
    dtype: torch.dtype
    size: int  # items
    offset: int = 0  # bytes from the buffer's start

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def _layout(max_tokens: int, max_seqs: int, max_blocks_per_seq: int) -> tuple[list[Region], int]:
    """The regions, in order, with room for a step of `max_tokens` tokens over `max_seqs` sequences; and the
    buffer's size in bytes."""
    regions = [
        Region("input_ids", torch.int64, max_tokens),
        Region("positions", torch.int64, max_tokens),
        Region("slot_mapping", torch.int64, max_tokens),
        Region("sample_rows", torch.int64, max_tokens),  # rows of the flat batch that sample
        Region("drawn", torch.int64, max_tokens),  # sampling rows that draw (not greedy)
        Region("top_k", torch.int64, max_tokens),  # of the drawing rows, in `drawn` order (so below too)
        Region("temperature", torch.float32, max_tokens),
        Region("top_p", torch.float32, max_tokens),
        Region("min_p", torch.float32, max_tokens),
        Region("query_start_loc", torch.int32, max_seqs + 1),
        Region("seq_lens", torch.int32, max_seqs),
        Region("block_tables", torch.int32, max_seqs * max_blocks_per_seq),
    ]
    placed, offset = [], 0
    for r in regions:
        placed.append(replace(r, offset=offset))
        offset += -(-r.nbytes // _ALIGN) * _ALIGN
    return placed, offset


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class StepInputs:
    """The regions of one step's inputs (see the module's docstring); write a region's `host` copy, `send`
    once, then read its `view` on the device."""

    def __init__(
        self, device: torch.device, max_tokens: int = 256, max_seqs: int = 64, max_blocks_per_seq: int = 16
    ) -> None:
        self.device = device
        self.frozen = False
        self._allocate(max_tokens, max_seqs, max_blocks_per_seq)

    def _allocate(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int) -> None:
        self.max_tokens, self.max_seqs, self.max_blocks_per_seq = max_tokens, max_seqs, max_blocks_per_seq
        regions, nbytes = _layout(max_tokens, max_seqs, max_blocks_per_seq)
        self.regions = {r.name: r for r in regions}
        on_cpu = self.device.type == "cpu"
        # NOTE: pinned host memory: the copy runs without staging and without blocking the host
        self.host_buffer = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=not on_cpu and torch.cuda.is_available())
        self.buffer = self.host_buffer if on_cpu else torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        raw = self.host_buffer.numpy()
        self._host_views = {r.name: raw[r.offset : r.offset + r.nbytes].view(_NUMPY[r.dtype]) for r in regions}
        self._device_views = {r.name: self.buffer[r.offset : r.offset + r.nbytes].view(r.dtype) for r in regions}

    def reserve(self, num_tokens: int, num_seqs: int, blocks_per_seq: int) -> None:
        """Room for a step of this size: every region grown (to twice what is asked) when one is too small."""
        if num_tokens <= self.max_tokens and num_seqs <= self.max_seqs and blocks_per_seq <= self.max_blocks_per_seq:
            return
        if self.frozen:
            raise RuntimeError(
                f"a step of {num_tokens} tokens, {num_seqs} sequences and {blocks_per_seq} blocks a sequence does "
                f"not fit the inputs sized at start ({self.max_tokens}, {self.max_seqs}, {self.max_blocks_per_seq})"
            )
        self._allocate(
            max(self.max_tokens, 2 * num_tokens),
            max(self.max_seqs, 2 * num_seqs),
            max(self.max_blocks_per_seq, 2 * blocks_per_seq),
        )

    def freeze(self) -> None:
        """From now on the regions never move (CUDA graphs read them where they are)."""
        self.frozen = True

    def host(self, name: str) -> np.ndarray[tuple[int], np.dtype[np.generic]]:
        """The region's host copy, to write this step's values into."""
        return self._host_views[name]

    def view(self, name: str) -> torch.Tensor:
        """The region on the model's device (valid once `send` has run this step)."""
        return self._device_views[name]

    def send(self) -> None:
        """The host copy to the device: one non-blocking copy of the whole buffer (nothing on the CPU)."""
        if self.buffer is not self.host_buffer:
            self.buffer.copy_(self.host_buffer, non_blocking=True)
