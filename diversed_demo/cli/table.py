"""`diversed-demo table`: the paper-style results table, exact SD against DIVERSED per task and
temperature."""

from __future__ import annotations

import contextlib

from . import shared


def add_table_arguments(parser) -> None:
    parser.add_argument(
        "--sets",
        default="summarization,math:arithmetic,math:gsm8k,code,general",
        help="comma-separated task or task:held-out set (default: every task; math on both sets)",
    )
    parser.add_argument("--temperatures", default="1,0", help="comma-separated; 0 = greedy (default 1,0)")
    parser.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="TASK=HEAD",
        help="the head of a task (default: the shipped heads/<task>); repeatable",
    )
    parser.add_argument("--limit", type=int, default=20, help="held-out examples per set (the first of each)")
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the table as JSON here (e.g. results/table.json)")
    parser.add_argument(
        "--markdown", default=None, help="write the Markdown table here (e.g. results/table.md)"
    )
    shared.add_pair_arguments(parser)
    parser.set_defaults(func=run_table)


def run_table(args) -> int:
    from tqdm.auto import tqdm

    from ..eval.held_out import held_out_examples
    from ..eval.table import markdown, parse_sets, parse_temperatures, results_table
    from ..models.heads import load_head

    sets, temperatures = parse_sets(args.sets), parse_temperatures(args.temperatures)
    if args.limit < 1 or args.n_draft < 1 or args.max_new_tokens < 1:
        raise ValueError("--limit, --n-draft and --max-new-tokens must be positive integers")
    head_paths, greedy_paths = table_head_paths(args.head, [task for task, _ in sets])  # fails before loading
    for task, set_name in sets:
        held_out_examples(task, args.limit, None, set_name)
    pair = shared.pair_from_args(args)
    heads = {task: (path.stem, load_head(path, pair)) for task, path in head_paths.items()}
    greedy_heads = {task: (path.stem, load_head(path, pair)) for task, path in greedy_paths.items()}
    bar = tqdm(total=len(sets) * len(temperatures) * 3 * args.limit, desc="table")
    report = results_table(
        pair,
        sets,
        heads,
        temperatures,
        args.limit,
        args.n_draft,
        args.max_new_tokens,
        args.seed,
        progress=lambda: bar.update(1),
        greedy_heads=greedy_heads,
    )
    bar.close()
    report["command"] = shared.command_line()
    shared.print_and_write(report, markdown(report), args.json, args.markdown)
    return 0


def table_head_paths(specs: list[str], tasks: list[str]) -> tuple[dict, dict]:
    """Each task's head file (--head TASK=HEAD, else the shipped heads/<task>), and the greedy twin
    (<head>-greedy) of each head where one exists, which serves T = 0."""
    from ..models.heads import greedy_twin, resolve_head_path

    chosen = {}
    for item in specs:
        task, sep, head = item.partition("=")
        if not sep or not head:
            raise ValueError(f"--head takes TASK=HEAD, not {item!r}")
        chosen[task] = head
    head_paths = {task: resolve_head_path(chosen.get(task, task)) for task in dict.fromkeys(tasks)}
    greedy_paths = {}
    for task, path in head_paths.items():
        with contextlib.suppress(ValueError):
            greedy_paths[task] = resolve_head_path(greedy_twin(path.stem))
    return head_paths, greedy_paths
