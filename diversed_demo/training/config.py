"""A head training run's settings (HeadTrainConfig) with each task's defaults, the check that refuses bad
ones, and the prompts a run trains on."""

from __future__ import annotations

from dataclasses import dataclass

from ..eval.tasks import REFERENCE_TASKS, TASKS, builtin_examples, load_jsonl_prompts


@dataclass
class HeadTrainConfig:
    task: str = "general"
    prompts_path: str | None = None  # a JSONL of {"prompt", "reference"?}; default: the built-in train split
    prompts_may_run_code: bool = True  # False for a visitor's upload: its "test_code" is refused, never run
    steps: int = 20
    prompts_per_step: int = 2
    rollouts_per_prompt: int = 4
    max_new_tokens: int = 48
    n_draft: int = 4  # the draft length of the rollouts: the N the head will serve with
    # 0 trains a greedy head: the loss then sees the one-hot limits of p and q (see sample_rollouts), and
    # a prompt's rollouts are identical, so the sequence reward's advantages vanish and the acceptance and
    # dense fidelity terms do the training (warm start, then on-policy dense steps).
    temperature: float = 1.0
    lam: float | None = None  # weight of the acceptance term; None: the task's default (TASK_DEFAULTS)
    # If set, training holds the rollouts' mean acceptance 1 − w·TV at this value by an augmented
    # Lagrangian: λ becomes a multiplier (updated after each step) and a penalty (ρ/2)·gap² joins the loss.
    target_acceptance: float | None = None
    penalty: float = 20.0  # ρ
    # Warm start: decode this many training prompts once at static w = w_init, then fit the head offline to
    # the dense objective's per-token optimum over the recorded positions (warm_start_steps of AdamW, on
    # warm_start.FIT_BATCH positions a step) before any RL step. With target_acceptance set, λ is then
    # chosen on those positions so that the optimum has that acceptance, and stays fixed through RL.
    warm_start_prompts: int = 0
    # Or, at scale: fit on this many positions recorded from teacher-forced passes over the target's own
    # responses to the task's prompt pool (training/positions.py; recorded once under positions_dir, by
    # task, temperature and N, and shared by every head trained with those), held out by prompt.
    warm_start_positions: int = 0
    positions_dir: str | None = None  # default: <user heads dir>/positions
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3
    # Each fit step zeroes this share of the hidden states' entries (greedy twins: 0.5), so that the head
    # learns what the p/q terms say rather than remembering fitted positions by their hidden states.
    warm_start_hidden_dropout: float = 0.0
    dense_fidelity: float | None = None  # weight of the exact per-token expected fidelity term
    lr: float | None = None
    # optimizer steps per batch of rollouts (> 1 reuses them slightly off-policy, without PPO's ratio or
    # clip; the dense term stays exact)
    epochs: int | None = None
    warmup_steps: int = 2
    grad_clip: float = 1.0
    # "ensemble": w_t from both hidden states (EnsembleHead); "cost": the rule's per-token cost corrected by
    # the hidden states, thresholded by λ (CostHead: starts as the rule; sampled decoding only). A cost
    # head trains at each λ of `lams` in turn, so that the dial moves it along its own curve.
    kind: str = "ensemble"
    lams: tuple[float, ...] = (0.5, 2.0, 8.0)
    hidden_size: int = 64  # 0: the paper's linear head
    # An ensemble head also reads the rule's terms (CE − H, TV, H(p); in greedy decoding their point-mass
    # forms: the target's margin over the draft's choice) beside the hidden states; None: yes
    pq_features: bool | None = None
    w_min: float = 0.0
    w_init: float = 0.7
    seed: int = 0
    name: str | None = None  # the head's name; default <task>-<time>
    out: str | None = None  # where the head goes; default <user heads dir>/<name>.safetensors
    run_dir: str | None = None  # checkpoints; default <user heads dir>/runs/<name>
    checkpoint_every: int = 5
    resume: bool = True  # continue from run_dir's checkpoint if there is one

    def __post_init__(self):
        if self.pq_features is None:
            self.pq_features = self.kind == "ensemble"
        if self.kind == "cost" and self.dense_fidelity is None:
            self.dense_fidelity = 1.0  # the rule's objective, fidelity + λ·acceptance, which the reward bends
        for key, value in TASK_DEFAULTS.get(self.task, TASK_DEFAULTS["*"]).items():
            if getattr(self, key) is None:
                setattr(self, key, value)


