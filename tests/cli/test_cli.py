"""The command line refuses bad input at once, in one line, with exit code 2 (no model is loaded first)."""

import os
import subprocess
import sys
import time

import pytest


def run_cli(*args, env=None):
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "diversed_demo.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    return out, time.perf_counter() - start


GENERATE = ["generate", "--prompt", "Hi", "--mode", "static"]


@pytest.mark.parametrize(
    "args, message",
    [
        ([*GENERATE, "--w", "2"], "ensemble weight"),
        ([*GENERATE, "--n-draft", "0"], "--n-draft"),
        ([*GENERATE, "--n-draft", "many"], "--n-draft"),
        ([*GENERATE, "--seed", str(10**30)], "seed"),
        ([*GENERATE, "--mode", "dynamic"], "head"),
        ([*GENERATE, "--mode", "dynamic", "--head", "no-such-head"], "no head 'no-such-head'"),
        (["bench", "--modes", "ar,static:2"], "[0, 1]"),
        (["bench", "--modes", "exact"], "must include ar"),
        (["bench", "--modes", "ar,dynamic:no-such-head"], "no head"),
        (["bench", "--n-draft", "0"], "--n-draft"),
        (["bench", "--app-examples", "0"], "--app-examples"),
        (["bench", "--batch-rows", "1"], "--batch-rows"),
        (["bench", "--vs-llama-cpp", "--target", "HuggingFaceTB/SmolLM2-360M"], "needs a GGUF target"),
        (["frontier", "--weights", "0,2"], "[0, 1]"),
        (["frontier", "--head", "no-such-head"], "no head"),
        (["frontier", "--task", "code", "--set", "gsm8k"], "no held-out set 'gsm8k'"),
        (["table", "--sets", "math:mbpp"], "no held-out set 'mbpp'"),
        (["table", "--sets", "poetry"], "no held-out set"),
        (["table", "--temperatures", "1,hot"], "--temperatures"),
        (["table", "--temperatures", "-1"], "--temperatures"),
        (["table", "--head", "general"], "TASK=HEAD"),
        (["table", "--head", "general=no-such-head"], "no head"),
        (["table", "--limit", "0"], "--limit"),
        (["train", "--task", "general", "--warm-start-prompts", "1"], "warm_start_prompts"),
        (["distill", "transfer", "--drafts", "assets/draft,no/such/draft"], "no/such/draft"),
    ],
)
def test_bad_values_fail_before_the_models_load(args, message, monkeypatch, capsys, heads_dir):
    from diversed_demo import cli
    from diversed_demo.cli import shared

    def load_pair(_args):
        raise AssertionError("the pair was loaded before the values were checked")

    monkeypatch.setattr(shared, "pair_from_args", load_pair)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {}])
def test_a_missing_hub_model_ends_in_one_line_at_once(env):
    out, seconds = run_cli(
        "generate", "--prompt", "Hi", "--target", "no/such-model", "--draft", "no/such-draft", env=env
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no/such-model" in lines[0] and "Traceback" not in out.stderr
    assert seconds < 45  # transformers alone retries the hub for about a minute; a busy CPU slows imports


def test_generate_prints_the_documented_json_and_summary_line(tmp_path, capsys):
    import json

    from tiny import save_tiny_pair

    from diversed_demo import cli

    target, draft = save_tiny_pair(tmp_path)
    pair_args = [
        "--target",
        target,
        "--draft",
        draft,
        "--device",
        "cpu",
        "--no-chat",
        "--max-new-tokens",
        "8",
    ]
    assert cli.main(["generate", "--prompt", "the cat", "--json", *pair_args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["summary"]) == {"acceptance_rate", "tau", "new_tokens", "tokens_per_second", "wall_time_s"}
    assert set(out["events"][0]) == {"token_id", "text", "kind", "w", "p", "q", "accept_prob"}
    assert out["summary"]["new_tokens"] == sum(e["kind"] != "rejected" for e in out["events"])
    assert cli.main(["generate", "--prompt", "the cat", "--mode", "ar", *pair_args]) == 0
    assert (
        capsys.readouterr().out.strip().splitlines()[-1].startswith("acceptance n/a  tau 1.00  new tokens ")
    )


def test_the_llama_cpp_comparison_says_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    from diversed_demo import cli
    from diversed_demo.cli import shared

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )
    monkeypatch.setattr(shared, "pair_from_args", lambda _args: pytest.fail("the pair loaded first"))
    assert cli.main(["bench", "--vs-llama-cpp"]) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err
