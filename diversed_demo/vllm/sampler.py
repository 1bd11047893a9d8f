"""The worker side of the plugin: each step's verifier per request (a static w, the per-token rule's λ, or a
learned head), and vLLM 0.32's rejection sampling with them.

vLLM's V1 model runner calls `RejectionSampler.forward`, which calls the module function `rejection_sample`.
The plugin wraps the runner's `_sample` (it knows the requests; the sampler does not) to publish this step's
verifiers (with, for heads, the hidden states hidden.py carries), and replaces `rejection_sample` with
`ensemble_rejection_sample`, which reads them. A step where every request is exact runs vLLM's own
function untouched.
"""

from __future__ import annotations

import dataclasses
import math
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch.nn.functional import one_hot
from vllm.logger import init_logger
from vllm.v1.sample import rejection_sampler as upstream
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from ..core.config import DecodeConfig
from ..core.head import weight_rule
from .head_clock import head_work
from .heads import head_setting, worker_heads
from .hidden import step_hidden
from .rule import (
    HEAD_KEY,
    LAMBDA_KEY,
    WEIGHT_KEY,
    Verifier,
    ensemble_argmax,
    ensemble_uniforms,
    parse_ensemble_weight,
    parse_head_name,
    parse_lambda,
    request_verifier,
    rule_weights,
)
from .rule import token_weights as spread_to_tokens


@dataclass(frozen=True)
class StepVerifiers:
    """One step's verifiers, per request in the batch's order; None where no request uses that kind."""

    weights: torch.Tensor | None = None  # [batch] static w, 1 where none
    lams: torch.Tensor | None = None  # [batch] the per-token rule's λ, NaN where none
    heads: list | None = None  # [batch] (head module, its λ or NaN) or None
    hidden: tuple | None = None  # (target [num_tokens, H], draft [num_tokens, Hd]) for the heads


# this step's verifiers, or None when all are exact; set only around one `_sample` call
STEP: ContextVar[StepVerifiers | None] = ContextVar("diversed_step_verifiers", default=None)
UPSTREAM_REJECTION_SAMPLE = upstream.rejection_sample
UPSTREAM_SAMPLE = GPUModelRunner._sample
logger = init_logger(__name__)


def server_verifier(vllm_config) -> Verifier:
    """The server's default verifier (`additional_config={"diversed_w": w}`, `{"diversed_lambda": λ}` or
    `{"diversed_head": name}`); exact when it sets none. The same rules as a request's, with messages that
    name additional_config."""
    config = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
    where = "additional_config's"
    if WEIGHT_KEY in config and (LAMBDA_KEY in config or HEAD_KEY in config):
        raise ValueError(f"additional_config sets {WEIGHT_KEY} beside {LAMBDA_KEY} or {HEAD_KEY}: set one")
    return Verifier(
        w=parse_ensemble_weight(config[WEIGHT_KEY], f"{where} {WEIGHT_KEY}") if WEIGHT_KEY in config else 1.0,
        lam=parse_lambda(config[LAMBDA_KEY], f"{where} {LAMBDA_KEY}") if LAMBDA_KEY in config else math.nan,
        head=parse_head_name(config[HEAD_KEY], f"{where} {HEAD_KEY}") if HEAD_KEY in config else None,
    )


def batch_verifiers(runner, num_requests: int) -> StepVerifiers | None:
    """The first `num_requests` requests' verifiers, in the batch's order; None if all are exact."""
    default = server_verifier(runner.vllm_config)
    verifiers = [
        request_verifier(runner.requests[req_id].sampling_params.extra_args, default)
        for req_id in runner.input_batch.req_ids[:num_requests]
    ]
    if not any(v.relaxed for v in verifiers):
        return None
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float32, device=runner.device)  # noqa: E731
    ruled = [v.head is None and not math.isnan(v.lam) for v in verifiers]
    heads = None
    if any(v.head is not None for v in verifiers):
        served = worker_heads(runner)
        heads = [
            (served[v.head], head_setting(served[v.head], v.lam)) if v.head in served else None
            for v in verifiers
        ]
    return StepVerifiers(
        weights=None if all(v.w == 1.0 for v in verifiers) else as_tensor([v.w for v in verifiers]),
        lams=as_tensor([v.lam if r else math.nan for v, r in zip(verifiers, ruled)]) if any(ruled) else None,
        heads=heads,
    )


