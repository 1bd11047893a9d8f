"""What the runtime builds while a pair serves (the AMX kernel's operands, compiled passes) is swapped in
between decodes (`ModelPair.offer_upgrade`): a running decode keeps the tokens it would have had."""

from __future__ import annotations

import threading

import torch
from tiny import tiny_pair

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.generate import generate, speculative_generate

PROMPT = [1, 5, 9, 7, 12]
CONFIG = DecodeConfig(mode="exact", n_draft=3, max_new_tokens=24, temperature=0)


def turned_around(pair):
    """An upgrade that changes every greedy choice: the target's LM head negated, in one swap."""
    head = pair.target.get_output_embeddings()
    negated = -head.weight.detach().clone()

    def swap():
        head.weight.data = negated

    return swap


def test_an_upgrade_offered_mid_decode_lands_after_it_and_leaves_its_tokens_alone():
    pair = tiny_pair()
    reference = generate(pair, PROMPT, CONFIG)[0].token_ids
    decode = speculative_generate(pair, PROMPT, CONFIG)
    first = [next(decode) for _ in range(3)]  # the decode runs
    landed = []
    builder = threading.Thread(target=lambda: landed.append(pair.offer_upgrade(turned_around(pair))))
    builder.start()
    builder.join()
    assert not landed[0].is_set()  # waiting for the decode to end
    *rest, summary = list(decode)
    assert summary.token_ids == reference and len(first) + len(rest) >= len(reference)
    assert landed[0].is_set()
    assert generate(pair, PROMPT, CONFIG)[0].token_ids != reference  # the next decode runs upgraded


def test_an_upgrade_offered_while_no_decode_runs_lands_at_once():
    pair = tiny_pair()
    before = generate(pair, PROMPT, CONFIG)[0].token_ids
    assert pair.offer_upgrade(turned_around(pair)).is_set()
    assert generate(pair, PROMPT, CONFIG)[0].token_ids != before


def test_a_decode_stopped_halfway_lets_the_upgrade_in():
    pair = tiny_pair()
    decode = speculative_generate(pair, PROMPT, CONFIG)
    next(decode)
    landed = pair.offer_upgrade(lambda: None)
    assert not landed.is_set()
    decode.close()  # a visitor's Stop
    assert landed.is_set()
    with torch.inference_mode():
        assert pair.offer_upgrade(lambda: None).is_set()