GREEDY_SOFTNESS = 0.02  # the width in w of the smoothed greedy keep/reject step (see draft_share)


# With the dense term λ is a quantile of (CE − H)/TV over the pair's tokens (`train --suggest-lam`);
# without it λ stays small. The figures behind these: docs/measurements/training.md.
TASK_DEFAULTS = {
    "*": {"lam": 0.15, "lr": 3e-3, "epochs": 1, "dense_fidelity": 0.0},
    "general": {"lam": 5.0, "lr": 1e-3, "epochs": 4, "dense_fidelity": 1.0},
    "summarization": {"lam": 5.0, "lr": 1e-3, "epochs": 4, "dense_fidelity": 1.0},
}


def check_config(config: HeadTrainConfig) -> None:
    if config.task not in TASKS:
        raise ValueError(f"unknown task {config.task!r}; the tasks are {', '.join(TASKS)}")
    if (
        not isinstance(config.warm_start_prompts, int)
        or config.warm_start_prompts < 0
        or config.warm_start_prompts == 1
    ):
        raise ValueError(
            "warm_start_prompts must be 0 (off) or at least 2 (some are held out), "
            f"not {config.warm_start_prompts!r}"
        )
    for name in (
        "steps",
        "prompts_per_step",
        "rollouts_per_prompt",
        "max_new_tokens",
        "epochs",
        "warm_start_steps",
    ):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if config.rollouts_per_prompt < 2:
        raise ValueError("rollouts_per_prompt must be at least 2: the baseline is the group mean")
    if not (
        config.lr > 0
        and config.lam >= 0
        and config.dense_fidelity >= 0
        and 0 <= config.w_min < 1
        and config.temperature >= 0
    ):
        raise ValueError(
            "need lr > 0, λ ≥ 0, dense_fidelity ≥ 0, 0 ≤ w_min < 1 and temperature ≥ 0 (0: greedy)"
        )
    if not 0 <= config.warm_start_hidden_dropout < 1:
        raise ValueError(
            f"warm_start_hidden_dropout must be in [0, 1), not {config.warm_start_hidden_dropout!r}"
        )
    if config.target_acceptance is not None and not (0 < config.target_acceptance < 1 and config.penalty > 0):
        raise ValueError("target_acceptance needs 0 < target < 1 and penalty > 0")
    if config.kind not in ("ensemble", "cost"):
        raise ValueError(f"kind must be 'ensemble' or 'cost', not {config.kind!r}")
    if config.kind == "cost" and (config.temperature == 0 or config.target_acceptance is not None):
        raise ValueError(
            "a cost head serves sampled decoding (temperature > 0) and takes λ from the dial (lams), "
            "not a target acceptance"
        )
    if config.pq_features and config.kind != "ensemble":
        raise ValueError("pq_features is for ensemble heads (a cost head always reads the p/q terms)")
    if not isinstance(config.warm_start_positions, int) or config.warm_start_positions < 0:
        raise ValueError(
            f"warm_start_positions must be 0 (off) or a count, not {config.warm_start_positions!r}"
        )
    if config.warm_start_positions and config.warm_start_prompts:
        raise ValueError("warm start from decoded prompts or from recorded positions, not both")
    if config.kind == "cost" and not (config.lams and all(lam >= 0 for lam in config.lams)):
        raise ValueError(f"lams must be one or more λ ≥ 0, not {config.lams!r}")


def training_examples(config: HeadTrainConfig):
    if config.prompts_path:
        examples = load_jsonl_prompts(config.prompts_path, config.task, config.prompts_may_run_code)
    else:
        examples = builtin_examples(config.task, "train")
    if config.task in REFERENCE_TASKS and any(e.reference is None for e in examples):
        missing = next(e for e in examples if e.reference is None)
        raise ValueError(
            f"the {config.task} reward needs a reference for every prompt; {missing.id or 'one'} has none"
        )
    if not examples:
        raise ValueError("no training prompts")
    return examples
