"""How a pair runs on this machine: every choice made here, once, when the pair loads, and recorded.

`load_pair` loads the models as transformers builds them (models/loading.py), then decides, in order:
1. the dtype: "auto" on a CPU is measured (dtype_choice.py: each candidate's passes timed, the faster kept
   and remembered per machine); on a GPU bf16 (fp16 where it has no bf16);
2. the target's products: a GGUF target's projections on its own 4-bit weights where that is faster here
   (gguf_int4.py, on the AMX kernel where the CPU has one: amx_gguf.py), with lean layers over them
   (lean_layer.py); an fp32 model's on the few-row product where that is faster (linear.py);
3. the draft's products: on 8-bit weights where that is faster (int8_draft.py);
4. attention: grouped K/V heads read in place, on a CPU (attention.py);
5. the passes: on a CPU the target's pass and an EAGLE-3 draft's step compiled (compiled_build.py: built
   once, in the background), on a CUDA GPU both as CUDA graphs (cuda_graphs.py); the decoder is handed them
   as `pair.target_pass` and `pair.draft_pass`.
`pair.runtime` records each choice; `print(pair.runtime)` gives one line. `fast=False` keeps the models as
transformers runs them; DIVERSED_COMPILED_PASS=off keeps the passes eager.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..common import priority
from ..common.files import read_json_object, write_text
from ..common.priority import lowest_priority
from ..common.threads import THREADS
from ..core.prompt import encode_prompt
from ..models.embedded import EMBEDDED
from ..models.loading import gguf_file, load_models, pick_device
from ..models.pair import ModelPair
from . import amx_gguf, fused_attention, greedy_head
from .amx_gguf import AmxKernel
from .attention import use_grouped_attention
from .compiled_build import attach_or_build
from .compiled_pass import SWITCH, int4_operand_count, package_path
from .costs import (
    CostError,
    host_change,
    measure_costs,
    median_costs,
    parsed_costs,
    pass_check,
    tree_speed,
)
from .cuda_graphs import attach_graphs
from .dtype_choice import TIMING_CALLS, calibration_prompt, choice_note, measured_dtype
from .gguf_int4 import quantised_operands, switch_to_operands, use_gguf_int4
from .int8_draft import blocks_aside, products, use_blocks, use_int8_draft
from .lean_layer import use_lean_layers
from .linear import use_fast_linear
from .model_thread import MODEL_THREAD
from .static_pass import StaticPass

# When the compiled passes are built: in the background (the app's way), before load_pair returns (the
# bench's), never.
COMPILED = ("background", "wait", "off")


@dataclass
class Runtime:
    """What runs where for one pair, as the runtime chose it; `str()` is one line."""

    device: str
    dtype: str
    dtype_why: str
    target: str  # the target's products
    draft: str  # the draft's products
    attention: str
    passes: str = "eager"  # updated when compiled passes are attached
    drafts: str = "chains"  # or "trees", where they decode faster (`choose_drafts`)
    tree_speed: float | None = None  # trees' decode speed ÷ chains', as `choose_drafts` timed it
    amx: AmxKernel = field(default_factory=AmxKernel, repr=False)  # whether the 4-bit products run on AMX
    on_model_thread: bool = field(default=False, repr=False)  # loaded (and so decoded) on MODEL_THREAD
    # A server's start (load_pair's serve_first): what it leaves for once its page is up (`after_serving`)
    serving_first: bool = field(default=False, repr=False)
    later: list = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        drafts = self.drafts
        if self.tree_speed is not None:
            drafts += f" (trees decode at {self.tree_speed:.2f}× the chains' speed here)"
        threads = THREADS.note() if self.device == "cpu" else ""
        return (
            f"{self.device}, {self.dtype} ({self.dtype_why}) · target: {self.target} · draft: {self.draft} · "
            f"attention: {self.attention} · passes: {self.passes} · drafts: {drafts}"
            + (f" · {threads}" if threads else "")
        )


# Trees where their decodes run at least this much faster than chains' here (a margin over the timing's
# noise): trees add draft, verification and bookkeeping work besides their wider pass, and on the CPUs at
# hand they decoded at 0.89–0.99 of the chains' speed (docs/measurements/speed.md).
TREE_GAIN = 1.05
# What the timing decodes: an answer, code, and a copy from the prompt (where chains draft from the text).
TREE_PROBES = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat the names in this list, one a line: Ada Lovelace, Alan Turing, Grace Hopper, Edsger Dijkstra.",
)
# What kept timings mean: a new form (whole steps' c and r the drafting's alone, since 2026-12-03) is
# kept apart from older files, which would read as valid and mean something else.
TIMING_FORM = 2
BUILDER_END_S = 5.0  # the most the model thread waits for the background thread to end before timing
# Timings kept, the newest last; the pair weighs each figure's median over them, so that one timing in a
# spell of the host's other work does not set a start's drafting alone (ten timings in one process read
# the whole steps' r + c + v_1 − 1 at 0.38–0.61 on Zen 3, around exact SD's first draft's 0.5: speed.md),
# and a host that moved is followed within two starts.
TIMINGS_KEPT = 3


def choose_drafts(pair: ModelPair, log) -> None:
    """Between decodes, on the compiled passes: time the costs the draft length weighs (c, r and v[N], of
    the passes and as whole steps price them; the dtype choice timed the eager passes, at a first start
    before the kernels were built), and greedy exact SD on TREE_PROBES with chains and with trees; draft
    trees (where a decode's tree setting is "auto") if they decode TREE_GAIN faster; chains otherwise, and
    where the pass cannot take a tree's rows (transformers' own static cache). The timings are kept beside
    the compiled passes with a half-second check of what the passes cost: later starts on them read them
    where the same check finds the host unchanged (costs.host_change), and time them again elsewhere."""
    runner = pair.target_pass
    if runner is None or not isinstance(runner.module, StaticPass):
        return

    def measure() -> None:
        kept, (timed, costs, speed) = tree_timing_path(pair), kept_timings(pair)
        history = kept_history(timed)
        try:
            with priority.decoding(), THREADS.judged() as timing:  # as a decode runs: no background build
                check = pass_check(pair, encode_prompt(pair.tokenizer, calibration_prompt()))
                if (costs or speed) and (change := host_change(timed.get("check"), check)):
                    log(f"drafts: the kept timings are timed again ({change})")
                    costs = speed = None
                if costs is None:  # before the trees' timing: its drafts weigh them
                    history = [*history, compiled_costs(pair)][-TIMINGS_KEPT:]
                pair.costs = costs or median_costs(history)
                speed = speed or tree_speed(pair, TREE_PROBES)
        except Exception as error:  # run where a decode ends: the decode must not fail for it
            log(f"drafts: chains (timing trees against chains failed: {error})")
            return
        if timing.shared:  # timed beside another process's busy core: for this start only
            log("drafts: timed while another process kept a core busy; timed again at the next start")
        elif pair.costs is not costs or timed.get("tree_speed") != speed:  # something was timed again
            check = check if costs is None else timed["check"]  # the host the kept costs were timed on
            kept_now = {"tree_speed": speed, "costs": pair.costs, "history": history, "check": check}
            write_text(kept, json.dumps(kept_now) + "\n")
        use_drafts(pair, speed)
        log(f"drafts: {pair.runtime.drafts} (trees decode at {speed:.2f}× the chains' speed here)")

    if pair.runtime.serving_first and MODEL_THREAD.is_current():
        # A server's start on built passes: the kept timings serve unchecked until its page is up, then are
        # checked, and timed again where the host changed (8 s of a 23 s start on a Zen 4 host that drifts).
        _, costs, speed = kept_timings(pair)
        pair.costs = costs or pair.costs
        if speed is not None:
            use_drafts(pair, speed)
        pair.runtime.later.append(lambda: pair.offer_upgrade(measure))
        return
    if pair.runtime.on_model_thread and not MODEL_THREAD.is_current():
        # Timed on the thread that decodes, once this (background) thread has ended: while it lives, its
        # OpenMP team leaves more threads than cores and every small kernel waits (model_thread.py). Timed
        # before it ended, a one-token pass took 50 ms instead of 10 and cold starts chose trees.
        builder = threading.current_thread()
        queued = MODEL_THREAD.submit(lambda: (builder.join(BUILDER_END_S), pair.offer_upgrade(measure)))
        failed = lambda done: done.exception() and log(f"drafts: chains ({done.exception()})")  # noqa: E731
        queued.add_done_callback(failed)
    else:
        pair.offer_upgrade(measure)


def kept_history(timed: dict) -> list[dict]:
    """The costs of the timings an earlier start kept (`TIMINGS_KEPT` at most, the newest last), each as the
    pair keeps costs; a damaged one is left out, and a file from before the history keeps its costs alone."""
    history = timed.get("history")
    if not isinstance(history, list):
        history = [timed.get("costs")]
    return [costs for costs in map(kept_costs, history) if costs is not None][-TIMINGS_KEPT:]


def kept_costs(costs) -> dict | None:
    """Kept timings (from JSON) as the pair keeps them: the passes' c, r and v[N] and whole steps' ("steps"),
    or None where either is missing or damaged (the file is timed again)."""
    steps = parsed_costs(costs["steps"]) if isinstance(costs, dict) and "steps" in costs else None
    passes = parsed_costs(costs)
    return None if passes is None or steps is None else {**passes, "steps": steps}


def compiled_costs(pair: ModelPair) -> dict:
    """c, r and v[N] for N = 1..6 on the passes the pair decodes on now, and as whole steps price them
    (a few seconds): medians of three rounds, as a first round pays the passes' first calls (one round read c
    at 0.29 where three read 0.16, EPYC)."""
    prompt_ids = encode_prompt(pair.tokenizer, calibration_prompt())
    costs = measure_costs(
        pair, prompt_ids, list(range(1, 7)), rounds=3, calls=TIMING_CALLS, draft_tokens=32, steps=True
    )
    kept = kept_costs(costs)
    if kept is None:
        raise CostError(f"the passes' costs timed as no machine runs them: c {costs['c']}, v {costs['v']}")
    return kept


def tree_timing_path(pair: ModelPair) -> Path:
    """Where `choose_drafts` keeps its timings: beside the target's compiled pass, for this draft and what its
    products run on (the pass's key already names the code, the CPU and the thread count)."""
    aux = list(getattr(pair.draft, "aux_layer_ids", None) or [])
    key = f"{pair.draft_name}:{products(pair.draft)}:{TIMING_FORM}"
    draft = hashlib.sha256(key.encode()).hexdigest()[:12]
    return package_path(pair.target, aux).with_suffix(f".drafts-{draft}.json")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def kept_timings(pair: ModelPair) -> tuple[dict, dict | None, float | None]:
    """What an earlier start kept beside the compiled passes: (the file's object, its costs, its trees'
    speed), each None where missing or damaged."""
    timed = read_json_object(tree_timing_path(pair))[0] or {}
    speed = timed.get("tree_speed")
    speed = speed if isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0 else None
    return timed, kept_costs(timed.get("costs")), speed


def use_drafts(pair: ModelPair, speed: float) -> None:
    """Draft trees where they decode TREE_GAIN faster than chains (`speed`: trees' ÷ chains'), else chains."""
    pair.runtime.tree_speed = speed
    pair.runtime.drafts = "trees" if speed >= TREE_GAIN else "chains"


def after_serving(pair: ModelPair) -> None:
    """What a server's start left for once its page is up (`Runtime.later`): run on the model thread, which
    its launcher submits it to before it launches the page."""
    while pair.runtime.later:
        pair.runtime.later.pop(0)()


def load_pair(
    target: str = EMBEDDED,
    draft: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    fast: bool = True,
    compiled: str = "background",
    log=say,
    serve_first: bool = False,
) -> ModelPair:
    """Load target, draft and their shared tokenizer, made fast here: a new pair each call (whoever serves
    one keeps it). `target`/`draft` are hub ids, local directories or .gguf files; `smollm2-135m` is the
    embedded pair (draft defaults to the shipped one). dtype "auto" is measured on a CPU. compiled:
    "background" (the app's way: eager until the compiled passes are built), "wait" (built before
    returning, as the bench times), "off". fast=False: as transformers runs them, nothing swapped.
    serve_first (a server's first start): a dtype choice that waits least (dtype_choice.measured_dtype), and
    the timings for the draft length checked once the page is up (`after_serving`, which the server runs).
    Raises PairError with a readable message on any mismatch."""
    if compiled not in COMPILED:
        raise ValueError(f"compiled must be one of {', '.join(COMPILED)}, not {compiled!r}")
    if not fast:
        pair = load_models(target, draft, device, dtype)
        stock = "as transformers runs it"
        pair.runtime = Runtime(str(pair.device), dtype_name(pair), stock, "stock", "stock", "stock")
        return pair
    amx = AmxKernel()  # this pair's: decided here, upgraded by its own background build
    if compiled == "wait":
        amx.available(wait=True)  # the kernel the products and the compiled pass are built on
    if dtype == "auto" and pick_device(device).type == "cpu":
        making = lambda name: fast_pair(target, draft, device, name, amx)  # noqa: E731
        pair, choice = measured_dtype(making, target, draft, serve_first)
        pair.dtype_choice = choice
        pair.costs = chosen_costs(choice)
        untimed = " and ".join(choice.get("untimed", ()))
        cached = " at an earlier start" if choice.get("cached") else ""
        pair.runtime.dtype_why = f"{untimed} timed at the next start" if untimed else f"measured{cached}"
        log(f"dtype {choice_note(choice)}")
    else:
        pair = fast_pair(target, draft, device, dtype, amx)
    pair.runtime.on_model_thread = MODEL_THREAD.is_current()
    if pair.device.type == "cpu":
        THREADS.start()  # decodes watch their count of threads against other processes on the cores
    pair.runtime.serving_first = serve_first
    start_passes(pair, compiled, log)
    pair.runtime.serving_first = False  # what a background build attaches later runs no page's start
    return pair


def chosen_costs(choice: dict) -> dict | None:
    """The draft's and the verification's costs (c, v[N]) timed when the dtype was chosen, or None."""
    figures = choice["figures"].get(choice["dtype"])
    if not figures:
        return None
    return parsed_costs({"r": 0.0, **figures})


def dtype_name(pair: ModelPair) -> str:
    return str(next(pair.target.parameters()).dtype).removeprefix("torch.")


def fast_pair(target: str, draft: str | None, device: str, dtype: str, amx: AmxKernel) -> ModelPair:
    """The pair with every product and layer that is faster here swapped in, recorded in `pair.runtime`."""
    pair = load_models(target, draft, device, dtype)
    speed_up(pair, gguf_file(target), amx)
    if dtype != "auto":
        pair.runtime.dtype_why = "asked for"
    return pair


def speed_up(pair: ModelPair, gguf: Path | None = None, amx: AmxKernel | None = None) -> Runtime:
    """Swap in the products and attention that are faster here (the target's 4-bit ones from `gguf`, its
    GGUF file, if any, on `amx` where it serves: a kernel decided anew if none), in place, and record them
    as `pair.runtime`."""
    amx = amx if amx is not None else AmxKernel()
    attention = [use_grouped_attention(model) for model in (pair.target, pair.draft)]
    pair.runtime = Runtime(
        device=str(pair.device),
        dtype=dtype_name(pair),
        dtype_why=f"the default on {pair.device.type}",
        target=fast_target(pair.target, gguf, amx),
        draft=fast_draft(pair.draft, amx),
        attention="grouped SDPA" if any(attention) else "transformers' SDPA",
        amx=amx,
    )
    return pair.runtime


def fast_target(model, gguf: Path | None, amx: AmxKernel) -> str:
    """The target's products that are faster here swapped in: what it runs on, in words."""
    if gguf is not None and use_gguf_int4(model, gguf, amx):
        model.gguf_path = gguf  # where its blocks are read again for another kernel (`upgrade_target`)
        return on_blocks(model, use_lean_layers(model))
    if use_fast_linear(model):
        return "few-row fp32 products"
    return "dense"


def on_blocks(model, lean: int) -> str:
    kernel = f"the project's {amx_gguf.name()}" if int4_operand_count(model) == 1 else "PyTorch's int4"
    return f"the GGUF's 4-bit weights on {kernel} kernel, {lean} lean layers"


def int8_words(draft) -> str:
    """An 8-bit draft's products, in words."""
    on = f" on the project's {amx_gguf.name()} kernel" if products(draft) == "blocks" else ""
    return f"8-bit weights{on}"


def fast_draft(draft, amx: AmxKernel) -> str:
    """The draft's products that are faster here swapped in (on the GGUF kernel where it serves already):
    what it runs on, in words."""
    if use_int8_draft(draft, kernel=amx.available()):
        return int8_words(draft)
    if use_fast_linear(draft):
        return "few-row fp32 products"
    return "dense"


def start_passes(pair: ModelPair, compiled: str = "background", log=say) -> None:
    """Give the pair its compiled (CPU) or graphed (CUDA) passes where they apply: at once where built,
    else after a build in a background process (before returning where compiled is "wait")."""
    if compiled == "off" or os.environ.get(SWITCH, "auto") == "off":
        return
    if pair.device.type == "cuda":
        attach_graphs(pair, log)
        return note_passes(pair, "CUDA graphs")
    if pair.device.type != "cpu":
        return
    wait = compiled == "wait"
    pair.runtime.passes = "eager while the compiled ones are built"
    work = functools.partial(build_passes, pair, wait, log)
    if pair.runtime.amx.pending and not wait:  # first the GGUF kernel (seconds): the pass compiles over it
        log(f"building the {amx_gguf.name()} kernel in the background (10-20 s), then the compiled pass")
        threading.Thread(
            target=work, kwargs={"background": True}, daemon=True, name="amx-kernel-build"
        ).start()
    else:
        work()


def build_passes(pair: ModelPair, wait: bool, log, background: bool = False) -> None:
    if background:  # a thread of its own: packing operands, checking packages, where a core is idle
        lowest_priority()
    if pair.runtime.amx.pending and pair.runtime.amx.upgrade():
        upgrade_target(pair, log)
    attach_or_build(pair, wait, log, done=lambda: passes_attached(pair, log, wait))


def passes_attached(pair: ModelPair, log, wait: bool) -> None:
    """Once nothing more will be attached: say so in `pair.runtime`, give it the greedy head kernel, then
    choose chains or trees. Then the process's own background work no longer holds a core (but for the head
    kernel's g++, which rearms the watch as it ends): decodes try all their threads (`ThreadWatch.rearm`)."""
    pair.offer_upgrade(lambda: note_passes(pair, "compiled")).wait()
    attach_head_kernel(pair, log, wait)
    choose_drafts(pair, log)
    THREADS.rearm()


def attach_head_kernel(pair: ModelPair, log, wait: bool) -> None:
    """Hand the pair the greedy head kernel (runtime/greedy_head.py) between decodes: at once where an
    earlier start built it, else once g++ has built it (in the background at the lowest priority, unless
    `wait`). Loaded and checked on the thread that decodes: torch work on another thread would give that
    one an OpenMP team of its own (model_thread.py)."""
    if pair.device.type != "cpu" or not greedy_head.wanted():
        return

    def swap() -> None:
        pair.head_kernel = greedy_head.Kernel()
        log(ATTACHED)

    def hand_over() -> None:
        if greedy_head.ensure():
            pair.offer_upgrade(swap)

    def failed(done) -> None:
        if done.exception() is not None:
            log(f"the {greedy_head.WHAT} is not used ({done.exception()})")

    def on_the_decoding_thread() -> None:
        if pair.runtime.on_model_thread and not MODEL_THREAD.is_current():
            MODEL_THREAD.submit(hand_over).add_done_callback(failed)
        else:
            hand_over()

    def build_aside() -> None:
        built = greedy_head.build(background=True)
        THREADS.rearm()  # its g++ held the other core
        if built:
            on_the_decoding_thread()

    if wait or greedy_head.built():
        on_the_decoding_thread()
    else:
        threading.Thread(target=build_aside, daemon=True, name="head-kernel-build").start()


ATTACHED = "a greedy head's rule runs in one native call"


def upgrade_target(pair: ModelPair, log) -> None:
    """Move the target's 4-bit products, and the draft's 8-bit ones, onto the project's kernel, built since
    the pair loaded: their operands are packed here, aside, then swapped in whole between decodes
    (`ModelPair.offer_upgrade`); returns once they are in, so that the compiled passes are built and
    checked over them (a later start's pair is made on the kernel at once)."""
    model = pair.target
    operands = quantised_operands(model, model.gguf_path, pair.runtime.amx)
    if not operands:
        return
    blocks = blocks_aside(pair.draft)

    def swap() -> None:
        switch_to_operands(model, operands)
        pair.runtime.target = on_blocks(model, use_lean_layers(model))
        use_blocks(blocks)
        if blocks:
            pair.runtime.draft = int8_words(pair.draft)

    pair.offer_upgrade(swap).wait()
    log(f"the 4-bit products run on the {amx_gguf.name()} kernel")


def note_passes(pair: ModelPair, how: str) -> None:
    parts = [name for name, runner in (("target", pair.target_pass), ("draft", pair.draft_pass)) if runner]
    pair.runtime.passes = f"{how}: {' and '.join(parts)}" if parts else "eager"
    if getattr(getattr(pair.target_pass, "module", None), "fused", False):
        pair.runtime.attention = f"the fused kernel ({fused_attention.name()}) in the compiled pass"
