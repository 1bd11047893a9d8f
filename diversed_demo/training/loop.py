"""Training an ensemble head with sequence-level REINFORCE plus an acceptance term.

Both language models are frozen; only the head trains. Rollouts come from the speculative decoder itself
(blocks of N drafts verified against nu_t = w_t·p_t + (1 − w_t)·q_t, with the serving N; a step's
rollouts decode as one batch), so they follow the law the head serves under for either kind of draft. At
every position where w_t decided the token we keep what the loss needs: the hidden states the head reads,
p_t(y_t), q_t(y_t) and TV(p_t, q_t). The loss then re-evaluates only the head:

    log π(y) = Σ_t log nu_t(y_t)
    loss = −mean_tokens(A · log nu_t(y_t)) − λ · mean_t(1 − w_t·TV_t)

with A = reward − the mean reward of the prompt's group of rollouts (the sample itself included, so
not leave-one-out), divided by the standard deviation of A over the batch: REINFORCE with a group
baseline and batch normalisation of the advantage, the two ingredients REINFORCE++ adds to plain
REINFORCE (no critic, no ratio clipping). Minimising −λ·(1 − w·TV) lowers w where TV > 0, which raises acceptance.
With `target_acceptance` set, λ is instead the multiplier of an augmented Lagrangian for "mean acceptance
= target": the loss gains (ρ/2)·(mean(1 − w·TV) − target)² and λ ← max(0, λ + ρ·(target − acceptance))
after each step (see multiplier_update for why).

The fidelity reward is a sum of per-token terms log p_t(y_t), and the part each w_t decides directly
has a closed form: E_{y~nu_t}[log p_t(y)] = −w_t·H(p_t) − (1 − w_t)·CE(q_t, p_t). Its
exact gradient joins the loss with weight `dense_fidelity`, giving every position its own noiseless
credit; REINFORCE still carries what a token does to the rest of the sequence. The per-token optimum
then raises w_t exactly where the draft's tokens cost the most fidelity per unit of acceptance,
CE − H > λ·TV, which a static w cannot do.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..core.prompt import encode_prompt
from ..eval.rewards import task_reward
from ..models.heads import new_head, save_head, user_heads_dir
from .config import HeadTrainConfig, check_config, training_examples
from .objective import group_advantages, head_loss, multiplier_update
from .optim import adamw_with_schedule, load_checkpoint, save_checkpoint
from .rollouts import sample_rollouts
from .warm_start import warm_start


@dataclass
class TrainResult:
    path: Path | None  # the saved head, or None if cancelled
    history: list[dict] = field(default_factory=list)
    cancelled: bool = False
    checkpoint: Path | None = None


def train_head(
    pair, config: HeadTrainConfig, callback=None, should_stop=None, progress: bool = True
) -> TrainResult:
    """Train a head for `pair` on `config.task`. `callback(record)` gets {step, steps, reward, acceptance,
    mean_w, loss, elapsed_s} after each step; `should_stop()` returning True cancels (a checkpoint is kept)."""
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    check_config(config)
    examples = training_examples(config)
    name = config.name or f"{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(config.out) if config.out else user_heads_dir() / f"{name}.safetensors"
    run_dir = Path(config.run_dir) if config.run_dir else user_heads_dir() / "runs" / name
    checkpoint_path = run_dir / "checkpoint.pt"

    accelerator = Accelerator(cpu=pair.target.device.type == "cpu")
    torch.manual_seed(config.seed)
    head = new_head(pair, hidden_size=config.hidden_size, w_min=config.w_min, w_init=config.w_init)
    head.meta.update(task=config.task, training=asdict(config))
    optimizer, scheduler = adamw_with_schedule(
        head.parameters(), config.lr, config.warmup_steps, config.steps, weight_decay=0.01
    )
    generator = torch.Generator(device=pair.target.device).manual_seed(
        config.seed + accelerator.process_index
    )
    start_step, history = 0, []
    saved = load_checkpoint(checkpoint_path, optimizer, scheduler) if config.resume else None
    if saved is not None:
        head.load_state_dict(saved["head"])
        generator.set_state(saved["generator"])
        start_step, history = saved["step"], saved["history"]
    warm = saved.get("warm_start") if saved is not None else None
    if saved is None and config.warm_start_prompts:
        warm = warm_start(pair, head, examples, config, generator, progress)
        save_checkpoint(
            checkpoint_path,
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
    lam = (
        history[-1]["next_lam"]
        if history and "next_lam" in history[-1]
        else warm["lam"]
        if warm is not None
        else config.lam
    )
    # After a warm start λ already gives the target acceptance on recorded positions: it stays fixed.
    adapt_lam = config.target_acceptance is not None and warm is None
    head_model, optimizer, scheduler = accelerator.prepare(head, optimizer, scheduler)

    def write_checkpoint(step):
        if accelerator.is_main_process:
            save_checkpoint(
                checkpoint_path,
                optimizer,
                scheduler,
                step=step,
                history=history,
                head=accelerator.unwrap_model(head_model).state_dict(),
                generator=generator.get_state(),
                warm_start=warm,
            )

    started = time.perf_counter()
    bar = tqdm(total=config.steps, initial=start_step, desc=f"train {name}", disable=not progress)
    for step in range(start_step, config.steps):
        if should_stop is not None and should_stop():
            write_checkpoint(step)
            bar.close()
            return TrainResult(None, history, cancelled=True, checkpoint=checkpoint_path)
        # Each process takes its own prompts: data parallel over examples.
        first = (step * accelerator.num_processes + accelerator.process_index) * config.prompts_per_step
        batch = [examples[(first + i) % len(examples)] for i in range(config.prompts_per_step)]
        head_model.eval()
        group = config.rollouts_per_prompt
        prompt_ids = [encode_prompt(pair.tokenizer, example.prompt) for example in batch]
        every = sample_rollouts(
            pair,
            head_model,
            [ids for ids in prompt_ids for _ in range(group)],
            config.max_new_tokens,
            config.temperature,
            generator,
            config.n_draft,
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
        rewards_t = torch.tensor(rewards, device=pair.target.device)
        advantages = group_advantages(rewards_t, config.rollouts_per_prompt)
        head_model.train()
        for epoch in range(config.epochs):
            optimizer.zero_grad()
            totals = torch.zeros(3)  # loss, acceptance, mean w, summed over the prompts
            for i, r in enumerate(rollouts):
                a = advantages[i * config.rollouts_per_prompt : (i + 1) * config.rollouts_per_prompt]
                loss, acceptance, mean_w = head_loss(
                    head_model, r, a, lam, config.dense_fidelity, config.target_acceptance, config.penalty
                )
                accelerator.backward(loss / len(rollouts))
                totals += torch.tensor([loss.item(), acceptance.item(), mean_w.item()])
            if epoch == 0:  # report the figures of the rollouts' own head, before reuse moves it
                loss_total, acc_total, w_total = totals.tolist()
            accelerator.clip_grad_norm_(head_model.parameters(), config.grad_clip)
            optimizer.step()
        scheduler.step()
        record = {
            "step": step + 1,
            "steps": config.steps,
            "reward": float(rewards_t.mean()),
            "acceptance": acc_total / len(rollouts),
            "mean_w": w_total / len(rollouts),
            "loss": loss_total / len(rollouts),
            "lam": lam,
            "elapsed_s": time.perf_counter() - started,
        }
        if adapt_lam:
            lam = multiplier_update(lam, record["acceptance"], config.target_acceptance, config.penalty)
            record["next_lam"] = lam
        history.append(record)
        bar.update(1)
        bar.set_postfix(
            reward=f"{record['reward']:.3f}", acc=f"{record['acceptance']:.3f}", w=f"{record['mean_w']:.3f}"
        )
        if callback is not None:
            callback(record)
        if (step + 1) % config.checkpoint_every == 0:
            write_checkpoint(step + 1)
    bar.close()
    write_checkpoint(config.steps)
    final = accelerator.unwrap_model(head_model)
    tail = history[-max(1, len(history) // 4) :]
    final.meta["train_figures"] = {
        k: sum(h[k] for h in tail) / len(tail) for k in ("reward", "acceptance", "mean_w")
    }
    path = save_head(final, out) if accelerator.is_main_process else None
    return TrainResult(path, history, checkpoint=checkpoint_path)
