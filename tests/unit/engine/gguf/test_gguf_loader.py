"""GGUF files as a model source: our model on a GGUF file against transformers reading the same file (the same
bits, dequantized), for every architecture and tensor type; the file's bits kept without a second rounding; clear
errors naming the file and the field for files we cannot serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from infer.engine.config import EngineConfig
from infer.engine.loader import ModelLoadError, load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from infer.kernels import Int4Weight, Int8GroupWeight, PackedWeight
from tests.helpers.tiny_gguf import write_tiny_gguf

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
PROMPT = torch.randint(0, 255, (40,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    arch = str(request.param)
    # six Gemma layers: the sixth attends globally, the others in a window of 8 (the prompt is 40 tokens)
    layers = 6 if arch == "gemma3" else 2
    path = write_tiny_gguf(
        tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, num_layers=layers, tied=arch != "qwen2"
    )
    return arch, path


@pytest.fixture(scope="module")
def reference(gguf_file: tuple[str, Path]) -> Any:
    import transformers

    path = gguf_file[1]
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def _logits(model: CausalLM, prompt: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, num_blocks=16, block_size=16)
    with torch.inference_mode():
        step = runner.prepare([SeqWork(prompt, 0, list(range(16)), True)]).step
        return model.compute_logits(model(step))


def _load(path: Path, quantization: str) -> CausalLM:
    return load_model(path, EngineConfig(quantization=quantization, max_model_len=256))


def test_floats_give_transformers_logits(gguf_file: tuple[str, Path], reference: Any) -> None:
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    got = _logits(_load(gguf_file[1], "none"), PROMPT)
    assert (got - expected).abs().max().item() <= 1e-6 * expected.abs().max().item() * 10


def test_the_files_bits_give_transformers_greedy_tokens(gguf_file: tuple[str, Path], reference: Any) -> None:
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    got = _logits(_load(gguf_file[1], "auto"), PROMPT)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert (got - expected).abs().max().item() <= 1e-4 * expected.abs().max().item()  # int16 inputs: ~1e-5


def _reference_weight(reference: Any, name: str) -> torch.Tensor:
    return reference.state_dict()[f"model.{name}"].float()


def _reference_fused(reference: Any, prefix: str, fused: str, parts: list[str]) -> torch.Tensor:
    """A fused projection of transformers' model: its own (Phi-3's `qkv_proj`), else its parts stacked."""
    if f"model.{prefix}{fused}.weight" in reference.state_dict():
        return _reference_weight(reference, f"{prefix}{fused}.weight")
    return torch.cat([_reference_weight(reference, f"{prefix}{p}.weight") for p in parts])


def test_packed_weights_are_the_files_values_exactly(gguf_file: tuple[str, Path], reference: Any) -> None:
    """No second rounding: every kept weight dequantizes to exactly what transformers read from the file."""
    model = _load(gguf_file[1], "auto")
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        prefix = f"layers.{i}."
        qkv = _reference_fused(reference, prefix, "self_attn.qkv_proj", [f"self_attn.{p}_proj" for p in "qkv"])
        gate_up = _reference_fused(reference, prefix, "mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"])
        o = _reference_weight(reference, f"{prefix}self_attn.o_proj.weight")
        down = _reference_weight(reference, f"{prefix}mlp.down_proj.weight")
        pairs = [(attn.qkv_proj.weight, qkv), (attn.o_proj.weight, o), (mlp.gate_up_proj.weight, gate_up),
                 (mlp.down_proj.weight, down)]  # fmt: skip
        for ours, theirs in pairs:
            values = ours.dequantize() if isinstance(ours, PackedWeight) else ours
            assert torch.equal(values, theirs), f"layer {i}"
    assert model.embed_packed is not None
    assert torch.equal(model.embed_packed.dequantize(), _reference_weight(reference, "embed_tokens.weight"))


def test_formats_follow_the_file(tmp_path: Path) -> None:
    """4-bit types land in int4, the rest in the 8-bit grouped format; a projection whose parts differ takes the
    wider one; a tied head reads the embedding table itself."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=1, types=("Q4_K",) * 2 + ("Q6_K",) + ("Q4_0",) * 4)
    model = _load(path, "auto")
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert isinstance(attn.qkv_proj.weight, Int8GroupWeight)  # Q4_K q, k beside a Q6_K v
    # K-quant scales stay two-level (fp16 per 256 inputs times int8 per group), Q4_0's fp16
    assert (attn.qkv_proj.weight.group, attn.qkv_proj.weight.scale_dtype) == (16, torch.int8)
    assert isinstance(attn.o_proj.weight, Int4Weight) and attn.o_proj.weight.scale_dtype == torch.float16
    assert isinstance(mlp.gate_up_proj.weight, Int4Weight)
    assert model.lm_head.weight is model.embed_packed


