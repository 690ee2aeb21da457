"""Constraints and the grammar compiler: what a request may ask for, what compiles, the cache, the thread."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr

from infer.engine.structured import MAX_CHOICES, MAX_CONSTRAINT_CHARS, Constraint, ConstraintKind, GrammarCompiler
from infer.engine.structured import compiler as structured
from infer.engine.structured.compiler import compile_error, tokenizer_info, vocab_type_name
from infer.engine.structured.constraint import choice_grammar
from infer.engine.structured.grammar_budget import CompileDroppedError, trial_worker
from infer.engine.tokenizer import Tokenizer
from infer.engine.validation import InvalidInput, QueueFullError
from tests.helpers.fake_engine import tiny_tokenizer


def matches(compiled: Any, text: str) -> bool:
    """Whether `text` is a complete output of the grammar."""
    matcher = xgr.GrammarMatcher(compiled)
    return bool(matcher.accept_string(text)) and bool(matcher.is_completed())


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    tok = tiny_tokenizer()
    return GrammarCompiler(tok, tok.vocab_size, [tok.token_to_id("<|im_end|>") or 0])


# --- Constraint


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("json_schema", "{", "json_schema: not valid JSON"),
        ("json_schema", "[]", "json_schema: must be a JSON object"),
        ("json_schema", "[" * 100_000, "json_schema: at most"),
        ("json_object", "{}", "json_object: takes no text"),
        ("regex", "", "regex: must not be empty"),
        ("grammar", "", "grammar: must not be empty"),
        ("choice", "[]", "choice: 1 to"),
        ("choice", '["a", ""]', "choice: must be non-empty strings"),
        ("choice", '["a", 1]', "choice: must be non-empty strings"),
        ("choice", json.dumps(["x"] * (MAX_CHOICES + 1)), "choice: 1 to"),
        ("xml", "<a/>", "constraint: 'xml' is not one of json_schema, json_object, regex, grammar, choice"),
    ],
)
def test_a_malformed_constraint_names_its_kind(kind: str, text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        Constraint(kind, text)  # type: ignore[arg-type]


def test_constraints_are_keyed_by_kind_and_text() -> None:
    a = Constraint("regex", "[0-9]+")  # type: ignore[arg-type]
    assert a.kind is ConstraintKind.REGEX
    assert a == Constraint.regex("[0-9]+") and hash(a) == hash(Constraint.regex("[0-9]+"))
    assert a != Constraint.grammar("[0-9]+")
    assert Constraint.json_schema({"type": "object"}) == Constraint.json_schema('{"type": "object"}')
    assert Constraint.choice(["ja", "ünï"]).choices == ["ja", "ünï"]
    assert len(Constraint.regex("a" * MAX_CONSTRAINT_CHARS).text) == MAX_CONSTRAINT_CHARS


def test_choice_grammar_takes_exactly_the_choices(compiler: GrammarCompiler) -> None:
    choices = ["yes", 'say "hi"', "back\\slash", "line\nbreak", "ünï 🙂", "\x01"]
    compiled = compiler.submit(Constraint.choice(choices)).result(timeout=60)
    assert all(matches(compiled, c) for c in choices)
    assert not any(matches(compiled, c) for c in ["no", "ye", "yess", "say hi", ""])
    assert choice_grammar(["a"]) == 'root ::= "a"'


def test_compile_errors_read_as_messages_not_source_positions() -> None:
    raw = RuntimeError("[16:32:14] /project/cpp/regex_converter.cc:83: Regex parsing error at position 3: oops\n")
    assert str(compile_error("regex", raw)) == "regex: does not compile: Regex parsing error at position 3: oops"
    checked = RuntimeError("[1:2:3] /p/x.h:9: Check failed: (a) is false: bad thing")
    assert str(compile_error("grammar", checked)) == "grammar: does not compile: bad thing"


# --- compiling

INT_N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
LOOP = {"$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}  # refs only
PAREN = "Regex parsing error at position 3: The parenthesis is not closed"


@pytest.mark.parametrize(
    ("constraint", "good", "bad"),
    [
        (Constraint.json_schema(INT_N), ['{"n": 3}'], ['{"n": "3"}', "{}", '{"n":3}']),
        (Constraint.json_object(), ['{"a": [1, {"b": null}]}', "{}"], ["[1]", '"x"']),
        (Constraint.regex(r"\d{3}-\d{2}"), ["123-45"], ["12-345", "123-456"]),
        (Constraint.grammar('root ::= "(" root ")" | "x"'), ["x", "((x))"], ["(x", "()"]),
    ],
)
def test_each_kind_compiles_to_what_it_says(
    compiler: GrammarCompiler, constraint: Constraint, good: list[str], bad: list[str]
) -> None:
    compiled = compiler.submit(constraint).result(timeout=60)
    assert all(matches(compiled, text) for text in good)
    assert not any(matches(compiled, text) for text in bad)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (Constraint.regex("(("), f"regex: does not compile: {PAREN}"),
        (Constraint.json_schema({"type": "objekt"}), 'json_schema: does not compile: Unsupported type "objekt"'),
        (Constraint.grammar('root ::= "a" | b'), "grammar: does not compile: EBNF parser error at line 1, column"),
        (Constraint.json_schema(LOOP), "json_schema: does not compile: no output can match it"),
    ],
)
def test_a_constraint_that_does_not_compile_fails_with_its_kind(
    compiler: GrammarCompiler, constraint: Constraint, message: str
) -> None:
    error = compiler.submit(constraint).exception(timeout=60)
    assert isinstance(error, ValueError)
    assert str(error).startswith(message)
    assert "/project/" not in str(error)


def test_the_cache_hands_out_one_compile_per_kind_and_text(compiler: GrammarCompiler) -> None:
    first = compiler.submit(Constraint.regex("[a-c]+x"))
    assert compiler.submit(Constraint.regex("[a-c]+x")) is first
    assert compiler.submit(Constraint.grammar('root ::= "[a-c]+x"')) is not first
    failed = compiler.submit(Constraint.regex("[a-"))
    assert failed.exception(timeout=60) is not None
    assert compiler.submit(Constraint.regex("[a-")) is failed  # a failure is remembered too
    assert first.result(timeout=60) is compiler.submit(Constraint.regex("[a-c]+x")).result()


def test_compiles_run_on_the_compilers_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    compile_one = structured._compile

    def recording(backend: Any, constraint: Constraint) -> Any:
        seen.append(threading.current_thread().name)
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", recording)
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0])
    compiler.submit(Constraint.regex("ab")).result(timeout=60)
    assert len(seen) == 1 and seen[0].startswith("infer-grammar")
    compiler.shutdown()


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(structured, "MAX_CACHED_GRAMMARS", 2)
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0])
    futures = [compiler.submit(Constraint.regex(f"a{i}")) for i in range(3)]
    for f in futures:
        f.result(timeout=60)
    assert compiler.num_cached == 2
    assert compiler.submit(Constraint.regex("a2")) is futures[2]
    assert compiler.submit(Constraint.regex("a0")) is not futures[0]  # evicted: compiled again
    assert compiler.cached_bytes > 0
    monkeypatch.setattr(structured, "MAX_CACHED_GRAMMAR_BYTES", 1)  # one entry always stays
    compiler.submit(Constraint.regex("a3")).result(timeout=60)
    assert compiler.num_cached == 1
    compiler.shutdown()


# --- what a compile may cost

# ~1.5 s of CPU to compile on the tiny vocabulary (63 KB of EBNF: under MAX_CONSTRAINT_CHARS)
SLOW = Constraint.grammar("root ::= " + " ".join('("a" | "bc" | [0-9])' for _ in range(3000)))


@pytest.fixture
def compiled_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[Constraint], threading.Event]]:
    """What the server itself compiles (after the trial), each compile waiting until the event is set."""
    seen: list[Constraint] = []
    gate = threading.Event()
    compile_one = structured._compile

    def gated(backend: Any, constraint: Constraint) -> Any:
        seen.append(constraint)
        assert gate.wait(30)
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", gated)
    yield seen, gate
    gate.set()


def _until(condition: Any, timeout_s: float = 30) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, "timed out"
        time.sleep(0.01)


def test_a_compile_over_its_cpu_budget_is_refused_and_remembered(
    monkeypatch: pytest.MonkeyPatch, compiled_here: tuple[list[Constraint], threading.Event]
) -> None:
    seen, gate = compiled_here
    gate.set()
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0], budget_s=0.2)
    error = compiler.submit(SLOW).exception(timeout=120)
    assert isinstance(error, InvalidInput) and error.field == "grammar"
    assert str(error) == "grammar: does not compile within 0.2 s of CPU time (grammar_compile_budget_s)"
    assert not any(c.text == SLOW.text for c in seen)  # killed in the trial: never compiled in the server
    monkeypatch.setattr(structured, "MAX_CACHED_GRAMMARS", 1)
    compiler.submit(Constraint.regex("a+")).result(timeout=60)  # the refusal leaves the cache
    again = compiler.submit(SLOW)
    assert again.done() and str(again.exception()) == str(error)  # remembered: refused without a trial
    assert compiler.stats.num_refused_total == 1 and compiler.stats.num_compiled_total == 2
    assert compiler.submit(Constraint.regex("b+")).result(timeout=60) is not None  # the next trial runs
    compiler.shutdown()


def test_the_compile_queue_is_bounded(compiled_here: tuple[list[Constraint], threading.Event]) -> None:
    _, gate = compiled_here
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0], max_pending=2)
    first, second = compiler.submit(Constraint.regex("a")), compiler.submit(Constraint.regex("b"))
    with pytest.raises(QueueFullError, match=r"2 grammars are compiling or waiting to \(max_pending_grammars\)"):
        compiler.submit(Constraint.regex("c"))
    assert compiler.submit(Constraint.regex("a")) is first  # one already queued takes no more room
    assert compiler.stats.num_pending == 2
    gate.set()
    first.result(timeout=60), second.result(timeout=60)
    assert compiler.submit(Constraint.regex("c")).result(timeout=60) is not None
    assert compiler.stats.num_pending == 0
    compiler.shutdown()


def test_a_compile_whose_callers_all_left_is_dropped(compiled_here: tuple[list[Constraint], threading.Event]) -> None:
    seen, gate = compiled_here
    gate.set()
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0])
    compiler.start().result(timeout=60)
    first = compiler.submit(SLOW)
    assert compiler.submit(SLOW) is first  # two callers
    compiler.release(first)
    time.sleep(0.2)
    assert not first.done()  # one caller still waits
    started_s = time.monotonic()
    compiler.release(first)
    error = first.exception(timeout=60)
    assert time.monotonic() - started_s < 1.0  # its trial was killed, not waited for (~1.5 s of CPU)
    assert isinstance(error, CompileDroppedError)
    assert (
        not any(c.text == SLOW.text for c in seen)
        and compiler.stats.num_pending == 0
        and compiler.stats.num_refused_total == 0
    )
    assert compiler.submit(SLOW) is not first  # not remembered: a new caller compiles it afresh
    compiler.shutdown()


def test_compiles_past_a_tenth_of_a_second_take_only_what_decoding_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cheap compile runs at normal priority; past CHEAP_COMPILE_CPU_S, the trial and the compile here run at
    nice 19."""
    niceness: dict[str, int] = {}
    compile_one = structured._compile

    def recording(backend: Any, constraint: Constraint) -> Any:
        niceness[constraint.text[:12]] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", recording)
    tok = tiny_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size, [0])
    compiler.submit(Constraint.regex("cheap")).result(timeout=60)
    assert niceness == {"cheap": 0}
    medium = Constraint.grammar("root ::= " + " ".join('("a" | "bc" | [0-9])' for _ in range(1500)))
    compiling = compiler.submit(medium)
    pid = trial_worker().pid
    assert pid is not None
    trial_nice = []
    while not compiling.done() and not trial_nice:  # the trial, past its first 0.1 s of CPU
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        trial_nice = [os.getpriority(os.PRIO_PROCESS, int(c)) for c in children if _cpu_s(int(c)) > 0.2]
        time.sleep(0.01)
    assert compiling.result(timeout=60) is not None
    assert trial_nice == [19] and niceness[medium.text[:12]] == 19
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the rest of the server is as it was
    compiler.shutdown()


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# --- the vocabulary as xgrammar sees it


