"""On-policy data for the feature draft: the target's own responses to training prompts.

A feature draft learns to predict what the target will say next, so it trains on what the target does
say: responses sampled at temperature 1 and greedy, in chat format, to training prompts only (GSM8K
train, MBPP train, HumanEval, the project's own instructions, articles and prompts, and the broad prompts
the target self-instructed across Spec-Bench's categories, distill/prompts.py). Spec-Bench is the
evaluation set and is never read here.

Only token ids are stored, as gzipped JSON lines in assets/draft/data/ (a few MB, committed), so the
draft is reproducible on any machine; the target's hidden states are recomputed from them in training.
Generation is resumable: each batch is one shard, written atomically, and the prompt schedule is a
pure function of the seed, so a rerun continues where the shards stop.
"""

from __future__ import annotations

import gzip
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.files import atomic_write
from ..common.paths import ASSETS
from ..core.prompt import encode_prompt
from ..core.sampling import sample
from ..eval import tasks
from .prompts import read_prompts

# the generated responses (committed), not tasks.data_dir()'s data sets
SHARDS_DIR = ASSETS / "draft" / "data"
INSTRUCTIONS_FILE = ASSETS / "prompts" / "distill_instructions.jsonl"
# T = 1 samples per prompt besides its one greedy response: the open-ended prompts are few, so they
# are sampled often; GSM8K is large, so once.
SAMPLES_PER_PROMPT = {
    "instructions": 12,
    "general": 12,
    "summarization": 8,
    "mbpp": 3,
    "humaneval": 3,
    "gsm8k": 1,
    "broad": 1,
}
SOURCE_WEIGHTS = {"broad": 0.5, "open": 0.2, "math": 0.15, "code": 0.15}
SOURCE_GROUP = {
    "instructions": "open",
    "general": "open",
    "summarization": "open",
    "gsm8k": "math",
    "mbpp": "code",
    "humaneval": "code",
    "broad": "broad",
}


@dataclass(frozen=True)
class Job:
    key: str  # "<source>/<prompt index>/<greedy|s0|s1…>": unique, stable across runs
    source: str
    prompt: str
    greedy: bool


def training_prompts() -> dict[str, list[str]]:
    """Prompt texts by source; every one comes from a training split."""
    instructions = [row["instruction"] for _, row in tasks.read_jsonl(INSTRUCTIONS_FILE)]
    return {
        "instructions": instructions,
        "general": [e.prompt for e in tasks.builtin_examples("general", "train")],
        "summarization": [e.prompt for e in tasks.builtin_examples("summarization", "train")],
        "gsm8k": [e.prompt for e in tasks.load_gsm8k(tasks.data_file("gsm8k/train.jsonl"))],
        "mbpp": [e.prompt for e in tasks.builtin_examples("code", "train")],
        "humaneval": [e.prompt for e in tasks.load_humaneval()],
        "broad": [row["prompt"] for row in read_prompts()],
    }


def schedule(prompts: dict[str, list[str]], seed: int = 0) -> list[Job]:
    """Every job, in an order that keeps the groups' mix (SOURCE_WEIGHTS) wherever generation stops."""
    rng = random.Random(seed)
    queues: dict[str, list[Job]] = {}
    for source, texts in prompts.items():
        jobs = [Job(f"{source}/{i}/greedy", source, text, True) for i, text in enumerate(texts)]
        jobs += [
            Job(f"{source}/{i}/s{s}", source, text, False)
            for s in range(SAMPLES_PER_PROMPT[source])
            for i, text in enumerate(texts)
        ]
        queues.setdefault(SOURCE_GROUP[source], []).extend(jobs)
    for jobs in queues.values():
        rng.shuffle(jobs)
    order, credit = [], dict.fromkeys(queues, 0.0)
    while any(queues.values()):
        live = [g for g in queues if queues[g]]
        total = sum(SOURCE_WEIGHTS[g] for g in live)
        for g in live:
            credit[g] += SOURCE_WEIGHTS[g] / total
        pick = max(live, key=lambda g: credit[g])
        credit[pick] -= 1.0
        order.append(queues[pick].pop())
    return order


