"""`diversed-demo` command line: generate, and the subcommands other modules register.

Each subcommand module exposes `add_arguments(parser)` and `run(args)`; this file only wires them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

SUBCOMMANDS = {  # name -> (module, help)
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
    from .decode import check_args, speculative_generate
    # Bad values fail before the models load (seconds), not after.
    check_args(args.mode, args.w, args.head, args.n_draft, args.max_new_tokens, args.temperature, args.top_p,
               args.seed)
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


def add_distill_arguments(parser: argparse.ArgumentParser) -> None:
    stages = parser.add_subparsers(dest="stage", required=True)
    data = stages.add_parser("data", help="sample the target's own responses to training prompts (resumable)")
    data.add_argument("--tokens", type=int, default=1_200_000, help="stop once the responses hold this many tokens")
    data.add_argument("--batch-size", type=int, default=96)
    data.add_argument("--max-new-tokens", type=int, default=384)
    data.add_argument("--minutes", type=float, default=None, help="stop after this long (resume later)")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--out", default=None, help="shard folder (default: assets/draft/data)")
    data.add_argument("--gen-dtype", default="bfloat16", help="the target's dtype while sampling")
    data.set_defaults(func=run_distill_data)
    from .distill.train import TrainConfig
    defaults = TrainConfig()
    train = stages.add_parser("train", help="train the feature draft on the generated data (resumable)")
    train.add_argument("--work-dir", default="runs/distill", help="checkpoints and the best draft (default: runs/distill)")
    train.add_argument("--data", default=None, help="shard folder (default: assets/draft/data)")
    train.add_argument("--epochs", type=float, default=defaults.epochs)
    train.add_argument("--ttt-steps", type=int, default=defaults.ttt_steps, help="draft positions trained by unrolling")
    train.add_argument("--step-decay", type=float, default=defaults.step_decay, help="loss weight decay per position")
    train.add_argument("--lr", type=float, default=defaults.lr)
    train.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens)
    train.add_argument("--eval-every", type=int, default=defaults.eval_every)
    train.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab_size)
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--minutes", type=float, default=None, help="stop after this long (rerun to resume)")
    train.set_defaults(func=run_distill_train)
    export = stages.add_parser("export", help="copy the best draft to assets/draft with its card")
    export.add_argument("--work-dir", default="runs/distill")
    export.add_argument("--out", default=None, help="default: assets/draft")
    export.set_defaults(func=run_distill_export)
    measure = stages.add_parser("measure", help="Spec-Bench figures of the embedded draft, into its card")
    measure.add_argument("--per-category", type=int, default=2)
    measure.add_argument("--max-new-tokens", type=int, default=64)
    measure.add_argument("--n-draft", type=int, default=4)
    measure.set_defaults(func=run_distill_measure)


def run_distill_train(args) -> int:
    from .distill import card, data
    from .distill.train import TrainConfig, train_draft
    from .models import EMBEDDED, load_pair
    config = TrainConfig(epochs=args.epochs, ttt_steps=args.ttt_steps, step_decay=args.step_decay, lr=args.lr,
                         batch_tokens=args.batch_tokens, eval_every=args.eval_every,
                         draft_vocab_size=args.draft_vocab, seed=args.seed)
    for name, value in (("--epochs", config.epochs), ("--lr", config.lr), ("--batch-tokens", config.batch_tokens),
                        ("--ttt-steps", config.ttt_steps), ("--eval-every", config.eval_every)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, not {value}")
    records = data.load_records(args.data or data.DATA_DIR)
    if not records:
        raise FileNotFoundError(f"no generated data in {args.data or data.DATA_DIR}: run `diversed-demo distill data` first")
    pair = load_pair(EMBEDDED, None, "auto", "auto")
    state = train_draft(pair, records, config, args.work_dir, args.minutes, " ".join(["diversed-demo"] + sys.argv[1:]))
    print(json.dumps(state["best"]))
    return 0


def run_distill_export(args) -> int:
    from .distill import card
    out = card.export(args.work_dir, args.out)
    print(f"wrote {out}")
    return 0


def run_distill_measure(args) -> int:
    from .distill import card
    from .models import load_pair
    figures = card.measure(load_pair(), args.per_category, args.max_new_tokens, args.n_draft)
    print(json.dumps(figures, indent=2))
    return 0


def run_distill_data(args) -> int:
    from tqdm import tqdm

    from .distill import data
    from .models import EMBEDDED, load_pair
    pair = load_pair(EMBEDDED, None, "auto", args.gen_dtype)
    bar = tqdm(total=args.tokens, desc="response tokens", unit="tok", dynamic_ncols=True)

    def progress(done, total):
        bar.n = min(done, total)
        bar.refresh()
    result = data.generate(pair.target, pair.tokenizer, args.out or data.DATA_DIR, args.tokens, args.batch_size,
                           args.max_new_tokens, args.seed, args.minutes, progress)
    bar.close()
    print(json.dumps(result))
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All subcommands are listed; only the chosen one's module is imported (they pull in heavy deps)."""
    parser = argparse.ArgumentParser(prog="diversed-demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="decode one prompt and print text and summary")
    add_generate_arguments(gen)
    gen.set_defaults(func=run_generate)
    add_distill_arguments(sub.add_parser("distill", help="train the embedded feature draft from the target"))
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
