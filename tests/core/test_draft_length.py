"""The draft length chosen step by step (n_draft="auto"): it drafts where drafting pays and not where it does
not, keeps exact decoding exact and the law of emitted tokens, and replays under a seed."""

import collections
import types

import pytest
import torch
from conftest import PROMPTS
from stats import chi_square_pvalue
from test_decode import first_two_law
from tiny import tiny_model, tiny_pair

from diversed_demo.core import draft as draft_module
from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.draft_length import AUTO_MAX, AdaptiveLength, FixedLength, draft_length
from diversed_demo.core.generate import generate
from diversed_demo.models.eagle import Eagle3Draft

CHEAP = {"c": 0.01, "v": {j: 1.0 for j in range(1, 8)}}  # drafting costs almost nothing
DEAR = {"c": 2.0, "v": {j: 1.0 + j for j in range(1, 8)}}  # a drafted token costs two target tokens


def verdict(n_accepted: int, accept_probs, w=None):
    accept_probs = torch.tensor(accept_probs, dtype=torch.float32)
    w = torch.ones_like(accept_probs) if w is None else torch.tensor(w)
    return types.SimpleNamespace(n_accepted=n_accepted, accept_probs=accept_probs, w=w, tree=None)


def drafts_on(length: AdaptiveLength, drafted: int, confidence: float) -> bool:
    """Whether the rule keeps the `drafted`-th draft, of `confidence`, and drafts another after it."""
    return length.keeps(drafted, confidence) and length.go_on(drafted)


def test_the_config_takes_auto_and_the_rule_follows_it():
    assert isinstance(draft_length(DecodeConfig(n_draft=3), None), FixedLength)
    assert isinstance(draft_length(DecodeConfig(n_draft="auto"), None), AdaptiveLength)
    with pytest.raises(ValueError, match="auto"):
        DecodeConfig(n_draft="many")


def test_drafting_stops_where_it_would_cost_more_than_it_returns():
    cheap = AdaptiveLength(CHEAP, w_prior=1.0)
    assert cheap.start(room=20) == AUTO_MAX  # a free draft pays up to the pass's room
    assert drafts_on(cheap, 1, 0.95) and drafts_on(cheap, 2, 0.95)
    assert not drafts_on(cheap, 3, 0.0)  # a draft the draft is unsure of: the path's chance is gone
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
    assert cheap.start(room=7) == 7 and drafts_on(cheap, 1, 0.95) and drafts_on(cheap, 2, 0.95)


def test_a_draft_that_would_not_pay_its_place_in_the_pass_is_not_verified():
    """Once drafted, a draft's own chance decides whether it is put to the target: at v_j − v_{j−1} = 0.3 a
    first draft of chance 0.1 returns less than its place costs (0.1 < 0.3 ÷ (1 + r + c)), one of 0.9
    more; a dropped draft ends the step's drafting and counts at its chance, so ᾱ falls with it."""
    costs = {"c": 0.1, "v": {j: 1.0 + 0.3 * j for j in range(1, 8)}}
    length = AdaptiveLength(costs, w_prior=1.0)
    length.start(room=7)
    before = length.mean_chance()
    assert not length.keeps(1, 0.1)
    assert length.confidences == [] and length.mean_chance() < before
    length.start(room=7)
    assert length.keeps(1, 0.9) and length.confidences == [0.9]
    # a chain's later draft pays its place against the step's tokens so far: at chance 0.9 ⋅ 0.3 it does not
    assert not length.keeps(2, 0.3)
    assert FixedLength(3).stopper is None  # a fixed N verifies every draft


def test_a_sampled_draft_the_draft_is_unsure_of_is_verified_until_its_bin_says_otherwise():
    """Sampled, a draft's top probability s says less of its acceptance than greedy (at T = 1 drafts of
    s < 0.1 were kept 0.28 of the time): its prior reads (s + 1/2)/2, so at a place worth a chance of 0.18 a
    draft of s = 0.05 is put to the target where greedy drops it; turned down there, its bin learns to drop
    it. Priced at s (the mutation), it was never verified, so its bin never learned otherwise."""
    costs = {"c": 0.1, "v": {j: 1.0 + 0.2 * j for j in range(1, 8)}}
    greedy = draft_length(DecodeConfig(mode="exact", n_draft="auto", temperature=0), costs)
    sampled = draft_length(DecodeConfig(mode="exact", n_draft="auto", temperature=1), costs)
    for length in (greedy, sampled):
        assert length.start(room=7) > 0
    assert not greedy.keeps(1, 0.05) and sampled.keeps(1, 0.05)
    sampled.start(room=7)
    assert sampled.keeps(1, 0.95)  # a confident one too
    for _ in range(10):  # drafts of s = 0.05 turned down every time
        sampled.start(room=7)
        if sampled.keeps(1, 0.05):
            sampled.learn(verdict(0, [0.0]))
    sampled.start(room=7)
    assert not sampled.keeps(1, 0.05)


