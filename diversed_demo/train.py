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

from .decode import Row, decode_rows, encode_prompt
from .head import new_head, save_head, user_heads_dir
from .models import text_config
from .optim import adamw_with_schedule, load_checkpoint, save_checkpoint
from .rewards import task_reward
from .tasks import REFERENCE_TASKS, TASKS, builtin_examples, load_jsonl_prompts
from .verify import total_variation


@dataclass
class TrainConfig:
    task: str = "general"
    prompts_path: str | None = None  # a JSONL of {"prompt", "reference"?}; default: the built-in train split
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
    # the dense objective's per-token optimum over the recorded positions (full batch, warm_start_steps of
    # AdamW) before any RL step. With target_acceptance set, λ is then chosen on those positions so that
    # the optimum has that acceptance, and stays fixed through RL (no multiplier swings).
    warm_start_prompts: int = 0
    warm_start_steps: int = 300
    warm_start_lr: float = 3e-3
    dense_fidelity: float | None = None  # weight of the exact per-token expected fidelity term
    lr: float | None = None
    epochs: int | None = None  # optimizer steps per batch of rollouts (> 1 reuses them slightly off-policy, without PPO's ratio or clip; the dense term stays exact)
    warmup_steps: int = 2
    grad_clip: float = 1.0
    hidden_size: int = 64  # 0: the paper's linear head
    w_min: float = 0.0
    w_init: float = 0.7
    seed: int = 0
    name: str | None = None  # the head's name; default <task>-<time>
    out: str | None = None  # where the head goes; default <user heads dir>/<name>.safetensors
    run_dir: str | None = None  # checkpoints; default <user heads dir>/runs/<name>
    checkpoint_every: int = 5
    resume: bool = True  # continue from run_dir's checkpoint if there is one

    def __post_init__(self):
        for key, value in TASK_DEFAULTS.get(self.task, TASK_DEFAULTS["*"]).items():
            if getattr(self, key) is None:
                setattr(self, key, value)


WARM_START_BATCH = 8  # prompts decoded together: a few rows cost the target little more than one
GREEDY_SOFTNESS = 0.02  # the width in w of the smoothed greedy keep/reject step (see draft_share)
# Measured on the embedded pair. A sequence reward alone (ROUGE, match, pass@1) gives REINFORCE a weak
# signal next to the acceptance term's exact gradient, so λ must stay small (0.5 drove a summarization
# head's w to ~0.3 within 8 steps) and the head barely learns which positions matter. With the dense
# fidelity term (in nats) the per-token optimum is w_t → 1 where (CE − H)/TV > λ and w_t → 0 elsewhere, so
# λ is a quantile of that ratio over the pair's own tokens (`train --suggest-lam` prints its quartiles):
# about 3 / 5 / 7.5 for both tasks with the GPU-trained EAGLE-3 draft (8 / 10.5 / 13 with the weaker
# CPU-trained one, where λ 3 sent every w to 1 within 7 steps and λ 8 every w to 0 within 10). Training
# is unstable around the balance: lower w makes the rollouts draft-like text on which the target is
# flatter, so relaxing looks cheaper still, and w moves as a whole before the head learns which tokens
# differ. Holding acceptance at a target (target_acceptance) bounds that drift but, with 20 steps, still
# oscillates with a period of about 12 steps (the rollouts' contexts answer late); see README.
TASK_DEFAULTS = {"*": {"lam": 0.15, "lr": 3e-3, "epochs": 1, "dense_fidelity": 0.0},
                 "general": {"lam": 5.0, "lr": 1e-3, "epochs": 4, "dense_fidelity": 1.0},
                 "summarization": {"lam": 5.0, "lr": 1e-3, "epochs": 4, "dense_fidelity": 1.0}}


@dataclass
class TrainResult:
    path: Path | None  # the saved head, or None if cancelled
    history: list[dict] = field(default_factory=list)
    cancelled: bool = False
    checkpoint: Path | None = None


