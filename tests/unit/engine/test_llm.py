"""The offline API on the fake engine: batches larger than the queue, and calls that fail or stop early."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch

from infer.engine.llm import LLM
from infer.engine.request import FinishReason
from infer.engine.runner import SeqWork
from infer.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import FakeRunner, fake_core

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture
def fake() -> Iterator[tuple[LLM, FakeRunner]]:
    core, runner = fake_core(max_waiting_requests=2, max_num_seqs=2)
    yield LLM.from_core(core), runner
    assert not core.has_work
    core.block_manager.assert_no_leaks()


def _expected(runner: FakeRunner, prompt: Sequence[int]) -> list[int]:
    return [runner.token_at(len(prompt) + i) for i in range(GREEDY.max_tokens)]


def test_a_batch_larger_than_the_queue_is_fed_as_room_frees_up(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    prompts = [[3 + i, 4, 5][: 1 + i % 3] for i in range(7)]  # 7 prompts for a queue of 2
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == [_expected(runner, p) for p in prompts]
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs)
    assert [o.text for o in llm.generate(["d"], GREEDY)] == [llm.tokenizer.decode(_expected(runner, [0]))]


def test_text_prompts_beyond_the_queue_then_another_call(fake: tuple[LLM, FakeRunner]) -> None:
    llm, _ = fake
    assert len(llm.generate(["a", "b", "c"], GREEDY)) == 3  # raised QueueFullError before
    (out,) = llm.generate(["d"], GREEDY)  # and every later call raised too
    assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 4


class _Interrupted(FakeRunner):
    """Ctrl-C during the second forward pass (a BaseException: the engine's isolation does not catch it)."""

    def execute(self, work: Sequence[SeqWork]) -> torch.Tensor:
        if len(self.calls) == 1:
            self.calls.append(list(work))
            raise KeyboardInterrupt
        return super().execute(work)


def test_a_failed_call_leaves_nothing_behind(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    interrupted = _Interrupted(runner.text_ids, runner.eos_id, runner.vocab_size, runner.num_blocks)
    llm.core.runner = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[3, 4, 5]] * 5, GREEDY)
    assert not llm.core.has_work and llm.core.num_queued == 0
    assert llm.core.block_manager.num_used_blocks == 0
    outputs = llm.generate([[3, 4, 5]] * 3, GREEDY)  # the LLM goes on as new
    assert [o.token_ids for o in outputs] == [_expected(runner, [3, 4, 5])] * 3


def test_a_stream_closed_early_aborts_its_request(fake: tuple[LLM, FakeRunner]) -> None:
    llm, _ = fake
    stream = llm.stream([3, 4, 5], SamplingParams(max_tokens=50, ignore_eos=True))
    first = next(stream)
    assert first.token_ids and not first.finished
    stream.close()
    assert not llm.core.has_work and llm.core.block_manager.num_used_blocks == 0
