"""The speed–quality frontier: static w over a grid, and heads, decoded on a held-out set.

Every point decodes the same examples with the same seeds (common random numbers), so differences
between points are not sampling noise of the prompts; margins.py says whether a head lies beyond the
static frontier, and cards.py keeps the result beside the head.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, replace
from pathlib import Path

from ..core.config import DecodeConfig, check_context
from ..core.generate import decode_batch
from ..core.head import COST_HEAD_LAM, CostHead
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from ..models.heads import load_head, pair_identity, resolve_head_path, trained_for_greedy
from .cards import evaluation_key, write_head_card
from .decode_log import DecodeLog, weights_key
from .held_out import HELD_OUT, held_out_examples, held_out_set
from .margins import frontier_margin, versus_exact, versus_point
from .point import Point
from .rewards import fidelity, task_reward

DEFAULT_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
FRONTIER_DECODING = DecodeConfig(max_new_tokens=64)  # N, length and temperature of a frontier's decodes
MAX_BATCH_ROWS = 16  # decodes run together: enough to share each target pass, few enough for the caches


def decode_examples(
    pair, task: str, jobs: list[tuple], decoding: DecodeConfig = FRONTIER_DECODING
) -> list[dict]:
    """Decodes of held-out examples as one batch, by `decoding` with seed = each job's index, each job
    (example, index, how) at a static w ({"w": w}) or with a head ({"head": head}): what a point keeps of
    each decode."""
    prompts = [encode_prompt(pair.tokenizer, example.prompt) for example, _, _ in jobs]
    for prompt_ids in prompts:
        check_context(pair, prompt_ids, decoding.max_new_tokens)
    configs = [decoding.replace(**point_settings(how), seed=index) for _, index, how in jobs]
    records = []
    for prompt_ids, (example, _, how), tally in zip(prompts, jobs, decode_batch(pair, prompts, configs)):
        summary = tally.summary
        output_ids = summary.token_ids or [pair.tokenizer.eos_token_id]
        quality = task_reward(task, example, summary.text, pair, prompt_ids, output_ids)
        records.append(
            {
                "quality": quality,
                # The target's log-probability of the text, every task's second measure.
                "fidelity": quality if task == "general" else fidelity(pair, prompt_ids, output_ids),
                "counts": asdict(summary.counts),
                "mean_w": summary.mean_w,
                "token_w": tally.token_w if "w" not in how else [],
            }
        )
    return records


def point_settings(how: dict) -> dict:
    """A point's decoding mode: a static w ({"w": w}), the per-token rule ({"lam": λ}) or a head."""
    if "head" in how:  # a CostHead's point has its λ too
        return {"mode": "dynamic", "head": how["head"], **({"lam": how["lam"]} if "lam" in how else {})}
    if "lam" in how:
        return {"mode": "cost", "lam": how["lam"]}
    return {"mode": "static", "ensemble_weight": how["w"]}


def sweep(
    pair,
    examples,
    task: str,
    weights=DEFAULT_WEIGHTS,
    heads: dict | None = None,
    progress=None,
    log: DecodeLog | None = None,
    decoding: DecodeConfig = FRONTIER_DECODING,
    lams=(),
) -> list[Point]:
    """`sweep_steps` run to the end: its points, with `progress(label, example number, examples)` called
    after each decode."""
    steps = sweep_steps(pair, examples, task, weights, heads, log, decoding, lams)
    while True:
        try:
            update = next(steps)
        except StopIteration as finished:
            return finished.value
        if progress is not None:
            progress(*update)


def head_points(name: str, head, lams) -> list[tuple[str, dict]]:
    """A head's points (label, how): one for an EnsembleHead; a CostHead's curve, one per λ of the rule's
    (its default λ alone where the sweep has none)."""
    if not isinstance(head, CostHead):
        return [(f"dynamic:{name}", {"head": head})]
    return [(f"dynamic:{name}@{lam:g}", {"head": head, "lam": lam}) for lam in (lams or [COST_HEAD_LAM])]


