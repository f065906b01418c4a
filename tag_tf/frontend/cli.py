"""The `tag-tf` command line. Each subcommand lives in `tag_tf.frontend.commands.<name>` and exposes
`register(subparsers)`; it sets `func(args) -> int` on its parser. User errors (TagError) print one
line on stderr and exit 2."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Subcommand modules, in the order `tag-tf --help` lists them.
COMMANDS = ("analyze", "profile", "topology", "simulate", "plan", "train_gnn", "calibrate", "verify", "server", "emulate",
            "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tag-tf", description=(
        "Deploy TF1 training graphs across heterogeneous GPU clusters (TAG)."))
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"tag_tf.frontend.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from tag_tf.errors import TagError

    try:
        return int(args.func(args) or 0)
    except TagError as e:
        print(f"tag-tf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
