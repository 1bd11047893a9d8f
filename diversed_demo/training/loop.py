"""The head training loop: start a run or resume it from its checkpoint, then steps of rollouts, rewards
and head updates, with checkpoints along the way and the trained head saved at the end."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..common.optim import adamw_with_schedule, load_checkpoint, save_checkpoint
from ..core.head import COST_HEAD_LAM
from ..core.prompt import encode_prompt
from ..eval.rewards import task_reward
from ..models.heads import new_head, save_head, user_heads_dir
from .config import HeadTrainConfig, check_config, training_examples
from .objective import group_advantages, head_loss, multiplier_update
from .positions import load_positions
from .rollouts import Rollouts, sample_rollouts
from .warm_start import held_out_figures, positions_folder, warm_start

if TYPE_CHECKING:
    from accelerate import Accelerator


@dataclass
class TrainResult:
    path: Path | None  # the saved head, or None if cancelled
    history: list[dict] = field(default_factory=list)
    cancelled: bool = False
    checkpoint: Path | None = None


@dataclass
class HeadRun:
    """What a training run carries from step to step; its checkpoint holds all of it but the accelerator."""

    accelerator: Accelerator
    head: torch.nn.Module  # as the accelerator prepared it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator  # the rollouts' random stream
    checkpoint: Path
    history: list[dict]  # one record per step done
    warm: dict | None  # the warm start's figures; None without one
    lam: float
    adapt_lam: bool  # λ is the multiplier of a target acceptance, updated after each step
    start_step: int


def train_head(
    pair, config: HeadTrainConfig, callback=None, should_stop=None, progress: bool = True
) -> TrainResult:
    """Train a head for `pair` on `config.task`. `callback(record)` gets {step, steps, reward, acceptance,
    mean_w, loss, lam, elapsed_s, and next_lam where λ adapts} after each step; `should_stop()` returning
    True cancels (a checkpoint is kept)."""
    from tqdm.auto import tqdm

    check_config(config)
    examples = training_examples(config)
    name = config.name or f"{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(config.out) if config.out else user_heads_dir() / f"{name}.safetensors"
    run_dir = Path(config.run_dir) if config.run_dir else user_heads_dir() / "runs" / name
    run = start_or_resume(pair, config, examples, run_dir / "checkpoint.pt", progress)
    started = time.perf_counter()
    bar = tqdm(total=config.steps, initial=run.start_step, desc=f"train {name}", disable=not progress)
    for step in range(run.start_step, config.steps):
        if should_stop is not None and should_stop():
            write_checkpoint(run, step)
            bar.close()
            return TrainResult(None, run.history, cancelled=True, checkpoint=run.checkpoint)
        record = training_step(pair, run, config, examples, step, started)
        run.history.append(record)
        bar.update(1)
        bar.set_postfix(
            reward=f"{record['reward']:.3f}", acc=f"{record['acceptance']:.3f}", w=f"{record['mean_w']:.3f}"
        )
        if callback is not None:
            callback(record)
        if (step + 1) % config.checkpoint_every == 0:
            write_checkpoint(run, step + 1)
    bar.close()
    write_checkpoint(run, config.steps)
    if config.warm_start_positions:
        measure_final_head(pair, run, config)
    return TrainResult(save_final_head(run, out), run.history, checkpoint=run.checkpoint)


def measure_final_head(pair, run: HeadRun, config: HeadTrainConfig) -> None:
    """The trained head's held-out figures on the recorded positions (after RL, where the warm start's are
    before it), at the λ it serves with: a cost head's default and each of its lams."""
    _, held_back = load_positions(positions_folder(config), pair.target.device)
    lams = (COST_HEAD_LAM, *config.lams) if config.kind == "cost" else (run.lam,)
    final = run.accelerator.unwrap_model(run.head)
    final.meta["held_out"] = held_out_figures(final, held_back, lams)


