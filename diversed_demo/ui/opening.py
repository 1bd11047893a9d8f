"""Where the app opens: the first example, at the settings its task's head card was measured with, and the
draft length that pays on this machine (timed by the launcher before the app is built)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..common.paths import shown_path
from ..core.config import DecodeConfig
from ..core.prompt import encode_prompt
from ..eval.schemas import HeadCard, RuleReport, read_model
from ..eval.tasks import Example
from ..models.embedded import EMBEDDED
from ..models.heads import HeadError, list_heads, load_head
from ..runtime.costs import choose_n_draft, measure_costs
from ..runtime.dtype_choice import choice_note
from .cards import head_cards, trained_greedy
from .frontiers import RULE_REPORTS, RULE_REPORTS_GREEDY
from .render import MODE_LABELS
from .runs import APP_CONFIG
from .space import zero_gpu_space


@dataclass
class Defaults:
    """Where the app starts: the settings at which the shipped figures were measured."""

    settings: DecodeConfig  # its head as named
    example_index: int | None
    note: str  # at most two short sentences, for the sidebar
    why: str = ""  # where the settings come from, in full, under the note


def opening_head(cards: dict[str, HeadCard], task: str | None) -> str | None:
    """The carded head to open with: the task's, trained for greedy decoding first (the app opens greedy,
    where the small target's own text is readable), else any carded head."""
    ranked = sorted(cards, key=lambda n: not trained_greedy(cards[n]))
    return next((n for n in ranked if cards[n].task == task), next(iter(ranked), None))


def arrival_defaults(examples: list[Example], head_paths: dict[str, Path]) -> Defaults:
    """The first example, and DIVERSED with the carded head of that example's task at the settings its
    frontier card was measured with (N, temperature, new tokens); the note says whether the head beat the
    static frontier there. w starts at the head's mean w_t, so the static ensemble spends the same average
    weight.

    Without a carded head (another pair), static w = 0.5 at the decoder's defaults, and the note says so.
    """
    first = examples[0] if examples else None
    example_index = 0 if first else None
    cards = head_cards(head_paths)
    name = opening_head(cards, first.task if first else None)
    if name is None:
        settings = APP_CONFIG.replace(mode="static", head=next(iter(head_paths), None))
        why = "No head of this pair has a frontier card, so nothing was measured to open at."
        return Defaults(settings, example_index, "Opened at the decoder's defaults.", why)
    frontier = cards[name].frontier
    measured, mean_w = frontier.settings, frontier.head_point.mean_w
    settings = APP_CONFIG.replace(
        mode="dynamic",
        head=name,
        ensemble_weight=round(mean_w * 20) / 20 if mean_w is not None else 0.5,
        n_draft=measured.n_draft,
        max_new_tokens=measured.max_new_tokens or 64,
        temperature=1.0 if measured.temperature is None else measured.temperature,
    )
    verdict = (
        "where the head beat the static frontier"
        if frontier.beyond_frontier
        else "where the head was not beyond the static frontier"
    )
    card_path = shown_path(Path(head_paths[name]).with_suffix(".json"))
    unticked = f"N = {settings.n_draft} unticked, as the {name} head was measured"
    note = f"Opened with N chosen step by step ({unticked})."
    return Defaults(settings, example_index, note, f"The settings of {card_path}'s frontier run, {verdict}.")


def with_draft_length(start: Defaults, n_draft: int, alphas: dict[str, float], costs: dict) -> Defaults:
    """`start` at the draft length found fastest on this machine for the slower of the measured modes (by
    the analytic bound at each one's per-token acceptance α with the measured costs), and why. A card's N
    is a frontier setting, and which N pays depends on the machine (docs/measurements/app.md)."""
    note = f"Opened with N chosen step by step (N = {n_draft} unticked, the fastest fixed N here)."
    measured = ", ".join(f"{name} {alpha:.2f}" for name, alpha in alphas.items())
    why = (
        f"{start.why} Each step drafts while one more token is expected to return more than it costs (the"
        " tick under N). Unticked, N"
        f" = {n_draft}"
        + (f", not {start.settings.n_draft}," if n_draft != start.settings.n_draft else "")
        + f" is where the slower of {' and '.join(alphas)} is fastest here by the analytic bound (Compare"
        f" runs every mode at one N), at this example's acceptance in a short decode at start"
        f" (α: {measured}), with a draft token costing {costs['c']:.2f} and a pass over N + 1 tokens"
        f" {costs['v'][n_draft]:.2f} of a target token."
    )
    return replace(start, settings=start.settings.replace(n_draft=n_draft), note=note, why=why)


def slowest_mode_fastest(chosen: dict[str, dict]) -> int:
    """The N whose smallest bound over the modes (choose_n_draft's) is the largest."""
    lengths = next(iter(chosen.values()))["bounds"]
    return max(lengths, key=lambda n: min(mode["bounds"][n] for mode in chosen.values()))


