"""EngineCore's step loop on a fake runner: scheduling, sampling, stopping and failure isolation, no weights.

The fake model predicts TEXT's token at each position (see tests/helpers/fake_engine.py), so every request's
expected output is known whatever the batch. The same behaviours on the real default model are in
test_core_default_model.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

from infer.engine.core import EngineCore, QueueFullError
from infer.engine.llm import LLM
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import TEXT, FakeRunner, fake_core

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[LLM, FakeRunner]]:
    core, runner = fake_core(**getattr(request, "param", {}))
    yield LLM.from_core(core), runner
    assert not core.has_work
    core.block_manager.assert_no_leaks()  # every test ends with every block free


@pytest.fixture
def llm(fake: tuple[LLM, FakeRunner]) -> LLM:
    return fake[0]


def _text_ids(llm: LLM) -> list[int]:
    return llm.tokenizer.encode(TEXT)


def _prompts() -> list[list[int]]:
    """12 prompts of 1 to 70 tokens: random ids, so only the positions decide what the fake model predicts."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (1 + (i * 29) % 70,), generator=g).tolist() for i in range(12)]


def _expected(llm: LLM, runner: FakeRunner, prompt: list[int], max_tokens: int) -> list[int]:
    return [runner.token_at(len(prompt) + i) for i in range(max_tokens)]


def test_greedy_continues_the_text_then_stops_at_eos(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    ids = _text_ids(llm)
    out = llm.generate([ids[:5]], SamplingParams(max_tokens=200, temperature=0))[0]
    assert out.token_ids == [*ids[5:], runner.eos_id]
    assert out.text == llm.tokenizer.decode(ids[5:])
    assert out.finish_reason is FinishReason.STOP


@pytest.mark.parametrize(
    "fake",
    [
        {},
        {"max_num_batched_tokens": 16},  # chunked prefill: long prompts take several steps
        {"batching": "static", "max_num_seqs": 4},
        {"kv_reserve": "full", "max_model_len": 128},
        {"enable_prefix_caching": False},
        {"num_blocks": 16, "max_model_len": 128},  # too small for all at once: preemption
    ],
    indirect=True,
    ids=["continuous", "chunk16", "static", "full-reserve", "no-prefix-cache", "preempting"],
)
def test_every_request_gets_its_own_tokens_whatever_the_batching(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    outputs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outputs] == [_expected(llm, runner, p, 8) for p in _prompts()]
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs)
    if llm.core.config.num_blocks == 16:
        assert sum(o.timings.num_preemptions for o in outputs if o.timings) > 0


def test_one_forward_pass_mixes_decodes_and_prefill_chunks(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    llm.generate(_prompts()[:6], GREEDY)
    mixed = [call for call in runner.calls if {len(w.token_ids) == 1 for w in call} == {True, False}]
    assert mixed, "no step ran decodes and prefill chunks together"
    for call in runner.calls:
        assert sum(len(w.token_ids) for w in call) <= llm.core.config.max_num_batched_tokens


def test_stop_string_split_across_tokens(llm: LLM) -> None:
    ids = _text_ids(llm)
    pieces = [llm.tokenizer.decode([t]) for t in ids]
    i = pieces.index("cap")  # "cap" + "it": a stop string made of the end of one token and the start of the next
    out = llm.generate([ids[:3]], SamplingParams(max_tokens=40, temperature=0, stop=["api"]))[0]
    assert out.finish_reason is FinishReason.STOP
    assert out.text == llm.tokenizer.decode(ids[3:i]) + "c"
    assert "api" not in out.text


def test_stop_token_ids_and_eos_end_the_request_without_text(llm: LLM) -> None:
    ids = _text_ids(llm)
    out = llm.generate([ids[:3]], SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[ids[6]]))[0]
    assert out.token_ids == ids[3:7] and out.finish_reason is FinishReason.STOP
    assert out.text == llm.tokenizer.decode(ids[3:6])
    near_end = llm.generate([ids[:-2]], SamplingParams(max_tokens=40, temperature=0))[0]
    assert near_end.token_ids[-1] in llm.core.eos_token_ids and len(near_end.token_ids) == 3


def test_min_tokens_holds_back_eos(llm: LLM) -> None:
    ids = _text_ids(llm)
    longer = llm.generate([ids[:-2]], SamplingParams(max_tokens=10, temperature=0, min_tokens=6))[0]
    assert len(longer.token_ids) >= 6
    assert not set(longer.token_ids[:6]) & llm.core.eos_token_ids


