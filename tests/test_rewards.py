import socket
import time
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from tiny import tiny_pair

from diversed_demo.eval.code_reward import build_program, extract_code, pass_at_1
from diversed_demo.eval.rewards import (
    SUMMARIZATION_REWARD,
    fidelity,
    final_number,
    math_exact_match,
    quality,
    rouge,
    task_reward,
)
from diversed_demo.eval.sandbox import network_namespace_command, run_sandboxed
from diversed_demo.eval.tasks import Example, humaneval_example, mbpp_example

# ---------------------------------------------------------------------------------------------------
# Summarization


def test_rouge_identical_vs_unrelated():
    summary = "The council approved a new bridge over the river after a long debate."
    same = rouge(summary, summary)
    unrelated = rouge("Bananas are rich in potassium and grow in warm climates.", summary)
    assert same["rouge2"] == pytest.approx(1.0) and same["rougeL"] == pytest.approx(1.0)
    assert unrelated["rouge2"] == 0.0 and unrelated["rougeL"] < 0.2


def test_rouge_uses_stemming():
    assert rouge("the councils approved bridges", "the council approves bridge")["rouge2"] == pytest.approx(
        1.0
    )


def test_summarization_reward_is_rouge2():
    example = Example("Summarize the following article:\n...", "summarization", "a new bridge opens in town")
    output = "the new bridge opens next week"
    assert task_reward("summarization", example, output) == pytest.approx(
        rouge(output, example.reference)["rouge2"]
    )
    assert SUMMARIZATION_REWARD == "rouge2"


# ---------------------------------------------------------------------------------------------------
# Math


@pytest.mark.parametrize(
    "text, number",
    [
        ("She sells 9 eggs at $2 each.\n#### 18", "18"),
        ("#### 1,234", "1234"),
        ("So the total is $1,250.50.", "1250.50"),
        ("First 3 + 4 = 7, then 7 * 2 = 14.", "14"),
        ("The answer is \\boxed{42}, not 41.", "42"),
        ("It dropped to -5 degrees.", "-5"),
        ("10-5", "5"),  # a subtraction, not a negative number
        ("There are 2,000 people in 3 towns. ", "3"),
    ],
)
def test_final_number(text, number):
    assert final_number(text) == Decimal(number)


def test_final_number_none_without_numbers():
    assert final_number("I am not sure.") is None


def test_math_exact_match():
    reference = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert math_exact_match("In total she sold 72 clips.", reference) == 1.0
    assert math_exact_match("In total she sold 72.00 clips.", reference) == 1.0
    assert math_exact_match("She sold 72 in April and 24 in May.", reference) == 0.0  # the last number counts
    assert math_exact_match("She sold 70 clips.", reference) == 0.0
    assert math_exact_match("No idea.", reference) == 0.0
    assert task_reward("math", Example("q", "math", reference), "#### 72") == 1.0


# ---------------------------------------------------------------------------------------------------
# Code: extraction and program assembly

MBPP_ROW = {
    "task_id": 999,
    "text": "Write a function to add two numbers.",
    "code": "def add(a, b):\r\n    return a + b",
    "test_setup_code": "",
    "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
}
HUMANEVAL_PROBLEM = {
    "task_id": "Toy/0",
    "entry_point": "double",
    "prompt": (
        'from typing import List\n\n\ndef double(xs: List[int]) -> List[int]:\n    """Double each."""\n'
    ),
    "canonical_solution": "    return [2 * x for x in xs]\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == [2, 4]\n    assert candidate([]) == []\n",
}


def test_extract_code_prefers_block_defining_entry_point():
    text = (
        "Example:\n```python\nprint(add(1, 2))\n```\n"
        "Solution:\n```python\ndef add(a, b):\n    return a + b\n```"
    )
    assert extract_code(text, "add").startswith("def add")
    assert extract_code("def add(a, b): return a + b", "add") == "def add(a, b): return a + b"
    assert extract_code("```python\ndef add(a, b):\n    return a + b", "add").startswith(
        "def add"
    )  # unclosed


