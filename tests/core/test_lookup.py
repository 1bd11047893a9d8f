"""Prompt lookup: copies from the text proposed in place of drafted tokens, in greedy decoding only."""

import pytest
import torch
from conftest import PROMPTS
from references import reference_step

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.decode import decode_rows
from diversed_demo.core.generate import generate
from diversed_demo.core.lookup import PromptLookup


def decode_steps(pair, prompt, mode, ensemble_weight=0.5, **settings):
    """The steps of one decode of `prompt` (token ids)."""
    config = DecodeConfig(mode, ensemble_weight, **settings)
    return [step for _, step in decode_rows(pair, [prompt], [config])]


REPEATING = [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]  # the tiny models' own greedy texts loop as well


def test_guess_follows_the_latest_occurrence_of_the_longest_match():
    lookup = PromptLookup()
    lookup.start(torch.tensor([3, 4, 5, 9, 4, 5, 7, 1, 4, 5]))
    assert lookup.guess() == 7  # "4 5" last came before 7 (and before 9 earlier)
    lookup.start(torch.tensor([3, 4, 5, 9, 4, 5, 7, 1, 4, 5, 9, 2, 6, 4, 5, 9]))
    assert lookup.guess() == 2  # "6 4 5 9" never occurred; "4 5 9" did, last before 2
    lookup.start(torch.tensor([3, 4, 5, 9, 4, 5, 7, 1, 4, 5, 9, 2, 6, 4, 5, 9, 8, 6, 4, 5, 9]))
    assert lookup.guess() == 8  # now "6 4 5 9" did, before 8, though "4 5 9" came later before other tokens
    lookup = PromptLookup()
    lookup.start(torch.tensor([8, 2, 6, 2]))
    assert lookup.guess() is None  # one matching token is not enough


def test_choose_copies_on_a_drafted_tail_and_keeps_the_draft_elsewhere():
    lookup = PromptLookup()
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2]))
    drafted = torch.tensor(42)
    assert int(lookup.choose(drafted)) == 3  # "1 2" -> 3
    assert int(lookup.choose(drafted)) == 4  # the copy extends the tail: "1 2 3" -> 4
    assert int(lookup.choose(torch.tensor(5))) == 9
    assert lookup.choose(torch.tensor(11)).shape == drafted.shape
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2, 8]))  # verified: "2 8" never occurred
    assert int(lookup.choose(torch.tensor(11))) == 11


def test_copies_go_on_while_the_text_has_a_follower_and_the_room_lasts():
    lookup = PromptLookup(copy_blocks=True)
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2]))
    assert lookup.copies(2) == [3, 4]  # "1 2" -> 3, "1 2 3" -> 4, then the room is spent
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2]))
    assert lookup.copies(7) == [3, 4, 9, 1, 2, 3, 4]  # the copies loop through the text
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2, 8]))
    assert lookup.copies(7) == []  # "2 8" never occurred


def test_a_block_of_copies_ends_where_the_length_rule_finds_the_next_does_not_pay():
    lookup = PromptLookup(copy_blocks=True)
    lookup.start(torch.tensor([1, 2, 3, 4, 9, 1, 2]))
    asked = []
    assert lookup.copies(7, lambda copied, match: asked.append((copied, match)) or copied < 2) == [3, 4]
    assert asked == [(0, 2), (1, 3), (2, 4)]  # each copy's match: "1 2", "1 2 3", "1 2 3 4"


def proposals(pair, prompt, mode, lookup, **kwargs):
    steps = decode_steps(pair, prompt, mode, n_draft=3, max_new_tokens=30, prompt_lookup=lookup, **kwargs)
    texts, drafts = [], []
    for step in steps:
        texts += step.new_ids
        drafts.append(step.verdict.draft_tokens.tolist())
    return texts, drafts


@pytest.mark.parametrize("prompt", [REPEATING, *PROMPTS])
def test_greedy_exact_with_lookup_still_emits_the_targets_own_tokens(any_pair, prompt):
    reference, _ = generate(any_pair, prompt, mode="ar", max_new_tokens=30, temperature=0)
    texts, _ = proposals(any_pair, prompt, "exact", True, temperature=0)
    assert texts == reference.token_ids


def test_lookup_changes_greedy_proposals_and_raises_acceptance(any_pair):
    with_lookup, drafts = proposals(any_pair, REPEATING, "exact", True, temperature=0)
    without, plain_drafts = proposals(any_pair, REPEATING, "exact", False, temperature=0)
    assert with_lookup == without and drafts != plain_drafts
    kept = [
        generate(
            any_pair,
            REPEATING,
            mode="exact",
            n_draft=3,
            max_new_tokens=30,
            temperature=0,
            prompt_lookup=lookup,
        )[0].acceptance_rate
        for lookup in (False, True)
    ]
    assert kept[1] > kept[0]


