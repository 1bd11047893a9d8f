"""The held-out sets, per task, that the frontier and the results table evaluate on; none of them is
ever trained on."""

from __future__ import annotations

import itertools
import math

from .tasks import MBPP_TEST_IDS, arithmetic_examples, data_file, load_gsm8k, load_mbpp, load_spec_bench

# task -> {held-out set: what it is}; the first is the task's default. None of them is ever trained on.
HELD_OUT = {
    "summarization": {"spec_bench": "Spec-Bench summarization (CNN/DailyMail), first turns"},
    "general": {"spec_bench": "Spec-Bench first turns, every category (stratified)"},
    # Arithmetic first (the default, and a card's drawn evaluation): the small target scores above its
    # floor there, not on GSM8K (docs/measurements/bench.md).
    "math": {
        "arithmetic": "scripted one- and two-step arithmetic (eval split)",
        "gsm8k": "GSM8K test",
        "spec_bench": "Spec-Bench math_reasoning, first turns",
    },
    "code": {"mbpp": "MBPP test (task ids 11-510), pass@1 in the sandbox"},
}


def held_out_set(task: str, set_name: str | None = None) -> str:
    """The held-out set's name: `set_name` if the task has it, else the task's default."""
    if task not in HELD_OUT:
        raise ValueError(f"no held-out set for task {task!r}; choose one of {', '.join(HELD_OUT)}")
    if set_name is not None and set_name not in HELD_OUT[task]:
        raise ValueError(
            f"task {task} has no held-out set {set_name!r}; choose one of {', '.join(HELD_OUT[task])}"
        )
    return set_name or next(iter(HELD_OUT[task]))


def held_out_examples(task: str, limit: int | None, data: str | None = None, set_name: str | None = None):
    """The first `limit` examples of the task's held-out set; `data` replaces the set's file (Spec-Bench's
    question.jsonl, GSM8K's test.jsonl or mbpp.jsonl)."""
    set_name = held_out_set(task, set_name)
    if set_name == "arithmetic":
        return arithmetic_examples("eval", limit)
    if set_name == "gsm8k":
        return load_gsm8k(data or data_file("gsm8k/test.jsonl"), limit)
    if set_name == "mbpp":
        return load_mbpp(data, limit, task_ids=MBPP_TEST_IDS)
    if task == "general":  # a stratified mix: the same number from every category
        by_category = {}
        for example in load_spec_bench(data, per_category=max(1, math.ceil((limit or 26) / 13))):
            by_category.setdefault(example.category, []).append(example)
        # Categories take turns, so that every prefix is stratified and a longer run extends a shorter one
        # (a resumed --log reuses its decodes).
        examples = [e for turn in itertools.zip_longest(*by_category.values()) for e in turn if e is not None]
        return examples[:limit] if limit else examples
    return load_spec_bench(
        data, categories=[{"summarization": "summarization", "math": "math_reasoning"}[task]]
    )[:limit]
