"""The dimensions `make bench-offline` and `make bench-serving` compare infer with llama-server over.

- precisions: fp32, bf16 and every weight quantization `--quantization` offers (read from the settings, so a new
  choice such as int4 joins by itself);
- speculation on and off, through the server setting whose name starts with `specul` (skipped when there is none);
- two workloads: input-grounded prompts of real text (benchmarks/grounded.json: summarize, extract, rewrite a
  passage, edit code given in the prompt; chat-formatted for the default model) and random token ids;
- two loads: one request at a time (batch 1) and 16 concurrent streams.

Each system runs the same requests in rounds; a figure is the median over rounds, and a ratio to llama-server is
taken within each round (the two ran minutes apart), then the median of those.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.clients.bench.workloads import FIRST_ID, RequestSpec, Workload
from infer.server.settings import SETTINGS, Setting

GROUNDED_FILE = Path(__file__).with_name("grounded.json")
LLAMA = "llama"
WORKLOADS = ("grounded", "random")
LOADS = {"batch1": 1, "c16": 16}  # streams at once
METRICS = ("output_tok_s", "decode_tok_s", "ttft_p50_s")
OFF_VALUES = ("none", "off", "false", "0")
NO_SPECULATION = "not measured: this build has no setting whose name starts with `specul`"


def precisions() -> dict[str, dict[str, str]]:
    """{name: engine settings}: fp32, bf16, then each `--quantization` choice but none and auto (the default
    model is a directory of floats: auto is none there)."""
    quantization = next(s for s in SETTINGS if s.name == "quantization")
    found: dict[str, dict[str, str]] = {"fp32": {}, "bf16": {"dtype": "bfloat16"}}
    return found | {q: {"quantization": q} for q in quantization.choices if q not in ("none", "auto")}


@dataclass(frozen=True)
class Speculation:
    """How a server turns speculative decoding on and off: one setting, two raw values."""

    setting: Setting
    on: str
    off: str

    def flags(self, enabled: bool) -> tuple[str, ...]:
        raw = self.on if enabled else self.off
        if isinstance(self.setting.default, bool):  # a --x / --no-x flag
            return (self.setting.flag if self.setting.parse(raw) else f"--no-{self.setting.flag[2:]}",)
        return (self.setting.flag, raw)

    def engine_settings(self, enabled: bool) -> dict[str, Any]:
        """LLM(...) keyword arguments; {} when the setting is the server's own (offline cannot use it)."""
        if not self.setting.is_engine:
            return {}
        return {self.setting.name: self.setting.parse(self.on if enabled else self.off)}

    def describe(self) -> str:
        return f"`{' '.join(self.flags(True))}` vs `{' '.join(self.flags(False))}`"


def find_speculation(name: str | None = None, on: str | None = None) -> Speculation | None:
    """The speculation setting (`name`, else the first whose name starts with `specul`), or None when absent.
    `on` is its value for "on"; by default true, `ngram` or the first choice that is not off, or 4 draft tokens."""
    found = [s for s in SETTINGS if s.name == name or (name is None and s.name.startswith("specul"))]
    if not found:
        return None
    setting = found[0]
    if isinstance(setting.default, bool):
        return Speculation(setting, on or "true", "false")
    if setting.choices:
        active = [c for c in setting.choices if c not in OFF_VALUES]
        off = next((c for c in setting.choices if c in OFF_VALUES), str(setting.default))
        return Speculation(setting, on or ("ngram" if "ngram" in active else active[0]), off)
    return Speculation(setting, on or "4", "0")


@dataclass(frozen=True)
class Variant:
    """One infer configuration of the comparison."""

    precision: str
    speculative: bool = False

    @property
    def name(self) -> str:
        return self.precision + ("+spec" if self.speculative else "")


def variants(names: Iterable[str], speculation: Speculation | None) -> list[Variant]:
    """Each precision without speculation, then with it when the server has it."""
    names = list(names)
    out = [Variant(p) for p in names]
    return out + ([Variant(p, True) for p in names] if speculation else [])


# --- workloads


def grounded_prompts(path: Path = GROUNDED_FILE) -> list[dict[str, Any]]:
    prompts: list[dict[str, Any]] = json.loads(path.read_text())["prompts"]
    return prompts


def grounded_ids(tokenizer: Any, path: Path = GROUNDED_FILE) -> list[tuple[str, tuple[int, ...]]]:
    """(task, token ids) of each prompt, rendered with the model's chat template (the generation prompt added)."""
    return [(p["task"], tuple(tokenizer.encode_chat(p["messages"]))) for p in grounded_prompts(path)]


@dataclass(frozen=True)
class MatrixWork:
    """How much of each workload a run sends."""

    batch1_requests: int = 4  # one at a time
    concurrent_requests: int = 32  # 16 at once
    grounded_tokens: int = 128  # new tokens of a grounded request
    random_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.batch1_requests, self.concurrent_requests, self.grounded_tokens, self.random_tokens) < 1:
            raise ValueError("request counts and token counts must be >= 1")


def interleave_tasks(prompts: Sequence[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """The prompts reordered round-robin over their tasks: summarize, extract, rewrite, code_edit, summarize, ..."""
    groups: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for prompt in prompts:
        groups.setdefault(prompt[0], []).append(prompt)
    return [p for row in itertools.zip_longest(*groups.values()) for p in row if p is not None]


def matrix_workloads(grounded: Sequence[tuple[str, tuple[int, ...]]], work: MatrixWork) -> dict[str, Workload]:
    """{"grounded/batch1": ..., "grounded/c16": ..., "random/batch1": ..., "random/c16": ...}. The grounded prompts
    go round-robin over the tasks (and start again when a load needs more); random prompts are 64–512 tokens."""
    rng, ordered = random.Random(work.seed), interleave_tasks(grounded)
    out: dict[str, Workload] = {}
    for load, count in (("batch1", work.batch1_requests), ("c16", work.concurrent_requests)):
        chosen = [ordered[i % len(ordered)] for i in range(count)]
        specs = tuple(RequestSpec(ids, work.grounded_tokens, tag=task) for task, ids in chosen)
        out[f"grounded/{load}"] = Workload(f"grounded/{load}", "input-grounded prompts", specs, LOADS[load])
        specs = tuple(
            RequestSpec(tuple(rng.randrange(FIRST_ID, 49152) for _ in range(rng.randint(64, 512))), work.random_tokens)
            for _ in range(count)
        )
        out[f"random/{load}"] = Workload(f"random/{load}", "random token ids, 64–512 tokens", specs, LOADS[load])
    return out


# --- results: {"rounds": [{system: {"grounded/batch1": {metric: value}}}]}

Figures = dict[str, float]
Round = dict[str, dict[str, Figures]]


def median_figure(rounds: Sequence[Round], system: str, key: str, metric: str) -> float | None:
    values = [r[system][key][metric] for r in rounds if key in r.get(system, {})]
    return statistics.median(values) if values else None


def median_ratio(rounds: Sequence[Round], a: str, b: str, key: str, metric: str) -> float | None:
    """a / b within each round where both ran, then the median (None when no round has both)."""
    ratios = [
        r[a][key][metric] / r[b][key][metric]
        for r in rounds
        if key in r.get(a, {}) and key in r.get(b, {}) and r[b][key][metric] > 0
    ]
    return statistics.median(ratios) if ratios else None
