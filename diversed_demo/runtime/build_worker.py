"""The background build of the CPU's compiled pieces, in a process of its own (compiled_build.start_build):
`python -m diversed_demo.runtime.build_worker TARGET AUX DRAFT_DIR INT8 PATH...`. It loads the pair as the
runtime runs it (plan.py) and builds the packages the paths name."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..models.loading import gguf_file, load_eagle3, load_target
from . import amx_gguf
from .amx_gguf import AmxKernel
from .compiled_draft import build_draft_package, draft_package_path
from .compiled_pass import build_package, package_path
from .int8_draft import use_int8_draft
from .plan import fast_target


def build_from_command_line(target: str, aux: str, draft_dir: str, int8: str, *paths: str) -> None:
    """Build the packages at `paths`: the target's pass and the draft's step, whichever each path names. A
    part that fails is reported and the others are still built; the exit status says whether all were."""
    model = load_target(target, torch.device("cpu"), torch.bfloat16)
    fast_target(model, gguf_file(target), AmxKernel())  # as DIVERSED_AMX, set by the app, says
    aux_layer_ids = [int(i) for i in aux.split(",") if i]
    builds = {package_path(model, aux_layer_ids): functools.partial(build_package, model, aux_layer_ids)}
    wanted = [Path(path) for path in paths]
    if draft_dir != "-" and any(path not in builds for path in wanted):
        try:
            draft = load_eagle3(draft_dir, model)
            if int8 == "blocks":  # the kernel the app loaded, whatever DIVERSED_AMX says of the target
                amx_gguf.load_if_built()
            if int8 != "dense":  # as the app's draft runs, whatever a timing in this process would say
                use_int8_draft(draft, when_faster=False, kernel=int8 == "blocks")
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
