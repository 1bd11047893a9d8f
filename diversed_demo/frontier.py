"""The speed–quality frontier: static w over a grid, and heads, decoded on a held-out set.

Every point decodes the same examples with the same seeds (common random numbers), so differences
between points are not sampling noise of the prompts. A head lies beyond the static frontier when, at
its acceptance, its quality beats the best static quality at that acceptance or more (or, at its quality,
its acceptance beats the best static acceptance at that quality or more). The margin's uncertainty comes
from a bootstrap over examples.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .decode import Counts, Row, check_context, decode_batch, encode_prompt
from .files import write_text
from .head import ConstantHead, load_head, pair_identity, resolve_head_path, save_head, trained_for_greedy
from .rewards import task_reward
from .tasks import MBPP_TEST_IDS, arithmetic_examples, data_file, load_gsm8k, load_mbpp, load_spec_bench

DEFAULT_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
# task -> {held-out set: what it is}; the first is the task's default. None of them is ever trained on.
HELD_OUT = {
    "summarization": {"spec_bench": "Spec-Bench summarization (CNN/DailyMail), first turns"},
    "general": {"spec_bench": "Spec-Bench first turns, every category (stratified)"},
    # Arithmetic first: the default, and the set a card's primary (drawn) evaluation uses, is the one on
    # which a 135M target scores clearly above zero; GSM8K is near its floor.
    "math": {"arithmetic": "scripted one- and two-step arithmetic (eval split)", "gsm8k": "GSM8K test",
             "spec_bench": "Spec-Bench math_reasoning, first turns"},
    "code": {"mbpp": "MBPP test (task ids 11-510), pass@1 in the sandbox"},
}


@dataclass
class Point:
    label: str  # "static:<w>" or "dynamic:<head>"
    w: float | None  # the static weight; None for a head
    counts: list[Counts] = field(default_factory=list)  # per example
    quality: list[float] = field(default_factory=list)
    mean_w: list[float] = field(default_factory=list)
    token_w: list[float] = field(default_factory=list)  # w_t at every position a draft token competed

    @property
    def total(self) -> Counts:
        return sum(self.counts, Counts())

    @property
    def acceptance(self) -> float:
        return self.total.acceptance_rate or 0.0

    @property
    def mean_quality(self) -> float:
        return float(np.mean(self.quality)) if self.quality else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.total.tokens_per_second

    def row(self) -> dict:
        return {"point": self.label, "w": self.w, "acceptance": self.acceptance, "quality": self.mean_quality,
                "tokens_per_second": self.tokens_per_second,
                "mean_w": float(np.mean(self.mean_w)) if self.mean_w else None,
                # a head that only learned a bias has std ≈ 0: the spread is what per-token w buys
                "w_std": float(np.std(self.token_w)) if self.token_w else None, "examples": len(self.quality)}


class DecodeLog:
    """Per-decode results of an evaluation as JSON lines, so that a run stopped at any point (a session's
    end, a kill) resumes without decoding again. The first line holds the settings: a log written under
    other settings is refused, never mixed in."""

    def __init__(self, path, settings: dict):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings))  # as it reads back from the file
        self.records, self.reused = {}, 0
        text = self.path.read_text() if self.path.exists() else ""
        if "\n" in text and not text.endswith("\n"):  # a line cut short by a kill: dropped, decoded again
            text = text[:text.rindex("\n") + 1]
            self.path.write_text(text)
        lines = text.splitlines()
        if not lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self._append({"settings": self.settings})
            return
        try:
            logged = json.loads(lines[0]).get("settings")
        except (json.JSONDecodeError, AttributeError):
            logged = None
        if logged != self.settings:
            raise ValueError(f"{self.path} is the log of another evaluation (settings {logged}); "
                             "name another log file or remove this one")
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                self.records[record["key"]] = record
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{self.path}, line {number}, is not a decode record: the log is damaged; "
                                 "remove that line (it is decoded again) or the file") from None

    def _append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def get(self, key: str) -> dict | None:
        record = self.records.get(key)
        self.reused += record is not None
        return record

    def put(self, key: str, record: dict) -> None:
        self.records[key] = {"key": key, **record}
        self._append(self.records[key])


def _weights_key(head) -> str:
    """Which weights a head has: a retrained head of the same name never reuses the old one's decodes."""
    if isinstance(head, ConstantHead):
        return f"constant {head.value!r}"
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        digest.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


