"""The paper-style results table on a tiny pair: its three modes, paired quality and the Markdown."""

import pytest

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.head import ConstantHead
from diversed_demo.eval.table import markdown, parse_sets, table_row
from diversed_demo.eval.tasks import Example

EXAMPLES = [
    Example(prompt=p, task="general") for p in ["the cat sat on", "one two three", "the dog ran", "a big red"]
]


def test_a_head_that_always_answers_one_is_exact_decoding(pair):
    # w ≡ 1 verifies against p, as exact SD does, with the same seeds: the paired difference is exactly 0.
    decoding = DecodeConfig(n_draft=3, max_new_tokens=10, temperature=1.0)
    row = table_row(pair, "general", "spec_bench", EXAMPLES, "one", ConstantHead(1.0), decoding)
    assert row["quality_difference"] == {"mean": 0.0, "se": 0.0}
    assert row["acceptance"]["exact"] == row["acceptance"]["diversed"] and row["examples"] == 4
    assert row["speedup"]["exact"] > 0 and row["target_only_tokens_per_second"] > 0


def test_relaxing_raises_acceptance_and_costs_fidelity_and_the_markdown_shows_both(pair):
    rows = [
        table_row(
            pair,
            "general",
            "spec_bench",
            EXAMPLES,
            "zero",
            ConstantHead(0.0),
            DecodeConfig(n_draft=3, max_new_tokens=10, temperature=t),
        )
        for t in (1.0, 0.0)
    ]
    for row in rows:
        assert row["acceptance"]["diversed"] == 1.0 > row["acceptance"]["exact"]  # w = 0 accepts every draft
        assert (
            row["quality_difference"]["mean"] < 0
        )  # fidelity: the draft's text is less likely under the target
        assert row["mean_w"] == 0.0
    table = markdown(
        {
            "settings": {
                "n_draft": 3,
                "max_new_tokens": 10,
                "dtype": "float32",
                "threads": 1,
                "device": "cpu",
            },
            "rows": rows,
        }
    )
    assert (
        "| general (spec_bench; fidelity (mean log p, nats/token)) | 1 | 4 |" in table
        and "| greedy |" in table
    )
    assert f"→ {rows[0]['acceptance']['diversed']:.3f}" in table


def test_sets_name_a_task_and_one_of_its_held_out_sets():
    assert parse_sets("summarization, math:arithmetic,code") == [
        ("summarization", "spec_bench"),
        ("math", "arithmetic"),
        ("code", "mbpp"),
    ]
    with pytest.raises(ValueError, match="no held-out set"):
        parse_sets("math:mbpp")


def test_a_greedy_twin_serves_the_greedy_rows(pair):
    from diversed_demo.eval.table import results_table

    report = results_table(
        pair,
        [("math", "arithmetic")],
        {"math": ("math", ConstantHead(1.0))},
        [1.0, 0.0],
        limit=2,
        n_draft=3,
        max_new_tokens=4,
        greedy_heads={"math": ("math-greedy", ConstantHead(0.0))},
    )
    assert [(r["temperature"], r["head"]) for r in report["rows"]] == [(1.0, "math"), (0.0, "math-greedy")]
    assert report["rows"][1]["acceptance"]["diversed"] == 1.0  # w = 0 keeps every draft
