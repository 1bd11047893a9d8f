"""The heads' cards and the frontiers drawn from them: the evaluation that fits the temperature, the heads
trained for it, and malformed cards left out."""

from __future__ import annotations

import json

import pytest
from conftest import shipped_heads, ui_examples

from diversed_demo.models.heads import HEADS_DIR
from diversed_demo.ui import cards, frontiers, opening, result_tables, results_summary
from diversed_demo.ui.tabs import dial


def summarization_card() -> dict:
    return json.loads(HEADS_DIR.joinpath("summarization.json").read_text())


def greedy_of(frontier: dict, acceptance: float) -> dict:
    """The evaluation measured greedily, its head at `acceptance`."""
    return {
        **frontier,
        "settings": {**frontier["settings"], "temperature": 0.0},
        "head_point": {**frontier["head_point"], "acceptance": acceptance},
    }


def test_the_dial_draws_the_greedy_evaluation_when_decoding_is_greedy(tmp_path):
    card = summarization_card()
    primary = card["frontier"]
    greedy = greedy_of(primary, 0.5)
    other_set = {
        **greedy,
        "settings": {**greedy["settings"], "held_out": "another set"},
        "head_point": {**primary["head_point"], "acceptance": 0.9},
    }
    card["evaluations"] = {"other, greedy": other_set, "spec_bench, greedy": greedy}
    (tmp_path / "s.json").write_text(json.dumps(card))
    heads = {"s": tmp_path / "s.safetensors"}

    def head_acceptance(temperature):
        points = frontiers.shipped_frontiers(heads, temperature)["summarization"].points
        return float(points[points["kind"] == "head"]["acceptance"].iloc[0])

    assert head_acceptance(0.0) == 0.5  # greedy on the primary's set, not another set's
    assert head_acceptance(1.0) == head_acceptance(0.7) == primary["head_point"]["acceptance"]
    drawn = {greedy: frontiers.shipped_frontiers(heads, 0.0 if greedy else 1.0) for greedy in (False, True)}
    *_, note, _, _ = dial.shipped_dial(drawn, "summarization", 4, 0.1, 0.0)
    assert "T = 0.0" in note
    del card["evaluations"]["spec_bench, greedy"]  # no greedy evaluation: the primary one is drawn
    (tmp_path / "s.json").write_text(json.dumps(card))
    assert head_acceptance(0.0) == primary["head_point"]["acceptance"]


@pytest.fixture(scope="module")
def twin_heads(tmp_path_factory) -> dict:
    """A summarization head "s" evaluated at T = 1 and its greedy twin "s-greedy" (trained and evaluated at
    T = 0, listed first), carded: their paths by name."""
    folder = tmp_path_factory.mktemp("twins")
    card = summarization_card()
    primary = card["frontier"]
    greedy = greedy_of(primary, 0.5)
    sampled_card = {**card, "evaluations": {"spec_bench, T=1": primary}}
    greedy_card = {
        **card,
        "training": {**card["training"], "temperature": 0.0},
        "frontier": greedy,
        "evaluations": {"spec_bench, greedy": greedy},
    }
    (folder / "s-greedy.json").write_text(json.dumps(greedy_card))  # listed first
    (folder / "s.json").write_text(json.dumps(sampled_card))
    return {name: folder / f"{name}.safetensors" for name in ("s-greedy", "s")}


def test_each_temperatures_frontier_stars_only_the_head_evaluated_at_it(twin_heads):
    def stars(temperature):
        points = frontiers.shipped_frontiers(twin_heads, temperature)["summarization"].points
        return sorted(points[points["kind"] == "head"]["label"])

    assert stars(1.0) == ["s"] and stars(0.0) == ["s-greedy"]  # s has no greedy evaluation


def test_a_sampled_head_hands_greedy_decoding_to_its_greedy_twin(twin_heads):
    assert cards.head_for_temperature(cards.head_cards(twin_heads), "s", 0.0) == "s-greedy"


def test_a_greedy_head_hands_sampling_to_its_twin(twin_heads):
    assert cards.head_for_temperature(cards.head_cards(twin_heads), "s-greedy", 0.7) == "s"


def test_a_head_already_of_the_right_kind_is_kept(twin_heads):
    assert cards.head_for_temperature(cards.head_cards(twin_heads), "s", 1.0) is None


def test_a_head_without_a_card_has_no_twin(twin_heads):
    assert cards.head_for_temperature(cards.head_cards(twin_heads), "not carded", 0.0) is None


def test_the_app_opens_with_the_greedy_one_of_twin_heads(twin_heads):
    assert opening.arrival_defaults(ui_examples(), twin_heads).settings.head_name == "s-greedy"


def test_the_frontier_table_lists_both_twins_points_each_at_its_temperature(twin_heads):
    table = result_tables.frontier_table(twin_heads)
    primary = summarization_card()["frontier"]
    assert set(table["T"]) == {"greedy", 1.0} and len(table) == 2 * (len(primary["static_points"]) + 1)


def test_each_temperature_kind_draws_the_heads_trained_for_it():
    heads = shipped_heads()
    carded = cards.head_cards(heads)
    twins = {card.task: name for name, card in carded.items() if cards.trained_greedy(card)}
    assert twins  # greedy twins ship

    assert any(cards.is_cost_head(card) for card in carded.values())  # drawn as curves, not stars
    for temperature, expected in ((0.0, lambda task: [twins[task]]), (1.0, lambda task: [task])):
        drawn = frontiers.shipped_frontiers(heads, temperature)
        for task in twins:
            points = drawn[task].points
            assert list(points[points["kind"] == "head"]["label"]) == expected(task)


def test_broken_cards_are_skipped_not_fatal(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text('{"frontier": {}}')
    card = json.loads(HEADS_DIR.joinpath("general.json").read_text())
    card["frontier"]["settings"]["n_draft"] = "four"
    (tmp_path / "typed.json").write_text(json.dumps(card))
    card["frontier"]["settings"]["n_draft"] = 4
    card["frontier"]["static_points"][0]["acceptance"] = None
    (tmp_path / "hole.json").write_text(json.dumps(card))
    heads = {name: tmp_path / f"{name}.safetensors" for name in ("bad", "empty", "typed", "hole", "none")}
    assert frontiers.shipped_frontiers(heads) == {} and result_tables.frontier_table(heads).empty
    assert opening.arrival_defaults(ui_examples(), heads).settings.mode == "static"
    assert results_summary.headline_data(heads) == []


def test_picking_a_cost_head_moves_the_lam_slider_to_its_default_and_nothing_else_does():
    import gradio as gr

    from diversed_demo.core.head import COST_HEAD_LAM
    from diversed_demo.ui.sidebar import cost_head_lam

    assert cost_head_lam("general-cost") == COST_HEAD_LAM
    for other in ("general", "general-greedy", None, "../../etc/passwd", "no-such-head"):
        assert cost_head_lam(other) == gr.skip(), other