@dataclass
class Rollouts:
    """Per rollout, the positions where w_t decided the emitted token, left-aligned and padded."""
    tokens: torch.Tensor  # [B, T] the emitted token at each such position
    mask: torch.Tensor  # [B, T] 1 where a position is recorded, 0 in the padding
    target_hidden: torch.Tensor  # [B, T, Ht] at the position that predicts each token
    draft_hidden: torch.Tensor  # [B, T, Hd]
    target_prob: torch.Tensor  # [B, T] p_t(y_t)
    draft_prob: torch.Tensor  # [B, T] q_t(y_t)
    tv: torch.Tensor  # [B, T] TV(p_t, q_t)
    target_entropy: torch.Tensor  # [B, T] H(p_t) = −Σ p log p
    cross_entropy: torch.Tensor  # [B, T] CE(q_t, p_t) = −Σ q log p
    greedy_limit: torch.Tensor  # [B, T] greedy decoding keeps the draft's token iff w_t < this; NaN when sampled
    outputs: list = field(default_factory=list)  # each rollout's whole output ids (bonus tokens too)

    def select(self, rows: slice) -> "Rollouts":
        """The rollouts of `rows` (a prompt's group, one prompt of a batch)."""
        return Rollouts(**{key: getattr(self, key)[rows] for key in self.__dataclass_fields__})


