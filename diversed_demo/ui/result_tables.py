"""The measured results' raw tables as the Results tab folds them: the frontier table (from the heads'
cards) and the bench reports. Every figure comes from a shipped file; a missing one gives a
placeholder naming the command that writes it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..common.files import read_json_object
from ..common.formatting import fmt
from ..common.paths import RESULTS_DIR, shown_path
from ..eval.bench_report import markdown_table
from ..eval.rewards import QUALITY_LABEL
from ..eval.schemas import Evaluation, HeadCard, Judged, RuleReport, Versus, read_model
from .cards import card_task, frontier_at, head_cards, is_greedy

# The bench reports the Results tab draws, and the commands that write them.
BENCH_REPORTS = {
    "Spec-Bench, every category": (
        RESULTS_DIR / "bench.json",
        "diversed-demo bench --per-category 2 --max-new-tokens 64 --modes "
        "ar,exact,static:0.5,dynamic:summarization-greedy,dynamic:general-greedy --vs-transformers "
        "--json results/bench.json",
    ),
    "Quality on the referenced categories": (
        RESULTS_DIR / "quality.json",
        "diversed-demo bench --categories summarization,math_reasoning --per-category 20 --max-new-tokens 64 "
        "--modes ar,exact,static:0.5,static:0.8,dynamic:summarization,dynamic:general "
        "--json results/quality.json",
    ),
    "Spec-Bench on a GPU (one H200, bfloat16, CUDA graphs)": (
        RESULTS_DIR / "bench_cuda.json",
        "diversed-demo bench --device cuda --dtype bfloat16 --per-category 1 --max-new-tokens 64 "
        "--modes ar,exact,static:0.5 --json results/bench_cuda.json",
    ),
}
# README's bench as run on each kind of machine (the GGUF kernel's instruction sets, runtime/amx_gguf.py, and
# a GPU): the header quotes the run on the kind that serves the page, as a visitor's Compare meets it there.
BENCH_BY_MACHINE = {
    "AMX": RESULTS_DIR / "bench.json",
    "AVX-512 VNNI": RESULTS_DIR / "bench_zen4.json",
    "AVX2": RESULTS_DIR / "bench_avx2.json",
    "cuda": RESULTS_DIR / "bench_cuda.json",
}
FRONTIER_COLUMNS = [
    "task",
    "T",
    "quality metric",
    "setting",
    "acceptance",
    "quality",
    "mean w_t",
    "margin over the static frontier",
    "prompts",
]


def quality_metric(task: str) -> str:
    """The quality a task's frontier measures (its reward in tasks/rewards)."""
    return QUALITY_LABEL.get(task, QUALITY_LABEL["general"])


def head_margin_text(evaluation: Evaluation) -> str:
    """'+1.44 ± 0.45 (P > 0: 0.997): beyond' from an evaluation's bootstrap margins and verdict, or n/a."""
    margin = evaluation.quality_margin
    if margin is None or margin.estimate is None:
        return "n/a"
    kind = evaluation.verdict.kind if evaluation.verdict else None
    return (
        f"{fmt(margin.estimate, '+.4g')} ± {fmt(margin.stderr, '.2g')} "
        f"(P > 0: {fmt(margin.p_positive, '.3g')})" + (f": {kind}" if kind else "")
    )


def frontier_rows(name: str, card: HeadCard) -> list[dict]:
    """The table's rows of one head's card: per temperature kind it was evaluated at on its primary set,
    each static w and the head."""
    task = card_task(card)
    rows = []
    for frontier in filter(None, (frontier_at(card, 1.0), frontier_at(card, 0.0))):
        temperature = frontier.settings.temperature
        for row in [*frontier.static_points, frontier.head_point]:
            is_head = row.w is None
            rows.append(
                {
                    "task": task,
                    "T": "greedy" if is_greedy(temperature) else temperature,
                    "quality metric": quality_metric(task),
                    "setting": f"DIVERSED head {name}" if is_head else f"static w = {row.w:g}",
                    "acceptance": fmt(row.acceptance),
                    "quality": fmt(row.quality, ".4g"),
                    "mean w_t": fmt(row.mean_w, ".2f"),
                    "margin over the static frontier": head_margin_text(frontier) if is_head else "",
                    "prompts": row.examples,
                }
            )
    return rows


