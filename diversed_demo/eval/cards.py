"""Head cards: each evaluation of a head, kept in <head>.json beside it and in its metadata; the app
draws the card's primary evaluation."""

from __future__ import annotations

import json
from pathlib import Path

from ..common.files import write_text
from ..models.heads import save_head
from .schemas import HeadCard, checked


def evaluation_key(set_name: str, temperature: float) -> str:
    """How a card names one evaluation: "<held-out set>, T=1" or "<held-out set>, greedy"."""
    return f"{set_name}, " + ("greedy" if temperature == 0 else f"T={temperature:g}")


def write_head_card(path: Path, head, evaluation: dict, key: str, primary: bool) -> dict:
    """Add one evaluation to the head's card (<head>.json beside it) and to its metadata; returns the card.

    The card keeps every evaluation of this head under "evaluations" (one per held-out set and
    temperature); "frontier" is the primary one the app draws (evaluate_heads marks it: the task's default
    set at the kind of decoding the head was trained for), else the first written. A card written for
    another training run of the same file starts afresh."""
    card_path = path.with_suffix(".json")
    old = json.loads(card_path.read_text()) if card_path.exists() else {}
    same_run = old.get("training") == head.meta.get("training")
    evaluations = {**(old.get("evaluations") or {}), key: evaluation} if same_run else {key: evaluation}
    frontier = evaluation if primary or not (same_run and old.get("frontier")) else old["frontier"]
    card = {
        "head": path.stem,
        "task": head.meta.get("task"),
        "pair": head.meta.get("pair"),
        "training": head.meta.get("training"),
        "warm_start": head.meta.get("warm_start"),
        "held_out": head.meta.get("held_out"),  # the trained head on held-out positions (a scaled warm start)
        "train_figures": head.meta.get("train_figures"),
        "frontier": frontier,
        "evaluations": evaluations,
    }
    write_text(card_path, json.dumps(checked(HeadCard, card), indent=2) + "\n")
    head.meta["evaluation"], head.meta["evaluations"] = frontier, evaluations
    save_head(head, path)
    return card