def check_config(config: TrainConfig) -> None:
    if config.task not in TASKS:
        raise ValueError(f"unknown task {config.task!r}; the tasks are {', '.join(TASKS)}")
    if not isinstance(config.warm_start_prompts, int) or config.warm_start_prompts < 0 or config.warm_start_prompts == 1:
        raise ValueError(f"warm_start_prompts must be 0 (off) or at least 2 (some are held out), not {config.warm_start_prompts!r}")
    for name in ("steps", "prompts_per_step", "rollouts_per_prompt", "max_new_tokens", "epochs", "warm_start_steps"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if config.rollouts_per_prompt < 2:
        raise ValueError("rollouts_per_prompt must be at least 2: the baseline is the group mean")
    if not (config.lr > 0 and config.lam >= 0 and config.dense_fidelity >= 0 and 0 <= config.w_min < 1
            and config.temperature >= 0):
        raise ValueError("need lr > 0, λ ≥ 0, dense_fidelity ≥ 0, 0 ≤ w_min < 1 and temperature ≥ 0 (0: greedy)")
    if config.target_acceptance is not None and not (0 < config.target_acceptance < 1 and config.penalty > 0):
        raise ValueError("target_acceptance needs 0 < target < 1 and penalty > 0")


def training_examples(config: TrainConfig):
    if config.prompts_path:
        examples = load_jsonl_prompts(config.prompts_path, config.task)
    else:
        examples = builtin_examples(config.task, "train")
    if config.task in REFERENCE_TASKS and any(e.reference is None for e in examples):
        missing = next(e for e in examples if e.reference is None)
        raise ValueError(f"the {config.task} reward needs a reference for every prompt; {missing.id or 'one'} has none")
    if not examples:
        raise ValueError("no training prompts")
    return examples


@torch.no_grad()
def sample_rollouts(pair, head, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                    generator: torch.Generator, n_draft: int = 4) -> Rollouts:
    """One decode of each prompt (ids; repeat a prompt for a group of rollouts) by the speculative decoder
    itself, with the head choosing w_t; all as one batch, so each target pass serves every rollout.

    With a feature draft, q at a position depends on how far it is from the last verification, so only
    the real decoding process has the law the head will serve under. Each verified position (where w_t
    decided the token) is recorded with what the loss needs; bonus tokens, which w never touches, are
    not, but they are part of each output (`outputs`) that the reward scores.
    """
    n = len(prompts)
    seeds = [int(torch.randint(2**31 - 1, (), generator=generator)) for _ in range(n)]
    fields = [{k: [] for k in Rollouts.__dataclass_fields__ if k not in ("mask", "outputs")} for _ in range(n)]
    outputs = [[] for _ in range(n)]
    rows = [Row(prompt_ids, seed, "dynamic", head=head) for prompt_ids, seed in zip(prompts, seeds)]
    for r, step in decode_rows(pair, rows, n_draft, max_new_tokens, temperature):
        v = step.verdict
        # positions whose token w decided: the accepted drafts and the resampled one, up to an EOS
        k = min(v.n_accepted + (v.n_accepted < len(v.draft_tokens)), len(step.new_ids))
        if k:
            tokens = torch.tensor(step.new_ids[:k], device=v.target_probs.device)
            rows_k = torch.arange(k, device=tokens.device)
            p, q = v.target_probs[:k], v.draft_probs[:k]
            log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()
            limit = torch.full((k,), float("nan"), device=p.device)
            if temperature == 0:
                # Greedy verification compares argmaxes: the loss sees the one-hot limits of p and q, so
                # TV is 1 where the draft's token differs from the target's, H is −log p of the target's
                # own token and CE that of the draft's; whether the draft's token is kept is a threshold
                # on w_t set by the true p and q (see greedy_limit).
                limit = greedy_limit(p, q, v.draft_tokens[:k])
                p, q = one_hot_of_argmax(p), one_hot_of_argmax(q)
            for key, value in (("tokens", tokens), ("target_hidden", v.target_hidden[:k].float()),
                               ("draft_hidden", v.draft_hidden[:k].float()), ("target_prob", p[rows_k, tokens]),
                               ("draft_prob", q[rows_k, tokens]), ("tv", total_variation(p, q)),
                               ("target_entropy", -(p * log_p).sum(-1)), ("cross_entropy", -(q * log_p).sum(-1)),
                               ("greedy_limit", limit)):
                fields[r][key].append(value)
        outputs[r] += step.new_ids
    rows = [{k: torch.cat(v) if v else None for k, v in row.items()} for row in fields]
    length = max(1, max(len(r["tokens"]) if r["tokens"] is not None else 0 for r in rows))
    device = pair.target.device
    batch = {"mask": torch.zeros(n, length, device=device)}
    for i, r in enumerate(rows):
        count = 0 if r["tokens"] is None else len(r["tokens"])
        batch["mask"][i, :count] = 1
        for key, value in r.items():
            if key not in batch:
                width = {"target_hidden": text_config(pair.target).hidden_size,
                         "draft_hidden": text_config(pair.draft).hidden_size}.get(key)
                shape = (n, length, width) if width else (n, length)
                batch[key] = torch.full(shape, float("nan") if key == "greedy_limit" else 0, device=device,
                                        dtype=torch.long if key == "tokens" else torch.float32)
            if count:
                batch[key][i, :count] = value
    return Rollouts(**batch, outputs=outputs)


def one_hot_of_argmax(probs: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)


def greedy_limit(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """[k] the largest w at which argmax(w·p + (1 − w)·q) is still the draft's token x (its argmax of q):
    greedy verification keeps x iff w_t < this. A token y overtakes x once w·(p(y) − p(x)) exceeds
    (1 − w)·(q(x) − q(y)); the first to do so sets the limit (1 where no token has more target mass than x)."""
    rows = torch.arange(len(draft_tokens), device=draft_tokens.device)
    target_gap = target_probs - target_probs[rows, draft_tokens][:, None]
    draft_gap = draft_probs[rows, draft_tokens][:, None] - draft_probs
    crossing = torch.where(target_gap > 0, draft_gap / (draft_gap + target_gap).clamp_min(1e-30),
                           torch.ones_like(target_gap))
    return crossing.min(-1).values.clamp(0, 1)


def draft_share(w: torch.Tensor, positions: Rollouts, hard: bool = False) -> torch.Tensor:
    """How much of each position the draft decides, as a function of w_t: its share 1 − w_t of nu when
    sampling; in greedy decoding 1 where the draft's token is kept (w_t below the position's greedy limit)
    and 0 where not, smoothed to σ((limit − w_t)/GREEDY_SOFTNESS) so that training has a gradient. With it,
    acceptance is 1 − TV·(1 − share) and the expected log p is −H − share·(CE − H) in both cases."""
    limit = positions.greedy_limit
    sampled = torch.isnan(limit)
    limit = torch.nan_to_num(limit, nan=0.0)  # a NaN in the unused branch would still poison the gradient
    greedy = (w < limit).float() if hard else torch.sigmoid((limit - w) / GREEDY_SOFTNESS)
    return torch.where(sampled, 1 - w, greedy)


def fidelity_cost_quartiles(pair, config: TrainConfig, prompts: int = 6) -> list[float]:
    """Quartiles of (CE − H)/TV at the verified positions of exact-SD rollouts (one per prompt, the config's
    N, temperature and length) of the task's first training prompts. The dense loss's per-token optimum
    sets w_t → 1 where this ratio exceeds λ, so λ at a quartile lets the draft through on that share of
    positions: the scale on which to choose λ for a new pair."""
    from .head import ConstantHead
    generator = torch.Generator().manual_seed(config.seed)
    r = sample_rollouts(pair, ConstantHead(1.0), [encode_prompt(pair.tokenizer, e.prompt)
                                                  for e in training_examples(config)[:prompts]],
                        config.max_new_tokens, config.temperature, generator, config.n_draft)
    keep = (r.mask > 0) & (r.tv > 1e-6)  # where the draft differs from the target at all
    ratios = (r.cross_entropy - r.target_entropy)[keep] / r.tv[keep]
    if not len(ratios):
        raise ValueError("the draft matched the target at every position: any λ lets it through")
    return torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75])).tolist()


