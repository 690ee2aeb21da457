"""The `infer` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="a Hugging Face model directory (default: SmolLM2-135M-Instruct, converted once into the cache)",
    )


def _generate(args: argparse.Namespace) -> int:
    from infer.engine.llm import LLM
    from infer.engine.sampling_params import SamplingParams

    llm = LLM(args.model, max_model_len=args.max_model_len, num_blocks=None)
    prompt = (
        llm.tokenizer.encode_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
        if delta.error:
            print(f"\nerror: {delta.error}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infer", description="LLM inference: generate, serve, call.")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream one completion to the terminal")
    gen.add_argument("prompt")
    _add_model_arg(gen)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-model-len", type=int, default=2048)
    gen.set_defaults(func=_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