def opening_draft_length(pair, examples: list[Example], start: Defaults) -> Defaults:
    """`start` at the draft length that pays on this machine for its example and settings: the draft's and
    the verification's costs timed, and the example decoded for 32 tokens in the opening mode and in exact
    SD to measure their acceptance, as `bench --n-draft auto` chooses, at the N where the slower of the two
    is fastest: Compare runs every mode at one N, and exact SD, accepting least, wants the shortest. Kept
    as is on ZeroGPU Spaces, where a GPU is attached only inside a call, and where the opening head does
    not load (the Decode tab then says why, on use)."""
    settings = start.settings
    if start.example_index is None or zero_gpu_space():
        return start
    if pair.costs is None and (pair.dtype_choice or {}).get("untimed"):
        # a server's first start times nothing before its page (runtime/dtype_choice.py): the card's N
        timed = "timed on this machine at the next start"
        return replace(start, why=f"{start.why} N = {settings.n_draft} unticked, as the card's: {timed}.")
    prompt = examples[start.example_index].prompt
    try:
        head = load_head(settings.head_name, pair) if settings.mode == "dynamic" else None
    except HeadError:
        return start
    # Calibrated as the app's decodes draft (with prompt lookup), in a short decode at the card's N.
    probe = settings.replace(head=head, max_new_tokens=32)
    modes = {MODE_LABELS[settings.mode]: probe}
    modes.setdefault(MODE_LABELS["exact"], probe.replace(mode="exact", head=None))
    costs = pair.costs or measure_costs(
        pair, encode_prompt(pair.tokenizer, prompt), range(1, 7), rounds=1, calls=10, draft_tokens=16
    )
    chosen = choose_n_draft(pair, modes, costs, [prompt])
    alphas = {name: mode["calibration_alpha"] for name, mode in chosen.items()}
    return with_draft_length(start, slowest_mode_fastest(chosen), alphas, costs)


def rule_opening(
    start: Defaults,
    task: str | None,
    reports: dict[str, Path] = RULE_REPORTS,
    greedy_reports: dict[str, Path] = RULE_REPORTS_GREEDY,
) -> Defaults:
    """`start` moved to the per-token rule at T = 1 where its shipped evaluation on the task's held-out
    prompts (results/rule/) put it beyond the static frontier in the task's own score, at the λ of highest
    acceptance among those (the head kept for Compare), and where its text scores no lower there than
    greedy exact SD's on the same prompts: a first screen's text must read well. Else `start`, its why
    saying what was found."""
    report, _ = read_model(RuleReport, reports[task]) if task in reports else (None, "")
    if report is None:
        return start
    beyond = [
        (row.acceptance, row.quality, label)
        for label, m in report.rules.items()
        for row in report.points
        if row.point == label and m.verdict is not None and m.verdict.kind == "beyond"
    ]
    measured = f"{report.examples} held-out {task} prompts at T = 1 ({shown_path(reports[task])})"
    if not beyond:
        return replace(start, why=f"{start.why} {not_beyond(report, measured)}")
    acceptance, quality, label = max(beyond)
    lam = float(label.removeprefix("cost:"))
    why = f"The per-token rule at λ = {lam:g}, measured on {measured}: {report.rules[label].verdict.text}."
    greedy_quality = exact_quality(greedy_reports.get(task))
    if greedy_quality is not None and quality < greedy_quality:
        return replace(start, why=f"{start.why} {why} {reads_worse(quality, greedy_quality)}")
    settings = start.settings.replace(mode="cost", lam=lam, temperature=1.0, max_new_tokens=64)
    note = f"Opened on the per-token rule at λ = {lam:g}, T = 1, where it beat the static frontier."
    return replace(start, settings=settings, note=note, why=why)


def exact_quality(path: Path | None) -> float | None:
    """Exact SD's (w = 1) task score in a shipped evaluation of the rule, or None without one."""
    report, _ = read_model(RuleReport, path) if path else (None, "")
    return next((row.quality for row in (report.points if report else []) if row.w == 1.0), None)


def reads_worse(quality: float, greedy_quality: float) -> str:
    return (
        f"But the small target's text at T = 1 scores {quality:.3f} there, against {greedy_quality:.3f} for "
        "exact SD greedy on the same prompts, so the app opens greedy, where its text reads best; the dial "
        "shows the rule at T = 1."
    )


def not_beyond(report: RuleReport, measured: str) -> str:
    """Why the app does not open on the rule: not beyond in the task's score; and where it was beyond in
    the target's likelihood of the text, at which λ."""
    in_fidelity = [
        label.removeprefix("cost:")
        for label, m in report.rules.items()
        if m.fidelity is not None and m.fidelity.verdict is not None and m.fidelity.verdict.kind == "beyond"
    ]
    likelihood = f" (it was at λ = {', '.join(in_fidelity)} in the target's likelihood of the text)"
    return (
        f"The per-token rule was not beyond the static frontier in the task's own score on {measured}"
        f"{likelihood if in_fidelity else ''}, so the app opens where the small target's text reads best."
    )


def measured_opening(pair, examples: list[Example]) -> Defaults:
    """What the launchers open the app at: the arrival settings, at the draft length timed on this pair,
    and, where the dtype was chosen by measurement, which one and why."""
    start = arrival_defaults(examples, list_heads(pair))
    if pair.target_name == EMBEDDED and examples:  # the rule's shipped evaluations are of the embedded pair
        start = rule_opening(start, examples[0].task)
    start = opening_draft_length(pair, examples, start)
    if pair.dtype_choice is None:
        return start
    dtype = pair.dtype_choice["dtype"]
    return replace(
        start,
        note=f"{start.note.removesuffix('.')}, in {dtype}.",
        why=f"{start.why} The models run in {choice_note(pair.dtype_choice)}.",
    )


def settings_why(pair, start: Defaults) -> str:
    """The sidebar's fold: where the settings come from, then how the pair runs at this moment (what the
    runtime builds while the app serves lands between decodes: the AMX kernel, the compiled passes)."""
    runtime = f" How the pair runs here now: {pair.runtime}." if pair.runtime else ""
    return f"{start.why}{runtime}".strip()
