"""The vLLM plugin's rule as pure tensor math (diversed_demo/vllm/rule.py needs no vLLM): checked here against
core/verify.py. The same rule inside vLLM's kernels: test_vllm_sampler.py."""

import math

import pytest
import torch

from diversed_demo.core.cost_rule import cost_weights, greedy_cost_weights
from diversed_demo.core.verify import verify_block_greedy
from diversed_demo.vllm.rule import (
    Verifier,
    ensemble_argmax,
    ensemble_uniforms,
    parse_ensemble_weight,
    request_verifier,
    rule_weights,
    token_weights,
)


@pytest.mark.parametrize("value", [0, 1, 0.0, 0.25, 1.0])
def test_a_weight_in_the_unit_interval_is_taken(value):
    assert parse_ensemble_weight(value) == float(value)


@pytest.mark.parametrize(
    "value, message",
    [
        (1.5, "must be in \\[0, 1\\], not 1.5"),
        (-0.1, "must be in \\[0, 1\\], not -0.1"),
        (math.nan, "not nan"),
        ("0.5", "must be a number in \\[0, 1\\], not '0.5'"),
        ("abc", "not 'abc'"),
        (None, "not None"),
        (True, "not True"),
        ([0.5], "not \\[0.5\\]"),
    ],
)
def test_a_bad_weight_is_refused_with_what_was_wrong(value, message):
    with pytest.raises(ValueError, match=f"^diversed_w .*{message}$"):
        parse_ensemble_weight(value)


def test_a_request_without_a_verifier_gets_the_servers_and_its_own_replaces_it():
    server_w, server_rule = Verifier(w=0.7), Verifier(lam=4.0)
    assert request_verifier(None) == Verifier() and not Verifier().relaxed  # exact, no rule, no head
    assert request_verifier({"other": 3}, server_w).w == 0.7
    assert request_verifier({"diversed_w": 0.2}, server_w).w == 0.2
    assert request_verifier({"diversed_lambda": 2}, server_w)[:2] == (
        1.0,
        2.0,
    )  # the rule, not the server's w
    assert request_verifier(None, server_rule) == server_rule  # a server that serves the rule
    own = request_verifier({"diversed_w": 0.5}, server_rule)  # a request's own w replaces the server's rule
    assert own.w == 0.5 and math.isnan(own.lam) and own.relaxed
    head = request_verifier({"diversed_head": "general"}, server_w)
    assert head.head == "general" and head.w == 1.0 and math.isnan(head.lam) and head.relaxed
    assert (
        request_verifier({"diversed_head": "general-cost", "diversed_lambda": 2}).lam == 2.0
    )  # a cost head's
    with pytest.raises(ValueError):
        request_verifier({"diversed_w": 2}, server_w)
    with pytest.raises(ValueError, match="diversed_lambda must be a finite number ≥ 0, not -1"):
        request_verifier({"diversed_lambda": -1})
    with pytest.raises(ValueError, match="diversed_lambda must be a number ≥ 0, not 'x'"):
        request_verifier({"diversed_lambda": "x"})
    for both in ({"diversed_w": 0.5, "diversed_lambda": 1}, {"diversed_w": 0.5, "diversed_head": "general"}):
        with pytest.raises(ValueError, match="not both"):
            request_verifier(both)
    for bad in ("../etc/passwd", "", 3, None):
        with pytest.raises(ValueError, match="diversed_head must be a head's name"):
            request_verifier({"diversed_head": bad})


