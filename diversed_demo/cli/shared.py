"""What every subcommand shares: the pair's arguments and how the pair they name is loaded, how the command
was called, and printing a report's table while writing the report where asked."""

from __future__ import annotations

import argparse
import json
import sys

from ..common.files import write_text


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", default=None, help="target: hub id, directory or .gguf (default: embedded smollm2-135m)"
    )
    parser.add_argument(
        "--draft", default=None, help="draft: hub id, directory or .gguf (default: the embedded draft)"
    )
    parser.add_argument(
        "--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (on a CPU: fp32 or bf16, whichever is measured faster here; bf16/fp16 on a GPU), "
        "float32, bfloat16, float16",
    )


def command_line() -> str:
    """How this command was called, for reports and cards."""
    return " ".join(["diversed-demo"] + sys.argv[1:])


def pair_from_args(args, compiled: str = "off", serve_first: bool = False):
    """The pair the arguments name, as the runtime runs it here (runtime/plan.py); compiled: when its
    compiled passes are built ("background", "wait": before returning, as the bench times, or "off");
    serve_first: a server's first start (load_pair's)."""
    from ..models.embedded import EMBEDDED
    from ..runtime.plan import load_pair

    pair = load_pair(
        args.target or EMBEDDED,
        args.draft,
        args.device,
        args.dtype,
        compiled=compiled,
        serve_first=serve_first,
    )
    print(f"runtime: {pair.runtime}", file=sys.stderr)
    return pair


def decode_config(args, base=None):
    """The DecodeConfig the decoding arguments give (those a command has; the others as in `base`, else at
    their defaults), checked now, before any model loads; a head stays named until the pair is loaded."""
    from ..core.config import DecodeConfig

    n_draft, head = getattr(args, "n_draft", None), getattr(args, "head", None)
    given = {
        "mode": getattr(args, "mode", None),
        "ensemble_weight": getattr(args, "w", None),
        "head": head if isinstance(head, str) else None,  # the frontier's --head lists heads to evaluate
        "lam": getattr(args, "lam", None),
        "n_draft": parse_n_draft(n_draft) if isinstance(n_draft, str) else n_draft,
        "max_new_tokens": getattr(args, "max_new_tokens", None),
        "temperature": getattr(args, "temperature", None),
        "top_p": getattr(args, "top_p", None),
        "seed": getattr(args, "seed", None),
        "chat": None if not hasattr(args, "no_chat") else not args.no_chat,
        "prompt_lookup": None if not hasattr(args, "no_lookup") else not args.no_lookup,
        "tree": getattr(args, "tree", None),
    }
    return (base or DecodeConfig()).replace(
        **{key: value for key, value in given.items() if value is not None}
    )


def parse_n_draft(text: str) -> int | str:
    """--n-draft: a positive integer, or "auto" (as many as pay, step by step)."""
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise ValueError(f"--n-draft must be a positive integer or auto, not {text!r}")
    return text if text == "auto" else int(text)


def print_and_write(report: dict, table: str, json_path: str | None, markdown_path: str | None) -> None:
    """Print a report's Markdown table; write the report as JSON and the table where asked."""
    print(table)
    if json_path:
        write_text(json_path, json.dumps(report, indent=2) + "\n")
    if markdown_path:
        write_text(markdown_path, table + "\n")
