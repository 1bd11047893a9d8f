"""Draft trees verified against ν: each emitted token follows ν given the path, for exact, static, the rule
and a head, with children drawn with and without replacement; greedy follows argmax ν."""

import collections

import pytest
import torch
from stats import chi_square_pvalue

from diversed_demo.core import tree as tree_module
from diversed_demo.core.cost_rule import cost_weights
from diversed_demo.core.head import EnsembleHead
from diversed_demo.core.sampling import sample, sample_distinct
from diversed_demo.core.tree import (
    ancestor_mask,
    children_of,
    depths,
    verify_tree,
    verify_tree_greedy,
)
from diversed_demo.core.verify import ensemble_probs

VOCAB, ROOT_CHILDREN, NODE_CHILDREN, TRIALS = 6, 3, 2, 12000


def dists(shape, seed, sharp=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(*shape, VOCAB, generator=g), -1)


class World:
    """A tiny pair as distributions of the prefix: at the root (p0, q0), after token x (p1[x], q1[x]), after
    x then y (p2[x, y]); and a mode's w at each row, from p and q (and, for a head, hidden states of the
    prefix)."""

    def __init__(self, mode: str):
        self.p0, self.q0 = dists((), 1), dists((), 2)
        self.p1, self.q1 = dists((VOCAB,), 3), dists((VOCAB,), 4)
        self.p2 = dists((VOCAB, VOCAB), 5)
        self.mode = mode
        torch.manual_seed(0)
        self.head = EnsembleHead(4, 4, hidden_size=8, w_init=0.5)
        self.hidden = torch.randn(VOCAB + 1, 8, generator=torch.Generator().manual_seed(6))

    def w(self, p, q, prefix: int) -> float:
        """w at a row whose prefix ends in token `prefix` (VOCAB for the root)."""
        if self.mode == "exact":
            return 1.0
        if self.mode == "static":
            return 0.4
        if self.mode == "rule":
            return float(cost_weights(p[None], q[None], lam=0.3)[0])
        with torch.no_grad():
            return float(self.head(self.hidden[prefix, :4][None], self.hidden[prefix, 4:][None])[0])

    def nu(self, row: str, x: int | None = None) -> torch.Tensor:
        p, q, prefix = (self.p0, self.q0, VOCAB) if row == "root" else (self.p1[x], self.q1[x], x)
        return ensemble_probs(p, q, self.w(p, q, prefix))

    def tree(self, generator, replacement: bool):
        """A depth-2 tree drawn as a draft would: children from q at each row (rows: root, then nodes)."""
        draw = (
            (lambda q, k: torch.multinomial(q, k, replacement=True, generator=generator))
            if replacement
            else (lambda q, k: sample_distinct(q, k, generator))
        )
        tokens, parents, p_rows, q_rows, w_rows = [], [], [self.p0], [self.q0], [None]
        w_rows[0] = self.w(self.p0, self.q0, VOCAB)
        for x in draw(self.q0, ROOT_CHILDREN).tolist():
            tokens.append(x), parents.append(-1)
            (
                p_rows.append(self.p1[x]),
                q_rows.append(self.q1[x]),
                w_rows.append(self.w(self.p1[x], self.q1[x], x)),
            )
        for node in range(len(tokens)):
            x = tokens[node]
            for y in draw(self.q1[x], NODE_CHILDREN).tolist():
                tokens.append(y), parents.append(node)
                p_rows.append(self.p2[x, y]), q_rows.append(self.p2[x, y]), w_rows.append(1.0)  # leaves
        return torch.tensor(tokens), parents, torch.stack(q_rows), torch.stack(p_rows), torch.tensor(w_rows)


def emitted(world: World, generator, replacement: bool) -> list[int]:
    tokens, parents, q, p, w = world.tree(generator, replacement)
    verdict = verify_tree(tokens, parents, q, p, w, generator, replacement=replacement)
    return [int(tokens[node]) for node in verdict.path] + [int(verdict.next_token)]


def laws_hold(mode: str, replacement: bool, seed: int = 0) -> float:
    """The smallest chi-square p-value of: the first token against ν at the root; the second, after each
    frequently kept first token x, against ν after x; the bonus after a kept leaf against p there."""
    world, generator = World(mode), torch.Generator().manual_seed(seed)
    runs = [emitted(world, generator, replacement) for _ in range(TRIALS)]
    pvalues = [
        chi_square_pvalue(collections.Counter(r[0] for r in runs), dict(enumerate(world.nu("root").tolist())))
    ]
    for x in range(VOCAB):
        seconds = collections.Counter(r[1] for r in runs if len(r) > 1 and r[0] == x)
        if sum(seconds.values()) >= 1500:
            pvalues.append(chi_square_pvalue(seconds, dict(enumerate(world.nu("node", x).tolist()))))
    bonus = collections.Counter(r[2] for r in runs if len(r) == 3 and r[:2] == [0, 0])
    if sum(bonus.values()) >= 500:
        pvalues.append(chi_square_pvalue(bonus, dict(enumerate(world.p2[0, 0].tolist()))))
    return min(pvalues)


