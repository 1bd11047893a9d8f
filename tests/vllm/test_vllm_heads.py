"""Learned heads inside a running vLLM engine on the embedded pair (fp32, probabilistic EAGLE-3 drafting):
the hidden states a head reads there are this project's, heads relax, mixed batches, and the refusals."""

import json
import os

import pytest
import torch
from vllm_helpers import generate, record_head_inputs, recorded_head_inputs

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a prime is."]
SERVED = {"diversed_heads": ["general", "general-cost"]}
# fp32 on both sides; what is left is the order of floating-point sums in two implementations
HIDDEN_TOLERANCE = 1e-3  # largest difference, relative to the largest magnitude of the state


def engine(drafting="probabilistic", **additional_config):
    from vllm import LLM

    from diversed_demo.vllm.engine import default_draft, embedded_target_dir, engine_kwargs

    kwargs = engine_kwargs(
        embedded_target_dir(), default_draft(), n_draft=4, dtype="float32", drafting=drafting
    )
    return LLM(**kwargs, additional_config=additional_config)


@pytest.fixture(scope="module")
def head_engine():
    # the tests read what a worker's heads were fed through collective_rpc, which sends functions by pickle
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    llm = engine(**SERVED)
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"]


@pytest.fixture(scope="module")
def prompts(head_engine):
    from diversed_demo.core.prompt import encode_prompt

    return [encode_prompt(head_engine.get_tokenizer(), q) for q in QUESTIONS]


def relative_gap(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def test_the_hidden_states_a_head_reads_in_vllm_are_the_projects(head_engine, prompts):
    """The first verification after the prefill: vLLM's target and draft hidden states at the four drafted
    tokens equal what this project records for the same prefix and the same drafts (training/positions.py,
    which equals the decoder's own target pass and draft chain)."""
    from diversed_demo.models.loading import load_models
    from diversed_demo.training.positions import teacher_forced_positions
    from diversed_demo.vllm.engine import default_draft, embedded_target_dir

    head_engine.collective_rpc(record_head_inputs)
    (ids,), _ = generate(head_engine, prompts[:1], temperature=1.0, head="general", seed=1)
    (records,) = head_engine.collective_rpc(recorded_head_inputs)
    first = next(record for record in records if record["drafts"])  # a prefill's step verifies nothing
    assert len(first["drafts"]) == 4 and first["target"].shape == first["draft"].shape == (4, 576)
    pair = load_models(embedded_target_dir(), str(default_draft()), device="cpu", dtype="float32")
    record = {"prompt_ids": prompts[0] + ids[:1], "response_ids": first["drafts"], "held_out": False}
    ours = teacher_forced_positions(pair, [record], temperature=1.0, n_draft=4)
    assert relative_gap(first["target"], ours["target_hidden"]) < HIDDEN_TOLERANCE
    assert relative_gap(first["draft"], ours["draft_hidden"]) < HIDDEN_TOLERANCE


def test_heads_relax_sampled_decoding_and_a_cost_heads_lambda_is_its_dial(head_engine, prompts):
    exact = generate(head_engine, prompts, temperature=1.0, w=1.0, seed=3)[1]
    general = generate(head_engine, prompts, temperature=1.0, head="general", seed=3)[1]
    cost = {
        lam: generate(head_engine, prompts, temperature=1.0, head="general-cost", lam=lam, seed=3)[1]
        for lam in (0.5, 8.0)
    }
    # vLLM samples drafts from its own stream, so these are compared with room to spare
    assert exact < general and cost[0.5] < cost[8.0] and exact < cost[8.0], (exact, general, cost)


def test_a_mixed_greedy_batch_serves_each_row_as_alone(head_engine, prompts):
    """One batch of requests with no verifier, a static w, the rule and a head: each row's text is the one
    that request gets alone."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    verifiers = [None, {"diversed_w": 0.7}, {"diversed_lambda": 1.0}, {"diversed_head": "general"}]
    params = [SamplingParams(temperature=0, max_tokens=32, extra_args=v) for v in verifiers]
    batch = [TokensPrompt(prompt_token_ids=prompts[i % len(prompts)]) for i in range(len(verifiers))]
    together = head_engine.generate(batch, params, use_tqdm=False)
    for prompt, param, output in zip(batch, params, together):
        (alone,) = head_engine.generate([prompt], param, use_tqdm=False)
        assert output.outputs[0].token_ids == alone.outputs[0].token_ids, param.extra_args


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"diversed_head": "nope"}, "diversed_head 'nope' is not served here \\(heads served: general, "),
        ({"diversed_head": "../general"}, "diversed_head must be a head's name"),
        ({"diversed_head": "general", "diversed_lambda": 2}, "only a cost head takes a diversed_lambda"),
        ({"diversed_head": "general", "diversed_w": 0.5}, "not both"),
    ],
)
def test_a_bad_head_request_is_refused_and_the_engine_keeps_serving(head_engine, prompts, fields, message):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=message):
        head_engine.generate(
            [{"prompt_token_ids": prompts[0]}],
            SamplingParams(max_tokens=4, extra_args=fields),
            use_tqdm=False,
        )
    assert len(generate(head_engine, prompts[:1], head="general")[0][0]) > 0


def another_pairs_head(folder) -> str:
    """heads/general.safetensors, its pair's draft fingerprint changed: a head trained for another draft."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from diversed_demo.common.paths import HEADS_DIR

    with safe_open(str(HEADS_DIR / "general.safetensors"), framework="pt") as f:
        metadata, weights = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
    meta = json.loads(metadata["meta"])
    meta["pair"]["draft_fingerprint"] = "0" * 16
    path = folder / "other.safetensors"
    save_file(weights, str(path), metadata={**metadata, "meta": json.dumps(meta)})
    return str(path)


def test_a_head_the_engine_cannot_serve_stops_it_at_start(tmp_path):
    with pytest.raises(ValueError, match="head 'other' .* belongs to another pair .* draft model differs"):
        engine(diversed_heads={"other": another_pairs_head(tmp_path)})
    with pytest.raises(ValueError, match='needs "draft_sample_method": "probabilistic"'):
        engine(drafting="greedy", **SERVED)
    with pytest.raises(ValueError, match="no head 'missing'"):
        engine(diversed_heads=["missing"])
