"""Which dtype a pair runs fastest in on this CPU, by measurement: each candidate's pass costs are timed and
priced by the analytic bound at the measured acceptance, and the fastest in tokens per second wins.

Which dtype wins depends on the CPU (bf16 halves the bytes a token streams, but only some CPUs have the
instructions that make bf16 arithmetic fast), so it is measured, never assumed. A server's first start
takes bf16 untimed where the project's kernels run the pair in bf16 (`bf16_kernels`); its next start times
every candidate, on the kernels built since (a first start would time the eager passes before them), and
keeps whichever is faster. A timing that another process shared the cores with is used for that
start only, never kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from ..common.files import cache_dir, discard_damaged, write_text
from ..common.paths import PROMPTS_DIR
from ..common.threads import THREADS
from ..core.config import DecodeConfig
from ..core.prompt import encode_prompt
from ..models.loading import gguf_file
from . import amx_gguf
from .costs import calibration_alpha, measure_costs
from .theory import analytic_speedup, fastest_n_draft

CANDIDATES = ("bfloat16", "float32")  # the first also measures the acceptance α: it decodes faster
# Passes timed per size and dtype: enough for a choice between dtypes that differ by tens of percent, and
# few, since a first start waits for them.
TIMING_CALLS = 4
CHOICES_ENV = (
    "DIVERSED_DTYPE_CHOICES"  # where the choices are kept, else dtype-choices.json in the user cache
)


def bf16_instructions() -> bool | None:
    """Whether the CPU has the bf16 arithmetic oneDNN uses (None where this build cannot tell)."""
    try:  # a private operator: absent from some builds
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return None


def bf16_kernels(target: str) -> bool:
    """Whether the project's kernels run a pair with this target in bf16 here: the CPU has bf16 arithmetic,
    or the GGUF kernel serves the CPU and the target is a GGUF (the kernel multiplies bf16 rows by the
    GGUF's blocks; on Zen 3, without bf16 instructions, the bound gave bf16 1.4-2.4x float32's tokens/s)."""
    return bool(bf16_instructions()) or gguf_kernel_serves(target)


def gguf_kernel_serves(target: str) -> bool:
    """Whether the target is a GGUF and this CPU has an instruction set the GGUF kernel is built for."""
    return amx_gguf.instruction_set() is not None and gguf_file(target) is not None


def cpu_capability() -> str:
    """The vector instructions PyTorch's CPU kernels use here (e.g. AVX512, AVX2), and whether the CPU
    has bf16 arithmetic."""
    capability, bf16 = torch.backends.cpu.get_cpu_capability(), bf16_instructions()
    if bf16 is None:
        return f"{capability} (bf16 support unknown)"
    return f"{capability}{' with bf16' if bf16 else ', no bf16 instructions'}"


def dtype_figures(pair, prompt_ids: list[int], alpha: float, n_drafts=range(1, 7)) -> dict:
    """One dtype's measured costs and the tokens per second the analytic bound gives them at α."""
    costs = measure_costs(pair, prompt_ids, list(n_drafts), rounds=1, calls=TIMING_CALLS, draft_tokens=16)
    r = costs["r"]
    n_draft = fastest_n_draft(alpha, costs["c"], costs["v"], r)
    bound = analytic_speedup(alpha, n_draft, costs["c"], costs["v"][n_draft], r)
    return {
        "target_ms": costs["target_ms"],
        "c": costs["c"],
        "r": r,
        "v": costs["v"],
        "n_draft": n_draft,
        "bound": bound,
        "tokens_per_second": 1e3 * bound / costs["target_ms"],
    }


def choose_dtype(load: Callable[[str], object], prompt_ids: list[int], alpha: float, candidates=CANDIDATES):
    """(the pair in the fastest dtype, the choice with every candidate's figures). `load(dtype)` returns
    the pair in that dtype."""
    figures = {d: dtype_figures(load(d), prompt_ids, alpha) for d in candidates}
    best = max(figures, key=lambda dtype: figures[dtype]["tokens_per_second"])
    choice = {"dtype": best, "alpha": alpha, "cpu": cpu_capability(), "figures": figures}
    return load(best), choice


