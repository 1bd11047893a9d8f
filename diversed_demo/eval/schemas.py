"""The files eval writes and the app reads, as one schema each: a head's card (<head>.json beside the head),
the per-token rule's reports (results/rule/), the bench's report (results/*.json) and the draft's card
(its Spec-Bench figures). Writers validate what they write; readers get typed objects, or one line naming
the first field that is wrong (`read_model`).

Each model names the fields something reads and checks their types; a file's other fields are kept as
they are (`extra="allow"`): an evaluation carries more figures than the page shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..common.files import read_json_object


class Record(BaseModel):
    """A part of a written file: the named fields checked, any others kept."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Point(Record):
    """One setting measured on a held-out set: a static w, the rule at a λ, or a head."""

    point: str = ""  # "static:0.5", "cost:4", "dynamic:<head>"
    w: float | None = None  # a static w; None for the rule and for heads
    acceptance: float = Field(ge=0, le=1)
    quality: float | None = None  # the task's reward
    fidelity: float | None = None  # the target's mean log-likelihood of the text
    tokens_per_second: float | None = None
    mean_w: float | None = None
    examples: int | None = None


class Margin(Record):
    """A paired bootstrap difference: its estimate, standard error and 95% interval."""

    estimate: float | None = None
    stderr: float | None = None
    ci95: tuple[float, float] | None = None
    p_positive: float | None = None


class Verdict(Record):
    kind: str  # "beyond", "below" or "unresolved" (the static frontier)
    text: str = ""


class Versus(Record):
    """A head against exact SD or the rule on the same prompts, paired."""

    against: str | None = None
    quality_difference: float | None = None
    stderr: float | None = None
    quality_stderr: float | None = None
    fidelity_difference: float | None = None
    fidelity_stderr: float | None = None
    examples: int | None = None
    acceptance: dict[str, float] | None = None  # {"exact", "head"} or {"against", "point"}


class Judged(Record):
    """A head's or the rule's verdict against the static frontier, in the task's score (and `fidelity`,
    the same in the target's likelihood)."""

    quality_margin: Margin | None = None
    acceptance_margin: Margin | None = None
    beyond_frontier: bool | None = None
    verdict: Verdict | None = None
    versus_exact: Versus | None = None
    versus_rule: Versus | None = None
    fidelity: Judged | None = None


class EvaluationSettings(Record):
    n_draft: int = 4
    max_new_tokens: int | None = None
    temperature: float | None = None
    held_out: str | None = None  # the held-out set, in words


class Evaluation(Judged):
    """One evaluation of a head: the static-w sweep and the head on the same held-out prompts."""

    static_points: list[Point]
    head_point: Point
    examples: int | None = None
    settings: EvaluationSettings = EvaluationSettings()
    command: str | None = None


class HeadCard(Record):
    """A head's card: its training and every evaluation of it; `frontier` is the one the app draws."""

    head: str
    task: str | None = None
    training: dict[str, Any] | None = None
    frontier: Evaluation
    evaluations: dict[str, Evaluation] = {}


class RuleReport(Record):
    """The per-token rule against static w on one task's held-out set: every point, and the verdicts of
    the rule at each λ and of the task's heads."""

    task: str | None = None
    examples: int | None = None
    settings: EvaluationSettings = EvaluationSettings()
    points: list[Point]
    rules: dict[str, Judged] = {}
    heads: dict[str, Judged] = {}


class ModeFigures(Record):
    speedup: float | None = None
    tokens_per_second: float | None = None


class BenchSettings(Record):
    examples: int | None = None
    temperature: float | None = None
    threads: int | None = None
    target: str | None = None
    device: str | None = None
    device_name: str | None = None  # the CPU's or GPU's model name (reports before 2026-12-07: a GPU's only)
    dtype: str | None = None
    dtype_choice: dict | None = None  # on a CPU: its "cpu", the instructions its kernels ran on


class BenchReport(Record):
    """The bench's report: per mode its figures over all prompts, how it ran, and the checks of greedy
    texts (exact SD against target-only)."""

    settings: BenchSettings = BenchSettings()
    overall: dict[str, ModeFigures]
    vs_transformers: dict[str, float] | None = None
    greedy_identical_to_target_only: dict[str, float] | None = None


class DraftSpecBench(Record):
    cost_ratio: float | None = None  # the draft's step over the target's, per token
    threads: int | None = None


class DraftCard(Record):
    spec_bench: DraftSpecBench | None = None


Model = TypeVar("Model", bound=BaseModel)


def first_problem(error: ValidationError) -> str:
    """The first wrong field as a line: "frontier.static_points.2.acceptance: Input should be ≤ 1"."""
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or "the file"
    return f"{where}: {problem['msg']}"


def checked(model: type[BaseModel], data: dict) -> dict:
    """`data`, as a writer is about to write it, once `model` accepts it; else a ValueError naming the
    field (nothing half-right is written)."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"not a valid {model.__name__}: {first_problem(error)}") from None
    return data


def read_model(model: type[Model], path: Path) -> tuple[Model | None, str]:
    """(the file as `model`, "") or (None, why not, in one line naming the file and the field)."""
    data, why = read_json_object(path)
    if data is None:
        return None, why
    try:
        return model.model_validate(data), ""
    except ValidationError as error:
        return None, f"{Path(path).name} is not a {model.__name__} ({first_problem(error)})"
