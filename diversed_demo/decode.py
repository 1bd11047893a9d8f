"""The decoder: one loop for target-only, exact speculative and DIVERSED decoding, emitting token events.

Each step the draft proposes up to N tokens, the target scores them (and the bonus position) in one
pass, and `verify_block` decides. Both models keep a KV cache of the emitted sequence; on rejection the
caches are cropped back, so the prefix is never recomputed. Target-only decoding is the same loop with
N = 0: every step then emits the target's own "bonus" token.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache

from .verify import sample, sampling_probs, verify_block, verify_block_greedy

MODES = ("ar", "exact", "static", "dynamic")
MAX_N_DRAFT = 32
KINDS = ("accepted", "rejected", "resampled", "bonus", "ar")


@dataclass
class TokenEvent:
    token_id: int
    text: str
    kind: str  # one of KINDS; "rejected" is a draft token turned down, not part of the output
    step: int
    w: float | None = None  # ensemble weight w_t at this position (None where no draft competed)
    p: float | None = None  # target probability of the token
    q: float | None = None  # draft probability of the token
    accept_prob: float | None = None
    drafted: int = 0  # how many tokens the draft proposed in this step
    draft_ms: float = 0.0  # the step's drafting time
    verify_ms: float = 0.0  # the step's target pass and verification time

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Summary:
    text: str
    new_tokens: int
    target_passes: int
    drafted: int
    accepted: int
    wall_time_s: float
    mean_w: float | None = None
    token_ids: list[int] = field(default_factory=list)
    events_s: float = 0.0  # of wall_time_s, the time spent building and yielding token events

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float:
        """Tokens emitted per target pass."""
        return self.new_tokens / max(self.target_passes, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"acceptance_rate": self.acceptance_rate, "tau": self.tau, "new_tokens": self.new_tokens,
                "tokens_per_second": self.tokens_per_second, "wall_time_s": self.wall_time_s,
                "target_passes": self.target_passes, "drafted": self.drafted, "accepted": self.accepted,
                "mean_w": self.mean_w}


def encode_prompt(tokenizer, prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt: a list of ids is taken as is; text goes through the chat template if any."""
    if isinstance(prompt, (list, tuple)):
        ids = [int(t) for t in prompt]
    else:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty")
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                add_generation_prompt=True, tokenize=True)
            if not isinstance(ids, list):  # some versions return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if not ids:
        raise ValueError("the prompt is empty")
    return list(ids)


