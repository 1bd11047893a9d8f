"""`diversed-demo generate`: decode one prompt, streaming its text, then the summary line (or one JSON
object with --json)."""

from __future__ import annotations

import argparse
import json

from . import shared


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    from ..core.config import MODES

    parser.add_argument("--prompt", required=True)
    parser.add_argument("--mode", choices=MODES, default="static")
    parser.add_argument("--w", type=float, default=0.5, help="static ensemble weight in [0, 1] (1 = exact)")
    parser.add_argument(
        "--lam",
        type=float,
        default=1.0,
        help="--mode cost: λ ≥ 0, what a kept draft may cost the target's likelihood, in nats",
    )
    parser.add_argument(
        "--head", default=None, help="head file (.safetensors) or name in heads/, for --mode dynamic"
    )
    parser.add_argument(
        "--n-draft",
        default="auto",
        help="tokens drafted a step: a positive integer, or auto (as many as pay, step by step; the default)",
    )
    parser.add_argument(
        "--tree",
        default="auto",
        help="draft trees, several candidates a position: on (sized step by step), a shape W,E,D,N "
        "(children a node, nodes expanded a depth, depth, nodes), off (a chain), or auto (the default: "
        "trees where the runtime found that they pay on this machine, chains elsewhere)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-chat", action="store_true", help="feed the prompt raw, without the chat template"
    )
    parser.add_argument(
        "--no-lookup",
        action="store_true",
        help="greedy decoding: draft without prompt lookup (copies from the text in place of drafted tokens)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object with text, summary and events"
    )
    shared.add_pair_arguments(parser)
    parser.set_defaults(func=run_generate)


def run_generate(args) -> int:
    from ..core.generate import speculative_generate
    from ..core.stats import Summary

    config = shared.decode_config(args)  # bad values fail before the models load (seconds), not after
    if config.mode == "dynamic":
        from ..models.heads import load_head, resolve_head_path

        resolve_head_path(config.head)  # a missing head fails here too, not after the models load
    pair = shared.pair_from_args(args, compiled="background")
    if config.mode == "dynamic":
        config = config.replace(head=load_head(config.head, pair))
    stream = speculative_generate(pair, args.prompt, config)
    events = []
    for item in stream:
        if isinstance(item, Summary):
            summary = item
        else:
            events.append(item)
            if not args.json and item.kind != "rejected":
                print(item.text, end="", flush=True)
    if args.json:
        print(generate_json(summary, events))
    else:
        print("\n")
        print(format_summary(summary))
    return 0


def generate_json(summary, events) -> str:
    """generate --json: one object with the text, the summary's figures and every token event."""
    summary_keys = ("acceptance_rate", "tau", "new_tokens", "tokens_per_second", "wall_time_s")
    event_keys = ("token_id", "text", "kind", "w", "p", "q", "accept_prob")
    figures = summary.to_dict()
    return json.dumps(
        {
            "text": summary.text,
            "summary": {k: figures[k] for k in summary_keys},
            "events": [{k: getattr(e, k) for k in event_keys} for e in events],
        },
        ensure_ascii=False,
    )


def format_summary(summary) -> str:
    from ..common.formatting import fmt

    mean_w = "" if summary.mean_w is None else f"  mean w {summary.mean_w:.3f}"
    return (
        f"acceptance {fmt(summary.acceptance_rate)}  tau {fmt(summary.tau, '.2f')}  "
        f"new tokens {summary.new_tokens}  {summary.tokens_per_second:.1f} tok/s  "
        f"wall {summary.wall_time_s:.2f} s{mean_w}"
    )
