"""Sequence-level rewards: ROUGE for summaries, final-number match for math, sandboxed pass@1 for code,
and a task-free fidelity reward (mean target log-probability) for any prompt.

`task_reward` is the one reward of training, the frontier and the app; `quality` gives the
reference-based metrics (the bench reports them per category, with `fidelity`).
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from decimal import Decimal

import torch

from .tasks import TASKS, Example

SUMMARIZATION_REWARD = "rouge2"  # the summarization reward is ROUGE-2 F1 against the reference summary
PRIMARY_METRIC = {"summarization": SUMMARIZATION_REWARD, "math": "exact_match", "code": "pass@1"}
# How reports name each task's quality (`task_reward`): tables, cards and the app's charts.
QUALITY_LABEL = {"summarization": "ROUGE-2", "math": "final-number match", "code": "pass@1",
                 "general": "fidelity (mean log p, nats/token)"}


# ---------------------------------------------------------------------------------------------------
# Summarization


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rouge2", "rougeL"], use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-2 and ROUGE-L F1 of `prediction` against `reference` (stemmed, as in the usual CNN/DM setup)."""
    scores = _rouge_scorer().score(reference, prediction)
    return {name: score.fmeasure for name, score in scores.items()}


# ---------------------------------------------------------------------------------------------------
# Math (GSM8K)

# A number as people write it: optional sign and $, thousands separators, decimals. The lookbehind
# keeps "x2" or "10-5" from yielding "2" or "-5"; a sentence's final period is never part of it.
NUMBER = re.compile(r"(?<![\w.])-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def final_number(text: str) -> Decimal | None:
    """The answer number of a solution: after the last "####" if any, else in the last \\boxed{},
    else the last number in the text. None if there is no number."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
        numbers = NUMBER.findall(text)[:1]  # the answer follows the marker
    else:
        boxed = BOXED.findall(text)
        numbers = NUMBER.findall(boxed[-1] if boxed else text)[-1:]
    return Decimal(numbers[0].replace("$", "").replace(",", "")) if numbers else None


def math_exact_match(prediction: str, reference: str) -> float:
    """1.0 if the final numbers of prediction and reference (a GSM8K answer ending "#### n") are equal."""
    predicted, expected = final_number(prediction), final_number(reference)
    if expected is None:
        raise ValueError(f"the reference has no final number: {reference[-80:]!r}")
    return float(predicted is not None and predicted == expected)


# ---------------------------------------------------------------------------------------------------
# Code (HumanEval, MBPP): extract the program, run it with its tests in a sandboxed subprocess

SANDBOX_TIMEOUT_S = 10.0
SANDBOX_MEMORY_MB = 1024
SANDBOX_OUTPUT_MB = 16  # largest file the program may write (its stderr included)

FENCE = re.compile(r"```[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.S)  # an unclosed last fence runs to the end
# Where a HumanEval body continuation stops (the Codex paper's stop sequences).
BODY_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")

# The sandboxed interpreter's own code (`python -I -c`): limits set here bind the program and any process
# it starts; socket.socket is replaced so that making any socket fails (the network namespace, when
# available, also covers what this cannot, e.g. ctypes or a spawned binary). The program then runs as
# __main__ from its own file, so `from __future__` imports and traceback line numbers work as written.
SANDBOX_LAUNCHER = """\
import resource, runpy, socket, _socket
resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu_seconds}, {cpu_seconds}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({file_bytes}, {file_bytes}))

def refuse(kind):
    class NoNetwork(kind):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")
    return NoNetwork

socket.socket = socket.SocketType = refuse(socket.socket)
_socket.socket = _socket.SocketType = refuse(_socket.socket)
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass
class SandboxResult:
    passed: bool
    status: str  # "passed", "failed" or "timeout"
    detail: str  # the end of stderr, or what stopped the program


