"""On-policy data for the feature draft: the target's own responses to training prompts.

A feature draft learns to predict what the target will say next, so it trains on what the target does
say: responses sampled at temperature 1 and greedy, in chat format, to training prompts only (GSM8K
train, MBPP train, HumanEval, the project's own instructions, articles and prompts, the broad prompts
the target self-instructed across Spec-Bench's categories, distill/prompts.py, and prompts over passages
of free documentation, distill/passages.py). Spec-Bench is the
evaluation set and is never read here.

Only token ids are stored, as gzipped JSON lines in assets/draft/data/ (a few MB, committed), so the
draft is reproducible on any machine; the target's hidden states are recomputed from them in training.
Generation is resumable: each batch is one shard, written atomically, and the prompt schedule is a
pure function of the seed, so a rerun continues where the shards stop.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.files import atomic_write, read_jsonl_gz, write_jsonl_gz, write_text
from ..common.paths import ASSETS
from ..core.prompt import encode_prompt
from ..eval import tasks
from ..runtime.batch_generation import generate_batch, padding_id
from .passages import PASSAGE_PROMPTS_FILE, read_passage_prompts
from .prompts import PROMPTS_FILE, prompts_digest, prompts_digests, read_prompts

# the generated responses (committed), not tasks.data_dir()'s data sets
SHARDS_DIR = ASSETS / "draft" / "data"
INSTRUCTIONS_FILE = ASSETS / "prompts" / "distill_instructions.jsonl"
# T = 1 samples per prompt besides its one greedy response: the open-ended prompts are few, so they
# are sampled often; GSM8K is large, so once; the broad prompts six times, which brings the schedule
# before the passage prompts to about 10M response tokens (docs/embedded-pair.md); those twice.
SAMPLES_PER_PROMPT = {
    "instructions": 12,
    "general": 12,
    "summarization": 8,
    "mbpp": 3,
    "humaneval": 3,
    "gsm8k": 1,
    "broad": 6,
    "passages": 2,
}
SOURCE_WEIGHTS = {"broad": 0.4, "passages": 0.2, "open": 0.15, "math": 0.125, "code": 0.125}
SOURCE_GROUP = {
    "instructions": "open",
    "general": "open",
    "summarization": "open",
    "gsm8k": "math",
    "mbpp": "code",
    "humaneval": "code",
    "broad": "broad",
    "passages": "passages",
}

# the prompt files whose rows the jobs' keys index, by source
PROMPT_FILES = {"broad": PROMPTS_FILE, "passages": PASSAGE_PROMPTS_FILE}


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
        "passages": [row["prompt"] for row in read_passage_prompts()],
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


def shard_paths(shards_dir: Path = SHARDS_DIR) -> list[Path]:
    return sorted(Path(shards_dir).glob("shard_*.jsonl.gz"))


def load_records(shards_dir: Path = SHARDS_DIR) -> list[dict]:
    """Every generated response, in generation order: {key, source, greedy, prompt_ids, response_ids,
    ended}."""
    return [record for path in shard_paths(shards_dir) for record in read_jsonl_gz(path)]


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
    only where given (None: all). Resumes; the run (its `command`, and the digest of each prompt file it
    read jobs from) is logged in the folder's runs.jsonl."""
    shards_dir = Path(shards_dir)
    shards_dir.mkdir(parents=True, exist_ok=True)
    done = load_records(shards_dir)
    check_prompt_files_unchanged(shards_dir, done)
    n_tokens = sum(len(r["response_ids"]) for r in done)
    batches = pending_batches({r["key"] for r in done}, seed, batch_size, sources)
    n_shard = first_shard = len(shard_paths(shards_dir))
    deadline = time.time() + minutes * 60 if minutes else None
    eos_id, pad_id = tokenizer.eos_token_id, padding_id(tokenizer)
    made: set[str] = set()  # the sources this run generated
    try:
        for jobs in batches:
            if n_tokens >= target_tokens or (deadline and time.time() > deadline):
                break
            generator = torch.Generator(device=target.device).manual_seed(seed * 100_003 + n_shard)
            prompt_ids = [encode_prompt(tokenizer, job.prompt) for job in jobs]
            results = generate_batch(
                target, prompt_ids, [job.greedy for job in jobs], max_new_tokens, eos_id, pad_id, generator
            )
            records = [
                {"key": job.key, "source": job.source, "greedy": job.greedy, "prompt_ids": ids,
                 "response_ids": response, "ended": ended}
                for job, ids, (response, ended) in zip(jobs, prompt_ids, results)
            ]  # fmt: skip
            write_jsonl_gz(shards_dir / f"shard_{n_shard:05d}.jsonl.gz", records)
            n_shard += 1
            made |= {job.source for job in jobs}
            n_tokens += sum(len(r["response_ids"]) for r in records)
            if progress:
                progress(n_tokens, target_tokens)
    finally:  # an interrupted run is logged too: its shards are kept
        if n_shard > first_shard:
            entry = {"command": command, "shards_before": first_shard, "shards": n_shard}
            digests = {
                f"{source}_prompts_sha256": prompts_digest(path)
                for source, path in PROMPT_FILES.items()
                if source in made
            }
            log_run(shards_dir, entry | {"response_tokens": n_tokens} | digests)
    return {"shards": n_shard, "response_tokens": n_tokens}


