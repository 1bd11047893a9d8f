"""The command line refuses bad input at once, in one line, with exit code 2 (no model is loaded first)."""
import os
import subprocess
import sys
import time

import pytest


def run_cli(*args, env=None):
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "diversed_demo.cli", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    return out, time.perf_counter() - start


@pytest.mark.parametrize("args, message", [(["--w", "2"], "ensemble weight"), (["--n-draft", "0"], "n_draft"),
                                           (["--seed", str(10**30)], "seed"), (["--mode", "dynamic"], "head")])
def test_bad_values_fail_before_the_models_load(args, message, monkeypatch, capsys):
    from diversed_demo import cli

    def load_pair(_args):
        raise AssertionError("the pair was loaded before the values were checked")
    monkeypatch.setattr(cli, "pair_from_args", load_pair)
    assert cli.main(["generate", "--prompt", "Hi", "--mode", "static", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {}])
def test_a_missing_hub_model_ends_in_one_line_at_once(env):
    out, seconds = run_cli("generate", "--prompt", "Hi", "--target", "no/such-model", "--draft", "no/such-draft",
                           env=env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no/such-model" in lines[0] and "Traceback" not in out.stderr
    assert seconds < 20  # transformers alone retries the hub for about a minute
