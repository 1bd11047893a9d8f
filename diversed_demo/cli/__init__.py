"""`diversed-demo` command line: every subcommand's arguments, and the plain functions each one calls.

This package is the top layer: nothing in diversed_demo imports it. Each subcommand has its module (its
arguments and the function that runs it: generate, distill, train, frontier, bench, table, app); shared.py
holds what they share (the pair's arguments and loading, the command line, printing a report). A
subcommand parses and checks its values, calls the package, and prints or writes what comes back. Models
load only inside the subcommand that needs them, after its values are checked, so bad input fails in a
second rather than after loading; importing this package imports no torch.
"""

from __future__ import annotations

import argparse
import sys

from .app import add_app_arguments
from .bench import add_bench_arguments
from .distill import add_distill_arguments
from .frontier import add_frontier_arguments
from .generate import add_generate_arguments
from .shared import add_pair_arguments, command_line, pair_from_args
from .table import add_table_arguments
from .train import add_train_arguments

__all__ = ["add_pair_arguments", "build_parser", "command_line", "main", "pair_from_args"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diversed-demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_arguments(sub.add_parser("generate", help="decode one prompt and print text and summary"))
    add_distill_arguments(sub.add_parser("distill", help="train the embedded feature draft from the target"))
    add_train_arguments(sub.add_parser("train", help="train an ensemble head with sequence-level RL"))
    add_frontier_arguments(sub.add_parser("frontier", help="static-w frontier vs heads on a held-out set"))
    add_bench_arguments(sub.add_parser("bench", help="Spec-Bench speed and quality table"))
    add_table_arguments(
        sub.add_parser("table", help="paper-style results: exact SD vs DIVERSED per task and temperature")
    )
    add_app_arguments(sub.add_parser("app", help="launch the Gradio app"))
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as err:  # bad input: a message, not a traceback
        print(f"diversed-demo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diversed-demo {args.command}: interrupted", file=sys.stderr)
        return 130