def sample_with_ensemble_weights(self, logits, spec_decode_metadata):
    """GPUModelRunner._sample with this step's verifiers published for `ensemble_rejection_sample`."""
    if spec_decode_metadata is None:
        return UPSTREAM_SAMPLE(self, logits, spec_decode_metadata)
    step = batch_verifiers(self, len(spec_decode_metadata.num_draft_tokens))
    if step is not None and step.heads is not None:
        with head_work("gather"):
            hidden = step_hidden(self, spec_decode_metadata)
        if hidden is None:
            logger.warning_once("DIVERSED: a head's hidden states were missing in a step; verified exactly")
        step = dataclasses.replace(step, hidden=hidden)
    token = STEP.set(step)
    try:
        return UPSTREAM_SAMPLE(self, logits, spec_decode_metadata)
    finally:
        STEP.reset(token)


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
    step = STEP.get()
    if step is None or synthetic_mode:
        return UPSTREAM_REJECTION_SAMPLE(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, synthetic_mode, synthetic_conditional_rates, use_fp64_gumbel,
        )  # fmt: skip
    device, meta = target_logits.device, sampling_metadata
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # once, for every path below
    weights = token_verdict_weights(step, num_draft_tokens, target_probs, draft_token_ids, draft_probs, meta)
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
        target_argmax = ensemble_argmax(
            target_logits.argmax(dim=-1), target_probs, draft_token_ids, weights, draft_probs
        )
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


def token_verdict_weights(step, num_draft_tokens, target_probs, draft_token_ids, draft_probs, meta):
    """[num_tokens] w per drafted token: its request's static w; where the request has a λ, the per-token
    rule's w_t from p and q (greedy or sampled by the request's temperature); where it has a head, the
    head's w_t (exact, w = 1, for a step whose hidden states are missing)."""
    batch, device = len(num_draft_tokens), target_probs.device
    request_w = step.weights.to(device) if step.weights is not None else torch.ones(batch, device=device)
    per_token = spread_to_tokens(request_w, num_draft_tokens)
    if meta.all_greedy or meta.all_random:
        greedy_requests = torch.full((batch,), bool(meta.all_greedy), device=device)
    else:
        greedy_requests = meta.temperature == upstream.GREEDY_TEMPERATURE
    greedy = spread_to_tokens(greedy_requests.to(device), num_draft_tokens)
    if step.lams is not None:
        token_lams = spread_to_tokens(step.lams.to(device), num_draft_tokens)
        rule = rule_weights(target_probs, draft_token_ids, draft_probs, token_lams.nan_to_num(0.0), greedy)
        per_token = torch.where(token_lams.isnan(), per_token, rule)
    if step.heads is not None and step.hidden is not None:
        with head_work("evaluate"):
            per_token = with_head_weights(
                per_token, step, num_draft_tokens, target_probs, draft_token_ids, draft_probs, greedy
            )
    return per_token


def with_head_weights(per_token, step, num_draft_tokens, target_probs, draft_token_ids, draft_probs, greedy):
    """per_token [num_tokens] with each head's w_t on its requests' drafted tokens: one call per head (and
    λ) over all of them. q is draft_probs, or the point mass on x where vLLM kept none (greedy drafting).
    A head that reads the p/q terms reads their greedy form on greedy requests' tokens (greedy
    [num_tokens])."""
    target_hidden, draft_hidden = step.hidden
    groups: dict[tuple, list[int]] = {}
    for i, entry in enumerate(step.heads):
        if entry is not None:
            groups.setdefault((id(entry[0]), entry[1]), []).append(i)
    per_token = per_token.clone()
    for requests in groups.values():
        head, lam = step.heads[requests[0]]
        if len(requests) == len(num_draft_tokens):  # every row: no copies of p and q
            rows = slice(None)
        else:
            owners = torch.arange(len(num_draft_tokens)).repeat_interleave(torch.as_tensor(num_draft_tokens))
            rows = torch.isin(owners, torch.tensor(requests)).nonzero().squeeze(-1).to(per_token.device)
            if not len(rows):
                continue
        x = draft_token_ids[rows].clamp_min(0).long()
        p = target_probs[rows]
        q = draft_probs[rows] if draft_probs is not None else one_hot(x, p.shape[-1]).to(p)
        config = DecodeConfig(mode="dynamic", head=head, lam=0.0 if math.isnan(lam) else lam)
        hidden, greedy_rows = (target_hidden[rows], draft_hidden[rows]), greedy[rows]
        reads_pq = getattr(head, "reads_pq", False)
        if reads_pq and greedy_rows.all():  # an all-greedy step computes no sampled terms
            w_t = weight_rule(config, greedy=True)(p, q, x, *hidden)
        else:
            w_t = weight_rule(config, greedy=False)(p, q, x, *hidden)
            if reads_pq and greedy_rows.any():
                w_t = torch.where(greedy_rows, weight_rule(config, greedy=True)(p, q, x, *hidden), w_t)
        per_token[rows] = w_t.to(per_token.dtype)
    return per_token
