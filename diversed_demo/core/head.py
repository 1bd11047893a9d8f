"""The ensemble weight w_t of each drafted position: a constant for exact (w = 1) and static modes, the
per-token rule from p and q (cost_rule.py), or a learned head reading both models' last hidden states
(files and pair binding: models/heads.py)."""

from __future__ import annotations

import torch
from torch import nn

from .cost_rule import cost_weights, greedy_cost_weights


class ConstantHead:
    """A head that always answers the same w: the decoder's rule for exact (w = 1) and static modes."""

    def __init__(self, ensemble_weight: float):
        self.value = float(ensemble_weight)

    def ensemble_weight(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        return torch.full((target_hidden.shape[0],), self.value, device=target_hidden.device)


class EnsembleHead(nn.Module):
    """w_t = w_min + (1 − w_min)·sigmoid(MLP([h_target; h_draft])).

    The input is layer-normalised (without affine) because the two models' hidden states live on
    different scales. `hidden_size=0` gives the paper's linear head.
    """

    def __init__(
        self,
        target_hidden: int,
        draft_hidden: int,
        hidden_size: int = 64,
        w_min: float = 0.0,
        w_init: float = 0.8,
        meta: dict | None = None,
    ):
        super().__init__()
        self.config = {
            "target_hidden": target_hidden,
            "draft_hidden": draft_hidden,
            "hidden_size": hidden_size,
            "w_min": w_min,
        }
        self.meta = dict(meta or {})
        features = target_hidden + draft_hidden
        self.norm = nn.LayerNorm(features, elementwise_affine=False)
        if hidden_size:
            self.mlp = nn.Sequential(nn.Linear(features, hidden_size), nn.GELU(), nn.Linear(hidden_size, 1))
        else:
            self.mlp = nn.Sequential(nn.Linear(features, 1))
        with torch.no_grad():  # start near w_init, whatever the features say
            last = self.mlp[-1]
            last.weight.mul_(0.1)
            frac = min(max((w_init - w_min) / (1 - w_min), 1e-3), 1 - 1e-3)
            last.bias.fill_(torch.logit(torch.tensor(frac)).item())

    def forward(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        features = torch.cat([target_hidden, draft_hidden], dim=-1).float()
        logit = self.mlp(self.norm(features)).squeeze(-1)
        w_min = self.config["w_min"]
        return w_min + (1.0 - w_min) * torch.sigmoid(logit)

    def ensemble_weight(self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor) -> torch.Tensor:
        return self(target_hidden, draft_hidden)


def weight_rule(config, greedy: bool):
    """w_t for every mode from one callable
    (target_probs [n, V], draft_probs [n, V], draft_tokens [n], target_hidden [n, H], draft_hidden [n, Hd])
    -> [n]: exact is w = 1, static a constant, cost the per-token rule at λ, dynamic the head."""
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
