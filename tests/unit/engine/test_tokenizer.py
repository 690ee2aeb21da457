"""Tokenizer: encode/decode, BOS/EOS and chat templates match transformers' AutoTokenizer on the same dir."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as BackendTokenizer

from infer.engine.tokenizer import ChatTemplateError, TemplateFailed, Tokenizer, TokenizerLoadError
from tests.helpers.tiny_tokenizer import train_byte_bpe

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXTS = [
    "Hello world",
    " leading space and trailing ",
    "The capital of France is Paris.",
    "日本語のテキスト、中文测试",
    "🙂🚀 family 👨‍👩‍👧",
    "Café naïve déjà vu",
    "special <|im_end|> inside<|im_start|>",
    "",
]
CONVERSATION = [
    {"role": "system", "content": "You are terse. Réponds en français 🙂."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris. 日本語も話せます。"},
    {"role": "user", "content": "And of Japan?"},
]


def make_backend(vocab_size: int = 420, bos_post_processor: bool = False) -> BackendTokenizer:
    return train_byte_bpe(vocab_size, SPECIALS, bos_post_processor)


def write_model_dir(
    out_dir: Path,
    *,
    bos_post_processor: bool = False,
    tokenizer_config: dict[str, Any] | None = None,
    chat_template_file: str | None = CHATML,
    extra_files: dict[str, dict[str, Any]] | None = None,
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    make_backend(bos_post_processor=bos_post_processor).save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|im_end|>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps({**config, **(tokenizer_config or {})}))
    if chat_template_file is not None:
        (out_dir / "chat_template.jinja").write_text(chat_template_file, encoding="utf-8")
    for name, data in (extra_files or {}).items():
        (out_dir / name).write_text(json.dumps(data))
    return out_dir


@functools.cache
def load_pair(model_dir: Path) -> tuple[Tokenizer, Any]:
    """Our tokenizer and transformers' AutoTokenizer for `model_dir` (loaded once per directory)."""
    from transformers import AutoTokenizer

    return Tokenizer.from_dir(model_dir), AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(params=["tiny", "default"])
def model_dir(request: pytest.FixtureRequest, tiny_dir: Path) -> Path:
    """The tiny local tokenizer, and the real default model (SmolLM2) when its fixture is available."""
    if request.param == "tiny":
        return tiny_dir
    path: Path = request.getfixturevalue("default_model_dir")
    return path


# --- encode / decode


