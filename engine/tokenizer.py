"""A model directory's tokenizer: `tokenizers` turns text into ids and back, jinja2 renders chat templates.

Behaviour follows transformers' `AutoTokenizer` (v5) for the same directory:
- `tokenizer.json` alone decides which special tokens `encode` adds (its post-processor, e.g. Llama 3's BOS);
  `add_bos_token` / `add_eos_token` in `tokenizer_config.json` are ignored, as transformers does whenever a
  `tokenizer.json` exists.
- The named special tokens of `tokenizer_config.json` (bos, eos, unk, pad, ...) are registered as special
  added tokens, so `decode(skip_special_tokens=True)` drops them and `encode` never splits them.
- Chat templates render in a sandbox with the same globals and filters as transformers, bounded in time and
  size (engine/chat_template.py): a template is code from whoever made the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from infer.engine.chat_template import (
    DEFAULT_TIMEOUT_S,
    ChatTemplate,
    ChatTemplateError,
    RenderBounds,
    TemplateFailed,
    TemplateTooLong,
)

__all__ = ["ChatTemplateError", "TemplateFailed", "TemplateTooLong", "Tokenizer", "TokenizerLoadError"]

# Named special tokens, in transformers' order; each is also a chat-template variable.
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")

TokenSpec = str | AddedToken
logger = logging.getLogger(__name__)

# what every chat template must render at load (`check_chat_template`), and, where it supports tools, a tool call
PROBE_CHAT = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hello, how can I help?"},
    {"role": "user", "content": "What is the weather in Paris?"},
)
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PROBE_TOOL_CHAT = (
    *PROBE_CHAT,
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ]},
    {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C, sunny"},
)  # fmt: skip


class TokenizerLoadError(ValueError):
    """A tokenizer directory we cannot load; the message names the file."""


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        special_tokens: Mapping[str, TokenSpec] | None = None,
        extra_special_tokens: Sequence[TokenSpec] = (),
        eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
        template_origin: str = "the chat template",
        missing_template_hint: str = "give one with --chat-template, or add chat_template.jinja to the model directory",
    ) -> None:
        self._backend = backend
        named = dict(special_tokens or {})
        _register_special_tokens(backend, [*named.values(), *extra_special_tokens])
        # template variables: bos_token, eos_token, ... as plain strings
        self.special_tokens: dict[str, str] = {name: str(tok) for name, tok in named.items()}
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = backend.token_to_id(bos) if bos is not None else None
        eos_ids = set(eos_token_ids)
        eos = self.special_tokens.get("eos_token")
        if eos is not None and (eos_id := backend.token_to_id(eos)) is not None:
            eos_ids.add(eos_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        self._chat_template = chat_template
        self.template_origin = template_origin  # names the template in errors
        self.template_timeout_s = DEFAULT_TIMEOUT_S  # one render's time bound (the loader sets the server's)
        self.missing_template_hint = missing_template_hint  # what the error for a chat without a template says
        self._compiled_template: ChatTemplate | None = None

    @classmethod
    def from_dir(cls, model_dir: Path, model_eos_token_ids: Iterable[int] | None = None) -> Tokenizer:
        """Load `tokenizer.json` (required) and the optional tokenizer configs of a Hugging Face model directory.

        `model_eos_token_ids`: the model's EOS ids as the loader parsed them (`config.json`'s and
        `generation_config.json`'s); None, for a tokenizer loaded on its own, reads `generation_config.json`'s.
        Never reads `config.json`."""
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerLoadError(f"missing file: {path} (a tokenizer.json is required)")
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise TokenizerLoadError(f"cannot load {path}: {e}") from None
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        if "added_tokens_decoder" not in tok_cfg:
            tok_cfg.update(_read_json(model_dir / "special_tokens_map.json"))  # legacy layout
        special = {k: t for k in SPECIAL_TOKEN_NAMES if (t := _token_spec(tok_cfg.get(k))) is not None}
        extra = [t for k in EXTRA_SPECIAL_KEYS for raw in _as_list(tok_cfg.get(k)) if (t := _token_spec(raw))]
        if model_eos_token_ids is None:  # a tokenizer on its own: generation_config.json's (the loader's parse has it)
            eos_ids = _ids(_read_json(model_dir / "generation_config.json").get("eos_token_id"))
        else:
            eos_ids = set(model_eos_token_ids)
        return cls(
            backend,
            special_tokens=special,
            extra_special_tokens=extra,
            eos_token_ids=eos_ids,
            chat_template=_load_chat_template(model_dir, tok_cfg),
            template_origin=f"the chat template of {model_dir}",
        )

    # --- text <-> ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (transformers' `len(tokenizer)`)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # NOTE: encode_batch releases the GIL while it works, encode does not: a multi-MB prompt tokenized
        # in a thread would otherwise stall the event loop for seconds all the same
        return list(self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` (byte-level form, e.g. 'Ġthe'), None when out of range."""
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self._backend.id_to_token(i) for i in ids]

    # --- chat

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        self._chat_template, self._compiled_template = template, None

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        max_chars: int | None = None,
        **template_vars: Any,
    ) -> str:
        """Render `messages` like transformers' `apply_chat_template(..., tokenize=False)`, within
        `template_timeout_s` and `max_chars` characters (None: chat_template.DEFAULT_MAX_CHARS).

        Extra `template_vars` (e.g. `tools`, `enable_thinking`) are passed to the template; they override the
        special-token variables. Raises ChatTemplateError when there is no template, TemplateFailed when it
        fails (it raised, or ran out of time), TemplateTooLong when its output grew past `max_chars`.
        """
        if not messages:
            raise ChatTemplateError("cannot apply a chat template to an empty conversation")
        template = self._template()
        # like transformers: keys whose value is None are dropped (OpenAI clients send content=None)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        variables: dict[str, Any] = {"tools": None, "documents": None, **self.special_tokens, **template_vars}
        variables |= {"messages": chat, "add_generation_prompt": add_generation_prompt}
        bounds = RenderBounds(self.template_timeout_s, *(() if max_chars is None else (max_chars,)))
        return template.render(bounds, variables)

    def check_chat_template(self) -> None:
        """Render the template once on a probe conversation (system, user, assistant, user; then without the
        system turn, which some templates refuse), so one that cannot render is found at load, not by every
        request. ChatTemplateError names the template; a failure on a tool call and its result only is logged
        (a template may not support tools). Nothing to check without a template."""
        if self._chat_template is None:
            return
        try:
            self.apply_chat_template(PROBE_CHAT)
        except ChatTemplateError as e:
            try:
                self.apply_chat_template(PROBE_CHAT[1:])
            except ChatTemplateError:
                raise ChatTemplateError(f"{e} (on a probe conversation: system, user, assistant, user)") from None
            logger.warning("%s refuses a system turn: %s", self.template_origin, e)
        try:
            self.apply_chat_template(PROBE_TOOL_CHAT, tools=[PROBE_TOOL])
        except ChatTemplateError as e:
            logger.warning("%s cannot render a tool call and its result: %s", self.template_origin, e)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **template_vars: Any
    ) -> list[int]:
        """Token ids of the rendered chat; the template writes its own special tokens (no BOS is added)."""
        text = self.apply_chat_template(messages, add_generation_prompt, **template_vars)
        return self.encode(text, add_special_tokens=False)

    def _template(self) -> ChatTemplate:
        if self._compiled_template is None:
            if self._chat_template is None:
                raise ChatTemplateError(f"this model has no chat template: {self.missing_template_hint}")
            self._compiled_template = ChatTemplate(self._chat_template, self.template_origin)
        return self._compiled_template


