"""Spec-Bench measurement: every mode's speed and quality on one pair, in one process, modes interleaved.

For each first-turn question the modes run back to back in a rotating order, so machine drift hits them
alike. bench_report.py turns what is measured here into speedups, analytic bounds and the goals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..common.threads import THREADS
from ..common.timing import device_clock
from ..core.config import MAX_N_DRAFT, DecodeConfig
from ..core.decode import decode_rows
from ..core.draft import is_feature_draft
from ..core.generate import generate
from ..core.head import COST_HEAD_LAM, CostHead
from ..core.prompt import encode_prompt, eos_ids
from ..core.stats import Counts
from ..models.heads import head_kind, load_head, resolve_head_path
from ..runtime.costs import measure_costs, memory_limit
from ..runtime.dtype_choice import cpu_name
from .bench_report import batch_report, report
from .hf_baseline import hf_generate, transformers_kwargs
from .llama_cpp_baseline import llama_cpp_generate
from .rewards import fidelity, quality
from .tasks import REFERENCE_TASKS

DEFAULT_MODES = "ar,exact,static:0.5,dynamic:general"
BENCH_DECODING = DecodeConfig(max_new_tokens=128, temperature=0.0)  # Spec-Bench's setting: greedy


def parse_modes(spec: str, pair=None, base: DecodeConfig = BENCH_DECODING) -> dict[str, DecodeConfig]:
    """'ar,exact,static:0.5,dynamic:general,dynamic:general-cost@8' -> {name: `base` (the run's length,
    temperature and seed) in that mode}. Without a pair it only checks the spec (weights in [0, 1], heads
    that exist), which needs no model, and leaves each head as its path. Options after a / (several
    allowed): no-lookup drafts without prompt lookup (core/lookup.py), to measure what it adds; tree drafts
    trees sized step by step, tree=W,E,D,N trees of that shape (core/draft_tree.py), chain chains; without
    either, what the runtime chose for this machine (`pair.runtime.drafts`); n=N drafts N tokens a step
    whatever the run's --n-draft, so a fixed N and the length chosen step by step meet in one run."""
    modes = {}
    for name in mode_names(spec):
        spec_mode, *options = name.split("/")
        kind, _, arg = spec_mode.partition(":")
        if options and kind == "ar":
            raise ValueError(f"mode {name!r}: target-only decoding drafts nothing, so takes no options")
        if kind in ("ar", "exact") and not arg:
            modes[name] = base.replace(mode=kind)
        elif kind == "static" and arg:
            try:
                w = float(arg)
            except ValueError:
                raise ValueError(f"mode {name!r}: the weight must be a number") from None
            if not 0 <= w <= 1:
                raise ValueError(f"mode {name!r}: the weight must be in [0, 1]")
            modes[name] = base.replace(mode="static", ensemble_weight=w)
        elif kind == "cost" and arg:
            try:
                lam = float(arg)
            except ValueError:
                raise ValueError(f"mode {name!r}: λ must be a number") from None
            modes[name] = base.replace(mode="cost", lam=lam)
        elif kind == "dynamic" and arg:
            modes[name] = head_mode(name, arg, pair, base)
        else:
            raise ValueError(
                f"unknown mode {name!r}: use ar, exact, static:<w>, cost:<λ> or dynamic:<head>[@<λ>]"
            )
        modes[name] = with_options(name, modes[name], options)
    if "ar" not in modes:
        raise ValueError("the modes must include ar: speedups are measured against it")
    return modes


def mode_names(spec: str) -> list[str]:
    """The names of a --modes spec: comma-separated, or by ; where a tree's shape holds commas."""
    return [name.strip() for name in spec.split(";" if ";" in spec else ",") if name.strip()]


