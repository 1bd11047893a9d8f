"""Where the CPU's compiled pieces come from: the target's pass (compiled_pass.py) and the EAGLE-3 draft's
step (compiled_draft.py), built in one process of their own at low priority (build_worker.py) into the user
cache while the eager path serves, then checked and lent to the pair; later starts attach them at once.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..common import priority
from . import amx_gguf
from .compiled_draft import attach_draft, draft_compilable, draft_package_path
from .compiled_pass import attach, int4_operand_count, package_path
from .int8_draft import products
from .static_pass import compilable


def attach_or_build(pair, wait: bool, log, done: Callable[[], None] = lambda: None) -> None:
    """Lend the pair its built packages now, and build the others in a background process: attached when
    it ends (before returning, with `wait`). `done` is called once nothing more will be attached."""
    parts = compiled_parts(pair)
    wanted = set(parts)
    for path in [path for path in parts if path.exists()]:
        parts.pop(path)(log=log)
    if parts:
        removed = prune(next(iter(parts)).parent, keep=wanted)
        if removed:
            log(f"removed {len(removed)} compiled packages no start used for {UNUSED_DAYS} days")
    if not parts:
        return done()
    build_log = next(iter(parts)).with_suffix(".log")
    build = start_build(pair, list(parts), build_log)
    log(f"compiling the decoding pass in the background (a minute or two); log: {build_log}")

    def finish():
        if not wait:
            priority.lowest_priority()  # its checks of the built packages: where a core is idle
        priority.finished(build)
        for path, attach_part in parts.items():
            if path.exists():
                attach_part(log=log)
            else:
                log(f"compiling {path.name} failed (see {build_log}); it stays eager")
        done()

    if wait:
        finish()
    else:
        threading.Thread(target=finish, daemon=True, name="compiled-pass").start()


UNUSED_DAYS = 30


def prune(folder: Path, keep: set[Path], days: int = UNUSED_DAYS) -> list[Path]:
    """Delete the compiled packages in `folder` (their build logs and timings too) that no start has loaded
    for `days`, but those in `keep`: every version of the code builds its own, a few hundred MB each."""
    cutoff = time.time() - days * 86400
    removed = []
    for package in sorted(folder.glob("*.pt2")):
        if package not in keep and package.stat().st_mtime < cutoff:
            package.unlink(missing_ok=True)
            package.with_suffix(".log").unlink(missing_ok=True)
            for timing in folder.glob(f"{package.stem}.drafts-*.json"):  # plan.tree_timing_path
                timing.unlink(missing_ok=True)
            removed.append(package)
    return removed


def compiled_parts(pair) -> dict[Path, Callable]:
    """{package path: attach(log)} of the pair's parts that compile and have no compiled runner yet; each
    attach lends what loads and agrees to the pair (`target_pass`, `draft_pass`)."""
    model, draft = pair.target, pair.draft
    aux = list(getattr(draft, "aux_layer_ids", None) or [])
    parts = {}
    if compilable(model) and pair.target_pass is None:
        path = package_path(model, aux)
        parts[path] = functools.partial(lend, pair, "target_pass", attach, model, aux, path)
    if draft_compilable(draft) and pair.draft_pass is None:
        path = draft_package_path(draft)
        parts[path] = functools.partial(lend, pair, "draft_pass", attach_draft, draft, path)
    return parts


def lend(pair, slot: str, attach_part: Callable, *args, log=print) -> None:
    """Attach a part and hand it to the pair between decodes (`ModelPair.offer_upgrade`)."""
    runner = attach_part(*args, log=log)
    if runner is not None:
        pair.offer_upgrade(functools.partial(setattr, pair, slot, runner))


def start_build(pair, paths: list[Path], log: Path) -> subprocess.Popen:
    """The build of `paths` (compiled_parts') in a process of its own at low priority, its output to `log`:
    C++ compilation on one core (the app keeps the other); products timed for autotuning at the app's
    thread count, as they will run."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), TORCHINDUCTOR_COMPILE_THREADS="1")
    env[amx_gguf.SWITCH] = "1" if int4_operand_count(pair.target) == 1 else "0"  # the app's kernel, untimed
    aux = ",".join(map(str, getattr(pair.draft, "aux_layer_ids", None) or []))
    draft_dir = str(getattr(pair.draft, "directory", "-"))
    int8 = products(pair.draft) if draft_compilable(pair.draft) else "dense"
    command = [
        sys.executable,
        "-m",
        f"{__package__}.build_worker",
        pair.target_name,
        aux,
        draft_dir,
        int8,
        *map(str, paths),
    ]
    with open(log, "w") as out:
        return priority.background(command, stdout=out, stderr=subprocess.STDOUT, env=env)