def test_max_model_len_ends_a_request_with_length(fake: tuple[LLM, FakeRunner]) -> None:
    llm, _ = fake
    prompt = list(range(3, 3 + 250))
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 6 and out.finish_reason is FinishReason.LENGTH


def test_logprobs_are_returned_per_token(llm: LLM) -> None:
    out = llm.generate([[5, 6]], SamplingParams(max_tokens=3, temperature=0, logprobs=2, ignore_eos=True))[0]
    assert out.logprobs is not None and len(out.logprobs) == 3
    for token_id, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == token_id and lp.logprob <= 0
        assert len(lp.top) == 2 and lp.top[0][0] == token_id  # greedy: the sampled token is the most likely


def test_seeded_sampling_is_the_same_whatever_the_batch(llm: LLM) -> None:
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    other = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    alone = llm.generate([[7, 8, 9]], seeded)[0].token_ids
    crowd = llm.generate([[7, 8, 9], [4], [10, 11], [7, 8, 9]], [seeded, other, other, other])
    assert crowd[0].token_ids == alone
    assert crowd[3].token_ids != alone  # same prompt, no seed: a different draw


def test_usage_timings_and_prefix_cache_hits(llm: LLM) -> None:
    prompt = list(range(3, 43))  # 40 tokens: two full blocks of 16 may be reused
    first, second = (llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0))[0] for _ in range(2))
    assert first.usage is not None and second.usage is not None and first.timings is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.cached_tokens) == (40, 5, 0)
    assert second.usage.cached_tokens == 32 and second.token_ids == first.token_ids
    assert 0 <= first.timings.queue_s <= first.timings.ttft_s <= first.timings.total_s


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], SamplingParams(), "prompt"),
        ([5], SamplingParams(max_tokens=10_000), "max_tokens"),
        ([10**9], SamplingParams(), "token_ids"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_enqueued(
    llm: LLM, prompt: list[int], params: SamplingParams, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        llm.generate([prompt], params)
    assert not llm.core.has_work


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens")],
)
def test_out_of_range_parameters_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_failing_request_fails_alone(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    runner.poison = {299}
    outs = llm.generate([[5, 6, 7], [8, 299, 9], [10, 11]], GREEDY)
    assert outs[1].finish_reason is FinishReason.ERROR
    assert outs[1].error is not None and "poisoned" in outs[1].error
    assert [o.finish_reason for o in (outs[0], outs[2])] == [FinishReason.LENGTH] * 2
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in (outs[0], outs[2]))


def _run(core: EngineCore) -> None:
    while core.has_work:
        core.step()


@pytest.mark.parametrize("fake", [{"max_waiting_requests": 2}], indirect=True)
def test_full_queue_is_refused_at_once(llm: LLM) -> None:
    outputs: list[RequestOutput] = []
    for i in range(2):
        llm.core.add_request(f"q{i}", [1, 2, 3], GREEDY, outputs.append)
    with pytest.raises(QueueFullError, match="max_waiting_requests"):
        llm.core.add_request("q2", [1, 2, 3], GREEDY, outputs.append)
    _run(llm.core)
    assert sum(o.finished for o in outputs) == 2


def test_a_request_id_in_flight_is_refused_and_free_again_when_done(llm: LLM) -> None:
    outputs: list[RequestOutput] = []
    llm.core.add_request("same", [1, 2, 3], GREEDY, outputs.append)
    with pytest.raises(ValueError, match="already in flight"):
        llm.core.add_request("same", [4], GREEDY, outputs.append)
    _run(llm.core)
    llm.core.add_request("same", [4], GREEDY, outputs.append)
    _run(llm.core)
    assert sum(o.finished for o in outputs) == 2


def test_abort_ends_the_request_and_frees_its_blocks(llm: LLM) -> None:
    outputs: list[RequestOutput] = []
    llm.core.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=50, ignore_eos=True), outputs.append)
    llm.core.step()
    assert llm.core.block_manager.num_used_blocks > 0
    llm.core.abort("a")
    llm.core.step()
    assert outputs[-1].finish_reason is FinishReason.ABORT and not llm.core.has_work


def test_fail_all_ends_every_live_request(llm: LLM) -> None:
    outputs: list[RequestOutput] = []
    for i in range(3):
        llm.core.add_request(f"r{i}", [3 + i, 4], SamplingParams(max_tokens=50, ignore_eos=True), outputs.append)
    llm.core.step()
    llm.core.fail_all(RuntimeError("the step loop broke"))
    finals = [o for o in outputs if o.finished]
    assert len(finals) == 3 and all(o.finish_reason is FinishReason.ERROR for o in finals)
    assert all(o.error is not None and "the step loop broke" in o.error for o in finals)