@functools.lru_cache(maxsize=1)
def network_namespace_command() -> tuple[str, ...]:
    """`unshare --net --map-root-user` if this machine lets us make a network namespace, else ().

    In a fresh network namespace there is no interface but a downed loopback: nothing the program or
    its children do can reach any network. Containers often forbid user namespaces, hence the probe.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    command = (unshare, "--net", "--map-root-user")
    try:
        probe = subprocess.run([*command, sys.executable, "-I", "-c", "pass"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return command if probe.returncode == 0 else ()


def run_sandboxed(program: str, timeout_s: float = SANDBOX_TIMEOUT_S, memory_mb: int = SANDBOX_MEMORY_MB,
                  isolate_network: bool = True) -> SandboxResult:
    """Run a Python program in a separate, limited interpreter; it passes if it exits with status 0.

    The program runs as `python -I` (no environment variables, no user site) with an empty
    environment, in a fresh temporary directory that is deleted afterwards, under limits on address
    space (memory_mb), CPU time and file size, in its own process group that is killed at the end
    (so a timeout also stops anything it started), and with sockets disabled. With
    `isolate_network` and a working `unshare`, it also runs in an empty network namespace.
    It is not a security boundary: the program can read and write whatever the user can.
    """
    launcher = SANDBOX_LAUNCHER.format(memory_bytes=memory_mb * 2**20, cpu_seconds=math.ceil(timeout_s) + 1,
                                       file_bytes=SANDBOX_OUTPUT_MB * 2**20)
    namespace = network_namespace_command() if isolate_network else ()
    with tempfile.TemporaryDirectory(prefix="diversed-sandbox-") as workdir:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(os.path.join(workdir, "stderr.txt"), "w+b") as stderr:
            process = subprocess.Popen([*namespace, sys.executable, "-I", "-c", launcher], cwd=workdir, env={},
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                       start_new_session=True)
            timed_out = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 2000))  # the last 2000 bytes
            tail = stderr.read().decode("utf-8", "replace").strip()
    if timed_out:
        return SandboxResult(False, "timeout", f"stopped after {timeout_s:g} s")
    if process.returncode == 0:
        return SandboxResult(True, "passed", tail)
    if process.returncode < 0:
        tail = f"killed by {signal.Signals(-process.returncode).name}\n{tail}".strip()
    return SandboxResult(False, "failed", tail)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program and every process it started (they share its session's process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def defines_function(code: str, name: str) -> bool:
    return bool(name) and re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def extract_code(output_text: str, entry_point: str = "") -> str:
    """The code in a model's answer: the first ``` block that defines `entry_point` (else the first
    block); the whole text if there is no fence (a raw continuation)."""
    blocks = FENCE.findall(output_text)
    if not blocks:
        return output_text
    return next((b for b in blocks if defines_function(b, entry_point)), blocks[0])


def build_program(example: Example, code: str) -> str:
    """The solution followed by the example's tests.

    HumanEval examples carry `code_prefix` (imports, signature, docstring). A completion that
    continues the body is appended to it, cut at the first top-level statement; a completion that
    writes the whole function replaces the body: the prefix's function is stubbed with `pass` so its
    imports and helpers stay, and the model's definition, coming later, is the one tested.
    """
    if example.code_prefix:
        if defines_function(code, example.entry_point):
            code = example.code_prefix + "    pass\n\n" + code
        else:
            cut = min((i for i in (code.find(s) for s in BODY_STOPS) if i >= 0), default=len(code))
            code = example.code_prefix + code[:cut]
    return code + "\n\n" + example.test_code + "\n"


def pass_at_1(example: Example, output_text: str, timeout_s: float = SANDBOX_TIMEOUT_S) -> float:
    """1.0 if the code in `output_text` passes the example's tests in the sandbox, else 0.0."""
    if not example.test_code:
        raise ValueError(f"example {example.id!r} has no tests")
    program = build_program(example, extract_code(output_text, example.entry_point))
    return float(run_sandboxed(program, timeout_s).passed)


# ---------------------------------------------------------------------------------------------------
# Fidelity: task-free, dense


@torch.no_grad()
def fidelity(pair, prompt_ids: list[int], output_ids: list[int]) -> float:
    """Mean log-probability per token of `output_ids` under the target, given `prompt_ids`.

    Near 0 means the target would have written this output itself; it needs no reference, so it
    rewards staying faithful to the target on any prompt. One forward pass over prompt + output.
    """
    if not prompt_ids or not output_ids:
        raise ValueError("fidelity needs a non-empty prompt and output")
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=pair.target.device)
    logits = pair.target(input_ids=ids).logits[0, len(prompt_ids) - 1: -1, : pair.vocab_size]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, ids[0, len(prompt_ids):, None])
    return chosen.mean().item()


# ---------------------------------------------------------------------------------------------------
# The dispatcher


def quality(task: str, example: Example, output_text: str) -> dict[str, float]:
    """Reference-based metrics of an output for `task` ({} for a general example without reference).

    summarization: rouge2, rougeL; math: exact_match; code: pass@1; general: ROUGE if the example has a
    reference (e.g. a translation), since there is no task-specific check.
    """
    if task == "code":
        return {"pass@1": pass_at_1(example, output_text)}
    if example.reference is None:
        if task == "general":
            return {}
        raise ValueError(f"the {task} metric needs a reference, and example {example.id!r} has none")
    if task == "math":
        return {"exact_match": math_exact_match(output_text, example.reference)}
    if task in ("summarization", "general"):
        return rouge(output_text, example.reference)
    raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")


def task_reward(task: str, example: Example, output_text: str, pair=None, prompt_ids: list[int] | None = None,
                output_ids: list[int] | None = None) -> float:
    """The sequence-level reward of one output: `task` picks the reward, `example` holds what it needs.

    summarization: ROUGE-2 F1; math: final-number exact match; code: pass@1 (sandboxed);
    general: fidelity (needs pair, prompt_ids and output_ids), usable on any example.
    """
    if task == "general":
        if pair is None or prompt_ids is None or output_ids is None:
            raise ValueError("the general reward (fidelity) needs pair, prompt_ids and output_ids")
        return fidelity(pair, prompt_ids, output_ids)
    if task not in PRIMARY_METRIC:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    return quality(task, example, output_text)[PRIMARY_METRIC[task]]