def flat_positions(rollouts: list[Rollouts]) -> Rollouts:
    """Every recorded position of several Rollouts as one row [1, P] (the per-token terms need no sequence)."""
    keep = [r.mask > 0 for r in rollouts]
    fields = {key: torch.cat([getattr(r, key)[k] for r, k in zip(rollouts, keep)])[None]
              for key in Rollouts.__dataclass_fields__ if key != "outputs"}
    return Rollouts(**fields)


def lam_for_acceptance(positions: Rollouts, target: float) -> float:
    """The λ at which the dense objective's per-token optimum (w_t = 1 where CE − H > λ·TV, else 0) has
    mean acceptance `target` over these positions; ValueError where no λ reaches it."""
    tv, gain = positions.tv[0], (positions.cross_entropy - positions.target_entropy)[0]
    ratio = torch.where(tv > 1e-6, gain / tv.clamp_min(1e-6), torch.full_like(tv, float("inf")))
    order = ratio.argsort(descending=True)  # w = 1 goes first where the target gains most per unit of TV
    acceptance = 1 - tv[order].cumsum(0) / len(tv)  # after setting w = 1 on the first k positions
    if not acceptance[-1] <= target <= 1:
        raise ValueError(f"a target acceptance of {target} is out of reach here: it lies in "
                         f"[{acceptance[-1]:.3f}, 1] (exact decoding's acceptance is the lower end)")
    k = min(int((acceptance > target).sum()) + 1, len(tv))  # w = 1 on the first k: acceptance reaches target
    ranked = ratio[order].clamp(max=1e3)
    # halfway to the next position's ratio, so that the strict rule CE − H > λ·TV keeps exactly the first k
    # λ < 0 would reward rejections: where the target is at exact decoding's own acceptance, λ = 0
    return max(float((ranked[k - 1] + ranked[k]) / 2) if k < len(tv) else float(ranked[-1]) / 2, 0.0)


def frontier_gain(w: torch.Tensor, positions: Rollouts) -> dict:
    """Expected fidelity (mean E_ν[log p] per token) of per-token weights w against a static w with the same
    expected acceptance, and against the per-token optimum (the threshold rule) with that acceptance: the
    offline measure of how much of the possible gain over the static frontier a head captures. Greedy
    positions are counted by the greedy rule itself (kept iff w_t is below the position's limit)."""
    tv, h, ce = positions.tv[0], positions.target_entropy[0], positions.cross_entropy[0]
    share = lambda weights: draft_share(weights, positions, hard=True)[0]  # noqa: E731
    accepted = lambda weights: float((1 - tv * (1 - share(weights))).mean())  # noqa: E731
    fidelity = lambda weights: float(-(h + share(weights) * (ce - h)).mean())  # noqa: E731
    acceptance = accepted(w[None])
    low, high = 0.0, 1.0  # the static w of that acceptance (acceptance falls as w rises)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if accepted(torch.full_like(w, middle)[None]) > acceptance else (low, middle)
    static_w = (low + high) / 2
    try:
        oracle = ((ce - h) > lam_for_acceptance(positions, acceptance) * tv).float()
    except ValueError:  # only at exact decoding's own acceptance (w ≡ 1), up to rounding
        oracle = torch.ones_like(tv)
    return {"acceptance": acceptance, "fidelity": fidelity(w[None]),
            "static_fidelity": fidelity(torch.full_like(w, static_w)[None]),
            "oracle_fidelity": fidelity(oracle[None]), "w_mean": float(w.mean()), "w_std": float(w.std()),
            "positions": len(tv)}