def test_mbpp_correct_passes_wrong_fails():
    example = mbpp_example(MBPP_ROW)
    assert example.entry_point == "add"
    assert pass_at_1(example, "```python\ndef add(a, b):\n    return a + b\n```") == 1.0
    assert pass_at_1(example, "```python\ndef add(a, b):\n    return a - b\n```") == 0.0
    assert pass_at_1(example, "```python\ndef add(a, b)\n    return a + b\n```") == 0.0  # syntax error


def test_mbpp_setup_code_runs_after_solution():
    row = dict(
        MBPP_ROW,
        code="class Box:\n    def __init__(self, v):\n        self.v = v\ndef add(a, b):\n    return a.v + b",
        test_setup_code="box = Box(2)",
        test_list=["assert add(box, 1) == 3"],
    )
    example = mbpp_example(row)
    assert task_reward("code", example, example.reference) == 1.0


def test_humaneval_body_and_whole_function():
    example = humaneval_example(HUMANEVAL_PROBLEM)
    body = "    return [2 * x for x in xs]\n\n\ndef unrelated():\n    raise SystemExit(1)\n"
    assert pass_at_1(example, body) == 1.0  # cut at the next top-level def
    whole = "```python\ndef double(xs: List[int]) -> List[int]:\n    return [x + x for x in xs]\n```"
    assert pass_at_1(example, whole) == 1.0  # uses List from the prompt's imports
    assert pass_at_1(example, "    return xs\n") == 0.0
    assert "check(double)" in build_program(example, body)


def test_humaneval_canonical_solutions_pass():
    from diversed_demo.eval.tasks import load_humaneval

    for example in load_humaneval(limit=3):
        assert pass_at_1(example, example.reference) == 1.0


# ---------------------------------------------------------------------------------------------------
# Code: the sandbox


def test_sandbox_timeout_stops_infinite_loop():
    start = time.perf_counter()
    result = run_sandboxed("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert time.perf_counter() - start < 5


def test_sandbox_timeout_kills_children(tmp_path):
    # A background child would outlive a kill of the program alone; the whole process group must go.
    started, late = tmp_path / "started", tmp_path / "late"
    child = (
        f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(1.5); "
        f"pathlib.Path({str(late)!r}).touch()"
    )
    program = (
        f"import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"while not os.path.exists({str(started)!r}):\n    time.sleep(0.01)\nwhile True:\n    pass\n"
    )
    assert run_sandboxed(program, timeout_s=1.0).status == "timeout"
    time.sleep(1.0)
    assert started.exists() and not late.exists()


def test_sandbox_memory_limit():
    # Without RLIMIT_AS this succeeds: the zeroed pages are never touched.
    result = run_sandboxed("buffer = bytearray(4 * 1024**3)\n", memory_mb=512)
    assert not result.passed and "MemoryError" in result.detail


def test_sandbox_removes_temp_dir(tmp_path):
    report = tmp_path / "cwd.txt"
    program = (
        f"import os\nopen({str(report)!r}, 'w').write(os.getcwd())\nopen('scratch.txt', 'w').write('x')\n"
    )
    assert run_sandboxed(program).passed
    workdir = Path(report.read_text())
    assert workdir.name.startswith("diversed-sandbox-") and not workdir.exists()
    # also when the program is stopped by the timeout
    assert run_sandboxed(program + "while True:\n    pass\n", timeout_s=0.5).status == "timeout"
    workdir = Path(report.read_text())
    assert not workdir.exists()


def test_sandbox_has_empty_environment(monkeypatch):
    monkeypatch.setenv("DIVERSED_SECRET", "x")
    assert run_sandboxed("import os\nassert os.environ.get('DIVERSED_SECRET') is None\n").passed
    assert not run_sandboxed("raise SystemExit(3)\n").passed


def test_sandbox_runs_the_program_as_written():
    # A __future__ import must come first in a file, and tracebacks should point at the program's own lines.
    result = run_sandboxed("from __future__ import annotations\n\n\nraise ValueError('wrong')\n")
    assert 'program.py", line 4' in result.detail and "ValueError: wrong" in result.detail


@pytest.fixture
def listening_server():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    yield server
    server.close()


def assert_nothing_connected(server):
    with pytest.raises(TimeoutError):
        server.accept()


@pytest.mark.parametrize("isolate_network", [False, True])
def test_sandbox_blocks_sockets(listening_server, isolate_network):
    port = listening_server.getsockname()[1]
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
    result = run_sandboxed(program, isolate_network=isolate_network)
    assert not result.passed and "network access is disabled" in result.detail
    assert_nothing_connected(listening_server)


def test_network_namespace_stops_what_the_prelude_cannot(listening_server):
    # A child interpreter does not run the prelude; only the network namespace stops it.
    if not network_namespace_command():
        pytest.skip("unshare cannot create a network namespace on this machine")
    port = listening_server.getsockname()[1]
    child = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')"
    program = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n"
    assert not run_sandboxed(program).passed
    assert_nothing_connected(listening_server)


# ---------------------------------------------------------------------------------------------------
# Fidelity and the dispatcher


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def greedy_continuation(pair, prompt_ids, n):
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = pair.target(input_ids=torch.tensor([ids])).logits[0, -1, : pair.vocab_size]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]


