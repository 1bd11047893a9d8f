"""The target's responses to a batch of prompts at once: left-padded, each row greedy or sampled, finished
rows dropped as they end. The draft's data, its self-instructed prompts and the heads' training positions are
made with it (distill/ and training/ both)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..core.cache import cache_keyword
from ..core.sampling import greedy_tokens, sample


def padding_id(tokenizer) -> int:
    """The tokenizer's pad id, or its EOS where it has none (SmolLM2's has one; others may not)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


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
    keyword = cache_keyword(target.forward)
    greedy_rows = torch.tensor(greedy, device=device)
    rows = torch.arange(len(prompts), device=device)  # which original row each live row is
    responses: list[list[int]] = [[] for _ in prompts]
    ended = [False] * len(prompts)
    for step in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        token = torch.where(greedy_rows, greedy_tokens(probs), sample(probs, generator))
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
            use_cache=True,
            **{keyword: cache},
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
    with prompt_attention(target):
        logits = target(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_keyword(target.forward): cache},
        ).logits[:, -1]
    return logits, cache, mask, positions


@contextmanager
def prompt_attention(target):
    """SDPA for the prompt pass of a target that decodes with eager attention (as batches do on a CPU):
    eager would hold a [rows, heads, T, T] float32 score tensor per layer (1.9 GB at 64 rows of 900
    tokens), and SDPA took the pass in 0.6 of the time (docs/measurements/distill.md)."""
    eager = target.config._attn_implementation == "eager"
    if eager:
        target.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        if eager:
            target.set_attn_implementation("eager")


def use_eager_attention_on_cpu(target) -> None:
    """Eager attention for batched one-token steps: on the CPU, SDPA's kernel took 4.6 ms a layer at 96 rows
    where eager took under 1 (docs/measurements/distill.md)."""
    if target.device.type == "cpu":
        target.set_attn_implementation("eager")


@contextmanager
def batched_attention(target):
    """use_eager_attention_on_cpu for the length of a block, then the target's own attention again (for a
    model the decoder also runs)."""
    before = target.config._attn_implementation
    use_eager_attention_on_cpu(target)
    try:
        yield
    finally:
        target.set_attn_implementation(before)