def test_a_laxer_rule_expects_more_and_drafts_longer():
    costs = {"c": 0.3, "v": {j: 1.0 + 0.05 * j for j in range(1, 8)}}

    def drafted(w_prior):
        length = AdaptiveLength(costs, w_prior)
        length.start(room=7)
        n = 1
        while drafts_on(length, n, 0.5):
            n += 1
        return n

    assert drafted(0.2) > drafted(1.0)


def test_a_per_token_rule_tries_drafting_where_exact_sd_would_not_and_learns_its_w():
    """A rule's or a head's w_t is unknown before it verifies a position: where the pair's steps make exact
    SD's first draft not pay (ᾱ = 0.5 < r + c + v_1 − 1 = 0.6), the per-token rule and a head still draft,
    and from what they verify go on (w_t = 0: kept) or stop (w_t = 1 and turned down, as exact SD). Started
    at exact's w = 1 (the mutation), they never drafted, so never saw their w_t."""
    costs = {"c": 0.2, "r": 0.1, "v": {j: 1.0 + 0.3 * j for j in range(1, 8)}}
    assert draft_length(DecodeConfig(mode="exact", n_draft="auto"), costs).start(room=7) == 0
    head = DecodeConfig(mode="dynamic", head="some-head", n_draft="auto")
    for config in (DecodeConfig(mode="cost", lam=2.0, n_draft="auto"), head):
        relaxed, strict = draft_length(config, costs), draft_length(config, costs)
        assert relaxed.start(room=7) > 0 and strict.start(room=7) > 0
        for _ in range(20):
            for length, w, kept in ((relaxed, 0.0, 1.0), (strict, 1.0, 0.0)):
                length.start(room=7)
                if length.keeps(1, 0.5):
                    length.learn(verdict(int(kept), [kept], w=[w]))
        assert relaxed.start(room=7) > 0
        assert strict.start(room=7) == 0


def test_evidence_moves_the_estimate_and_a_skipped_stretch_forgets_it():
    length = AdaptiveLength({"c": 0.2, "v": {j: 1.0 for j in range(1, 8)}}, w_prior=1.0)
    prior = length.chance(0.55)
    for _ in range(20):  # every draft the draft was fairly sure of is turned down
        length.start(room=7)
        drafts_on(length, 1, 0.55)
        length.learn(verdict(0, [0.0]))
    assert length.chance(0.55) < prior / 3
    assert length.start(room=7) == 0  # drafting no longer pays
    skipped = 1
    while length.start(room=7) == 0:  # ...until the forgotten evidence lets the prior try again
        skipped += 1
        assert skipped < 60
    assert skipped > 1


def copy_block(length: AdaptiveLength, match: int = 2, room: int = 7) -> int:
    """How many copies a step's block takes, each after a match of `match` tokens."""
    length.start(room=room)
    n = 0
    while n < room and length.copy_pays(n, match):
        n += 1
    return n


def test_a_block_of_copies_is_priced_by_what_its_copies_returned():
    """Exact SD's copies cost their places in the pass alone: at the prior a block takes copies while they
    pay (2 at v_j = 1 + 0.2·j); where the text's copies were turned down it takes none, where they were kept
    it runs to the room; the evidence is kept per length of the match. A fixed N takes every copy."""
    length = AdaptiveLength({"c": 0.1, "v": {j: 1.0 + 0.2 * j for j in range(1, 8)}}, w_prior=1.0)
    assert copy_block(length) == 2
    for _ in range(20):
        taken = copy_block(length)
        length.learn(verdict(0, [0.0] * taken))  # the block's first copy turned down
    assert copy_block(length) == 0
    assert copy_block(length, match=4) == 2  # a longer match's evidence is its own
    for _ in range(20):
        taken = copy_block(length, match=4)
        length.learn(verdict(taken, [1.0] * taken))  # every copy kept
    assert copy_block(length, match=4) == 7
    assert FixedLength(3).copy_pays(6, 2)


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