def rule_lam(head, how: dict) -> float | None:
    """The λ of the rule a head's point is paired with: a cost head's at that point, an ensemble head's
    that it was fitted to (its warm start's), None for a head without one."""
    if "lam" in how:
        return how["lam"]
    return ((getattr(head, "meta", None) or {}).get("warm_start") or {}).get("lam")


def sweep_steps(
    pair,
    examples,
    task: str,
    weights=DEFAULT_WEIGHTS,
    heads=None,
    log=None,
    decoding=FRONTIER_DECODING,
    lams=(),
):
    """Static points for each w, a point of the per-token rule for each λ, then one point per head
    ({name: head}), every one over the same examples, decoded by `decoding` (its N, length and temperature):
    a generator that yields (label, example number, examples) after each decode and returns the points, so
    that a caller can stop between batches.

    Decodes run in example order, up to MAX_BATCH_ROWS at a time as one batch, so that a run stopped early
    has every point on (nearly) the same examples; with a `log`, decodes it already holds are read back
    instead of run again."""
    points = [(Point(f"static:{w:g}", w), {"w": w}, f"static:{w:g}|") for w in weights]
    points += [(Point(f"cost:{lam:g}", None), {"lam": lam}, f"cost:{lam:g}|") for lam in lams]
    points += [
        (Point(label, None), how, f"{label}|{weights_key(head)}")
        for name, head in (heads or {}).items()
        for label, how in head_points(name, head, lams)
    ]
    keys = [
        [
            f"{point_key}|{i}|{hashlib.sha256(example.prompt.encode()).hexdigest()[:12]}"
            for _, _, point_key in points
        ]
        for i, example in enumerate(examples)
    ]
    records = {key: log.get(key) if log is not None else None for row in keys for key in row}
    missing = [
        (key, (example, i, how))
        for i, example in enumerate(examples)
        for key, (_, how, _) in zip(keys[i], points)
        if records[key] is None
    ]
    for i, row in enumerate(keys):
        for key, (point, _, _) in zip(row, points):
            if records[key] is not None:
                yield point.label, i + 1, len(examples)
    for first in range(0, len(missing), MAX_BATCH_ROWS):
        batch = missing[first : first + MAX_BATCH_ROWS]
        for (key, (_, i, _)), record in zip(
            batch, decode_examples(pair, task, [job for _, job in batch], decoding)
        ):
            records[key] = record
            if log is not None:
                log.put(key, record)
            yield key.split("|")[0], i + 1, len(examples)
    for row in keys:
        for key, (point, _, _) in zip(row, points):
            add_record(point, records[key], task)
    return [point for point, _, _ in points]


def add_record(point: Point, record: dict, task: str) -> None:
    """One decode's figures into its point."""
    point.quality.append(record["quality"])
    # Logs written before fidelity was kept have it only where it is the quality (general).
    kept = record.get("fidelity", record["quality"] if task == "general" else None)
    if kept is not None:
        point.fidelity.append(kept)
    point.counts.append(Counts(**record["counts"]))
    if record["mean_w"] is not None:
        point.mean_w.append(record["mean_w"])
    point.token_w.extend(record["token_w"])


def head_labels(paths: list) -> dict:
    """{label: path}: the file's stem, or folder/stem where two heads share a stem (heads of two runs)."""
    stems = [Path(p).stem for p in paths]
    return {
        (f"{Path(p).parent.name}/{Path(p).stem}" if stems.count(Path(p).stem) > 1 else Path(p).stem): Path(p)
        for p in paths
    }


def log_settings(pair, task: str, set_name: str, settings: dict) -> dict:
    """What a decode log is of. The dtype joins it where it is not float32 (the logs predate the choice of
    dtype and were all fp32), so a bf16 run never reuses fp32 decodes, nor the other way round."""
    dtype = str(pair.target.dtype).removeprefix("torch.")
    logged = {"task": task, "set": set_name, **settings, "pair": pair_identity(pair)}
    return logged if dtype == "float32" else {**logged, "dtype": dtype}


