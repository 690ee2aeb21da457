"""Lower-precision weights against transformers fp32: greedy agreement and perplexity.

For each precision option (fp32, `--dtype bfloat16`, `--quantization int8`,
`--quantization int4`) of the default model: the greedy tokens of 8 prompts x 64
new tokens compared with transformers' fp32 greedy tokens (the tokens matching
before the first difference, and position by position), and the perplexity of a
fixed text; for int4 also the perplexity with an int4 LM head (`int4_head_int4`;
the engine keeps it int8). Writes docs/benchmarks/precision.json and precision.md.

NOTE: the default model is llama.cpp's Q4_1 GGUF dequantized to fp32 (Q4_1 layers, a Q8_0 embedding and tied
head), so the fp32 row is also llama.cpp's Q4_1 weights' perplexity on this text, computed by our engine.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from infer import LLM, SamplingParams
from infer.engine.default_model import default_model_dir
from infer.engine.runner import ModelRunner, SeqWork

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
PROMPTS: list[str] = json.loads((Path(__file__).resolve().parent / "parity_prompts.json").read_text(encoding="utf-8"))
TEXT = (
    "The river runs past the old mill and under the stone bridge before it widens into the lake. "
    "In spring the water is high and brown with mud from the hills; by late summer it is clear enough "
    "to see the trout holding still against the current. People from the town walk along the bank in "
    "the evening, and children throw bread to the ducks that gather near the reeds. The mill has not "
    "ground flour for fifty years, but its wheel still turns when the water is high, and the sound of "
    "it carries across the fields. A small museum in the miller's house shows the tools that were used "
    "to dress the stones, the ledgers in which every sack was recorded, and photographs of the families "
    "who worked there. Most visitors stay for an hour, have tea in the garden, and leave by the path "
    "that follows the water back towards the town."
)
OPTIONS = {
    "fp32": {},
    "bf16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
}


def hf_greedy(model: Any, prompts: list[list[int]], num_new: int) -> list[list[int]]:
    """transformers' greedy tokens, EOS a token like any other, as infer's `ignore_eos` treats it.

    NOTE: not `generate(min_new_tokens=...)`: that forbids EOS, so every EOS infer chose counted as a miss.
    """
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            step, past, new = torch.tensor([ids]), None, []
            for _ in range(num_new):
                out = model(step, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, int(out.logits[0, -1].argmax())
                new.append(token)
                step = torch.tensor([[token]])
            outs.append(new)
    return outs


@torch.inference_mode()
def perplexity(llm: LLM, ids: list[int]) -> float:
    """exp(mean next-token NLL) of `ids`, one prefill over the whole text."""
    runner: ModelRunner = llm.core.runner
    num_blocks = -(-len(ids) // runner.block_size)
    step = runner.prepare([SeqWork(ids, 0, list(range(num_blocks)), True)]).step
    logits = runner.model.compute_logits(runner.model(step))  # [n, vocab] fp32
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(float(nll))


def perplexity_with_int4_head(llm: LLM, ids: list[int]) -> float:
    """The perplexity with the (tied) LM head packed as int4 too, which the engine keeps int8."""
    model = llm.core.runner.model
    int8_head = model.lm_head.weight
    model.lm_head.weight = model.kernels.quantize(model.embed_tokens, "int4")
    try:
        return perplexity(llm, ids)
    finally:
        model.lm_head.weight = int8_head


def agreement(ours: list[list[int]], ref: list[list[int]]) -> tuple[float, float]:
    """Mean tokens matching before the first difference, and the share of equal positions."""
    pairs = list(zip(ours, ref, strict=True))
    prefix = [next((i for i, (a, b) in enumerate(zip(o, r, strict=True)) if a != b), len(r)) for o, r in pairs]
    same = sum(a == b for o, r in pairs for a, b in zip(o, r, strict=True))
    return sum(prefix) / len(prefix), same / sum(len(r) for r in ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args()
    import transformers

    model_dir = default_model_dir()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results: dict[str, Any] = {"model": model_dir.name, "new_tokens": args.new_tokens, "prompts": len(PROMPTS)}
    for name, settings in OPTIONS.items():
        llm = LLM(str(model_dir), max_model_len=1024, **settings)
        prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
        if "reference" not in results:
            results["reference"] = hf_greedy(hf, prompts, args.new_tokens)
        params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
        ours = [o.token_ids for o in llm.generate(prompts, params)]
        prefix, share = agreement(ours, results["reference"])
        text_ids = llm.tokenizer.encode(TEXT)
        results[name] = {"prefix_tokens": prefix, "equal_share": share, "perplexity": perplexity(llm, text_ids)}
        if name == "int4":
            results[name]["perplexity_int4_head"] = perplexity_with_int4_head(llm, text_ids)
        results["text_tokens"] = len(text_ids)
        results["kernels"] = "compiled CPU kernels" if llm.core.model_info.kernels == "cpu" else "PyTorch references"
        del llm
    write_report(results, args.out_dir)
    print(json.dumps({k: v for k, v in results.items() if k != "reference"}, indent=2))


def write_report(r: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "precision.json").write_text(json.dumps(r, indent=2) + "\n")
    base = r["fp32"]["perplexity"]
    lines = [
        "# Lower-precision weights: agreement with transformers fp32",
        "",
        f"Measured by `python benchmarks/precision.py` ({r['kernels']}), model {r['model']}: greedy tokens of "
        f"{r['prompts']} prompts x {r['new_tokens']} new tokens against transformers' fp32 greedy tokens, and "
        f"the perplexity of a fixed {r['text_tokens']}-token English text (`TEXT` in the script).",
        "",
        "| weights | tokens matching before the first difference (mean of 8) | equal positions | perplexity | delta |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in OPTIONS:
        o = r[name]
        lines.append(
            f"| {name} | {o['prefix_tokens']:.1f} / {r['new_tokens']} | {100 * o['equal_share']:.0f}% "
            f"| {o['perplexity']:.3f} | {100 * (o['perplexity'] / base - 1):+.2f}% |"
        )
    if "perplexity_int4_head" in r.get("int4", {}):
        head = r["int4"]["perplexity_int4_head"]
        lines += [
            "",
            f"The int4 row keeps the LM head int8 (as llama.cpp's Q4_1 files keep it Q8_0); with an int4 head too "
            f"the perplexity is {head:.3f} ({100 * (head / base - 1):+.2f}%).",
        ]
    lines += [
        "",
        "NOTE: this default model is llama.cpp's Q4_1 GGUF dequantized (Q4_1 layers, a Q8_0 embedding and tied "
        "head), so fp32 is also llama.cpp's Q4_1 perplexity on this text (through our engine), and int4's groups "
        "of 32 land on Q4_1's own grid: its layers lose almost nothing here. The int4 LM head, which re-quantizes "
        "the Q8_0 embedding, is the one place this model shows what int4 costs an 8-bit weight.",
    ]
    (out_dir / "precision.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
