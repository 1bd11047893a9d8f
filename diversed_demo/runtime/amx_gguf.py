"""Products on a GGUF's quantised weights in the project's own kernel: the 4-bit projections, where a pass
over several tokens converts each block once (PyTorch's int4 kernel pays again for every 4 rows) and a
prompt's pass runs faster than on the dense weights, and the 8-bit (Q8_0) LM head, which streams half the
bytes of its dense bf16 copy (docs/measurements/speed.md).

Three instruction sets, one operator (`diversed::amx_mm`): Intel AMX (amx_gguf.cpp: tile products of the
exact bf16 weights, Sapphire Rapids and later Xeons, where Linux lends the process its tiles), AVX-512 VNNI
(vnni_gguf.cpp: integer dot products of the GGUF's codes and the rows' blocks as 8-bit codes, as llama.cpp
multiplies them, AMD Zen 4 and later; its records laid out for it: `VNNI_LAYOUT`) and, elsewhere on x86,
AVX2 (vector_gguf.cpp: integer products of the GGUF's codes and the rows' 8-bit codes too, as llama.cpp
multiplies them there, on the VNNI kernel's records). The
kernel is C++ compiled here once per machine and PyTorch into the user cache (g++, 10-20 s: at a first
start in the background, before the compiled pass is built, while decodes run on PyTorch's kernel;
runtime/compiled_build.py) and loaded as a PyTorch operator, so the compiled pass can call it too. It serves
where the build succeeds, it computes right and its product is the faster here; everywhere else PyTorch's
int4 kernel and the dense LM head do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from . import native_build
from .native_build import cpu_flags

SWITCH = "DIVERSED_AMX"  # "0": PyTorch's int4 kernel even where this one would serve; "1": this one untimed
# The kernel's instruction sets, the better first: the CPU flags each needs, its source, g++'s flags
CPU_FLAGS = {"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw", "avx512vl", "f16c"}
AMX_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mf16c", "-mamx-tile", "-mamx-bf16"]
AMX = (CPU_FLAGS, Path(__file__).with_suffix(".cpp"), AMX_FLAGS)
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "f16c"}
VNNI = (
    VNNI_FLAGS,
    Path(__file__).with_name("vnni_gguf.cpp"),
    ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512bf16", "-mf16c"],
)
AVX2_FLAGS = {"avx2", "fma", "f16c"}
AVX2 = (AVX2_FLAGS, Path(__file__).with_name("vector_gguf.cpp"), ["-mavx2", "-mfma", "-mf16c"])
KERNELS = (("AMX", AMX), ("AVX-512 VNNI", VNNI), ("AVX2", AVX2))  # the better first
VNNI_LAYOUT = "AVX-512 VNNI"  # the kernel whose records hold a block's codes by groups of 4 inputs
# The kernels that multiply the blocks by the rows as 8-bit codes, on the VNNI kernel's records (AMX
# multiplies the dense model's bf16 weights by the bf16 rows)
CODED_ROWS = (VNNI_LAYOUT, "AVX2")
# Every kernel here takes any number of rows, prompts too: each is the faster than the dense bf16 weight at
# every length (AVX-512 VNNI against oneDNN's dense product on Zen 4: 0.4-0.9 of its time from 16 to 512
# rows; docs/measurements/speed.md), and a verification gives each row a one-token pass's sums.
# bytes a block of 16 rows × 32 inputs takes: 4-bit, 256 of codes, 16 fp16 scales and 16 fp16 minima;
# 8-bit, 512 of codes and 16 fp16 scales
Q4_RECORD, Q8_RECORD = 320, 544


def instruction_set() -> tuple[str, Path, list[str]] | None:
    """(its name, its source, g++'s flags) of the best instruction set this CPU gives the kernel, or None."""
    cpu = cpu_flags()
    for name, (needs, source, flags) in KERNELS:
        if needs <= cpu:
            return name, source, [*native_build.BASE_FLAGS, *flags]
    return None


def library_path() -> Path:
    _, source, flags = instruction_set() or ("", AVX2[1], [])
    return native_build.library_path(source, flags)


def build(path: Path, background: bool = False) -> None:
    _, source, flags = instruction_set()
    native_build.compile_library(source, flags, path, background)


class AmxKernel:
    """Whether one pair's 4-bit products run on this kernel, decided by the runtime as it plans the pair
    (`plan.load_pair`) and recorded in `pair.runtime.amx`; one pair never mixes the two kernels' operands.
    Not yet built at a first start, it is `pending` until `upgrade` builds it (the background thread,
    between the pair's load and its compiled pass), so a lock keeps two threads from deciding at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.decision: bool | None = None
        self.pending = False  # decided against only because it was not built yet
        self.faster: bool | None = None  # than PyTorch's int4 kernel: timed once (`gguf_int4.int4_kernel`)

    def __getstate__(self) -> dict:  # a copied pair (a test's deepcopy) copies the decision, not the lock
        return {key: value for key, value in vars(self).items() if key != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())

    def available(self, wait: bool = False) -> bool:
        """Whether the kernel serves: the CPU has it, it is not switched off, it is built, loads and
        computes a check product right. Not yet built, it is built now with `wait`; else it is `pending`."""
        with self.lock:
            if self.decision is None:
                self.decision = self.decide(wait)
            return self.decision

    def decide(self, wait: bool) -> bool:
        if os.environ.get(SWITCH) == "0" or instruction_set() is None or sys.platform != "linux":
            return False
        path = library_path()
        try:
            if not loaded() and path.exists():
                load_built(path)
            if not loaded() and not wait:
                self.pending = True
                return False
            if not loaded():
                build(path)
                torch.ops.load_library(str(path))
            register_fake()
            return computes_right()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
            say_why(err)
            return False

    def upgrade(self) -> bool:
        """Build the pending kernel at low priority (background work, about 10 s) and decide again: whether
        it serves from now on (the model's operands are then packed for it anew: `plan.upgrade_target`)."""
        with self.lock:
            if not self.pending:
                return bool(self.decision)
            self.pending = False  # one thread builds it
        try:
            build(library_path(), background=True)
        except (OSError, subprocess.CalledProcessError) as err:
            say_why(err)
            return False
        with self.lock:
            self.decision = None
        return self.available(wait=True)


def load_if_built() -> None:
    """Load the kernel where an earlier start built it, for tracing too (a build process's draft step)."""
    if not loaded() and library_path().exists():
        load_built(library_path())
    if loaded():
        register_fake()


def load_built(path: Path) -> None:
    native_build.load_built(path, f"{name()} kernel")


def loaded() -> bool:
    try:
        return torch.ops.diversed.amx_mm is not None
    except (AttributeError, RuntimeError):
        return False


def name() -> str:
    """The kernel as the runtime names it: "AMX", "AVX-512 VNNI" or "AVX2", by this CPU."""
    return (instruction_set() or ("native",))[0]


def say_why(err: Exception) -> None:
    detail = getattr(err, "stderr", "") or err
    print(
        f"the {name()} kernel for the GGUF weights is not used ({str(detail).strip()[-300:]})",
        file=sys.stderr,
    )


def register_fake() -> None:
    """Shapes for tracing (torch.export of the compiled pass); registering again replaces the same."""

    @torch.library.register_fake("diversed::amx_mm")
    def _(rows, records):
        return rows.new_empty(rows.shape[0], records.shape[0] * 32)  # [M, N]


def computes_right() -> bool:
    """Products of random 4-bit and 8-bit blocks against the same weights dense, to output rounding, over
    a few rows (a verification's path) and more than 16 (a prompt's)."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(20, 64, generator=generator).bfloat16()
    d = (torch.rand(64, 2, generator=generator) / 50).half().float()
    m = (-torch.rand(64, 2, generator=generator) / 10).half().float()
    q4 = torch.randint(0, 16, (64, 64), generator=generator)
    q8 = torch.randint(-127, 128, (64, 64), generator=generator)
    for records, codes, minima in ((pack_q4(q4, d, m), q4, m), (pack_q8(q8, d), q8, 0 * m)):
        dense = (codes.view(64, 2, 32) * d[..., None] + minima[..., None]).view(64, 64)
        expected = rows_as_multiplied(rows) @ as_multiplied(dense).T
        for count in (1, 3, 5, len(rows)):
            if not torch.allclose(amx_product(rows[:count], records).float(), expected[:count], 1e-2, 1e-2):
                return False
    return True


def as_multiplied(weights: torch.Tensor) -> torch.Tensor:
    """A GGUF's float32 weights as this CPU's kernel multiplies them: rounded to bf16 on AMX (the dense bf16
    model's weights), as they are elsewhere (the GGUF's own values)."""
    return weights.bfloat16().float() if name() == "AMX" else weights


def codes_rows() -> bool:
    """Whether this CPU's kernel multiplies the blocks by the rows as 8-bit codes (and takes its records in
    the VNNI kernel's layout)."""
    return name() in CODED_ROWS


def records_layout() -> str:
    """The layout of this CPU's records, for the keys of packed operands kept on disk."""
    return f"{name()}-codes" if codes_rows() else name()


def rows_as_multiplied(rows: torch.Tensor) -> torch.Tensor:
    """A product's input rows [M, K] as this CPU's kernel multiplies them, in float32: where it codes them
    (`codes_rows`) each block of 32 as int8 codes times one scale (its largest magnitude / 127), as they
    are elsewhere."""
    x = rows.float()
    if not codes_rows():
        return x
    blocks = x.unflatten(-1, (-1, 32))
    largest = blocks.abs().amax(-1, keepdim=True)
    # a true division, as the kernel's (`127 / tensor` multiplies by a reciprocal: another rounding)
    inverse = torch.where(largest > 0, torch.full_like(largest, 127).div(largest), torch.zeros_like(largest))
    return ((blocks * inverse).round() * (largest / 127)).flatten(-2)


def check_fp16(*tensors: torch.Tensor) -> None:
    if not all(torch.equal(t.half().float(), t.float()) for t in tensors):
        raise ValueError("the scales and minima must be fp16 values, as a GGUF stores them")


def to_records(blocks: torch.Tensor, scales: list[torch.Tensor]) -> torch.Tensor:
    """[groups of 16 rows, K/32, bytes of codes] and fp16 [N, K/32] tensors as the kernel's records
    [N/32, K/32, 2, record bytes]: a block's codes, then its fp16 values per row."""
    groups, n_blocks = blocks.shape[:2]
    per_block = [
        t.view(groups, 16, n_blocks).transpose(1, 2).half().contiguous().view(torch.uint8) for t in scales
    ]
    joined = torch.cat([blocks, *per_block], -1)
    return joined.view(groups // 2, 2, n_blocks, joined.shape[-1]).transpose(1, 2).contiguous()


def pack_q4(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The kernel's 4-bit records of codes [N, K] (0..15), d and m [N, K/32] (a GGUF's fp16 values)."""
    check_fp16(d, m)
    n_rows, width = codes.shape
    groups, n_blocks = n_rows // 16, width // 32
    if codes_rows():
        # 4 x 64 bytes: byte 4j + e of the t-th holds row j's inputs 8t + e (low nibble) and 8t + 4 + e
        # (high); the view's axes: group, row j, block, t, low or high, e
        quads = codes.view(groups, 16, n_blocks, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
        nibbles = quads[..., 0] | (quads[..., 1] << 4)
    else:
        # byte 32i + k: row 2i's input k (low nibble) and row 2i + 1's (high)
        pairs = codes.view(groups, 8, 2, n_blocks, 32).permute(0, 3, 1, 2, 4)
        nibbles = pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)
    return to_records(nibbles.reshape(groups, n_blocks, 256).to(torch.uint8), [d, m])


def pack_q8(codes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The kernel's 8-bit records of codes [N, K] (−128..127) and d [N, K/32] (a GGUF's fp16 values)."""
    check_fp16(d)
    n_rows, width = codes.shape
    groups, n_blocks = n_rows // 16, width // 32
    if codes_rows():
        # 8 x 64 bytes: byte 4j + e of the u-th holds row j's input 4u + e; unsigned (code + 128) for
        # `vpdpbusd` on AVX-512 VNNI, signed on AVX2 (whose `vpsignb` takes the codes' signs)
        offset = 128 if name() == VNNI_LAYOUT else 0
        quads = ((codes.to(torch.int32) + offset) % 256).view(groups, 16, n_blocks, 8, 4)
        return to_records(quads.permute(0, 2, 3, 1, 4).reshape(groups, n_blocks, 512).to(torch.uint8), [d])
    blocks = (
        codes.to(torch.int8).view(groups, 16, n_blocks, 32).transpose(1, 2).reshape(groups, n_blocks, 512)
    )
    return to_records(blocks.view(torch.uint8), [d])


def amx_product(rows: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
    """rows [M, K] bf16 · (the packed 4- or 8-bit weight [N, K])ᵀ -> [M, N] bf16."""
    return torch.ops.diversed.amx_mm(rows, records)
