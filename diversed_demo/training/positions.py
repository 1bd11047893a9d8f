"""Positions at scale: what a head fits to (the fields of `rollouts.Rollouts`), recorded from teacher-forced
passes over the target's own responses to thousands of a task's training prompts, where decoding a few
dozen prompts gave a head about a thousand positions.

For each chunk of prompts the target answers (batched sampling at the head's temperature, or greedy); one
pass of the target over prompt and response then gives p and its last hidden state at every response
token, and the draft unrolled as decoding chains it (EAGLE-3's training-time test, `distill/ttt.py`) gives
q and the draft's hidden state at depths 1..N. Each response token is recorded once, at depth
1 + (its index in the response mod N), as if every block before it were accepted whole: every depth is as
common as any other (in decoding, rejections make deep ones rarer).

Prompts are split by a hash of their text (HELD_OUT_SHARE held out): a held-out figure never sees a prompt
it was fitted on, not even another sample of it. Chunks are written atomically under a folder and a rerun
resumes after the last one; the seed fixes each chunk's prompts and samples. Spec-Bench is never read.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import torch

from ..common.files import atomic_write
from ..core.prompt import encode_prompt
from ..distill.batches import make_batch
from ..distill.ttt import label_rows, target_pass, unroll
from ..eval import tasks
from ..runtime.batch_generation import batched_attention, generate_batch, padding_id
from .rollouts import RECORDED, Rollouts, position_terms

HELD_OUT_SHARE = 0.2  # of the prompts, by hash: a held-out figure is one on prompts the fit never saw
CHUNK_PROMPTS = 64  # rows sampled together: the CPU's batched sampling made 308 tokens/s at 64 rows
MAX_SEQUENCE = 640  # prompt and response tokens of one pass (a prompt too long for it is skipped)
POSITIONS_MAX_NEW_TOKENS = 128  # a response's length: longer than RL's, more positions per prompt's pass
P_ROWS = 2048  # positions whose full-vocabulary p is held at once (400 MB in fp32)
HIDDEN = ("target_hidden", "draft_hidden")  # stored in bf16: they are 97% of a position's bytes


def task_prompts(task: str) -> list[str]:
    """A task's prompt pool at scale: its built-in training split and the draft data's prompts of its kind
    (the target's self-instructed requests, the passage prompts), never an evaluation set."""
    from ..distill.passages import read_passage_prompts
    from ..distill.prompts import read_prompts

    def broad(categories):
        rows = read_prompts() + read_passage_prompts()
        return [row["prompt"] for row in rows if row.get("category") in categories]

    if task == "math":
        gsm8k = tasks.load_gsm8k(tasks.data_file("gsm8k/train.jsonl"))
        return [e.prompt for e in tasks.arithmetic_examples("train") + gsm8k] + broad({"math", "reasoning"})
    own = [e.prompt for e in tasks.builtin_examples(task, "train")]
    if task == "code":
        return own + broad({"coding"})
    if task == "summarization":
        return own + broad({"summarization", "extraction"})
    from ..distill.data import INSTRUCTIONS_FILE

    instructions = [row["instruction"] for _, row in tasks.read_jsonl(INSTRUCTIONS_FILE)]
    return own + instructions + [row["prompt"] for row in read_prompts()]


def held_out(prompt: str) -> bool:
    """Whether a prompt is in the held-out share (a hash of its text: stable across runs and machines)."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") < HELD_OUT_SHARE * 2**32


def chunk_prompts(prompts: list[str], chunk: int, seed: int) -> list[str]:
    """The prompts of chunk `chunk`: the pool in a seeded order, cycled (a small pool is sampled again)."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    first = chunk * CHUNK_PROMPTS
    return [prompts[order[i % len(order)]] for i in range(first, first + CHUNK_PROMPTS)]


@torch.no_grad()
def sample_responses(
    pair, prompts: list[str], temperature: float, max_new_tokens: int, seed: int
) -> list[dict]:
    """The target's responses to `prompts` (those that fit MAX_SEQUENCE; greedy at T = 0), as records
    {prompt_ids, response_ids, held_out}; empty responses are dropped."""
    tokenizer, target = pair.tokenizer, pair.target
    ids = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    keep = [i for i, x in enumerate(ids) if len(x) + max_new_tokens <= MAX_SEQUENCE]
    generator = torch.Generator(device=target.device).manual_seed(seed)
    with batched_attention(target):
        responses = generate_batch(
            target, [ids[i] for i in keep], [temperature == 0] * len(keep), max_new_tokens,
            tokenizer.eos_token_id, padding_id(tokenizer), generator, temperature=temperature or 1.0,
        )  # fmt: skip
    return [
        {"prompt_ids": ids[i], "response_ids": response, "held_out": held_out(prompts[i])}
        for i, (response, _) in zip(keep, responses)
        if response
    ]


@torch.no_grad()
def teacher_forced_positions(pair, records: list[dict], temperature: float, n_draft: int) -> dict:
    """Every response token of `records` once, in order (record by record), as RECORDED fields [P, ...] and
    `held_out` [P]: p and the target's hidden state from one pass, q and the draft's hidden state from the
    draft's chain as decoding roots it, the response cut in blocks of N from its start."""
    pad_id = padding_id(pair.tokenizer)
    batch = make_batch(records, pad_id, MAX_SEQUENCE, pair.target.device)
    features, final = target_pass(pair.target, batch, pair.draft.aux_layer_ids, autocast=False)
    # N columns of padding: every root's chain, the last ones' too, stays inside the unrolled length
    batch = {key: torch.nn.functional.pad(value, (0, n_draft), value=0) for key, value in batch.items()}
    batch["ids"][:, -n_draft:] = pad_id
    features = torch.nn.functional.pad(features, (0, 0, 0, n_draft))
    steps = unroll(pair.draft, features, batch, n_draft, autocast=False)
    final = final[batch["predicts_response"][:, : final.shape[1]]]  # [P, H]: those that predict a response
    record_of = batch["predicts_response"].nonzero()[:, 0]
    flags = torch.tensor([r["held_out"] for r in records], device=final.device)[record_of]
    next_tokens = torch.nn.functional.pad(batch["ids"][:, 1:], (0, 1), value=pad_id)  # [B, T]: after each
    # Blocks as decoding's first ones fall: chains rooted at i = s − 1, s − 1 + N, … (s the row's first
    # response position) cover positions i + 1 .. i + N, each response position once.
    starts = torch.tensor([len(r["prompt_ids"]) - 1 for r in records], device=final.device)[:, None]
    roots = (torch.arange(steps[0].shape[1], device=final.device)[None, :] + 1 - starts) % n_draft == 0
    parts = []
    for depth, (hidden, (mask, rows)) in enumerate(zip(steps, label_rows(batch, n_draft, steps[0].shape[1]))):
        chosen = roots[mask]  # among the roots whose depth predicts a response token
        rows, hidden = rows[chosen], hidden[mask][chosen]
        tokens = next_tokens[:, 1 + depth : 1 + depth + mask.shape[1]][mask][chosen]
        for first in range(0, len(rows), P_ROWS):
            cut = slice(first, first + P_ROWS)
            terms = depth_terms(pair, final, rows[cut], hidden[cut], tokens[cut], temperature)
            parts.append(terms | {"held_out": flags[rows[cut]], "order": rows[cut]})
    joined = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
    order = joined.pop("order").argsort()
    return {key: value[order] for key, value in joined.items()}


def depth_terms(pair, final, rows, draft_hidden, tokens, temperature: float) -> dict[str, torch.Tensor]:
    """RECORDED at some positions of one depth: p from the target's final hidden states `final[rows]`, q
    from the draft's hidden states [k, H], both at `temperature`."""
    scale = 1.0 / (temperature or 1.0)
    target_hidden = final[rows]
    lm_head = pair.target.get_output_embeddings()
    logits = lm_head(target_hidden.to(lm_head.weight.dtype))[:, : pair.vocab_size].float()
    p = torch.softmax(logits * scale, dim=-1)
    draft = pair.draft
    q = draft.full_probs(torch.softmax(draft.draft_logits(draft_hidden).float() * scale, dim=-1))
    q = q[:, : pair.vocab_size]
    return position_terms(p, q, tokens, q.argmax(-1), temperature, target_hidden, draft_hidden)


def record_positions(
    pair, task: str, folder, positions: int, temperature: float, n_draft: int, max_new_tokens: int,
    seed: int = 0, progress: bool = True,
) -> Path:  # fmt: skip
    """Record chunks under `folder` until the fit side holds `positions` positions; resumes after the last
    chunk written, and refuses a folder recorded with other settings or another pair."""
    from tqdm.auto import tqdm

    from ..models.heads import pair_identity

    folder = Path(folder)
    settings = {
        "task": task, "temperature": temperature, "n_draft": n_draft, "max_new_tokens": max_new_tokens,
        "seed": seed, "draft_fingerprint": pair_identity(pair)["draft_fingerprint"],
    }  # fmt: skip
    check_settings(folder, settings)
    prompts = task_prompts(task)
    chunks = sorted(folder.glob("chunk_*.safetensors"))
    counts = [stored_counts(path) for path in chunks]
    fit, held = sum(c[0] for c in counts), sum(c[1] for c in counts)
    enough_held = positions * HELD_OUT_SHARE / 2  # a chunk's prompts may all fall on one side
    bar = tqdm(total=positions, initial=min(fit, positions), desc=f"positions ({task})", disable=not progress)
    while fit < positions or held < enough_held:
        index = len(chunks)
        records = sample_responses(
            pair, chunk_prompts(prompts, index, seed), temperature, max_new_tokens, seed * 100_003 + index
        )
        if not records:
            raise ValueError(
                f"none of chunk {index}'s prompts fits {MAX_SEQUENCE} tokens with its response, or the "
                "target answered none of them: the task's prompt pool is of no use at scale"
            )
        chunk = teacher_forced_positions(pair, records, temperature, n_draft)
        path = folder / f"chunk_{index:05d}.safetensors"
        save_chunk(chunk, path)
        chunks.append(path)
        held_added = int(chunk["held_out"].sum())
        added = len(chunk["held_out"]) - held_added
        fit, held = fit + added, held + held_added
        bar.update(min(added, positions - bar.n))
    bar.close()
    return folder


def check_settings(folder: Path, settings: dict) -> None:
    """Write the folder's settings, or check that its chunks were recorded with these."""
    path = folder / "settings.json"
    if path.exists():
        before = json.loads(path.read_text(encoding="utf-8"))
        if before != settings:
            changed = sorted(k for k in settings if before.get(k) != settings[k])
            raise ValueError(
                f"{folder} holds positions recorded with other settings ({', '.join(changed)}); "
                "name another folder, or delete this one to record again"
            )
        return
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(settings, indent=1), encoding="utf-8"))


