"""The draft length chosen step by step (n_draft="auto"): it drafts where drafting pays and not where it does
not, keeps exact decoding exact and the law of emitted tokens, and replays under a seed."""

import collections
import types

import pytest
import torch
from conftest import PROMPTS
from stats import chi_square_pvalue
from test_decode import first_two_law

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.draft_length import AUTO_MAX, AdaptiveLength, FixedLength, draft_length
from diversed_demo.core.generate import generate

CHEAP = {"c": 0.01, "v": {j: 1.0 for j in range(1, 8)}}  # drafting costs almost nothing
DEAR = {"c": 2.0, "v": {j: 1.0 + j for j in range(1, 8)}}  # a drafted token costs two target tokens


def verdict(n_accepted: int, accept_probs, w=None):
    accept_probs = torch.tensor(accept_probs, dtype=torch.float32)
    w = torch.ones_like(accept_probs) if w is None else torch.tensor(w)
    return types.SimpleNamespace(n_accepted=n_accepted, accept_probs=accept_probs, w=w, tree=None)


def test_the_config_takes_auto_and_the_rule_follows_it():
    assert isinstance(draft_length(DecodeConfig(n_draft=3), None), FixedLength)
    assert isinstance(draft_length(DecodeConfig(n_draft="auto"), None), AdaptiveLength)
    with pytest.raises(ValueError, match="auto"):
        DecodeConfig(n_draft="many")


def test_drafting_stops_where_it_would_cost_more_than_it_returns():
    cheap = AdaptiveLength(CHEAP, w_prior=1.0)
    assert cheap.start(room=20) == AUTO_MAX  # a free draft pays up to the pass's room
    assert cheap.go_on(1, 0.95) and cheap.go_on(2, 0.95)
    assert not cheap.go_on(3, 0.0)  # a draft the draft is unsure of: the path's chance is gone
    assert AdaptiveLength(DEAR, w_prior=1.0).start(room=20) == 0  # the step drafts nothing
    assert AdaptiveLength(CHEAP, w_prior=1.0).start(room=2) == 2  # never past the budget


def test_a_step_that_must_pay_its_drafts_catch_up_drafts_only_where_that_pays():
    """A drafting step's own cost r (the draft's pass over the tokens verified since its last) counts once a
    step: at an exact rule's prior ᾱ = 0.5, a draft that pays at r = 0 (0.5 ≥ c + v_1 − 1 = 0.3) does not at
    r = 0.3, and once a step drafts, r makes its later drafts no dearer."""
    costs = {"c": 0.2, "v": {j: 1.0 + 0.1 * j for j in range(1, 8)}}
    assert AdaptiveLength(costs, w_prior=1.0).start(room=7) == 7
    assert AdaptiveLength({**costs, "r": 0.3}, w_prior=1.0).start(room=7) == 0
    cheap = AdaptiveLength({**CHEAP, "r": 0.2}, w_prior=1.0)
    assert cheap.start(room=7) == 7 and cheap.go_on(1, 0.95) and cheap.go_on(2, 0.95)


def test_a_laxer_rule_expects_more_and_drafts_longer():
    costs = {"c": 0.3, "v": {j: 1.0 + 0.05 * j for j in range(1, 8)}}

    def drafted(w_prior):
        length = AdaptiveLength(costs, w_prior)
        length.start(room=7)
        n = 1
        while length.go_on(n, 0.5):
            n += 1
        return n

    assert drafted(0.2) > drafted(1.0)


def test_evidence_moves_the_estimate_and_a_skipped_stretch_forgets_it():
    length = AdaptiveLength({"c": 0.2, "v": {j: 1.0 for j in range(1, 8)}}, w_prior=1.0)
    prior = length.chance(0.55)
    for _ in range(20):  # every draft the draft was fairly sure of is turned down
        length.start(room=7)
        length.go_on(1, 0.55)
        length.learn(verdict(0, [0.0]))
    assert length.chance(0.55) < prior / 3
    assert length.start(room=7) == 0  # drafting no longer pays
    skipped = 1
    while length.start(room=7) == 0:  # ...until the forgotten evidence lets the prior try again
        skipped += 1
        assert skipped < 60
    assert skipped > 1


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_exact_with_auto_equals_target_only(any_pair, prompt):
    reference, _ = generate(any_pair, prompt, mode="ar", max_new_tokens=24, temperature=0)
    for costs in (None, CHEAP, DEAR):
        any_pair.costs = costs
        try:
            summary, _ = generate(
                any_pair, prompt, mode="exact", n_draft="auto", max_new_tokens=24, temperature=0
            )
        finally:
            any_pair.costs = None
        assert summary.token_ids == reference.token_ids, costs
        if costs is DEAR:
            assert summary.drafted == 0 and summary.target_passes == summary.new_tokens


def test_auto_replays_under_a_seed(any_pair):
    config = DecodeConfig(mode="static", ensemble_weight=0.5, n_draft="auto", max_new_tokens=20, seed=3)
    first, second = (generate(any_pair, PROMPTS[1], config)[0] for _ in range(2))
    assert first.token_ids == second.token_ids and first.drafted == second.drafted


@pytest.mark.slow
def test_sampled_exact_with_auto_follows_the_target(any_pair):
    """Where each step drafts as many as it expects to pay, the emitted tokens still follow p."""
    prompt, samples = PROMPTS[0], 3000
    law, _ = first_two_law(any_pair, prompt, 1.0, eos=2)
    counts, lengths = collections.Counter(), collections.Counter()
    any_pair.costs = {"c": 0.3, "v": {j: 1.0 + 0.05 * j for j in range(1, 8)}}
    try:
        for seed in range(samples):
            summary, _ = generate(any_pair, prompt, mode="exact", n_draft="auto", max_new_tokens=3, seed=seed)
            counts[tuple(summary.token_ids[:2])] += 1
            lengths[summary.drafted] += 1
    finally:
        any_pair.costs = None
    assert chi_square_pvalue(counts, law) > 0.001
    if any_pair.draft.__class__.__name__ != "Eagle3Draft":  # a feature draft's first step drafts nothing
        assert len(lengths) > 1  # the draft's length did vary
