"""`diversed-demo` command line: generate, and the subcommands other modules register.

Each subcommand module exposes `add_arguments(parser)` and `run(args)`; this file only wires them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

SUBCOMMANDS = {  # name -> (module, help)
    "distill": ("diversed_demo.distill", "distil the embedded draft from the target"),
    "train": ("diversed_demo.train", "train an ensemble head with sequence-level RL"),
    "frontier": ("diversed_demo.frontier", "static-w frontier vs heads on a held-out set"),
    "bench": ("diversed_demo.bench", "Spec-Bench speed and quality table"),
    "app": ("diversed_demo.ui", "launch the Gradio app"),
}


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target: hub id, directory or .gguf (default: embedded smollm2-135m)")
    parser.add_argument("--draft", default=None, help="draft: hub id, directory or .gguf (default: the embedded draft)")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16/fp16 on GPU), float32, bfloat16, float16")


def pair_from_args(args):
    from .models import EMBEDDED, load_pair
    return load_pair(args.target or EMBEDDED, args.draft, args.device, args.dtype)


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--mode", choices=["ar", "exact", "static", "dynamic"], default="static")
    parser.add_argument("--w", type=float, default=0.5, help="static ensemble weight in [0, 1] (1 = exact)")
    parser.add_argument("--head", default=None, help="head file (.safetensors) or name in heads/, for --mode dynamic")
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-chat", action="store_true", help="feed the prompt raw, without the chat template")
    parser.add_argument("--json", action="store_true", help="print one JSON object with text, summary and events")
    add_pair_arguments(parser)


def run_generate(args) -> int:
    from .decode import speculative_generate
    pair = pair_from_args(args)
    head = None
    if args.mode == "dynamic":
        from .head import load_head
        head = load_head(args.head, pair) if args.head else None
    stream = speculative_generate(pair, args.prompt, mode=args.mode, ensemble_weight=args.w, head=head,
                                  n_draft=args.n_draft, max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                  chat=not args.no_chat)
    events = []
    for item in stream:
        if hasattr(item, "kind"):
            events.append(item)
            if not args.json and item.kind != "rejected":
                print(item.text, end="", flush=True)
        else:
            summary = item
    if args.json:
        keys = ("token_id", "text", "kind", "w", "p", "q", "accept_prob")
        print(json.dumps({"text": summary.text,
                          "summary": {k: summary.to_dict()[k] for k in
                                      ("acceptance_rate", "tau", "new_tokens", "tokens_per_second", "wall_time_s")},
                          "events": [{k: getattr(e, k) for k in keys} for e in events]}, ensure_ascii=False))
    else:
        print("\n")
        print(format_summary(summary))
    return 0


def format_summary(summary) -> str:
    acc = "n/a" if summary.acceptance_rate is None else f"{summary.acceptance_rate:.3f}"
    mean_w = "" if summary.mean_w is None else f"  mean w {summary.mean_w:.3f}"
    return (f"acceptance {acc}  tau {summary.tau:.2f}  new tokens {summary.new_tokens}  "
            f"{summary.tokens_per_second:.1f} tok/s  wall {summary.wall_time_s:.2f} s{mean_w}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All subcommands are listed; only the chosen one's module is imported (they pull in heavy deps)."""
    parser = argparse.ArgumentParser(prog="diversed-demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="decode one prompt and print text and summary")
    add_generate_arguments(gen)
    gen.set_defaults(func=run_generate)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        cmd = sub.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(cmd)
            cmd.set_defaults(func=module.run)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as err:  # bad input: a message, not a traceback
        print(f"diversed-demo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diversed-demo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
