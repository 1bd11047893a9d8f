"""The heads' cards (<head>.json beside each head): which are readable, which evaluation fits a
temperature, and which head to decode with at a temperature.

A card's frontier is its head against the static-w frontier on a held-out set; `evaluations` holds the
same at other settings (greedy or sampled). A malformed card counts as none.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..models.heads import greedy_twin, sampled_twin, trained_for_greedy
from .shipped_files import dig, read_json

FRONTIER_COMMAND = "diversed-demo frontier --task <task> --head <name> --max-new-tokens 64 --write-card"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def readable_frontier(frontier) -> bool:
    """An evaluation the page can draw: static points and a head point, each with an acceptance in [0, 1],
    and numeric settings where it has them."""
    points = dig(frontier, "static_points")
    head = dig(frontier, "head_point")
    if not isinstance(points, list) or not isinstance(head, dict):
        return False
    rows_ok = all(
        isinstance(row, dict)
        and is_number(row.get("acceptance"))
        and 0 <= row["acceptance"] <= 1
        and (row.get("w") is None or is_number(row["w"]))
        for row in [*points, head]
    )
    settings = dig(frontier, "settings") or {}
    return (
        rows_ok
        and isinstance(settings, dict)
        and all(
            is_number(settings[key])
            for key in ("n_draft", "max_new_tokens", "temperature")
            if key in settings
        )
    )


def head_cards(head_paths: dict[str, Path]) -> dict[str, dict]:
    """{head name: its card} for the heads that have a readable one (<head>.json beside the head); a
    malformed card is left out, as if the head had none."""
    cards = {}
    for name, path in head_paths.items():
        card, _ = read_json(Path(path).with_suffix(".json"))
        if readable_frontier(dig(card, "frontier")):
            cards[name] = card
    return cards


def is_greedy(temperature) -> bool:
    return temperature == 0


def trained_greedy(card: dict) -> bool:
    return trained_for_greedy(card.get("training"))


def is_cost_head(card: dict) -> bool:
    """Whether a card is a cost head's (a curve on the dial, drawn from the rule's reports, not a star)."""
    training = card.get("training")
    return isinstance(training, dict) and training.get("kind") == "cost"


def card_task(card: dict) -> str:
    return card.get("task") or "general"


def frontier_at(card: dict, temperature: float) -> dict | None:
    """The card's evaluation on its primary set measured greedily (T = 0) or sampled (T > 0), as
    `temperature` is; None where it has none of that kind."""
    primary = card["frontier"]
    held_out = dig(primary, "settings", "held_out")
    candidates = [primary, *(card.get("evaluations") or {}).values()]
    return next(
        (
            e
            for e in candidates
            if readable_frontier(e)
            and dig(e, "settings", "held_out") == held_out
            and is_greedy(dig(e, "settings", "temperature")) == is_greedy(temperature)
        ),
        None,
    )


def head_for_temperature(cards: dict[str, dict], head_name, temperature):
    """The head to decode with at `temperature`: `head_name` if it was trained for that kind of decoding
    (greedy or sampled), else its task's head that was (`<name>-greedy` ↔ `<name>` first); None to keep
    the user's choice where no such head exists."""
    card = cards.get(head_name)
    if card is None or trained_greedy(card) == is_greedy(temperature):
        return None
    task = card.get("task")
    fits = [
        n for n, c in cards.items() if c.get("task") == task and trained_greedy(c) == is_greedy(temperature)
    ]
    twin = greedy_twin(head_name) if is_greedy(temperature) else sampled_twin(str(head_name))
    return twin if twin in fits else next(iter(fits), None)