def test_multibyte_characters_span_tokens(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    ids = tok.encode("日本語のテキスト 🙂", add_special_tokens=False)
    assert any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(model_dir: Path, text: str, add_special_tokens: bool) -> None:
    ours, hf = load_pair(model_dir)
    assert ours.encode(text, add_special_tokens) == hf.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(model_dir: Path, skip_special_tokens: bool) -> None:
    ours, hf = load_pair(model_dir)
    ids = ours.encode_chat(CONVERSATION)
    expected = hf.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == expected
    assert ("<|im_start|>" in expected) != skip_special_tokens


def test_vocab_and_special_ids_match_transformers(model_dir: Path) -> None:
    ours, hf = load_pair(model_dir)
    assert ours.vocab_size == len(hf)
    assert ours.bos_token_id == hf.bos_token_id
    assert hf.eos_token_id in ours.eos_token_ids
    ids = ours.encode("Hello 日本", add_special_tokens=False)
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.id_to_token(ids[0]) == hf.convert_ids_to_tokens(ids[0])
    assert ours.id_to_token(10**9) is None


@pytest.mark.parametrize("bos_post_processor", [True, False])
@pytest.mark.parametrize("add_bos_token", [True, False, None])
def test_bos_handling_matches_transformers(
    tmp_path: Path, bos_post_processor: bool, add_bos_token: bool | None
) -> None:
    cfg = {} if add_bos_token is None else {"add_bos_token": add_bos_token}
    model_dir = write_model_dir(tmp_path, bos_post_processor=bos_post_processor, tokenizer_config=cfg)
    ours, hf = load_pair(model_dir)
    ids = ours.encode("Hello world")
    assert ids == hf.encode("Hello world")
    # transformers v5 trusts tokenizer.json's post-processor whenever that file exists
    assert (ids[0] == ours.bos_token_id) == bos_post_processor
    plain = ours.encode("Hello world", add_special_tokens=False)
    assert plain == hf.encode("Hello world", add_special_tokens=False)


def test_config_special_tokens_are_registered_like_transformers(tmp_path: Path) -> None:
    # "<pad>" is in no vocabulary (a new id), "<|endoftext|>" is already an added token
    legacy_bos = {"__type": "AddedToken", "content": "<s>", "lstrip": True, "normalized": False}
    cfg = {"pad_token": "<pad>", "unk_token": "<|endoftext|>", "bos_token": legacy_bos}
    model_dir = write_model_dir(tmp_path, tokenizer_config=cfg)
    ours, hf = load_pair(model_dir)
    text = "a <pad>b <s> c<|endoftext|>"
    assert ours.encode(text) == hf.encode(text)
    assert ours.vocab_size == len(hf)
    ids = ours.encode(text)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.special_tokens["bos_token"] == "<s>"


def test_eos_token_ids_from_the_loader_or_generation_config(tmp_path: Path) -> None:
    extra: dict[str, dict[str, Any]] = {"generation_config.json": {"eos_token_id": [5, 6]}}
    model_dir = write_model_dir(tmp_path, extra_files=extra)
    # the loader's ids (config.json's and generation_config.json's, parsed once): generation_config.json not read
    tok = Tokenizer.from_dir(model_dir, model_eos_token_ids=(5, 6, 7))
    im_end = tok.token_to_id("<|im_end|>")
    assert im_end is not None
    assert tok.eos_token_ids == frozenset({5, 6, 7, im_end})
    # a tokenizer on its own reads generation_config.json's
    assert Tokenizer.from_dir(model_dir).eos_token_ids == frozenset({5, 6, im_end})


def test_config_json_is_not_read_again(tmp_path: Path) -> None:
    """The model config is parsed once, by the loader: the tokenizer never opens config.json."""
    model_dir = write_model_dir(tmp_path)
    (model_dir / "config.json").write_text("{not json")
    tok = Tokenizer.from_dir(model_dir)
    assert tok.encode("hello")


def test_missing_tokenizer_json_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json") as err:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_invalid_config_names_the_file(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path)
    (model_dir / "generation_config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=r"generation_config\.json"):
        Tokenizer.from_dir(model_dir)
    (model_dir / "tokenizer.json").write_text("[]")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(model_dir)


# --- chat templates

FEATURES_TEMPLATE = """\
{%- set ns = namespace(turns=0) -%}
{%- for m in messages %}
    {% if m['role'] == 'system' and not loop.first %}
{{ raise_exception('the system message must come first') }}
    {% endif %}
    {% if m.get('content') == 'STOP' %}{% break %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
<{{ m['role'] }}>{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}\
{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}
{% endfor %}
{{ messages | tojson }}|{{ {'k': 'é<&>', 'a': [1, 2]} | tojson(indent=2, sort_keys=True) }}
{{ tools | tojson }}
{{ bos_token }}|{{ ns.turns }}|{{ 'thinking' if enable_thinking is defined and enable_thinking else 'plain' }}
{% if add_generation_prompt %}<assistant>{% endif %}"""


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(model_dir: Path, add_generation_prompt: bool) -> None:
    ours, hf = load_pair(model_dir)
    text = ours.apply_chat_template(CONVERSATION, add_generation_prompt=add_generation_prompt)
    kwargs = {"add_generation_prompt": add_generation_prompt}
    assert text == hf.apply_chat_template(CONVERSATION, tokenize=False, **kwargs)
    ids = hf.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False, **kwargs)
    assert ours.encode_chat(CONVERSATION, add_generation_prompt=add_generation_prompt) == list(ids)


@pytest.mark.parametrize(
    "messages",
    [
        CONVERSATION,
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "STOP"},
            {"role": "user", "content": "b"},
        ],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": "[]"}],
    ],
)
def test_template_features_match_transformers(tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    model_dir = write_model_dir(tmp_path, chat_template_file=FEATURES_TEMPLATE)
    ours, hf = load_pair(model_dir)
    tools = [{"name": "f", "description": "ünï"}]
    extras: list[dict[str, Any]] = [{}, {"enable_thinking": True, "tools": tools}]
    for extra in extras:
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
        assert ours.apply_chat_template(messages, **extra) == expected


def test_template_raise_exception_is_a_chat_template_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file=FEATURES_TEMPLATE))
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
    with pytest.raises(ChatTemplateError, match="the system message must come first"):
        tok.apply_chat_template(messages)
    with pytest.raises(ChatTemplateError, match="empty"):
        tok.apply_chat_template([])
    chatml = Tokenizer.from_dir(write_model_dir(tmp_path / "chatml"))
    with pytest.raises(ChatTemplateError, match="TypeError"):  # content parts: str + list
        chatml.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])


