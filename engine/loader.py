"""Load a model: a Hugging Face directory or a GGUF file. `load_model` reads the config once (`config.json`, or
the GGUF metadata), chooses the kernel backend for the device and dtype, builds the model, fills it from the
safetensors weights (one file or sharded) or the GGUF tensors (kept in their own bits: `gguf/weights.py`),
places it, quantizes it and hands its layers to the backend's fused stack where there is one."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from infer.engine.config import EngineConfig, Quantization
from infer.engine.cuda_graphs import NO_GRAPHS, graphs_for
from infer.engine.gguf.check import checked_config
from infer.engine.gguf.config import GGUFConfigError
from infer.engine.gguf.source import GGUFSource, GGUFSourceError, find_gguf, open_gguf
from infer.engine.gguf.weights import GGUFWeightError, fill_model
from infer.engine.interface import ModelInfo
from infer.engine.model_check import check_special_ids, check_tensors, check_vocab
from infer.engine.model_config import ModelCheckError, ModelConfig
from infer.engine.models import CausalLM, Target, checkpoint_target, convert_tensor
from infer.engine.models.registry import architecture, parse_model_config
from infer.engine.runner import ModelRunner, kv_cache_bytes_per_block
from infer.engine.tokenizer import ChatTemplateError, Tokenizer, TokenizerLoadError
from infer.kernels import select_kernels

logger = logging.getLogger(__name__)


class ModelLoadError(ValueError):
    """A model directory we cannot load; the message names the file or tensor."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"missing file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data


def load_model_config(model_dir: Path) -> ModelConfig:
    cfg = read_json(model_dir / "config.json")
    generation = model_dir / "generation_config.json"
    generation_eos = read_json(generation).get("eos_token_id") if generation.is_file() else None
    if generation_eos is not None:  # NOTE: both count (generation stops at either), as they did for the tokenizer
        cfg["eos_token_id"] = list(dict.fromkeys(_as_list(cfg.get("eos_token_id")) + _as_list(generation_eos)))
    try:
        return parse_model_config(cfg)
    except ValueError as e:
        raise ModelLoadError(f"{model_dir / 'config.json'}: {e}") from None


def _as_list(raw: Any) -> list[Any]:
    """An `eos_token_id`: an int, a list of them, or null."""
    return [] if raw is None else list(raw) if isinstance(raw, list) else [raw]


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise ModelLoadError(f"{index.name} lists missing weight files: {', '.join(missing)}")
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    return files


def _copy_into(param: torch.Tensor, target: Target, tensor: torch.Tensor, name: str) -> None:
    dest = param if target.num_rows is None else param.narrow(0, target.row_start, target.num_rows)
    if tuple(dest.shape) != tuple(tensor.shape):
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)} for this config"
        )
    dest.copy_(tensor)


def _target(cfg: ModelConfig, name: str, params: dict[str, torch.nn.Parameter], path: Path) -> Target | None:
    """Where tensor `name` of file `path` goes (None: skip it); ModelLoadError for one the model does not have."""
    unexpected = ModelLoadError(f"unexpected tensor {name!r} in {path.name} for {cfg.model_type}")
    try:
        target = checkpoint_target(cfg, name)
    except ValueError:
        raise unexpected from None
    if target is not None and target.param not in params:
        raise unexpected
    return target


