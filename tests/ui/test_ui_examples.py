"""The app's example prompts: read from the app's file, offered in a dropdown, recognised in a prompt."""

from __future__ import annotations

from conftest import ui_examples

from diversed_demo.ui import examples as app_examples


def test_examples_come_from_the_app_file(monkeypatch):
    examples = app_examples.load_examples()
    assert examples and {e.task for e in examples} >= {"summarization", "math", "code", "general"}
    assert examples[0].task == "summarization" and examples[0].reference  # the file's order: arrival shows it

    def missing():
        raise FileNotFoundError("examples.json")

    monkeypatch.setattr(app_examples, "app_examples", missing)
    assert app_examples.load_examples() == []


def test_find_example_ignores_whitespace_changes():
    examples = ui_examples()
    example = examples[0]
    assert app_examples.find_example("  " + example.prompt.replace(" ", "\n", 1), examples) is example
    assert app_examples.find_example("something typed", examples) is None
    labels = [label for label, _ in app_examples.example_choices(examples)]
    assert labels[0].startswith("[summarization] ") and len(labels[0]) < 90
