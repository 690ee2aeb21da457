"""benchmarks/cuda_report.py on made-up figures: each of issue 39's goals passes, fails or says why it was not
measured, by its own figure (the bandwidth limit and the ratio to transformers computed, not copied)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import cuda_report


def _results(b1_small: float, host: float | None, served: float, b1_mid: float, served_mid: float, hf_mid: float,
             identical: bool) -> dict[str, Any]:  # fmt: skip
    def engine(b1: float, share: float | None) -> dict[str, Any]:
        return {"batch1_decode_tok_s": b1, "sizes": {1: {"tok_s": b1, "step_ms": 1e3 / b1}},
                "host": {1: {"host_share": share}}, "load_s": 1.0}  # fmt: skip

    parity = {"identical": identical, "tokens_equal": identical, "max_logprob_diff": 0.0 if identical else 0.1}
    small = {"label": "S", "engines": {"graphs_on": engine(b1_small, host), "graphs_off": engine(80, 0.9)},
             "server": {"ready_s": 5.0, "1": _served(900), "16": _served(served)}, "parity": parity,
             "decode_bytes": 269_000_000, "hf": {"batch1_decode_tok_s": 30.0}}  # fmt: skip
    mid = {"label": "Q", "engines": {"graphs_on": engine(b1_mid, 0.1)}, "decode_bytes": 3_000_000_000,
           "server": {"ready_s": 9.0, "64": _served(served_mid)}, "hf": {"padded16_tok_s": hf_mid},
           "parity": {"identical": True, "tokens_equal": True, "max_logprob_diff": 0.0}}  # fmt: skip
    return {"device": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2", "transformers": "5", "python": "3"},
            "tiny": False, "bandwidth_bytes_s": 3.0e12, "bandwidth_source": "sheet", "elapsed_s": 100.0,
            "skipped": [], "models": {"smollm2-135m": small, "qwen2.5-1.5b": mid},
            "settings": {"concurrency": [16, 64], "capture_sizes": [1], "max_num_seqs": 64, "max_model_len": 512,
                         "prompt_tokens": 64, "new_tokens": 32, "server_tokens": 128, "hf_requests": 32,
                         "budget_s": 300.0}}  # fmt: skip


def _served(tok_s: float) -> dict[str, float]:
    return {"output_tok_s": tok_s, "ttft_p50_s": 0.01, "tpot_mean_s": 0.002}


def test_every_goal_passes_on_figures_past_its_target() -> None:
    # Qwen: 3e12 B/s over 3e9 B = 1,000 tok/s limit; 700 is 70%. 64 streams 9,000 over 800 is 11.25x
    goals = cuda_report.goals(_results(1200, 0.10, 12_000, 700, 9_000, 800, True))
    assert [g.passed for g in goals] == [True] * 6
    assert goals[3].value is not None and abs(goals[3].value - 0.70) < 1e-9
    assert goals[4].value is not None and abs(goals[4].value - 11.25) < 1e-9


def test_each_goal_fails_on_its_own_figure() -> None:
    cases = [(1200, 0.20, 12_000, 700, 9_000, 800, True), (900, 0.10, 12_000, 700, 9_000, 800, True),
             (1200, 0.10, 9_000, 700, 9_000, 800, True), (1200, 0.10, 12_000, 500, 9_000, 800, True),
             (1200, 0.10, 12_000, 700, 7_000, 800, True), (1200, 0.10, 12_000, 700, 9_000, 800, False)]  # fmt: skip
    for failing, case in enumerate(cases):
        passed = [g.passed for g in cuda_report.goals(_results(*case))]
        assert passed == [i != failing for i in range(6)], (failing, passed)


def test_a_figure_not_measured_says_why_and_the_report_still_renders() -> None:
    results = _results(1200, None, 12_000, 700, 9_000, 800, True)
    results["models"]["smollm2-135m"]["engines"]["graphs_on"]["host"][1]["why"] = "profiler saw no kernels"
    del results["models"]["qwen2.5-1.5b"]["server"]
    goals = cuda_report.goals(results)
    assert goals[0].passed is None and goals[0].shown == "not measured: profiler saw no kernels"
    assert goals[4].passed is None and goals[4].shown.startswith("not measured")
    text = cuda_report.markdown(results, goals)
    assert "NVIDIA H100 80GB HBM3" in text and text.count("| not measured |") == 2 and "**FAIL**" not in text