def frontier_table(head_paths: dict[str, Path]) -> pd.DataFrame:
    """The paper-style table: per task and temperature (sampled, greedy: each card's evaluations on its
    primary set), each static w and each head with acceptance, quality and mean w; for heads, the quality
    margin over the static frontier at their acceptance."""
    rows = [row for name, card in head_cards(head_paths).items() for row in frontier_rows(name, card)]
    # A task's static points appear once per temperature, however many of its heads carry them.
    return (
        pd.DataFrame(rows, columns=FRONTIER_COLUMNS)
        .drop_duplicates(subset=["task", "T", "setting"])
        .reset_index(drop=True)
    )


def bench_markdown(name: str) -> str:
    """One bench report as the bench's own markdown tables, or a note naming the command that writes it."""
    path, command = BENCH_REPORTS[name]
    report, why = read_json_object(path)
    if report is not None:
        try:
            return f"*From `{shown_path(path)}`.*\n\n" + markdown_table(report)
        except (KeyError, TypeError, ValueError) as err:
            why = f"{path.name} is not a bench report ({type(err).__name__}: {err})"
    return f"*Not measured yet ({why}): `{command}` writes it.*"


VERIFIER_COLUMNS = [
    "task",
    "decoding",
    "setting",
    "acceptance",
    "quality",
    "fidelity",
    "vs static w: quality",
    "vs static w: fidelity",
    "vs the rule at its λ: quality",
    "vs the rule at its λ: fidelity",
    "prompts",
]


def margin_ci_text(judged: Judged | None) -> str:
    """'beyond: +0.396 [+0.220, +0.574]' from a verdict block (its margin and 95% interval), or ''."""
    margin = judged.quality_margin if judged else None
    if margin is None or margin.estimate is None:
        return "no claim" if judged else ""
    low, high = margin.ci95 or (None, None)
    interval = f"[{fmt(low, '+.3f')}, {fmt(high, '+.3f')}]"
    kind = judged.verdict.kind if judged.verdict else None
    return f"{kind}: {fmt(margin.estimate, '+.3f')} {interval}"


def versus_rule_text(versus: Versus | None, measure: str = "fidelity") -> str:
    """'+0.012 ± 0.030' (the head's quality or fidelity minus the rule's, paired), or ''."""
    difference = getattr(versus, f"{measure}_difference", None)
    if difference is None:
        return ""
    return f"{fmt(difference, '+.3f')} ± {fmt(getattr(versus, f'{measure}_stderr'), '.3f')}"


def verifier_rows(report: RuleReport, decoding: str) -> list[dict]:
    """One rule report's rows: each static w, the rule at each λ and each head (a cost head at each λ)."""
    judged = {f"cost:{k.removeprefix('cost:')}": v for k, v in report.rules.items()}
    judged |= {f"dynamic:{name}": v for name, v in report.heads.items()}
    rows = []
    for row in report.points:
        name, verdict = row.point, judged.get(row.point)
        setting = (
            f"static w = {row.w:g}"
            if row.w is not None
            else name.replace("cost:", "per-token rule λ = ")
            if name.startswith("cost:")
            else "head " + name.removeprefix("dynamic:").replace("@", " λ = ")
        )
        rows.append(
            {
                "task": report.task,
                "decoding": decoding,
                "setting": setting,
                "acceptance": fmt(row.acceptance),
                "quality": fmt(row.quality, ".4g"),
                "fidelity": fmt(row.fidelity, ".3f"),
                "vs static w: quality": margin_ci_text(verdict),
                "vs static w: fidelity": margin_ci_text(verdict.fidelity if verdict else None),
                "vs the rule at its λ: quality": versus_rule_text(verdict and verdict.versus_rule, "quality"),
                "vs the rule at its λ: fidelity": versus_rule_text(verdict and verdict.versus_rule),
                "prompts": row.examples,
            }
        )
    return rows


def verifier_table(reports: dict[str, dict[str, Path]]) -> pd.DataFrame:
    """The per-token verifiers against static w, from the rule's reports ({decoding: {task: path}}): every
    point of each, judged in the task's score and in fidelity, with the 95% intervals."""
    rows = []
    for decoding, paths in reports.items():
        for path in paths.values():
            report, _ = read_model(RuleReport, path)
            rows += verifier_rows(report, decoding) if report else []
    return pd.DataFrame(rows, columns=VERIFIER_COLUMNS)


def verifier_markdown(reports: dict[str, dict[str, Path]]) -> str:
    """verifier_table as the Markdown table docs/results.md quotes (results/rule/table.py prints it)."""
    table = verifier_table(reports)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
