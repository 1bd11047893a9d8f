"""The verification rule on explicit distributions: each emitted token follows nu, acceptance is 1 − w·TV."""

import collections

import pytest
import torch
from stats import chi_square_pvalue

from diversed_demo.core.sampling import greedy_tokens, sample, sampling_probs
from diversed_demo.core.verify import (
    acceptance_prob,
    ensemble_probs,
    residual_probs,
    total_variation,
    verify_block,
    verify_block_greedy,
)


def random_dists(n, vocab, seed, sharp=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(n, vocab, generator=g), -1)


def test_mixture_and_acceptance_formulas():
    p, q = random_dists(3, 6, 0), random_dists(3, 6, 1)
    w = torch.tensor([0.0, 0.5, 1.0])
    nu = ensemble_probs(p, q, w)
    # The endpoints bit for bit (exact decoding's greedy choices are p's own), the mixture between them.
    assert torch.equal(nu[0], q[0]) and torch.equal(nu[2], p[2])
    assert torch.allclose(nu[1], 0.5 * p[1] + 0.5 * q[1], atol=1e-7)
    assert torch.allclose(nu.sum(-1), torch.ones(3))
    # E_{x~q}[min(1, nu/q)] = 1 − w·TV(p, q)
    expected = (q * acceptance_prob(nu, q)).sum(-1)
    assert torch.allclose(expected, 1 - w * total_variation(p, q), atol=1e-6)


def test_residual_is_normalised_and_falls_back_to_target():
    p, q = random_dists(2, 5, 2), random_dists(2, 5, 3)
    r = residual_probs(p, q)
    assert torch.allclose(r.sum(-1), torch.ones(2))
    assert (r[p <= q] == 0).all()
    same = residual_probs(p, p.clone())
    assert torch.allclose(same, p) and torch.isfinite(same).all()


def test_top_p_keeps_the_smallest_sufficient_prefix():
    probs = sampling_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), temperature=1.0, top_p=0.75)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)
    greedy_display = sampling_probs(torch.tensor([1.0, 2.0]), temperature=0.0)
    assert greedy_display.argmax() == 1


@pytest.mark.parametrize("w", [1.0, 0.6, 0.0])
def test_first_emitted_token_follows_nu_and_acceptance_is_one_minus_w_tv(w):
    vocab, n, trials = 8, 3, 20000
    p, q = random_dists(n + 1, vocab, 10), random_dists(n, vocab, 11)
    nu0 = ensemble_probs(p[0], q[0], w)
    gen = torch.Generator().manual_seed(123)
    counts, accepted_first = collections.Counter(), 0
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)
        n_acc, nxt, _ = verify_block(drafts, q, p, w, generator=gen)
        first = int(drafts[0]) if n_acc > 0 else int(nxt)
        counts[first] += 1
        accepted_first += n_acc > 0
    assert chi_square_pvalue(counts, dict(enumerate(nu0.tolist()))) > 0.001
    alpha = 1 - w * float(total_variation(p[0], q[0]))
    se = max((alpha * (1 - alpha) / trials) ** 0.5, 1e-9)
    assert abs(accepted_first / trials - alpha) < 4 * se + 1e-9


def test_bonus_token_follows_target_when_all_drafts_pass():
    vocab = 6
    p, q = random_dists(2, vocab, 20), random_dists(1, vocab, 21)
    gen = torch.Generator().manual_seed(5)
    counts = collections.Counter()
    for _ in range(8000):
        n_acc, nxt, _ = verify_block(torch.tensor([0]), q, p, 0.0, generator=gen)  # w = 0 accepts always
        assert n_acc == 1
        counts[int(nxt)] += 1
    assert chi_square_pvalue(counts, dict(enumerate(p[1].tolist()))) > 0.001


def test_greedy_rule_accepts_while_draft_is_argmax_nu():
    p = torch.tensor([[0.1, 0.9, 0.0], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.2, 0.8, 0.0], [0.2, 0.7, 0.1]])
    drafts = torch.tensor([1, 1])
    n_acc, nxt, _ = verify_block_greedy(drafts, q, p, 1.0)  # exact: position 1 wants 0
    assert (n_acc, int(nxt)) == (1, 0)
    n_acc, nxt, _ = verify_block_greedy(
        drafts, q, p, 0.3
    )  # nu(1) = .3·.3 + .7·.7 > nu(0): accept, bonus argmax p
    assert (n_acc, int(nxt)) == (2, 2)


def test_greedy_tokens_take_the_first_of_tied_maxima_as_argmax_does():
    """Greedy decoding breaks ties as transformers' argmax does, so target-only repeats its text."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        probs = torch.randint(0, 3, (64, 49152), generator=generator).to(dtype)  # every row has many ties
        assert torch.equal(greedy_tokens(probs), probs.argmax(-1))
        assert torch.equal(greedy_tokens(probs[5]), probs[5].argmax(-1))


def test_sample_draws_each_row_from_its_own_distribution_and_never_a_zero():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 6, generator=g) * 2, -1)
    probs[0, 2] = probs[1, 0] = 0.0  # tokens a row can never draw
    probs = probs / probs.sum(-1, keepdim=True)
    draws = sample(probs.repeat(10000, 1), g).view(10000, 2)
    for row in range(2):
        counts = collections.Counter(draws[:, row].tolist())
        assert counts[2 if row == 0 else 0] == 0
        assert chi_square_pvalue(counts, dict(enumerate(probs[row].tolist()))) > 0.001
    one = sample(probs[0], g)  # one row [V] -> one token, as the decoder calls it
    assert one.dim() == 0 and probs[0, one] > 0
