"""Constrained requests in the engine: held until compiled, one matcher each, one bitmask for the constrained rows."""

from __future__ import annotations

import pytest
import torch
import xgrammar  # noqa: F401  (a hard dependency: missing, these tests fail)

from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.structured import Constraint, GrammarCompiler
from infer.engine.structured.manager import StructuredOutputs, TokenBitmask, apply_bitmask
from infer.engine.tokenizer import Tokenizer
from tests.helpers.fake_engine import tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tiny_tokenizer()


@pytest.fixture
def manager(tok: Tokenizer) -> StructuredOutputs:
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None
    return StructuredOutputs(GrammarCompiler(tok, tok.vocab_size, [eos]), num_rows=8, on_compiled=lambda: None)


def request(manager: StructuredOutputs, rid: str, constraint: Constraint | None) -> Request:
    r = Request(rid, [1, 2], SamplingParams(constraint=constraint), 0.0)
    if constraint is not None:
        r.grammar = manager.grammar(constraint)
        r.grammar.future.exception(timeout=60)  # compiled (or failed)
    return r


def allowed(mask: TokenBitmask, row: int, vocab_size: int) -> set[int]:
    logits = torch.zeros(mask.bits.shape[0], vocab_size)
    apply_bitmask(logits, TokenBitmask(mask.bits, [row]))
    return set(torch.nonzero(logits[row] == 0).flatten().tolist())


def test_pending_requests_leave_ready_or_failed(manager: StructuredOutputs) -> None:
    good = request(manager, "good", Constraint.regex("ab"))
    bad = request(manager, "bad", Constraint.regex("(("))
    ready, failed = manager.take_compiled([good, bad])  # the scheduler's waiting requests that are not ready
    assert ready == [good] and good.grammar is not None and good.grammar.matcher is not None
    assert [r for r, _ in failed] == [bad] and "regex: does not compile" in str(failed[0][1])
    assert good.is_ready and not bad.is_ready  # no table: the failed one ends (the core fails it)


def test_a_request_waits_while_its_grammar_compiles(manager: StructuredOutputs) -> None:
    r = request(manager, "slow", Constraint.regex("x"))
    assert r.grammar is not None
    r.grammar.future = type(r.grammar.future)()  # a compile still under way
    assert manager.take_compiled([r]) == ([], [])
    assert not r.is_ready
    manager.release(r)  # it ended while compiling: its compile is dropped (a no-op for one done already)


def test_the_matcher_follows_the_output_and_ends_with_the_grammar(manager: StructuredOutputs, tok: Tokenizer) -> None:
    r = request(manager, "r", Constraint.choice(["Paris", "London"]))
    manager.take_compiled([r])
    grammar = r.grammar
    assert grammar is not None
    for token_id in tok.encode("Paris", add_special_tokens=False):
        assert grammar.accept(token_id) and not grammar.is_terminated
    assert not grammar.accept(tok.encode("x", add_special_tokens=False)[0])  # outside the grammar: refused
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None and grammar.accept(eos) and grammar.is_terminated


def test_the_bitmask_covers_the_constrained_rows_only(manager: StructuredOutputs, tok: Tokenizer) -> None:
    free = request(manager, "free", None)
    digits = request(manager, "digits", Constraint.regex("[0-9]+"))
    word = request(manager, "word", Constraint.choice(["Hello"]))
    manager.take_compiled([digits, word])
    assert manager.bitmask([free]) is None
    mask = manager.bitmask([digits, free, word])
    assert mask is not None and mask.rows == [0, 2]
    vocab = tok.vocab_size
    digit_tokens = allowed(mask, 0, vocab)
    assert digit_tokens and all(tok.decode([t]).isdigit() for t in digit_tokens)
    assert {tok.decode([t]) for t in allowed(mask, 2, vocab)} <= {"H", "He", "Hel", "Hell", "Hello"}
    logits = torch.randn(3, vocab)
    before = logits.clone()
    apply_bitmask(logits, mask)
    assert torch.equal(logits[1], before[1])  # the free row is untouched
    assert torch.isneginf(logits[0]).sum() == vocab - len(digit_tokens)


def test_a_padded_model_vocabulary_never_samples_past_the_tokenizer(tok: Tokenizer) -> None:
    compiler = GrammarCompiler(tok, tok.vocab_size + 40, [0])
    manager = StructuredOutputs(compiler, 4, lambda: None)
    r = request(manager, "r", Constraint.regex("[a-z]+"))
    manager.take_compiled([r])
    mask = manager.bitmask([r])
    assert mask is not None
    logits = torch.zeros(1, tok.vocab_size + 40)
    apply_bitmask(logits, mask)
    assert torch.isneginf(logits[0, tok.vocab_size :]).all()


def test_the_bitmask_has_a_row_for_every_sampled_row_past_num_rows(tok: Tokenizer) -> None:
    """With speculation a step samples one row per request plus one per draft: more rows than max_num_seqs."""
    manager = StructuredOutputs(GrammarCompiler(tok, tok.vocab_size, [0]), num_rows=4, on_compiled=lambda: None)
    free = request(manager, "free", None)
    digits = request(manager, "digits", Constraint.regex("[0-9]+"))
    manager.take_compiled([digits])
    mask = manager.bitmask([free] * 15 + [digits])  # three requests with 4 drafts each, then a constrained one
    assert mask is not None and mask.rows == [15] and mask.bits.shape[0] == 16
    assert all(tok.decode([t]).isdigit() for t in allowed(mask, 15, tok.vocab_size))
    assert manager.bitmask([digits]) is not None  # a smaller step after a larger one