def test_strftime_now(tmp_path: Path) -> None:
    from datetime import datetime

    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file="{{ strftime_now('%Y') }}"))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == str(datetime.now().year)


@pytest.mark.parametrize("form", ["string", "named_list"])
def test_chat_template_from_tokenizer_config(tmp_path: Path, form: str) -> None:
    inline: Any = CHATML
    if form == "named_list":
        inline = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": CHATML}]
    model_dir = write_model_dir(tmp_path, tokenizer_config={"chat_template": inline}, chat_template_file=None)
    ours, hf = load_pair(model_dir)
    expected = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION) == expected
    assert expected.startswith("<|im_start|>system\n")


def test_chat_template_file_wins_over_config(tmp_path: Path) -> None:
    cfg = {"chat_template": "FROM CONFIG"}
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, tokenizer_config=cfg, chat_template_file="FROM FILE"))
    assert tok.apply_chat_template(CONVERSATION) == "FROM FILE"


def test_no_chat_template_is_a_clear_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file=None))
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template(CONVERSATION)
    with pytest.raises(ValueError, match="no chat template"):
        tok.encode_chat(CONVERSATION)


def test_invalid_template_syntax_is_a_chat_template_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file="{% for m in messages %}"))
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        tok.apply_chat_template(CONVERSATION)


def test_a_model_directory_without_a_template_names_chat_template_jinja_and_the_flag(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file=None))
    with pytest.raises(ChatTemplateError, match=r"--chat-template.*chat_template\.jinja"):
        tok.apply_chat_template(CONVERSATION)


@pytest.mark.parametrize(
    "template",
    ["{{ 1 // 0 }}", "{% if messages[0].role == 'system' %}{{ raise_exception('no') }}{% endif %}{{ x.y.z }}"],
    ids=["always", "even-without-system"],
)
def test_a_template_that_cannot_render_the_probe_chat_is_refused_at_load(tmp_path: Path, template: str) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file=template))
    with pytest.raises(ChatTemplateError, match=r"failed: .* \(on a probe conversation: system, user, assistant"):
        tok.check_chat_template()


@pytest.mark.parametrize(
    "template",
    [
        CHATML,
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
        "{% for m in messages %}{% if m.role == 'tool' %}{{ 1 // 0 }}{% endif %}{% endfor %}ok",  # tools: logged
    ],
    ids=["chatml", "no-system-turn", "no-tool-turn"],
)
def test_a_template_that_renders_the_probe_chat_is_taken(tmp_path: Path, template: str) -> None:
    Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file=template)).check_chat_template()


def test_a_template_failure_at_request_time_is_a_template_failure_naming_it(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_model_dir(tmp_path, chat_template_file="{{ 1 // 0 }}"))
    with pytest.raises(TemplateFailed, match=f"the chat template of {tmp_path} failed: ZeroDivisionError"):
        tok.apply_chat_template(CONVERSATION)
    tok.template_timeout_s = 0.2  # NOTE: a short bound, for tests only
    tok.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateFailed, match="ran past its time bound"):
        tok.apply_chat_template(CONVERSATION)
