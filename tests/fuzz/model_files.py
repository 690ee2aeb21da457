"""`make fuzz-models`: model files from strangers, mutated in their header and metadata, loaded as the server
loads them. Every case must end in a clean refusal (a one-line `ModelLoadError`: exit code 2 from `infer generate`
and `infer serve`) or a working model, within a time bound and an RSS bound.

Templates: tiny GGUF files of each architecture (`tests/helpers/tiny_gguf.py`, tied and untied heads), and the
three real files when `make models` has put them in the cache. A case takes a template and either writes new
numbers into its header (1-3 of: a count, a string's length, a value or element type, a scalar value, a
dimension, a tensor's type or offset, random bytes, a cut inside the header; `tests/helpers/gguf_layout.py`) or
rewrites one field (a value of another kind, a key dropped, a vocabulary longer or shorter than the embedding,
a chat template of the hostile corpus of `tests/fuzz/templates.py`).
A real file's case is a sparse copy: its header, then a hole as long as its tensor data (no disk, no copy time).

Each case runs in a child forked from this warm process (torch and infer imported once: ~20 ms a case, not the
seconds of a fresh interpreter), under `RLIMIT_AS` (so a lie that allocates fails in the child, never in the
machine) and a wall-clock bound (the parent kills a child that runs past it); the child resets and reads its
peak RSS (`VmHWM`) around the load. NOTE: in-process with tracemalloc would miss torch's and numpy's C
allocations and could not survive a hang or a segfault; a fresh interpreter per case would try 10x fewer cases.
A tiny case loads the model fully and generates (text and the vocabulary's first and last ids); a real case
runs everything a load does before filling weights (header, config, tensor shapes, tokenizer): the weights of a
sparse copy are zeros, and filling them would spend the run on packing.

    python -m tests.fuzz.model_files [--minutes 10] [--seed 0] [--out docs/fuzz-models]

Outcomes: refused, loaded (tiny), valid (real), and the failures: unclean (a ValueError the server would turn
into exit 1), multiline, crash (any other exception, or a signal), memory (MemoryError, or the RSS bound passed),
timeout. It writes `<out>.json` and `<out>.md` and exits 1 when any case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from tests.helpers.gguf_layout import Slot, header_layout, patched, rewritten
from tests.helpers.tiny_gguf import write_tiny_gguf

FAILURES = ("unclean", "multiline", "crash", "memory", "timeout")
SLOT_KINDS = ("count", "length", "type", "value", "dim", "offset")
INT_EDGES = (0, 1, 2, 3, 7, 8, 16, 255, 256, 4096, 65535, 65536, 1_000_000, 2**31 - 1, 2**31, 4_000_000_000,
             2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1)  # fmt: skip
KV_BYTES = 64 << 20  # a tiny model's KV pool: its default max_model_len (up to 2,048) of Gemma's 256-wide heads
FLOAT_EDGES = (0.0, -0.0, -1.0, 1.0, 0.5, 1e-38, 3.0e38, -3.0e38, math.inf, -math.inf, math.nan)


@dataclass
class Template:
    name: str
    path: Path
    header: bytes  # the bytes a case mutates: a tiny file whole, a real file's header
    size: int  # the whole file's
    slots: list[Slot]
    is_real: bool


@dataclass
class Case:
    index: int
    template: str
    mutations: list[str]
    outcome: str = ""
    message: str = ""
    seconds: float = 0.0
    rss_growth_mib: float = 0.0
    detail: str = field(default="", repr=False)  # a crash's traceback


def templates(work: Path, with_real: bool) -> list[Template]:
    found = []
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        for tied in (True, False):
            name = f"tiny-{arch}{'' if tied else '-untied'}"
            path = write_tiny_gguf(work / f"{name}.gguf", arch, num_layers=2, tied=tied)
            data = path.read_bytes()
            found.append(Template(name, path, data, len(data), header_layout(path).slots, is_real=False))
    if with_real:
        from benchmarks.real_models import manifest, model_path

        for model in manifest():
            path = model_path(model.name)
            if path.is_file():
                layout = header_layout(path)
                with path.open("rb") as f:
                    header = f.read(layout.header_end + 64)
                found.append(Template(model.name, path, header, path.stat().st_size, layout.slots, is_real=True))
    return found


# mutations
def _int_value(rng: random.Random, slot: Slot, old: int) -> int:
    choice = rng.random()
    if choice < 0.5:
        return rng.choice(INT_EDGES)
    if choice < 0.8:
        return max(0, old + rng.choice((-2, -1, 1, 2, old, -old // 2, 1000 * old)))
    return rng.getrandbits(8 * slot.size)


def _float_value(rng: random.Random, old: float) -> float:
    if rng.random() < 0.7:
        return rng.choice(FLOAT_EDGES)
    return old * rng.choice((-1.0, 2.0, 0.5, 1e6, 1e-6))


def mutate_slot(rng: random.Random, data: bytearray, template: Template) -> str:
    kinds = sorted({s.kind for s in template.slots})
    kind = rng.choice(kinds)
    slot = rng.choice([s for s in template.slots if s.kind == kind])
    old = slot.read(data)
    if slot.fmt in "fd":
        value: int | float = _float_value(rng, float(old))
    elif slot.kind == "type":
        value = rng.choice((*range(42), 2**31, 2**32 - 1))
    else:
        value = _int_value(rng, slot, int(old))
    data[:] = patched(data, slot, value)
    return f"{slot.kind} {slot.label}: {old!r} -> {value!r}"


def mutate_bytes(rng: random.Random, data: bytearray, end: int) -> str:
    spots = sorted(rng.randrange(8, end) for _ in range(rng.randint(1, 8)))
    for spot in spots:
        data[spot] = rng.randrange(256)
    return f"bytes at {spots}"


def _rewrite_fields(rng: random.Random, template: Template) -> tuple[dict[str, Any], tuple[str, ...], str]:
    from infer.engine.gguf.metadata import read_gguf_metadata

    meta = read_gguf_metadata(template.path)
    key = rng.choice(sorted(k for k in meta if k != "general.architecture"))
    op = rng.choice(("retype", "drop", "vocabulary", "template"))
    if op == "template":  # NOTE: the other engineer's hostile corpus (tests/fuzz/templates.py), as the file's own
        from tests.fuzz.templates import HOSTILE

        name = rng.choice(sorted(HOSTILE))
        return {"tokenizer.chat_template": (HOSTILE[name], GGUFValueType.STRING, None)}, (), f"template {name}"
    if op == "drop":
        return {}, (key,), f"drop {key}"
    if op == "vocabulary":
        tokens = list(meta["tokenizer.ggml.tokens"])
        delta = rng.choice((-200, -16, -1, 1, 16, 1000))
        tokens = tokens[:delta] if delta < 0 else tokens + [f"<extra_{i}>" for i in range(delta)]
        fields = {
            "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY, GGUFValueType.STRING),
            "tokenizer.ggml.token_type": ([1] * len(tokens), GGUFValueType.ARRAY, GGUFValueType.INT32),
        }
        return fields, (), f"vocabulary of {len(tokens)} tokens"
    kinds: list[tuple[Any, GGUFValueType, GGUFValueType | None]] = [
        ("12", GGUFValueType.STRING, None), (-3, GGUFValueType.INT32, None), (2.5, GGUFValueType.FLOAT32, None),
        (math.inf, GGUFValueType.FLOAT32, None), (True, GGUFValueType.BOOL, None),
        ([1, 2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32), (["a"], GGUFValueType.ARRAY, GGUFValueType.STRING),
        (2**64 - 1, GGUFValueType.UINT64, None), ([[1], [2]], GGUFValueType.ARRAY, GGUFValueType.ARRAY),
    ]  # fmt: skip
    value, value_type, sub_type = rng.choice(kinds)
    return {key: (value, value_type, sub_type)}, (), f"retype {key} = {value!r} ({value_type.name})"


def write_case(rng: random.Random, template: Template, path: Path) -> list[str]:
    """The case's file at `path`; what was done to it."""
    if not template.is_real and rng.random() < 0.25:
        fields, drop, what = _rewrite_fields(rng, template)
        rewritten(template.path, path, fields, drop)
        return [what]
    data = bytearray(template.header)
    header_end = max(s.offset + s.size for s in template.slots)
    done = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        roll = rng.random()
        if roll < 0.8:
            done.append(mutate_slot(rng, data, template))
        elif roll < 0.9:
            done.append(mutate_bytes(rng, data, header_end))
        else:
            cut = rng.randrange(0, header_end)
            path.write_bytes(bytes(data[:cut]))
            return [*done, f"cut at byte {cut}"]
    path.write_bytes(bytes(data))
    if template.is_real:
        with path.open("r+b") as f:
            f.truncate(template.size)  # NOTE: sparse: the tensor data is a hole
    return done