def _load_weights(model: CausalLM, files: list[Path]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    rows_loaded: dict[str, int] = dict.fromkeys(params, 0)
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = _target(model.cfg, name, params, path)
                if target is None:
                    continue
                tensor = convert_tensor(model.cfg, target, f.get_tensor(name))
                _copy_into(params[target.param], target, tensor, name)
                rows_loaded[target.param] += target.num_rows or params[target.param].shape[0]
    if model.cfg.tie_word_embeddings:
        rows_loaded["lm_head.weight"] = rows_loaded["embed_tokens"]
    missing = [n for n, p in params.items() if rows_loaded[n] != p.shape[0]]
    if missing:
        raise ModelLoadError(f"weights missing from checkpoint: {', '.join(sorted(missing)[:5])}")


def load_model(model_path: str | Path, config: EngineConfig | None = None, kernels: str | None = None) -> CausalLM:
    """The model a directory or GGUF file describes, loaded for `config` (its device, dtype, max_model_len and
    quantization; the defaults when None) on the kernel backend `kernels` names (None: `config.kernels`, whose
    None is INFER_KERNELS), chosen here, once.

    The config is read once; `model.cfg` is what it says. ValueError when `config.max_model_len` is more
    than the model's positions (before any weight is read), ModelLoadError for a model we cannot load.
    """
    path, config = Path(model_path), config or EngineConfig()
    kernels = config.kernels if kernels is None else kernels
    gguf_file = _find_gguf(path)
    if gguf_file is not None:
        return load_gguf_model(open_source(gguf_file), config, kernels)
    return _load_directory(path, config, kernels)


def _load_directory(path: Path, config: EngineConfig, kernels: str | None) -> CausalLM:
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    cfg = load_model_config(path)
    config.for_model(cfg.max_position_embeddings)  # a max_model_len past the model's: before the weights are read
    files = weight_files(path)
    _check_tensor_shapes(cfg, files, path)
    model = _empty_model(cfg, config, kernels)
    _load_weights(model, files)
    return _placed(model, config, "none" if config.quantization == "auto" else config.quantization)


def _check_tensor_shapes(cfg: ModelConfig, files: list[Path], model_dir: Path) -> None:
    """The config against the shapes in the weight files' headers, before a layer is built (`model_check.py`)."""
    shapes: list[tuple[str, str, tuple[int, ...]]] = []
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                names = [n for n in f.keys() if not _is_ignored(cfg, n)]  # noqa: SIM118
                shapes += [(name, name, tuple(f.get_slice(name).get_shape())) for name in names]
        except Exception as e:  # NOTE: safetensors raises its own SafetensorError for a bad header
            raise ModelLoadError(f"cannot read the tensors of {path}: {e}") from None
    try:
        check_tensors(cfg, shapes, architecture(cfg.model_type).layer_shapes(cfg))
    except ModelCheckError as e:
        raise ModelLoadError(f"{model_dir / 'config.json'}: {e}") from None


def _is_ignored(cfg: ModelConfig, name: str) -> bool:
    """A checkpoint tensor the loader skips (a vision tower's, a tied LM head): it sizes nothing."""
    try:
        return checkpoint_target(cfg, name) is None
    except ValueError:  # NOTE: one the model does not have: checked (a layer past the count), else refused later
        return False


def _empty_model(cfg: ModelConfig, config: EngineConfig, kernels: str | None) -> CausalLM:
    """The model's modules on the CPU, weights unfilled, on the kernel backend chosen here, once. ValueError when
    `config.max_model_len` is more than the model's positions (before any weight is read)."""
    max_model_len = config.for_model(cfg.max_position_embeddings).max_model_len
    backend = select_kernels(config.device, config.torch_dtype, kernels)
    with torch.device("cpu"):
        return CausalLM(cfg, backend, max_positions=max_model_len)


def _placed(model: CausalLM, config: EngineConfig, quantization: str) -> CausalLM:
    """A filled model on its device and dtype, quantized, its layers handed to the fused stack."""
    placed = model.to_device(torch.device(config.device), config.torch_dtype).eval()
    return placed.quantize(Quantization.of(quantization)).fuse()


def _find_gguf(path: Path) -> Path | None:
    try:
        return find_gguf(path)
    except GGUFSourceError as e:
        raise ModelLoadError(str(e)) from None


def open_source(gguf_file: Path) -> GGUFSource:
    """The GGUF file's metadata and tensors; ModelLoadError naming the file when it cannot be read."""
    try:
        return open_gguf(gguf_file)
    except GGUFSourceError as e:
        raise ModelLoadError(str(e)) from None


def gguf_config(source: GGUFSource) -> ModelConfig:
    """The file's model config, checked against its tensors and vocabulary before a layer is built."""
    try:
        return checked_config(source.meta, source.tensors)
    except GGUFConfigError as e:
        raise ModelLoadError(f"{source.path}: {e}") from None


def load_gguf_model(source: GGUFSource, config: EngineConfig, kernels: str | None = None) -> CausalLM:
    """A GGUF file's model: `quantization` auto keeps every tensor's own bits (`gguf/weights.py`); none, int8 and
    int4 dequantize the file to floats first (none stops there)."""
    model = _empty_model(gguf_config(source), config, kernels)
    keep = config.quantization == "auto"
    try:
        fill_model(model, str(source.meta["general.architecture"]), source.tensors, keep=keep)
    except GGUFWeightError as e:
        raise ModelLoadError(f"{source.path}: {e}") from None
    return _placed(model, config, "none" if keep else config.quantization)


def resolve_model_dir(model: str | None) -> Path:
    if model is not None:
        return Path(model).expanduser()
    from infer.engine.default_model import default_model_dir

    return default_model_dir()


def load_engine(config: EngineConfig) -> tuple[EngineConfig, ModelRunner, Tokenizer, ModelInfo]:
    """An engine core's parts for the model `config.model` names (a directory or a GGUF file; the default model
    when None): the config settled for the model, the runner with its KV cache, the tokenizer and what clients
    see."""
    with _collector_paused():
        return _engine_parts(config)


def _engine_parts(config: EngineConfig) -> tuple[EngineConfig, ModelRunner, Tokenizer, ModelInfo]:
    path = resolve_model_dir(config.model)
    template = read_chat_template(config.chat_template)
    gguf_file = _find_gguf(path)
    if gguf_file is not None:
        model, tokenizer, model_id = _load_gguf(gguf_file, config, template)
    else:
        model, tokenizer, model_id = _load_directory_and_tokenizer(path, config, template)
    _check_chat_template(tokenizer, config)
    _return_freed_memory()  # before the KV cache: with it, the peak of the load
    config = config.for_model(model.cfg.max_position_embeddings)
    block_bytes = kv_cache_bytes_per_block(model, config.block_size, config.torch_dtype)
    num_blocks = config.num_blocks or config.kv_cache_memory_bytes // block_bytes
    info = ModelInfo(
        model_id=model_id,
        model_dir=str(path),
        vocab_size=model.cfg.vocab_size,
        eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),  # the model config's among them
        has_chat_template=tokenizer.chat_template is not None,
        kernels=model.kernels.name,
    )
    runner = ModelRunner(model, num_blocks, config.block_size, seed=config.seed, max_num_seqs=config.max_num_seqs,
                         max_num_batched_tokens=config.max_num_batched_tokens,
                         max_model_len=config.max_model_len)  # fmt: skip
    graphs = graphs_for(runner.device, model.kernels.name, config.cuda_graphs, config.max_num_seqs)
    if graphs is not None:
        runner.use_graphs(graphs)
        g = graphs.stats
        how = "captured" if config.cuda_graphs else "run eagerly (--no-cuda-graphs)"
        logger.info("CUDA graphs: decode steps padded to %d sizes (%d to %d rows), %s in %.2f s, %.1f MiB",
                    len(g.sizes), g.sizes[0], g.sizes[-1], how, g.capture_s, g.memory_bytes / 2**20)  # fmt: skip
        info = replace(info, cuda_graphs=g if config.cuda_graphs else NO_GRAPHS)
    return config, runner, tokenizer, info