@pytest.mark.parametrize("fake", [{"enable_prefix_caching": False, "max_num_batched_tokens": 16}], indirect=True)
def test_stats_count_prompt_and_generated_tokens(llm: LLM) -> None:
    prompts = _prompts()[:4]
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.core.stats()
    assert stats.num_prompt_tokens_total == sum(len(p) for p in prompts)
    assert stats.num_generation_tokens_total == sum(len(o.token_ids) for o in outputs)
    assert stats.num_running == stats.num_waiting == stats.num_blocks_used == 0


def test_queued_tokens_count_requests_the_scheduler_has_not_seen(llm: LLM) -> None:
    prompts = _prompts()[:3]
    outputs: list[RequestOutput] = []
    for i, prompt in enumerate(prompts):
        llm.core.add_request(f"q{i}", prompt, GREEDY, outputs.append)
    # nothing has stepped: the requests are still in the engine's inbox, yet they are work ahead of a newcomer
    stats = llm.core.stats()
    assert stats.queued_tokens == sum(len(p) for p in prompts)
    assert stats.num_waiting == 3
    assert replace(stats, prefill_tokens_per_s=100.0).predict_ttft_s(10) == pytest.approx(
        (sum(len(p) for p in prompts) + 10) / 100
    )
    _run(llm.core)
    assert sum(o.finished for o in outputs) == 3 and llm.core.stats().queued_tokens == 0


def test_predicted_ttft_uses_the_prefill_rate_not_the_decode_rate(fake: tuple[LLM, FakeRunner]) -> None:
    llm, runner = fake
    runner.step_s = 0.002  # a forward pass costs about the same for one token or a chunk, as on a real CPU
    # one long prefill, then many one-token decode steps: the rate of all tokens falls to the decode rate
    llm.generate([list(range(3, 203))], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    stats = llm.core.stats()
    assert stats.prefill_tokens_per_s > 5 * stats.tokens_per_s
    assert llm.core.predict_ttft_s(500) == pytest.approx(500 / stats.prefill_tokens_per_s)


def test_an_unsettled_max_model_len_is_refused() -> None:
    from infer.engine.config import EngineConfig

    assert EngineConfig().max_model_len == 0  # "the smaller of 2048 and the model's", settled at load
    assert EngineConfig().for_model(1024).max_model_len == 1024
    assert EngineConfig().for_model(8192).max_model_len == 2048
    assert EngineConfig(max_model_len=4096).for_model(8192).max_model_len == 4096
    with pytest.raises(ValueError, match="max_model_len: must be <= the model's max_position_embeddings"):
        EngineConfig(max_model_len=4096).for_model(1024)
    with pytest.raises(ValueError, match="max_model_len: must be settled"):
        fake_core(max_model_len=0)


def test_pending_aborts_are_not_waiting_requests(llm: LLM) -> None:
    outputs: list[RequestOutput] = []
    for i in range(3):
        llm.core.add_request(f"w{i}", [3 + i, 4], GREEDY, outputs.append)
    for i in range(100):  # cancels the step loop has not taken in yet
        llm.core.abort(f"cancelled-{i}")
    assert llm.core.stats().num_waiting == 3  # infer_requests_waiting
    _run(llm.core)
    assert sum(o.finished for o in outputs) == 3 and llm.core.stats().num_waiting == 0


def test_a_late_cancel_never_ends_a_new_request_that_reuses_the_id(llm: LLM) -> None:
    outputs: list[RequestOutput] = []

    def sink(out: RequestOutput) -> None:
        outputs.append(out)
        if out.finished and len(outputs) == 1:  # as the first one ends, its client cancels and sends the id again
            llm.core.abort("same")
            llm.core.add_request("same", [4], GREEDY, outputs.append)

    llm.core.add_request("same", [1, 2, 3], SamplingParams(max_tokens=1), sink)
    _run(llm.core)
    llm.core.abort("never-sent")
    assert not llm.core.has_work  # an abort is no queue entry: one of an unknown id is dropped at once
    assert [o.finish_reason for o in outputs if o.finished] == [FinishReason.LENGTH] * 2
    assert len(outputs[-1].token_ids) == 1 and sum(len(o.token_ids) for o in outputs) == 1 + GREEDY.max_tokens
