import json

import pytest

from diversed_demo.eval.rewards import final_number, math_exact_match, quality
from diversed_demo.eval.tasks import (
    MBPP_TEST_IDS,
    MBPP_TRAIN_IDS,
    PROMPTS_DIR,
    SUMMARIZE,
    TASKS,
    app_examples,
    arithmetic_examples,
    builtin_examples,
    data_dir,
    load_gsm8k,
    load_humaneval,
    load_jsonl_prompts,
    load_mbpp,
    load_spec_bench,
)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------
# User JSONL


def test_jsonl_prompts_accepts_references_blank_lines_and_extra_keys(tmp_path):
    path = write_lines(
        tmp_path / "mine.jsonl",
        ['{"prompt": "Hello?"}', "", '{"prompt": "Translate: chat", "reference": "cat", "id": 7}'],
    )
    examples = load_jsonl_prompts(path)
    assert [(e.prompt, e.reference, e.task) for e in examples] == [
        ("Hello?", None, "general"),
        ("Translate: chat", "cat", "general"),
    ]
    assert examples[1].id == "mine.jsonl:3"


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "unclosed', r"line 2: not valid JSON"),
        ('["a", "list"]', r"line 2: expected a JSON object, got list"),
        ('{"reference": "no prompt"}', r'line 2: "prompt" is missing or empty'),
        ('{"prompt": "   "}', r'line 2: "prompt" is missing or empty'),
        ('{"prompt": 42}', r'line 2: "prompt" must be a string, not int'),
        ('{"prompt": "ok", "reference": ["a"]}', r'line 2: "reference" must be a string, not list'),
    ],
)
def test_jsonl_prompts_rejects_malformed_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "bad.jsonl", ['{"prompt": "fine"}', bad_line])
    with pytest.raises(ValueError, match=message):
        load_jsonl_prompts(path)


