"""Offline `LLM.generate` on a serving workload: the ceiling the online server is compared with.

Run by benchmarks/serving.py in its own process (the servers are stopped meanwhile):
    python benchmarks/serving_offline.py WORKLOAD.json '{"num_blocks": 512}'
reads {"prompts": [[ids]], "max_tokens": [n]} and prints {"output_tokens_per_s": ..., ...} as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from infer import LLM, SamplingParams


def main() -> None:
    work = json.loads(Path(sys.argv[1]).read_text())
    settings = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    llm = LLM(None, **settings)
    prompts, max_tokens = work["prompts"], work["max_tokens"]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in max_tokens]
    llm.generate(prompts[:2], params[:2])  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    result = {"output_tokens": tokens, "seconds": elapsed, "output_tokens_per_s": tokens / elapsed}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