MAX_BATCH_ROWS = 16  # decodes run together: enough to share each target pass, few enough for the caches


def decode_examples(pair, task: str, jobs: list[tuple], n_draft: int = 4, max_new_tokens: int = 64,
                    temperature: float = 1.0) -> list[dict]:
    """Decodes of held-out examples as one batch, each job (example, index, how) with seed = its index at
    a static w ({"w": w}) or with a head ({"head": head}): what a point keeps of each decode."""
    prompts = [encode_prompt(pair.tokenizer, example.prompt) for example, _, _ in jobs]
    for prompt_ids in prompts:
        check_context(pair, prompt_ids, max_new_tokens)
    rows = [Row(prompt_ids, index, "dynamic", head=how["head"]) if "head" in how else
            Row(prompt_ids, index, "static", how["w"]) for prompt_ids, (_, index, how) in zip(prompts, jobs)]
    records = []
    for prompt_ids, (example, _, how), tally in zip(prompts, jobs, decode_batch(pair, rows, n_draft, max_new_tokens,
                                                                               temperature)):
        summary = tally.summary
        quality = task_reward(task, example, summary.text, pair=pair, prompt_ids=prompt_ids,
                              output_ids=summary.token_ids or [pair.tokenizer.eos_token_id])
        records.append({"quality": quality, "counts": asdict(summary.counts), "mean_w": summary.mean_w,
                        "token_w": tally.token_w if "head" in how else []})
    return records


def sweep(pair, examples, task: str, weights=DEFAULT_WEIGHTS, heads: dict | None = None, progress=None,
          log: DecodeLog | None = None, **decode_kwargs) -> list[Point]:
    """Static points for each w, then one point per head ({name: head}), every one over the same examples.

    Decodes run in example order, up to MAX_BATCH_ROWS at a time as one batch, so that a run stopped early
    has every point on (nearly) the same examples; with a `log`, decodes it already holds are read back
    instead of run again."""
    points = [(Point(f"static:{w:g}", w), {"w": w}, f"static:{w:g}|") for w in weights]
    points += [(Point(f"dynamic:{name}", None), {"head": head}, f"dynamic:{name}|{_weights_key(head)}")
               for name, head in (heads or {}).items()]
    keys = [[f"{point_key}|{i}|{hashlib.sha256(example.prompt.encode()).hexdigest()[:12]}"
             for _, _, point_key in points] for i, example in enumerate(examples)]
    records = {key: log.get(key) if log is not None else None for row in keys for key in row}
    missing = [(key, (example, i, how)) for i, example in enumerate(examples)
               for key, (_, how, _) in zip(keys[i], points) if records[key] is None]
    if progress is not None:
        for i, row in enumerate(keys):
            for key, (point, _, _) in zip(row, points):
                if records[key] is not None:
                    progress(point.label, i + 1, len(examples))
    for first in range(0, len(missing), MAX_BATCH_ROWS):
        batch = missing[first:first + MAX_BATCH_ROWS]
        for (key, (_, i, _)), record in zip(batch, decode_examples(pair, task, [job for _, job in batch],
                                                                   **decode_kwargs)):
            records[key] = record
            if log is not None:
                log.put(key, record)
            if progress is not None:
                progress(key.split("|")[0], i + 1, len(examples))
    for row in keys:
        for key, (point, _, _) in zip(row, points):
            record = records[key]
            point.quality.append(record["quality"])
            point.counts.append(Counts(**record["counts"]))
            if record["mean_w"] is not None:
                point.mean_w.append(record["mean_w"])
            point.token_w.extend(record["token_w"])
    return [point for point, _, _ in points]


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None)


