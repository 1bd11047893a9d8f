"""The per-token rule (core/cost_rule.py): its w_t is the optimum of fidelity + λ·acceptance per position,
the tokens it emits follow nu_t, and its greedy form keeps the draft's own token within λ of the target's."""

from __future__ import annotations

import collections

import pytest
import torch
from stats import chi_square_pvalue

from diversed_demo.core.cost_rule import cost_weights, greedy_cost_weights, greedy_position_costs
from diversed_demo.core.head import CostHead
from diversed_demo.core.verify import ensemble_probs, total_variation, verify_block, verify_block_greedy


def random_pairs(n: int, vocab: int = 12, seed: int = 0):
    """n positions' p and q [n, V], some close and some far apart."""
    generator = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(n, vocab, generator=generator), -1)
    q = torch.softmax(3 * torch.randn(n, vocab, generator=generator), -1)
    mix = torch.rand(n, 1, generator=generator)
    return p, mix * p + (1 - mix) * q  # drafts from a near copy of p to an unrelated guess


def objective(p, q, w, lam):
    """Per position: the target's expected log-probability of a token drawn from nu, plus λ·acceptance."""
    fidelity = (ensemble_probs(p, q, w) * p.log()).sum(-1)
    return fidelity + lam * (1 - w * total_variation(p, q))


@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0, 8.0])
def test_the_rules_w_maximises_fidelity_plus_lam_acceptance_at_every_position(lam):
    p, q = random_pairs(200)
    w = cost_weights(p, q, lam)
    assert set(w.tolist()) <= {0.0, 1.0}
    best = objective(p, q, w, lam)
    for other in torch.linspace(0, 1, 21):
        assert (best >= objective(p, q, other.expand(len(w)), lam) - 1e-5).all()


def test_the_rules_w_is_one_where_the_drafts_cost_exceeds_lam_tv():
    p, q = random_pairs(200, seed=1)
    lam = 2.0
    cross_entropy, entropy = -(q * p.log()).sum(-1), -(p * p.log()).sum(-1)
    expected = (cross_entropy - entropy > lam * total_variation(p, q)).float()
    assert torch.equal(cost_weights(p, q, lam), expected)
    assert 0 < expected.mean() < 1  # both kinds of position occur


def test_at_lam_zero_the_rule_relaxes_only_where_the_draft_raises_the_targets_likelihood():
    p, q = random_pairs(100, seed=2)
    sharper = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()  # q on the target's best token
    assert cost_weights(p, sharper, 0.0).eq(0).all()  # −log max p < H(p): drafting it raises fidelity
    unlikely = torch.nn.functional.one_hot(p.argmin(-1), p.shape[-1]).float()
    assert cost_weights(p, (p + unlikely) / 2, 0.0).eq(1).all()  # half its mass on p's least likely token
    assert cost_weights(p, q, 1e6).eq(0).all()  # a large λ relaxes everywhere


@pytest.mark.slow
def test_emitted_tokens_follow_nu_and_acceptance_is_one_minus_w_tv_at_the_rules_w():
    """At a position the rule relaxes and at one it checks exactly: the law of the emitted token is nu_t
    (chi-square), and the chance of keeping the draft 1 − w_t·TV."""
    p, q = random_pairs(200, seed=3)
    w = cost_weights(p, q, 2.0)
    for position in (int(w.argmin()), int(w.argmax())):  # one with w = 0, one with w = 1
        target = torch.stack([p[position], p[position]])  # the bonus position is not reached here
        draft = q[position : position + 1]
        nu = ensemble_probs(p[position], q[position], w[position])
        generator = torch.Generator().manual_seed(position)
        counts, kept, samples = collections.Counter(), 0, 4000
        for _ in range(samples):
            token = torch.multinomial(draft[0], 1, generator=generator)
            accepted, next_token, _ = verify_block(
                token, draft, target, w[position : position + 1], generator
            )
            emitted = int(token) if accepted else int(next_token)
            counts[emitted] += 1
            kept += accepted
        law = {i: float(v) for i, v in enumerate(nu) if v > 0}
        assert chi_square_pvalue(counts, law) > 0.001
        expected = 1 - float(w[position]) * float(total_variation(p[position], q[position]))
        assert abs(kept / samples - expected) < 4 * (expected * (1 - expected) / samples) ** 0.5 + 1e-9


def test_greedy_keeps_the_drafts_own_token_within_lam_of_the_targets_best_and_checks_the_rest():
    # Three positions: the draft's choice is the target's second best (log-margin log 2 ≈ 0.69), its
    # fifth best (margin log 8 ≈ 2.08), and a copy that is not the draft's own choice.
    p = torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.05, 0.05]] * 3)
    q = torch.tensor(
        [[0.1, 0.6, 0.1, 0.1, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1, 0.5, 0.1], [0.6, 0.1] + [0.075] * 4]
    )
    drafted = torch.tensor([1, 4, 2])
    w = greedy_cost_weights(p, q, drafted, lam=1.0)
    assert w.tolist() == [0.0, 1.0, 1.0]
    n_accepted, next_token, _ = verify_block_greedy(drafted, q, torch.cat([p, p[:1]]), w)
    assert (
        n_accepted == 1 and int(next_token) == 0
    )  # the far token is checked, and the target's best replaces it
    assert greedy_cost_weights(p, q, drafted, lam=3.0).tolist() == [0.0, 0.0, 1.0]  # a copy: always checked


def test_the_greedy_terms_are_the_margin_of_the_drafts_choice_and_whether_the_choices_differ():
    p, q = random_pairs(200, seed=4)
    cost, tv, entropy = greedy_position_costs(p, q)
    log_p, choice = p.log(), q.argmax(-1)
    rows = torch.arange(200)
    assert torch.allclose(cost, log_p.max(-1).values - log_p[rows, choice], atol=1e-6)
    assert torch.equal(tv, (p.argmax(-1) != choice).float()) and bool(tv.any()) and not bool(tv.all())
    assert torch.allclose(entropy, -log_p.max(-1).values) and bool((cost[tv == 0] == 0).all())
    # the greedy rule is the threshold on this cost where the draft's own choice was drafted
    assert torch.equal(greedy_cost_weights(p, q, choice, lam=1.0), (cost > 1.0 * tv).float())


def test_an_untrained_cost_head_is_the_rule_at_every_lam_and_a_trained_one_departs_from_it():
    """A CostHead starts as the per-token rule (its correction is 0), so the dial moves it along the rule's
    curve; once its correction is non-zero its w_t differ from the rule's at the same λ."""
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(2 * torch.randn(400, 30, generator=g), -1)
    q = torch.softmax(2 * torch.randn(400, 30, generator=g), -1)
    target_hidden, draft_hidden = torch.randn(400, 16, generator=g), torch.randn(400, 12, generator=g)
    head = CostHead(16, 12, hidden_size=8)
    for lam in (0.0, 0.5, 2.0, 8.0):
        assert torch.equal(head.weights(p, q, lam, target_hidden, draft_hidden), cost_weights(p, q, lam))
    with torch.no_grad():
        head.mlp[-1].bias.fill_(-50.0)  # relaxing looks cheap everywhere: keeps every draft
    assert head.weights(p, q, 2.0, target_hidden, draft_hidden).eq(0).all()
    assert cost_weights(p, q, 2.0).eq(1).any()
