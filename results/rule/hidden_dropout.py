"""Why the greedy twins drop half of the hidden states' entries in their warm start: a head fitted to the
per-token optimum at λ = 2 on the general task's greedy positions (runs/positions/general-T0-N4, recorded
here up to 40,000 if fewer), and the share of the optimum's held-out gain over static w it keeps, with and
without the dropout, and reading the p/q terms alone (hidden states zeroed). Seed 0; a few minutes on 2 CPU
cores. Usage: .venv/bin/python results/rule/hidden_dropout.py"""

import dataclasses

import torch

from diversed_demo.models.heads import new_head
from diversed_demo.models.loading import load_models
from diversed_demo.training.diagnostics import frontier_gain
from diversed_demo.training.objective import head_weights
from diversed_demo.training.positions import POSITIONS_MAX_NEW_TOKENS, load_positions, record_positions
from diversed_demo.training.warm_start import fit_to_positions

LAM, FOLDER = 2.0, "runs/positions/general-T0-N4"


def held_out_share(pair, fit, held, dropout: float) -> float:
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=64, w_init=0.7, pq_features=True)
    fit_to_positions(head, fit, LAM, steps=300, lr=3e-3, hidden_dropout=dropout)
    with torch.no_grad():
        return frontier_gain(head_weights(head, held, LAM, hard=True)[0], held)["share_of_optimum"]


def without_hidden(positions):
    zeros = {k: torch.zeros_like(getattr(positions, k)) for k in ("target_hidden", "draft_hidden")}
    return dataclasses.replace(positions, **zeros)


def main() -> None:
    pair = load_models()
    record_positions(pair, "general", FOLDER, 40_000, 0.0, 4, POSITIONS_MAX_NEW_TOKENS)
    print("| fitted positions | hidden dropout 0 | 0.5 | p/q terms alone |\n|---|---|---|---|")
    for count in (16_000, 40_000):
        fit, held = load_positions(FOLDER, limit=count)
        shares = [held_out_share(pair, fit, held, d) for d in (0.0, 0.5)]
        alone = held_out_share(pair, without_hidden(fit), without_hidden(held), 0.0)
        print(f"| {count:,} | " + " | ".join(f"{s:.2f}" for s in (*shares, alone)) + " |", flush=True)


if __name__ == "__main__":
    main()
