"""`diversed-demo bench`: Spec-Bench (or the app's examples) speed and quality per mode, or with
--batch-rows one batch of decodes against the same decodes one after another. Every value that needs no
model is checked before the pair loads."""

from __future__ import annotations

from . import shared


def add_bench_arguments(parser) -> None:
    add_bench_question_arguments(parser)
    add_bench_decoding_arguments(parser)
    add_bench_comparison_arguments(parser)
    parser.add_argument("--json", default=None, help="write the machine-readable report here")
    parser.add_argument("--markdown", default=None, help="write the Markdown table here")
    parser.add_argument("--plot", default=None, help="write a plotly HTML chart here")
    shared.add_pair_arguments(parser)
    parser.set_defaults(func=run_bench_command)


def add_bench_question_arguments(parser) -> None:
    """The modes, and the questions they decode."""
    from ..eval.bench import DEFAULT_MODES

    parser.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help="comma-separated: ar, exact, static:<w>, cost:<λ> (the per-token rule), dynamic:<head> (a cost "
        "head at its default λ, or dynamic:<head>@<λ>); options after a /: no-lookup drafts without prompt "
        "lookup (greedy decoding's copies from the text), tree drafts trees sized step by step, "
        "tree=W,E,D,N trees of that shape (separate the modes by ; then), chain chains (without tree or "
        "chain, what the runtime chose for this machine), n=N drafts N tokens a step whatever --n-draft says "
        "(a fixed N beside auto in one run), e.g. exact/no-lookup, exact/tree, exact/n=2",
    )
    parser.add_argument(
        "--per-category", type=int, default=2, help="questions per Spec-Bench category (0 = all)"
    )
    parser.add_argument(
        "--categories",
        default=None,
        help="comma-separated Spec-Bench categories to run (default all), e.g. summarization,math_reasoning",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="Spec-Bench question.jsonl (default: spec_bench/ in $DIVERSED_DATA or ../shared/data)",
    )
    parser.add_argument(
        "--app-examples",
        type=int,
        default=None,
        metavar="K",
        help="time the app's first K example prompts instead of Spec-Bench (1: the example the "
        "app opens with)",
    )


def add_bench_decoding_arguments(parser) -> None:
    parser.add_argument(
        "--n-draft",
        default="auto",
        help="draft length for every mode, or auto: each mode's best by the analytic bound at the "
        "acceptance of a calibration run on the project's own prompts (default)",
    )
    parser.add_argument(
        "--tree",
        dest="tree_twins",  # not the modes' own setting: each mode runs as a chain and as a tree
        default="off",
        help="also run each drafting mode with draft trees (as <mode>/tree): on (sized step by step) or a "
        "shape W,E,D,N (children a node, nodes expanded a depth, depth, nodes); off (default): only the "
        "modes as given, which draft what the runtime chose for this machine",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (Spec-Bench's setting)")
    parser.add_argument("--seed", type=int, default=0)


def add_bench_comparison_arguments(parser) -> None:
    """What else is timed: transformers, llama.cpp, or batches of decodes."""
    parser.add_argument(
        "--vs-transformers", action="store_true", help="also time transformers' generate (greedy)"
    )
    parser.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        help="also time llama.cpp's target-only decoding of the same GGUF (greedy; needs "
        "llama-cpp-python, which compiles llama.cpp)",
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        metavar="K",
        help="instead: time K decodes of each question as one batch (how head training decodes "
        "rollouts) against one after another, per mode (N from --n-draft, 4 where auto)",
    )


def run_bench_command(args) -> int:
    from tqdm.auto import tqdm

    from ..eval.bench import BENCH_DECODING, parse_modes, run_batch_bench, run_bench
    from ..eval.bench_report import bench_figure, bench_markdown
    from ..eval.schemas import BenchReport, checked

    # Everything that can be checked without the models is checked before they load.
    examples = bench_examples(args)
    run = shared.decode_config(args, BENCH_DECODING)
    mode_spec = with_trees(args.modes, args.tree_twins)
    parse_modes(mode_spec, base=run)
    n_draft = shared.parse_n_draft(args.n_draft)
    if args.batch_rows is not None and args.batch_rows < 2:
        raise ValueError(f"--batch-rows must be at least 2, not {args.batch_rows}")
    llama_cpp_gguf = llama_cpp_target(args) if args.vs_llama_cpp else None
    pair = shared.pair_from_args(args, compiled="wait")
    modes = parse_modes(mode_spec, pair, run)
    bar = tqdm(total=len(examples) * len(modes), desc="bench")
    if args.batch_rows is not None:
        report = run_batch_bench(
            pair,
            examples,
            modes,
            args.batch_rows,
            4 if n_draft == "auto" else n_draft,
            progress=lambda: bar.update(1),
        )
    else:
        report = run_bench(
            pair,
            examples,
            modes,
            n_draft,
            args.vs_transformers,
            progress=lambda: bar.update(1),
            vs_llama_cpp=llama_cpp_gguf,
        )
    bar.close()
    if args.batch_rows is None:  # the batched bench's report is a table of its own
        checked(BenchReport, report)
    shared.print_and_write(report, bench_markdown(report), args.json, args.markdown)
    if args.plot and args.batch_rows is None:
        bench_figure(report).write_html(args.plot)
    return 0


def with_trees(spec: str, tree: str) -> str:
    """--modes with, for --tree other than off, each drafting mode's twin drafting trees (<mode>/tree)."""
    from ..core.config import TREE_OFF, TREE_ON, tree_shape
    from ..eval.bench import mode_names

    if tree != TREE_ON:
        tree_shape(tree)  # a bad --tree fails here, before the models load
    if tree == TREE_OFF:
        return spec
    names = mode_names(spec)
    option = "tree" if tree == TREE_ON else f"tree={tree}"
    twins = [f"{name}/{option}" for name in names if not name.startswith("ar")]
    return ";".join(names + twins)


def llama_cpp_target(args):
    """The target's GGUF for --vs-llama-cpp, checked before the models load."""
    import importlib.util

    from ..models.embedded import EMBEDDED
    from ..models.loading import gguf_file

    gguf = gguf_file(args.target or EMBEDDED)
    if gguf is None:
        raise ValueError("--vs-llama-cpp needs a GGUF target (the embedded one, or a .gguf file)")
    if importlib.util.find_spec("llama_cpp") is None:
        raise ValueError("--vs-llama-cpp needs llama-cpp-python: pip install llama-cpp-python (it compiles)")
    return gguf


def bench_examples(args) -> list:
    """The questions to bench: the app's first K example prompts, or Spec-Bench's first turns."""
    from ..eval.tasks import app_examples, load_spec_bench

    if args.app_examples is not None:
        if args.app_examples < 1:
            raise ValueError(f"--app-examples must be a positive integer, not {args.app_examples}")
        return [e for task_examples in app_examples().values() for e in task_examples][: args.app_examples]
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    return load_spec_bench(args.data, categories, per_category=args.per_category or None)
