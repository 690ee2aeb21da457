"""Decode steps replayed from CUDA graphs: one launch a step instead of a few hundred.

At start the runner captures a decode-only step (every row one new token that samples) for each of a set of
batch sizes (`capture_sizes`: 1, 2, 4, 8, then every 8 up to max_num_seqs), the largest first so that all
graphs share one memory pool. A decode step of n rows is padded to the next captured size with rows that
write no KV and attend to one slot; the graph replays over the runner's step inputs, which sit at the same
addresses every step (`StepInputs`), and its logits' first n rows are the step's. Steps with prefill chunks
or drafts, or more rows than the largest size, run eagerly. Sampling runs after the replay, eagerly (its
work depends on each row's parameters).

What a graph may capture: the Triton backend's kernels read every per-step value from device tensors
(sequence lengths, block tables, slots), and a decode step's tile choices depend only on its row count. The
PyTorch reference plans its attention on the host each step, so it cannot be captured.

`EagerGraphs` runs the same steps (the padding, the inputs' addresses) without capturing anything: on CUDA
with --no-cuda-graphs (the same rows as with graphs, so the same tokens and logprobs: cuBLAS may pick another
kernel for another row count), and in the CPU tests.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from infer.engine.models import StepInput


logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (and max_num_seqs itself), ascending."""
    sizes = {s for s in (1, 2, 4, 8) if s <= max_num_seqs}
    sizes.update(range(16, max_num_seqs + 1, 8))
    sizes.add(max_num_seqs)
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class GraphStats:
    """What capturing cost: reported in the start-up log and in /metrics."""

    sizes: tuple[int, ...] = ()
    capture_s: float = 0.0
    memory_bytes: int = 0  # the graphs' memory pool (device memory allocated by the capture)


NO_GRAPHS = GraphStats()


class _Replay(Protocol):
    def __call__(self, step: StepInput) -> torch.Tensor: ...  # [size, vocab] fp32


class Row(Protocol):
    """A request's share of a step, as far as graphs care (`runner.SeqWork`)."""

    @property
    def is_decode(self) -> bool: ...


class Forward(Protocol):
    """What graphs need of the runner (`ModelRunner`): its device, the vocabulary, a decode step of padding
    rows to capture over its inputs, and the decode forward pass."""

    @property
    def device(self) -> torch.device: ...

    @property
    def vocab_size(self) -> int: ...

    def padding_step(self, size: int) -> StepInput:
        """A decode step of `size` rows that write no KV, in the runner's step inputs."""
        ...

    def decode_logits(self, step: StepInput) -> torch.Tensor: ...  # [num_tokens, vocab] fp32


class DecodeGraphs:
    """Decode steps of the captured sizes, replayed (see the module's docstring)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"capture sizes must be >= 1, got {list(sizes)}")
        self.sizes = tuple(sorted(set(sizes)))
        self.max_size = self.sizes[-1]
        self.stats = NO_GRAPHS
        self._replays: dict[int, _Replay] = {}
        self.num_replays = 0  # decode steps run from a graph

    def size_for(self, work: Sequence[Row]) -> int | None:
        """The captured size a step runs at, or None when it runs eagerly (not decode-only, or too large)."""
        n = len(work)
        if n == 0 or n > self.max_size or not all(w.is_decode for w in work):
            return None
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def capture(self, runner: Forward) -> None:
        started_s = time.monotonic()
        before = _allocated(runner.device)
        self._capture(runner)
        self.stats = GraphStats(self.sizes, time.monotonic() - started_s, _allocated(runner.device) - before)

    def _capture(self, runner: Forward) -> None:
        pool = None
        stream = torch.cuda.Stream(runner.device)  # type: ignore[no-untyped-call]
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
            step = runner.padding_step(size)
            with torch.inference_mode():
                stream.wait_stream(torch.cuda.current_stream(runner.device))
                with torch.cuda.stream(stream):  # warm-up, outside the graph: compiles the kernels for the size
                    runner.decode_logits(step)
                torch.cuda.current_stream(runner.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = runner.decode_logits(step)
            pool = graph.pool() if pool is None else pool
            self._replays[size] = _CudaReplay(graph, logits)
        torch.cuda.synchronize(runner.device)

    def run(self, size: int, step: StepInput) -> torch.Tensor:  # [size, vocab] fp32
        """The decode step of `size` rows whose inputs `step` views (the runner filled them)."""
        self.num_replays += 1
        return self._replays[size](step)


@dataclass(frozen=True)
class _CudaReplay:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # the graph's output: [size, vocab], rewritten by each replay

    def __call__(self, step: StepInput) -> torch.Tensor:
        self.graph.replay()  # NOTE: `step` views the inputs the graph reads; nothing of it is passed
        return self.logits


class EagerGraphs(DecodeGraphs):
    """The same padded decode steps over the same inputs, run eagerly, without capture: with --no-cuda-graphs on
    CUDA (a step's rows, and so its kernels and its results, are the same whether graphs replay it or not),
    and the CPU tests' stand-in for capture. The logits land in one output buffer, as a graph's output stays
    where it was captured."""

    def _capture(self, runner: Forward) -> None:
        out = torch.empty(self.max_size, runner.vocab_size, dtype=torch.float32, device=runner.device)
        for size in self.sizes:
            self._replays[size] = _EagerReplay(runner, out[:size])


@dataclass(frozen=True)
class _EagerReplay:
    runner: Forward
    out: torch.Tensor  # [size, vocab] fp32

    def __call__(self, step: StepInput) -> torch.Tensor:
        return self.out.copy_(self.runner.decode_logits(step))


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def graphs_for(device: torch.device, kernels: str, enabled: bool, max_num_seqs: int) -> DecodeGraphs | None:
    """An engine's decode graphs: on CUDA with the Triton kernels, captured when `enabled`, else the same padded
    steps run eagerly (so that graphs on and off give the same tokens); none elsewhere."""
    if device.type != "cuda":
        return None
    if kernels != "triton":
        logger.warning("CUDA graphs: off (the %s kernels plan attention on the host each step; Triton's do not)",
                       kernels)  # fmt: skip
        return None
    sizes = capture_sizes(max_num_seqs)
    return DecodeGraphs(sizes) if enabled else EagerGraphs(sizes)