def choice_note(choice: dict) -> str:
    """One line on the choice: which dtype, and by how much it beat the others here."""
    figures, best = choice["figures"], choice["dtype"]
    if choice.get("untimed"):  # a server's first start: nothing timed yet
        untimed = " and ".join(choice["untimed"])
        where = f"({choice['cpu']}; {untimed} timed at the next start)"
        return f"{best}: taken at once, the project's kernels here being bf16's {where}"
    others = [f"{dtype} {figures[dtype]['tokens_per_second']:.0f}" for dtype in figures if dtype != best]
    cached = ", measured at an earlier start" if choice.get("cached") else ""
    cached += (
        "; another process shared the cores: timed again at the next start" if choice.get("shared") else ""
    )
    return (
        f"{best}: the fastest here ({choice['cpu']}; the bound at α = {choice['alpha']:.2f} gives "
        f"{figures[best]['tokens_per_second']:.0f} tokens/s, {', '.join(others)}{cached})"
    )


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it ("AMD EPYC", "Intel(R) Xeon(R) …")."""
    return next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")),
        "unknown CPU",
    )


def choice_key(target: str, draft: str | None) -> str:
    """What a cached choice holds for: this CPU, this PyTorch, these threads, this pair."""
    machine = [cpu_name(), cpu_capability(), torch.__version__, torch.get_num_threads()]
    return json.dumps([*machine, target, draft])


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def choices_path() -> Path:
    """The file of measured choices, one per CPU, PyTorch, thread count and pair."""
    return Path(os.environ.get(CHOICES_ENV) or cache_dir() / "dtype-choices.json")


def cached_choices() -> dict:
    """The measured choices kept so far; a damaged file is removed (and measured again) with one line."""
    path = choices_path()
    try:
        choices = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        discard_damaged(path, "dtype choices", err, "measuring again")
        return {}
    if not isinstance(choices, dict):
        discard_damaged(path, "dtype choices", "not a JSON object", "measuring again")
        return {}
    return choices


def calibration_prompt() -> str:
    """What the dtype is timed on: the first of the project's general prompts (assets/prompts)."""
    with open(PROMPTS_DIR / "general.jsonl") as lines:
        return json.loads(lines.readline())["prompt"]


def measured_dtype(load: Callable[[str], object], target: str, draft: str | None, serve_first=False):
    """(the pair in the dtype measured fastest here, the choice), once per machine and pair: the choice is
    kept in the user cache. `load(dtype)` returns the pair in that dtype, each dtype loaded once.
    `serve_first` (a server's first start): where the project's kernels run the pair in bf16
    (`bf16_kernels`), bf16 is taken untimed and every candidate is timed at the next start, which completes
    the choice (a first start's timing, of the eager passes before the kernels are built, cost 2.4 s of a
    20.7 s page on Zen 4 and 20 s of a 38 s page on Zen 3, and was timed again at the next start anyway)."""
    loaded = {}

    def load_once(name):  # the dtype not chosen is let go with this function
        if name not in loaded:
            loaded[name] = load(name)
        return loaded[name]

    key, choices = choice_key(target, draft), cached_choices()
    kept = choices.get(key) if isinstance(choices.get(key), dict) else {}
    if kept.get("dtype") in CANDIDATES and not kept.get("untimed"):
        return load_once(kept["dtype"]), {**kept, "cached": True}
    if not kept and serve_first and bf16_kernels(target):
        choice = {"dtype": CANDIDATES[0], "alpha": None, "cpu": cpu_capability(), "figures": {}}
        choice["untimed"] = list(CANDIDATES)
        write_text(choices_path(), json.dumps({**choices, key: choice}, indent=1) + "\n")
        return load_once(CANDIDATES[0]), choice
    prompt = calibration_prompt()
    if kept.get("untimed") and isinstance(kept.get("alpha"), (int, float)):  # a first start's choice: its α
        alpha = kept["alpha"]
    else:
        exact = DecodeConfig(mode="exact", max_new_tokens=32, temperature=0.0)
        alpha = calibration_alpha(load_once(CANDIDATES[0]), exact, [prompt])
    timing_prompt = encode_prompt(load_once(CANDIDATES[0]).tokenizer, prompt)
    for dtype in CANDIDATES:  # loaded before the timing: a load's waits on the disk are not a busy core
        load_once(dtype)
    with THREADS.judged() as timing:
        pair, choice = choose_dtype(load_once, timing_prompt, alpha)
    if timing.shared:  # timed beside another process's busy core: for this start only
        return pair, {**choice, "shared": True}
    write_text(choices_path(), json.dumps({**choices, key: choice}, indent=1) + "\n")
    return pair, choice