def test_a_tree_knows_its_children_depths_and_ancestors():
    parents = [-1, -1, 0, 0, 2]
    assert children_of(parents) == [[0, 1], [2, 3], [], [4], [], []]
    assert depths(parents) == [1, 1, 2, 2, 3]
    mask = ancestor_mask(parents)
    assert mask[4].tolist() == [True, False, True, False, True]
    assert mask[1].tolist() == [False, True, False, False, False]
    with pytest.raises(ValueError, match="parent"):
        children_of([-1, 3])


def test_distinct_draws_never_repeat_and_follow_successive_draws():
    g = torch.Generator().manual_seed(1)
    q = dists((), 7)
    draws = [tuple(sample_distinct(q, 2, g).tolist()) for _ in range(20000)]
    assert all(a != b for a, b in draws)
    first = collections.Counter(a for a, _ in draws)
    assert chi_square_pvalue(first, dict(enumerate(q.tolist()))) > 0.001
    # the second draw follows q without the first, renormalised
    after = collections.Counter(b for a, b in draws if a == int(q.argmax()))
    rest = q.clone()
    rest[q.argmax()] = 0
    assert chi_square_pvalue(after, dict(enumerate((rest / rest.sum()).tolist()))) > 0.001
    sparse = torch.tensor([0.0, 0.5, 0.5, 0.0])
    assert sorted(sample_distinct(sparse, 3, g).tolist()) == [1, 2]  # never a token of probability 0


@pytest.mark.parametrize("replacement", [False, True], ids=["without-replacement", "with-replacement"])
@pytest.mark.parametrize("mode", ["exact", "static", "rule", "head"])
def test_every_token_a_tree_emits_follows_nu_given_the_path(mode, replacement):
    assert laws_hold(mode, replacement) > 0.001


@pytest.mark.parametrize("mutation", ["no residual", "residual of q with replacement"])
def test_the_law_tests_fail_when_the_residual_is_broken(monkeypatch, mutation):
    """The chi-square tests above can fail: a residual that forgets what was rejected, or (drawing without
    replacement) one that takes the rejected child's law to be q itself, emits other laws."""
    if mutation == "no residual":
        monkeypatch.setattr(tree_module, "residual", lambda r, q: r)
    else:
        monkeypatch.setattr(tree_module, "without", lambda q, token: q)
    assert laws_hold("static", replacement=False) < 1e-4


def test_greedy_follows_argmax_nu_and_emits_it_at_the_first_miss():
    world = World("static")
    tokens = torch.tensor([int(world.nu("root").argmax()), 5, 0, 1])
    parents = [-1, -1, 0, 0]
    x = int(tokens[0])
    choice = int(world.nu("node", x).argmax())
    tokens[2:] = torch.tensor([(choice + 1) % VOCAB, (choice + 2) % VOCAB])  # neither child is argmax ν
    p = torch.stack([world.p0, world.p1[x], world.p1[5], world.p2[x, 0], world.p2[x, 1]])
    q = torch.stack([world.q0, world.q1[x], world.q1[5], world.p2[x, 0], world.p2[x, 1]])
    w = torch.tensor(
        [world.w(world.p0, world.q0, VOCAB), world.w(world.p1[x], world.q1[x], x), 1.0, 1.0, 1.0]
    )
    verdict = verify_tree_greedy(tokens, parents, q, p, w)
    assert verdict.path == [0] and int(verdict.next_token) == choice and verdict.rejected_at == 1
    tokens[3] = choice  # now the second child of node 0 is: kept, then the bonus is argmax p at that leaf
    verdict = verify_tree_greedy(tokens, parents, q, p, w)
    assert (
        verdict.path == [0, 3]
        and int(verdict.next_token) == int(p[4].argmax())
        and verdict.rejected_at is None
    )


def test_a_chain_verified_as_a_tree_keeps_the_chains_law():
    """With one child a row, recursive rejection is the chain's rule: the same coins give the same tokens
    (the bonus from p, where the draft did not look past its last token)."""
    world = World("static")
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    from diversed_demo.core.verify import verify_block

    for _ in range(200):
        x = int(sample(world.q0, g1))
        g2.set_state(g1.get_state())
        p = torch.stack([world.p0, world.p1[x]])
        q = torch.stack([world.q0, torch.zeros(VOCAB)])  # past a chain's last draft q is not known
        w = torch.tensor([0.4, 0.4])
        tree_verdict = verify_tree(torch.tensor([x]), [-1], q, p, w, g1)
        n_accepted, next_token, _ = verify_block(torch.tensor([x]), q[:1], p, 0.4, g2)
        assert len(tree_verdict.path) == n_accepted
        if n_accepted:
            assert int(tree_verdict.next_token) == int(next_token)