def test_the_draft_runs_on_the_copied_tokens(pair):
    """Where a copy is proposed, q (and so nu) at the next positions is the draft's own for that prefix, as
    from scratch: the rule's law is unchanged, only the proposals move."""
    copied = 0
    for step in decode_steps(
        pair, REPEATING, "static", 0.4, n_draft=3, max_new_tokens=30, temperature=0, prompt_lookup=True
    ):
        verdict = step.verdict
        for j, token in enumerate(verdict.draft_tokens.tolist()):
            _, q, _, _ = reference_step(pair, step.sequence.tolist() + verdict.draft_tokens[:j].tolist())
            assert torch.allclose(verdict.draft_probs[j], q, atol=1e-5)
            copied += token != int(q.argmax())
    assert copied > 0


def test_sampled_decoding_never_copies(any_pair):
    options = dict(ensemble_weight=0.5, temperature=1.0, seed=3)
    assert proposals(any_pair, REPEATING, "static", True, **options) == proposals(
        any_pair, REPEATING, "static", False, **options
    )


def test_exact_greedy_proposes_blocks_of_copies_without_the_draft(feature_pair, monkeypatch):
    """Exact decoding's blocks of copies: longer than N where the text goes on, q a point mass on each copy,
    no draft step (no hidden state), and the positions the draft skipped fed at its next proposal in one
    pass the compiled step takes."""
    from diversed_demo.core.cache import MAX_FEED
    from diversed_demo.core.draft import FeatureDraft

    feeds = []
    step_rows = FeatureDraft._step
    monkeypatch.setattr(
        FeatureDraft,
        "_step",
        lambda self, f, ids, start: feeds.append(len(ids)) or step_rows(self, f, ids, start),
    )
    reference, _ = generate(feature_pair, REPEATING, mode="ar", max_new_tokens=30, temperature=0)
    texts, blocks = [], []
    for step in decode_steps(
        feature_pair, REPEATING, "exact", n_draft=1, max_new_tokens=30, temperature=0, prompt_lookup=True
    ):
        texts += step.new_ids
        blocks.append(step.verdict)
    assert texts == reference.token_ids
    copied = [v for v in blocks if v.draft_hidden is None and len(v.draft_tokens)]
    assert copied and max(len(v.draft_tokens) for v in copied) > 1
    for v in copied:
        assert torch.equal(v.draft_probs.argmax(-1), v.draft_tokens) and torch.all(v.draft_probs.sum(-1) == 1)
    assert max(feeds[1:]) <= MAX_FEED  # after the prompt's


def exact_auto_verdicts(pair, monkeypatch, costs: dict) -> list:
    """The verdicts of exact greedy decoding at N step by step on REPEATING, the pair priced by `costs`,
    checked to give the target's own tokens."""
    monkeypatch.setattr(pair, "costs", costs)
    reference, _ = generate(pair, REPEATING, mode="ar", max_new_tokens=30, temperature=0)
    texts, verdicts = [], []
    for step in decode_steps(
        pair, REPEATING, "exact", n_draft="auto", max_new_tokens=30, temperature=0, prompt_lookup=True
    ):
        texts += step.new_ids
        verdicts.append(step.verdict)
    assert texts == reference.token_ids
    return verdicts


def test_a_step_whose_length_rule_drafts_nothing_still_proposes_the_texts_copies(feature_pair, monkeypatch):
    """Copies cost no draft step: where drafting never pays (the pair's costs say a drafted token costs ten
    passes), exact greedy decoding at N step by step still verifies the text's blocks of copies, and still
    gives the target's own tokens (on Zen 4 the rule's skipped steps had skipped the copies too: exact SD
    1.07× where N = 1, copying, ran 1.14×)."""
    verdicts = exact_auto_verdicts(feature_pair, monkeypatch, {"c": 10.0, "r": 10.0, "v": {1: 1.1, 2: 1.2}})
    assert all(v.draft_hidden is None for v in verdicts)  # the draft never drafted
    assert any(len(v.draft_tokens) for v in verdicts)  # but the text's copies were verified


def test_where_no_copy_can_pay_its_place_exact_decoding_verifies_none(feature_pair, monkeypatch):
    """A copy costs its place in the pass: where a position costs a whole pass (v_1 = 2) no copy's chance
    pays it, and exact greedy decoding at N step by step verifies the unseen token alone, step after step."""
    verdicts = exact_auto_verdicts(feature_pair, monkeypatch, {"c": 10.0, "r": 10.0, "v": {1: 2.0, 2: 3.0}})
    assert not any(len(v.draft_tokens) for v in verdicts)
