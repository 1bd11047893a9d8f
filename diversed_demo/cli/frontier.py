"""`diversed-demo frontier`: the static-w frontier against heads on a held-out set, printed as a table
with each head's verdict, plotted, and written as JSON where asked."""

from __future__ import annotations

import json
from pathlib import Path

from ..common.files import write_text
from ..eval.schemas import RuleReport, checked
from . import shared


def add_frontier_arguments(parser) -> None:
    from ..eval.frontier import DEFAULT_WEIGHTS
    from ..eval.held_out import HELD_OUT

    parser.add_argument("--task", default="summarization", choices=sorted(HELD_OUT))
    parser.add_argument("--head", action="append", default=[], help="head name or path (repeatable)")
    parser.add_argument("--weights", default=",".join(f"{w:g}" for w in DEFAULT_WEIGHTS))
    parser.add_argument(
        "--lams",
        default=None,
        help="the per-token rule at each of these λ too (comma-separated, e.g. 0.5,2,8): a point each",
    )
    sets = "; ".join(f"{task}: {', '.join(sets)}" for task, sets in HELD_OUT.items())
    parser.add_argument(
        "--set", dest="set_name", default=None, help=f"held-out set (default: the task's first) — {sets}"
    )
    parser.add_argument("--limit", type=int, default=12, help="held-out examples (the first of the set)")
    parser.add_argument(
        "--data",
        default=None,
        help="the set's file: Spec-Bench question.jsonl, GSM8K test.jsonl or "
        "mbpp.jsonl (default: in $DIVERSED_DATA or ../shared/data)",
    )
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--plot", default=None, help="HTML plot path (default runs/frontier/<task>-<set>.html)"
    )
    parser.add_argument("--json", default=None, help="write all points and margins as JSON")
    parser.add_argument(
        "--write-card",
        action="store_true",
        help="store each head's figures in its card beside it (<head>.json) and in its safetensors metadata",
    )
    parser.add_argument(
        "--log",
        default=None,
        help="JSONL of every decode; a rerun with the same settings "
        "resumes from it (long evaluations survive a stop)",
    )
    shared.add_pair_arguments(parser)
    parser.set_defaults(func=run_frontier)


def run_frontier(args) -> int:
    from tqdm.auto import tqdm

    from ..eval.frontier import FRONTIER_DECODING, evaluate_heads
    from ..eval.held_out import held_out_examples
    from ..models.heads import read_head_metadata, resolve_head_path

    weights, lams = parse_weights(args.weights), parse_lams(args.lams)
    decoding = shared.decode_config(args, FRONTIER_DECODING)
    head_points = 0  # before the models load: the heads and the held-out set exist
    for head in args.head:  # a cost head is a curve: a point per λ
        cost = read_head_metadata(resolve_head_path(head))["config"].get("kind") == "cost"
        head_points += max(1, len(lams)) if cost else 1
    examples = held_out_examples(args.task, args.limit, args.data, args.set_name)
    pair = shared.pair_from_args(args)
    bar = tqdm(
        desc=f"frontier {args.task}",
        unit="decode",
        total=len(examples) * (len(weights) + len(lams) + head_points),
    )
    report, points = evaluate_heads(
        pair,
        args.task,
        args.head,
        weights,
        args.limit,
        data=args.data,
        decoding=decoding,
        write_card=args.write_card,
        command=shared.command_line(),
        progress=lambda *_: bar.update(1),
        set_name=args.set_name,
        log_path=args.log,
        lams=lams,
    )
    bar.close()
    print_frontier(report)
    write_frontier_plot(report, points, args.task, args.temperature, args.plot)
    if args.json:
        write_text(args.json, json.dumps(checked(RuleReport, report), indent=2) + "\n")
    return 0


def parse_lams(spec: str | None) -> list[float]:
    try:
        lams = [float(lam) for lam in (spec or "").split(",") if lam.strip()]
    except ValueError:
        raise ValueError(f"--lams must be comma-separated numbers, not {spec!r}") from None
    if not all(lam >= 0 for lam in lams):
        raise ValueError(f"--lams must be ≥ 0, not {spec!r}")
    return lams


def parse_weights(spec: str) -> list[float]:
    try:
        weights = [float(w) for w in spec.split(",")]
    except ValueError:
        raise ValueError(f"--weights must be comma-separated numbers, not {spec!r}") from None
    if not all(0 <= w <= 1 for w in weights):
        raise ValueError(f"--weights must be in [0, 1], not {spec!r}")
    return weights


def print_frontier(report: dict) -> None:
    """The points as a table, then each head's verdict, acceptance margin and difference from exact."""
    import pandas as pd

    from ..common.formatting import fmt

    if "log" in report:
        print(f"log: {report['log']['path']} ({report['log']['decodes_reused']} decodes read back)")
    print(pd.DataFrame(report["points"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for name, m in {**report["rules"], **report["heads"]}.items():
        acceptance = m["acceptance_margin"]
        print(
            f"{name}: {m['verdict']['text']}\n{name}: acceptance margin at the head's quality "
            f"{fmt(acceptance['estimate'], '+.4f')} ± {fmt(acceptance['stderr'], '.4f')}"
        )
        if m["versus_exact"] is not None:
            v = m["versus_exact"]
            print(
                f"{name} − exact (w = 1), paired over {v['examples']} examples: "
                f"quality {v['quality_difference']:+.4f} ± {fmt(v['stderr'], '.4f')}, "
                f"acceptance {v['acceptance']['exact']:.3f} → {v['acceptance']['head']:.3f}"
            )


def write_frontier_plot(report: dict, points, task: str, temperature: float, plot: str | None) -> None:
    from ..eval.frontier_figure import frontier_figure

    path = Path(plot or Path("runs/frontier") / f"{task}-{report['set']}.html")
    path.parent.mkdir(parents=True, exist_ok=True)
    frontier_figure(
        points,
        f"Frontier on {task}, {report['set']} ({report['examples']} held-out examples, T = {temperature:g})",
    ).write_html(path)
    print(f"plot: {path}")