# one case, in a forked child
def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _load(path: Path, full: bool) -> str:
    from infer.engine.config import EngineConfig
    from infer.engine.loader import check_tokenizer, gguf_config, gguf_tokenizer, open_source

    if not full:
        source = open_source(path)
        cfg = gguf_config(source)
        check_tokenizer(cfg, gguf_tokenizer(source, None), str(path))
        return "valid"
    from infer.engine.core import EngineCore
    from infer.engine.llm import LLM
    from infer.engine.sampling_params import SamplingParams

    llm = LLM.from_core(EngineCore.from_config(EngineConfig(model=str(path), kv_cache_memory_bytes=KV_BYTES)))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for prompt in ("Hi", [0, llm.tokenizer.vocab_size - 1]):
        with contextlib.suppress(ValueError):  # NOTE: a request the model refuses (past its context) loaded fine
            llm.generate(prompt, params)
    return "loaded"


def _run_child(path: Path, full: bool, limits: argparse.Namespace, out_fd: int) -> None:
    import torch

    torch.set_num_threads(1)
    address_space = _status("VmSize") + os.path.getsize(path) + (limits.rss_mib << 20) + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    with open("/proc/self/clear_refs", "w") as f:  # the peak RSS (VmHWM) from here
        f.write("5")
    base = _status("VmRSS")
    result: dict[str, Any] = {}
    start = time.perf_counter()
    from infer.engine.loader import ModelLoadError

    try:
        result["outcome"] = _load(path, full)
    except ModelLoadError as e:
        result.update(outcome="multiline" if "\n" in str(e) else "refused", message=str(e))
    except MemoryError as e:
        result.update(outcome="memory", message=f"MemoryError: {e}", detail=traceback.format_exc())
    except (ValueError, FileNotFoundError) as e:
        result.update(outcome="unclean", message=f"{type(e).__name__}: {e}", detail=traceback.format_exc())
    except BaseException as e:
        result.update(outcome="crash", message=f"{type(e).__name__}: {e}", detail=traceback.format_exc())
    result["seconds"] = time.perf_counter() - start
    result["rss_growth_mib"] = max(0, _status("VmHWM") - base) / 2**20
    if result["rss_growth_mib"] > limits.rss_mib and result["outcome"] not in FAILURES:
        result.update(outcome="memory", message=f"peak RSS grew {result['rss_growth_mib']:.0f} MiB")
    os.write(out_fd, json.dumps(result).encode())


