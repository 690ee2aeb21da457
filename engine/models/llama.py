"""Llama (2, 3.x) and the families that keep its layout (SmolLM, Mistral-style configs read as `llama`): the
`Architecture` defaults, with Llama 3's RoPE scaling read from the config; llama.cpp interleaves the rotary halves
of each q/k head's rows in its files."""

from __future__ import annotations

from infer.engine.models.architecture import Architecture


class Llama(Architecture):
    model_types = ("llama",)
    gguf_name = "llama"
    gguf_interleaved_qk = True
