"""A greedy head's w_t in one native call (greedy_head.cpp): the rule's terms from p and q and the head's MLP,
for an EnsembleHead that reads them (core/head.py), in place of about 26 small PyTorch operations, each
slowed by the caches the target's pass leaves cold (docs/measurements/speed.md, "Where a step's time goes").

Portable C++ (no instruction set assumed), compiled into the user cache like the other kernels
(runtime/native_build.py) and loaded as the operator `diversed_head::greedy_weights`. With the compiled
passes, the runtime builds it aside and hands it to the pair between decodes as `pair.head_kernel`
(`plan.attach_head_kernel`); until then, with the passes off, and where it does not build or compute
right, the head's own operations serve. Its w_t agree with theirs to float rounding (a sum's order
differs), so a greedy decode may part from theirs only at a near-tie of ν.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from ..core.config import DecodeConfig
from ..core.head import EnsembleHead, weight_rule
from . import native_build

SOURCE = Path(__file__).with_suffix(".cpp")
SWITCH = "DIVERSED_HEAD_KERNEL"  # "0": a head's own PyTorch operations even where the kernel is built
FLAGS = native_build.BASE_FLAGS
WHAT = "greedy head kernel"


def loaded() -> bool:
    try:
        return torch.ops.diversed_head.greedy_weights is not None
    except (AttributeError, RuntimeError):
        return False


def library_path() -> Path:
    return native_build.library_path(SOURCE, FLAGS)


def wanted() -> bool:
    return sys.platform == "linux" and os.environ.get(SWITCH) != "0"


def built() -> bool:
    return library_path().exists()


def build(background: bool = False) -> bool:
    """Compile the kernel into the user cache where it is not there (at the lowest priority with
    `background`); whether it is there. No torch work: any thread may run it."""
    try:
        native_build.compile_library(SOURCE, FLAGS, library_path(), background)
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        print(f"the {WHAT} is not used ({str(detail).strip()[-300:]})", file=sys.stderr)
        return False
    return True


def ensure() -> bool:
    """Load the kernel, compiling it first where it is not built; whether it serves."""
    if not wanted():
        return False
    if not loaded():
        if not built() and not build():
            return False
        native_build.load_built(library_path(), WHAT)
    return loaded() and computes_right()


def takes(head) -> bool:
    """Whether the kernel computes this head's w_t: an EnsembleHead reading the p/q terms through one
    hidden layer of exact GELU, its weights float32 on the CPU."""
    if not isinstance(head, EnsembleHead) or not head.reads_pq or len(head.mlp) != 3:
        return False
    first, gelu, last = head.mlp
    weights = (first.weight, first.bias, last.weight, last.bias)
    return (
        isinstance(gelu, nn.GELU)
        and gelu.approximate == "none"
        and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in weights)
    )


def greedy_weights(head: EnsembleHead, p, q, target_hidden, draft_hidden) -> torch.Tensor:
    """w_t [n] of a head that `takes`, from p, q [n, V] (float32) and the hidden states [n, Ht], [n, Hd]."""
    first, _, last = head.mlp
    return torch.ops.diversed_head.greedy_weights(
        p,
        q,
        target_hidden,
        draft_hidden,
        first.weight,
        first.bias,
        last.weight[0],
        float(last.bias),
        float(head.config["w_min"]),
        head.norm.eps,
    )


def reference_weights(head: EnsembleHead, p, q, target_hidden, draft_hidden) -> torch.Tensor:
    """The same w_t by the head's own operations: the decoder's greedy weight rule without a kernel."""
    weigh = weight_rule(DecodeConfig(mode="dynamic", head=head), greedy=True)
    return weigh(p, q, None, target_hidden, draft_hidden)


def computes_right() -> bool:
    """A random head on random rows against its own operations, to float rounding: over a vocabulary
    shorter than a block and one of two blocks and a tail, with the maximum tied across blocks (the first
    index wins, as with torch.max; the check fails if w_t does not see it) and in the tail."""
    generator = torch.Generator().manual_seed(0)
    head = EnsembleHead(24, 16, hidden_size=8, w_min=0.1, pq_features=True)
    with torch.no_grad():  # a logit of about unit scale, so that a wrong term moves w_t
        for layer in (head.mlp[0], head.mlp[2]):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) / layer.in_features**0.5)
        head.mlp[0].weight[:, -2] *= 30  # TV's column
    hidden = [torch.randn(5, width, generator=generator).bfloat16() for width in (24, 16)]
    for vocab in (300, 2100):
        p, q = (torch.softmax(3 * torch.randn(5, vocab, generator=generator), -1) for _ in range(2))
        second = vocab * 5 // 7  # in the second block of 2100
        p[0, 7] = p[0, second] = q[0, second] = 1.0  # a tie; the draft takes the second
        p[1, vocab - 1] = 1.0
        try:
            with torch.inference_mode():
                fused = greedy_weights(head, p, q, *hidden)
                expected = reference_weights(head, p, q, *hidden)
        except RuntimeError:
            return False
        if not torch.allclose(fused, expected, atol=1e-5, rtol=1e-4):
            return False
    return True


class Kernel:
    """What the runtime hands a pair (`pair.head_kernel`): `takes(head)` and `greedy_weights(head, p, q,
    target_hidden, draft_hidden)`, this module's."""

    takes = staticmethod(takes)
    greedy_weights = staticmethod(greedy_weights)
