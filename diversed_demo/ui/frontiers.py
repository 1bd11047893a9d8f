"""The dial's points: static w and heads, each at its acceptance, quality and speed, from the shipped
frontier cards or a live sweep; and E[TV], which the theory line 1 − w·E[TV] needs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..common.paths import RESULTS_DIR, shown_path
from ..eval.schemas import Evaluation, HeadCard, Point, RuleReport, Verdict, read_model
from ..runtime.theory import alpha_from_acceptance
from .cards import (
    FRONTIER_COMMAND,
    card_task,
    frontier_at,
    head_cards,
    is_cost_head,
    is_greedy,
    trained_greedy,
)

RULE_COMMAND = "results/rule/run.sh"  # writes the rule's evaluations, one JSON per task (T=0: greedy)
RULE_SETS = (
    ("general", "spec_bench"),
    ("summarization", "spec_bench"),
    ("math", "arithmetic"),
    ("code", "mbpp"),
)
RULE_REPORTS = {task: RESULTS_DIR / "rule" / f"{task}-{held_out}-T1.json" for task, held_out in RULE_SETS}
RULE_REPORTS_GREEDY = {
    task: RESULTS_DIR / "rule" / f"{task}-{held_out}-greedy.json" for task, held_out in RULE_SETS
}


@dataclass
class Frontier:
    """One task's shipped frontier: static points and heads, as the dial draws them."""

    task: str
    points: pd.DataFrame
    n_draft: int
    note: str  # where the figures come from
    verdicts: dict[str, Verdict | None]  # head name -> its card's verdict on the static frontier


def points_frame(rows: list[dict], n_draft: int) -> pd.DataFrame:
    """The dial's points from frontier rows (frontier.Point.row(), as in the cards or a live sweep).

    One row per point: label, kind (static; rule: the per-token rule at a λ; curve: a cost head at a λ,
    its point named "dynamic:<name>@<λ>"; head), w (the mean w_t for the rule and heads), acceptance
    (accepted/drafted), alpha (per-token acceptance inferred from it), tokens_per_second, quality (the task
    reward), fidelity (the target's mean log-probability of the text, where the rows carry it).
    """
    out = []
    for row in rows:
        static, name = row.get("w") is not None, str(row.get("point", "head"))
        kind = (
            "static" if static else "rule" if name.startswith("cost:") else "curve" if "@" in name else "head"
        )
        acceptance = row.get("acceptance")
        label = (
            f"w = {row['w']:.2f}"
            if kind == "static"
            else name.replace("cost:", "λ = ")
            if kind == "rule"
            else name.removeprefix("dynamic:").replace("@", " λ = ")
        )
        out.append(
            {
                "label": label,
                "kind": kind,
                "w": row["w"] if static else row.get("mean_w"),
                "acceptance": acceptance,
                "alpha": alpha_from_acceptance(acceptance, n_draft) if acceptance is not None else math.nan,
                "tokens_per_second": row.get("tokens_per_second"),
                "quality": row.get("quality"),
                "fidelity": row.get("fidelity"),
            }
        )
    return pd.DataFrame(
        out, columns=["label", "kind", "w", "acceptance", "alpha", "tokens_per_second", "quality", "fidelity"]
    )


def expected_tv(points: pd.DataFrame) -> float:
    """E[TV(p, q)] from the exact point (w = 1), whose per-token acceptance is 1 − E[TV]; the other static
    points then test the line 1 − w·E[TV] rather than fit it."""
    exact = points[(points["kind"] == "static") & (points["w"] == 1.0)]
    return float(1 - exact["alpha"].iloc[0]) if not exact.empty else math.nan


def cards_for_temperature(cards: dict[str, HeadCard], temperature) -> dict[str, HeadCard]:
    """The cards of the heads trained for the temperature's kind of decoding (greedy or sampled), and all
    the cards of a task that has none such: the app decodes with those."""
    greedy = is_greedy(temperature)
    fitting = {card_task(card) for card in cards.values() if trained_greedy(card) == greedy}
    return {
        name: card
        for name, card in cards.items()
        if trained_greedy(card) == greedy or card_task(card) not in fitting
    }


def frontier_note(examples: int | None, settings, command: str | None, card_path: Path, n_draft: int) -> str:
    """Where a drawn frontier comes from: its prompts, settings, card and command."""
    return (
        f"{examples or '?'} held-out prompts ({settings.held_out or 'held-out set'}), "
        f"N = {n_draft}, T = {or_unknown(settings.temperature)}, "
        f"≤{or_unknown(settings.max_new_tokens)} new tokens; from {shown_path(card_path)}, written by "
        f"`{command or FRONTIER_COMMAND}`"
    )


