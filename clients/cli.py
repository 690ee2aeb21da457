"""`infer client ...`: call a running server from the terminal."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc

from infer.api import DEFAULT_ADDRESS
from infer.clients.channel import ClientTls, read_keys
from infer.clients.client import InferClient
from infer.clients.types import InferError, Prompt, Sampling


def _tls(args: argparse.Namespace) -> ClientTls | None:
    """The TLS flags (`add_tls_flags`) as a ClientTls; None: plaintext."""
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_server_name):
        return None
    return ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    """--tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name (`infer client` and `infer health`)."""
    env = os.environ.get
    parser.add_argument("--tls", action="store_true", help="TLS, trusting the system's root certificates")
    parser.add_argument("--tls-ca", default=env("INFER_TLS_CA"), help="TLS, trusting this CA (PEM) [env INFER_TLS_CA]")
    parser.add_argument(
        "--tls-cert",
        default=env("INFER_TLS_CLIENT_CERT"),
        help="mTLS: client certificate (PEM) [env INFER_TLS_CLIENT_CERT]",
    )
    parser.add_argument(
        "--tls-key",
        default=env("INFER_TLS_CLIENT_KEY"),
        help="mTLS: client private key (PEM) [env INFER_TLS_CLIENT_KEY]",
    )
    parser.add_argument(
        "--tls-server-name",
        default=env("INFER_TLS_SERVER_NAME"),
        help="the name the server's certificate carries, when not the --address host [env INFER_TLS_SERVER_NAME]",
    )


def _client(args: argparse.Namespace) -> InferClient:
    return InferClient(args.address, timeout_s=args.timeout_s, tls=_tls(args), api_key=_api_key(args))


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is None:
        return args.api_key  # type: ignore[no-any-return]
    return read_keys(args.api_key_file, "api_key_file")[0]


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag}: cannot read {path}: {e}") from None


def _constraint(args: argparse.Namespace) -> dict[str, Any]:
    """The constraint flags as Sampling fields: schema and grammar files are read here."""
    values: dict[str, Any] = {}
    if args.json_schema is not None:
        values["json_schema"] = _read(args.json_schema, "--json-schema")
    if args.grammar is not None:
        values["grammar"] = _read(args.grammar, "--grammar")
    if args.regex is not None:
        values["regex"] = args.regex
    if args.choice:
        values["choice"] = tuple(args.choice)
    if args.json_object:
        values["json_object"] = True
    return values


def _generate(args: argparse.Namespace) -> int:
    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                        speculative_tokens=args.speculative_tokens, **_constraint(args))  # fmt: skip
    prompt: Prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    with _client(args) as client:
        last = None
        for chunk in client.generate(prompt, sampling):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
    sys.stdout.write("\n")
    if args.usage and last is not None and last.usage is not None:
        print(f"[{last.finish_reason}] {json.dumps(asdict(last.usage))}", file=sys.stderr)
        if last.timings is not None and last.timings.num_draft_tokens:
            t = last.timings
            print(f"[speculative] {t.num_accepted_tokens}/{t.num_draft_tokens} drafts accepted "
                  f"({t.acceptance_rate:.0%})", file=sys.stderr)  # fmt: skip
    return 0


def _info(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(json.dumps(asdict(client.model_info()), indent=2))
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    with _client(args) as client:
        text = [{"role": "user", "content": args.text}] if args.chat else args.text
        print(json.dumps(client.tokenize(text)))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return int(args.client_func(args))
    except InferError as e:
        print(f"\nerror: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # an unreadable TLS file, half a key pair
        print(f"error: {e}", file=sys.stderr)
        return 1


def add_client_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    client = sub.add_parser("client", help="call a running infer server over gRPC")
    client.add_argument(
        "--address",
        default=os.environ.get("INFER_ADDRESS", DEFAULT_ADDRESS),
        help=f"server host:port [env INFER_ADDRESS; default: {DEFAULT_ADDRESS}]",
    )
    client.add_argument("--timeout-s", type=float, default=None, help="gRPC deadline of each call")
    env = os.environ.get
    client.add_argument(
        "--api-key", default=env("INFER_API_KEY"), help="sent as 'authorization: Bearer <key>' [env INFER_API_KEY]"
    )
    client.add_argument(
        "--api-key-file", default=None, help="send the first key of this file (one a line, as infer serve reads)"
    )
    add_tls_flags(client)
    client.set_defaults(func=run)
    commands = client.add_subparsers(dest="client_command", required=True)
    gen = commands.add_parser("generate", help="stream a completion to the terminal")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument(
        "--speculative-tokens",
        type=int,
        default=None,
        metavar="N",
        help="n-gram speculative decoding: up to N draft tokens a step (0 = off; default: the server's)",
    )
    gen.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    gen.add_argument("--usage", action="store_true", help="print the finish reason and token usage to stderr")
    constraint = gen.add_argument_group("constrained output (one at most)").add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", metavar="FILE", help="the output is JSON valid under this JSON schema")
    constraint.add_argument("--regex", help="the output matches this regular expression")
    constraint.add_argument("--grammar", metavar="FILE", help="the output follows this EBNF grammar (root ::= ...)")
    constraint.add_argument("--choice", action="append", help="the output is one of these strings (repeat the flag)")
    constraint.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    gen.set_defaults(client_func=_generate)
    info = commands.add_parser("info", help="the served model and its limits")
    info.set_defaults(client_func=_info)
    tok = commands.add_parser("tokenize", help="token ids of a text")
    tok.add_argument("text")
    tok.add_argument("--chat", action="store_true", help="tokenize the text as a user chat message")
    tok.set_defaults(client_func=_tokenize)


def health_address(environ: Mapping[str, str]) -> str:
    """INFER_ADDRESS, else this host at INFER_HEALTH_PORT (the plaintext health port), else at INFER_GRPC_PORT
    (what `infer serve` listens on), else the default."""
    if address := environ.get("INFER_ADDRESS"):
        return address
    for name in ("INFER_HEALTH_PORT", "INFER_GRPC_PORT"):
        if (port := environ.get(name, "")) and port.lower() not in ("off", "none"):
            return f"127.0.0.1:{port}"
    return DEFAULT_ADDRESS


def _tls_hint(error: InferError, tls: ClientTls | None) -> str:
    if error.code is not grpc.StatusCode.UNAVAILABLE:
        return ""
    if tls is None:
        return " (a TLS server? pass --tls-ca, or --tls for the system's roots)"
    return " (an mTLS server? pass --tls-cert and --tls-key)" if tls.cert_file is None else ""


def _check_health(args: argparse.Namespace) -> int:
    try:
        tls = _tls(args)
        client = InferClient(args.address, timeout_s=args.timeout_s, tls=tls)
    except (OSError, ValueError) as e:  # an unreadable TLS file, half a key pair
        print(f"error: {e}", file=sys.stderr)
        return 1  # NOTE: not 2, which Docker's HEALTHCHECK reserves
    deadline = time.monotonic() + args.wait_s
    with client:
        while True:
            try:
                status = client.health(args.service)
            except InferError as e:
                status = f"{e.code.name}: {e.details}{_tls_hint(e, tls)}"
            if status == "SERVING" or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    print(f"{args.address}: {status}", file=sys.stdout if status == "SERVING" else sys.stderr)
    return 0 if status == "SERVING" else 1


def add_health_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`infer health`: exit 0 when the server's grpc.health.v1 status is SERVING, else 1 (a container probe)."""
    default = health_address(os.environ)
    p = sub.add_parser(
        "health",
        help="check a server's grpc.health.v1 status: exit 0 when SERVING, 1 otherwise",
        description="A probe for containers: no model, no torch; one Check call (or several with --wait-s).",
    )
    p.add_argument(
        "--address",
        default=default,
        help="server host:port [env INFER_ADDRESS, else 127.0.0.1:$INFER_HEALTH_PORT or 127.0.0.1:$INFER_GRPC_PORT; "
        f"default: {default}]",
    )
    p.add_argument("--service", default="", help="the service to check ('' = the whole server)")
    p.add_argument("--timeout-s", type=float, default=3.0, help="deadline of each Check call")
    p.add_argument("--wait-s", type=float, default=0.0, help="keep checking until SERVING or this many seconds")
    add_tls_flags(p)
    p.set_defaults(func=_check_health)
