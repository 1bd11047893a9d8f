"""The shipped cost heads on the held-out positions recorded at scale (runs/positions, the same the sampled
heads' warm starts use: `train --warm-start-positions`, recorded there if absent): each head's share of the
per-token optimum's gain over static w at its default λ and at each λ it trained at, written into its
metadata and card as "held_out" (as training writes it for a head warm-started at scale).

Usage: .venv/bin/python results/rule/held_out_cost_heads.py [task ...]
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from diversed_demo.common.files import write_text
from diversed_demo.core.head import COST_HEAD_LAM
from diversed_demo.models.heads import HEADS_DIR, load_head, save_head
from diversed_demo.runtime.plan import load_pair
from diversed_demo.training.config import HeadTrainConfig
from diversed_demo.training.warm_start import held_out_figures, scaled_positions

POSITIONS = 100_000  # as the sampled heads' recipe (docs/training.md)


def measure(pair, task: str) -> list[dict]:
    path = HEADS_DIR / f"{task}-cost.safetensors"
    head = load_head(path, pair)
    trained = HeadTrainConfig(**head.meta["training"])
    config = replace(trained, positions_dir="runs/positions", warm_start_positions=POSITIONS)
    _, held_back, _ = scaled_positions(pair, config, progress=True)  # recorded first where absent
    figures = held_out_figures(head, held_back, (COST_HEAD_LAM, *trained.lams))
    head.meta["held_out"] = figures
    save_head(head, path)
    card_path = Path(path).with_suffix(".json")
    card = json.loads(card_path.read_text())
    card["held_out"] = figures
    write_text(card_path, json.dumps(card, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    pair = load_pair("smollm2-135m", None, "auto", "bfloat16", compiled="off")
    for task in sys.argv[1:] or ("general", "summarization", "math", "code"):
        for f in measure(pair, task):
            print(
                f"{task}-cost λ={f['lam']:g}: acceptance {f['acceptance']:.3f}, share of the optimum's gain "
                f"{f['share_of_optimum']:.2f} ({f['positions']} held-out positions)"
            )
