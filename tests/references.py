"""Reference computations that test files in several folders check the fast paths against: a pair's next-token
distributions from scratch (no cache), a decode's passes through CachedLM with rollbacks, and a draft tree's
pass scored against chains over each node's path."""

from __future__ import annotations

import random

import torch

from diversed_demo.core.cache import CachedLM, tree_feed
from diversed_demo.core.tree import feed_layout
from diversed_demo.distill.ttt import ttt_forward
from diversed_demo.models.eagle import Eagle3Draft, target_features
from diversed_demo.runtime.static_pass import K_MAX

AUX = [0, 1]


def reference_step(pair, context):
    """Target p, draft q, and both hidden states for the token after `context`, from scratch (no cache).

    A feature draft's q there reads the target's features of context[:-1] and the token context[-1]."""
    ids = torch.tensor([context])
    with torch.no_grad():
        out = pair.target.model(ids, output_hidden_states=True)
        t = out.last_hidden_state[0, -1]
        p = torch.softmax(pair.target.lm_head(t), -1)
        if isinstance(pair.draft, Eagle3Draft):
            features = target_features(out.hidden_states, pair.draft.aux_layer_ids)[:, :-1]
            positions = torch.arange(len(context) - 1)[None]
            real = torch.ones(1, len(context) - 1, dtype=torch.bool)
            d = ttt_forward(pair.draft, features, ids, positions, real, steps=1)[0][0, -1]
            q = pair.draft.full_probs(torch.softmax(pair.draft.draft_logits(d).float(), -1))
        else:
            d = pair.draft.model(ids).last_hidden_state[0, -1]
            q = torch.softmax(pair.draft.lm_head(d), -1)
    return p, q, t, d


def decode_like(model, feeds, rollbacks, aux=AUX, runner=None):
    """Logits, hidden and aux of each feed (the first is the prompt), rolling back after each as listed,
    on `runner` where given (and free)."""
    lm = CachedLM(model, model.config.vocab_size, aux, runner=runner)
    out = []
    with torch.inference_mode():
        for feed, back in zip(feeds, rollbacks, strict=True):
            logits, hidden, aux = lm.forward(torch.tensor(feed), keep=len(feed) if out else 1)
            out.append((logits.float(), hidden.float(), aux.float()))
            lm.rollback(lm.length - back)
        held = lm.compiled is not None
    lm.close()
    return out, held


def random_feeds(seed: int, vocab: int, passes: int, prompt: int = 40):
    rng = random.Random(seed)
    feeds = [[rng.randrange(4, vocab) for _ in range(prompt)]]
    feeds += [[rng.randrange(4, vocab) for _ in range(rng.randint(1, K_MAX))] for _ in range(passes)]
    rollbacks = [0] + [rng.randint(0, len(f) - 1) for f in feeds[1:]]  # a verification keeps a prefix
    return feeds, rollbacks


TREE_PARENTS = [-1, -1, 0, 0, 2, 4]  # two at depth 1, two under the first, then a chain of two below


def path_to(node: int, parents: list[int]) -> list[int]:
    """The nodes from the root's child down to `node`."""
    path = []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    return path


def tree_logits_match_paths(model, runner, prompt, tokens, parents, exact: bool):
    """One pass over the tree `tokens` (`parents`) after `prompt` scores each node as a chain over its own
    path does (bit for bit where `exact`); returns the tree's CachedLM and the length before the tree."""
    vocab = model.config.vocab_size
    tree_lm = CachedLM(model, vocab, AUX, runner=runner())
    tree_lm.forward(prompt[:-1], keep=1)
    length = tree_lm.length
    offsets, sees = feed_layout(1, parents)
    feed = torch.cat([prompt[-1:], tokens])
    logits, _, aux = tree_lm.forward(feed, keep=len(feed), rows=tree_feed(length, offsets, sees))
    for node in range(len(tokens)):
        chain = CachedLM(model, vocab, AUX, runner=runner())
        chain.forward(prompt[:-1], keep=1)
        path = tokens[path_to(node, parents)]
        expected, _, expected_aux = chain.forward(torch.cat([prompt[-1:], path]), keep=len(path) + 1)
        assert torch.equal(logits[node + 1], expected[-1]) or not exact, node
        torch.testing.assert_close(logits[node + 1], expected[-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux[node + 1], expected_aux[-1], rtol=1e-4, atol=1e-4)
        chain.close()
    return tree_lm, length
