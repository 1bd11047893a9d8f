"""A few checks on the real embedded pair (SmolLM2-135M-Instruct target and the shipped draft)."""
import json
import subprocess
import sys

import pytest

from diversed_demo.decode import generate
from diversed_demo.models import load_pair

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def embedded():
    return load_pair()


def test_embedded_pair_shares_the_target_embedding(embedded):
    assert embedded.draft.get_input_embeddings().weight is embedded.target.get_input_embeddings().weight
    assert embedded.draft.config.num_hidden_layers < embedded.target.config.num_hidden_layers
    assert embedded.tokenizer.chat_template  # chat prompts go through the template


def test_greedy_exact_sd_equals_greedy_target_on_embedded_pair(embedded):
    prompt = "Name three primary colors."
    reference, _ = generate(embedded, prompt, mode="ar", max_new_tokens=24, temperature=0)
    summary, _ = generate(embedded, prompt, mode="exact", n_draft=4, max_new_tokens=24, temperature=0)
    assert summary.token_ids == reference.token_ids
    assert reference.text.strip()


def test_cli_generate_json_on_embedded_pair():
    out = subprocess.run([sys.executable, "-m", "diversed_demo.cli", "generate", "--prompt", "What is 2 + 3?",
                          "--mode", "static", "--w", "0.5", "--max-new-tokens", "12", "--seed", "1", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result["summary"]) == {"acceptance_rate", "tau", "new_tokens", "tokens_per_second", "wall_time_s"}
    emitted = [e for e in result["events"] if e["kind"] != "rejected"]
    assert len(emitted) == result["summary"]["new_tokens"] <= 12
    assert {"token_id", "text", "kind", "w", "p", "q", "accept_prob"} <= set(result["events"][0])


def test_cli_plain_output_and_bad_input():
    out = subprocess.run([sys.executable, "-m", "diversed_demo.cli", "generate", "--prompt", "Say hi.",
                          "--mode", "exact", "--max-new-tokens", "8", "--temperature", "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "acceptance" in out.stdout and "tok/s" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "diversed_demo.cli", "generate", "--prompt", "Hi", "--w", "2"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "ensemble weight" in bad.stderr and "Traceback" not in bad.stderr
