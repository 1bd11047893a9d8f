"""The decoder: one loop for target-only, exact speculative and DIVERSED decoding, emitting token events.

Each step the draft proposes up to N tokens (draft.py: a standalone LM or a feature draft, one
interface), the target scores them and the bonus position in one pass, `verify_step` decides, and the
loop keeps the accounting and turns the verdict into events. Both models keep a KV cache of the emitted
sequence; on rejection the caches are cropped back, so the prefix is never recomputed. Target-only
decoding is the same loop with N = 0: every step then emits the target's own "bonus" token. The loop
also runs a batch of sequences through one target pass a step (`decode_rows`), which head training uses.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .draft import CachedLM, FeatureDraft, Sampler, StandaloneDraft
from .eagle import Eagle3Draft
from .head import ConstantHead
from .verify import verify_block, verify_block_greedy

MODES = ("ar", "exact", "static", "dynamic")
MAX_N_DRAFT = 32
MAX_SEED = 2**32 - 1  # past 64 bits torch's generator overflows; a browser's number box holds 32 exactly
KINDS = ("accepted", "rejected", "resampled", "bonus", "ar")


@dataclass
class TokenEvent:
    token_id: int
    text: str
    kind: str  # one of KINDS; "rejected" is a draft token turned down, not part of the output
    step: int  # the decoding step (target pass) that decided it, from 1
    w: float | None = None  # ensemble weight w_t at this position (None where no draft competed)
    p: float | None = None  # target probability of the token
    q: float | None = None  # draft probability of the token
    accept_prob: float | None = None
    drafted: int = 0  # how many tokens the draft proposed in this step
    draft_ms: float = 0.0  # the step's drafting time
    verify_ms: float = 0.0  # the step's target pass and verification time

    def to_dict(self) -> dict:
        return asdict(self)


class Rates:
    """Acceptance rate, τ and speed, defined once for whatever counts a decode's tokens in `new_tokens`,
    `target_passes`, `drafted`, `accepted` and `wall_time_s` (a Summary, the Counts of many decodes, a live
    tally): every report of them in the project reads these."""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafted tokens ÷ drafted tokens (None where nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        """Tokens emitted per target pass."""
        return self.new_tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass
class Counts(Rates):
    """Token counts of one decode or a sum of many (`+`), or a live tally of an event stream (`add_event`)."""
    new_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens kept in the output
    rejected: int = 0  # drafted tokens verified and turned down (at most one per step)
    wall_time_s: float = 0.0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(*(getattr(self, f) + getattr(other, f) for f in Counts.__dataclass_fields__))

    @property
    def verified_acceptance(self) -> float | None:
        """Accepted ÷ verified drafts: the per-token acceptance α, where accepted ÷ drafted also counts the
        drafts after a rejection, which are never verified."""
        verified = self.accepted + self.rejected
        return self.accepted / verified if verified else None

    def add_event(self, event: TokenEvent) -> None:
        """Count one event of the stream (events arrive in step order); wall time is the caller's."""
        if event.step > self.target_passes:
            self.target_passes = event.step
            self.drafted += event.drafted
        if event.kind == "rejected":
            self.rejected += 1
        else:
            self.new_tokens += 1
            self.accepted += event.kind == "accepted"


@dataclass
class Summary(Rates):
    text: str
    new_tokens: int
    target_passes: int
    drafted: int
    accepted: int
    wall_time_s: float
    mean_w: float | None = None  # mean w_t over the positions where it decided a token
    token_ids: list[int] = field(default_factory=list)
    events_s: float = 0.0  # of wall_time_s, the time spent building and yielding token events
    rejected: int = 0

    @property
    def counts(self) -> Counts:
        return Counts(self.new_tokens, self.target_passes, self.drafted, self.accepted, self.rejected,
                      self.wall_time_s)

    def to_dict(self) -> dict:
        """The figures of a decode (not its text or ids), as the CLI's --json and the app's traces write them."""
        return {"acceptance_rate": self.acceptance_rate, "tau": self.tau, "new_tokens": self.new_tokens,
                "tokens_per_second": self.tokens_per_second, "wall_time_s": self.wall_time_s,
                "target_passes": self.target_passes, "drafted": self.drafted, "accepted": self.accepted,
                "rejected": self.rejected, "mean_w": self.mean_w}


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
    """The tokens that end a decode: the tokenizer's EOS and those of the target's generation config."""
    ids = set()
    for source in (pair.tokenizer.eos_token_id, getattr(pair.target.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


def check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p, seed=0):
    """A ValueError saying which argument is wrong and why; cheap, so callers check before loading models."""
    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"the seed must be an integer from 0 to {MAX_SEED}, not {seed!r}")
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


