"""The project's Spec-Bench measurement, run by vLLM offline (the `LLM` API) in place of this project's
decoder.

Two engines stay up side by side: the target alone (mode ar) and the target with its EAGLE-3 draft (exact,
every static w, the per-token rule at every λ and every head: each is per request, so one engine serves
them all, its heads named at start). For each first-turn question the modes run back to back in a rotating
order, one prompt at a time, as `diversed-demo bench` does; the report has the same `overall` figures per
mode (tokens_per_second, acceptance_rate, tau, speedup, fidelity and per-example fidelity_scores: the
target's mean log-probability of the text, scored by the target engine after the timed runs), and for
heads the share of decoding time the heads' work took (`head_step_share`, from the workers' clock).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from ..common.formatting import fmt
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from ..eval.bench_report import identical_to_target_only
from ..models.heads import head_kind
from .engine import engine_kwargs, spec_counters
from .rule import HEAD_KEY, HEADS_KEY, LAMBDA_KEY, WEIGHT_KEY


def check_modes(modes: dict, drafting: str = "probabilistic") -> None:
    """vLLM runs every mode of eval.bench.parse_modes's spec (ar, exact, static:<w>, cost:<λ>,
    dynamic:<head>[@<λ>]) but prompt lookup, which it does not have; a head needs probabilistic drafting."""
    for name, config in modes.items():
        if config.mode == "dynamic" and drafting != "probabilistic":
            raise ValueError(
                f"mode {name!r}: a head reads the draft's q, which needs --drafting probabilistic"
            )


def served_heads(modes: dict) -> dict[str, str]:
    """{name: file} of the heads the dynamic modes name, for the engine's additional_config."""
    return {head_name(config): str(config.head) for config in modes.values() if config.mode == "dynamic"}


def head_name(config) -> str:
    """The name a request gives its head: the file's stem (parse_modes resolved names to files)."""
    return Path(config.head).stem


def sampling_params(config, max_new_tokens: int, temperature: float, seed: int):
    """vLLM's SamplingParams for one mode (a DecodeConfig): static modes carry their w per request, the
    per-token rule its λ, a head its name (and a cost head the mode's λ), as a client would."""
    from vllm import SamplingParams

    extra = None
    if config.mode == "static":
        extra = {WEIGHT_KEY: config.ensemble_weight}
    elif config.mode == "cost":
        extra = {LAMBDA_KEY: config.lam}
    elif config.mode == "dynamic":
        extra = {HEAD_KEY: head_name(config)}
        if head_kind(config.head) == "cost":
            extra[LAMBDA_KEY] = config.lam
    return SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed, extra_args=extra)


def decode(llm, prompt_ids: list[int], params) -> tuple[list[int], Counts]:
    """One prompt through one engine: its new token ids and counts. A target pass emits the prefill's token
    or verifies one block of drafts, so passes = 1 + drafting rounds (and = tokens without a draft)."""
    from vllm.inputs import TokensPrompt

    before = spec_counters(llm)
    start = time.perf_counter()
    output = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], params, use_tqdm=False)[0]
    seconds = time.perf_counter() - start
    spent = {name: value - before[name] for name, value in spec_counters(llm).items()}
    ids = list(output.outputs[0].token_ids)
    drafted = int(spent["num_draft_tokens"])
    return ids, Counts(
        new_tokens=len(ids),
        target_passes=1 + int(spent["num_drafts"]) if drafted else len(ids),
        drafted=drafted,
        accepted=int(spent["num_accepted_tokens"]),
        wall_time_s=seconds,
    )


def mode_rows(counts: dict) -> dict:
    """{mode: the bench's figures} from {mode: Counts}; speedup is over ar's tokens per second."""
    ar_speed = counts["ar"].tokens_per_second
    return {
        name: {
            "tokens_per_second": c.tokens_per_second,
            "acceptance_rate": c.acceptance_rate,
            "tau": c.tau,
            "speedup": c.tokens_per_second / ar_speed if ar_speed else None,
            "new_tokens": c.new_tokens,
            "target_passes": c.target_passes,
            "drafted": c.drafted,
            "accepted": c.accepted,
            "wall_time_s": c.wall_time_s,
        }
        for name, c in counts.items()
    }


def warm_up(engines: dict, tokenizer) -> None:
    """One short decode per engine, so first-call set-up is not timed."""
    from vllm import SamplingParams

    ids = encode_prompt(tokenizer, "Say hello.")
    for llm in engines.values():
        llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)


