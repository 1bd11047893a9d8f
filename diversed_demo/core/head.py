"""The ensemble weight w_t of each drafted position: a constant for exact (w = 1) and static modes, the
per-token rule from p and q (cost_rule.py), or a learned head: EnsembleHead reads both models' last hidden
states, CostHead corrects the rule's per-token cost and is thresholded by λ as the rule is (files and pair
binding: models/heads.py)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .cost_rule import cost_weights, greedy_cost_weights, greedy_position_costs, position_costs


class ConstantHead:
    """A head that always answers the same w: the decoder's rule for exact (w = 1) and static modes."""

    def __init__(self, ensemble_weight: float):
        self.value = float(ensemble_weight)

    def ensemble_weight(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        return torch.full((target_hidden.shape[0],), self.value, device=target_hidden.device)


class EnsembleHead(nn.Module):
    """w_t = w_min + (1 − w_min)·sigmoid(MLP([LN(h_target); LN(h_draft)] (; the p/q terms))).

    The hidden states are layer-normalised (without affine) because the two models' live on different
    scales. With `pq_features`, the MLP also reads the rule's terms at the position (pq_terms: CE − H, TV,
    H(p); in greedy decoding their point-mass forms, cost_rule.greedy_position_costs), which the hidden
    states alone predicted poorly. `hidden_size=0` gives the paper's linear head.
    """

    def __init__(
        self,
        target_hidden: int,
        draft_hidden: int,
        hidden_size: int = 64,
        w_min: float = 0.0,
        w_init: float = 0.8,
        pq_features: bool = False,
        meta: dict | None = None,
    ):
        super().__init__()
        self.config = {
            "target_hidden": target_hidden,
            "draft_hidden": draft_hidden,
            "hidden_size": hidden_size,
            "w_min": w_min,
        }
        if pq_features:  # absent from the files of heads that read hidden states only
            self.config["pq_features"] = True
        self.meta = dict(meta or {})
        self.norm = nn.LayerNorm(target_hidden + draft_hidden, elementwise_affine=False)
        features = target_hidden + draft_hidden + (PQ_TERMS if pq_features else 0)
        if hidden_size:
            self.mlp = nn.Sequential(nn.Linear(features, hidden_size), nn.GELU(), nn.Linear(hidden_size, 1))
        else:
            self.mlp = nn.Sequential(nn.Linear(features, 1))
        with torch.no_grad():  # start near w_init, whatever the features say
            last = self.mlp[-1]
            last.weight.mul_(0.1)
            frac = min(max((w_init - w_min) / (1 - w_min), 1e-3), 1 - 1e-3)
            last.bias.fill_(torch.logit(torch.tensor(frac)).item())

    @property
    def reads_pq(self) -> bool:
        return bool(self.config.get("pq_features"))

    def forward(self, target_hidden, draft_hidden, terms=None) -> torch.Tensor:
        """w_t [...] from the hidden states [..., H] and, for a head that reads them, pq_terms [..., 3]."""
        features = self.norm(torch.cat([target_hidden, draft_hidden], dim=-1).float())
        if self.reads_pq:
            features = torch.cat([features, terms.float()], dim=-1)
        logit = self.mlp(features).squeeze(-1)
        w_min = self.config["w_min"]
        return w_min + (1.0 - w_min) * torch.sigmoid(logit)

    def ensemble_weight(self, target_hidden, draft_hidden, terms=None) -> torch.Tensor:
        return self(target_hidden, draft_hidden, terms)


PQ_TERMS = 3  # asinh(CE − H), TV, asinh(H(p)): asinh keeps the nats' long tail from swamping the rest


def pq_terms(rule_cost: torch.Tensor, tv: torch.Tensor, target_entropy: torch.Tensor) -> torch.Tensor:
    """The rule's terms per position as a head's inputs [..., PQ_TERMS], from CE − H, TV and H(p) [...]."""
    return torch.stack([torch.asinh(rule_cost), tv, torch.asinh(target_entropy)], dim=-1)


# The width, in nats of cost, of the smoothed threshold σ((ĉ − λ·TV)/COST_SOFTNESS) that training
# differentiates through; decoding uses the hard threshold.
COST_SOFTNESS = 0.25
COST_HEAD_LAM = 4.0  # a cost head's default setting: between the λ it trains at (0.5, 2, 8), where it relaxes
LAM_OFFSET = 0.1  # log(λ + this) feeds the correction: finite at λ = 0, near log λ for the dial's values


class CostHead(nn.Module):
    """A learned verifier that is a curve on the dial: it prices relaxing each drafted position with a cost
    ĉ_t in nats, and λ thresholds it as the per-token rule does: w_t = 1 where ĉ_t > λ·TV(p, q), else 0.

    ĉ_t = CE(q, p) − H(p) + r_t: the rule's own cost (its optimum of fidelity + λ·acceptance) plus a learned
    correction r_t = MLP([LN(h_target); LN(h_draft); asinh of CE − H, TV and H(p); log(λ + 0.1)]) whose last
    layer starts at 0. An untrained head is therefore the rule at every λ; a task reward moves r_t only
    where the task's score says relaxing costs more or less than the target's likelihood shows. Sampled
    decoding only: greedy verification has no law to weigh (its heads are EnsembleHeads).
    """

    kind = "cost"

    def __init__(
        self, target_hidden: int, draft_hidden: int, hidden_size: int = 64, meta: dict | None = None
    ):
        super().__init__()
        self.config = {
            "kind": self.kind,
            "target_hidden": target_hidden,
            "draft_hidden": draft_hidden,
            "hidden_size": hidden_size,
        }
        self.meta = dict(meta or {})
        self.norm = nn.LayerNorm(target_hidden + draft_hidden, elementwise_affine=False)
        features = target_hidden + draft_hidden + PQ_TERMS + 1  # and log(λ + LAM_OFFSET)
        self.mlp = nn.Sequential(nn.Linear(features, hidden_size), nn.GELU(), nn.Linear(hidden_size, 1))
        with torch.no_grad():  # r_t = 0: the rule, until training says otherwise
            self.mlp[-1].weight.zero_()
            self.mlp[-1].bias.zero_()

    def cost(self, target_hidden, draft_hidden, rule_cost, tv, target_entropy, lam: float) -> torch.Tensor:
        """ĉ_t [...] from the hidden states [..., H] and the rule cost CE − H, TV and H(p) [...]."""
        hidden = self.norm(torch.cat([target_hidden, draft_hidden], dim=-1).float())
        price = torch.full_like(tv, math.log(lam + LAM_OFFSET))[..., None]
        terms = torch.cat([pq_terms(rule_cost, tv, target_entropy), price], dim=-1)
        return rule_cost + self.mlp(torch.cat([hidden, terms.float()], dim=-1)).squeeze(-1)

    def forward(self, target_hidden, draft_hidden, rule_cost, tv, target_entropy, lam: float) -> torch.Tensor:
        """The smoothed w_t [...] that training differentiates: σ((ĉ_t − λ·TV)/COST_SOFTNESS)."""
        cost = self.cost(target_hidden, draft_hidden, rule_cost, tv, target_entropy, lam)
        return torch.sigmoid((cost - lam * tv) / COST_SOFTNESS)

    def weights(self, target_probs, draft_probs, lam: float, target_hidden, draft_hidden) -> torch.Tensor:
        """w_t ∈ {0, 1} [n] of decoding, from p, q [n, V] and the hidden states [n, H]."""
        rule_cost, tv, target_entropy = position_costs(target_probs, draft_probs)
        cost = self.cost(target_hidden, draft_hidden, rule_cost, tv, target_entropy, lam)
        return (cost > lam * tv).float()


def weight_rule(config, greedy: bool, kernel=None):
    """w_t for every mode from one callable
    (target_probs [n, V], draft_probs [n, V], draft_tokens [n], target_hidden [n, H], draft_hidden [n, Hd])
    -> [n]: exact is w = 1, static a constant, cost the per-token rule at λ, dynamic the head (a CostHead
    at the config's λ). `kernel`: the pair's `head_kernel`, a greedy head's rule in one native call where
    it takes the head."""
    if config.mode == "dynamic" and isinstance(config.head, CostHead):
        return lambda p, q, x, target_hidden, draft_hidden: config.head.weights(
            p, q, config.lam, target_hidden, draft_hidden
        )
    if config.mode == "dynamic" and greedy and kernel is not None and kernel.takes(config.head):
        return lambda p, q, x, target_hidden, draft_hidden: kernel.greedy_weights(
            config.head, p, q, target_hidden, draft_hidden
        )
    if config.mode == "dynamic" and getattr(config.head, "reads_pq", False):
        costs = greedy_position_costs if greedy else position_costs
        return lambda p, q, x, target_hidden, draft_hidden: config.head.ensemble_weight(
            target_hidden, draft_hidden, pq_terms(*costs(p, q))
        )
    if config.mode == "dynamic":
        return lambda p, q, x, target_hidden, draft_hidden: config.head.ensemble_weight(
            target_hidden, draft_hidden
        )
    if config.mode == "cost" and greedy:
        return lambda p, q, x, *hidden: greedy_cost_weights(p, q, x, config.lam)
    if config.mode == "cost":
        return lambda p, q, x, *hidden: cost_weights(p, q, config.lam)
    constant = ConstantHead(1.0 if config.mode in ("exact", "ar") else float(config.ensemble_weight))
    return lambda p, q, x, target_hidden, draft_hidden: constant.ensemble_weight(target_hidden, draft_hidden)
