"""CPU threads that follow the cores the machine leaves the engine (`cpu_threads: 0`, the default).

A parallel region on 2 OpenMP threads ends when its slower thread does. When another process keeps one of the
2 cores busy, the thread sharing that core runs in the scheduler's time slices (milliseconds) while a region
lasts tens of microseconds, so every region waits a slice: measured on this project's 2-core machines, a
busy loop beside the server cut one-stream decoding to 0.13-0.36x of its solo rate at 2 threads, while 1
thread kept 0.68-1.0x (docs/benchmarks/contention.md). So the engine runs on as many threads as there are
cores nobody else is using, never more than it started with:

- every `interval_s` of stepping, it reads the busy time of the CPUs it may run on (/proc/stat: user, nice,
  system, irq, softirq and steal, which is a VM neighbour's share) and its own process's CPU time
  (/proc/self/stat); the difference over the window is what others used, in cores;
- threads = the free cores (those CPUs less what others used) rounded to the nearest whole core, at least 1,
  at most the starting count (torch's, which follows OMP_NUM_THREADS) and the cgroup CPU quota;
- fewer threads take effect at once (a collapse costs more than a window at fewer threads); more need two
  windows in a row that agree, so a neighbour's short pause does not flip it.

The thread count never changes what is computed: every kernel splits its work by output (rows, channels,
sequences), never a reduction, so the tokens are the same at 1 and 2 threads (tests/unit/engine/test_threads.py).
On a machine without /proc (not Linux) the count stays fixed.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from infer.engine.config import EngineConfig

logger = logging.getLogger(__name__)

INTERVAL_S = 0.5
_PROC_STAT = Path("/proc/stat")
_PROC_SELF_STAT = Path("/proc/self/stat")
_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_DIR = Path("/sys/fs/cgroup/cpu")


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # monotonic clock
    busy_s: float  # busy time of the CPUs this process may run on, summed over them
    own_s: float  # this process's CPU time, every thread


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where the platform has none)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def parse_busy_ticks(proc_stat: str, cpus: frozenset[int]) -> int:
    """Clock ticks the `cpus` spent busy, from /proc/stat's per-CPU lines (idle and iowait are not busy)."""
    total = 0
    for line in proc_stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal (guest time is already inside user)
        ticks = [int(v) for v in rest.split()[:8]]
        total += sum(ticks[:3]) + sum(ticks[5:8])
    return total


def parse_own_ticks(proc_self_stat: str) -> int:
    """utime + stime of /proc/self/stat (after the command name, which may hold spaces and parentheses)."""
    fields = proc_self_stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def read_sample(cpus: frozenset[int], clock: Callable[[], float] = time.monotonic) -> CpuSample | None:
    """This moment's CPU times, or None where /proc cannot be read."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        busy = parse_busy_ticks(_PROC_STAT.read_text(), cpus)
        own = parse_own_ticks(_PROC_SELF_STAT.read_text())
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(clock(), busy / hz, own / hz)


def quota_cores(v2_max: Path = _CGROUP_V2_MAX, v1_dir: Path = _CGROUP_V1_DIR) -> float | None:
    """The cgroup's CPU quota in cores (cgroup v2 cpu.max or v1 cfs_quota_us / cfs_period_us); None without one."""
    try:
        if v2_max.is_file():
            quota, _, period = v2_max.read_text().partition(" ")
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((v1_dir / "cpu.cfs_quota_us").read_text())
        return None if quota_us <= 0 else quota_us / int((v1_dir / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def choose_threads(free_cores: float, max_threads: int) -> int:
    """The free cores rounded to the nearest whole one, within [1, max_threads]."""
    return max(1, min(max_threads, math.floor(free_cores + 0.5)))


class ThreadGovernor:
    """Sets torch's thread count (which the compiled kernels follow) from what other processes leave free.

    `tick()` runs on the thread that runs the model, between steps: OpenMP's thread count is per thread."""

    def __init__(
        self,
        max_threads: int,
        cpus: frozenset[int],
        interval_s: float = INTERVAL_S,
        read: Callable[[frozenset[int]], CpuSample | None] = read_sample,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads, self.cpus, self.interval_s = max_threads, cpus, interval_s
        self._read, self._set, self._clock = read, set_threads, clock
        self.threads = max_threads
        self.changes = 0  # how many times the count changed
        self._last = read(cpus)
        self._rise_to = 0  # a larger count the last window asked for (0: none)

    @classmethod
    def for_machine(cls) -> ThreadGovernor | None:
        """A governor up to torch's thread count and the cgroup quota; None where there is nothing to govern."""
        cpus, quota = allowed_cpus(), quota_cores()
        most = torch.get_num_threads()
        if quota is not None:
            most = min(most, max(1, math.floor(quota)))  # NOTE: 2 threads in 1.5 cores get throttled mid-region
        if most < 2 or read_sample(cpus) is None:
            return None
        return cls(most, cpus)

    def tick(self) -> None:
        if self._last is None:
            return
        if self._clock() - self._last.wall_s < self.interval_s:
            return
        sample = self._read(self.cpus)
        if sample is None:
            return
        last, self._last = self._last, sample
        wall = sample.wall_s - last.wall_s
        others = max(0.0, (sample.busy_s - last.busy_s) - (sample.own_s - last.own_s)) / wall
        self._decide(choose_threads(len(self.cpus) - others, self.max_threads), others)

    def _decide(self, target: int, others: float) -> None:
        if target < self.threads or (target > self.threads and self._rise_to == target):
            self._apply(target, others)
        self._rise_to = target if target > self.threads else 0

    def _apply(self, threads: int, others: float) -> None:
        logger.info("CPU threads %d -> %d: other processes used %.2f of %d cores", self.threads, threads, others,
                    len(self.cpus))  # fmt: skip
        self._set(threads)
        self.threads = threads
        self.changes += 1


def set_fixed_threads(config: EngineConfig, device: torch.device) -> None:
    """A fixed `cpu_threads` takes effect (torch's count, which the compiled kernels follow)."""
    if device.type == "cpu" and config.cpu_threads > 0:
        torch.set_num_threads(config.cpu_threads)


def governor_for(config: EngineConfig, device: torch.device) -> ThreadGovernor | None:
    """The governor a server's engine steps with: on the CPU when `cpu_threads` is 0 (None otherwise, or where
    there is nothing to govern). The offline API does not govern: its caller's process owns torch's threads."""
    if device.type != "cpu" or config.cpu_threads > 0:
        return None
    return ThreadGovernor.for_machine()