def test_fidelity_prefers_the_targets_own_continuation(pair):
    prompt_ids = pair.tokenizer("the cat sat on the mat", add_special_tokens=True)["input_ids"]
    own = greedy_continuation(pair, prompt_ids, 12)
    random_ids = torch.randint(4, pair.vocab_size, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    assert fidelity(pair, prompt_ids, own) > fidelity(pair, prompt_ids, random_ids) + 1.0
    assert fidelity(pair, prompt_ids, own) <= 0.0
    example = Example("the cat sat on the mat", "general")
    assert task_reward("general", example, "", pair, prompt_ids, own) == fidelity(pair, prompt_ids, own)


def test_fidelity_ignores_padded_logit_columns(pair):
    # A checkpoint may pad its LM head beyond the shared vocabulary; those columns must not count.
    prompt_ids, output_ids = [1, 5, 6], [7, 8]
    before = fidelity(pair, prompt_ids, output_ids)
    padded = tiny_pair(draft=pair.draft)
    head = padded.target.lm_head
    wide = torch.nn.Linear(head.in_features, head.out_features + 8, bias=False)
    with torch.no_grad():
        wide.weight[: head.out_features] = head.weight
        wide.weight[head.out_features :] = head.weight[output_ids[0]]  # would take probability from it
    padded.target.lm_head = wide
    assert fidelity(padded, prompt_ids, output_ids) == pytest.approx(before, abs=1e-5)


def test_dispatcher_errors_are_clear():
    with pytest.raises(ValueError, match=r"\(fidelity\) needs pair"):
        task_reward("general", Example("p", "general"), "text")
    with pytest.raises(ValueError, match="unknown task"):
        task_reward("poetry", Example("p", "general"), "text")
    with pytest.raises(ValueError, match="needs a reference"):
        task_reward("summarization", Example("p", "summarization"), "text")


def test_quality():
    assert quality("general", Example("p", "general"), "anything") == {}
    assert set(quality("general", Example("p", "general", "a reference"), "a reference")) == {
        "rouge2",
        "rougeL",
    }
    assert quality("math", Example("q", "math", "#### 3"), "three is 3") == {"exact_match": 1.0}
    assert quality("code", mbpp_example(MBPP_ROW), "def add(a, b):\n    return b + a\n") == {"pass@1": 1.0}