def trimmed_law(monkeypatch, pair, prompt: list[int], samples: int, threshold: float, first_only=False):
    """The chi-square p-value of sampled exact SD's first two tokens (or first, `first_only`) against the
    target's law, where a draft's place in the pass costs what a draft of chance `threshold` returns
    (chance ⋅ (1 + c) ≥ v_1 − 1; at c = 0.01 a first look pays up to a threshold of 0.485), and how many
    drafts the rule kept and dropped ({True: kept, False: dropped}). Before evidence a sampled draft of top
    probability s has the chance (s + 1/2)/2: it is dropped where s < 2 ⋅ threshold − 1/2."""
    law, _ = first_two_law(pair, prompt, 1.0, eos=2)
    if first_only:
        marginal = collections.Counter()
        for key, chance in law.items():
            marginal[key[:1]] += chance
        law = dict(marginal)
    monkeypatch.setattr(pair, "costs", {"c": 0.01, "v": {j: 1.0 + 1.01 * threshold * j for j in range(1, 8)}})
    counts, verdicts = collections.Counter(), collections.Counter()
    keeps = AdaptiveLength.keeps

    def counted(self, drafted, confidence):
        kept = keeps(self, drafted, confidence)
        verdicts[kept] += 1
        return kept

    monkeypatch.setattr(AdaptiveLength, "keeps", counted)
    for seed in range(samples):
        summary, _ = generate(pair, prompt, mode="exact", n_draft="auto", max_new_tokens=3, seed=seed)
        counts[tuple(summary.token_ids[: 1 if first_only else 2])] += 1
    return chi_square_pvalue(counts, law), verdicts


@pytest.mark.slow
def test_sampled_exact_follows_the_target_where_drafts_are_dropped(monkeypatch, any_pair):
    """Dropping a draft that would not pay its place reads the drafts before it and its distribution's
    top, never its own token: the emitted tokens still follow p. A feature draft drafts the second token,
    whose top max q(· | x1) falls below 0.4 (a threshold of 0.45) for about 7% of the first tokens x1
    here, so whether it is verified varies with x1; a standalone draft's first draft (top 0.41) is always
    dropped."""
    feature = isinstance(any_pair.draft, Eagle3Draft)
    prompt, threshold = (PROMPTS[1], 0.45) if feature else (PROMPTS[0], 0.47)
    pvalue, verdicts = trimmed_law(monkeypatch, any_pair, prompt, 3000, threshold)
    assert verdicts[False] > 0 and pvalue > 0.001
    if feature:
        assert verdicts[True] > 0


@pytest.mark.slow
def test_the_law_test_fails_where_a_draft_is_dropped_by_its_own_token(monkeypatch):
    """The test above can fail: a rule that reads the drafted token's own q (whether it is verified then
    depends on the token) emits another law, here by 0.06 in total variation (a draft near the target, so
    that most drafts are kept and those of q < 0.05, a threshold of 0.275, drop the accepted share of their
    mass)."""
    draft = tiny_model(0, 2)
    torch.manual_seed(5)
    weight = draft.get_output_embeddings().weight
    with torch.no_grad():
        weight += 0.5 * weight.std() * torch.randn_like(weight)
    monkeypatch.setattr(draft_module, "draft_confidence", lambda q, index, sampler, copied=None: q[index])
    pvalue, verdicts = trimmed_law(monkeypatch, tiny_pair(draft=draft), PROMPTS[0], 3000, 0.275, True)
    assert verdicts[False] > 0 and verdicts[True] > 0 and pvalue < 1e-4


def test_lengths_beyond_the_measured_are_priced_on_the_last_slope():
    """v_j past the longest length measured follows the last two lengths' slope, in their units; lengths
    between two measured lie on the line through them; with fewer than two measured, the default slope."""
    from diversed_demo.core.draft_length import DEFAULT_V_SLOPE, pass_costs

    v = pass_costs({1: 1.2, 2: 1.5, 4: 2.5})
    assert v[:5] == pytest.approx([1.0, 1.2, 1.5, 2.0, 2.5]) and len(v) == AUTO_MAX + 1
    assert v[AUTO_MAX] == pytest.approx(2.5 + 0.5 * (AUTO_MAX - 4))
    assert pass_costs({})[AUTO_MAX] == pytest.approx(1 + DEFAULT_V_SLOPE * AUTO_MAX)
    assert pass_costs({1: 1.3})[2] == pytest.approx(1.3 + DEFAULT_V_SLOPE)


def test_the_rule_weighs_whole_steps_where_the_pair_measured_them():
    """A pair's costs as whole steps price them ("steps") are what the rule weighs, not its passes' alone:
    passes that make drafting pay, steps that show it does not, and the step drafts nothing."""
    steps = {"c": 0.3, "r": 0.3, "v": {j: 1.0 + 0.3 * j for j in range(1, 8)}}
    assert AdaptiveLength(CHEAP, w_prior=1.0).start(room=7) == 7
    assert AdaptiveLength({**CHEAP, "steps": steps}, w_prior=1.0).start(room=7) == 0