def evaluate_heads(
    pair,
    task: str,
    head_specs: list[str],
    weights: list[float],
    limit: int | None,
    data=None,
    decoding: DecodeConfig = FRONTIER_DECODING,
    write_card: bool = False,
    command: str = "",
    progress=None,
    set_name: str | None = None,
    log_path: str | None = None,
    lams=(),
) -> tuple[dict, list[Point]]:
    """The static frontier, the per-token rule at each λ and each head (a name or path) on a held-out set
    of the task: (report, points).
    With write_card, each head's figures join its card (<head>.json beside its file) and its metadata.
    With log_path, every decode is logged there, and a rerun with the same settings resumes from it."""
    set_name = held_out_set(task, set_name)
    paths = head_labels([resolve_head_path(h) for h in head_specs])
    heads = {name: load_head(str(path), pair) for name, path in paths.items()}
    examples = held_out_examples(task, limit, data, set_name)
    settings = {name: getattr(decoding, name) for name in ("n_draft", "max_new_tokens", "temperature")}
    settings["held_out"] = HELD_OUT[task][set_name]
    log = None if log_path is None else DecodeLog(log_path, log_settings(pair, task, set_name, settings))
    points = sweep(pair, examples, task, weights, heads, progress, log, decoding, lams)
    static = [p for p in points if p.w is not None]
    report = {
        "task": task,
        "set": set_name,
        "examples": len(examples),
        "settings": settings,
        "points": [p.row() for p in points],
        "rules": {p.label: judged(static, p) for p in points if p.label.startswith("cost:")},
        "heads": {},
    }
    if log is not None:
        report["log"] = {"path": str(log.path), "decodes_reused": log.reused}
    by_label = {p.label: p for p in points}
    for name, head in heads.items():
        curve = {label: by_label[label] for label, _ in head_points(name, head, lams)}
        for label, how in head_points(name, head, lams):
            verdict = report["heads"][label.removeprefix("dynamic:")] = judged(static, by_label[label])
            lam = rule_lam(head, how)
            rule = by_label.get(f"cost:{lam:g}") if lam is not None else None
            if rule is not None:  # against the rule at its λ (a cost head's, or the λ a head was fitted at)
                verdict["versus_rule"] = versus_point(rule, by_label[label])
        if write_card:  # a CostHead's card holds its point at its default λ, else its curve's first
            label = f"dynamic:{name}@{COST_HEAD_LAM:g}"
            label = label if label in curve else next(iter(curve))
            point_name = label.removeprefix("dynamic:")
            write_evaluation(paths[name], head, report, point_name, curve[label], static, command)
    return report, points


def judged(static: list[Point], point: Point) -> dict:
    """A per-token verifier's point against the static frontier: in the task's quality (its margins and
    verdict), against exact decoding, and in fidelity (the target's log-probability of the text)."""
    verdict = {**frontier_margin(static, point), "versus_exact": versus_exact(static, point)}
    points = [*static, point]
    if all(len(p.fidelity) == len(p.quality) for p in points):  # decoded with fidelity kept
        on_fidelity = [replace(p, quality=p.fidelity) for p in points]
        verdict["fidelity"] = frontier_margin(on_fidelity[:-1], on_fidelity[-1])
        verdict["fidelity_versus_exact"] = versus_exact(on_fidelity[:-1], on_fidelity[-1])
    return verdict


def write_evaluation(
    path: Path, head, report: dict, name: str, point: Point, static: list, command: str
) -> None:
    """Add the head's figures from an evaluate_heads report to its card."""
    task, set_name, temperature = report["task"], report["set"], report["settings"]["temperature"]
    evaluation = {
        **report["heads"][name],
        "head_point": point.row(),
        "static_points": [p.row() for p in static],
        "examples": report["examples"],
        "settings": report["settings"],
        "command": command,
    }
    # The card draws the evaluation of the decoding the head was trained for (greedy or sampled) on the
    # task's default set.
    trained_greedy = trained_for_greedy(head.meta.get("training"))
    primary = (temperature == 0) == trained_greedy and set_name == next(iter(HELD_OUT[task]))
    write_head_card(path, head, evaluation, evaluation_key(set_name, temperature), primary)