def test_jsonl_prompts_task_requirements(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", ['{"prompt": "Summarize the following article:\\nA."}'])
    with pytest.raises(ValueError, match=r'line 1: a summarization prompt needs a "reference"'):
        load_jsonl_prompts(path, task="summarization")
    with pytest.raises(ValueError, match=r'line 1: a code prompt needs "test_code"'):
        load_jsonl_prompts(path, task="code")
    with pytest.raises(ValueError, match="unknown task 'poetry'"):
        load_jsonl_prompts(path, task="poetry")
    with pytest.raises(ValueError, match="no prompts"):
        load_jsonl_prompts(write_lines(tmp_path / "empty.jsonl", [""]))


# ---------------------------------------------------------------------------------------------------
# Shared data sets


def test_data_dir_override(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="DIVERSED_DATA"):
        load_gsm8k()
    (tmp_path / "gsm8k").mkdir()
    write_lines(
        tmp_path / "gsm8k" / "test.jsonl", [json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"})]
    )
    [example] = load_gsm8k()
    assert (example.prompt, example.task, example.id) == ("1 + 1?", "math", "gsm8k/test/0")


def test_gsm8k_references_end_with_the_answer():
    examples = load_gsm8k(limit=5)
    assert len(examples) == 5
    assert all(
        e.task == "math" and "####" in e.reference and final_number(e.reference) is not None for e in examples
    )


def test_spec_bench_first_turns_and_references():
    path = data_dir() / "spec_bench" / "question.jsonl"
    rows = {f"spec_bench/{row['question_id']}": row for row in map(json.loads, path.read_text().splitlines())}
    examples = load_spec_bench(categories=["summarization", "math_reasoning", "writing"], per_category=3)
    assert [e.category for e in examples].count("summarization") == 3
    assert {e.category for e in examples} == {"summarization", "math_reasoning", "writing"}
    for example in examples:
        row = rows[example.id]
        assert example.prompt == row["turns"][0]  # the first turn, even where there are two
        if example.category == "writing":
            assert len(row["turns"]) == 2 and example.task == "general"
        else:
            assert (
                example.task == {"summarization": "summarization", "math_reasoning": "math"}[example.category]
            )
            assert example.reference == row["reference"][0]
    math = [e for e in examples if e.task == "math"]
    assert all(final_number(e.reference) is not None for e in math)


def test_spec_bench_all_categories_and_unknown_category():
    examples = load_spec_bench()
    assert len(examples) == 480
    assert all(e.reference for e in examples if e.category in ("summarization", "math_reasoning"))
    assert all(e.reference is None or isinstance(e.reference, str) for e in examples)
    with pytest.raises(ValueError, match="unknown Spec-Bench categories"):
        load_spec_bench(categories=["poetry"])


def test_mbpp_split_and_setup_code():
    test = load_mbpp(task_ids=MBPP_TEST_IDS)
    assert len(test) == 500 and all(e.entry_point for e in test)
    # Task 367's setup code builds trees from the solution's Node class: it must run after the solution.
    [tree] = [e for e in test if e.id == "mbpp/367"]
    assert quality("code", tree, tree.reference) == {"pass@1": 1.0}


def test_humaneval():
    examples = load_humaneval()
    assert len(examples) == 164
    first = examples[0]
    assert first.id == "HumanEval/0" and first.entry_point == "has_close_elements"
    assert first.code_prefix in first.prompt and first.test_code.endswith("check(has_close_elements)")


# ---------------------------------------------------------------------------------------------------
# Built-in prompts


@pytest.mark.parametrize("task", ["summarization", "general"])
def test_builtin_split_is_fixed_and_disjoint(task):
    train, eval_ = builtin_examples(task, "train"), builtin_examples(task, "eval")
    assert train and eval_ and not {e.prompt for e in train} & {e.prompt for e in eval_}
    assert len(train) + len(eval_) == len(load_jsonl_prompts(PROMPTS_DIR / f"{task}.jsonl", task))
    assert [e.id for e in builtin_examples(task, "train")] == [e.id for e in train]
    assert len(builtin_examples(task, "train", limit=3)) == 3


def test_builtin_code_and_math_splits_are_disjoint():
    code_train, code_eval = builtin_examples("code", "train"), builtin_examples("code", "eval")
    assert {int(e.id.split("/")[1]) for e in code_train} <= set(MBPP_TRAIN_IDS)
    assert {int(e.id.split("/")[1]) for e in code_eval} <= set(MBPP_TEST_IDS)
    math_train = {e.prompt for e in builtin_examples("math", "train")}
    assert not math_train & {e.prompt for e in builtin_examples("math", "eval")}
    assert not math_train & {e.prompt for e in arithmetic_examples("eval")}
    # the scripted problems and GSM8K train take turns
    assert [e.category for e in builtin_examples("math", "train", limit=4)] == ["arithmetic", "gsm8k"] * 2
    # Spec-Bench is for evaluation only: its GSM8K questions must not be in the training side.
    assert not math_train & {e.prompt for e in load_spec_bench(categories=["math_reasoning"])}


def test_builtin_summarization_articles():
    examples = builtin_examples("summarization", "train") + builtin_examples("summarization", "eval")
    assert len(examples) >= 30
    for example in examples:
        assert example.prompt.startswith(SUMMARIZE)
        assert 120 <= len(example.prompt[len(SUMMARIZE) :].split()) <= 250
        assert 0 < len(example.reference.split()) < 60


def test_builtin_rejects_bad_split():
    with pytest.raises(ValueError, match="split must be"):
        builtin_examples("general", "test")


def test_app_examples_cover_every_task_and_their_references_score_full_marks():
    examples = app_examples()
    assert set(examples) == set(TASKS)
    for task, items in examples.items():
        assert 2 <= len(items) <= 3
        for example in items:
            assert example.task == task and len(example.prompt.split()) < 90  # a tiny model on CPU
            if task != "general":
                assert max(quality(task, example, example.reference).values()) == 1.0


def test_arithmetic_set_is_fixed_disjoint_and_its_answers_follow_from_its_working():
    train, eval_ = arithmetic_examples("train"), arithmetic_examples("eval")
    assert (
        len(train) == 400
        and len(eval_) >= 390
        and [e.prompt for e in arithmetic_examples("eval")] == [e.prompt for e in eval_]
    )
    assert not {e.prompt for e in train} & {e.prompt for e in eval_}
    assert len({e.prompt for e in eval_}) > 0.95 * len(eval_)  # not a handful of problems repeated
    for example in train[:40] + eval_[:40]:
        working, answer = example.reference.split("\n#### ")
        # every step of the working is right, and its last result is the answer the reward checks
        for left, right in (step.split(" = ") for step in working.split(", and ")):
            assert eval(left) == int(right)  # noqa: S307 (the script's own arithmetic)
        assert int(working.rsplit(" = ", 1)[1]) == int(answer) >= 0
        numbers = [int(n) for n in __import__("re").findall(r"\d+", example.prompt)]
        assert all(n in numbers for n in map(int, __import__("re").findall(r"\d+", working.split(" = ")[0])))
        assert math_exact_match(f"So the answer is {answer}.", example.reference) == 1.0
    with pytest.raises(ValueError, match="split must be"):
        arithmetic_examples("test")