def test_vocab_types_from_the_vocabulary() -> None:
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    assert vocab_type_name(["<unk>", *byte_pieces, "▁the"]) == "BYTE_FALLBACK"
    alphabet = sorted(structured._BYTE_LEVEL_CHARS)
    assert vocab_type_name([*alphabet, "Ġthe", "<|im_end|>"]) == "BYTE_LEVEL"
    assert vocab_type_name(["the", "▁cat", "sat", *"abcdef"]) == "RAW"


def _hf_info(tokenizer_json: str, vocab_size: int) -> Any:
    from tokenizers import Tokenizer as Backend
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(tokenizer_json))
    return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[0])


def test_tokenizer_info_matches_xgrammars_own_reading_of_a_tiny_tokenizer() -> None:
    tok = tiny_tokenizer()
    ours = tokenizer_info(tok, tok.vocab_size + 7, [0])  # a model may pad its vocabulary
    hf = _hf_info(tok._backend.to_str(), tok.vocab_size + 7)
    assert (ours.vocab_type, ours.add_prefix_space, ours.vocab_size) == (hf.vocab_type, hf.add_prefix_space,
                                                                          hf.vocab_size)  # fmt: skip
    assert ours.decoded_vocab == hf.decoded_vocab


def test_tokenizer_info_matches_xgrammars_own_reading_of_the_default_model(default_model_dir: Path) -> None:
    tok = Tokenizer.from_dir(default_model_dir)
    ours = tokenizer_info(tok, 49152, [2])
    hf = _hf_info((default_model_dir / "tokenizer.json").read_text(), 49152)
    assert ours.vocab_type == hf.vocab_type == xgr.VocabType.BYTE_LEVEL
    assert ours.add_prefix_space == hf.add_prefix_space
    assert ours.decoded_vocab == hf.decoded_vocab