def run_vllm_bench(engines: dict, tokenizer, examples, modes: dict, max_new_tokens: int, temperature, seed):
    """Every mode on every question through `engines` ({"ar": LLM, "sd": LLM}): the report's figures."""
    counts = defaultdict(lambda: defaultdict(Counts))  # category (and "overall") -> mode -> Counts
    outputs, prompts, names = defaultdict(list), [], list(modes)
    head_seconds = defaultdict(lambda: defaultdict(float))  # mode -> part -> seconds
    warm_up(engines, tokenizer)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(tokenizer, example.prompt)
        prompts.append(prompt_ids)
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate: no mode always runs first
            llm = engines["ar" if modes[name].mode == "ar" else "sd"]
            params = sampling_params(modes[name], max_new_tokens, temperature, seed + i)
            heads = modes[name].mode == "dynamic"
            if heads:
                head_clock(llm)  # reset: what the clock holds now is another mode's
            ids, spent = decode(llm, prompt_ids, params)
            if heads:
                for part, seconds in head_clock(llm).items():
                    head_seconds[name][part] += seconds
            outputs[name].append(ids)
            for where in (example.category, "overall"):
                counts[where][name] += spent
    overall = mode_rows(counts.pop("overall"))
    for name, row in overall.items():
        row["fidelity_scores"] = fidelity_scores(engines["ar"], prompts, outputs[name])
        row["fidelity"] = sum(row["fidelity_scores"]) / len(row["fidelity_scores"])
        if name in head_seconds:
            row["head_seconds"] = dict(head_seconds[name])
            row["head_step_share"] = sum(head_seconds[name].values()) / row["wall_time_s"]
    result = {
        "overall": overall,
        "per_category": {category: mode_rows(by_mode) for category, by_mode in counts.items()},
    }
    if temperature == 0 and "ar" in outputs:
        result["greedy_identical_to_target_only"] = identical_to_target_only(outputs)
        result["greedy_exact_identical_to_target"] = result["greedy_identical_to_target_only"].get("exact")
    return result


def head_clock(llm) -> dict[str, float]:
    """Seconds the engine's workers spent on heads since the last read, by part (the busiest worker's)."""
    return max(llm.collective_rpc("diversed_head_clock"), key=lambda parts: sum(parts.values()))


def fidelity_scores(llm, prompts: list[list[int]], outputs: list[list[int]]) -> list[float]:
    """The target's mean log-probability (T = 1) of each output given its prompt, as eval.rewards.fidelity
    gives it, from the target engine's prompt log-probabilities over prompt + output."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    scored = [(p, o) for p, o in zip(prompts, outputs) if o]
    results = llm.generate([TokensPrompt(prompt_token_ids=p + o) for p, o in scored], params, use_tqdm=False)
    scores = []
    for (prompt, output), result in zip(scored, results):
        chosen = [result.prompt_logprobs[len(prompt) + k][token].logprob for k, token in enumerate(output)]
        scores.append(sum(chosen) / len(chosen))
    return scores


def cpu_model() -> str:
    """The CPU's model name as lscpu reports it (the bench's figures depend on it)."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")


def machine_settings(dtype: str) -> dict:
    """Where the figures were measured, for a reader and for a rerun: CPU, threads, load, OpenMP."""
    import torch
    import vllm

    return {
        "engine": f"vllm {vllm.__version__}",
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "threads": int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0))),
        "dtype": dtype,
        "load_average_at_start": os.getloadavg(),
        "intel_openmp_preloaded": "libiomp" in os.environ.get("LD_PRELOAD", ""),
        "command": " ".join([os.path.basename(sys.executable), "-m", "diversed_demo.vllm", *sys.argv[1:]]),
    }


def run(
    target, draft, examples, modes: dict, n_draft=4, max_new_tokens=64, temperature=0.0, seed=0, **engine
):
    """Start both engines, bench, and return the whole report (settings, overall, per_category, ...)."""
    from vllm import LLM

    dtype = engine.get("dtype", "float32")
    settings = {
        "examples": len(examples),
        "modes": list(modes),
        "n_draft": n_draft,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "seed": seed,
        "target": str(target),
        "draft": str(draft),
        "drafting": engine.get("drafting", "greedy"),
        **machine_settings(dtype),
    }
    engines = {"ar": LLM(**engine_kwargs(target, None, seed=seed, **engine))}  # drafting: unused alone
    heads = served_heads(modes)
    additional_config = {HEADS_KEY: heads} if heads else {}
    engines["sd"] = LLM(
        **engine_kwargs(target, draft, n_draft, seed=seed, **engine), additional_config=additional_config
    )
    tokenizer = engines["sd"].get_tokenizer()
    figures = run_vllm_bench(engines, tokenizer, examples, modes, max_new_tokens, temperature, seed)
    settings["load_average_at_end"] = os.getloadavg()
    return {"settings": settings, **figures}