def versus_exact(static_points: list[Point], head_point: Point) -> dict | None:
    """The head's quality minus exact decoding's (the static point w = 1) on the same examples and seeds:
    the paired mean difference and its standard error; None where w = 1 was not decoded."""
    exact = next((p for p in static_points if p.w == 1.0), None)
    if exact is None:
        return None
    mean, se = mean_and_se([h - e for h, e in zip(head_point.quality, exact.quality)])
    return {"quality_difference": mean, "stderr": se, "examples": len(exact.quality),
            "acceptance": {"exact": exact.acceptance, "head": head_point.acceptance}}


def _best_where_at_least(curve, x0):
    """The largest y on the piecewise-linear curve [(x, y), …] over the places where x ≥ x0; None where x0
    lies outside the curve's range of x (no claim either way)."""
    xs = [x for x, _ in curve]
    if not curve or x0 < min(xs) or x0 > max(xs):
        return None
    best = max(y for x, y in curve if x >= x0)
    for (xa, ya), (xb, yb) in zip(curve, curve[1:]):
        if min(xa, xb) < x0 < max(xa, xb):  # the segment crosses x0: its point there counts too
            best = max(best, ya + (yb - ya) * (x0 - xa) / (xb - xa))
    return float(best)


def margins(static: list[tuple[float, float]], head: tuple[float, float]) -> dict:
    """Quality margin at the head's acceptance, acceptance margin at the head's quality.

    `static` holds (acceptance, quality) in w order, joined linearly (mixing two neighbouring w reaches
    the segment between them). The frontier is that curve's upper envelope: the head is compared with
    the best static quality at an acceptance at least its own, and the best static acceptance at a quality
    at least its own. Interpolating the curve itself would, where quality is flat or not monotone in w (a
    task at its floor), compare the head with a slow point of equal quality and call it beyond.
    """
    best_quality = _best_where_at_least(static, head[0])
    best_acceptance = _best_where_at_least([(q, a) for a, q in static], head[1])
    return {"quality_margin": None if best_quality is None else head[1] - best_quality,
            "acceptance_margin": None if best_acceptance is None else head[0] - best_acceptance}


def _resampled(point: Point, idx) -> tuple[float, float]:
    """(acceptance, quality) of a bootstrap sample of the point's examples."""
    acceptance = sum((point.counts[i] for i in idx), Counts()).acceptance_rate or 0.0
    return acceptance, float(np.asarray(point.quality)[idx].mean())


def frontier_margin(static_points: list[Point], head_point: Point, n_boot: int = 1000, seed: int = 0) -> dict:
    """The head's margins over the static frontier, with bootstrap standard errors and 95% intervals."""
    n = len(head_point.quality)
    static_points = sorted(static_points, key=lambda p: p.w)
    estimate = margins([(p.acceptance, p.mean_quality) for p in static_points],
                       (head_point.acceptance, head_point.mean_quality))
    rng = np.random.default_rng(seed)
    samples = {k: [] for k in estimate}
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        m = margins([_resampled(p, idx) for p in static_points], _resampled(head_point, idx))
        for k, v in m.items():
            if v is not None:
                samples[k].append(v)
    result = {}
    for k, value in estimate.items():
        s = np.asarray(samples[k])
        result[k] = {"estimate": value, "stderr": float(s.std()) if s.size else None,
                     "ci95": [float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))] if s.size else None,
                     "p_positive": float((s > 0).mean()) if s.size else None, "bootstrap_samples": int(s.size)}
    # Beyond the frontier only where a 95% interval excludes zero: a positive estimate alone is noise as often
    # as not on a dozen prompts.
    result["beyond_frontier"] = any(result[k]["ci95"] is not None and result[k]["ci95"][0] > 0
                                    for k in ("quality_margin", "acceptance_margin"))
    result["verdict"] = verdict(result, [p.mean_quality for p in static_points], n)
    return result