@pytest.mark.parametrize("drafting", ["point mass", "probabilistic"])
def test_the_plugins_rule_is_the_projects_rule_fed_the_same_q(drafting):
    """rule_weights (what the plugin computes inside vLLM's rejection step) equals core/cost_rule.py on the
    same p and q: q the draft's distribution, or for vLLM's greedy drafting the point mass on x."""
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(2 * torch.randn(300, 20, generator=g), -1)
    q_full = torch.softmax(2 * torch.randn(300, 20, generator=g), -1)
    x = q_full.argmax(-1) if drafting == "point mass" else torch.multinomial(q_full, 1, generator=g)[:, 0]
    q = torch.nn.functional.one_hot(x, 20).float() if drafting == "point mass" else q_full
    lams = torch.tensor([0.0, 0.5, 2.0, 8.0]).repeat(75)
    greedy = torch.arange(300) % 3 == 0
    got = rule_weights(p, x, None if drafting == "point mass" else q_full, lams, greedy)
    sampled, greedy_w = cost_weights(p, q, lams), greedy_cost_weights(p, q, x, lams)
    assert torch.equal(got, torch.where(greedy, greedy_w, sampled))
    assert got.eq(0).any() and got.eq(1).any()


def test_request_weights_spread_over_their_drafted_tokens():
    spread = token_weights(torch.tensor([0.5, 1.0, 0.2]), [2, 0, 3])
    assert spread.tolist() == pytest.approx([0.5, 0.5, 0.2, 0.2, 0.2])


def test_shifted_uniforms_apply_the_diversed_acceptance_test():
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(20000, dtype=torch.float64, generator=generator)
    ratio = torch.rand(20000, dtype=torch.float64, generator=generator) * 1.5  # p(x)/q(x), past 1 too
    for w in (0.0, 0.3, 0.5, 0.9):
        weights = torch.full((20000,), w)
        kept_by_kernel = ratio >= ensemble_uniforms(u, weights)  # vLLM's test on the shifted uniform
        kept_by_diversed = u <= torch.clamp(w * ratio + (1 - w), max=1.0)
        margin = (u - (w * ratio + 1 - w)).abs() > 1e-12  # rounding decides ties only
        assert torch.equal(kept_by_kernel[margin], kept_by_diversed[margin])


def test_weight_one_leaves_the_uniforms_bit_for_bit():
    u = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ensemble_uniforms(u, torch.ones(1000)), u)


def greedy_by_kernel(target_logits, drafts, w):
    """What vLLM's greedy kernel emits given ensemble_argmax: (n_accepted, next token)."""
    n = drafts.shape[0]
    choice = ensemble_argmax(
        target_logits[:n].argmax(-1), target_logits[:n].softmax(-1), drafts, torch.full((n,), w)
    )
    matches = choice.eq(drafts)
    n_accepted = int(matches.int().cumprod(0).sum())
    bonus = int(target_logits[n].argmax())
    return n_accepted, int(choice[n_accepted]) if n_accepted < n else bonus


@pytest.mark.parametrize("w", [0.0, 0.4, 0.5, 0.6, 0.8, 0.95, 1.0])
def test_greedy_rule_is_the_projects_with_a_point_mass_draft(w):
    """vLLM drafts greedily: q is the point mass on each drafted token, fed as such to verify_block_greedy."""
    generator = torch.Generator().manual_seed(2)
    for _ in range(200):
        n, vocab = 4, 12
        target_logits = torch.randn(n + 1, vocab, generator=generator) * 2
        drafts = torch.randint(vocab, (n,), generator=generator)
        if torch.rand(1, generator=generator) < 0.5:  # often the target's own choice, as a good draft's is
            drafts = torch.where(
                torch.rand(n, generator=generator) < 0.7, target_logits[:n].argmax(-1), drafts
            )
        point_mass = torch.nn.functional.one_hot(drafts, vocab).float()
        n_ref, next_ref, _ = verify_block_greedy(drafts, point_mass, target_logits.softmax(-1), w)
        assert greedy_by_kernel(target_logits, drafts, w) == (n_ref, int(next_ref))


def test_greedy_rule_rejects_padded_drafts():
    target_logits = torch.randn(2, 5)
    choice = ensemble_argmax(
        target_logits.argmax(-1), target_logits.softmax(-1), torch.tensor([-1, -1]), torch.zeros(2)
    )
    assert torch.equal(choice, target_logits.argmax(-1))