def eos_ids(pair) -> set[int]:
    ids = set()
    for source in (pair.tokenizer.eos_token_id, getattr(pair.target.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


class CachedLM:
    """A causal LM with its KV cache and the number of sequence tokens the cache holds."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.vocab_size = vocab_size
        self.cache = DynamicCache(config=model.config)
        self.length = 0

    def forward(self, tokens: torch.Tensor, keep: int):
        """Feed tokens [k]; return logits [keep, V] and last hidden states [keep, H] of the last `keep`."""
        out = self.decoder(input_ids=tokens.view(1, -1), past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state[0, -keep:]
        logits = self.lm_head(hidden)[:, : self.vocab_size]
        self.length += tokens.numel()
        return logits, hidden

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


def check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "static" and not (isinstance(ensemble_weight, (int, float)) and 0.0 <= ensemble_weight <= 1.0):
        raise ValueError(f"the ensemble weight w must be a number in [0, 1], not {ensemble_weight!r}")
    if mode == "dynamic" and head is None:
        raise ValueError("dynamic mode needs a head (--head PATH)")
    if mode != "ar" and not (isinstance(n_draft, int) and 1 <= n_draft <= MAX_N_DRAFT):
        raise ValueError(f"n_draft must be an integer from 1 to {MAX_N_DRAFT}, not {n_draft!r}")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be ≥ 0 (0 is greedy), not {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], not {top_p!r}")


@torch.inference_mode()
def speculative_generate(pair, prompt, mode: str = "static", ensemble_weight: float = 0.5, head=None,
                         n_draft: int = 4, max_new_tokens: int = 128, temperature: float = 1.0,
                         top_p: float = 1.0, seed: int = 0, chat: bool = True, emit_events: bool = True):
    """Decode `prompt` and yield a TokenEvent per decided token, then one Summary.

    mode: "ar" (target only), "exact" (nu = p), "static" (nu = w·p + (1 − w)·q with w = ensemble_weight)
    or "dynamic" (w_t from `head`). temperature 0 is greedy. emit_events=False yields only the Summary
    (the bare loop). Summary.events_s is the time the events took, which prices streaming.
    """
    check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p)
    tokenizer, device = pair.tokenizer, pair.target.device
    prompt_ids = encode_prompt(tokenizer, prompt, chat)
    limit = getattr(pair.target.config.get_text_config(), "max_position_embeddings", None)
    if limit and len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's context of {limit} tokens")
    greedy = temperature == 0
    generator = torch.Generator(device=device).manual_seed(seed)
    stop_ids = eos_ids(pair)
    target = CachedLM(pair.target, pair.vocab_size)
    draft = CachedLM(pair.draft, pair.vocab_size) if mode != "ar" else None
    sequence = torch.tensor(prompt_ids, device=device)
    n_prompt = len(prompt_ids)
    summary = Summary("", 0, 0, 0, 0, 0.0)
    w_total, w_count = 0.0, 0
    start = time.perf_counter()
    step = 0
    while summary.new_tokens < max_new_tokens:
        step += 1
        # Never draft past the budget: the step emits at most n + 1 tokens.
        n = 0 if mode == "ar" else min(n_draft, max_new_tokens - summary.new_tokens - 1)
        t0 = time.perf_counter()
        draft_tokens, draft_probs, draft_hidden = [], [], []
        if n > 0:
            feed = sequence[draft.length:]
            for _ in range(n):
                logits, hidden = draft.forward(feed, keep=1)
                probs = sampling_probs(logits[0], temperature, top_p)
                token = (probs.argmax(-1) if greedy else sample(probs, generator)).view(1)
                draft_tokens.append(token)
                draft_probs.append(probs)
                draft_hidden.append(hidden[0])
                feed = token
            draft_tokens, draft_probs = torch.cat(draft_tokens), torch.stack(draft_probs)
        else:
            draft_tokens = sequence.new_empty(0)
            draft_probs = torch.empty(0, pair.vocab_size, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()

        logits, target_hidden = target.forward(torch.cat([sequence[target.length:], draft_tokens]), keep=n + 1)
        target_probs = sampling_probs(logits, temperature, top_p)
        if mode == "exact":
            w = torch.ones(n, device=device)
        elif mode == "static":
            w = torch.full((n,), float(ensemble_weight), device=device)
        elif mode == "dynamic" and n > 0:
            w = head.ensemble_weight(target_hidden[:n], torch.stack(draft_hidden)).float()
        else:
            w = torch.ones(0, device=device)
        verify = verify_block_greedy if greedy else verify_block
        extra = () if greedy else (generator,)
        n_accepted, next_token, accept_probs = verify(draft_tokens, draft_probs, target_probs, w, *extra)
        t2 = time.perf_counter()

        new_ids = torch.cat([draft_tokens[:n_accepted], next_token.view(1)]).tolist()
        stop_at = next((i + 1 for i, t in enumerate(new_ids) if t in stop_ids), None)
        new_ids = new_ids[:stop_at]
        summary.target_passes += 1
        summary.drafted += n
        summary.accepted += min(n_accepted, len(new_ids))
        verified = n_accepted + (n_accepted < n)  # positions whose w mattered
        w_total = w_total + w[:verified].sum()
        w_count += verified
        if emit_events:
            t3 = time.perf_counter()
            events = step_events(tokenizer, sequence, draft_tokens, draft_probs, target_probs, w, accept_probs,
                                 n_accepted, next_token, mode, step, (t1 - t0) * 1e3, (t2 - t1) * 1e3)
            emitted = 0
            for event in events:
                emitted += event.kind != "rejected"
                if emitted > len(new_ids):
                    break  # past an EOS
                yield event
            summary.events_s += time.perf_counter() - t3
        summary.new_tokens += len(new_ids)
        sequence = torch.cat([sequence, sequence.new_tensor(new_ids)])
        if stop_at is not None:
            break
        # Keep the caches in step with the new sequence minus its last token (which is fed next step).
        target.rollback(len(sequence) - 1)
        if draft is not None:
            draft.rollback(len(sequence) - 1)

    summary.wall_time_s = time.perf_counter() - start
    summary.token_ids = sequence[n_prompt:].tolist()
    summary.text = tokenizer.decode(summary.token_ids, skip_special_tokens=True)
    summary.mean_w = float(w_total) / w_count if w_count else None
    yield summary


def token_text(tokenizer, context: list[int], token_id: int) -> str:
    """The text a token adds after `context` (decoded with a little context, for byte-level tokenizers)."""
    context = context[-4:]
    before = tokenizer.decode(context, skip_special_tokens=False) if context else ""
    return tokenizer.decode(context + [token_id], skip_special_tokens=False)[len(before):]


def step_events(tokenizer, sequence, draft_tokens, draft_probs, target_probs, w, accept_probs, n_accepted,
                next_token, mode, step, draft_ms, verify_ms) -> list[TokenEvent]:
    """The events of one decoding step, in order, with one host transfer for all their numbers."""
    n = draft_tokens.numel()
    pos = torch.arange(n, device=draft_tokens.device)
    at = min(n_accepted, n)  # position of next_token among the drafted ones (n for the bonus)
    per_draft = torch.stack([target_probs[:n][pos, draft_tokens], draft_probs[pos, draft_tokens],
                             accept_probs.float(), w.float()], dim=1).tolist() if n else []
    next_p = float(target_probs[at, next_token])
    next_q = float(draft_probs[at, next_token]) if at < n else None
    drafted, nxt = draft_tokens.tolist(), int(next_token)
    context = sequence[-4:].tolist()
    timing = dict(step=step, drafted=n, draft_ms=draft_ms, verify_ms=verify_ms)
    events = []
    for i in range(n_accepted):
        p, q, a, wi = per_draft[i]
        events.append(TokenEvent(drafted[i], token_text(tokenizer, context, drafted[i]), "accepted",
                                 w=wi, p=p, q=q, accept_prob=a, **timing))
        context.append(drafted[i])
    if at < n:
        p, q, a, wi = per_draft[at]
        events.append(TokenEvent(drafted[at], token_text(tokenizer, context, drafted[at]), "rejected",
                                 w=wi, p=p, q=q, accept_prob=a, **timing))
        events.append(TokenEvent(nxt, token_text(tokenizer, context, nxt), "resampled",
                                 w=wi, p=next_p, q=next_q, **timing))
    else:
        events.append(TokenEvent(nxt, token_text(tokenizer, context, nxt), "ar" if mode == "ar" else "bonus",
                                 p=next_p, **timing))
    return events


def generate(pair, prompt, **kwargs):
    """Run a decode to the end: (summary, events). The events include rejected drafts."""
    events = list(speculative_generate(pair, prompt, **kwargs))
    return events[-1], events[:-1]