def verdict(margin: dict, static_qualities: list[float], examples: int) -> dict:
    """What a frontier margin says, as {"kind", "text"}: beyond, below, unresolved, or floor.

    Floor: the static curve's quality varies over w by less than two standard errors of the margin, so the
    set cannot tell any setting from another (a small target near zero on GSM8K or MBPP); no claim is made."""
    def figures(name):
        m = margin[name]
        return (f"{name.replace('_', ' ')} {m['estimate']:+.3f} ± {m['stderr']:.3f}, "
                f"95% CI [{m['ci95'][0]:+.3f}, {m['ci95'][1]:+.3f}], n = {examples}")
    quality = margin["quality_margin"]
    if margin["beyond_frontier"]:
        beyond = [k for k in ("quality_margin", "acceptance_margin")
                  if margin[k]["ci95"] is not None and margin[k]["ci95"][0] > 0]
        return {"kind": "beyond", "text": "beyond the static frontier: " + "; ".join(map(figures, beyond))}
    if quality["ci95"] is None:
        return {"kind": "unresolved", "text": "the head's acceptance lies outside the static curve's range: no claim"}
    spread = max(static_qualities) - min(static_qualities)
    if quality["ci95"][1] < 0:
        return {"kind": "below", "text": f"below the static frontier at the head's acceptance: {figures('quality_margin')}"}
    if spread < 2 * quality["stderr"]:
        return {"kind": "floor", "text": f"no claim: quality varies by {spread:.3f} over static w, less than two "
                                         f"standard errors of the margin (the set is at the target's floor); "
                                         f"{figures('quality_margin')}"}
    return {"kind": "unresolved", "text": f"on the static frontier within its 95% CI: {figures('quality_margin')}"}


def frontier_figure(points: list[Point], title: str = "Speed–quality frontier"):
    import plotly.graph_objects as go
    static = sorted((p for p in points if p.w is not None), key=lambda p: p.acceptance)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p.acceptance for p in static], y=[p.mean_quality for p in static],
                             mode="lines+markers+text", text=[f"w={p.w:g}" for p in static],
                             textposition="top center", name="static w"))
    for p in points:
        if p.w is None:
            fig.add_trace(go.Scatter(x=[p.acceptance], y=[p.mean_quality], mode="markers+text", text=[p.label],
                                     textposition="bottom center", marker={"size": 14, "symbol": "star"},
                                     name=p.label))
    fig.update_layout(title=title, xaxis_title="acceptance rate", yaxis_title="quality", template="plotly_white")
    return fig


def held_out_set(task: str, set_name: str | None = None) -> str:
    """The held-out set's name: `set_name` if the task has it, else the task's default."""
    if task not in HELD_OUT:
        raise ValueError(f"no held-out set for task {task!r}; choose one of {', '.join(HELD_OUT)}")
    if set_name is not None and set_name not in HELD_OUT[task]:
        raise ValueError(f"task {task} has no held-out set {set_name!r}; choose one of {', '.join(HELD_OUT[task])}")
    return set_name or next(iter(HELD_OUT[task]))


def held_out_examples(task: str, limit: int | None, data: str | None = None, set_name: str | None = None):
    """The first `limit` examples of the task's held-out set; `data` replaces the set's file (Spec-Bench's
    question.jsonl, GSM8K's test.jsonl or mbpp.jsonl)."""
    set_name = held_out_set(task, set_name)
    if set_name == "arithmetic":
        return arithmetic_examples("eval", limit)
    if set_name == "gsm8k":
        return load_gsm8k(data or data_file("gsm8k/test.jsonl"), limit)
    if set_name == "mbpp":
        return load_mbpp(data, limit, task_ids=MBPP_TEST_IDS)
    if task == "general":  # a stratified mix: the same number from every category
        by_category = {}
        for example in load_spec_bench(data, per_category=max(1, math.ceil((limit or 26) / 13))):
            by_category.setdefault(example.category, []).append(example)
        # Categories take turns, so that every prefix is stratified and a longer run extends a shorter one
        # (a resumed --log reuses its decodes).
        examples = [e for turn in itertools.zip_longest(*by_category.values()) for e in turn if e is not None]
        return examples[:limit] if limit else examples
    return load_spec_bench(data, categories=[{"summarization": "summarization", "math": "math_reasoning"}[task]])[:limit]


