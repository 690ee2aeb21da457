"""The CPU thread governor (engine/threads.py): /proc parsing, the cgroup quota, its decisions, and that the thread
count never changes the tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from infer import LLM, SamplingParams
from infer.engine.config import EngineConfig
from infer.engine.threads import (
    CpuSample,
    ThreadGovernor,
    allowed_cpus,
    choose_threads,
    governor_for,
    parse_busy_ticks,
    parse_own_ticks,
    quota_cores,
    read_sample,
)

PROC_STAT = """cpu  300 10 60 900 5 0 2 3 0 0
cpu0 100 5 30 500 4 0 1 2 0 0
cpu1 200 5 30 400 1 0 1 1 0 0
intr 12345
ctxt 999
"""


def test_busy_ticks_of_the_allowed_cpus_only() -> None:
    # user + nice + system + irq + softirq + steal; idle and iowait are not busy
    assert parse_busy_ticks(PROC_STAT, frozenset({0})) == 100 + 5 + 30 + 0 + 1 + 2
    assert parse_busy_ticks(PROC_STAT, frozenset({1})) == 200 + 5 + 30 + 0 + 1 + 1
    assert parse_busy_ticks(PROC_STAT, frozenset({0, 1, 7})) == 138 + 237


def test_own_ticks_after_a_command_name_with_spaces_and_parentheses() -> None:
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "111", "22", "0", "0"]
    assert parse_own_ticks(f"1234 (py (x) y) {' '.join(fields)}") == 111 + 22


def test_this_machine_is_readable() -> None:
    first = read_sample(allowed_cpus())
    assert first is not None
    sum(i * i for i in range(200_000))  # some CPU time of our own
    second = read_sample(allowed_cpus())
    assert second is not None and second.wall_s > first.wall_s
    assert second.busy_s >= first.busy_s and second.own_s >= first.own_s


def test_cgroup_quota_v2_and_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "cpu.max"
    v2.write_text("150000 100000\n")
    assert quota_cores(v2, tmp_path / "none") == 1.5
    v2.write_text("max 100000\n")
    assert quota_cores(v2, tmp_path / "none") is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert quota_cores(tmp_path / "absent", v1) is None
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    assert quota_cores(tmp_path / "absent", v1) == 2.0
    assert quota_cores(tmp_path / "absent", tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("free", "most", "threads"), [(2.0, 2, 2), (1.6, 2, 2), (1.4, 2, 1), (0.2, 2, 1), (0.0, 4, 1), (7.9, 4, 4)]
)
def test_free_cores_round_to_threads(free: float, most: int, threads: int) -> None:
    assert choose_threads(free, most) == threads


class FakeMachine:
    """Two CPUs; others_cores of them busy with other processes, our process using the rest."""

    def __init__(self) -> None:
        self.now, self.busy, self.own, self.others_cores, self.reads = 0.0, 0.0, 0.0, 0.0, 0
        self.threads: list[int] = []

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.busy += 2 * seconds  # both CPUs always busy
        self.own += (2 - self.others_cores) * seconds

    def read(self, cpus: frozenset[int]) -> CpuSample:
        self.reads += 1
        return CpuSample(self.now, self.busy, self.own)


def governor(machine: FakeMachine) -> ThreadGovernor:
    return ThreadGovernor(
        2, frozenset({0, 1}), 0.5, read=machine.read, set_threads=machine.threads.append, clock=lambda: machine.now
    )


def test_a_busy_neighbour_takes_a_thread_at_once_and_its_leaving_gives_it_back_after_two_windows() -> None:
    machine = FakeMachine()
    gov = governor(machine)
    machine.others_cores = 1.0
    machine.advance(0.2)
    gov.tick()  # inside the window: nothing read
    assert (machine.reads, gov.threads) == (1, 2)
    machine.advance(0.4)
    gov.tick()
    assert gov.threads == 1 and machine.threads == [1]
    machine.others_cores = 0.0
    machine.advance(0.6)
    gov.tick()  # one window of free cores: not yet
    assert gov.threads == 1
    machine.advance(0.6)
    gov.tick()
    assert gov.threads == 2 and machine.threads == [1, 2]


def test_a_short_pause_of_the_neighbour_does_not_flip_the_count() -> None:
    machine = FakeMachine()
    gov = governor(machine)
    for others in (1.0, 0.0, 1.0, 0.0, 1.0):
        machine.others_cores = others
        machine.advance(0.6)
        gov.tick()
    assert machine.threads == [1]


def test_two_busy_neighbours_leave_one_thread() -> None:
    machine = FakeMachine()
    gov = governor(machine)
    machine.others_cores = 2.0
    machine.advance(0.6)
    gov.tick()
    assert gov.threads == 1


def test_only_a_servers_cpu_engine_with_cpu_threads_0_is_governed() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert governor_for(EngineConfig(cpu_threads=2), cpu) is None
    assert governor_for(EngineConfig(), cuda) is None
    expected = (os.cpu_count() or 1) >= 2 and torch.get_num_threads() >= 2
    assert (governor_for(EngineConfig(), cpu) is not None) == expected


def test_cpu_threads_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads=-1)


@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_the_tokens_and_logprobs_do_not_depend_on_the_thread_count(default_model_dir: Path, quantization: str) -> None:
    # the governor changes the count between steps: a kernel that split a reduction by thread would change tokens
    llm = LLM(str(default_model_dir), max_model_len=256, quantization=quantization)
    prompts = [list(range(300, 300 + n)) for n in (5, 40, 77)]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=3, ignore_eos=True)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs = llm.generate(prompts, params)
            runs.append([(o.token_ids, o.logprobs) for o in outs])  # each logprob with its top 3
    finally:
        torch.set_num_threads(before)
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("quota", "expected"), [(None, 2), (1.5, None), (2.0, 2), (0.5, None)])
def test_the_cgroup_quota_bounds_the_threads(
    monkeypatch: pytest.MonkeyPatch, quota: float | None, expected: int | None
) -> None:
    # whole cores of the quota: 2 threads in 1.5 cores are throttled mid-region; one thread leaves nothing to govern
    from infer.engine import threads

    monkeypatch.setattr(threads, "quota_cores", lambda: quota)
    monkeypatch.setattr(threads, "allowed_cpus", lambda: frozenset({0, 1}))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    gov = ThreadGovernor.for_machine()
    assert (gov.max_threads if gov else None) == expected