def check_context(pair, prompt_ids: list[int], max_new_tokens: int) -> None:
    """A ValueError where the prompt and the new tokens would not fit the target's context."""
    limit = getattr(pair.target.config.get_text_config(), "max_position_embeddings", None)
    if limit and len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's context of {limit} tokens")


def make_draft(pair, mode: str):
    """The pair's draft behind the decoder's interface (none for target-only decoding)."""
    if mode == "ar":
        return None
    if isinstance(pair.draft, Eagle3Draft):
        return FeatureDraft(pair.draft)
    return StandaloneDraft(pair.draft, pair.vocab_size)


def weight_rule(mode: str, ensemble_weight: float = 0.5, head=None):
    """w_t for every mode from one callable (target_hidden [n, H], draft_hidden [n, Hd]) -> [n]:
    exact is w = 1, static a constant, dynamic the head."""
    if mode == "dynamic":
        return head.ensemble_weight
    return ConstantHead(1.0 if mode in ("exact", "ar") else float(ensemble_weight)).ensemble_weight


@dataclass
class Verdict:
    """What one verification decided, with everything the events, the accounting and training read."""
    draft_tokens: torch.Tensor  # [n]
    draft_probs: torch.Tensor  # [n, V]
    target_probs: torch.Tensor  # [n + 1, V]
    w: torch.Tensor  # [n]
    n_accepted: int
    next_token: torch.Tensor  # the resampled token at the first rejection, or the bonus token
    accept_probs: torch.Tensor  # [n]
    target_hidden: torch.Tensor  # [n + 1, H] the target's last hidden states at the scored positions
    draft_hidden: torch.Tensor | None  # [n, Hd] what the head read beside them
    target_features: torch.Tensor | None  # aux hidden states of the verified positions, for a feature draft


def verify_step(scored, fed: int, draft_tokens, draft_probs, draft_hidden, weigh, sampler) -> Verdict:
    """Decide one row's drafts from the target's pass over its `fed` unseen tokens and the drafts:
    scored = (logits [n + 1, V], last hidden [n + 1, H], aux hidden of the fed tokens or None)."""
    logits, target_hidden, aux = scored
    n = len(draft_tokens)
    target_probs = sampler.probs(logits)
    w = weigh(target_hidden[:n], draft_hidden).float() if n else target_probs.new_ones(0)
    if sampler.greedy:
        n_accepted, next_token, accept_probs = verify_block_greedy(draft_tokens, draft_probs, target_probs, w)
    else:
        n_accepted, next_token, accept_probs = verify_block(draft_tokens, draft_probs, target_probs, w,
                                                            sampler.generator)
    verified = None if aux is None else aux[: fed + n_accepted]
    return Verdict(draft_tokens, draft_probs, target_probs, w, n_accepted, next_token, accept_probs,
                   target_hidden, draft_hidden, verified)


@dataclass
class Step:
    """One decoding step: the sequence before it, the verdict, the tokens it emits, and its timing."""
    index: int
    sequence: torch.Tensor
    verdict: Verdict
    new_ids: list[int]  # emitted tokens, cut after an EOS
    stopped: bool  # an EOS ended the decode
    draft_s: float
    verify_s: float


@dataclass
class Row:
    """One sequence of a batch: its prompt, its random stream and how w is set for it."""
    prompt_ids: list[int]
    seed: int = 0
    mode: str = "static"
    ensemble_weight: float = 0.5
    head: object = None


def decode_steps(pair, prompt_ids: list[int], mode: str, ensemble_weight: float = 0.5, head=None,
                 n_draft: int = 4, max_new_tokens: int = 128, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0):
    """The decoding loop for one sequence, one Step at a time (arguments already checked)."""
    for _, step in decode_rows(pair, [Row(prompt_ids, seed, mode, ensemble_weight, head)], n_draft,
                               max_new_tokens, temperature, top_p):
        yield step


