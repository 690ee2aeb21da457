"""Decode steps replayed from CUDA graphs (engine/cuda_graphs.py) on the default model: the same greedy tokens
and logprobs as with --no-cuda-graphs, every batch size padded, no KV leak.

Run by `make test-gpu`; skipped on a machine without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer import LLM, SamplingParams
from infer.engine import TokenLogprob

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 5, 8,", "Dear Sir,"]


def _run(model_dir: Path, cuda_graphs: bool, dtype: str) -> tuple[list[list[int]], list[list[TokenLogprob]], int]:
    llm = LLM(str(model_dir), device="cuda", dtype=dtype, max_model_len=512, max_num_seqs=16,
              cuda_graphs=cuda_graphs)  # fmt: skip
    graphs = llm.core.runner.graphs
    assert graphs is not None and graphs.sizes == (1, 2, 4, 8, 16)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS] * 3  # 15 rows: padded to 16, then fewer as they end
    params = [SamplingParams(max_tokens=8 + 3 * i, temperature=0, logprobs=2, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    outputs = llm.generate(prompts, params)
    llm.core.block_manager.assert_no_leaks()
    return [o.token_ids for o in outputs], [o.logprobs or [] for o in outputs], graphs.num_replays


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_graphs_on_and_off_give_the_same_tokens_and_logprobs(default_model_dir: Path, dtype: str) -> None:
    tokens, logprobs, replays = _run(default_model_dir, True, dtype)
    eager_tokens, eager_logprobs, _ = _run(default_model_dir, False, dtype)
    assert replays > 20  # decode steps of every size from 16 down ran from graphs
    assert tokens == eager_tokens
    assert logprobs == eager_logprobs
