"""Sequence-level rewards: ROUGE for summaries, final-number match for math, sandboxed pass@1 for code,
and a task-free fidelity reward (mean target log-probability) for any prompt.

`task_reward` is the one reward of training, the frontier and the app; `quality` gives the
reference-based metrics (the bench reports them per category, with `fidelity`).
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal

import torch

from .code_reward import pass_at_1
from .tasks import TASKS, Example

SUMMARIZATION_REWARD = "rouge2"  # the summarization reward is ROUGE-2 F1 against the reference summary
PRIMARY_METRIC = {"summarization": SUMMARIZATION_REWARD, "math": "exact_match", "code": "pass@1"}
# How reports name each task's quality (`task_reward`): tables, cards and the app's charts.
QUALITY_LABEL = {
    "summarization": "ROUGE-2",
    "math": "final-number match",
    "code": "pass@1",
    "general": "fidelity (mean log p, nats/token)",
}


# ---------------------------------------------------------------------------------------------------
# Summarization


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge2", "rougeL"], use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-2 and ROUGE-L F1 of `prediction` against `reference` (stemmed, as in the usual CNN/DM setup)."""
    scores = _rouge_scorer().score(reference, prediction)
    return {name: score.fmeasure for name, score in scores.items()}


# ---------------------------------------------------------------------------------------------------
# Math (GSM8K)

# A number as people write it: optional sign and $, thousands separators, decimals. The lookbehind
# keeps "x2" or "10-5" from yielding "2" or "-5"; a sentence's final period is never part of it.
NUMBER = re.compile(r"(?<![\w.])-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def final_number(text: str) -> Decimal | None:
    """The answer number of a solution: after the last "####" if any, else in the last \\boxed{},
    else the last number in the text. None if there is no number."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
        numbers = NUMBER.findall(text)[:1]  # the answer follows the marker
    else:
        boxed = BOXED.findall(text)
        numbers = NUMBER.findall(boxed[-1] if boxed else text)[-1:]
    return Decimal(numbers[0].replace("$", "").replace(",", "")) if numbers else None


def math_exact_match(prediction: str, reference: str) -> float:
    """1.0 if the final numbers of prediction and reference (a GSM8K answer ending "#### n") are equal."""
    predicted, expected = final_number(prediction), final_number(reference)
    if expected is None:
        raise ValueError(f"the reference has no final number: {reference[-80:]!r}")
    return float(predicted is not None and predicted == expected)


# ---------------------------------------------------------------------------------------------------
# Fidelity: task-free, dense


@torch.no_grad()
def fidelity(pair, prompt_ids: list[int], output_ids: list[int]) -> float:
    """Mean log-probability per token of `output_ids` under the target, given `prompt_ids`.

    Near 0 means the target would have written this output itself; it needs no reference, so it
    rewards staying faithful to the target on any prompt. One forward pass over prompt + output.
    """
    if not prompt_ids or not output_ids:
        raise ValueError("fidelity needs a non-empty prompt and output")
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=pair.target.device)
    logits = pair.target(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1, : pair.vocab_size]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, ids[0, len(prompt_ids) :, None])
    return chosen.mean().item()


# ---------------------------------------------------------------------------------------------------
# The dispatcher


def quality(task: str, example: Example, output_text: str) -> dict[str, float]:
    """Reference-based metrics of an output for `task` ({} for a general example without reference).

    summarization: rouge2, rougeL; math: exact_match; code: pass@1; general: ROUGE if the example has a
    reference (e.g. a translation), since there is no task-specific check.
    """
    if task == "code":
        return {"pass@1": pass_at_1(example, output_text)}
    if example.reference is None:
        if task == "general":
            return {}
        raise ValueError(f"the {task} metric needs a reference, and example {example.id!r} has none")
    if task == "math":
        return {"exact_match": math_exact_match(output_text, example.reference)}
    if task in ("summarization", "general"):
        return rouge(output_text, example.reference)
    raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")


def task_reward(
    task: str,
    example: Example,
    output_text: str,
    pair=None,
    prompt_ids: list[int] | None = None,
    output_ids: list[int] | None = None,
) -> float:
    """The sequence-level reward of one output: `task` picks the reward, `example` holds what it needs.

    summarization: ROUGE-2 F1; math: final-number exact match; code: pass@1 (sandboxed);
    general: fidelity (needs pair, prompt_ids and output_ids), usable on any example.
    """
    if task == "general":
        if pair is None or prompt_ids is None or output_ids is None:
            raise ValueError("the general reward (fidelity) needs pair, prompt_ids and output_ids")
        return fidelity(pair, prompt_ids, output_ids)
    if task not in PRIMARY_METRIC:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    return quality(task, example, output_text)[PRIMARY_METRIC[task]]
