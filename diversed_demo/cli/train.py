"""`diversed-demo train`: train an ensemble or cost head with sequence-level RL (a flag for each number of
HeadTrainConfig; the config's own check refuses bad values before the models load)."""

from __future__ import annotations

import argparse

from . import shared


def add_train_arguments(parser) -> None:
    from ..training.config import TASK_DEFAULTS, HeadTrainConfig

    defaults = HeadTrainConfig()
    parser.add_argument(
        "--task", default=defaults.task, help="summarization, math, code or general (fidelity)"
    )
    parser.add_argument("--prompts", dest="prompts_path", default=None, help="JSONL of {prompt, reference?}")
    parser.add_argument(
        "--kind",
        choices=("ensemble", "cost"),
        default=defaults.kind,
        help="ensemble: w from both hidden states; cost: the per-token rule's cost corrected by them, "
        "thresholded by the dial's λ (starts as the rule; sampled decoding only)",
    )
    parser.add_argument(
        "--lams",
        type=lams_list,
        default=",".join(f"{lam:g}" for lam in defaults.lams),  # a string: argparse parses it as given
        help="a cost head's λ, in turn per step (comma-separated; default 0.5,2,8)",
    )
    parser.add_argument(
        "--pq-features",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an ensemble head also reads CE − H, TV and H(p) beside the hidden states (greedy: the "
        "target's margin over the draft's choice, whether the choices differ, −log max p; default: yes)",
    )
    parser.add_argument(
        "--positions-dir",
        default=None,
        help="where --warm-start-positions are recorded, by task, temperature and N (default <user heads "
        "folder>/positions)",
    )
    add_head_config_arguments(parser, defaults)
    for name in TASK_DEFAULTS["*"]:  # unset: the task's own default
        parser.set_defaults(**{name: None})
    parser.add_argument("--name", default=None, help="the head's name (default <task>-<time>)")
    parser.add_argument("--out", default=None, help="head path (default: the user heads folder)")
    parser.add_argument(
        "--run-dir", default=None, help="checkpoint folder (default <user heads folder>/runs/<name>)"
    )
    parser.add_argument(
        "--no-resume", dest="resume", action="store_false", help="ignore an existing checkpoint"
    )
    parser.add_argument(
        "--suggest-lam",
        action="store_true",
        help="print the quartiles of (CE − H)/TV over exact-SD rollouts of the task's prompts (the "
        "per-token optimum lets the draft through where this is below λ) and exit",
    )
    shared.add_pair_arguments(parser)
    parser.set_defaults(func=run_train)


def lams_list(text: str) -> tuple[float, ...]:
    """--lams as numbers (argparse turns the ValueError into a usage message)."""
    return tuple(float(part) for part in text.split(",") if part.strip())


def add_head_config_arguments(parser, defaults) -> None:
    """A flag for each number of HeadTrainConfig, with its default."""
    helps_int = {
        "warm_start_prompts": "before RL, decode this many training prompts at static w = --w-init and fit "
        "the head offline to the per-token optimum (default 0: off)",
        "warm_start_positions": "or fit it on this many positions recorded at scale (teacher-forced passes "
        "over the target's own responses to the task's prompt pool, held out by prompt; default 0: off)",
        "warm_start_steps": "AdamW steps of that fit (16,384 positions a step, all where fewer)",
    }
    for name in (
        "steps",
        "prompts_per_step",
        "rollouts_per_prompt",
        "max_new_tokens",
        "n_draft",
        "epochs",
        "hidden_size",
        "warmup_steps",
        "checkpoint_every",
        "seed",
        "warm_start_prompts",
        "warm_start_positions",
        "warm_start_steps",
    ):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), help=helps_int.get(name)
        )
    helps = {
        "lam": "weight of the acceptance term (default per task: 5 for general and summarization, else 0.15)",
        "dense_fidelity": "weight of the exact per-token expected fidelity (default 1 for general and "
        "summarization, else 0)",
        "lr": "AdamW learning rate (default per task: 1e-3 for general and summarization, else 3e-3)",
        "target_acceptance": "hold the rollouts' mean acceptance 1 − w·TV at this value (an augmented "
        "Lagrangian: λ starts at --lam and adapts after each step; with a warm start, "
        "λ is set once from the recorded positions); default off: λ fixed",
        "penalty": "ρ of that augmented Lagrangian: the gap penalty's weight and the multiplier's step",
        "warm_start_hidden_dropout": "share of the hidden states' entries zeroed at each fit step, so that "
        "the head learns what the p/q terms say (default 0)",
    }
    for name in (
        "temperature",
        "lam",
        "dense_fidelity",
        "lr",
        "grad_clip",
        "w_min",
        "w_init",
        "target_acceptance",
        "penalty",
        "warm_start_lr",
        "warm_start_hidden_dropout",
    ):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=float, default=getattr(defaults, name), help=helps.get(name)
        )


def run_train(args) -> int:
    from ..training.config import HeadTrainConfig, check_config
    from ..training.loop import train_head

    fields = HeadTrainConfig.__dataclass_fields__
    config = HeadTrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    check_config(config)
    if args.suggest_lam:
        from ..training.diagnostics import fidelity_cost_quartiles

        quartiles = fidelity_cost_quartiles(shared.pair_from_args(args), config)
        print(f"(CE − H)/TV quartiles on {config.task}: " + " / ".join(f"{q:.2f}" for q in quartiles))
        return 0
    result = train_head(shared.pair_from_args(args), config)
    print(f"head saved to {result.path}" if result.path else "cancelled")
    return 0
