"""An EAGLE-3 draft's step (static_draft.py) compiled ahead of time by AOTInductor, as the target's pass is
(compiled_pass.py: built in the background, keyed, checked against the eager step, lent to one decode at a
time). `core.draft.FeatureDraft` drafts on it where the pair lends one (`ModelPair.draft_pass`)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from pathlib import Path

import torch

from ..common.files import cache_dir
from ..models.eagle import Eagle3Draft
from . import fused_attention
from .block_attention import feed_rows, padded_width
from .compiled_pass import (
    K_MAX,
    MAX_LEN,
    CompiledPass,
    compile_checked,
    load_checked,
    source_digests,
    tolerance,
)
from .int8_draft import products
from .static_draft import StaticDraftStep

# The files whose code (or build settings) the compiled step holds: a change to any builds a new package.
STEP_SOURCES = (
    "runtime/compiled_draft.py",
    "runtime/static_draft.py",
    "runtime/static_pass.py",
    "runtime/block_attention.py",
    "runtime/fused_attention.py",
    "runtime/fused_attention.cpp",
    "runtime/int8_draft.py",
    "runtime/amx_gguf.py",
    "runtime/amx_gguf.cpp",
    "runtime/vector_gguf.cpp",
    "runtime/vnni_gguf.cpp",
    "runtime/lean_layer.py",
    "runtime/compiled_pass.py",
    "models/eagle.py",
)


def draft_compilable(draft) -> bool:
    """Whether a draft's step compiles here: an EAGLE-3 draft in bf16 on the CPU, loaded from a folder."""
    return (
        isinstance(draft, Eagle3Draft)
        and draft.fc.weight.device.type == "cpu"
        and draft.fc.weight.dtype == torch.bfloat16
        and getattr(draft, "directory", None) is not None
    )


def fused_step(draft) -> bool:
    """Whether the draft's step attends on the fused kernel here (if it builds)."""
    attn = draft.layers[0].self_attn
    return fused_attention.serves(draft.fc.weight.dtype, attn.head_dim)


def draft_package_path(draft) -> Path:
    """What a package is valid for: the draft's config and weights, its products' kind, the step's code,
    PyTorch, the CPU's vector instructions and the thread count."""
    weights = hashlib.sha256()
    for name, tensor in sorted(draft.state_dict().items()):
        if not name.startswith("embed_tokens"):
            weights.update(name.encode() + tensor.detach().float().numpy().tobytes())
    identity = {
        "config": draft.config,
        "weights": weights.hexdigest(),
        "int8": products(draft),
        "max_len": MAX_LEN,
        "k_max": K_MAX,
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "fused_attention": fused_step(draft),  # which attention
        "source": source_digests(STEP_SOURCES),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_dir() / "compiled" / f"draft-step-{key}.pt2"


def build_draft_package(draft, path: Path, inductor_configs: dict | None = None, log=print) -> Path:
    """Export the draft's step for 1..K_MAX rows and any used length, and compile it (half a minute);
    built again without autotuning where the autotuned step does not draft what the eager one does."""
    module = StaticDraftStep(draft, MAX_LEN, fused_step(draft) and fused_attention.ensure())
    inputs = (torch.zeros(4, draft.hidden_size, dtype=torch.bfloat16),)
    check = functools.partial(attach_draft, draft, log=log)
    return compile_checked(module, inputs, path, inductor_configs, check, log)


def step_agrees_with_eager(draft, compiled: CompiledPass, sizes=(3, 1, 1, 1)) -> bool:
    """Whether the compiled step gives the eager step's logits, to bf16 rounding, after a check feed of
    twelve rows (run eagerly by both): on feeds of `sizes` rows after it, as drafting feeds it (a restart
    of several rows, one-row steps on the eager step's hidden state; each on its own static cache). Both
    get the same input each step: fed their own hidden states, the two would drift apart by roundings
    that compound over the steps, which is not what the check is for."""
    device = draft.fc.weight.device
    ends = list(itertools.accumulate((12, *sizes)))
    eager = StaticDraftStep(draft, padded_width(ends[-1]))
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(ends[-1], draft.hidden_size, generator=generator).to(device, draft.fc.weight.dtype)
    tokens = torch.randint(0, draft.vocab_size, (ends[-1],), generator=generator).to(device)
    hidden = None
    with torch.inference_mode():
        for start, end in zip([0, *ends[:-1]], ends):
            given = features[start:end] if hidden is None or end - start > 1 else hidden[-1:]
            hidden, logits_e = eager(tokens[start:end], *feed_rows(start, end, device), given)
            _, logits_c = compiled.forward(tokens[start:end], start, given)
            if (logits_c.float() - logits_e.float()).abs().max() > tolerance():
                return False
    return True


def attach_draft(draft, path: Path, log=print) -> CompiledPass | None:
    """The package loaded over the draft, for its decodes to run (`ModelPair.draft_pass`), if it agrees with
    the eager step; None (and drafting stays eager) if it cannot load or does not agree."""
    # The package calls the kernel where its build could load it (built in the build's process, found here)
    module = StaticDraftStep(draft, MAX_LEN, fused_step(draft) and fused_attention.ensure())
    return load_checked(module, path, lambda c: step_agrees_with_eager(draft, c), "draft step", log)