def save_chunk(chunk: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    state = {
        key: (value.to(torch.bfloat16) if key in HIDDEN else value).contiguous().cpu()
        for key, value in chunk.items()
    }
    held = int(chunk["held_out"].sum())
    counts = {"fit_positions": str(len(chunk["held_out"]) - held), "held_out_positions": str(held)}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=counts))


def stored_counts(path: Path) -> tuple[int, int]:
    """A chunk's fit and held-out positions, from its header."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
    return int(header["fit_positions"]), int(header["held_out_positions"])


def load_positions(folder, device="cpu", limit: int | None = None) -> tuple[Rollouts, Rollouts]:
    """The recorded positions as (fit, held out), each one row [1, P] of Rollouts (in float32); `limit`
    caps the fit side at that many positions (the chunks' order)."""
    from safetensors.torch import load_file

    chunks = sorted(Path(folder).glob("chunk_*.safetensors"))
    if not chunks:
        raise ValueError(f"{folder} holds no recorded positions (record them first)")
    stored = [load_file(str(path), device=str(device)) for path in chunks]
    flags = torch.cat([chunk["held_out"] for chunk in stored])
    fields = {key: torch.cat([chunk[key] for chunk in stored]) for key in RECORDED}
    fields = {key: value if key == "tokens" else value.float() for key, value in fields.items()}

    def side(rows):
        return Rollouts(
            **{key: value[rows][None] for key, value in fields.items()},
            mask=torch.ones(1, len(rows), device=device),
        )

    fit_rows = (~flags).nonzero()[:, 0][:limit]
    return side(fit_rows), side(flags.nonzero()[:, 0])