@torch.inference_mode()
def generate_batch(
    target,
    prompts: list[list[int]],
    greedy: list[bool],
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
    stop_fraction: float = 0.9,
    prune_every: int = 16,
    temperature: float = 1.0,
) -> list[tuple[list[int], bool]]:
    """Responses to left-padded prompts, each row greedy or sampled at `temperature`: [(ids, ended at EOS)].

    Finished rows are dropped from the batch every `prune_every` steps, and the batch stops once
    `stop_fraction` of its rows have ended: the last few long responses would otherwise cost as much as
    the rest of the batch, and a truncated response is still on-policy text.
    """
    device = target.device
    logits, cache, mask, positions = prefill(target, prompts, pad_id)
    greedy_rows = torch.tensor(greedy, device=device)
    rows = torch.arange(len(prompts), device=device)  # which original row each live row is
    responses: list[list[int]] = [[] for _ in prompts]
    ended = [False] * len(prompts)
    for step in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        token = torch.where(greedy_rows, probs.argmax(-1), sample(probs, generator))
        for row, t in zip(rows.tolist(), token.tolist()):
            if not ended[row]:
                responses[row].append(t)
                ended[row] = t == eos_id
        if sum(ended) >= stop_fraction * len(prompts) or step == max_new_tokens - 1:
            break
        live = torch.tensor([not ended[r] for r in rows.tolist()], device=device)
        if step % prune_every == prune_every - 1 and not live.all():
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, token, mask, positions, greedy_rows = (
                x[keep] for x in (rows, token, mask, positions, greedy_rows)
            )
        # A row that ended keeps decoding padding until it is pruned; its tokens are never read.
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        positions = positions[:, -1:] + 1
        logits = target(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
    return list(zip(responses, ended))


def prefill(target, prompts: list[list[int]], pad_id: int):
    """The target's pass over left-padded prompts: its next-token logits [B, V], its KV cache, and the
    attention mask and positions that decoding extends."""
    from transformers import DynamicCache

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=target.config)
    logits = target(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    return logits, cache, mask, positions


def shard_paths(shards_dir: Path = SHARDS_DIR) -> list[Path]:
    return sorted(Path(shards_dir).glob("shard_*.jsonl.gz"))


def load_records(shards_dir: Path = SHARDS_DIR) -> list[dict]:
    """Every generated response, in generation order: {key, source, greedy, prompt_ids, response_ids,
    ended}."""
    records = []
    for path in shard_paths(shards_dir):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def write_shard(path: Path, records: list[dict]) -> None:
    def write(tmp):
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
            for record in records:
                f.write(json.dumps(record, separators=(",", ":")) + "\n")

    atomic_write(path, write)


def generate_shards(
    target,
    tokenizer,
    shards_dir: Path = SHARDS_DIR,
    target_tokens: int = 1_200_000,
    batch_size: int = 96,
    max_new_tokens: int = 384,
    seed: int = 0,
    minutes: float | None = None,
    progress=None,
    sources: list[str] | None = None,
    command: str | None = None,
) -> dict:
    """Generate shards until the responses hold `target_tokens` tokens (or `minutes` pass), from `sources`
    only where given (None: all). Resumes."""
    shards_dir = Path(shards_dir)
    shards_dir.mkdir(parents=True, exist_ok=True)
    done = load_records(shards_dir)
    have = {r["key"] for r in done}
    n_tokens = sum(len(r["response_ids"]) for r in done)
    prompts = training_prompts()
    unknown = set(sources or ()) - set(prompts)
    if unknown:
        raise ValueError(f"unknown source(s) {sorted(unknown)}: choose from {sorted(prompts)}")
    todo = [
        job for job in schedule(prompts, seed) if job.key not in have and job.source in (sources or prompts)
    ]
    n_shard = first_shard = len(shard_paths(shards_dir))
    deadline = time.time() + minutes * 60 if minutes else None
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if pad_id is None:
        pad_id = eos_id
    # Batches of similar prompt lengths waste less on padding: sort within windows of a few batches.
    window = 4 * batch_size
    batches = [
        sorted(todo[i : i + window], key=lambda job: len(job.prompt))[j : j + batch_size]
        for i in range(0, len(todo), window)
        for j in range(0, min(window, len(todo) - i), batch_size)
    ]
    for jobs in batches:
        if n_tokens >= target_tokens or (deadline and time.time() > deadline):
            break
        generator = torch.Generator(device=target.device).manual_seed(seed * 100_003 + n_shard)
        prompt_ids = [encode_prompt(tokenizer, job.prompt) for job in jobs]
        results = generate_batch(
            target, prompt_ids, [job.greedy for job in jobs], max_new_tokens, eos_id, pad_id, generator
        )
        records = [
            {
                "key": job.key,
                "source": job.source,
                "greedy": job.greedy,
                "prompt_ids": ids,
                "response_ids": response,
                "ended": ended,
            }
            for job, ids, (response, ended) in zip(jobs, prompt_ids, results)
        ]
        write_shard(shards_dir / f"shard_{n_shard:05d}.jsonl.gz", records)
        n_shard += 1
        n_tokens += sum(len(r["response_ids"]) for r in records)
        if progress:
            progress(n_tokens, target_tokens)
    result = {"shards": n_shard, "response_tokens": n_tokens}
    if command:
        log_run(shards_dir, {"command": command, "shards_before": first_shard, **result})
    return result


RUNS_FILE = "runs.jsonl"


def log_run(shards_dir: Path, entry: dict) -> None:
    """Append one generation run (its command and the shards it left) to the folder's runs.jsonl."""
    path = Path(shards_dir) / RUNS_FILE
    lines = path.read_text(encoding="utf-8") if path.exists() else ""
    atomic_write(path, lambda tmp: Path(tmp).write_text(lines + json.dumps(entry) + "\n", encoding="utf-8"))


def read_runs(shards_dir: Path = SHARDS_DIR) -> list[dict]:
    """The generation runs that made a shard folder, in order."""
    path = Path(shards_dir) / RUNS_FILE
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    )
