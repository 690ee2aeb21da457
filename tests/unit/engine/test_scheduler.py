"""Scheduler: token budget, decode first, chunking, FCFS, max_num_seqs, static batching, preemption."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from infer.engine import Constraint
from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.request import Request, RequestStatus
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.structured.grammar_state import GrammarState


def make(num_blocks: int = 64, **settings: Any) -> Scheduler:
    cfg = EngineConfig(**{"block_size": 4, "max_model_len": 64, "num_blocks": num_blocks, **settings})
    return Scheduler(cfg, BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching))


def add(s: Scheduler, rid: str, prompt_len: int, now: float = 0.0, max_tokens: int = 8) -> Request:
    req = Request(rid, [100 + i for i in range(prompt_len)], SamplingParams(max_tokens=max_tokens), now)
    s.add(req)
    return req


def step(s: Scheduler, now: float = 0.0) -> SchedulerOutput:
    """Schedule, then pretend the forward pass ran and each caught-up request sampled token 7."""
    out = s.schedule(now)
    caught_up = [
        rid
        for rid, n in out.num_scheduled_tokens.items()
        if s.requests[rid].num_computed_tokens + n == s.requests[rid].num_tokens
    ]
    s.update(out, {rid: [7] for rid in caught_up})
    return out


def test_budget_is_never_exceeded_and_long_prompt_is_chunked() -> None:
    s = make(max_num_batched_tokens=16)
    add(s, "long", 40)
    chunks = [step(s).num_scheduled_tokens["long"] for _ in range(3)]
    assert chunks == [16, 16, 8]
    assert s.requests["long"].num_output_tokens == 1  # sampled only after the last chunk


def test_decodes_go_first_then_prefill_chunks_then_waiting() -> None:
    s = make(max_num_batched_tokens=8)
    add(s, "a", 3)
    step(s)  # a prefilled, now decoding
    add(s, "b", 20)
    out = step(s)
    assert list(out.num_scheduled_tokens) == ["a", "b"]
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}
    add(s, "c", 5)
    out = step(s)
    # a's decode, then b's chunk in progress; c waits: no budget left
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}
    assert s.requests["c"].status is RequestStatus.WAITING


def test_waiting_requests_are_admitted_fcfs() -> None:
    s = make(max_num_batched_tokens=10)
    for rid in "xyz":
        add(s, rid, 4)
    out = s.schedule(0.0)
    assert list(out.num_scheduled_tokens) == ["x", "y", "z"]
    assert out.num_scheduled_tokens == {"x": 4, "y": 4, "z": 2}


def test_max_num_seqs_bounds_running_requests() -> None:
    s = make(max_num_seqs=2)
    for rid in "abc":
        add(s, rid, 2)
    out = step(s)
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    assert [r.request_id for r in s.waiting] == ["c"]


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    s = make(max_num_batched_tokens=64, enable_chunked_prefill=False)
    add(s, "a", 2)
    step(s)
    add(s, "b", 64)
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 1}  # b needs 64 tokens, a's decode took one
    s.finish("a")
    assert step(s).num_scheduled_tokens == {"b": 64}


def test_static_batching_gathers_then_admits_nothing_mid_batch() -> None:
    s = make(batching="static", max_num_seqs=4, static_batch_wait_s=0.05)
    add(s, "a", 3, now=0.0)
    assert s.schedule(0.01).is_empty  # still gathering
    add(s, "b", 3, now=0.02)
    out = step(s, now=0.06)  # the wait is over: the batch starts
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    add(s, "c", 3, now=0.07)
    out = step(s, now=1.0)
    assert set(out.num_scheduled_tokens) == {"a", "b"}  # c waits for the batch to finish
    s.finish("a")
    s.finish("b")
    assert set(step(s, now=1.1).num_scheduled_tokens) == {"c"}


def test_static_batch_starts_at_once_when_full() -> None:
    s = make(batching="static", max_num_seqs=2)
    add(s, "a", 3)
    add(s, "b", 3)
    assert set(s.schedule(0.0).num_scheduled_tokens) == {"a", "b"}


def test_preemption_takes_the_most_recently_admitted_request() -> None:
    # 6 blocks of 4 tokens; three requests of 8 tokens use all of them
    s = make(num_blocks=6, max_num_batched_tokens=64)
    for rid in "abc":
        add(s, rid, 8)
    step(s)
    assert s.blocks.num_free_blocks == 0
    out = step(s)  # every decode needs a new block: c (admitted last) is preempted
    assert out.preempted == ("c",)
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    c = s.requests["c"]
    assert c.status is RequestStatus.WAITING
    assert s.waiting[0] is c
    assert c.num_computed_tokens == 0
    assert c.num_preemptions == 1
    assert s.num_never_scheduled == 0  # c ran before: the queue bound does not count it again


def test_preempted_request_is_recomputed_with_its_output() -> None:
    s = make(num_blocks=6, max_num_batched_tokens=64, enable_prefix_caching=False)
    for rid in "abc":
        add(s, rid, 8)
    step(s)
    step(s)  # c preempted, holding 1 output token
    s.finish("a")
    s.finish("b")
    out = step(s)
    assert out.num_scheduled_tokens["c"] == 9  # prompt + the token it had generated
    s.finish("c")
    s.blocks.assert_no_leaks()


def test_full_reserve_takes_max_model_len_of_blocks_at_admission() -> None:
    s = make(num_blocks=32, kv_reserve="full")
    add(s, "a", 3)
    s.schedule(0.0)
    assert len(s.blocks.block_table("a")) == 64 // 4


def test_prefix_cache_hit_skips_computed_tokens() -> None:
    s = make()
    add(s, "a", 12)
    step(s)
    s.finish("a")
    b = add(s, "b", 12)
    out = s.schedule(0.0)
    assert out.num_scheduled_tokens == {"b": 4}  # 8 tokens (2 blocks) came from the cache
    assert b.num_cached_tokens == 8


def test_one_table_holds_every_request_and_the_queues_are_views_of_it() -> None:
    s = make(max_num_seqs=1)
    a, b = add(s, "a", 4), add(s, "b", 6)
    assert s.num_tokens_to_compute == 10 and s.num_never_scheduled == 2
    step(s)
    assert s.running == [a] and s.waiting == [b] and s.requests == {"a": a, "b": b}
    assert (a.status, b.status) == (RequestStatus.RUNNING, RequestStatus.WAITING)
    assert s.num_tokens_to_compute == 1 + 6 and s.num_never_scheduled == 1  # a's next token, b's prompt
    assert s.finish("b") is b and b.status is RequestStatus.FINISHED
    assert s.waiting == [] and s.requests == {"a": a}
    s.finish("a")
    assert not s.has_work and s.running == [] and s.num_tokens_to_compute == 0
    s.blocks.assert_no_leaks()


def _decoding(s: Scheduler, rid: str, prompt_len: int, max_tokens: int = 20) -> Request:
    """A request past its prefill: one token left to compute."""
    r = add(s, rid, prompt_len, max_tokens=max_tokens)
    while r.num_tokens_to_compute != 1 or r.num_output_tokens == 0:
        step(s)
    return r


def test_drafts_ride_with_a_decode_and_rejected_ones_are_rolled_back() -> None:
    s = make(max_num_batched_tokens=16)
    r = _decoding(s, "a", 6)  # 6 prompt + 1 output tokens, 6 computed: blocks of 4 cover 8
    out = s.schedule(0.0, {"a": [11, 12, 13, 14]})
    assert out.num_scheduled_tokens == {"a": 5} and out.draft_token_ids == {"a": (11, 12, 13, 14)}
    assert len(s.blocks.block_table("a")) == 3  # 6 + 5 = 11 tokens
    s.update(out, {"a": [11, 42]})  # one draft accepted, then a correction
    assert r.output_token_ids[-2:] == [11, 42] and r.num_computed_tokens == 8  # the newest token and the draft
    assert len(s.blocks.block_table("a")) == 2  # the block only rejected drafts reached is free again
    assert s.blocks.num_used_blocks == 2


def test_drafts_are_cut_to_the_budget_and_never_preempt() -> None:
    s = make(num_blocks=4, max_num_batched_tokens=16)
    add(s, "a", 6), add(s, "b", 6)
    step(s)  # both prefilled: 2 blocks each, the pool is full
    out = s.schedule(0.0, {"a": [11, 12, 13]})
    assert out.num_scheduled_tokens["a"] == 1 and "a" not in out.draft_token_ids  # a new block would preempt b
    assert not out.preempted
    s.update(out, {rid: [7] for rid in out.num_scheduled_tokens})
    small = make(max_num_batched_tokens=3)
    _decoding(small, "a", 2)
    out = small.schedule(0.0, {"a": [11, 12, 13, 14]})
    assert out.num_scheduled_tokens == {"a": 3} and out.draft_token_ids == {"a": (11, 12)}


def test_prefill_chunks_take_no_drafts() -> None:
    s = make(max_num_batched_tokens=4)
    add(s, "a", 10)
    out = s.schedule(0.0, {"a": [11, 12]})
    assert out.num_scheduled_tokens == {"a": 4} and not out.draft_token_ids


def test_a_request_whose_grammar_is_compiling_waits_without_holding_up_the_queue() -> None:
    s = make(max_num_batched_tokens=64)
    first = add(s, "compiling", 4)
    first.grammar = GrammarState(Constraint.regex("[a-z]+"), Future())  # no matcher yet
    add(s, "b", 4)
    add(s, "c", 4)
    out = step(s)
    assert list(out.num_scheduled_tokens) == ["b", "c"]  # the two behind it, in order
    assert first.status is RequestStatus.WAITING and [r.request_id for r in s.waiting] == ["compiling"]
    first.grammar.matcher = object()  # type: ignore[assignment]  # compiled: ready
    out = step(s)
    assert out.num_scheduled_tokens["compiling"] == 4
    assert first.status is RequestStatus.RUNNING


def test_unready_lists_only_the_requests_whose_grammar_is_compiling() -> None:
    s = make(max_num_batched_tokens=64)
    compiling = [Request(rid, [101, 102], SamplingParams(max_tokens=4), 0.0) for rid in ("g1", "g2", "g3")]
    for request in compiling:
        request.grammar = GrammarState(Constraint.regex("[a-z]+"), Future())  # no matcher yet
        s.add(request)
    add(s, "plain", 4)
    assert [r.request_id for r in s.unready()] == ["g1", "g2", "g3"]
    compiling[0].grammar.matcher = object()  # type: ignore[union-attr, assignment]  # compiled: ready
    s.finish("g3")  # aborted while compiling
    assert [r.request_id for r in s.unready()] == ["g2"]
    assert s._unready == {"g2": None}  # the ready and the gone are dropped from the index, not skipped each step