def decode_rows(pair, rows: list[Row], n_draft: int = 4, max_new_tokens: int = 128, temperature: float = 1.0,
                top_p: float = 1.0):
    """The decoding loop over a batch of sequences, yielding (row, Step) for each row still decoding at
    each step. Every row has its own draft state, weight rule and random stream, so row r follows the law
    (and, up to rounding, the tokens) of a decode of rows[r] alone; the rows share one target pass a step,
    which streams the target's weights once for all of them (a Step's verify_s is its share of that pass).
    The event stream, the frontier and head training's rollouts all read this loop: one law."""
    device = pair.target.device
    samplers = [Sampler(temperature, top_p, torch.Generator(device=device).manual_seed(row.seed)) for row in rows]
    stop_ids = eos_ids(pair)
    drafts = [make_draft(pair, row.mode) for row in rows]
    weighs = [weight_rule(row.mode, row.ensemble_weight, row.head) for row in rows]
    aux_layer_ids = next((d.aux_layer_ids for d in drafts if d is not None), ())
    target = CachedLM(pair.target, pair.vocab_size, aux_layer_ids, rows=len(rows))
    sequences = [torch.tensor(row.prompt_ids, device=device) for row in rows]
    emitted, active, index = [0] * len(rows), list(range(len(rows))), 0
    while active:
        index += 1
        proposals, draft_s = [], []
        for r in active:
            # Never draft past the budget: the step emits at most n + 1 tokens. A feature draft waits for
            # the target's first pass over the prompt.
            draft, sequence = drafts[r], sequences[r]
            n = min(n_draft, max_new_tokens - emitted[r] - 1) if draft and draft.ready(len(sequence)) else 0
            t0 = time.perf_counter()
            if n > 0:
                proposals.append(draft.propose(sequence, n, samplers[r]))
            else:
                proposals.append((sequence.new_empty(0), torch.empty(0, pair.vocab_size, device=device), None))
            if device.type == "cuda":
                torch.cuda.synchronize()
            draft_s.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        feeds = [torch.cat([sequences[r][target.lengths[i]:], proposal[0]]) for i, (r, proposal)
                 in enumerate(zip(active, proposals))]
        scored = target.forward_rows(feeds, [len(p[0]) + 1 for p in proposals])
        verdicts = [verify_step(out, len(feed) - len(p[0]), *p, weighs[r], samplers[r])
                    for r, out, feed, p in zip(active, scored, feeds, proposals)]
        verify_s = (time.perf_counter() - t1) / len(active)
        still = []
        for i, (r, verdict) in enumerate(zip(active, verdicts)):
            new_ids = torch.cat([verdict.draft_tokens[:verdict.n_accepted], verdict.next_token.view(1)]).tolist()
            stop_at = next((j + 1 for j, t in enumerate(new_ids) if t in stop_ids), None)
            new_ids = new_ids[:stop_at]
            yield r, Step(index, sequences[r], verdict, new_ids, stop_at is not None, draft_s[i], verify_s)
            emitted[r] += len(new_ids)
            sequences[r] = torch.cat([sequences[r], sequences[r].new_tensor(new_ids)])
            if stop_at is not None or emitted[r] >= max_new_tokens:
                continue
            still.append(i)
            # Keep the caches on the new sequence minus its last token (which is fed next step).
            target.rollback(len(sequences[r]) - 1, i)
            if drafts[r] is not None:
                drafts[r].observe(len(sequences[r]), verdict.target_features)
        if len(still) < len(active):
            if still:
                target.keep_rows(still)
            active = [active[i] for i in still]


