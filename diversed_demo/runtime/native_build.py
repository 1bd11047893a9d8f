"""The project's C++ kernels (amx_gguf.cpp, fused_attention.cpp, greedy_head.cpp): compiled here once per
machine and PyTorch into the user cache (g++, seconds), loaded as PyTorch operators, and let go of (to be
compiled again) when a cached library is damaged."""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import subprocess
import sysconfig
from pathlib import Path

import torch

from ..common import priority
from ..common.files import cache_dir, discard_damaged

BASE_FLAGS = ["-O3", "-fPIC", "-std=c++20", "-fopenmp"]


def cpu_flags() -> set[str]:
    """The CPU's feature flags, as Linux lists them."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((set(line.split(":")[1].split()) for line in info if line.startswith("flags")), set())
    except OSError:
        return set()


def library_path(source: Path, flags: list[str]) -> Path:
    """Where the library built from `source` with `flags` for this PyTorch lives in the user cache."""
    tag = source.read_bytes() + torch.__version__.encode() + " ".join(flags).encode()
    return cache_dir() / "kernels" / f"{source.stem}-{hashlib.sha256(tag).hexdigest()[:16]}.so"


def compile_library(source: Path, flags: list[str], path: Path, background: bool = False) -> None:
    """Compile `source` into `path` (compiled with OpenMP, linked without it: PyTorch's own runtime
    serves its threads); in the background at the lowest priority, as the compiled pass is built. One
    process at a time compiles a library: another that wants it waits, then finds it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        if not path.exists() or library_damage(path) is not None:  # else another process built it
            compile_unlocked(source, flags, path, background)


def compile_unlocked(source: Path, flags: list[str], path: Path, background: bool) -> None:
    torch_dir = Path(torch.__file__).parent
    includes = [f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include/torch/csrc/api/include'}"]
    includes.append(f"-I{sysconfig.get_paths()['include']}")
    partial = path.with_name(f"{path.stem}.tmp{os.getpid()}")
    try:
        compile_ = ["g++", *flags, *includes, "-c", str(source), "-o", f"{partial}.o"]
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


def load_built(path: Path, what: str) -> None:
    """Load a library built at an earlier start (a namespace registers once per process: never a second
    copy). One that is damaged or does not load (cut short by a full disk, a copy or a crash, or not a
    library) is removed, with one line saying so, to be built again."""
    damage = library_damage(path)
    if damage is None:
        try:
            torch.ops.load_library(str(path))
            return
        except OSError as err:
            damage = str(err)
    discard_damaged(path, what, damage, "compiling it again")


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
