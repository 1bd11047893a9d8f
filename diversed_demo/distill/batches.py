"""The draft's training data in batches: the held-out split, the draft vocabulary, length-grouped
batches of records and their padded tensors."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import torch


def is_heldout(record: dict, fraction: float, groups: dict[str, list] | None = None) -> bool:
    """Held out by a hash of the prompt (not the sample), so no held-out prompt is ever trained on; where
    `groups[source][i]` gives prompt i's group, by its group's (train.prompt_groups_by_source: prompts made
    from one passage go together)."""
    prompt_key = record["key"].rsplit("/", 1)[0]
    source, index = prompt_key.split("/", 1)
    source_groups = (groups or {}).get(source, ())
    if int(index) < len(source_groups):
        prompt_key = f"{source}/{source_groups[int(index)]}"
    return int(hashlib.sha256(prompt_key.encode()).hexdigest()[:8], 16) / 2**32 < fraction


def select_sources(records: list[dict], sources, replay: float, seed: int) -> list[dict]:
    """Every record of `sources` (None: of every source) and a seeded `replay` fraction of the others: new
    data trained on with some of the old, so that what the draft learnt before is not forgotten."""
    if not sources:
        return records
    rng = random.Random(seed)
    return [r for r in records if r["source"] in sources or rng.random() < replay]


def frequent_tokens(records: list[dict], size: int, always=()) -> list[int]:
    """The `size` most frequent response tokens (ties to the smaller id), sorted, with `always` included."""
    counts = Counter(t for r in records for t in r["response_ids"])
    chosen = set(always)
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        chosen.add(token)
    return sorted(chosen)


def batches(records: list[dict], batch_tokens: int, max_length: int, seed: int) -> list[list[int]]:
    """Indices of records grouped by similar length, batch order shuffled by `seed`."""
    order = sorted(
        range(len(records)), key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["response_ids"])
    )
    groups, current, width = [], [], 0
    for i in order:
        length = min(len(records[i]["prompt_ids"]) + len(records[i]["response_ids"]), max_length)
        if current and max(width, length) * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, length)
    if current:
        groups.append(current)
    random.Random(seed).shuffle(groups)
    return groups


def make_batch(records: list[dict], pad_id: int, max_length: int, device) -> dict[str, torch.Tensor]:
    """Right-padded ids [B, T], the real-token mask and the mask of positions whose next token is a response
    token."""
    seqs = [(r["prompt_ids"] + r["response_ids"])[:max_length] for r in records]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    real = torch.zeros(len(seqs), width, dtype=torch.bool)
    predicts_response = torch.zeros(len(seqs), width, dtype=torch.bool)
    for row, (seq, record) in enumerate(zip(seqs, records)):
        ids[row, : len(seq)] = torch.tensor(seq)
        real[row, : len(seq)] = True
        # position t predicts token t + 1: a response token from t = len(prompt) − 1 to len(seq) − 2
        predicts_response[row, len(record["prompt_ids"]) - 1 : len(seq) - 1] = True
    return {"ids": ids.to(device), "real": real.to(device), "predicts_response": predicts_response.to(device)}


def coverage(records: list[dict], token_ids: list[int]) -> float:
    """Share of response tokens inside the draft vocabulary."""
    inside = set(token_ids)
    tokens = [t for r in records for t in r["response_ids"]]
    return sum(t in inside for t in tokens) / max(len(tokens), 1)
