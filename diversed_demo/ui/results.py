"""The measured figures the project ships, read for the page: the draft card (cost ratio), the heads'
frontier cards (static points and heads per task), the bench reports; the app's measured defaults; and
the dial's points, projection presets and transformers snippet.

Every figure shown comes from one of those files. A missing file or key gives a placeholder that says
which command writes it, never a number typed here (the GPU presets below are model sizes, not results).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from ..common.paths import RESULTS_DIR
from ..eval.rewards import QUALITY_LABEL
from ..eval.theory import alpha_from_acceptance
from ..models.embedded import EMBEDDED_DRAFT_DIR
from ..models.heads import greedy_twin, sampled_twin, trained_for_greedy
from .runs import DecodeSettings

DRAFT_CARD = EMBEDDED_DRAFT_DIR / "card.json"
DRAFT_CARD_COMMAND = "diversed-demo distill --measure-only"
FRONTIER_COMMAND = "diversed-demo frontier --task <task> --head <name> --max-new-tokens 64 --write-card"
# The bench reports the Results tab draws, and the commands that write them.
BENCH_REPORTS = {
    "Spec-Bench, every category": (
        RESULTS_DIR / "bench.json",
        "diversed-demo bench --per-category 2 --max-new-tokens 64 --modes "
        "ar,exact,static:0.5,dynamic:summarization-greedy,dynamic:general-greedy --vs-transformers --json results/bench.json",
    ),
    "Quality on the referenced categories": (
        RESULTS_DIR / "quality.json",
        "diversed-demo bench --categories summarization,math_reasoning --per-category 20 --max-new-tokens 64 "
        "--modes ar,exact,static:0.5,static:0.8,dynamic:summarization,dynamic:general --json results/quality.json",
    ),
}


def read_json(path: Path) -> tuple[dict | None, str]:
    """(the file's object, "") or (None, why it cannot be read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path.name} is not there"
    except (OSError, ValueError) as err:
        return None, f"{path.name} cannot be read ({err})"
    return (data, "") if isinstance(data, dict) else (None, f"{path.name} does not hold a JSON object")


def shown_path(path: Path) -> Path:
    """A file as the page names it: relative to the repository when it is in it."""
    return path.relative_to(RESULTS_DIR.parent) if path.is_relative_to(RESULTS_DIR.parent) else path


def dig(data, *keys):
    """data[k0][k1]…, or None where any level is missing or of the wrong type."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


# ---------------------------------------------------------------- draft/target cost ratio


@dataclass
class CostPreset:
    label: str
    cost_ratio: float
    source: str


def measured_cost_preset(card_path: Path = DRAFT_CARD) -> CostPreset | None:
    """The embedded draft's measured draft/target cost per token, from its card (None if the card lacks it)."""
    card, _ = read_json(card_path)
    c = dig(card, "spec_bench", "cost_ratio")
    if not isinstance(c, (int, float)) or not 0 < c <= 1:
        return None
    threads = dig(card, "spec_bench", "threads")
    where = f"CPU, {threads} thread{'s' if threads != 1 else ''}" if threads else "CPU"
    return CostPreset(f"embedded pair, measured ({where}): c = {c:.2f}", round(float(c), 2), str(card_path))


# Decoding one token on a GPU is memory-bound: a forward pass costs about the time to read the weights, so
# c ≈ draft parameters ÷ target parameters. These are estimates from the models' sizes (in billions),
# marked as such on the page; the embedded pair's c is measured (above).
GPU_PAIRS = (
    ("Llama-3.1-8B ← Llama-3.2-1B", 8.03, 1.24),
    ("Qwen2.5-7B ← Qwen2.5-0.5B", 7.62, 0.49),
    ("Qwen2.5-32B ← Qwen2.5-1.5B", 32.8, 1.54),
    ("Llama-3.1-70B ← Llama-3.2-1B", 70.6, 1.24),
)


def cost_presets(card_path: Path = DRAFT_CARD) -> list[CostPreset]:
    presets = [
        CostPreset(
            f"GPU {name} (size ratio, estimate): c = {draft / target:.3f}",
            round(draft / target, 3),
            "parameter counts",
        )
        for name, target, draft in GPU_PAIRS
    ]
    measured = measured_cost_preset(card_path)
    return ([measured] if measured else []) + presets


# ---------------------------------------------------------------- frontier cards


@dataclass
class Frontier:
    """One task's shipped frontier: static points and heads, as the dial draws them."""

    task: str
    points: pd.DataFrame
    n_draft: int
    note: str  # where the figures come from


def points_frame(rows: list[dict], n_draft: int) -> pd.DataFrame:
    """The dial's points from frontier rows (frontier.Point.row(), as in the cards or a live sweep).

    One row per point: label, kind (static/head), w (the mean w_t for heads), acceptance (accepted/drafted),
    alpha (per-token acceptance inferred from it), tokens_per_second, quality (the task reward).
    """
    out = []
    for row in rows:
        static = row.get("w") is not None
        acceptance = row.get("acceptance")
        out.append(
            {
                "label": f"w = {row['w']:.2f}"
                if static
                else str(row.get("point", "head")).removeprefix("dynamic:"),
                "kind": "static" if static else "head",
                "w": row["w"] if static else row.get("mean_w"),
                "acceptance": acceptance,
                "alpha": alpha_from_acceptance(acceptance, n_draft) if acceptance is not None else math.nan,
                "tokens_per_second": row.get("tokens_per_second"),
                "quality": row.get("quality"),
            }
        )
    return pd.DataFrame(
        out, columns=["label", "kind", "w", "acceptance", "alpha", "tokens_per_second", "quality"]
    )


def expected_tv(points: pd.DataFrame) -> float:
    """E[TV(p, q)] from the exact point (w = 1), whose per-token acceptance is 1 − E[TV]; the other static
    points then test the line 1 − w·E[TV] rather than fit it."""
    exact = points[(points["kind"] == "static") & (points["w"] == 1.0)]
    return float(1 - exact["alpha"].iloc[0]) if not exact.empty else math.nan


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def readable_frontier(frontier) -> bool:
    """An evaluation the page can draw: static points and a head point, each with an acceptance in [0, 1],
    and numeric settings where it has them."""
    points = dig(frontier, "static_points")
    head = dig(frontier, "head_point")
    if not isinstance(points, list) or not isinstance(head, dict):
        return False
    rows_ok = all(
        isinstance(row, dict)
        and is_number(row.get("acceptance"))
        and 0 <= row["acceptance"] <= 1
        and (row.get("w") is None or is_number(row["w"]))
        for row in [*points, head]
    )
    settings = dig(frontier, "settings") or {}
    return (
        rows_ok
        and isinstance(settings, dict)
        and all(
            is_number(settings[key])
            for key in ("n_draft", "max_new_tokens", "temperature")
            if key in settings
        )
    )


def head_cards(head_paths: dict[str, Path]) -> dict[str, dict]:
    """{head name: its card} for the heads that have a readable one (<head>.json beside the head); a
    malformed card is left out, as if the head had none."""
    cards = {}
    for name, path in head_paths.items():
        card, _ = read_json(Path(path).with_suffix(".json"))
        if readable_frontier(dig(card, "frontier")):
            cards[name] = card
    return cards


def is_greedy(temperature) -> bool:
    return temperature == 0


def frontier_at(card: dict, temperature: float) -> dict | None:
    """The card's evaluation on its primary set measured greedily (T = 0) or sampled (T > 0), as
    `temperature` is; None where it has none of that kind."""
    primary = card["frontier"]
    held_out = dig(primary, "settings", "held_out")
    candidates = [primary, *(card.get("evaluations") or {}).values()]
    return next(
        (
            e
            for e in candidates
            if readable_frontier(e)
            and dig(e, "settings", "held_out") == held_out
            and is_greedy(dig(e, "settings", "temperature")) == is_greedy(temperature)
        ),
        None,
    )


def shipped_frontiers(head_paths: dict[str, Path], temperature: float = 1.0) -> dict[str, Frontier]:
    """Per task, the static points of its first head card and every carded head of that task as a star
    (its heads trained for the temperature's kind of decoding, where it has any: a greedy twin at T = 0).

    Each card's evaluation of the temperature's kind (greedy or sampled, see `frontier_at`) is drawn, and
    a task none of whose cards has one falls back to the primary evaluations. Heads of one task were
    each evaluated with their own static sweep; the first card's sweep is drawn (the same settings and
    held-out set for the shipped ones)."""
    cards = head_cards(head_paths)
    # a task's heads trained for this kind of decoding, where it has any: the app decodes with those
    fitting = {
        card.get("task") or "general"
        for card in cards.values()
        if trained_greedy(card) == is_greedy(temperature)
    }
    cards = {
        name: card
        for name, card in cards.items()
        if trained_greedy(card) == is_greedy(temperature) or (card.get("task") or "general") not in fitting
    }
    chosen = {name: frontier_at(card, temperature) for name, card in cards.items()}
    tasks_drawn = {cards[name].get("task") or "general" for name, frontier in chosen.items() if frontier}
    by_task: dict[str, Frontier] = {}
    for name, card in cards.items():
        task = card.get("task") or "general"
        frontier = chosen[name] or (None if task in tasks_drawn else card["frontier"])
        if frontier is None:
            continue
        n_draft = int(dig(frontier, "settings", "n_draft") or 4)
        head_row = {**frontier["head_point"], "point": name}
        if task not in by_task:
            settings = frontier.get("settings", {})
            note = (
                f"{frontier.get('examples', '?')} held-out prompts ({settings.get('held_out', 'held-out set')}), "
                f"N = {n_draft}, T = {settings.get('temperature', '?')}, ≤{settings.get('max_new_tokens', '?')} "
                f"new tokens; from {shown_path(Path(head_paths[name]).with_suffix('.json'))}, written by "
                f"`{frontier.get('command', FRONTIER_COMMAND)}`"
            )
            by_task[task] = Frontier(
                task, points_frame(frontier["static_points"] + [head_row], n_draft), n_draft, note
            )
        else:
            extra = points_frame([head_row], by_task[task].n_draft)
            by_task[task].points = pd.concat([by_task[task].points, extra], ignore_index=True)
    return by_task


def trained_greedy(card: dict) -> bool:
    return trained_for_greedy(card.get("training"))


def head_for_temperature(cards: dict[str, dict], head_name, temperature):
    """The head to decode with at `temperature`: `head_name` if it was trained for that kind of decoding
    (greedy or sampled), else its task's head that was (`<name>-greedy` ↔ `<name>` first); None to keep
    the user's choice where no such head exists."""
    card = cards.get(head_name)
    if card is None or trained_greedy(card) == is_greedy(temperature):
        return None
    task = card.get("task")
    fits = [
        n for n, c in cards.items() if c.get("task") == task and trained_greedy(c) == is_greedy(temperature)
    ]
    twin = greedy_twin(head_name) if is_greedy(temperature) else sampled_twin(str(head_name))
    return twin if twin in fits else next(iter(fits), None)


def head_margin_text(evaluation: dict) -> str:
    """'+1.44 ± 0.45 (P > 0: 0.997): beyond' from an evaluation's bootstrap margins and verdict, or n/a."""
    from ..common.formatting import fmt

    margin = dig(evaluation, "quality_margin")
    if not isinstance(margin, dict) or margin.get("estimate") is None:
        return "n/a"
    kind = dig(evaluation, "verdict", "kind")
    return (
        f"{fmt(margin['estimate'], '+.4g')} ± {fmt(margin.get('stderr'), '.2g')} "
        f"(P > 0: {fmt(margin.get('p_positive'), '.3g')})" + (f": {kind}" if isinstance(kind, str) else "")
    )


def quality_metric(task: str) -> str:
    """The quality a task's frontier measures (its reward in tasks/rewards)."""
    return QUALITY_LABEL.get(task, QUALITY_LABEL["general"])


def headline(head_paths: dict[str, Path]) -> str:
    """One sentence for the page's header: each carded head's quality margin over the static frontier at
    its own acceptance and its verdict, grouped by the decoding it was trained for (sampled, greedy), or ""
    where no head has a card."""
    from ..common.formatting import fmt

    groups = {False: [], True: []}
    for name, card in head_cards(head_paths).items():
        margin = dig(card, "frontier", "quality_margin")
        if not isinstance(margin, dict) or not isinstance(margin.get("estimate"), (int, float)):
            continue
        metric = quality_metric(card.get("task") or "general")
        verdict = dig(card, "frontier", "verdict", "kind")
        groups[trained_greedy(card)].append(
            f"<b>{html.escape(name)}</b> {metric} {fmt(margin['estimate'], '+.2g')} ± {fmt(margin.get('stderr'), '.1g')}"
            + (f" ({html.escape(verdict)})" if isinstance(verdict, str) else "")
        )
    parts = [
        f"{label}: " + "; ".join(claims)
        for label, claims in (("Sampled (T = 1)", groups[False]), ("Greedy", groups[True]))
        if claims
    ]
    if not parts:
        return ""
    return (
        "Heads against the static frontier at equal acceptance, on held-out prompts (each card names its "
        "set). " + ". ".join(parts) + ". (Speed–quality dial, Results.)"
    )


def frontier_table(head_paths: dict[str, Path]) -> pd.DataFrame:
    """The paper-style table: per task and temperature (sampled, greedy: each card's evaluations on its
    primary set), each static w and each head with acceptance, quality and mean w; for heads, the quality
    margin over the static frontier at their acceptance."""
    from ..common.formatting import fmt

    rows = []
    for name, card in head_cards(head_paths).items():
        task = card.get("task") or "general"
        metric = quality_metric(task)
        for frontier in filter(None, (frontier_at(card, 1.0), frontier_at(card, 0.0))):
            temperature = dig(frontier, "settings", "temperature")
            for row in frontier["static_points"] + [frontier["head_point"]]:
                is_head = row.get("w") is None
                rows.append(
                    {
                        "task": task,
                        "T": "greedy" if is_greedy(temperature) else temperature,
                        "quality metric": metric,
                        "setting": f"DIVERSED head {name}" if is_head else f"static w = {row['w']:g}",
                        "acceptance": fmt(row.get("acceptance")),
                        "quality": fmt(row.get("quality"), ".4g"),
                        "mean w_t": fmt(row.get("mean_w"), ".2f"),
                        "margin over the static frontier": head_margin_text(frontier) if is_head else "",
                        "prompts": row.get("examples"),
                    }
                )
    columns = [
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
    # A task's static points appear once per temperature, however many of its heads carry them.
    return (
        pd.DataFrame(rows, columns=columns)
        .drop_duplicates(subset=["task", "T", "setting"])
        .reset_index(drop=True)
    )


def bench_markdown(name: str) -> str:
    """One bench report as the bench's own markdown tables, or a note naming the command that writes it."""
    from ..eval.bench_report import markdown_table

    path, command = BENCH_REPORTS[name]
    report, why = read_json(path)
    if report is not None:
        try:
            return f"*From `{shown_path(path)}`.*\n\n" + markdown_table(report)
        except (KeyError, TypeError, ValueError) as err:
            why = f"{path.name} is not a bench report ({type(err).__name__}: {err})"
    return f"*Not shipped yet: {why}. Written by*\n\n```bash\n{command}\n```"


# ---------------------------------------------------------------- defaults on arrival


@dataclass
class Defaults:
    """Where the app starts: the settings at which the shipped figures were measured."""

    settings: DecodeSettings
    example_index: int | None
    note: str


def arrival_defaults(examples, head_paths: dict[str, Path]) -> Defaults:
    """The first example, and DIVERSED with the carded head of that example's task at the settings its
    frontier card was measured with (N, temperature, new tokens); the note says whether the head beat the
    static frontier there. w starts at the head's mean w_t, so the static ensemble spends the same average
    weight.

    Without a carded head (another pair), static w = 0.5 at the decoder's defaults, and the note says so.
    """
    first = examples[0] if examples else None
    cards = head_cards(head_paths)
    task = first.task if first else None
    # The task's head trained for greedy decoding first: the app opens greedy. At T = 1 the 135M target's own
    # summary of the first example is garbled whatever the mode (exact SD's too); greedy, the greedy twin's
    # is accurate and the fastest (first example, N = 2: τ 2.21 against exact SD's 1.62).
    ranked = sorted(cards, key=lambda n: not trained_greedy(cards[n]))
    name = next((n for n in ranked if cards[n].get("task") == task), next(iter(ranked), None))
    if name is None:
        return Defaults(
            DecodeSettings(mode="static", head_name=next(iter(head_paths), None)),
            0 if first else None,
            "no frontier card for this pair: decoder defaults",
        )
    frontier = cards[name]["frontier"]
    settings = frontier.get("settings", {})
    mean_w = dig(frontier, "head_point", "mean_w")
    defaults = DecodeSettings(
        mode="dynamic",
        head_name=name,
        ensemble_weight=round(mean_w * 20) / 20 if isinstance(mean_w, (int, float)) else 0.5,
        n_draft=int(settings.get("n_draft", 4)),
        max_new_tokens=int(settings.get("max_new_tokens", 64)),
        temperature=float(settings.get("temperature", 1.0)),
    )
    verdict = (
        "where the head beat the static frontier"
        if frontier.get("beyond_frontier")
        else "where the head was not beyond the static frontier"
    )
    return Defaults(
        defaults,
        0 if first else None,
        f"settings of {shown_path(Path(head_paths[name]).with_suffix('.json'))}'s frontier run, {verdict}",
    )


def with_draft_length(start: Defaults, n_draft: int, alpha: float, costs: dict) -> Defaults:
    """`start` at the draft length found fastest on this machine (by the analytic bound at per-token acceptance
    α with the measured costs); the note says why where it differs from the card's. A card's N is a frontier
    setting, and which N pays depends on the machine: on a 2-core CPU a pass over 5 tokens costs about 1.5
    target tokens, and at T = 1 N = 4 lost to target-only on the first example."""
    if n_draft == start.settings.n_draft:
        return start
    note = (
        f"{start.note}; N = {n_draft}, not {start.settings.n_draft}: the fastest here by the "
        f"analytic bound at this example's acceptance (α = {alpha:.2f} in a short decode at start), with a draft "
        f"token costing {costs['c']:.2f} and a pass over N + 1 tokens {costs['v'][n_draft]:.2f} of a target token"
    )
    return replace(start, settings=replace(start.settings, n_draft=n_draft), note=note)


# ---------------------------------------------------------------- the dial in transformers


def transformers_snippet(
    target: str,
    draft: str,
    w: float,
    temperature: float,
    max_new_tokens: int,
    feature_draft: bool = False,
    local: bool = False,
) -> str:
    """Python that reproduces static w with transformers' own assisted generation, on this pair.

    transformers verifies against ν = w·p_target + (1 − w)·q_draft (generation/utils.py, _speculative_sampling),
    the same ν as here, and accepts only 0 < w < 1: w = 1 is its plain (lossless) assisted generation.
    `local`: the pair is not two hub models (the embedded pair, local directories), so the snippet loads it
    with this package and hands its models to transformers, as the bench's transformers check does.
    """
    if feature_draft:
        # An EAGLE-3 draft reads the target's features: transformers has no path for it.
        models = (
            "# This pair's draft is an EAGLE-3 feature draft, which transformers cannot use as an assistant;\n"
            "# any causal LM with the target's tokenizer can be one.\n"
            f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(target)})\n"
            f"target = AutoModelForCausalLM.from_pretrained({json.dumps(target)})\n"
            'draft = AutoModelForCausalLM.from_pretrained("<a causal LM with the same tokenizer>")\n'
        )
    elif local:
        models = (
            "from diversed_demo.models import load_pair  # this pair, as the app loaded it\n"
            f"pair = load_pair({json.dumps(target)}"
            + ("" if draft.startswith("assets/") else f", {json.dumps(draft)}")
            + ")\n"
            "tokenizer, target, draft = pair.tokenizer, pair.target, pair.draft\n"
        )
    else:
        models = (
            f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(target)})\n"
            f"target = AutoModelForCausalLM.from_pretrained({json.dumps(target)})\n"
            f"draft = AutoModelForCausalLM.from_pretrained({json.dumps(draft)})\n"
        )
    if w >= 1:
        weight = "    # w = 1: exact speculative decoding, transformers' default (no ensemble weight)\n"
    elif w <= 0:
        weight = (
            "    # w = 0 (every draft token accepted) is outside transformers' range 0 < w < 1; the nearest:\n"
            "    assistant_ensemble_weight=0.01,\n"
        )
    else:
        weight = f"    assistant_ensemble_weight={w:g},\n"
    sampling = "do_sample=False" if temperature == 0 else f"do_sample=True, temperature={temperature:g}"
    return f"""# transformers >= 5.14. The weight w applies to the TARGET model's distribution p: each drafted token
# is verified against nu = w * p_target + (1 - w) * q_draft, so w = 1 is exact speculative decoding and a
# lower w accepts more of the draft (assistant) model's tokens.
from transformers import AutoModelForCausalLM, AutoTokenizer

{models}
inputs = tokenizer.apply_chat_template([{{"role": "user", "content": "Why is the sky blue?"}}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = target.generate(
    **inputs,
    assistant_model=draft,
{weight}    {sampling},
    max_new_tokens={max_new_tokens},
)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
"""