def head_labels(paths: list) -> dict:
    """{label: path}: the file's stem, or folder/stem where two heads share a stem (heads of two runs)."""
    stems = [Path(p).stem for p in paths]
    return {(f"{Path(p).parent.name}/{Path(p).stem}" if stems.count(Path(p).stem) > 1 else Path(p).stem): Path(p)
            for p in paths}


def evaluation_key(set_name: str, temperature: float) -> str:
    """How a card names one evaluation: "<held-out set>, T=1" or "<held-out set>, greedy"."""
    return f"{set_name}, " + ("greedy" if temperature == 0 else f"T={temperature:g}")


def write_head_card(path: Path, head, evaluation: dict, key: str, primary: bool) -> dict:
    """Add one evaluation to the head's card (<head>.json beside it) and to its metadata; returns the card.

    The card keeps every evaluation of this head under "evaluations" (one per held-out set and
    temperature); "frontier" is the primary one the app draws (evaluate_heads marks it: the task's default
    set at the kind of decoding the head was trained for), else the first written. A card written for
    another training run of the same file starts afresh."""
    card_path = path.with_suffix(".json")
    old = json.loads(card_path.read_text()) if card_path.exists() else {}
    same_run = old.get("training") == head.meta.get("training")
    evaluations = {**(old.get("evaluations") or {}), key: evaluation} if same_run else {key: evaluation}
    frontier = evaluation if primary or not (same_run and old.get("frontier")) else old["frontier"]
    card = {"head": path.stem, "task": head.meta.get("task"), "pair": head.meta.get("pair"),
            "training": head.meta.get("training"), "warm_start": head.meta.get("warm_start"),
            "train_figures": head.meta.get("train_figures"), "frontier": frontier, "evaluations": evaluations}
    write_text(card_path, json.dumps(card, indent=2) + "\n")
    head.meta["evaluation"], head.meta["evaluations"] = frontier, evaluations
    save_head(head, path)
    return card


def evaluate_heads(pair, task: str, head_specs: list[str], weights: list[float], limit: int | None, data=None,
                   n_draft: int = 4, max_new_tokens: int = 64, temperature: float = 1.0, write_card: bool = False,
                   command: str = "", progress=None, set_name: str | None = None,
                   log_path: str | None = None) -> tuple[dict, list[Point]]:
    """The static frontier and each head (a name or path) on a held-out set of the task: (report, points).
    With write_card, each head's figures join its card (<head>.json beside its file) and its metadata.
    With log_path, every decode is logged there, and a rerun with the same settings resumes from it."""
    set_name = held_out_set(task, set_name)
    paths = head_labels([resolve_head_path(h) for h in head_specs])
    heads = {name: load_head(str(path), pair) for name, path in paths.items()}
    examples = held_out_examples(task, limit, data, set_name)
    settings = {"n_draft": n_draft, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "held_out": HELD_OUT[task][set_name]}
    log = None if log_path is None else DecodeLog(log_path, {"task": task, "set": set_name, **settings,
                                                             "pair": pair_identity(pair)})
    points = sweep(pair, examples, task, weights, heads, progress=progress, log=log, n_draft=n_draft,
                   max_new_tokens=max_new_tokens, temperature=temperature)
    static = [p for p in points if p.w is not None]
    report = {"task": task, "set": set_name, "examples": len(examples), "settings": settings,
              "points": [p.row() for p in points], "heads": {}}
    if log is not None:
        report["log"] = {"path": str(log.path), "decodes_reused": log.reused}
    for name, head in heads.items():
        point = next(p for p in points if p.label == f"dynamic:{name}")
        report["heads"][name] = {**frontier_margin(static, point), "versus_exact": versus_exact(static, point)}
        if write_card:
            evaluation = {**report["heads"][name], "head_point": point.row(), "static_points": [p.row() for p in static],
                          "examples": len(examples), "settings": report["settings"], "command": command}
            # the evaluation of the kind of decoding the head was trained for (greedy or sampled), on the
            # task's default set
            primary = ((temperature == 0) == trained_for_greedy(head.meta.get("training"))
                       and set_name == next(iter(HELD_OUT[task])))
            write_head_card(paths[name], head, evaluation, evaluation_key(set_name, temperature), primary)
    return report, points
