"""What other threads read from the engine core: the snapshot it publishes after each step, never the scheduler.

Metrics (`stats()`), deadline admission (`predict_ttft_s`) and the queue bound are read by the server's
threads while the core steps on its own; each read must be one whole published state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from infer.engine.async_engine import AsyncEngine
from infer.engine.core import EngineCore
from infer.engine.cuda_graphs import GraphStats
from infer.engine.input_processor import Prompt
from infer.engine.request import RequestOutput
from infer.engine.runner import SeqWork
from infer.engine.sampling_params import SamplingParams
from infer.engine.stats import EngineStats
from tests.helpers.fake_engine import fake_core

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


class _Tripwire:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"read the live {name!r} of the step loop's state")


def _run(core: EngineCore) -> None:
    while core.has_work:
        core.step()


def test_stats_never_read_the_scheduler_or_the_block_pool() -> None:
    core, _ = fake_core()
    outputs: list[RequestOutput] = []
    core.add_request("running", list(range(3, 23)), GREEDY, outputs.append)
    core.step()
    core.add_request("queued", [5, 6, 7], GREEDY, outputs.append)
    scheduler, blocks = core.scheduler, core.block_manager
    core.scheduler, core.block_manager = _Tripwire(), _Tripwire()  # type: ignore[assignment]
    try:
        stats = core.stats()
        predicted_s = core.predict_ttft_s(4)
        num_queued = core.num_queued
    finally:
        core.scheduler, core.block_manager = scheduler, blocks
    assert (stats.num_running, stats.num_waiting, num_queued) == (1, 1, 1)
    assert stats.num_blocks_used == 2 and stats.queued_tokens == 1 + 3  # running's next token, queued's prompt
    assert predicted_s == (stats.queued_tokens + 4) / stats.tokens_per_s
    _run(core)
    assert len([o for o in outputs if o.finished]) == 2


def test_stats_during_a_step_show_the_last_published_step() -> None:
    core, runner = fake_core()
    outputs: list[RequestOutput] = []
    for i, prompt in enumerate(([3, 4, 5, 6], [7, 8])):
        core.add_request(f"r{i}", prompt, GREEDY, outputs.append)
    before = core.stats()
    seen: list[EngineStats] = []
    execute = runner.execute

    def spying(work: Sequence[SeqWork]) -> torch.Tensor:
        seen.append(core.stats())  # the scheduler has admitted both by now; nothing is published yet
        return execute(work)

    runner.execute = spying  # type: ignore[method-assign]
    core.step()
    assert (before.num_waiting, before.num_running, before.queued_tokens) == (2, 0, 6)
    assert seen == [before]  # each request counted once, as waiting, as at the last published state
    after = core.stats()
    assert (after.num_waiting, after.num_running, after.num_steps, after.queued_tokens) == (0, 2, 1, 2)
    assert after.num_blocks_used == 2
    _run(core)


def test_stats_from_another_thread_while_steps_run_are_whole_states() -> None:
    # a small pool and budget: chunked prefills, preemptions, requests arriving and leaving all the time
    core, _ = fake_core(num_blocks=16, max_model_len=128, max_num_batched_tokens=32)
    engine = AsyncEngine(core)
    reads: list[EngineStats] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                reads.append(core.stats())
            except BaseException as e:
                errors.append(e)
            stop.wait(0.0002)

    reader = threading.Thread(target=read)
    reader.start()
    finals: list[RequestOutput] = []
    done = threading.Event()
    num_requests = 24

    def sink(out: RequestOutput) -> None:
        if out.finished:
            finals.append(out)
            if len(finals) == num_requests:
                done.set()

    try:
        for i in range(num_requests):
            core.add_request(f"r{i}", list(range(3, 3 + 5 + 3 * i)), GREEDY, sink)
        assert done.wait(30)
    finally:
        stop.set()
        reader.join(10)
        engine.shutdown()
    assert not errors and len(reads) > 10
    for s in reads:
        assert s.num_blocks_used + s.num_blocks_free == 16
        assert 0 <= s.num_waiting + s.num_running <= num_requests
        assert (s.num_running == 0) == (s.num_blocks_used == 0)  # running requests hold blocks, nobody else
    totals = [s.num_generation_tokens_total for s in reads]
    assert totals == sorted(totals)
    assert core.stats().num_generation_tokens_total == num_requests * GREEDY.max_tokens
    core.block_manager.assert_no_leaks()


def test_the_snapshot_counts_the_tenants_the_fair_policy_tracks() -> None:
    core, _ = fake_core(scheduling_policy="fair")
    for i in range(3):
        core.submit(f"r{i}", core.processor.process(Prompt(token_ids=[5, 6]), SamplingParams(max_tokens=4)),
                    lambda out: None, tenant=f"t{i}")  # fmt: skip
    core.step()
    assert core.stats().num_tenants_tracked == 3  # read 0: the snapshot did not carry the policy's count


def test_the_snapshot_counts_the_steps_and_their_busy_time() -> None:
    core, _ = fake_core()
    core.submit("r", core.processor.process(Prompt(token_ids=[5, 6]), SamplingParams(max_tokens=4)), lambda out: None)
    started_s = time.monotonic()
    while core.has_work:
        core.step()
    wall_s = time.monotonic() - started_s
    stats = core.stats()
    assert stats.num_steps == 4  # a prefill and three decodes
    assert 0 < stats.step_s_total <= wall_s  # read 0: the snapshot did not carry the steps' time


def test_a_steps_busy_time_counts_its_scheduling() -> None:
    """A policy that takes long to decide costs busy time: what the tenants goal's tokens per busy second read."""
    core, _ = fake_core()
    schedule = core.scheduler.schedule

    def slow(now_s: float, drafts: Any = None) -> Any:
        time.sleep(0.02)
        return schedule(now_s, drafts)

    core.scheduler.schedule = slow  # type: ignore[method-assign]
    core.submit("r", core.processor.process(Prompt(token_ids=[5, 6]), SamplingParams(max_tokens=3)), lambda out: None)
    while core.has_work:
        core.step()
    stats = core.stats()
    assert stats.num_steps == 3 and stats.step_s_total >= 3 * 0.02  # read the forward passes' time alone before


def test_the_snapshot_reports_the_cuda_graphs_captured_at_start() -> None:
    core, _ = fake_core()
    assert (core.stats().cuda_graphs, core.stats().cuda_graph_memory_bytes) == (0, 0)  # none on the CPU
    core.model_info = replace(core.model_info, cuda_graphs=GraphStats((1, 2, 4, 8), 1.25, 3 << 20))
    core.step()  # a snapshot is published after each step
    stats = core.stats()
    assert (stats.cuda_graphs, stats.cuda_graph_capture_s, stats.cuda_graph_memory_bytes) == (4, 1.25, 3 << 20)
