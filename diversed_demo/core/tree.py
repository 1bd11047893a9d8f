"""Draft trees: several candidates per position, scored by one target pass and verified against ν.

A tree of n drafted nodes hangs from the root, the last verified token. Node i holds a token and its parent
(−1 for the root); its depth is one more than its parent's. A node's children are the nodes whose parent it
is, in index order, which is the order the draft drew them. A chain is the tree where each node has at most
one child. Rows: row 0 is the root's position and row i + 1 node i's, so

    target_probs [n + 1, V]  the target's distribution after each row's token (one pass scores them all),
    draft_probs  [n + 1, V]  the draft's distribution there, the one that row's children were drawn from
                             (unused where a row has no children),
    w            [n + 1]     the ensemble weight at each row, ν = w·p + (1 − w)·q there.

Sampled verification is recursive rejection sampling against ν at each row of the path: the row's children
are tried in turn, child i kept with probability min(1, r(x_i) / q_i(x_i)), where r starts as ν and after
each rejection becomes norm(max(0, r − q_i)); q_i is the law child i was drawn from: q itself when the
children are drawn with replacement, q without the children drawn before it, renormalised, when without.
Each try is one rejection step of a draw from q_i against r, so the token emitted at each position follows
ν given the path (SpecTr, Sun et al. 2023; recursive rejection sampling without replacement, Jeon et al.
2024). If every child is rejected the token is drawn from the last r. Past a kept leaf comes the bonus
token: from ν where the draft gave its q there (it expanded the node and none of its children was kept),
from p where it did not, as after a chain's last draft. How many children a row gets may depend on anything
drawn before them, never on their own draws.

Greedy verification follows the children that equal argmax ν, and emits argmax ν at the first row where none
does (past a leaf, argmax of the bonus's law): greedy exact decoding on a tree is target-only's, token for
token, where the pass gives each node the logits a chain over its path would. In float32 it does; in bf16
a near-tie may round apart, as a node's ancestors sit with masked slots between them (docs/results.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import greedy_tokens, sample
from .verify import acceptance_prob, ensemble_probs

RESIDUAL_FLOOR = 1e-12  # a residual with less mass than this could not have been reached: keep r


def children_of(parents: list[int]) -> list[list[int]]:
    """Per row (root, then each node), the indices of its children in draw order."""
    children = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            raise ValueError(f"node {node}'s parent {parent} must be −1 or an earlier node")
        children[parent + 1].append(node)
    return children


def depths(parents: list[int]) -> list[int]:
    """Each node's depth: 1 for the root's children."""
    result = []
    for parent in parents:
        result.append(1 if parent < 0 else result[parent] + 1)
    return result


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node i sees node j where j is i or one of its ancestors (the tree's attention among the
    drafted nodes; every node also sees the whole verified sequence)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] |= mask[parent]
    return mask


def feed_layout(prefix: int, parents: list[int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A target feed of `prefix` unseen sequence tokens followed by a tree's nodes: each row's position past
    the first (offsets [k]: the prefix's in turn, a node's its depth past the last) and what the rows see
    of each other (sees [k, k]: the prefix causally, a node the whole prefix, its ancestors and itself),
    both on `device`."""
    k = prefix + len(parents)
    offsets = torch.tensor(list(range(prefix)) + [prefix - 1 + d for d in depths(parents)])
    sees = torch.ones(k, k, dtype=torch.bool).tril()
    sees[prefix:, prefix:] = ancestor_mask(parents)
    return offsets.to(device), sees.to(device)


@dataclass
class TreeVerdict:
    """What verifying a tree decided: the kept nodes from the root down, the token after them (a redraw
    at the first rejection, or the bonus), and every tried child with its chance of being kept."""

    path: list[int]
    next_token: torch.Tensor
    tried: list[tuple[int, float]]  # (node, min(1, r(x)/q_i(x))) in the order tried
    rejected_at: int | None  # the row whose children were all rejected, or None past a kept leaf


def residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, r − q)) [V], or r where that has no mass (a rejection that could not happen)."""
    rest = torch.clamp(r - q, min=0.0)
    mass = float(rest.sum())
    return rest / mass if mass > RESIDUAL_FLOOR else r


def without(q: torch.Tensor, token: int) -> torch.Tensor:
    """q [V] with `token` removed, renormalised: the law of the next draw without replacement."""
    rest = q.clone()
    rest[token] = 0.0
    mass = float(rest.sum())
    return rest / mass if mass > 0 else rest


def bonus_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor, w) -> torch.Tensor:
    """The law of the token past a kept leaf [V]: ν where the draft's q [V] is there, else p (q is zeros)."""
    if float(draft_probs.sum()) > 0:
        return ensemble_probs(target_probs, draft_probs, w)
    return target_probs


def verify_tree(
    tokens, parents, draft_probs, target_probs, w, generator=None, replacement: bool = False
) -> TreeVerdict:
    """Sampled verification of a tree (tokens [n], parents: list of n ints; the rows as the module says)."""
    children, row, path, tried = children_of(parents), 0, [], []
    while children[row]:
        r = ensemble_probs(target_probs[row], draft_probs[row], w[row])
        q = draft_probs[row]
        kept = None
        for node in children[row]:
            x = int(tokens[node])
            chance = float(acceptance_prob(r[x], q[x]))
            tried.append((node, chance))
            if float(torch.rand((), generator=generator)) < chance:
                kept = node
                break
            r = residual(r, q)
            if not replacement:
                q = without(q, x)
        if kept is None:
            return TreeVerdict(path, sample(r, generator), tried, row)
        path.append(kept)
        row = kept + 1
    bonus = bonus_probs(target_probs[row], draft_probs[row], w[row])
    return TreeVerdict(path, sample(bonus, generator), tried, None)


def verify_tree_greedy(tokens, parents, draft_probs, target_probs, w) -> TreeVerdict:
    """Greedy verification of a tree: follow the child that is argmax ν at each row."""
    children, row, path, tried = children_of(parents), 0, [], []
    while children[row]:
        choice = greedy_tokens(ensemble_probs(target_probs[row], draft_probs[row], w[row]))
        kept = next((node for node in children[row] if int(tokens[node]) == int(choice)), None)
        tried += [(node, float(node == kept)) for node in children[row]]
        if kept is None:
            return TreeVerdict(path, choice, tried, row)
        path.append(kept)
        row = kept + 1
    bonus = bonus_probs(target_probs[row], draft_probs[row], w[row])
    return TreeVerdict(path, greedy_tokens(bonus), tried, None)
