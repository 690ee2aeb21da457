"""Models of real shapes with random weights, made where the benchmark runs: `benchmarks/cuda.py`'s models.

A lent GPU has no network and a call carries at most 64 MiB, so no real checkpoint reaches it; a decode step's
work does not depend on the weights' values, so a model of the real shape with random bf16 weights costs what the
real one does. Each shape is the `config.json` of the published model (dimensions, tied or not, Qwen2's q/k/v
biases, Llama 3's RoPE scaling). The weights are drawn on the device, written into a model directory (safetensors
shards, the config, a word-level tokenizer of `t<id>` words for the whole vocabulary) that infer and `infer serve`
load as they load any model, and handed to transformers as they are, on the device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SHARD_BYTES = 2 << 30  # a safetensors shard: at most this much is staged on the host at a time
INIT_STD = 0.02  # matrices and embeddings ~ N(0, 0.02), as the published configs' initializer_range
BOS_ID, EOS_ID = 0, 1  # the tokenizer's words t0 and t1; prompts use ids from 100 up (workloads.FIRST_ID)


@dataclass(frozen=True)
class Shape:
    key: str  # the name on the command line and in the report
    label: str  # the published model whose shape this is
    fields: dict[str, Any]  # its config.json, less what every model here shares (the token ids, the dtype)

    @property
    def num_layers(self) -> int:
        return int(self.fields["num_hidden_layers"])


_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
SHAPES = {
    s.key: s
    for s in (
        Shape("smollm2-135m", "SmolLM2-135M", {
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
            "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}),
        Shape("qwen2.5-1.5b", "Qwen2.5-1.5B (Qwen2.5-Coder-1.5B's shape)", {
            "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "use_sliding_window": False}),
        Shape("llama-3.2-1b", "Llama-3.2-1B", {
            "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}}),
        Shape("llama-3.1-8b", "Llama-3.1-8B", {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}}),
    )
}  # fmt: skip
# --tiny (the CPU dry run): every shape keeps its kind (tied or not, biases, RoPE scaling) at these sizes
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}  # fmt: skip


def config_json(shape: Shape, tiny: bool = False, num_layers: int | None = None) -> dict[str, Any]:
    """The model directory's config.json: the shape's fields (TINY's sizes when `tiny`; the first `num_layers`
    of its layers when given), the tokenizer's bos and eos, bf16."""
    fields = {**shape.fields, **(TINY if tiny else {})}
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[fields["model_type"]]
    return {**fields, "architectures": [arch], "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
            "torch_dtype": "bfloat16", "hidden_act": "silu"}  # fmt: skip


def random_weights(config: dict[str, Any], device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (transformers' names, one per parameter: a tied LM head is the embedding) drawn
    in bf16 on `device`: matrices and embeddings N(0, INIT_STD), norms 1, biases N(0, INIT_STD)."""
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(hf_config)
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, param in skeleton.named_parameters():  # NOTE: a tied head is the embedding's parameter: listed once
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(param.shape, dtype=torch.bfloat16, device=device)
        else:
            t = torch.empty(param.shape, dtype=torch.bfloat16, device=device)
            weights[name] = t.normal_(0.0, INIT_STD, generator=gen)
    return weights


def decode_bytes(config: dict[str, Any], weights: dict[str, torch.Tensor]) -> int:
    """The bytes of weights one decode step reads: every parameter once, less the embedding table when the LM
    head is a matrix of its own (a step reads one row of it per sequence); a tied table is read whole as the
    head."""
    total = sum(t.numel() * t.element_size() for t in weights.values())
    if not config.get("tie_word_embeddings", False):
        embed = weights["model.embed_tokens.weight"]
        total -= embed.numel() * embed.element_size()
    return total


def write_model_dir(out_dir: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Path:
    """`out_dir` as a model directory: config.json, the weights in safetensors shards of at most SHARD_BYTES
    (copied to the host one shard at a time) with their index, and the tokenizer."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: weights[n].contiguous().cpu() for n in names}, str(out_dir / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in weights.values())},
             "weight_map": weight_map}  # fmt: skip
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    write_tokenizer(out_dir, int(config["vocab_size"]))
    return out_dir


def write_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the whole vocabulary: id i is the word `t<i>` (prompts are token ids; the
    text a server streams is these words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token=f"t{BOS_ID}"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": f"t{BOS_ID}", "eos_token": f"t{EOS_ID}", "tokenizer_class": "PreTrainedTokenizerFast"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(special))


def hf_model(config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Any:
    """transformers' model of `config` over the same tensors (assigned, not copied: on their device, bf16)."""
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    device = next(iter(weights.values())).device
    with torch.device(device):  # NOTE: not the meta device: its RoPE buffers are computed at init
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    missing, _ = model.load_state_dict(weights, strict=False, assign=True)
    if set(missing) - {"lm_head.weight"}:
        raise ValueError(f"transformers' model has parameters the weights do not: {sorted(missing)[:3]}")
    if hf_config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
