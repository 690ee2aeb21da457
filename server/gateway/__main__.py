"""`python -m infer.server.gateway --upstream HOST:PORT ...`: the same as `infer gateway ...`."""

from __future__ import annotations

import argparse
import logging
import sys

from infer.server.gateway.cli import add_gateway_parser


def main() -> int:
    parser = argparse.ArgumentParser(prog="infer")
    add_gateway_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gateway", *sys.argv[1:]])
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
