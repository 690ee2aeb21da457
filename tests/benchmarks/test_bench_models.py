"""`make bench-models`' goal rows on made-up figures (the real run takes the three GGUF files and llama.cpp)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import models  # noqa: E402


def _model(ours: float, llama: float, reference: float | None) -> dict[str, Any]:
    m: dict[str, Any] = {"rounds": [], "ours": {"perplexity": ours}, "llama_perplexity": llama}
    if reference is not None:
        m["reference_perplexity"] = reference
    return m


def test_the_perplexity_goal_says_how_far_each_estimate_is_from_transformers() -> None:
    goal, target, measured, met = models.goal_rows("qwen2.5-coder-0.5b", _model(3.024, 3.049, 3.0241))[0]
    assert (goal, target, met) == ("perplexity vs llama-perplexity", "within ±0.5%", False)
    assert measured == ("3.024 vs 3.049 (-0.82%); transformers on the same file 3.024: ours -0.00%, llama.cpp's "
                        "+0.82%")  # fmt: skip
    _, _, measured, met = models.goal_rows("gemma3-270m", _model(10.102, 10.094, None))[0]
    assert measured == "10.102 vs 10.094 (+0.08%)" and met  # a run without transformers' estimate
