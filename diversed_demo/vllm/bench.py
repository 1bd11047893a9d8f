"""The project's Spec-Bench measurement, run by vLLM offline (the `LLM` API) in place of this project's
decoder.

Two engines stay up side by side: the target alone (mode ar) and the target with its EAGLE-3 draft (exact,
every static w and the per-token rule at every λ: each is per request, so one engine serves them all).
For each first-turn question the modes run back to back in a rotating order, one prompt at a time, as
`diversed-demo bench` does; the report has the same `overall` figures per mode (tokens_per_second,
acceptance_rate, tau, speedup).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections import defaultdict

from ..common.formatting import fmt
from ..core.prompt import encode_prompt
from ..core.stats import Counts
from ..eval.bench_report import identical_to_target_only
from .engine import engine_kwargs, spec_counters
from .rule import LAMBDA_KEY, WEIGHT_KEY


def check_modes(modes: dict) -> None:
    """vLLM runs ar, exact, static:<w> and cost:<λ> (eval.bench.parse_modes's spec); a dynamic head needs a
    vLLM hook that does not exist yet (docs/vllm.md)."""
    for name, config in modes.items():
        if config.mode == "dynamic":
            raise ValueError(
                f"mode {name!r}: vLLM cannot run a dynamic head yet (see docs/vllm.md); use static:<w> or "
                "cost:<λ>"
            )


def sampling_params(config, max_new_tokens: int, temperature: float, seed: int):
    """vLLM's SamplingParams for one mode (a DecodeConfig): static modes carry their w per request, the
    per-token rule its λ, as a client would."""
    from vllm import SamplingParams

    extra = (
        {WEIGHT_KEY: config.ensemble_weight}
        if config.mode == "static"
        else {LAMBDA_KEY: config.lam}
        if config.mode == "cost"
        else None
    )
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
    outputs, names = defaultdict(list), list(modes)
    warm_up(engines, tokenizer)
    for i, example in enumerate(examples):
        prompt_ids = encode_prompt(tokenizer, example.prompt)
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate: no mode always runs first
            llm = engines["ar" if modes[name].mode == "ar" else "sd"]
            params = sampling_params(modes[name], max_new_tokens, temperature, seed + i)
            ids, spent = decode(llm, prompt_ids, params)
            outputs[name].append(ids)
            for where in (example.category, "overall"):
                counts[where][name] += spent
    result = {
        "overall": mode_rows(counts.pop("overall")),
        "per_category": {category: mode_rows(by_mode) for category, by_mode in counts.items()},
    }
    if temperature == 0 and "ar" in outputs:
        result["greedy_identical_to_target_only"] = identical_to_target_only(outputs)
        result["greedy_exact_identical_to_target"] = result["greedy_identical_to_target_only"].get("exact")
    return result


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
    engines["sd"] = LLM(**engine_kwargs(target, draft, n_draft, seed=seed, **engine))
    tokenizer = engines["sd"].get_tokenizer()
    figures = run_vllm_bench(engines, tokenizer, examples, modes, max_new_tokens, temperature, seed)
    settings["load_average_at_end"] = os.getloadavg()
    return {"settings": settings, **figures}


def markdown_table(report: dict) -> str:
    """The overall figures per mode, and the settings that produced them, as Markdown."""
    s = report["settings"]
    lines = [
        f"vLLM ({s['engine']}) on {s['examples']} Spec-Bench first turns, {s['max_new_tokens']} new tokens, "
        f"T = {s['temperature']}, N = {s['n_draft']}, {s.get('drafting', 'greedy')} drafting, {s['dtype']}, "
        f"{s['device']} "
        f"({s['cpu']}, {s['threads']} threads; load average {s['load_average_at_start'][0]:.2f} at start, "
        f"{s['load_average_at_end'][0]:.2f} at end)",
        "",
        "| mode | tokens/s | speedup | acceptance | τ |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["overall"].items():
        lines.append(
            f"| {name} | {fmt(row['tokens_per_second'], '.1f')} | {fmt(row['speedup'], '.2f')}× | "
            f"{fmt(row['acceptance_rate'])} | {fmt(row['tau'], '.2f')} |"
        )
    if report.get("greedy_exact_identical_to_target") is not None:
        share = report["greedy_exact_identical_to_target"]
        lines += ["", f"Greedy exact SD text identical to vLLM's target-only text: {share:.0%} of prompts."]
    lines += ["", f"Command: `{s['command']}`"]
    return "\n".join(lines)
