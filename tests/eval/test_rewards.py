import socket
import subprocess
import tempfile
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
from diversed_demo.eval.sandbox import SANDBOX_PROCESSES, run_sandboxed
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


def test_nothing_the_program_started_outlives_the_call():
    # A grandchild in a session of its own escapes a process-group kill; the PID namespace's end takes it.
    marker = f"diversed-survivor-{time.monotonic_ns()}"
    child = f"import time; time.sleep(30)  # {marker}"
    program = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)\n"
    )
    assert run_sandboxed(program).passed
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""
    assert run_sandboxed(program + "while True:\n    pass\n", timeout_s=1.0).status == "timeout"
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""


def test_sandbox_memory_limit():
    # Without RLIMIT_AS this succeeds: the zeroed pages are never touched.
    result = run_sandboxed("buffer = bytearray(4 * 1024**3)\n", memory_mb=512)
    assert not result.passed and "MemoryError" in result.detail


def test_a_fork_bomb_stops_at_the_process_limit():
    program = (
        "import os, time\nforked = 0\n"
        "try:\n    for _ in range(10000):\n        if os.fork() == 0:\n            time.sleep(5)\n"
        "            os._exit(0)\n        forked += 1\n"
        "except OSError:\n    raise SystemExit(f'stopped after {forked} forks')\n"
    )
    result = run_sandboxed(program, timeout_s=20)
    assert not result.passed and "stopped after" in result.detail
    assert int(result.detail.split("stopped after ")[1].split()[0]) < SANDBOX_PROCESSES


def test_the_program_writes_only_its_own_folder(tmp_path):
    outside = tmp_path / "escaped.txt"
    program = f"open({str(outside)!r}, 'w').write('x')\n"
    assert not run_sandboxed(program).passed and not outside.exists()
    folders = set(Path(tempfile.gettempdir()).glob("diversed-sandbox-*"))
    assert run_sandboxed(
        "open('scratch.txt', 'w').write('x')\nimport os\nassert os.getcwd() == '/sandbox'\n"
    ).passed
    assert run_sandboxed("while True:\n    pass\n", timeout_s=0.5).status == "timeout"
    assert set(Path(tempfile.gettempdir()).glob("diversed-sandbox-*")) <= folders  # each deleted after use


def test_the_program_sees_neither_the_servers_environment_nor_its_processes(monkeypatch):
    monkeypatch.setenv("DIVERSED_SECRET", "hunter2")
    program = (
        "import os, glob\nassert os.environ.get('DIVERSED_SECRET') is None\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n        assert b'hunter2' not in open(path, 'rb').read()\n"
        "    except PermissionError:\n        pass\n"
        "assert os.getppid() <= 1 and len(glob.glob('/proc/[0-9]*')) < 5\n"
    )
    result = run_sandboxed(program)
    assert result.passed, result.detail
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


def test_no_socket_reaches_the_host(listening_server):
    port = listening_server.getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')"
    assert not run_sandboxed(connect + "\n").passed
    # nor from a child interpreter, nor through the socket type's base class
    via_child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {connect!r}], check=True)\n"
    assert not run_sandboxed(via_child).passed
    raw = (
        "import _socket\ns = _socket.socket.__bases__[0](_socket.AF_INET, _socket.SOCK_STREAM)\n"
        f"s.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
    )
    assert not run_sandboxed(raw).passed
    with pytest.raises(TimeoutError):
        listening_server.accept()


def test_without_isolation_code_is_refused_never_run(monkeypatch):
    import diversed_demo.eval.sandbox as sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation_problem.cache_clear()
    try:
        result = run_sandboxed("print('ran')\n")
        assert result.status == "refused" and result.isolation == () and "bubblewrap" in result.detail
        example = Example("p", "code", None, "t", "t", "assert True\n", "f")
        with pytest.raises(ValueError, match="never run without isolation"):
            pass_at_1(example, "def f():\n    return 1\n")
    finally:
        monkeypatch.undo()
        sandbox.isolation_problem.cache_clear()


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