def pending_batches(have: set[str], seed: int, batch_size: int, sources: list[str] | None) -> list[list[Job]]:
    """The jobs not yet generated (of `sources` only, where given), in batches of similar prompt lengths."""
    prompts = training_prompts()
    unknown = set(sources or ()) - set(prompts)
    if unknown:
        raise ValueError(f"unknown source(s) {sorted(unknown)}: choose from {sorted(prompts)}")
    todo = [
        job for job in schedule(prompts, seed) if job.key not in have and job.source in (sources or prompts)
    ]
    # sorted by length within windows of a few batches: less padding, and the schedule's mix kept
    window = 4 * batch_size
    return [
        sorted(todo[i : i + window], key=lambda job: len(job.prompt))[j : j + batch_size]
        for i in range(0, len(todo), window)
        for j in range(0, min(window, len(todo) - i), batch_size)
    ]


def merge_shards(out: Path, base: Path, folders: list[Path]) -> dict:
    """Shard folders generated apart from copies of one `base` folder (one generator per group of sources, as
    GPU generators run side by side) into one new folder `out`: the base's shards once, then each folder's
    own (those past its copy of the base), renumbered in order; likewise the lines of their runs.jsonl. A key
    found twice is refused: a record would be trained on twice, or held out and trained on."""
    out, base = Path(out), Path(base)
    if shard_paths(out):
        raise ValueError(f"{out} already holds shards: merge into a new folder")
    for folder in (base, *map(Path, folders)):
        if not shard_paths(folder):
            raise ValueError(f"{folder} holds no shards (shard_*.jsonl.gz): nothing to merge from it")
    out.mkdir(parents=True, exist_ok=True)
    copied = {path.name for path in shard_paths(base)}
    base_runs = (base / RUNS_FILE).read_text(encoding="utf-8") if (base / RUNS_FILE).exists() else ""
    shards = shard_paths(base) + [p for f in folders for p in shard_paths(Path(f)) if p.name not in copied]
    seen: set[str] = set()
    for n_shard, path in enumerate(shards):
        keys = {r["key"] for r in read_jsonl_gz(path)}
        if keys & seen:
            raise ValueError(f"{path} repeats records of an earlier shard, e.g. {sorted(keys & seen)[0]}")
        seen |= keys
        atomic_write(out / f"shard_{n_shard:05d}.jsonl.gz", lambda tmp, path=path: shutil.copyfile(path, tmp))
    runs = base_runs
    for folder in map(Path, folders):
        if (folder / RUNS_FILE).exists():
            runs += (folder / RUNS_FILE).read_text(encoding="utf-8").removeprefix(base_runs)
    write_text(out / RUNS_FILE, runs)
    return {"shards": len(shards), "records": len(seen)}


RUNS_FILE = "runs.jsonl"


def log_run(shards_dir: Path, entry: dict) -> None:
    """Append one generation run (its command and the shards it left) to the folder's runs.jsonl."""
    path = Path(shards_dir) / RUNS_FILE
    lines = path.read_text(encoding="utf-8") if path.exists() else ""
    write_text(path, lines + json.dumps(entry) + "\n")


def read_runs(shards_dir: Path = SHARDS_DIR) -> list[dict]:
    """The generation runs that made a shard folder, in order."""
    path = Path(shards_dir) / RUNS_FILE
    return [row for _, row in tasks.read_jsonl(path)] if path.exists() else []


def check_prompt_files_unchanged(shards_dir: Path, records: list[dict] | None = None) -> None:
    """`broad` and `passages` jobs are keyed by their index in their prompt file: shards made from another
    version of it would be taken for done, or for other prompts, and held out by other groups. Checked
    for the sources the folder's records (`records`, else read) hold."""
    records = load_records(shards_dir) if records is None else records
    present = {r["source"] for r in records}
    for source, path in PROMPT_FILES.items():
        logged = {run.get(f"{source}_prompts_sha256") for run in read_runs(shards_dir)} - {None}
        if source in present and not logged <= prompts_digests(path):
            raise ValueError(
                f"{path} is not the file the shards in {shards_dir} were made from: restore it "
                "(git checkout) or generate into a new --out folder"
            )
