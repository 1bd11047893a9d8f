"""Probe: what a target pass of the embedded model's shape costs on a GPU, eager and as a CUDA graph.

The embedded target's architecture (SmolLM2-135M: 30 layers, hidden 576) with random bf16 weights, which
time like the real ones; no weights or packages beyond torch and transformers travel. For k new tokens
over a 200-token context: wall time of transformers' eager pass with a dynamic and a static cache, the
GPU's own time of the eager pass (CUDA events), and a CUDA graph of the static-cache pass replayed (its
logits checked against the eager pass). Run on a lent GPU: `python3 docs/measurements/probes/cuda_pass.py`.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

CONFIG = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=8192,
    tie_word_embeddings=True, rope_theta=100000.0,
)  # fmt: skip
CONTEXT, REPEATS, SIZES = 200, 50, (1, 2, 3, 4, 6, 8)


def cache_kw(model) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def where(model, positions) -> dict:
    """cache_position where this transformers takes it (later versions place by the cache's own count)."""
    takes = "cache_position" in inspect.signature(model.model.forward).parameters
    return {"cache_position": positions} if takes else {}


def rewind(cache) -> None:
    """A static cache's count back to the context, in place (so that a CUDA graph replays it too)."""
    for layer in getattr(cache, "layers", ()):
        count = getattr(layer, "cumulative_length", None)
        if isinstance(count, torch.Tensor):
            count.fill_(CONTEXT)


def wall_ms(fn, repeats: int = REPEATS) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / repeats * 1e3


def gpu_ms(fn, repeats: int = REPEATS) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        total += start.elapsed_time(end)
    return total / repeats


def main() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to("cuda", torch.bfloat16).eval().requires_grad_(False)
    kw = cache_kw(model)
    prompt = torch.randint(0, CONFIG["vocab_size"], (1, CONTEXT), device="cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cache keyword", kw)

    dynamic = DynamicCache(config=model.config)
    model(prompt, **{kw: dynamic})
    static = StaticCache(config=model.config, max_cache_len=CONTEXT + 16)
    start = torch.arange(CONTEXT, device="cuda")
    model(prompt, **{kw: static}, position_ids=start[None], **where(model, start))

    print("k | eager dynamic ms | eager static ms | GPU time of eager ms | CUDA graph ms | graph = eager")
    for k in SIZES:
        print(
            k,
            *(f"{x:.2f}" if isinstance(x, float) else x for x in measure(model, kw, dynamic, static, k)),
            sep=" | ",
        )


def measure(model, kw, dynamic, static, k: int) -> list:
    tokens = torch.randint(0, CONFIG["vocab_size"], (1, k), device="cuda")
    positions = torch.arange(CONTEXT, CONTEXT + k, device="cuda")

    def eager_dynamic():
        model(tokens, **{kw: dynamic})
        dynamic.crop(-k)

    def eager_static():
        rewind(static)
        return model(tokens, **{kw: static}, position_ids=positions[None], **where(model, positions)).logits

    row = [wall_ms(eager_dynamic), wall_ms(eager_static), gpu_ms(eager_static)]
    try:
        reference = eager_static().clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager_static()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = eager_static()
        graph.replay()
        torch.cuda.synchronize()
        return row + [wall_ms(graph.replay), torch.equal(logits, reference)]
    except Exception as err:  # report and go on: the eager figures stand alone
        return row + [f"failed: {type(err).__name__}: {str(err)[:200]}", "-"]


if __name__ == "__main__":
    main()
