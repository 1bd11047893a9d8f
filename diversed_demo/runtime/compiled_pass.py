"""The static pass (static_pass.py) compiled ahead of time by AOTInductor, built once per machine in the
background (compiled_build.py), and lent to one cached decode at a time.

Building takes about a minute (export, inductor's GEMM autotuning, then C++ compilation on one core), so
it never delays a start: the eager path serves until the pass is attached, once it agrees with the eager
pass on a check prompt. Autotuning lets inductor replace an ATen product by its own C++ GEMM template
where that is faster here: on an AMX Xeon, the LM head's (docs/measurements/speed.md). The templates are
generated for the app's thread count, so the build runs at that count too, and the package is keyed on
it. Later starts load it in a fraction of a second. The package's weights are the model's own tensors,
shared, not copied (its constants are "user managed"), and so is the static KV cache, which
`core.cache.CachedLM` fills from the prompt's cache and crops by setting its length. (Products that a
template replaces keep a packed copy of their weights inside the package.) On a CUDA GPU the same lending
serves the passes replayed as CUDA graphs (cuda_graphs.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
import warnings
from pathlib import Path

import torch

from ..common.files import cache_dir, discard_damaged
from . import amx_gguf, fused_attention
from .block_attention import BLOCK, MIN_BLOCKS, feed_rows, padded_mask
from .static_pass import K_MAX, StaticPass

MAX_LEN = 2048  # cache slots: prompt and answer together; longer decodes go on eager
SWITCH = "DIVERSED_COMPILED_PASS"


class CompiledPass:
    """A runner of a static module (the target's StaticPass or a draft's StaticDraftStep: its AOTInductor
    package, its CUDA graphs, or the eager module itself) with the module's static cache, held by one
    decode at a time."""

    def __init__(self, module: torch.nn.Module, runner=None):
        self.module, self.runner = module, runner or module
        self._lock, self._holder = threading.Lock(), None
        self.failure: Exception | None = None

    def acquire(self, holder: object) -> bool:
        """Lend the pass to `holder` if nobody holds it and it never failed (never waits)."""
        if self.failure is not None or not self._lock.acquire(blocking=False):
            return False
        self._holder = id(holder)
        return True

    def release(self, holder_id: int) -> None:
        if self._holder == holder_id:
            self._holder = None
            self._lock.release()

    def fail(self, error: Exception) -> None:
        """Its runner raised mid-decode (out of memory, a kernel's error): lend it no more, so later decodes
        run eagerly. The holder goes on eagerly from the static cache: a pass writes only the slots from
        `length` on, so the used ones are intact."""
        self.failure = error
        warnings.warn(
            f"a compiled pass failed ({error}); decoding goes on eagerly", RuntimeWarning, stacklevel=2
        )

    def fits(self, length: int, k: int) -> bool:
        return 1 <= k <= K_MAX and length + k < self.module.max_len

    def keep_slots(self, length: int, kept: torch.Tensor) -> None:
        """Move the entries at slots `kept` [m] (a draft tree's path, in order) to slots length, length + 1,
        …, so that the cache holds the kept path only, as a chain's would."""
        target = torch.arange(length, length + len(kept), device=kept.device)
        for keys, values in self._static_layers():
            keys.index_copy_(1, target, keys.index_select(1, kept))
            values.index_copy_(1, target, values.index_select(1, kept))

    def load(self, layers, length: int) -> None:
        """Copy a one-row KV cache ([(keys [1, H, T, D], values, …), …] per layer) into the static one."""
        for (keys, values, *_), static in zip(layers, self._static_layers(), strict=True):
            static[0][:, :length].copy_(keys[0, :, :length])
            static[1][:, :length].copy_(values[0, :, :length])

    def layers(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The static cache's first `length` slots as a one-row KV cache, to go on eagerly."""
        return [(k[None, :, :length].clone(), v[None, :, :length].clone()) for k, v in self._static_layers()]

    def _static_layers(self):
        return [tuple(self.module.buffers_of_layer(i)) for i in range(self.module.n_layers)]

    def forward(self, tokens: torch.Tensor, length: int, *inputs, rows=None):
        """Feed tokens [k] (and the module's further `inputs`) into the slots after `length` cached ones:
        the module's outputs (the target's: logits [k, V], last hidden [k, H], aux [k, ·]). A chain's rows
        by default; a draft tree's as `rows` = (positions [k], visible [k, length + k]: the slots each row
        sees). Feeds of more than K_MAX rows, outside the runner's range, run the module eagerly, on the
        same cache."""
        k = tokens.numel()
        if rows is None:
            positions, mask = feed_rows(length, length + k, tokens.device)
        else:
            positions, mask = rows[0], padded_mask(rows[1])
        runner = self.runner if k <= K_MAX else self.module  # the graph's range
        return tuple(runner(tokens.view(-1), positions, mask, *inputs))


# The files whose code (or build settings) a compiled package holds: a change to any builds a new one.
PASS_SOURCES = (
    "runtime/static_pass.py",
    "runtime/block_attention.py",
    "runtime/gguf_int4.py",
    "runtime/amx_gguf.py",
    "runtime/amx_gguf.cpp",
    "runtime/vector_gguf.cpp",
    "runtime/vnni_gguf.cpp",
    "runtime/fused_attention.py",
    "runtime/fused_attention.cpp",
    "runtime/lean_layer.py",
    "runtime/compiled_pass.py",
)


def source_digests(files) -> list[str]:
    """The sha256 of each of these files of the package (paths from its folder)."""
    package = Path(__file__).resolve().parents[1]
    return [hashlib.sha256((package / name).read_bytes()).hexdigest() for name in files]


def int4_operand_count(model) -> int:
    """How many operands the target's 4-bit products take: 1 on the project's kernel (AMX or AVX2), 2 on
    PyTorch's, 0 without."""
    return len(getattr(model.get_decoder().layers[0], "qkv", ()))


def package_key(model, aux_layer_ids) -> str:
    """What a package is valid for: the model's shapes and weights' source, the pass's code, PyTorch and
    the CPU's vector instructions."""
    identity = {
        "config": model.config.get_text_config().to_dict(),
        "weights": getattr(model, "name_or_path", None) or str(model.config._name_or_path),
        "dtype": str(next(model.parameters()).dtype),
        "aux": list(aux_layer_ids),
        "max_len": MAX_LEN,
        "k_max": K_MAX,
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),  # autotuned GEMM templates are generated for a thread count
        "int4_operands": int4_operand_count(model),  # which 4-bit kernel
        "fused_attention": fused_attention.serves_model(model),  # which attention
        "source": source_digests(PASS_SOURCES),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def package_path(model, aux_layer_ids) -> Path:
    return cache_dir() / "compiled" / f"static-pass-{package_key(model, aux_layer_ids)}.pt2"


TOLERANCE = 2.0  # |Δ logit| a compiled runner may differ from the eager module by (bf16 roundings fused away)
# Where the GGUF kernel multiplies a product's rows as 8-bit codes (AVX-512 VNNI, AVX2), a last bit rounded
# otherwise moves a code by one: the embedded target's one- and three-token passes then differ by up to 0.9
# and 2.4 (a wrong package: 30 and more).
CODES_TOLERANCE = 4.0


def tolerance() -> float:
    """|Δ logit| a compiled runner may differ from the eager module by on this CPU's kernel."""
    return CODES_TOLERANCE if amx_gguf.codes_rows() else TOLERANCE


# Inductor times its C++ GEMM templates against ATen's products and keeps the faster, per product.
AUTOTUNE = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def build_package(model, aux_layer_ids, path: Path, inductor_configs: dict | None = None, log=print) -> Path:
    """Export the static pass for 1..K_MAX new tokens and any used length, and compile it (a minute or
    two), with AUTOTUNE unless other inductor settings are given."""
    fused = fused_attention.serves_model(model) and fused_attention.ensure()
    module = StaticPass(model, aux_layer_ids, MAX_LEN, fused)
    check = functools.partial(attach, model, aux_layer_ids, log=log)
    return compile_checked(module, (), path, inductor_configs, check, log)


def compile_checked(module, inputs: tuple, path: Path, inductor_configs, check, log=print) -> Path:
    """compile_module, and where the autotuned package does not check out (`check(path)` gives None), the
    package built again without autotuning: on a busy host inductor's timings may pick a product whose code
    fails at some row counts (a draft step's, on the Xeon under a parallel test run), and every start would
    load that package and stay eager. The check runs in the build's process, at its low priority; the app
    repeats it when it attaches the package, as for any package it finds."""
    compile_module(module, inputs, path, inductor_configs)
    if inductor_configs is None and check(path) is None:
        log(f"building {path} again without autotuning")
        compile_module(module, inputs, path, {})
    return path


def compile_module(module, inputs: tuple, path: Path, inductor_configs: dict | None = None) -> Path:
    """Export a static module for 1..K_MAX new rows and any used length (its arguments: tokens, positions
    [k], mask [k, W] as feed_rows makes it, then `inputs` with k rows first, for four rows here) and
    compile it into `path`."""
    new = torch.export.Dim("new", min=1, max=K_MAX)
    width = BLOCK * torch.export.Dim("blocks", min=MIN_BLOCKS, max=MAX_LEN // BLOCK)
    # Example sizes like a verification's over a few hundred positions: inductor sizes its loops from
    # them (a tiny example left the attention's softmax on one thread).
    tokens, (positions, mask) = torch.tensor([1, 2, 3, 4]), feed_rows(252, 256)
    dynamic = ({0: new}, {0: new}, {0: new, 1: width}, *({0: new} for _ in inputs))
    with torch.no_grad():
        program = torch.export.export(module, (tokens, positions, mask, *inputs), dynamic_shapes=dynamic)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.tmp{os.getpid()}.pt2")  # the packager wants the suffix
    configs = AUTOTUNE if inductor_configs is None else inductor_configs
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=str(partial), inductor_configs=configs)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def load_runner(module, path: Path) -> CompiledPass:
    """A compiled package of `module`, run over the module's buffers (shared, not copied)."""
    runner = torch._inductor.aoti_load_package(str(path))
    with contextlib.suppress(OSError):
        os.utime(path)  # in use: pruning (compiled_build.prune) keeps it
    buffers = dict(module.named_buffers())
    names = runner.get_constant_fqns()
    runner.load_constants(
        {n: buffers[n] for n in names if n in buffers}, check_full_update=False, user_managed=True
    )
    return CompiledPass(module, runner)


def agrees_with_eager(model, compiled: CompiledPass, aux_layer_ids, sizes=(1, 3)) -> bool:
    """Whether the compiled pass gives the eager pass's logits, to bf16 rounding, on a check prompt and a
    pass of each of `sizes` tokens after it."""
    from ..core.cache import CachedLM

    vocab = model.config.get_text_config().vocab_size
    prompt = torch.arange(1, 33, device=model.device) % vocab
    eager = CachedLM(model, vocab, aux_layer_ids)
    with torch.inference_mode():
        eager.forward(prompt, keep=1)
        compiled.load(list(eager.cache), len(prompt))
        for feed in (prompt[:size] for size in sizes):
            length = eager.length
            reference, _, _ = eager.forward(feed, keep=len(feed))
            logits, _, _ = compiled.forward(feed, length)
            if (logits[:, :vocab].float() - reference.float()).abs().max() > tolerance():
                return False
    return True


def attach(model, aux_layer_ids, path: Path, log=print) -> CompiledPass | None:
    """The package loaded over the model, for its cached decodes to run (`ModelPair.target_pass`), if it
    agrees with the eager pass; None (and the eager pass goes on) if it cannot load or does not agree."""
    # The package calls the kernel where its build could load it (built in the build's process, found here)
    fused = fused_attention.serves_model(model) and fused_attention.ensure()
    module = StaticPass(model, aux_layer_ids, MAX_LEN, fused)
    return load_checked(module, path, lambda c: agrees_with_eager(model, c, aux_layer_ids), "pass", log)


def load_checked(module, path: Path, agrees, name: str, log=print) -> CompiledPass | None:
    """The package at `path` over `module`'s buffers if it loads and `agrees(compiled)`; otherwise None, and
    `log` says why: a broken, foreign or wrong package must not stop decoding, which goes on eagerly. One
    that does not load (cut short by a full disk, a copy or a crash) is removed, so that the next start
    builds it again."""
    try:
        compiled = load_runner(module, path)
    except Exception as err:
        then = "it stays eager and is built again at the next start"
        discard_damaged(path, f"compiled {name}", err, then, log)
        return None
    try:
        agreed = agrees(compiled)
    except Exception as err:
        log(f"the compiled {name} at {path} did not run ({err}); it stays eager")
        return None
    if not agreed:
        log(f"the compiled {name} at {path} disagrees with the eager one; it stays eager")
        return None
    return compiled
