"""The peer comparison's dimensions (precisions and speculation from the settings), its workloads (the committed
input-grounded prompts) and its arithmetic (medians, per-round ratios, goals) on made-up figures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infer.server.settings import SETTINGS, Setting, _bool

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import bench_matrix
import matrix_report


def test_every_quantization_choice_of_the_settings_is_a_precision() -> None:
    quantization = next(s for s in SETTINGS if s.name == "quantization")
    found = bench_matrix.precisions()
    assert list(found)[:2] == ["fp32", "bf16"] and found["bf16"] == {"dtype": "bfloat16"}
    assert set(found) - {"fp32", "bf16"} == set(quantization.choices) - {"none", "auto"}  # auto: none here
    assert found["int8"] == {"quantization": "int8"}


@pytest.mark.parametrize(
    ("setting", "on_flags", "off_flags", "engine_on"),
    [
        (Setting("speculative_decoding", _bool, "x"), ("--speculative-decoding",), ("--no-speculative-decoding",),
         True),
        (Setting("speculative_tokens", int, "x"), ("--speculative-tokens", "4"), ("--speculative-tokens", "0"), 4),
        (Setting("speculation", str, "x", choices=("none", "ngram")), ("--speculation", "ngram"),
         ("--speculation", "none"), "ngram"),
    ],
)  # fmt: skip
def test_speculation_is_whatever_setting_the_server_has(
    monkeypatch: pytest.MonkeyPatch, setting: Setting, on_flags: tuple[str, ...], off_flags: tuple[str, ...],
    engine_on: object,
) -> None:  # fmt: skip
    others = tuple(s for s in SETTINGS if not s.name.startswith("specul"))  # the server's own, if any
    monkeypatch.setattr(bench_matrix, "SETTINGS", (*others, setting))
    monkeypatch.setattr(Setting, "default", property(lambda s: False if s.parse is _bool else None))
    spec = bench_matrix.find_speculation()
    assert spec is not None and spec.flags(True) == on_flags and spec.flags(False) == off_flags
    assert spec.engine_settings(True) == {setting.name: engine_on}
    names = [v.name for v in bench_matrix.variants(["fp32", "int8"], spec)]
    assert names == ["fp32", "int8", "fp32+spec", "int8+spec"]


def test_without_a_speculation_setting_the_dimension_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_matrix, "SETTINGS", tuple(s for s in SETTINGS if not s.name.startswith("specul")))
    assert bench_matrix.find_speculation() is None
    assert bench_matrix.find_speculation("no_such_setting") is None
    assert [v.name for v in bench_matrix.variants(["fp32"], None)] == ["fp32"]


def test_the_grounded_prompts_are_real_text_of_four_tasks_and_fit_the_model(default_model_dir: Path) -> None:
    from infer.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(default_model_dir)
    prompts = bench_matrix.grounded_ids(tokenizer)
    tasks = [task for task, _ in prompts]
    assert {t: tasks.count(t) for t in set(tasks)} == {"summarize": 4, "extract": 4, "rewrite": 4, "code_edit": 4}
    im_start = tokenizer.token_to_id("<|im_start|>")
    for _, ids in prompts:
        assert ids[0] == im_start and 100 <= len(ids) <= 2048 - 128 - 8  # chat-formatted; room for 128 new
        assert tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    text = bench_matrix.GROUNDED_FILE.read_text()
    assert "Python Software Foundation License" in text and "def rgb_to_hsv" in text


def test_the_workloads_take_each_task_in_turn_and_random_prompts_in_range() -> None:
    grounded = [(t, (i,) * 10) for i, t in enumerate(["summarize", "summarize", "extract", "rewrite", "code_edit"])]
    work = bench_matrix.MatrixWork(batch1_requests=4, concurrent_requests=7, grounded_tokens=9, random_tokens=5)
    loads = bench_matrix.matrix_workloads(grounded, work)
    assert [r.tag for r in loads["grounded/batch1"].requests] == ["summarize", "extract", "rewrite", "code_edit"]
    assert [r.prompt[0] for r in loads["grounded/c16"].requests] == [0, 2, 3, 4, 1, 0, 2]
    assert loads["grounded/c16"].concurrency == 16 and loads["grounded/batch1"].concurrency == 1
    assert all(64 <= len(r.prompt) <= 512 and r.max_tokens == 5 for r in loads["random/c16"].requests)
    assert all(r.max_tokens == 9 for r in loads["grounded/batch1"].requests)
    with pytest.raises(ValueError, match=">= 1"):
        bench_matrix.MatrixWork(batch1_requests=0)


def _figures(b1: float, c16: float) -> dict[str, dict[str, float]]:
    batch1 = {"output_tok_s": b1, "decode_tok_s": b1, "ttft_p50_s": 0.1}
    return {"grounded/batch1": batch1, "random/batch1": batch1, "grounded/c16": {"output_tok_s": c16},
            "random/c16": {"output_tok_s": c16}}  # fmt: skip


def test_ratios_are_taken_within_a_round_and_goals_pick_the_best_precision() -> None:
    rounds = [
        {"fp32": _figures(50, 100), "int8": _figures(150, 400), "int8+spec": _figures(300, 380),
         "llama": _figures(100, 100)},
        {"fp32": _figures(40, 80), "int8": _figures(100, 300), "int8+spec": _figures(200, 290),
         "llama": _figures(50, 100)},
        {"int8": _figures(999, 999)},  # llama-server failed this round: no ratio from it
    ]  # fmt: skip
    assert bench_matrix.median_figure(rounds, "int8", "random/c16", "output_tok_s") == 400
    assert bench_matrix.median_ratio(rounds, "int8", "llama", "random/batch1", "decode_tok_s") == pytest.approx(1.75)
    goals = matrix_report.goals(rounds, ["fp32", "int8"], "offline")
    b1, c16, spec_grounded, spec_random = goals
    assert b1["ratio"] == pytest.approx(1.75) and b1["met"] is True and "(int8)" in b1["detail"]
    assert c16["ratio"] == pytest.approx(3.5) and c16["met"] is True
    assert spec_grounded["ratio"] == pytest.approx(2.0) and spec_grounded["met"] is True
    assert spec_random["ratio"] == pytest.approx(2.0)
    table = "\n".join(matrix_report.systems_table(rounds, ["fp32", "int8", "llama"]))
    assert "| int8 | 150.0 (1.75×) | 150.0 (1.75×) | 100 | 400.0 (3.50×) |" in table  # medians of 3 rounds
    assert "| llama | 75.0 | 75.0 | 100 | 100.0 |" in table  # of the 2 it ran in


def test_goals_are_not_measured_when_a_side_is_missing() -> None:
    rounds = [{"fp32": _figures(50, 100), "bf16": _figures(60, 120)}]
    goals = matrix_report.goals(rounds, ["fp32", "bf16"], "over HTTP")
    assert all(g["met"] is None and g["detail"] == "not run" for g in goals)
    lines = "\n".join(matrix_report.goals_table(goals))
    assert "| best precision / llama-server, batch-1 decode tok/s (over HTTP) | ≥ 1.5× | – |" in lines