def markdown_table(report: dict) -> str:
    """The overall figures per mode, the settings that produced them, and where the report has one, the
    project's decoder beside them, as Markdown."""
    s = report["settings"]
    lines = [
        f"vLLM ({s['engine']}) on {s['examples']} Spec-Bench first turns, {s['max_new_tokens']} new tokens, "
        f"T = {s['temperature']}, N = {s['n_draft']}, {s.get('drafting', 'greedy')} drafting, {s['dtype']}, "
        f"{s['device']} "
        f"({s['cpu']}, {s['threads']} threads; load average {s['load_average_at_start'][0]:.2f} at start, "
        f"{s['load_average_at_end'][0]:.2f} at end)",
        "",
        "| mode | tokens/s | speedup | acceptance | τ | fidelity | heads' share of decoding time |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in report["overall"].items():
        lines.append(
            f"| {name} | {fmt(row['tokens_per_second'], '.1f')} | {fmt(row['speedup'], '.2f')}× | "
            f"{fmt(row['acceptance_rate'])} | {fmt(row['tau'], '.2f')} | {fmt(row.get('fidelity'), '.2f')} | "
            f"{fmt(row.get('head_step_share'), '.2%')} |"
        )
    if report.get("greedy_exact_identical_to_target") is not None:
        share = report["greedy_exact_identical_to_target"]
        lines += ["", f"Greedy exact SD text identical to vLLM's target-only text: {share:.0%} of prompts."]
    if report.get("beside"):
        lines += ["", *beside_table(report["beside"])]
    lines += ["", f"Command: `{s['command']}`"]
    return "\n".join(lines)


def beside(report: dict, decoder_report: dict, source: str) -> dict:
    """{mode: vLLM's and this project's figures} for the modes both reports ran, from a `diversed-demo bench
    --json` report of the same prompts and settings (its /no-lookup modes stand for vLLM's, which has no
    prompt lookup). A ValueError says which setting differs."""
    check_beside(report["settings"], decoder_report, source)
    decoder_rows = {name.removesuffix("/no-lookup"): row for name, row in decoder_report["overall"].items()}
    rows = {}
    for name, row in report["overall"].items():
        if name in decoder_rows:
            mine = decoder_rows[name]
            rows[name] = {
                "vllm": {key: row.get(key) for key in ("acceptance_rate", "tau", "fidelity")},
                "decoder": {key: mine.get(key) for key in ("acceptance_rate", "tau", "fidelity", "quality")},
            }
    return {"source": source, "modes": rows}


def check_beside(settings: dict, decoder_report: dict, source: str) -> None:
    """A ValueError unless the decoder's report ran the same number of prompts, length and temperature."""
    theirs = decoder_report.get("settings", {}) if isinstance(decoder_report, dict) else {}
    for key in ("examples", "max_new_tokens", "temperature"):
        if settings[key] != theirs.get(key):
            raise ValueError(
                f"--beside {source}: its {key} is {theirs.get(key)!r}, this run's {settings[key]!r}"
            )


def beside_table(side_by_side: dict) -> list[str]:
    lines = [
        f"Beside this project's decoder on the same prompts ({side_by_side['source']}):",
        "",
        "| mode | acceptance: vLLM | ours | difference | τ: vLLM | ours | fidelity: vLLM | ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, both in side_by_side["modes"].items():
        v, d = both["vllm"], both["decoder"]
        gap = (
            None
            if v["acceptance_rate"] is None or d["acceptance_rate"] is None
            else v["acceptance_rate"] - d["acceptance_rate"]
        )
        lines.append(
            f"| {name} | {fmt(v['acceptance_rate'])} | {fmt(d['acceptance_rate'])} | {fmt(gap, '+.3f')} | "
            f"{fmt(v['tau'], '.2f')} | {fmt(d['tau'], '.2f')} | {fmt(v['fidelity'], '.2f')} | "
            f"{fmt(d['fidelity'], '.2f')} |"
        )
    return lines
