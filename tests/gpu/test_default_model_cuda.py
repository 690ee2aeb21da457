"""The default model on CUDA (Triton kernels compiled for real): transformers' greedy tokens, no KV leak.

Run by `make test-gpu`; skipped on a machine without CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from tests.helpers.hf_reference import hf_greedy

# NOTE: the Triton kernel modules are imported inside the tests, never at collection: under `make test`
# tests/unit/kernels/conftest.py must set TRITON_INTERPRET=1 before anything imports them
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a quiet village by the sea,"]
CHAT = [{"role": "user", "content": "Give me three tips for staying focused."}]
NUM_NEW = 32


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    return model.to("cuda").eval()


# 512: each prompt prefills in one step beside the others' decodes; 8: prompts prefill in 8-token chunks
@pytest.mark.parametrize("max_num_batched_tokens", [512, 8])
def test_greedy_tokens_match_transformers_on_cuda(
    default_model_dir: Path, reference: Any, max_num_batched_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infer.kernels import attention_triton
    from infer.kernels.attention_triton import paged_attention_triton

    launches = []

    def counted(*args: Any) -> torch.Tensor:
        launches.append(args[0].device)
        out: torch.Tensor = paged_attention_triton(*args)
        return out

    monkeypatch.setattr(attention_triton, "paged_attention_triton", counted)
    llm = LLM(str(default_model_dir), device="cuda", max_model_len=512, max_num_batched_tokens=max_num_batched_tokens)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS] + [llm.tokenizer.encode_chat(CHAT)]
    # min_tokens bans EOS as transformers' min_new_tokens does
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0, min_tokens=NUM_NEW)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    assert launches and all(d.type == "cuda" for d in launches)  # Triton attention ran, on the GPU
    assert ours == [hf_greedy(reference, p, NUM_NEW) for p in prompts]
    llm.core.block_manager.assert_no_leaks()


def test_bfloat16_on_cuda_starts_as_fp32_does(default_model_dir: Path, reference: Any) -> None:
    # bf16 rounds every activation, so a long greedy run drifts from fp32's; its first tokens do not
    llm = LLM(str(default_model_dir), device="cuda", dtype="bfloat16", max_model_len=512)
    prompt = llm.tokenizer.encode(PROMPTS[0])
    [out] = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0, min_tokens=4))
    assert out.token_ids == hf_greedy(reference, prompt, NUM_NEW)[:4]
    llm.core.block_manager.assert_no_leaks()
