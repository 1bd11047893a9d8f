"""Products on a GGUF's quantised weights on Intel AMX (amx_gguf.cpp): the 4-bit projections, where a pass
over up to 16 tokens costs about what one token's does (PyTorch's int4 kernel pays again for every 4 rows)
and a prompt's pass runs faster than on the dense weights, and the 8-bit (Q8_0) LM head, which streams half
the bytes of its dense bf16 copy (docs/measurements/speed.md).

The kernel is C++ compiled here once per machine and PyTorch into the user cache (g++, about 10 s: at a
first start in the background, before the compiled pass is built, while decodes run on PyTorch's kernel;
runtime/compiled_build.py) and loaded as the PyTorch operator `diversed::amx_mm`, so the compiled pass
can call it too. It serves only where the CPU has AMX (Sapphire Rapids and later Xeons), Linux lends the
process its tiles, the build succeeds and the product is the faster here; everywhere else PyTorch's int4
kernel and the dense LM head do.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import torch

from ..common import priority
from ..common.files import cache_dir, discard_damaged

SOURCE = Path(__file__).with_suffix(".cpp")
SWITCH = "DIVERSED_AMX"  # "0": PyTorch's int4 kernel even where this one would serve; "1": this one untimed
CPU_FLAGS = {"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw", "avx512vl", "f16c"}
FLAGS = ["-O3", "-fPIC", "-std=c++20", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"]
FLAGS += ["-mf16c", "-mamx-tile", "-mamx-bf16"]
# bytes a block of 16 rows × 32 inputs takes: 4-bit, 256 of codes, 16 fp16 scales and 16 fp16 minima;
# 8-bit, 512 of codes and 16 fp16 scales
Q4_RECORD, Q8_RECORD = 320, 544


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            return next((set(line.split(":")[1].split()) for line in info if line.startswith("flags")), set())
    except OSError:
        return set()


def library_path() -> Path:
    tag = SOURCE.read_bytes() + torch.__version__.encode() + " ".join(FLAGS).encode()
    return cache_dir() / "kernels" / f"amx_gguf-{hashlib.sha256(tag).hexdigest()[:16]}.so"


def build(path: Path, background: bool = False) -> None:
    """Compile the kernel into `path` (compiled with OpenMP, linked without it: PyTorch's own runtime
    serves its threads); in the background at the lowest priority, as the compiled pass is built."""
    torch_dir = Path(torch.__file__).parent
    includes = [f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include/torch/csrc/api/include'}"]
    includes.append(f"-I{sysconfig.get_paths()['include']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.tmp{os.getpid()}")
    try:
        compile_ = ["g++", *FLAGS, *includes, "-c", str(SOURCE), "-o", f"{partial}.o"]
        libraries = [f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu"]
        link = ["g++", "-shared", f"{partial}.o", *libraries, "-o", str(partial)]
        for command in (compile_, link):
            if background:  # out of a visitor's way: idle priority, stopped while a decode runs
                process = priority.background(
                    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                output, _ = process.communicate()
                if priority.finished(process):
                    raise subprocess.CalledProcessError(process.returncode, command, output, output)
            else:
                subprocess.run(command, check=True, capture_output=True, text=True)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
        Path(f"{partial}.o").unlink(missing_ok=True)


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
        if os.environ.get(SWITCH) == "0" or not CPU_FLAGS <= cpu_flags() or sys.platform != "linux":
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


def load_built(path: Path) -> None:
    """Load the kernel built at an earlier start (a namespace registers once per process: never a second
    copy). One that is damaged or does not load (cut short by a full disk, a copy or a crash, or not a
    library) is removed, with one line saying so, to be built again."""
    damage = library_damage(path)
    if damage is None:
        try:
            torch.ops.load_library(str(path))
            return
        except OSError as err:
            damage = str(err)
    discard_damaged(path, "AMX kernel", damage, "compiling it again")


def library_damage(path: Path) -> str | None:
    """Whether a built library is cut short, checked before the loader maps it: the loader maps a short
    file's missing pages all the same, and touching them kills the process (SIGBUS) instead of failing.
    Its ELF headers say where its segments and section table end; the file must reach there."""
    data = path.read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return f"not a 64-bit little-endian ELF library ({len(data)} bytes)"
    ph_offset, sh_offset = struct.unpack_from("<QQ", data, 32)
    ph_size, ph_count, sh_size, sh_count = struct.unpack_from("<HHHH", data, 54)
    ends = [ph_offset + ph_size * ph_count, sh_offset + sh_size * sh_count]
    if max(ends) <= len(data):
        for i in range(ph_count):  # p_offset and p_filesz of each segment
            offset, _, _, size = struct.unpack_from("<QQQQ", data, ph_offset + i * ph_size + 8)
            ends.append(offset + size)
    if max(ends) > len(data):
        return f"{len(data)} bytes where its headers need {max(ends)}"
    return None


def loaded() -> bool:
    try:
        return torch.ops.diversed.amx_mm is not None
    except (AttributeError, RuntimeError):
        return False


def say_why(err: Exception) -> None:
    detail = getattr(err, "stderr", "") or err
    print(f"the AMX kernel for the GGUF weights is not used ({str(detail).strip()[-300:]})", file=sys.stderr)


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
        dense = (codes.view(64, 2, 32) * d[..., None] + minima[..., None]).view(64, 64).bfloat16()
        expected = rows.float() @ dense.float().T
        for count in (3, len(rows)):
            if not torch.allclose(amx_product(rows[:count], records).float(), expected[:count], 1e-2, 1e-2):
                return False
    return True


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
    pairs = codes.view(groups, 8, 2, n_blocks, 32).permute(0, 3, 1, 2, 4)  # group, block, pair, row, input
    nibbles = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(groups, n_blocks, 256).to(torch.uint8)
    return to_records(nibbles, [d, m])


def pack_q8(codes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The kernel's 8-bit records of codes [N, K] (−128..127) and d [N, K/32] (a GGUF's fp16 values)."""
    check_fp16(d)
    n_rows, width = codes.shape
    groups, n_blocks = n_rows // 16, width // 32
    blocks = (
        codes.to(torch.int8).view(groups, 16, n_blocks, 32).transpose(1, 2).reshape(groups, n_blocks, 512)
    )
    return to_records(blocks.view(torch.uint8), [d])


def amx_product(rows: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
    """rows [M, K] bf16 · (the packed 4- or 8-bit weight [N, K])ᵀ -> [M, N] bf16."""
    return torch.ops.diversed.amx_mm(rows, records)
