"""eval/schemas.py: every file the project ships reads as its schema, and a wrong one is refused with one
line naming the field."""

from __future__ import annotations

import json

import pytest

from diversed_demo.common.paths import ASSETS, RESULTS_DIR
from diversed_demo.eval.schemas import BenchReport, DraftCard, HeadCard, RuleReport, checked, read_model
from diversed_demo.models.heads import HEADS_DIR

SHIPPED = [
    *[(HeadCard, path) for path in sorted(HEADS_DIR.glob("*.json"))],
    *[(RuleReport, path) for path in sorted((RESULTS_DIR / "rule").glob("*.json"))],
    *[(BenchReport, path) for path in sorted(RESULTS_DIR.glob("bench*.json"))],
    (DraftCard, ASSETS / "draft" / "card.json"),
]


def test_the_project_ships_each_kind_of_file():
    assert {model for model, _ in SHIPPED} == {HeadCard, RuleReport, BenchReport, DraftCard}
    assert sum(model is HeadCard for model, _ in SHIPPED) >= 8


@pytest.mark.parametrize("model, path", SHIPPED, ids=lambda x: getattr(x, "name", None) or x.__name__)
def test_every_shipped_file_reads_as_its_schema(model, path):
    read, why = read_model(model, path)
    assert read is not None, why


def test_a_wrong_card_is_refused_in_one_line_naming_the_field(tmp_path):
    card = json.loads((HEADS_DIR / "general.json").read_text())
    card["frontier"]["static_points"][2]["acceptance"] = 1.5
    path = tmp_path / "general.json"
    path.write_text(json.dumps(card))
    read, why = read_model(HeadCard, path)
    assert read is None and "\n" not in why
    assert why.startswith("general.json is not a HeadCard (frontier.static_points.2.acceptance:")
    path.write_text("{")
    assert "cannot be read" in read_model(HeadCard, path)[1]
    assert "is not there" in read_model(HeadCard, tmp_path / "none.json")[1]


def test_a_writer_writes_nothing_its_schema_refuses():
    card = json.loads((HEADS_DIR / "general.json").read_text())
    assert checked(HeadCard, card) is card
    del card["frontier"]["head_point"]
    with pytest.raises(ValueError, match="not a valid HeadCard: frontier.head_point: Field required"):
        checked(HeadCard, card)


def test_fields_the_page_does_not_read_are_kept():
    card = HeadCard.model_validate_json((HEADS_DIR / "general.json").read_text())
    assert card.model_extra["warm_start"]["lam"] > 0 and card.frontier.model_extra["fidelity_versus_exact"]