def token_kind(text: str) -> str:
    """A coarse class of a decoded token, for reading what a head does with each."""
    if not text.strip():
        return "whitespace"
    core = text.strip()
    if any(c.isdigit() for c in core):
        return "number"
    if not any(c.isalnum() for c in core):
        return "punctuation"
    return "word start" if text[0].isspace() else "word piece"


def what_separates(w: torch.Tensor, positions: Rollouts, tokenizer) -> dict:
    """What tells the positions a head hands to the draft (low w_t) from those it keeps for the target:
    Spearman correlations of w_t with TV(p, q), H(p) and the fidelity cost of the draft CE − H, and the
    mean w_t by kind of emitted token."""
    def ranks(x: torch.Tensor) -> torch.Tensor:  # tied values share their average rank
        values, order = x.sort()
        _, inverse, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
        result = torch.empty(len(x))
        result[order] = ((counts.cumsum(0) - counts) + (counts - 1) / 2)[inverse].float()
        return result

    def spearman(x: torch.Tensor) -> float | None:
        r = torch.stack([ranks(w), ranks(x)])
        return float(torch.corrcoef(r)[0, 1]) if len(x) > 2 and bool((r.std(1) > 0).all()) else None

    tv, h, ce = positions.tv[0], positions.target_entropy[0], positions.cross_entropy[0]
    kinds = {}
    for weight, token in zip(w.tolist(), positions.tokens[0].tolist()):
        kinds.setdefault(token_kind(tokenizer.decode([token])), []).append(weight)
    return {"spearman_w_vs": {"tv": spearman(tv), "target_entropy": spearman(h), "fidelity_cost": spearman(ce - h)},
            "mean_w_by_token": {kind: {"mean_w": sum(v) / len(v), "positions": len(v)}
                                for kind, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))}}


def fit_to_positions(head, train: Rollouts, lam: float, steps: int, lr: float, weight_decay: float = 0.01) -> list[float]:
    """Full-batch AdamW towards the dense objective's per-token optimum on recorded positions, before any
    sequence reward is sampled: the head learns which positions to hand to the draft.

    The objective is linear in w_t, so its optimum is w_t ∈ {0, 1} and plain gradient ascent saturates the
    sigmoid for every position at once, the majority drowning the rest. Its convex surrogate is used
    instead: cross-entropy of the target's share (w_t, or at greedy positions whether w_t reaches the
    limit) against the optimum's choice, each position weighted by what the choice is worth there,
    |CE − H − λ·TV| (cost-sensitive classification of the same objective)."""
    kept = train.mask > 0
    gain = (train.cross_entropy - train.target_entropy - lam * train.tv)[kept]
    label, weight = (gain > 0).float(), gain.abs() / gain.abs().mean().clamp_min(1e-9)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        target_share = 1 - draft_share(head(train.target_hidden, train.draft_hidden), train)[kept]
        loss = torch.nn.functional.binary_cross_entropy(target_share.clamp(1e-6, 1 - 1e-6), label, weight)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def warm_start(pair, head, examples, config: TrainConfig, generator: torch.Generator, progress: bool = True) -> dict:
    """Record positions of static-w decodes of the first `warm_start_prompts` training prompts, fit the head
    to the per-token optimum on three quarters of the prompts, and report on the held-back quarter how much
    of the gain over a static w (same acceptance) the head captures next to the optimum. Returns the
    figures with the λ used."""
    from tqdm.auto import tqdm

    from .head import ConstantHead
    prompts = examples[:config.warm_start_prompts]
    rollouts = []  # one per prompt, decoded WARM_START_BATCH prompts at a time
    for first in tqdm(range(0, len(prompts), WARM_START_BATCH), desc="warm start: decoding", unit="batch",
                      disable=not progress):
        chunk = [encode_prompt(pair.tokenizer, e.prompt) for e in prompts[first:first + WARM_START_BATCH]]
        batch = sample_rollouts(pair, ConstantHead(config.w_init), chunk, config.max_new_tokens,
                                config.temperature, generator, config.n_draft)
        rollouts += [batch.select(slice(i, i + 1)) for i in range(len(chunk))]
    cut = max(1, round(0.75 * len(rollouts)))
    fit, held_back = flat_positions(rollouts[:cut]), flat_positions(rollouts[cut:])
    lam = lam_for_acceptance(fit, config.target_acceptance) if config.target_acceptance is not None else config.lam
    losses = fit_to_positions(head, fit, lam, config.warm_start_steps, config.warm_start_lr)
    with torch.no_grad():
        w = {split: head(r.target_hidden, r.draft_hidden)[0] for split, r in (("fit", fit), ("held_back", held_back))}
        figures = {"fit": frontier_gain(w["fit"], fit), "held_back": frontier_gain(w["held_back"], held_back)}
        figures["held_back"]["separates"] = what_separates(w["held_back"], held_back, pair.tokenizer)
    return {"lam": lam, "prompts": len(prompts), "final_loss": losses[-1] if losses else None, **figures}


