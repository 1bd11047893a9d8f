"""Token events: what the app and the CLI show of a decode, one per decided token (a rejected draft
included), built from each step's verdict."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .cost_rule import position_costs
from .decode import Step, Verdict
from .tree import depths

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
    tree: dict | None = None  # a tree step's first event: the tree it verified (`tree_figure`)

    def to_dict(self) -> dict:
        # Shallow: dataclasses.asdict deep-copies every value, the larger part of writing a trace.
        return {field.name: getattr(self, field.name) for field in fields(self)}


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
    return token_texts(tokenizer, context, [token_id])[0]


def token_texts(tokenizer, context: list[int], token_ids: list[int]) -> list[str]:
    """The text each of several tokens adds after the same `context` (a tree's nodes), its decode once."""
    context = context[-4:]
    before = tokenizer.decode(context, skip_special_tokens=False) if context else ""
    return [tokenizer.decode(context + [t], skip_special_tokens=False)[len(before) :] for t in token_ids]


def draft_figures(verdict: Verdict) -> list[tuple[float, float, float, float]]:
    """(p(x), q(x), acceptance probability, w) of each drafted token x, in one host transfer."""
    n = verdict.draft_tokens.numel()
    if not n:
        return []
    at = torch.arange(n, device=verdict.draft_tokens.device), verdict.draft_tokens
    figures = [verdict.target_probs[:n][at], verdict.draft_probs[at], verdict.accept_probs.float(), verdict.w]
    return torch.stack([f.float() for f in figures], dim=1).tolist()


def tree_figure(tokenizer, step: Step, lam: float | None = None) -> dict:
    """A tree step's tree as the app draws it: per node its token, text, parent (−1: the root), depth,
    p and q of its token at its parent's row, its chance of being kept where it was tried, and whether it
    was kept; per row the draft expanded, w_t and the rule's terms H(p), TV(p, q) and CE(q, p) − H(p)
    (with λ·TV where a λ is given); the row where every child was rejected."""
    verified = step.verdict.tree
    tree, decided, p, w = verified.tree, verified.decided, verified.target_probs, verified.w
    q, parents, tokens = tree.draft_probs, tree.parents, tree.tokens.tolist()
    context = step.sequence[-4:].tolist()
    chance, path = dict(decided.tried), set(decided.path)
    expanded = [row for row, drawn in enumerate(tree.expanded) if drawn]
    terms = torch.stack([*position_costs(p[expanded], q[expanded]), w[expanded].float()], 1).tolist()
    at = torch.tensor(parents, dtype=torch.long) + 1, tree.tokens
    p_of, q_of = p[at].tolist(), q[at].tolist()  # each node's token at its parent's row
    texts = token_texts(tokenizer, context, tokens)
    nodes = [
        {
            "token_id": token,
            "text": texts[node],
            "parent": parent,
            "depth": depth,
            "p": p_of[node],
            "q": q_of[node],
            "accept_prob": chance.get(node),
            "kept": node in path,
        }
        for node, (token, parent, depth) in enumerate(zip(tokens, parents, depths(parents)))
    ]
    rows = [
        {
            "row": row,
            "w": w_row,
            "entropy": entropy,
            "tv": tv,
            "cost": cost,
            "lam_tv": None if lam is None else lam * tv,
        }
        for row, (cost, tv, entropy, w_row) in zip(expanded, terms)
    ]
    return {"nodes": nodes, "rows": rows, "rejected_at": decided.rejected_at}


def step_events(tokenizer, step: Step, mode: str, lam: float | None = None) -> list[TokenEvent]:
    """The events of one decoding step, in order: the accepted drafts, then either the rejected draft and
    its resampled replacement, or the bonus token (the target's own token in target-only decoding). A
    tree step's first event carries its tree (`tree_figure`, λ·TV beside the rule's cost where given)."""
    verdict = step.verdict
    n, n_accepted, next_token = verdict.draft_tokens.numel(), verdict.n_accepted, int(verdict.next_token)
    at = min(n_accepted, n)  # position of next_token among the drafted ones (n for the bonus)
    figures, drafted = draft_figures(verdict), verdict.draft_tokens.tolist()
    next_p = float(verdict.target_probs[at, next_token])
    context = step.sequence[-4:].tolist()
    timing = dict(
        step=step.index, drafted=step.drafted, draft_ms=step.draft_s * 1e3, verify_ms=step.verify_s * 1e3
    )

    def event(token_id, kind, **figures):
        return TokenEvent(token_id, token_text(tokenizer, context, token_id), kind, **figures, **timing)

    events = []
    for token_id, (p, q, accept_prob, w) in zip(drafted[:n_accepted], figures):
        events.append(event(token_id, "accepted", w=w, p=p, q=q, accept_prob=accept_prob))
        context.append(token_id)
    if at < n:
        p, q, accept_prob, w = figures[at]
        events.append(event(drafted[at], "rejected", w=w, p=p, q=q, accept_prob=accept_prob))
        next_q = float(verdict.draft_probs[at, next_token])
        events.append(event(next_token, "resampled", w=w, p=next_p, q=next_q))
    else:
        events.append(event(next_token, "ar" if mode == "ar" else "bonus", p=next_p))
    if verdict.tree is not None:
        events[0].tree = tree_figure(tokenizer, step, lam)
    return events