def with_options(name: str, config: DecodeConfig, options: list[str]) -> DecodeConfig:
    """A mode's config with its options after / (parse_modes), prompt lookup on where it drafts."""
    changes = {"prompt_lookup": config.mode != "ar"}
    for option in options:
        kind, equals, value = option.partition("=")
        if option == "no-lookup":
            changes["prompt_lookup"] = False
        elif kind == "tree":
            changes["tree"] = value if equals else "on"
        elif option == "chain":
            changes["tree"] = "off"
        elif kind == "n" and equals:
            changes["n_draft"] = own_length(name)
        else:
            options = "no-lookup, chain, tree, tree=W,E,D,N or n=N"
            raise ValueError(f"mode {name!r}: an option after / is {options}")
    try:
        return config.replace(**changes)
    except ValueError as error:
        raise ValueError(f"mode {name!r}: {error}") from None


def own_length(name: str) -> int | None:
    """The draft length a mode's name fixes with its n=N option (parse_modes), else None."""
    for option in name.split("/")[1:]:
        kind, _, value = option.partition("=")
        if kind == "n":
            if not value.isdigit() or not 1 <= int(value) <= MAX_N_DRAFT:
                raise ValueError(f"mode {name!r}: n=N takes a draft length from 1 to {MAX_N_DRAFT}")
            return int(value)
    return None


def head_mode(name: str, arg: str, pair, base: DecodeConfig) -> DecodeConfig:
    """'general' or 'general-cost@8' -> `base` with that head: a cost head at the λ after @, or at its
    default (COST_HEAD_LAM, as the app and frontier run it); only a cost head takes a λ."""
    head_name, at, lam_text = arg.partition("@")
    head = load_head(head_name, pair) if pair is not None else resolve_head_path(head_name)
    is_cost = isinstance(head, CostHead) if pair is not None else head_kind(head) == "cost"
    if at and not is_cost:
        raise ValueError(f"mode {name!r}: only a cost head takes a λ after @")
    try:
        lam = float(lam_text) if at else COST_HEAD_LAM if is_cost else base.lam
    except ValueError:
        lam = math.nan
    if not 0 <= lam < math.inf:
        raise ValueError(f"mode {name!r}: λ must be a number ≥ 0")
    return base.replace(mode="dynamic", head=head, lam=lam)


def machine_settings(pair) -> dict:
    """The pair and the machine a report was measured on."""
    device = pair.target.device
    return {
        "threads": THREADS.full or torch.get_num_threads(),  # the pair's, not a lowered count's
        "target": pair.target_name,
        "draft": pair.draft_name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "dtype": str(pair.target.dtype).removeprefix("torch."),
        "dtype_choice": pair.dtype_choice,
    }


@dataclass
class BenchRuns:
    """What the bench measured, summed over questions per category (and "overall") and mode."""

    counts: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(Counts)))
    # category -> mode -> sums of events_s, fidelity, examples, quality and quality_examples
    totals: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(float))))
    # category -> mode -> quality per question, in order (the goals pair them across modes)
    scores: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    # category -> mode -> fidelity per question, in order: pairs any two modes on any task
    fidelities: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    theirs: dict = field(default_factory=lambda: defaultdict(Counts))  # mode -> transformers' runs
    ours: dict = field(default_factory=lambda: defaultdict(Counts))  # mode -> ours, where compared
    greedy_identical: dict = field(default_factory=lambda: defaultdict(list))
    llama_cpp: Counts = field(default_factory=Counts)  # llama.cpp's target-only runs, where timed
    llama_cpp_identical: list = field(default_factory=list)  # its greedy text equals our target-only's
    outputs: dict = field(default_factory=lambda: defaultdict(list))  # mode -> token ids per question

    def add(self, category: str, name: str, counts: Counts, figures: dict) -> None:
        if "quality" in figures:
            self.scores[category][name].append(figures["quality"])
        for where in (category, "overall"):
            self.fidelities[where][name].append(figures["fidelity"])
            self.counts[where][name] += counts
            for key, value in figures.items():
                self.totals[where][name][key] += value

    def add_transformers(self, name: str, their_ids: list[int], seconds: float, summary) -> None:
        self.theirs[name] += Counts(new_tokens=len(their_ids), wall_time_s=seconds)
        self.ours[name] += summary.counts
        self.greedy_identical[name].append(their_ids[: len(summary.token_ids)] == summary.token_ids)

    def add_llama_cpp(self, their_ids: list[int], seconds: float, summary) -> None:
        self.llama_cpp += Counts(new_tokens=len(their_ids), wall_time_s=seconds)
        self.llama_cpp_identical.append(their_ids[: len(summary.token_ids)] == summary.token_ids)


