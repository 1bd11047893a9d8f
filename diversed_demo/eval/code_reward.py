"""The code reward: extract the program from a model's answer, append the example's tests, and score
pass@1 by running it in the sandbox."""

from __future__ import annotations

import re

from .sandbox import SANDBOX_TIMEOUT_S, run_sandboxed
from .tasks import Example

FENCE = re.compile(r"```[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.S)  # an unclosed last fence runs to the end
# Where a HumanEval body continuation stops (the Codex paper's stop sequences).
BODY_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


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
    result = run_sandboxed(program, timeout_s)
    if result.status == "refused":  # a score of 0 would hide that nothing was run
        raise ValueError(result.detail)
    return float(result.passed)
