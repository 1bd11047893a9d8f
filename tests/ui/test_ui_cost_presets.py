"""The dial's cost presets: the embedded pair's c from its draft card, GPU pairs' estimated from sizes."""

from __future__ import annotations

import json

from diversed_demo.ui import cost_presets


def test_the_cost_ratio_comes_from_the_draft_card_or_is_left_out(tmp_path):
    card = json.loads(cost_presets.DRAFT_CARD.read_text())
    measured = cost_presets.measured_cost_preset()
    assert measured.cost_ratio == round(card["spec_bench"]["cost_ratio"], 2) and "measured" in measured.label
    assert cost_presets.cost_presets()[0] == measured
    (tmp_path / "card.json").write_text('{"spec_bench": {}}')
    assert cost_presets.measured_cost_preset(tmp_path / "card.json") is None
    presets = cost_presets.cost_presets(tmp_path / "missing.json")
    assert presets and all("estimate" in p.label and 0 < p.cost_ratio < 1 for p in presets)