def start_or_resume(pair, config: HeadTrainConfig, examples, checkpoint: Path, progress: bool) -> HeadRun:
    """A new head with its optimiser and rollout generator, restored from `checkpoint` where one exists
    (and config.resume); a new run with warm_start_prompts is warm-started first, saved as step 0."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=pair.target.device.type == "cpu")
    torch.manual_seed(config.seed)
    head = new_head(
        pair,
        config.kind,
        hidden_size=config.hidden_size,
        w_min=config.w_min,
        w_init=config.w_init,
        pq_features=config.pq_features,
    )
    head.meta.update(task=config.task, training=asdict(config))
    optimizer, scheduler = adamw_with_schedule(
        head.parameters(), config.lr, config.warmup_steps, config.steps, weight_decay=0.01
    )
    generator = torch.Generator(device=pair.target.device).manual_seed(
        config.seed + accelerator.process_index
    )
    start_step, history, warm = 0, [], None
    saved = load_checkpoint(checkpoint, optimizer, scheduler) if config.resume else None
    if saved is not None:
        head.load_state_dict(saved["head"])
        generator.set_state(saved["generator"])
        start_step, history, warm = saved["step"], saved["history"], saved.get("warm_start")
    elif config.warm_start_prompts or config.warm_start_positions:
        warm = warm_start(pair, head, examples, config, generator, progress)
        save_checkpoint(
            checkpoint,
            optimizer,
            scheduler,
            step=0,
            history=[],
            head=head.state_dict(),
            generator=generator.get_state(),
            warm_start=warm,
        )
    if warm is not None:
        head.meta["warm_start"] = warm
    head, optimizer, scheduler = accelerator.prepare(head, optimizer, scheduler)
    return HeadRun(
        accelerator=accelerator,
        head=head,
        optimizer=optimizer,
        scheduler=scheduler,
        generator=generator,
        checkpoint=checkpoint,
        history=history,
        warm=warm,
        lam=starting_lam(config, history, warm),
        # After a warm start λ already gives the target acceptance on recorded positions: it stays fixed.
        adapt_lam=config.target_acceptance is not None and warm is None,
        start_step=start_step,
    )


def starting_lam(config: HeadTrainConfig, history: list[dict], warm: dict | None) -> float:
    """λ as the last step left it (the multiplier's update), else the warm start's, else the config's."""
    if history and "next_lam" in history[-1]:
        return history[-1]["next_lam"]
    return warm["lam"] if warm is not None else config.lam


def training_step(pair, run: HeadRun, config: HeadTrainConfig, examples, step: int, started: float) -> dict:
    """Rollouts of step `step`'s prompts by the current head, their rewards, and the head's updates on them;
    returns the step's record (with next_lam where λ adapts)."""
    if config.kind == "cost":  # the dial's λ in turn: the head learns its whole curve
        run.lam = config.lams[step % len(config.lams)]
    rollouts, rewards = rollouts_and_rewards(pair, run, config, examples, step)
    advantages = group_advantages(rewards, config.rollouts_per_prompt)
    loss, acceptance, mean_w = update_head(run, config, rollouts, advantages)
    run.scheduler.step()
    record = {
        "step": step + 1,
        "steps": config.steps,
        "reward": float(rewards.mean()),
        "acceptance": acceptance,
        "mean_w": mean_w,
        "loss": loss,
        "lam": run.lam,
        "elapsed_s": time.perf_counter() - started,
    }
    if run.adapt_lam:
        run.lam = multiplier_update(run.lam, acceptance, config.target_acceptance, config.penalty)
        record["next_lam"] = run.lam
    return record


def rollouts_and_rewards(
    pair, run: HeadRun, config: HeadTrainConfig, examples, step: int
) -> tuple[list[Rollouts], torch.Tensor]:
    """The step's prompts, rollouts_per_prompt decodes of each by the current head (one Rollouts per
    prompt), and the task's reward of every decode."""
    accelerator, group = run.accelerator, config.rollouts_per_prompt
    # Each process takes its own prompts: data parallel over examples.
    first = (step * accelerator.num_processes + accelerator.process_index) * config.prompts_per_step
    batch = [examples[(first + i) % len(examples)] for i in range(config.prompts_per_step)]
    run.head.eval()
    prompt_ids = [encode_prompt(pair.tokenizer, example.prompt) for example in batch]
    every = sample_rollouts(
        pair,
        run.head,
        [ids for ids in prompt_ids for _ in range(group)],
        config.max_new_tokens,
        config.temperature,
        run.generator,
        config.n_draft,
        run.lam,
    )
    rollouts = [every.select(slice(i * group, (i + 1) * group)) for i in range(len(batch))]
    rewards = [
        task_reward(
            config.task,
            example,
            pair.tokenizer.decode(output_ids, skip_special_tokens=True),
            pair=pair,
            prompt_ids=ids,
            output_ids=output_ids,
        )
        for example, ids, r in zip(batch, prompt_ids, rollouts)
        for output_ids in r.outputs
    ]
    return rollouts, torch.tensor(rewards, device=pair.target.device)


def update_head(
    run: HeadRun, config: HeadTrainConfig, rollouts: list[Rollouts], advantages: torch.Tensor
) -> list[float]:
    """config.epochs optimiser steps on one batch of rollouts; returns the mean loss, acceptance and w over
    its prompts in the first epoch, those of the head that decoded the rollouts (before reuse moves it)."""
    run.head.train()
    group = config.rollouts_per_prompt
    for epoch in range(config.epochs):
        run.optimizer.zero_grad()
        totals = torch.zeros(3)  # loss, acceptance, mean w, summed over the prompts
        for i, r in enumerate(rollouts):
            loss, acceptance, mean_w = head_loss(
                run.head,
                r,
                advantages[i * group : (i + 1) * group],
                run.lam,
                config.dense_fidelity,
                config.target_acceptance,
                config.penalty,
            )
            run.accelerator.backward(loss / len(rollouts))
            totals += torch.tensor([loss.item(), acceptance.item(), mean_w.item()])
        if epoch == 0:
            first_epoch = [total / len(rollouts) for total in totals.tolist()]
        run.accelerator.clip_grad_norm_(run.head.parameters(), config.grad_clip)
        run.optimizer.step()
    return first_epoch


def write_checkpoint(run: HeadRun, step: int) -> None:
    """The run as it stands before step `step` (the main process writes it)."""
    if run.accelerator.is_main_process:
        save_checkpoint(
            run.checkpoint,
            run.optimizer,
            run.scheduler,
            step=step,
            history=run.history,
            head=run.accelerator.unwrap_model(run.head).state_dict(),
            generator=run.generator.get_state(),
            warm_start=run.warm,
        )


def save_final_head(run: HeadRun, out: Path) -> Path | None:
    """The trained head to `out`, its card with the mean reward, acceptance and w of the last quarter of the
    steps; None on processes other than the main one."""
    final = run.accelerator.unwrap_model(run.head)
    tail = run.history[-max(1, len(run.history) // 4) :]
    final.meta["train_figures"] = {
        k: sum(h[k] for h in tail) / len(tail) for k in ("reward", "acceptance", "mean_w")
    }
    return save_head(final, out) if run.accelerator.is_main_process else None
