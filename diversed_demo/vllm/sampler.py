"""The worker side of the plugin: each step's w (or the per-token rule's λ) per request, and vLLM 0.32's
rejection sampling with them.

vLLM's V1 model runner calls `RejectionSampler.forward`, which calls the module function `rejection_sample`.
The plugin wraps the runner's `_sample` (it knows the requests; the sampler does not) to publish this step's
weights, and replaces `rejection_sample` with `ensemble_rejection_sample`, which reads them. A step where
every request has w = 1 runs vLLM's own function untouched.
"""

from __future__ import annotations

import math
from contextvars import ContextVar

import torch
from vllm.v1.sample import rejection_sampler as upstream
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from .rule import (
    LAMBDA_KEY,
    WEIGHT_KEY,
    ensemble_argmax,
    ensemble_uniforms,
    parse_ensemble_weight,
    parse_lambda,
    request_verifier,
    rule_weights,
)
from .rule import token_weights as spread_to_tokens

# [batch] w of this step's requests, or None when all are exact; set only around one `_sample` call
STEP_WEIGHTS: ContextVar[torch.Tensor | None] = ContextVar("diversed_step_weights", default=None)
# [batch] λ of this step's requests under the per-token rule (NaN for the others), or None when none is
STEP_LAMBDAS: ContextVar[torch.Tensor | None] = ContextVar("diversed_step_lambdas", default=None)
UPSTREAM_REJECTION_SAMPLE = upstream.rejection_sample
UPSTREAM_SAMPLE = GPUModelRunner._sample


def server_weight(vllm_config) -> float:
    """The server's default w (`additional_config={"diversed_w": w}`); 1 (exact) when it sets none."""
    config = vllm_config.additional_config
    if isinstance(config, dict) and WEIGHT_KEY in config:
        return parse_ensemble_weight(config[WEIGHT_KEY], f"additional_config's {WEIGHT_KEY}")
    return 1.0


def server_lambda(vllm_config) -> float:
    """The server's default λ of the per-token rule (`additional_config={"diversed_lambda": λ}`); NaN (no
    rule) when it sets none. A server default of both w and λ is refused."""
    config = vllm_config.additional_config
    if not (isinstance(config, dict) and LAMBDA_KEY in config):
        return math.nan
    if WEIGHT_KEY in config:
        raise ValueError(f"additional_config sets {WEIGHT_KEY} and {LAMBDA_KEY}: set one server verifier")
    return parse_lambda(config[LAMBDA_KEY], f"additional_config's {LAMBDA_KEY}")


def batch_verifiers(runner, num_requests: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The first `num_requests` requests' w and λ, in the batch's order: ([batch] w, None if all are 1;
    [batch] λ, NaN where a request has no rule, None if none has)."""
    default_w, default_lam = server_weight(runner.vllm_config), server_lambda(runner.vllm_config)
    pairs = [
        request_verifier(runner.requests[req_id].sampling_params.extra_args, default_w, default_lam)
        for req_id in runner.input_batch.req_ids[:num_requests]
    ]
    weights, lams = [w for w, _ in pairs], [lam for _, lam in pairs]
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float32, device=runner.device)  # noqa: E731
    return (
        None if all(w == 1.0 for w in weights) else as_tensor(weights),
        None if all(math.isnan(lam) for lam in lams) else as_tensor(lams),
    )


def batch_weights(runner, num_requests: int) -> torch.Tensor | None:
    """w of the first `num_requests` requests of the runner's batch, in its order; None if all are 1."""
    return batch_verifiers(runner, num_requests)[0]


def sample_with_ensemble_weights(self, logits, spec_decode_metadata):
    """GPUModelRunner._sample with this step's weights and λ published for `ensemble_rejection_sample`."""
    if spec_decode_metadata is None:
        return UPSTREAM_SAMPLE(self, logits, spec_decode_metadata)
    weights, lams = batch_verifiers(self, len(spec_decode_metadata.num_draft_tokens))
    tokens = STEP_WEIGHTS.set(weights), STEP_LAMBDAS.set(lams)
    try:
        return UPSTREAM_SAMPLE(self, logits, spec_decode_metadata)
    finally:
        STEP_WEIGHTS.reset(tokens[0])
        STEP_LAMBDAS.reset(tokens[1])


def ensemble_rejection_sample(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_logits,
    bonus_token_ids,
    sampling_metadata,
    synthetic_mode=False,
    synthetic_conditional_rates=None,
    use_fp64_gumbel=False,
):
    """vLLM 0.32's `rejection_sample` (same arguments, kernels, and random draws in the same order) verifying
    against nu = w·p + (1 − w)·q: shifted uniforms for sampled requests, argmax nu for greedy ones."""
    weights, lams = STEP_WEIGHTS.get(), STEP_LAMBDAS.get()
    if (weights is None and lams is None) or synthetic_mode:
        return UPSTREAM_REJECTION_SAMPLE(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, synthetic_mode, synthetic_conditional_rates, use_fp64_gumbel,
        )  # fmt: skip
    device, meta = target_logits.device, sampling_metadata
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # once, for every path below
    weights = token_verdict_weights(
        weights, lams, num_draft_tokens, target_probs, draft_token_ids, draft_probs, meta
    )
    output_token_ids = torch.full(
        (len(num_draft_tokens), max_spec_len + 1),
        upstream.PLACEHOLDER_TOKEN_ID,
        dtype=torch.int32,
        device=device,
    )
    greedy = None if meta.all_greedy else meta.temperature == upstream.GREEDY_TEMPERATURE
    uniform_probs = None
    if not meta.all_greedy:  # drawn first, as upstream does, so seeded requests see the same stream
        uniform_probs = upstream.generate_uniform_probs(
            draft_token_ids.shape[0], num_draft_tokens, meta.generators, device
        )
    if not meta.all_random:
        target_argmax = ensemble_argmax(target_logits.argmax(dim=-1), target_probs, draft_token_ids, weights)
        upstream._rejection_greedy_sample(
            output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, greedy,
            max_spec_len, None, None,
        )  # fmt: skip
        if meta.all_greedy:
            return output_token_ids
    recovered_token_ids = upstream.sample_recovered_tokens(
        max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, meta,
        device, use_fp64_gumbel,
    )  # fmt: skip
    upstream._rejection_random_sample(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
        recovered_token_ids, ensemble_uniforms(uniform_probs, weights), greedy, max_spec_len, None,
    )  # fmt: skip
    return output_token_ids


def token_verdict_weights(weights, lams, num_draft_tokens, target_probs, draft_token_ids, draft_probs, meta):
    """[num_tokens] w per drafted token: its request's static w, or where the request has a λ, the per-token
    rule's w_t from p and q (greedy or sampled by the request's temperature)."""
    batch, device = len(num_draft_tokens), target_probs.device
    request_w = weights.to(device) if weights is not None else torch.ones(batch, device=device)
    per_token = spread_to_tokens(request_w, num_draft_tokens)
    if lams is None:
        return per_token
    if meta.all_greedy or meta.all_random:
        greedy_requests = torch.full((batch,), bool(meta.all_greedy), device=device)
    else:
        greedy_requests = meta.temperature == upstream.GREEDY_TEMPERATURE
    token_lams = spread_to_tokens(lams.to(device), num_draft_tokens)
    greedy = spread_to_tokens(greedy_requests.to(device), num_draft_tokens)
    rule = rule_weights(target_probs, draft_token_ids, draft_probs, token_lams.nan_to_num(0.0), greedy)
    return torch.where(token_lams.isnan(), per_token, rule)
