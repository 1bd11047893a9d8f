"""llama.cpp as the CPU peer: its target-only decoding of the same GGUF on the same prompts, timed in the
bench's run. Optional: llama-cpp-python compiles llama.cpp when installed (minutes), so it is not a
dependency; `pip install llama-cpp-python` adds it."""

from __future__ import annotations

import functools
import time
from pathlib import Path


class LlamaCppMissing(RuntimeError):
    """The comparison was asked for where it cannot run."""


@functools.lru_cache(maxsize=1)
def load_llama_cpp(gguf_path: str, threads: int, context: int = 4096):
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise LlamaCppMissing(
            "--vs-llama-cpp needs llama-cpp-python (pip install llama-cpp-python; it compiles llama.cpp)"
        ) from err
    return Llama(gguf_path, n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)


def llama_cpp_generate(
    gguf_path: Path, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int], threads: int
) -> tuple[list[int], float]:
    """llama.cpp's greedy decode of the prompt's token ids (its prompt pass included, as in ours) up to
    max_new_tokens or a stop token: (token ids, seconds)."""
    llm = load_llama_cpp(str(gguf_path), threads)
    llm.reset()  # no prefix reuse from the previous question
    out = []
    start = time.perf_counter()
    for token in llm.generate(prompt_ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if token in stop_ids or len(out) >= max_new_tokens:
            break
    return out, time.perf_counter() - start