def head_loss(head, rollouts: Rollouts, advantages: torch.Tensor, lam: float, dense_fidelity: float = 0.0,
              target_acceptance: float | None = None, penalty: float = 0.0):
    """Policy-gradient term, acceptance term and, optionally, the dense fidelity term and the augmented
    Lagrangian's penalty on the gap to a target acceptance; returns (loss, acceptance, mean_w)."""
    w = head(rollouts.target_hidden, rollouts.draft_hidden)
    mask = rollouts.mask
    log_nu = torch.log(w * rollouts.target_prob + (1 - w) * rollouts.draft_prob + 1e-12)
    tokens = mask.sum().clamp_min(1)
    policy = -(advantages[:, None] * log_nu * mask).sum() / tokens
    share = draft_share(w, rollouts)
    acceptance = ((1 - rollouts.tv * (1 - share)) * mask).sum() / tokens
    mean_w = (w * mask).sum() / tokens
    loss = policy - lam * acceptance
    if dense_fidelity:
        expected_log_p = -(rollouts.target_entropy + share * (rollouts.cross_entropy - rollouts.target_entropy))
        loss = loss - dense_fidelity * (expected_log_p * mask).sum() / tokens
    if target_acceptance is not None:
        loss = loss + penalty / 2 * (acceptance - target_acceptance) ** 2
    return loss, acceptance, mean_w


def multiplier_update(lam: float, acceptance: float, target: float, penalty: float) -> float:
    """The augmented Lagrangian's multiplier step for the constraint mean acceptance = target (λ ≥ 0).

    Why not a fixed λ: lower w makes the rollouts draft-like text on which the target is flatter, so
    relaxing looks cheaper still, and w moves as a whole. Why not the multiplier alone: the head answers a
    change of λ a few steps late, and λ overshoots (seen: λ 5 → 13 → 0.03 in 15 steps, w 0.7 → 0.04 → 0.35).
    The penalty in head_loss pulls the mean back within the step, which bounds the drift; it does not damp
    it fully: on the embedded pair, 20 steps still swung acceptance 0.60 → 0.94 → 0.52 around a target of
    0.7 (λ 5 → 10.9 → 0 → 13.6), because the rollouts' contexts answer a step or more late."""
    return max(lam + penalty * (target - acceptance), 0.0)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """reward − its prompt group's mean, normalised by the batch's standard deviation."""
    grouped = rewards.view(-1, group_size)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()
    return advantages / (advantages.std() + 1e-6) if advantages.numel() > 1 else advantages