@dataclass
class Tally:
    """A decode's Summary, counted step by step."""
    summary: Summary = field(default_factory=lambda: Summary("", 0, 0, 0, 0, 0.0))
    w_total: float = 0.0
    w_count: int = 0
    token_w: list = field(default_factory=list)  # w_t at each output token that w decided

    def add(self, step: Step) -> None:
        summary, verdict, n = self.summary, step.verdict, len(step.verdict.draft_tokens)
        summary.target_passes += 1
        summary.drafted += n
        summary.accepted += min(verdict.n_accepted, len(step.new_ids))
        summary.rejected += verdict.n_accepted < n and len(step.new_ids) > verdict.n_accepted  # not cut by an EOS
        verified = verdict.n_accepted + (verdict.n_accepted < n)  # positions whose w mattered
        self.w_total += float(verdict.w[:verified].sum())
        self.w_count += verified
        self.token_w += verdict.w[:min(verified, len(step.new_ids))].tolist()
        summary.new_tokens += len(step.new_ids)
        summary.token_ids += step.new_ids
        summary.wall_time_s += step.draft_s + step.verify_s

    def finish(self, tokenizer, wall_time_s: float | None = None) -> Summary:
        """The Summary, with its text; wall_time_s replaces the steps' own time (which leaves out the loop's)."""
        summary = self.summary
        if wall_time_s is not None:
            summary.wall_time_s = wall_time_s
        summary.text = tokenizer.decode(summary.token_ids, skip_special_tokens=True)
        summary.mean_w = self.w_total / self.w_count if self.w_count else None
        return summary


@torch.inference_mode()
def decode_batch(pair, rows: list[Row], n_draft: int = 4, max_new_tokens: int = 128, temperature: float = 1.0,
                 top_p: float = 1.0) -> list[Tally]:
    """Decode rows as one batch (arguments already checked): each row's Tally, its summary finished."""
    tallies = [Tally() for _ in rows]
    for r, step in decode_rows(pair, rows, n_draft, max_new_tokens, temperature, top_p):
        tallies[r].add(step)
    for tally in tallies:
        tally.finish(pair.tokenizer)
    return tallies


@torch.inference_mode()
def speculative_generate(pair, prompt, mode: str = "static", ensemble_weight: float = 0.5, head=None,
                         n_draft: int = 4, max_new_tokens: int = 128, temperature: float = 1.0,
                         top_p: float = 1.0, seed: int = 0, chat: bool = True, emit_events: bool = True):
    """Decode `prompt` and yield a TokenEvent per decided token, then one Summary.

    mode: "ar" (target only), "exact" (nu = p), "static" (nu = w·p + (1 − w)·q with w = ensemble_weight)
    or "dynamic" (w_t from `head`). temperature 0 is greedy. emit_events=False yields only the Summary
    (the bare loop). Summary.events_s is the time the events took, which prices streaming.
    """
    check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p, seed)
    tokenizer = pair.tokenizer
    prompt_ids = encode_prompt(tokenizer, prompt, chat)
    check_context(pair, prompt_ids, max_new_tokens)
    tally = Tally()
    start = time.perf_counter()
    for step in decode_steps(pair, prompt_ids, mode, ensemble_weight, head, n_draft, max_new_tokens, temperature,
                             top_p, seed):
        tally.add(step)
        if emit_events:
            t3 = time.perf_counter()
            events = step_events(tokenizer, step.sequence, step.verdict, mode, step.index, step.draft_s * 1e3,
                                 step.verify_s * 1e3)
            yield from output_events(events, len(step.new_ids))
            tally.summary.events_s += time.perf_counter() - t3
    yield tally.finish(tokenizer, time.perf_counter() - start)


def output_events(events: list, n_output: int) -> list:
    """The events up to the n_output-th output token (an EOS cuts the step short: nothing after it,
    not even the draft that was rejected after it)."""
    kept, emitted = [], 0
    for event in events:
        if emitted == n_output:
            break
        kept.append(event)
        emitted += event.kind != "rejected"
    return kept


def token_text(tokenizer, context: list[int], token_id: int) -> str:
    """The text a token adds after `context` (decoded with a little context, for byte-level tokenizers)."""
    context = context[-4:]
    before = tokenizer.decode(context, skip_special_tokens=False) if context else ""
    return tokenizer.decode(context + [token_id], skip_special_tokens=False)[len(before):]


def step_events(tokenizer, sequence, verdict: Verdict, mode, step, draft_ms, verify_ms) -> list[TokenEvent]:
    """The events of one decoding step, in order, with one host transfer for all their numbers."""
    draft_tokens, draft_probs, target_probs, w = verdict.draft_tokens, verdict.draft_probs, verdict.target_probs, verdict.w
    n_accepted, next_token, accept_probs = verdict.n_accepted, verdict.next_token, verdict.accept_probs
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