def run_case(case: Case, path: Path, full: bool, limits: argparse.Namespace) -> None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_fd)
        try:
            _run_child(path, full, limits, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    start, chunks = time.perf_counter(), []
    deadline = start + limits.timeout_s
    while True:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.perf_counter()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            break
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    case.seconds = time.perf_counter() - start
    if chunks:
        result = json.loads(b"".join(chunks))
        case.outcome, case.message = result["outcome"], result.get("message", "")[:300]
        case.seconds, case.rss_growth_mib = result["seconds"], result["rss_growth_mib"]
        case.detail = result.get("detail", "")
    elif time.perf_counter() >= deadline:
        case.outcome, case.message = "timeout", f"killed after {limits.timeout_s} s"
    else:
        case.outcome, case.message = "crash", f"the child died: {_died(status)}"


def _died(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"


# the run
def fuzz(args: argparse.Namespace) -> tuple[list[Case], dict[str, Any]]:
    import infer.engine.core
    import infer.engine.llm
    import infer.engine.loader  # noqa: F401  (warm: every child starts with these imported)

    rng = random.Random(args.seed)
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="fuzz-models-") as tmp:
        work = Path(tmp)
        found = templates(work, with_real=not args.no_real)
        tiny = [t for t in found if not t.is_real]
        real = [t for t in found if t.is_real]
        start = time.monotonic()
        while time.monotonic() - start < args.minutes * 60 and len(cases) < args.max_cases:
            template = rng.choice(real if real and rng.random() < args.real_share else tiny)
            case = Case(len(cases), template.name, [])
            path = work / f"case-{case.index}.gguf"
            try:
                case.mutations = write_case(rng, template, path)
            except ValueError:  # NOTE: a rewrite gguf's writer refuses (an empty array): draw again
                continue
            run_case(case, path, full=not template.is_real, limits=args)
            path.unlink(missing_ok=True)
            cases.append(case)
            if case.outcome in FAILURES:
                print(f"FAIL case {case.index} {case.template} {case.mutations}: {case.outcome} {case.message}",
                      file=sys.stderr, flush=True)  # fmt: skip
        duration = time.monotonic() - start
    settings = {"seed": args.seed, "minutes": args.minutes, "timeout_s": args.timeout_s, "rss_mib": args.rss_mib,
                "templates": [t.name for t in found], "duration_s": round(duration, 1)}  # fmt: skip
    return cases, settings


def summary(cases: list[Case], settings: dict[str, Any]) -> dict[str, Any]:
    by_template: dict[str, Counter[str]] = defaultdict(Counter)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for c in cases:
        by_template[c.template][c.outcome] += 1
        for m in c.mutations:
            by_kind[m.split(" ", 1)[0]][c.outcome] += 1
    slowest = max(cases, key=lambda c: c.seconds, default=None)
    largest = max(cases, key=lambda c: c.rss_growth_mib, default=None)
    return {
        **settings,
        "cases": len(cases),
        "outcomes": dict(Counter(c.outcome for c in cases).most_common()),
        "by_template": {k: dict(v) for k, v in sorted(by_template.items())},
        "by_mutation": {k: dict(v) for k, v in sorted(by_kind.items())},
        "slowest": None if slowest is None else _brief(slowest),
        "largest_rss_growth": None if largest is None else _brief(largest),
        "failures": [asdict(c) for c in cases if c.outcome in FAILURES][:50],
        "refusals_seen": dict(Counter(_reason(c.message) for c in cases if c.outcome == "refused").most_common(25)),
    }


def _brief(c: Case) -> dict[str, Any]:
    return {"template": c.template, "mutations": c.mutations, "outcome": c.outcome,
            "seconds": round(c.seconds, 3), "rss_growth_mib": round(c.rss_growth_mib, 1)}  # fmt: skip


def _reason(message: str) -> str:
    """A refusal's kind: its message without the file's path and numbers."""
    text = message.split(": ", 1)[-1]
    return "".join("#" if ch.isdigit() else ch for ch in text)[:90]


def markdown(report: dict[str, Any]) -> str:
    outcomes = ", ".join(f"{k} {v}" for k, v in report["outcomes"].items())
    lines = [
        "# Model-file fuzzing (`make fuzz-models`)",
        "",
        f"{report['cases']} cases in {report['duration_s']} s (seed {report['seed']}, a time bound of"
        f" {report['timeout_s']} s and an RSS bound of {report['rss_mib']} MiB a case): {outcomes}.",
        f"Failures (unclean, multiline, crash, memory, timeout): {len(report['failures'])}.",
        "",
        "| template | " + " | ".join(["refused", "loaded", "valid", *FAILURES]) + " |",
        "|---|" + "---:|" * (3 + len(FAILURES)),
    ]
    for name, counts in report["by_template"].items():
        lines.append(f"| {name} | " + " | ".join(str(counts.get(k, 0)) for k in
                                                   ["refused", "loaded", "valid", *FAILURES]) + " |")  # fmt: skip
    lines += ["", "| mutation | cases | refused | loaded or valid | failed |", "|---|---:|---:|---:|---:|"]
    for kind, counts in report["by_mutation"].items():
        ok = counts.get("loaded", 0) + counts.get("valid", 0)
        failed = sum(counts.get(k, 0) for k in FAILURES)
        lines.append(f"| {kind} | {sum(counts.values())} | {counts.get('refused', 0)} | {ok} | {failed} |")
    slow, big = report["slowest"], report["largest_rss_growth"]
    if slow:
        lines += ["", f"Slowest case: {slow['seconds']} s, {slow['template']} ({'; '.join(slow['mutations'])}):"
                  f" {slow['outcome']}."]  # fmt: skip
    if big:
        lines += [f"Largest RSS growth: {big['rss_growth_mib']} MiB, {big['template']} ({big['outcome']})."]
    lines += ["", "Most frequent refusals (digits as #):", ""]
    lines += [f"- {n} x `{reason}`" for reason, n in report["refusals_seen"].items()]
    for failure in report["failures"][:10]:
        lines += [
            "",
            f"FAILED: {failure['template']} {failure['mutations']}: {failure['outcome']} {failure['message']}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--max-cases", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="wall-clock bound of one case")
    parser.add_argument("--rss-mib", type=int, default=1536, help="peak RSS growth bound of one case")
    parser.add_argument("--real-share", type=float, default=0.25, help="share of cases on the real files")
    parser.add_argument("--no-real", action="store_true", help="tiny files only")
    parser.add_argument("--out", type=Path, default=Path("docs/fuzz-models"), help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    cases, settings = fuzz(args)
    report = summary(cases, settings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
