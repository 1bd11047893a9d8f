"""The app's example prompts (assets/prompts/examples.json): the list, the dropdown's choices, and which
example a prompt is."""

from __future__ import annotations

from ..eval.tasks import Example, app_examples


def load_examples() -> list[Example]:
    """The examples in the file's order; none if it is unreadable."""
    try:
        return [example for examples in app_examples().values() for example in examples]
    except (OSError, ValueError):
        return []


def example_choices(examples: list[Example]) -> list[tuple[str, int]]:
    """Dropdown choices: "[task] start of the prompt…" → index into `examples`."""

    def label(example):
        text = " ".join(example.prompt.split())
        return f"[{example.task}] {text[:70]}{'…' if len(text) > 70 else ''}"

    return [(label(example), i) for i, example in enumerate(examples)]


def find_example(prompt: str, examples: list[Example]) -> Example | None:
    """The example whose prompt this is (so its task and reference apply), or None for a typed prompt."""
    key = " ".join((prompt or "").split())
    return next((e for e in examples if " ".join(e.prompt.split()) == key), None)


def opening_prompt(examples: list[Example], index: int | None) -> str:
    """The prompt box's first text: the opening example's prompt, or empty without examples."""
    return examples[index].prompt if index is not None else ""
