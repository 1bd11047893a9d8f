"""How a draft grows a tree for one step: EAGLE-2's dynamic tree (the most valuable nodes of each depth
expanded, their likeliest children drawn, the most valuable nodes kept), sized as the chain's length is.

A node's value is the chance that it is reached and kept: its parent's value times the child's chance,
α(s_j), where s_j is the j-th largest probability of the parent's q (greedy, the child's own q, as the
children are q's top tokens) and draft_length.py maps it to a chance, apart for a row's first child and
its later ones (which are kept only where the target passes over the first). A child's
value never exceeds its parent's, so the most valuable nodes form a tree, and siblings rank in draw
order: the kept children of a row are the first ones drawn, decided before they were drawn, which keeps
sampled verification's law (tree.py). A tree of n nodes is expected to emit 1 + the sum of their values.

Sizing, with the chain's costs (c a draft step, v_n a target pass over n drafts and the bonus): the draft
expands another depth while that depth's most valuable node, times a draft's mean chance ᾱ, returns at
least the step's rate so far for c + Δv; then nodes are kept in value order while each returns the
rate for its Δv. A fixed shape keeps its number of nodes. With width 1 and expansion 1 the tree is the
chain, and this is the chain's rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .draft_length import AdaptiveLength, FixedLength
from .sampling import sample_distinct


@dataclass(frozen=True)
class TreeShape:
    """The most a tree may hold: children a node, nodes expanded a depth, depth, nodes."""

    width: int = 3
    expand: int = 3
    depth: int = 5
    nodes: int = 7


@dataclass
class DraftTree:
    """A step's drafted tree: rows are the root's position then each node's (tree.py)."""

    tokens: torch.Tensor  # [n]
    parents: list[int]
    draft_probs: torch.Tensor  # [n + 1, V] q at each row (zeros where a row was not expanded)
    draft_hidden: torch.Tensor | None  # [n + 1, Hd] the draft's hidden state that gave each row's q
    confidences: list[float]  # per node, the s_j its value was priced from
    later: list[bool]  # per node, whether it is a later child (not its row's first)
    expanded: list[bool]  # per row, whether the draft drew its children


@dataclass
class Grower:
    """One step's growth: every drawn node with its value, then the kept ones."""

    shape: TreeShape
    length: FixedLength | AdaptiveLength  # its chances (and, adaptive, its costs)
    greedy: bool
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)  # per drawn node, its index in q's vocabulary
    parents: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    later: list[bool] = field(default_factory=list)  # per drawn node: not its row's first child
    depth_of: list[int] = field(default_factory=list)
    rows: dict = field(default_factory=dict)  # row -> (q [Vq], the draft's hidden [Hd] or None)
    spent: int = 0  # draft steps this step, the root's included

    def root(self, q: torch.Tensor, hidden) -> None:
        self.spent = 1
        self._draw(-1, q, hidden, 1.0, 0)

    def _draw(self, parent: int, q: torch.Tensor, hidden, value: float, depth: int) -> None:
        """Record row parent + 1's q and draw its children."""
        self.rows[parent + 1] = (q, hidden)
        if depth >= self.shape.depth:
            return
        top = q.topk(min(self.shape.width, self.shape.nodes))
        ranked = [s for s in top.values.tolist() if s > 0]  # no child of probability 0
        if self.greedy:
            children = top.indices[: len(ranked)]
        else:
            children = sample_distinct(q, len(ranked), self.generator)
        for rank, (child, s) in enumerate(zip(children.tolist(), ranked)):
            self.tokens.append(child)
            self.parents.append(parent)
            self.confidences.append(s)
            self.later.append(rank > 0)
            self.values.append(value * self.length.chance(s, later=rank > 0))
            self.depth_of.append(depth + 1)

    def to_expand(self) -> list[int]:
        """The nodes the draft expands next (the most valuable of the newest depth), or none: stop."""
        depth = max(self.depth_of, default=0)
        if depth >= self.shape.depth or not self.tokens:
            return []
        newest = [i for i, d in enumerate(self.depth_of) if d == depth]
        newest = sorted(newest, key=lambda i: -self.values[i])[: self.shape.expand]
        if not self._expansion_pays(self.values[newest[0]]):
            return []
        return newest

    def expanded(self, nodes: list[int], q_rows: torch.Tensor, hidden_rows) -> None:
        """The draft's q [m, Vq] (and hidden states [m, Hd]) at the nodes it expanded."""
        self.spent += 1
        for j, node in enumerate(nodes):
            hidden = None if hidden_rows is None else hidden_rows[j]
            self._draw(node, q_rows[j], hidden, self.values[node], self.depth_of[node])

    def _order(self) -> list[int]:
        """Drawn nodes by value (a parent before its children, siblings in draw order on ties)."""
        return sorted(range(len(self.tokens)), key=lambda i: (-self.values[i], self.depth_of[i], i))

    def _adaptive(self) -> bool:
        return isinstance(self.length, AdaptiveLength)

    def _rate(self, kept: list[int]) -> float:
        """Tokens a step is expected to emit per unit of its cost, with these nodes kept."""
        rule = self.length
        return (1 + sum(self.values[i] for i in kept)) / (self.spent * rule.c + rule.v[len(kept)])

    def _expansion_pays(self, best: float) -> bool:
        if not self._adaptive():  # a fixed shape expands to its depth
            return True
        rule, kept = self.length, self._kept()
        if len(kept) >= len(rule.v) - 1:
            return False
        step = rule.c + rule.v[len(kept) + 1] - rule.v[len(kept)]
        return best * rule.mean_chance() / step >= self._rate(kept)

    def _kept(self) -> list[int]:
        """The nodes kept: the most valuable, while each pays for its share of the target's pass."""
        if not self._adaptive():
            return self._order()[: self.shape.nodes]
        rule, kept = self.length, []
        for node in self._order()[: min(self.shape.nodes, len(rule.v) - 1)]:
            if self.values[node] / (rule.v[len(kept) + 1] - rule.v[len(kept)]) < self._rate(kept):
                break
            kept.append(node)
        return kept

    def tree(self, to_token, full_probs) -> DraftTree:
        """The kept nodes as a DraftTree, in draw order (parents first, siblings as drawn). `to_token` maps
        q's indices to the vocabulary's token ids, `full_probs` q rows [m, Vq] to [m, V]."""
        kept = sorted(self._kept())  # draw order: parents first, siblings as drawn
        index = {node: j for j, node in enumerate(kept)}
        parents = [-1 if self.parents[i] < 0 else index[self.parents[i]] for i in kept]
        rows = [0] + [i + 1 for i in kept]
        some_q, some_hidden = next(iter(self.rows.values()))
        q_rows = [self.rows.get(row, (torch.zeros_like(some_q), None))[0] for row in rows]
        hidden = None
        if some_hidden is not None:
            zero = torch.zeros_like(some_hidden)
            hidden = torch.stack([self.rows.get(row, (None, zero))[1] for row in rows])
        tokens = to_token(torch.tensor([self.tokens[i] for i in kept], dtype=torch.long))
        return DraftTree(
            tokens,
            parents,
            full_probs(torch.stack(q_rows)),
            hidden,
            [self.confidences[i] for i in kept],
            [self.later[i] for i in kept],
            [row in self.rows for row in rows],
        )