def or_unknown(value) -> str:
    return "?" if value is None else str(value)


def point_rows(points: list[Point]) -> list[dict]:
    """Points as the rows `points_frame` reads."""
    return [point.model_dump() for point in points]


def rule_frontiers(reports: dict[str, Path] = RULE_REPORTS, command: str = f"bash {RULE_COMMAND}") -> dict:
    """Per task, the shipped evaluation of the per-token rule (results/rule/; at T = 1 by default,
    RULE_REPORTS_GREEDY for greedy): its static points, the rule at each λ and the task's heads (a cost
    head as a curve), all on the same held-out prompts, with their verdicts: {task: Frontier}."""
    by_task = {}
    for task, path in reports.items():
        report, _ = read_model(RuleReport, path)
        if report is None:
            continue
        n_draft = report.settings.n_draft
        rules = {label.replace("cost:", "per-token rule λ = "): m for label, m in report.rules.items()}
        verdicts = {name: m.verdict for name, m in {**rules, **report.heads}.items()}
        note = frontier_note(report.examples, report.settings, command, path, n_draft)
        points = points_frame(point_rows(report.points), n_draft)
        by_task[task] = Frontier(task, points, n_draft, note, verdicts)
    return by_task


def shipped_frontiers(head_paths: dict[str, Path], temperature: float = 1.0) -> dict[str, Frontier]:
    """Per task, the static points of its first head card and every carded head of that task as a star
    (its heads trained for the temperature's kind of decoding, where it has any: a greedy twin at T = 0).

    Each card's evaluation of the temperature's kind (greedy or sampled, see `frontier_at`) is drawn, and
    a task none of whose cards has one falls back to the primary evaluations. Heads of one task were
    each evaluated with their own static sweep; the first card's sweep is drawn (the same settings and
    held-out set for the shipped ones)."""
    # a cost head is a curve, drawn from the rule's reports (rule_frontiers), each point against its sweep
    cards = {
        n: c
        for n, c in cards_for_temperature(head_cards(head_paths), temperature).items()
        if not is_cost_head(c)
    }
    chosen = {name: frontier_at(card, temperature) for name, card in cards.items()}
    tasks_drawn = {card_task(cards[name]) for name, frontier in chosen.items() if frontier}
    by_task: dict[str, Frontier] = {}
    for name, card in cards.items():
        task = card_task(card)
        frontier: Evaluation | None = chosen[name] or (None if task in tasks_drawn else card.frontier)
        if frontier is None:
            continue
        head_row = frontier.head_point.model_copy(update={"point": name})
        if task in by_task:
            by_task[task].verdicts[name] = frontier.verdict
            extra = points_frame(point_rows([head_row]), by_task[task].n_draft)
            by_task[task].points = pd.concat([by_task[task].points, extra], ignore_index=True)
            continue
        n_draft = frontier.settings.n_draft
        card_path = Path(head_paths[name]).with_suffix(".json")
        note = frontier_note(frontier.examples, frontier.settings, frontier.command, card_path, n_draft)
        points = points_frame(point_rows([*frontier.static_points, head_row]), n_draft)
        by_task[task] = Frontier(task, points, n_draft, note, {name: frontier.verdict})
    return by_task


def frontier_position(verdict: Verdict | None) -> str:
    """Where a card's verdict puts its head: "beyond", "on" or "below" the static frontier, or "no claim"
    (none; quality at the set's floor; or the head's acceptance outside the static curve's range)."""
    if verdict is None or (verdict.kind == "unresolved" and "no claim" in verdict.text):
        return "no claim"
    return {"beyond": "beyond", "below": "below", "unresolved": "on"}.get(verdict.kind, "no claim")


def verdict_markdown(verdicts: dict[str, Verdict | None]) -> str:
    """In words, for each head: beyond, on or below the static frontier, with the card's CI and n."""
    lines = []
    for name, verdict in verdicts.items():
        position, detail = frontier_position(verdict), verdict.text if verdict else ""
        words = (
            "makes no claim against the static frontier"
            if position == "no claim"
            else f"lies **{position}** the static frontier"
        )
        lines.append(f"**{name}** {words}." + (f"  \n<small>{detail}</small>" if detail else ""))
    return "\n\n".join(lines)
