"""The plugin inside a running vLLM engine on the embedded pair (fp32, greedy drafting by EAGLE-3)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_helpers import MAX_TOKENS, generate

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def prompts(embedded_engine):
    from diversed_demo.core.prompt import encode_prompt

    return [encode_prompt(embedded_engine.get_tokenizer(), q) for q in QUESTIONS]


def test_requests_without_w_or_with_w_one_are_served_as_by_vllm_alone(embedded_engine, prompts):
    plain = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("plain_vllm.py"))],
        input=json.dumps({"prompts": prompts, "max_tokens": MAX_TOKENS}),
        env={**os.environ, "VLLM_PLUGINS": ""},  # an allow-list naming no plugin: DIVERSED not loaded
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    line = next(line for line in plain.stdout.splitlines() if line.startswith("REFERENCE "))
    reference = json.loads(line.removeprefix("REFERENCE "))
    assert generate(embedded_engine, prompts)[0] == reference
    assert generate(embedded_engine, prompts, w=1.0)[0] == reference


def test_greedy_requests_accept_more_as_w_falls(embedded_engine, prompts):
    exact_ids, exact = generate(embedded_engine, prompts, w=1.0)
    relaxed_ids, relaxed = generate(embedded_engine, prompts, w=0.8)
    all_ids, everything = generate(embedded_engine, prompts, w=0.5)
    assert exact < relaxed < everything
    # With vLLM's point-mass draft, w·(max p − p(x)) ≤ 1 − w holds for every x once w ≤ 0.5.
    assert everything == 1.0
    assert all(len(ids) > 0 for ids in relaxed_ids + all_ids) and relaxed_ids != exact_ids


def test_sampled_requests_accept_more_as_w_falls(embedded_engine, prompts):
    acceptance = {
        w: generate(embedded_engine, prompts, temperature=1.0, w=w, seed=3)[1] for w in (1.0, 0.5, 0.0)
    }
    assert acceptance[1.0] < acceptance[0.5] < acceptance[0.0] == 1.0
    # seeded: the same request twice is the same decode
    assert generate(embedded_engine, prompts, 1.0, 0.5, seed=3) == generate(
        embedded_engine, prompts, 1.0, 0.5, 3
    )


def test_the_rule_accepts_more_as_lambda_rises_greedy_and_sampled(embedded_engine, prompts):
    for temperature in (0.0, 1.0):
        exact = generate(embedded_engine, prompts, temperature, w=1.0, seed=3)[1]
        rule = {
            lam: generate(embedded_engine, prompts, temperature, seed=3, lam=lam)[1] for lam in (0.5, 8.0)
        }
        assert exact <= rule[0.5] < rule[8.0], (temperature, exact, rule)


def test_a_bad_lambda_or_both_verifiers_are_refused_and_the_engine_keeps_serving(embedded_engine, prompts):
    from vllm.exceptions import VLLMValidationError

    for bad in (-1, math.inf, "2"):
        with pytest.raises(VLLMValidationError, match="diversed_lambda must be"):
            generate(embedded_engine, prompts[:1], lam=bad)
    with pytest.raises(VLLMValidationError, match="not both"):
        generate(embedded_engine, prompts[:1], w=0.5, lam=2.0)
    assert len(generate(embedded_engine, prompts[:1], lam=2.0)[0][0]) > 0


@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan, "abc", "0.5", True, [0.5]])
def test_a_bad_w_is_refused_with_a_message_and_the_engine_keeps_serving(embedded_engine, prompts, bad):
    from vllm.exceptions import VLLMValidationError  # vLLM's request error (HTTP 400 from its server)

    with pytest.raises(VLLMValidationError, match="diversed_w must be"):
        generate(embedded_engine, prompts[:1], w=bad)
    assert len(generate(embedded_engine, prompts[:1], w=0.5)[0][0]) > 0


def test_a_bad_server_default_stops_the_engine_before_it_starts():
    from vllm import LLM

    from diversed_demo.vllm.engine import default_draft, embedded_target_dir, engine_kwargs

    kwargs = engine_kwargs(embedded_target_dir(), default_draft())
    with pytest.raises(ValueError, match="additional_config's diversed_w must be in \\[0, 1\\], not 2"):
        LLM(**kwargs, additional_config={"diversed_w": 2})