# --- loading helpers


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, {} if the (optional) file is absent."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} must hold a JSON object")
    return data


def _as_list(raw: Any) -> list[Any]:
    """A list of tokens; v5 configs may name them instead (`{"image_token": "<image>"}`)."""
    if isinstance(raw, dict):
        return list(raw.values())
    return list(raw) if isinstance(raw, list) else []


def _ids(raw: Any) -> set[int]:
    """`eos_token_id` as a set: configs hold an int, a list of ints or null."""
    if raw is None:
        return set()
    return {int(i) for i in raw} if isinstance(raw, list) else {int(raw)}


def _token_spec(raw: Any) -> TokenSpec | None:
    """A config token: a plain string, or an AddedToken dict (`{"content": ..., "lstrip": ...}`)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and isinstance(raw.get("content"), str):
        flags = {k: bool(raw[k]) for k in ("single_word", "lstrip", "rstrip", "normalized") if k in raw}
        return AddedToken(raw["content"], special=True, **flags)
    return None


def _register_special_tokens(backend: BackendTokenizer, tokens: Sequence[TokenSpec]) -> None:
    """Mark config-named tokens special, adding missing ones (new ids at the end), like transformers."""
    added_by_content = {t.content: t for t in backend.get_added_tokens_decoder().values()}
    for tok in tokens:
        content = tok if isinstance(tok, str) else tok.content
        if (known := added_by_content.get(content)) is not None:
            flags = dict(single_word=known.single_word, lstrip=known.lstrip, rstrip=known.rstrip)
            tok = AddedToken(content, normalized=known.normalized, special=True, **flags)
        elif isinstance(tok, str):
            tok = AddedToken(tok, special=True, normalized=False)
        backend.add_special_tokens([tok])
        added_by_content[content] = tok


def _load_chat_template(model_dir: Path, tok_cfg: Mapping[str, Any]) -> str | None:
    """`chat_template.jinja` wins; else the config's template (a string, or a named list: 'default')."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raw = tok_cfg.get("chat_template")
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("default")
    return raw if isinstance(raw, str) else None