def _load_gguf(gguf_file: Path, config: EngineConfig, template: str | None) -> tuple[CausalLM, Tokenizer, str]:
    """The model and the tokenizer of a GGUF file; its metadata (Gemma's 262,144 tokens and scores as Python
    lists, ~40 MB) and its memory map go when this returns, before the KV cache is allocated.

    NOTE: the tokenizer comes after the weights. Beside them on a thread (OpenMP on both cores against the GIL)
    the two took longer than one after the other and peaked 30-110 MB higher; before them, the load peaked 12 MB
    lower but the server held 30-70 MB more after its first 17 requests (Gemma 3 270M, Qwen2.5-Coder 0.5B)."""
    source = open_source(gguf_file)
    model = load_gguf_model(source, config)
    tokenizer = gguf_tokenizer(source, template)
    check_tokenizer(model.cfg, tokenizer, str(gguf_file))
    return model, tokenizer, source.name


def check_tokenizer(cfg: ModelConfig, tokenizer: Tokenizer, where: str) -> None:
    """No id the tokenizer makes past the embedding's rows (fewer is fine: padded embeddings), its eos and bos
    ids among them; ModelLoadError naming what does not fit."""
    special = {
        "eos": sorted(tokenizer.eos_token_ids),
        "bos": [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id],
    }
    try:
        check_vocab(cfg, tokenizer.vocab_size)
        check_special_ids(cfg, special)
    except ModelCheckError as e:
        raise ModelLoadError(f"{where}: {e}") from None


def _load_directory_and_tokenizer(
    path: Path, config: EngineConfig, template: str | None
) -> tuple[CausalLM, Tokenizer, str]:
    model = _load_directory(path, config, None)
    try:
        tokenizer = Tokenizer.from_dir(path, model.cfg.eos_token_ids)
    except TokenizerLoadError as e:
        raise ModelLoadError(str(e)) from None
    check_tokenizer(model.cfg, tokenizer, str(path / "tokenizer.json"))
    if template is not None:
        tokenizer.chat_template = template
    return model, tokenizer, path.name


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a model loads (the collector left as it was found). NOTE: a load makes
    millions of objects (Gemma's vocabulary, its 514,906 merges) and little cyclic garbage; each full pass walks
    every live object, torch's modules included: 0.4-0.6 s of Gemma's 1.4-2.2 s tokenizer on 2 cores."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _return_freed_memory() -> None:
    """The C heap's free memory back to the system (glibc's `malloc_trim`; a no-op elsewhere). NOTE: the load's
    transient objects (the metadata's lists, a vocabulary and merges on their way into Rust) leave free memory
    that glibc keeps and the process's RSS counts: 10-30 MB."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def _check_chat_template(tokenizer: Tokenizer, config: EngineConfig) -> None:
    """The chat template bounded by the config's time bound, named after its file when `--chat-template` gave
    it, and rendered once on a probe conversation: one that cannot render stops the load (ModelLoadError)."""
    tokenizer.template_timeout_s = config.chat_template_timeout_s
    if config.chat_template is not None:
        tokenizer.template_origin = f"the chat template {config.chat_template} (--chat-template)"
    try:
        tokenizer.check_chat_template()
    except ChatTemplateError as e:
        raise ModelLoadError(f"{e}: the server does not start with a chat template that cannot render (replace it "
                             "with --chat-template FILE)") from None  # fmt: skip


def read_chat_template(path: str | None) -> str | None:
    """The text of a `--chat-template` file (None: the model's own)."""
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"chat template {path}: {e}") from None


def gguf_tokenizer(source: GGUFSource, chat_template: str | None) -> Tokenizer:
    """The tokenizer a GGUF file describes (`gguf/tokenizer.py`), the file's chat template unless one is given."""
    from infer.engine.gguf.tokenizer import tokenizer_from_gguf

    try:
        return tokenizer_from_gguf(source.meta, str(source.path), chat_template)
    except TokenizerLoadError as e:
        raise ModelLoadError(str(e)) from None
