"""Attention for a decode's few query rows in one C++ loop on AVX-512 with BF16 or on AVX2 with FMA
(fused_attention.cpp), for the target's static pass and the draft's step: a row's bits depend neither on the
rows beside it nor on masked slots between the slots it sees, so a verification (a chain's or a tree's) gives
each position a one-token pass's logits, and a one-token pass costs a seventh of `attend_in_blocks`'
(docs/measurements/speed.md).

Compiled into the user cache like the AMX kernel (runtime/native_build.py), for the best of the two
instruction sets the CPU has, and loaded as the PyTorch operator `diversed_attention::attend`. It serves
where the CPU has AVX-512 with BF16 (Intel Xeons since Cooper Lake, AMD since Zen 4) or AVX2 with FMA (x86
CPUs since 2013-2015), the pass runs in bf16 with heads of 32, 64 or 128, the build succeeds and it computes
right; elsewhere `attend_in_blocks` does. Which of the two a compiled pass runs is fixed when the pass is
built (`StaticPass.fused`) and is part of its package's key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from . import native_build
from .block_attention import attend_in_blocks, feed_rows, mask_bias, padded_mask

SOURCE = Path(__file__).with_suffix(".cpp")
SWITCH = "DIVERSED_FUSED_ATTENTION"  # "0": attention in blocks even where this kernel would serve
# The instruction sets the kernel is written for, the better first: the CPU flags each needs, g++'s flags
AVX512 = (
    {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
    ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"],
)
AVX2 = ({"avx2", "fma"}, ["-mavx2", "-mfma"])
HEAD_DIMS = (32, 64, 128)
WHAT = "fused attention kernel"


def flags() -> list[str] | None:
    """g++'s flags for this CPU's best instruction set the kernel has, or None where it has neither."""
    cpu = native_build.cpu_flags()
    chosen = next((extra for needs, extra in (AVX512, AVX2) if needs <= cpu), None)
    return None if chosen is None else [*native_build.BASE_FLAGS, *chosen]


def name() -> str:
    """The instruction set the kernel is built for here, in words."""
    return "AVX-512 BF16" if AVX512[0] <= native_build.cpu_flags() else "AVX2"


def serves(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether this machine and a pass of this dtype and head size take the kernel (if it builds)."""
    machine = sys.platform == "linux" and flags() is not None
    return machine and os.environ.get(SWITCH) != "0" and dtype == torch.bfloat16 and head_dim in HEAD_DIMS


def serves_model(model) -> bool:
    """`serves` for a model's own dtype and head size."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return serves(next(model.parameters()).dtype, head_dim)


def loaded() -> bool:
    try:
        return torch.ops.diversed_attention.attend is not None
    except (AttributeError, RuntimeError):
        return False


def library_path() -> Path:
    return native_build.library_path(SOURCE, flags() or [])


def load_if_built() -> None:
    """Load the kernel where an earlier build left it (a compiled pass built on it calls it)."""
    path = library_path()
    if not loaded() and path.exists():
        native_build.load_built(path, WHAT)
    if loaded():
        register_fake()


def ensure(background: bool = False) -> bool:
    """Load the kernel, compiling it first where it is not built (at the lowest priority with
    `background`); whether it is loaded and computes right."""
    load_if_built()
    if not loaded():
        try:
            native_build.compile_library(SOURCE, flags() or [], library_path(), background)
            torch.ops.load_library(str(library_path()))
            register_fake()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", "") or err
            print(f"the {WHAT} is not used ({str(detail).strip()[-300:]})", file=sys.stderr)
            return False
    return computes_right()


def register_fake() -> None:
    """Shapes for tracing (torch.export of the compiled pass); registering again replaces the same."""

    @torch.library.register_fake("diversed_attention::attend")
    def _(query, keys, values, mask):
        return query.new_empty(query.shape[0], query.shape[1] * query.shape[2])


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """query [k, n_q, D] bf16 over the slots of a cache (keys, values [n_kv, ≥ W, D] bf16) each row sees
    (mask [k, W]) -> [k, n_q·D] bf16."""
    return torch.ops.diversed_attention.attend(query, keys, values, mask)


def computes_right() -> bool:
    """Random rows against attention in blocks, to bf16 rounding: a chain's rows over a few hundred slots."""
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(3, 320, 64, generator=generator).bfloat16() for _ in range(2))
    query = torch.randn(4, 9, 64, generator=generator).bfloat16()
    _, mask = feed_rows(250, 254)
    expected = attend_in_blocks(query, keys, values, mask_bias(padded_mask(mask), 3)).float()
    try:
        return torch.allclose(attend(query, keys, values, mask).float(), expected, atol=2e-2, rtol=2e-2)
    except RuntimeError:
        return False