def train_head(pair, config: TrainConfig, callback=None, should_stop=None, progress: bool = True) -> TrainResult:
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
    optimizer, scheduler = adamw_with_schedule(head.parameters(), config.lr, config.warmup_steps, config.steps,
                                               weight_decay=0.01)
    generator = torch.Generator(device=pair.target.device).manual_seed(config.seed + accelerator.process_index)
    start_step, history = 0, []
    saved = load_checkpoint(checkpoint_path, optimizer, scheduler) if config.resume else None
    if saved is not None:
        head.load_state_dict(saved["head"])
        generator.set_state(saved["generator"])
        start_step, history = saved["step"], saved["history"]
    warm = saved.get("warm_start") if saved is not None else None
    if saved is None and config.warm_start_prompts:
        warm = warm_start(pair, head, examples, config, generator, progress)
        save_checkpoint(checkpoint_path, optimizer, scheduler, step=0, history=[], head=head.state_dict(),
                        generator=generator.get_state(), warm_start=warm)
    if warm is not None:
        head.meta["warm_start"] = warm
    lam = (history[-1]["next_lam"] if history and "next_lam" in history[-1]
           else warm["lam"] if warm is not None else config.lam)
    # After a warm start λ already gives the target acceptance on recorded positions: it stays fixed.
    adapt_lam = config.target_acceptance is not None and warm is None
    head_model, optimizer, scheduler = accelerator.prepare(head, optimizer, scheduler)

    def write_checkpoint(step):
        if accelerator.is_main_process:
            save_checkpoint(checkpoint_path, optimizer, scheduler, step=step, history=history,
                            head=accelerator.unwrap_model(head_model).state_dict(), generator=generator.get_state(),
                            warm_start=warm)

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
        every = sample_rollouts(pair, head_model, [ids for ids in prompt_ids for _ in range(group)],
                                config.max_new_tokens, config.temperature, generator, config.n_draft)
        rollouts = [every.select(slice(i * group, (i + 1) * group)) for i in range(len(batch))]
        rewards = [task_reward(config.task, example, pair.tokenizer.decode(output_ids, skip_special_tokens=True),
                               pair=pair, prompt_ids=ids, output_ids=output_ids)
                   for example, ids, r in zip(batch, prompt_ids, rollouts) for output_ids in r.outputs]
        rewards_t = torch.tensor(rewards, device=pair.target.device)
        advantages = group_advantages(rewards_t, config.rollouts_per_prompt)
        head_model.train()
        for epoch in range(config.epochs):
            optimizer.zero_grad()
            totals = torch.zeros(3)  # loss, acceptance, mean w, summed over the prompts
            for i, r in enumerate(rollouts):
                a = advantages[i * config.rollouts_per_prompt:(i + 1) * config.rollouts_per_prompt]
                loss, acceptance, mean_w = head_loss(head_model, r, a, lam, config.dense_fidelity,
                                                     config.target_acceptance, config.penalty)
                accelerator.backward(loss / len(rollouts))
                totals += torch.tensor([loss.item(), acceptance.item(), mean_w.item()])
            if epoch == 0:  # report the figures of the rollouts' own head, before reuse moves it
                loss_total, acc_total, w_total = totals.tolist()
            accelerator.clip_grad_norm_(head_model.parameters(), config.grad_clip)
            optimizer.step()
        scheduler.step()
        record = {"step": step + 1, "steps": config.steps, "reward": float(rewards_t.mean()),
                  "acceptance": acc_total / len(rollouts), "mean_w": w_total / len(rollouts),
                  "loss": loss_total / len(rollouts), "lam": lam, "elapsed_s": time.perf_counter() - started}
        if adapt_lam:
            lam = multiplier_update(lam, record["acceptance"], config.target_acceptance, config.penalty)
            record["next_lam"] = lam
        history.append(record)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward']:.3f}", acc=f"{record['acceptance']:.3f}",
                        w=f"{record['mean_w']:.3f}")
        if callback is not None:
            callback(record)
        if (step + 1) % config.checkpoint_every == 0:
            write_checkpoint(step + 1)
    bar.close()
    write_checkpoint(config.steps)
    final = accelerator.unwrap_model(head_model)
    tail = history[-max(1, len(history) // 4):]
    final.meta["train_figures"] = {k: sum(h[k] for h in tail) / len(tail) for k in ("reward", "acceptance", "mean_w")}
    path = save_head(final, out) if accelerator.is_main_process else None
    return TrainResult(path, history, checkpoint=checkpoint_path)