def test_five_bit_types_land_in_int5(tmp_path: Path) -> None:
    """Q5_0, Q5_1, Q5_K (and 4-bit parts beside them) keep the file's ~0.69 bytes a weight in int5, not 8 bits."""
    types = ("Q5_0", "Q5_0", "Q5_0", "Q5_K", "Q5_0", "Q4_K", "Q5_1")
    model = _load(write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=1, types=types), "auto")
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    formats = [(type(w.weight).__name__, w.weight.scale_dtype) for w in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                                                          mlp.down_proj)]  # fmt: skip
    assert formats == [("Int5Weight", torch.float16), ("Int5Weight", torch.int8), ("Int5Weight", torch.float32),
                       ("Int5Weight", torch.float16)]  # fmt: skip


def test_q6_k_lands_in_int6_alone_and_in_int8g_beside_other_types(tmp_path: Path) -> None:
    """Q4_K_M files' Q6_K down (and here o) projections keep the file's 0.82 bytes a weight in int6, with the
    file's values; a Q6_K v beside Q4_K q and k stays in 8-bit groups."""
    types = ("Q4_K", "Q4_K", "Q6_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K")
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", num_layers=1, types=types, tied=False)
    model = _load(path, "auto")
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert [type(w.weight).__name__ for w in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)] == [
        "Int8GroupWeight", "Int6Weight", "Int4Weight", "Int6Weight"]  # fmt: skip
    reader = GGUFReader(path)
    for name, linear in [("blk.0.attn_output.weight", attn.o_proj), ("blk.0.ffn_down.weight", mlp.down_proj)]:
        t = next(t for t in reader.tensors if t.name == name)
        expected = torch.from_numpy(dequantize(t.data, t.tensor_type)).reshape(linear.weight.shape)
        assert torch.equal(linear.weight.dequantize().view(torch.int32), expected.view(torch.int32)), name


def test_a_type_with_no_grouped_form_is_rounded_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen3", num_layers=2, types=("IQ4_NL", "Q8_0"))
    model = _load(path, "auto")
    assert isinstance(model.layers[0].mlp.down_proj.weight, Int8GroupWeight)
    assert [r.getMessage() for r in caplog.records if "IQ4_NL" in r.getMessage()] == [
        "tensor types with no exact grouped form (IQ4_NL): rounded to int8 codes per group of 32"
    ]


def test_none_dequantizes_and_int8_requantizes(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", num_layers=1, tied=False)
    floats = _load(path, "none")
    assert floats.embed_packed is None and isinstance(floats.layers[0].self_attn.qkv_proj.weight, torch.Tensor)
    assert not isinstance(_load(path, "int8").layers[0].mlp.down_proj.weight, torch.Tensor)


def _truncated(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.mark.parametrize("keep", [0.002, 0.5])
def test_a_truncated_file_is_named(tmp_path: Path, keep: float) -> None:
    path = _truncated(write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=1), tmp_path / "cut.gguf", keep)
    with pytest.raises(ModelLoadError, match=r"cut\.gguf"):
        _load(path, "auto")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelLoadError, match=r"x\.gguf is not a GGUF file"):
        _load(path, "auto")


def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=1)
    data = path.read_bytes()
    # the architecture string is the first metadata value: `llama` -> `mamba`, same length
    path.write_bytes(data.replace(b"llama", b"mamba", 1))
    with pytest.raises(ModelLoadError, match=r"m\.gguf.*general\.architecture: unsupported 'mamba'"):
        _load(path, "auto")


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=1)
    data = path.read_bytes()
    name = b"blk.0.ffn_up.weight"
    path.write_bytes(data.replace(name, b"blk.0.ffn_xx.weight", 1))
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'blk\.0\.ffn_xx\.weight'"):
        _load(path, "auto")


def test_a_directory_holding_one_gguf_file_is_that_model(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "m.gguf", "qwen3", num_layers=1)
    assert _load(tmp_path, "auto").cfg.model_type == "qwen3"
    write_tiny_gguf(tmp_path / "n.gguf", "qwen3", num_layers=1)
    with pytest.raises(ModelLoadError, match="several GGUF files"):
        _load(tmp_path, "auto")