def draft_lengths(pair, examples, modes: dict, n_draft, candidates) -> tuple[dict, dict]:
    """({mode: N, or "auto" for a length chosen step by step}, with 0 for ar; the measured costs c, r and
    v[N] over the candidates, which the report's analytic bound reads, and with "auto" the pair's costs of
    whole steps, which the draft length weighs, where it has them)."""
    if n_draft != "auto" and not (isinstance(n_draft, int) and n_draft >= 1):
        raise ValueError(f"n_draft must be a positive integer or 'auto', not {n_draft!r}")
    timing_prompt = encode_prompt(pair.tokenizer, examples[0].prompt)
    n_of = {name: 0 if config.mode == "ar" else own_length(name) or n_draft for name, config in modes.items()}
    fixed = {n for n in n_of.values() if n != "auto" and n}
    if "auto" not in n_of.values():
        return n_of, measure_costs(pair, timing_prompt, sorted(fixed))
    costs = measure_costs(pair, timing_prompt, sorted(fixed | set(candidates)))
    weighed = (getattr(pair, "costs", None) or {}).get("steps")
    return n_of, costs | ({"steps": weighed} if weighed else {})  # what the decodes' lengths weigh


def shared_run(modes: dict[str, DecodeConfig]) -> tuple[int, float, int]:
    """(max_new_tokens, temperature, seed): what every mode of one bench shares."""
    runs = {(c.max_new_tokens, c.temperature, c.seed, c.top_p) for c in modes.values()}
    if len(runs) != 1:
        raise ValueError("the modes of one bench share their length, temperature, top_p and seed")
    return next(iter(runs))[:3]


def comparable_with_transformers(pair, modes: dict) -> dict[str, bool]:
    """Modes transformers' generate can run too; it has no EAGLE path, so with a feature draft only ar."""
    return {
        name: transformers_kwargs(config) is not None
        and (config.mode == "ar" or not is_feature_draft(pair.draft))
        for name, config in modes.items()
    }


def decode_question(pair, example, prompt_ids, config: DecodeConfig):
    """One mode's decode of one question: its summary and the figures the bench sums."""
    summary, _ = generate(pair, prompt_ids, config)
    output_ids = summary.token_ids or [pair.tokenizer.eos_token_id]
    scores = quality(example.task, example, summary.text) if example.task in REFERENCE_TASKS else {}
    figures = {
        "events_s": summary.events_s,
        "prompt_s": summary.prompt_s,
        "draft_s": summary.draft_s,
        "pass_s": summary.pass_s,
        "decide_s": summary.decide_s,
        "fidelity": fidelity(pair, prompt_ids, output_ids),
        "examples": 1,
    }
    if scores:
        figures["quality"] = scores.get("rouge2", scores.get("exact_match"))
        figures["quality_examples"] = 1
    return summary, figures


