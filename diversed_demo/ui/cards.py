"""The heads' cards (<head>.json beside each head): which are readable, which evaluation fits a
temperature, and which head to decode with at a temperature.

A card's frontier is its head against the static-w frontier on a held-out set; `evaluations` holds the
same at other settings (greedy or sampled). A malformed card counts as none.
"""

from __future__ import annotations

from pathlib import Path

from ..eval.schemas import Evaluation, HeadCard, read_model
from ..models.heads import greedy_twin, sampled_twin, trained_for_greedy

FRONTIER_COMMAND = "diversed-demo frontier --task <task> --head <name> --max-new-tokens 64 --write-card"


def head_cards(head_paths: dict[str, Path]) -> dict[str, HeadCard]:
    """{head name: its card} for the heads that have a valid one (<head>.json beside the head, checked
    against eval/schemas.HeadCard); a malformed card is left out, as if the head had none."""
    cards = {}
    for name, path in head_paths.items():
        card, _ = read_model(HeadCard, Path(path).with_suffix(".json"))
        if card is not None:
            cards[name] = card
    return cards


def is_greedy(temperature) -> bool:
    return temperature == 0


def trained_greedy(card: HeadCard) -> bool:
    return trained_for_greedy(card.training)


def is_cost_head(card: HeadCard) -> bool:
    """Whether a card is a cost head's (a curve on the dial, drawn from the rule's reports, not a star)."""
    return (card.training or {}).get("kind") == "cost"


def card_task(card: HeadCard) -> str:
    return card.task or "general"


def frontier_at(card: HeadCard, temperature: float) -> Evaluation | None:
    """The card's evaluation on its primary set measured greedily (T = 0) or sampled (T > 0), as
    `temperature` is; None where it has none of that kind."""
    held_out = card.frontier.settings.held_out
    candidates = [card.frontier, *card.evaluations.values()]
    return next(
        (
            e
            for e in candidates
            if e.settings.held_out == held_out and is_greedy(e.settings.temperature) == is_greedy(temperature)
        ),
        None,
    )


def head_for_temperature(cards: dict[str, HeadCard], head_name, temperature):
    """The head to decode with at `temperature`: `head_name` if it was trained for that kind of decoding
    (greedy or sampled), else its task's head that was (`<name>-greedy` ↔ `<name>` first); None to keep
    the user's choice where no such head exists."""
    card = cards.get(head_name)
    if card is None or trained_greedy(card) == is_greedy(temperature):
        return None
    greedy = is_greedy(temperature)
    fits = [n for n, c in cards.items() if c.task == card.task and trained_greedy(c) == greedy]
    twin = greedy_twin(head_name) if greedy else sampled_twin(str(head_name))
    return twin if twin in fits else next(iter(fits), None)
