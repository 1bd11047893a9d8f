"""Where the compiled pieces come from. On a CPU: the target's pass (compiled_pass.py) and the EAGLE-3
draft's step (compiled_draft.py) built in one background process at low priority into the user cache while
the eager path serves, and attached when ready and checked; later starts attach them at once. On a CUDA
GPU: both passes as CUDA graphs (cuda_graphs.py), captured and checked at start.

DIVERSED_COMPILED_PASS=off keeps everything eager.
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

from . import amx_gguf
from .compiled_draft import attach_draft, build_draft_package, draft_compilable, draft_package_path, uses_int8
from .compiled_pass import SWITCH, attach, build_package, int4_operand_count, package_path
from .cuda_graphs import attach_graphs
from .int8_draft import use_int8_draft
from .loading import use_4bit_products
from .static_pass import compilable


def prepare(pair, wait: bool = False, log=print) -> None:
    """Give the pair's target its compiled pass and its EAGLE-3 draft its compiled step, where they apply (a
    lean 4-bit target, a bf16 draft, on the CPU): at once where a package is built, else after a build in a
    background process (or, with wait, before returning). On a CUDA GPU: both as CUDA graphs, at once."""
    if os.environ.get(SWITCH, "auto") == "off":
        return
    if pair.target.device.type == "cuda":
        return attach_graphs(pair, log)  # every row count's graph is captured now
    if pair.target.device.type != "cpu":
        return
    if amx_gguf.pending():  # first the AMX kernel (seconds), so that the pass compiles over it
        log("building the AMX kernel in the background (about 10 s), then the compiled pass")
        work = functools.partial(upgrade_then_prepare, pair, log)
        if wait:
            return work()
        threading.Thread(target=work, daemon=True, name="amx-kernel-build").start()
        return
    attach_or_build(pair, wait, log)


def upgrade_then_prepare(pair, log) -> None:
    if amx_gguf.upgrade():
        use_4bit_products(pair.target)
        log("the 4-bit products run on the AMX kernel")
    attach_or_build(pair, True, log)


def attach_or_build(pair, wait: bool, log) -> None:
    parts = compiled_parts(pair)
    wanted = set(parts)
    for path in [path for path in parts if path.exists()]:
        parts.pop(path)(log)
    if parts:
        removed = prune(next(iter(parts)).parent, keep=wanted)
        if removed:
            log(f"removed {len(removed)} compiled packages no start used for {UNUSED_DAYS} days")
    if not parts:
        return
    build_log = next(iter(parts)).with_suffix(".log")
    build = start_build(pair, list(parts), build_log)
    log(f"compiling the decoding pass in the background (a minute or two); log: {build_log}")

    def finish():
        build.wait()
        for path, attach_part in parts.items():
            if path.exists():
                attach_part(log)
            else:
                log(f"compiling {path.name} failed (see {build_log}); it stays eager")

    if wait:
        finish()
    else:
        threading.Thread(target=finish, daemon=True, name="compiled-pass").start()


UNUSED_DAYS = 30


def prune(folder: Path, keep: set[Path], days: int = UNUSED_DAYS) -> list[Path]:
    """Delete the compiled packages in `folder` (and their build logs) that no start has loaded for `days`,
    but those in `keep`: every version of the code builds its own, a few hundred MB each."""
    cutoff = time.time() - days * 86400
    removed = []
    for package in sorted(folder.glob("*.pt2")):
        if package not in keep and package.stat().st_mtime < cutoff:
            package.unlink(missing_ok=True)
            package.with_suffix(".log").unlink(missing_ok=True)
            removed.append(package)
    return removed


def compiled_parts(pair) -> dict[Path, Callable]:
    """{package path: attach(log)} of the pair's parts that compile and have no compiled runner yet."""
    model, draft = pair.target, pair.draft
    aux = list(getattr(draft, "aux_layer_ids", None) or [])
    parts = {}
    if compilable(model) and getattr(model, "compiled_pass", None) is None:
        path = package_path(model, aux)
        parts[path] = functools.partial(attach, model, aux, path)
    if draft_compilable(draft) and getattr(draft, "compiled_step", None) is None:
        path = draft_package_path(draft)
        parts[path] = functools.partial(attach_draft, draft, path)
    return parts


def start_build(pair, paths: list[Path], log: Path) -> subprocess.Popen:
    """The build of `paths` (compiled_parts') in a process of its own at low priority, its output to `log`:
    C++ compilation on one core (the app keeps the other); products timed for autotuning at the app's
    thread count, as they will run."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), TORCHINDUCTOR_COMPILE_THREADS="1")
    env[amx_gguf.SWITCH] = "1" if int4_operand_count(pair.target) == 1 else "0"  # the app's kernel, untimed
    aux = ",".join(map(str, getattr(pair.draft, "aux_layer_ids", None) or []))
    draft_dir = str(getattr(pair.draft, "directory", "-"))
    int8 = str(int(draft_compilable(pair.draft) and uses_int8(pair.draft)))
    command = [sys.executable, "-m", __name__, pair.target_name, aux, draft_dir, int8, *map(str, paths)]
    with open(log, "w") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=lambda: os.nice(10)
        )


def build_from_command_line(target: str, aux: str, draft_dir: str, int8: str, *paths: str) -> None:
    """Build the packages at `paths`: the target's pass and the draft's step, whichever each path names. A
    part that fails is reported and the others are still built; the exit status says whether all were."""
    from .loading import load_eagle3, load_target

    model = load_target(target, torch.device("cpu"), torch.bfloat16)
    aux_layer_ids = [int(i) for i in aux.split(",") if i]
    builds = {package_path(model, aux_layer_ids): functools.partial(build_package, model, aux_layer_ids)}
    wanted = [Path(path) for path in paths]
    if draft_dir != "-" and any(path not in builds for path in wanted):
        try:
            draft = load_eagle3(draft_dir, model)
            if int8 == "1":  # as the app's draft runs, whatever a timing in this process would say
                use_int8_draft(draft, when_faster=False)
            builds[draft_package_path(draft)] = functools.partial(build_draft_package, draft)
        except Exception as err:
            print(f"the draft in {draft_dir} did not load ({err!r})", flush=True)
    failed = [path for path in wanted if not build_one(builds.get(path), path)]
    sys.exit(1 if failed else 0)


def build_one(build: Callable | None, path: Path) -> bool:
    """Build one package (autotuned, else plain: inductor's templates cover fewer CPUs than its plain
    code) and say how it went."""
    if build is None:
        print(f"this process builds other packages than {path}: the two processes load different models")
        return False
    start = time.perf_counter()
    try:
        try:
            build(path)
        except Exception as err:
            print(f"the autotuned build of {path} failed ({err!r}); building without autotuning", flush=True)
            build(path, inductor_configs={})
    except Exception as err:
        print(f"building {path} failed ({err!r})", flush=True)
        return False
    print(f"built {path} in {time.perf_counter() - start:.0f} s", flush=True)
    return True


if __name__ == "__main__":
    build_from_command_line(*sys.argv[1:])