def run_bench(
    pair,
    examples,
    modes: dict[str, DecodeConfig],
    n_draft: int | str = 4,
    vs_transformers: bool = False,
    progress=None,
    candidates=range(1, 7),
    vs_llama_cpp: Path | None = None,
) -> dict:
    """Every mode (parse_modes': their length, temperature and seed shared) on every question, the i-th
    at seed + i: the report (`bench_report.report`) of what was measured.

    n_draft: one draft length for every mode, or "auto" to choose it step by step (core/draft_length.py).
    vs_llama_cpp: the target's GGUF, to time llama.cpp's target-only decoding of it after ours."""
    max_new_tokens, temperature, seed = shared_run(modes)
    n_of, costs = draft_lengths(pair, examples, modes, n_draft, candidates)
    comparable = comparable_with_transformers(pair, modes)
    runs, names, fewer_s = BenchRuns(), list(modes), THREADS.fewer_s
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate: no mode always runs first
            config = modes[name].replace(n_draft=n_of[name] or 1, seed=seed + i)
            summary, figures = decode_question(pair, example, prompt_ids, config)
            runs.add(example.category, name, summary.counts, figures)
            runs.outputs[name].append(summary.token_ids)
            if vs_transformers and comparable[name] and temperature == 0:
                their_ids, seconds = hf_generate(pair, prompt_ids, config)
                runs.add_transformers(name, their_ids, seconds, summary)
            if vs_llama_cpp is not None and config.mode == "ar" and temperature == 0:
                their_ids, seconds = llama_cpp_generate(
                    vs_llama_cpp, prompt_ids, max_new_tokens, eos_ids(pair), torch.get_num_threads()
                )
                runs.add_llama_cpp(their_ids, seconds, summary)
            if progress is not None:
                progress()
    settings = {
        "examples": len(examples),
        "n_draft": {k: v for k, v in n_of.items() if v},
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "seed": seed,
        **machine_settings(pair),
        "fewer_threads_s": THREADS.fewer_s - fewer_s,  # decoding beside another process's busy core
    }
    return report(settings, costs, runs, n_of, memory_limit(pair.target))


def decode_rows_timed(pair, prompt_ids, seeds, config: DecodeConfig, together: bool):
    """([token ids] per seed, seconds): the seeds' decodes of one prompt as one batch or one after another,
    both on the bare loop (no events)."""
    ids = defaultdict(list)
    configs = [config.replace(seed=seed) for seed in seeds]
    clock = device_clock(pair.target.device)
    start = clock()
    if together:
        for r, step in decode_rows(pair, [prompt_ids] * len(seeds), configs, clock):
            ids[r] += step.new_ids
    else:
        for r, row_config in enumerate(configs):
            for _, step in decode_rows(pair, [prompt_ids], [row_config], clock):
                ids[r] += step.new_ids
    seconds = clock() - start
    return [ids[r] for r in range(len(seeds))], seconds


@torch.inference_mode()
def run_batch_bench(
    pair,
    examples,
    modes: dict,
    rows: int,
    n_draft: int = 4,
    progress=None,
) -> dict:
    """Throughput of `rows` decodes of each question as one batch (how head training decodes a prompt's
    rollouts) against the same decodes one after another, per mode, in one process; which goes first
    alternates between questions."""
    if not (isinstance(rows, int) and rows >= 2):
        raise ValueError(f"the batch needs at least 2 rows, not {rows!r}")
    max_new_tokens, temperature, seed = shared_run(modes)
    settings = {"n_draft": n_draft, "max_new_tokens": max_new_tokens, "temperature": temperature}
    modes = {name: config.replace(n_draft=n_draft) for name, config in modes.items()}
    counts = {True: defaultdict(Counts), False: defaultdict(Counts)}  # together -> mode -> runs
    identical = defaultdict(list)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(pair.tokenizer, example.prompt)
        seeds = [seed + i * rows + r for r in range(rows)]
        for name, config in modes.items():
            outputs = {}
            for together in (False, True) if i % 2 == 0 else (True, False):
                outputs[together], seconds = decode_rows_timed(pair, prompt_ids, seeds, config, together)
                tokens = sum(len(ids) for ids in outputs[together])
                counts[together][name] += Counts(new_tokens=tokens, wall_time_s=seconds)
            identical[name] += [a == b for a, b in zip(outputs[False], outputs[True])]
            if progress is not None:
                progress()
    settings = {"examples": len(examples), "rows": rows, **settings, "seed": seed, **machine_settings(pair)}
    return batch_report(settings, list(modes), counts[False], counts[True], identical)
