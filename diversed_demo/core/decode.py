"""The decoder: one loop for target-only, exact speculative and DIVERSED decoding, emitting token events.

Each step the draft proposes up to N tokens (draft.py: a standalone LM or a feature draft, one
interface), the target scores them and the bonus position in one pass, `verify_step` decides, and the
loop keeps the accounting and turns the verdict into events. Both models keep a KV cache of the emitted
sequence; on rejection the caches are cropped back, so the prefix is never recomputed. Target-only
decoding is the same loop with N = 0: every step then emits the target's own "bonus" token. The loop
also runs a batch of sequences through one target pass a step (`decode_rows`), which head training uses.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..common.threads import THREADS
from .cache import MAX_FEED, CachedLM, tree_feed
from .config import AUTO, TREE_OFF, DecodeConfig, tree_shape
from .draft import make_draft, no_drafts
from .draft_length import AdaptiveLength, FixedLength, draft_length
from .draft_tree import DraftTree, Grower, TreeShape
from .head import weight_rule
from .lookup import PromptLookup
from .prompt import eos_ids
from .sampling import Sampler, greedy_tokens
from .tree import TreeVerdict, children_of, feed_layout, verify_tree, verify_tree_greedy
from .verify import verify_block, verify_block_greedy


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
    # a tree's step; the fields above are then the chain it verified: the kept path, and the first child
    # tried at the row where every child was rejected
    tree: TreeStep | None = None


@dataclass
class TreeStep:
    """A tree step's tree, what verification decided, and the target's p and w_t at every row."""

    tree: DraftTree
    decided: TreeVerdict
    target_probs: torch.Tensor  # [n + 1, V]
    w: torch.Tensor  # [n + 1], 1 at rows the draft did not expand


def verify_step(scored, fed: int, draft_tokens, draft_probs, draft_hidden, weigh, sampler) -> Verdict:
    """Decide one row's drafts from the target's pass over its `fed` unseen tokens and the drafts:
    scored = (logits [n + 1, V], last hidden [n + 1, H], aux hidden of the fed tokens or None)."""
    logits, target_hidden, aux = scored
    n = len(draft_tokens)
    target_probs = sampler.probs(logits)
    if n:
        w = weigh(target_probs[:n], draft_probs, draft_tokens, target_hidden[:n], draft_hidden).float()
    else:
        w = target_probs.new_ones(0)
    if sampler.greedy:
        n_accepted, next_token, accept_probs = verify_block_greedy(draft_tokens, draft_probs, target_probs, w)
    else:
        n_accepted, next_token, accept_probs = verify_block(
            draft_tokens, draft_probs, target_probs, w, sampler.generator
        )
    verified = None if aux is None else aux[: fed + n_accepted]
    return Verdict(
        draft_tokens,
        draft_probs,
        target_probs,
        w,
        n_accepted,
        next_token,
        accept_probs,
        target_hidden,
        draft_hidden,
        verified,
    )


def verify_tree_step(scored, fed: int, tree: DraftTree, weigh, sampler) -> Verdict:
    """Decide a tree (draft_tree.py) from the target's pass over the `fed` unseen tokens and its nodes
    (scored as in verify_step, rows: the root's then each node's) by tree.py's rules, w_t at each row
    the draft expanded."""
    logits, target_hidden, aux = scored
    p, q, children = sampler.probs(logits), tree.draft_probs, children_of(tree.parents)
    rows = [r for r, expanded in enumerate(tree.expanded) if expanded]
    w = p.new_ones(len(p))
    if rows:
        index = torch.tensor(rows)
        # the greedy rule weighs the draft's own choice at a row: its first child, or q's top where none
        # (q's tops in one reduction over the rows, not one per row: a 49k argmax costs 0.1 ms)
        drew = torch.tensor([bool(children[r]) for r in rows], device=tree.tokens.device)
        first_child = torch.tensor([children[r][0] if children[r] else 0 for r in rows])
        q_rows = q[index]
        first = torch.where(drew, tree.tokens[first_child], greedy_tokens(q_rows))
        hidden = None if tree.draft_hidden is None else tree.draft_hidden[index]
        w[index] = weigh(p[index], q_rows, first, target_hidden[index], hidden).float()
    if sampler.greedy:
        decided = verify_tree_greedy(tree.tokens, tree.parents, q, p, w)
    else:
        decided = verify_tree(tree.tokens, tree.parents, q, p, w, sampler.generator)
    chain = list(decided.path)
    if decided.rejected_at is not None:
        chain.append(children[decided.rejected_at][0])  # the rejection the chain view shows
    at = [0] + [node + 1 for node in chain]  # the row deciding each position, then the one after
    chance = dict(decided.tried)
    n = len(chain)
    verified = (
        None
        if aux is None
        else torch.cat([aux[:fed], aux[fed + torch.tensor(decided.path, dtype=torch.long)]])
    )
    return Verdict(
        tree.tokens[chain] if chain else tree.tokens[:0],
        q[at[:n]],
        p[at],
        w[at[:n]],
        len(decided.path),
        decided.next_token,
        p.new_tensor([chance.get(node, 0.0) for node in chain]),
        target_hidden[at],
        None if tree.draft_hidden is None else tree.draft_hidden[at[:n]],
        verified,
        TreeStep(tree, decided, p, w),
    )


@dataclass
class Step:
    """One decoding step: the sequence before it, the verdict, the tokens it emits, and its timing."""

    index: int
    sequence: torch.Tensor
    verdict: Verdict
    new_ids: list[int]  # emitted tokens, cut after an EOS
    stopped: bool  # an EOS ended the decode
    draft_s: float  # proposing: the draft's steps, its sampling and the length rule
    verify_s: float  # the target's pass and the decision (pass_s of it the pass alone)
    pass_s: float = 0.0

    @property
    def drafted(self) -> int:
        """The drafts this step put to the target: all, unless an accepted EOS ended the decode before the
        rest were looked at."""
        if self.verdict.tree is not None:  # a tree put all its nodes to the target
            return len(self.verdict.tree.tree.tokens)
        n, n_accepted = len(self.verdict.draft_tokens), self.verdict.n_accepted
        return n if len(self.new_ids) > n_accepted else len(self.new_ids)


def propose(
    draft, sequence: torch.Tensor, n: int, sampler: Sampler, vocab_size: int, lookup=None, room=0, length=None
):
    """Up to n drafted tokens (none without a draft, or before a feature draft has the target's features of
    the prompt): (tokens [m], q [m, V], the draft's hidden states [m, H] or None), fewer where `length`
    (draft_length.py) stops the draft. A PromptLookup, where given, proposes the copies it finds in place of
    the draft's choices; one that copies whole blocks proposes up to `room` copies alone where the text has
    them and `length` finds they pay (lookup.py), at n = 0 too."""
    if draft is None or not draft.ready(len(sequence)):
        return no_drafts(sequence, vocab_size)
    if lookup is not None:
        lookup.start(sequence)
        # The draft feeds the positions it skipped at its next proposal, in one pass: one of at most MAX_FEED
        # where it drafts now. Where the length rule drafts nothing (n = 0) that pass comes later whatever
        # this step copies, and copies cost no draft step: the room alone bounds them.
        most = room if n <= 0 else min(room, MAX_FEED - 1 - draft.lag(len(sequence)))
        pays = None if length is None else length.copy_pays  # a fixed N takes every copy
        copied = lookup.copies(most, pays) if lookup.copy_blocks else []
        if copied:
            tokens = sequence.new_tensor(copied)
            return tokens, F.one_hot(tokens, vocab_size).float(), None  # q: a point mass on each copy
    if n <= 0:
        return no_drafts(sequence, vocab_size)
    return draft.propose(sequence, n, sampler, lookup, length)


def make_lookup(config: DecodeConfig, sampler: Sampler, draft) -> PromptLookup | None:
    """A row's prompt lookup, where it asks for one and decodes greedily with a draft (lookup.py says why
    greedy only); in exact decoding it copies whole blocks."""
    if not (config.prompt_lookup and sampler.greedy and draft is not None):
        return None
    return PromptLookup(copy_blocks=config.mode == "exact")


def emitted_ids(verdict: Verdict, stop_ids: set[int]) -> tuple[list[int], bool]:
    """The tokens a verdict emits, cut after the first EOS, and whether one ended the decode."""
    new_ids = torch.cat([verdict.draft_tokens[: verdict.n_accepted], verdict.next_token.view(1)]).tolist()
    stop_at = next((j + 1 for j, t in enumerate(new_ids) if t in stop_ids), None)
    return new_ids[:stop_at], stop_at is not None


@dataclass
class Row:
    """One sequence of a batch as it decodes: its tokens so far, its draft's state, its weight rule, its
    random stream, its prompt lookup and its draft length rule."""

    sequence: torch.Tensor
    draft: object
    weigh: Callable
    sampler: Sampler
    lookup: PromptLookup | None
    length: FixedLength | AdaptiveLength
    tree: TreeShape | None = None  # a tree's bounds where the row drafts trees, else a chain
    emitted: int = 0


def start_row(pair, prompt_ids: list[int], config: DecodeConfig, rows: int = 1) -> Row:
    device = pair.target.device
    _, _, temperature, top_p = config.batch_settings
    sampler = Sampler(temperature, top_p, torch.Generator(device=device).manual_seed(config.seed))
    draft = make_draft(pair, config.mode)
    weigh = weight_rule(config, sampler.greedy, getattr(pair, "head_kernel", None))
    length = draft_length(config, getattr(pair, "costs", None))
    if draws_trees(pair, config, draft, rows):
        lookup, tree = None, TreeShape(*(tree_shape(config.tree) or ()))
    else:
        lookup, tree = make_lookup(config, sampler, draft), None
    return Row(torch.tensor(prompt_ids, device=device), draft, weigh, sampler, lookup, length, tree)


def draws_trees(pair, config: DecodeConfig, draft, rows: int) -> bool:
    """Whether a decode drafts trees: where its config asks for them ("auto": where the runtime found that
    they pay), for one sequence (a batch's rows share one pass a step, laid out as chains)."""
    if draft is None or rows > 1 or config.tree == TREE_OFF:
        return False
    if config.tree == AUTO:
        return getattr(getattr(pair, "runtime", None), "drafts", "chains") == "trees"
    return True


def propose_tree(row: Row, room: int, vocab_size: int):
    """The row's drafted tree, sized by its length rule, or no drafts (an empty chain) where the rule
    drafts nothing or the draft has no features yet."""
    limit = row.length.start(room) if row.draft.ready(len(row.sequence)) else 0
    if limit <= 0:
        return no_drafts(row.sequence, vocab_size)
    shape = dataclasses.replace(row.tree, depth=min(row.tree.depth, limit))
    grower = Grower(shape, row.length, row.sampler.greedy, row.sampler.generator)
    tree = row.draft.propose_tree(row.sequence, grower, row.sampler)
    if not len(tree.tokens):  # no node paid its way: the step is the target's own
        return tree.tokens, tree.draft_probs[:0], None
    return tree


def decode_rows(pair, prompts: list[list[int]], configs: list[DecodeConfig], clock=time.perf_counter):
    """The decoding loop over a batch of sequences, yielding (row, Step) for each row still decoding at
    each step. Every row has its own draft state, weight rule and random stream (its config's mode, w,
    head, seed and lookup), so row r follows the law (and, up to rounding, the tokens) of a decode of
    prompts[r] alone; the rows share one target pass a step (so N, length and sampling), which streams the
    target's weights once for all of them (a Step's times are its share of the step's, read from `clock`:
    pass one that waits for the device where times must be exact, as the bench does). The event stream,
    the frontier and head training's rollouts all read this loop: one law."""
    if len({config.batch_settings for config in configs}) != 1:
        raise ValueError("the rows of a batch share N, max_new_tokens, temperature and top_p")
    _, max_new_tokens, _, _ = configs[0].batch_settings
    with pair.in_use():  # what the runtime builds meanwhile is swapped in after this decode
        rows = [start_row(pair, ids, config, len(prompts)) for ids, config in zip(prompts, configs)]
        aux_layer_ids = next((row.draft.aux_layer_ids for row in rows if row.draft is not None), ())
        target = CachedLM(
            pair.target, pair.vocab_size, aux_layer_ids, rows=len(rows), runner=pair.target_pass
        )
        stop_ids, active, index = eos_ids(pair), list(range(len(rows))), 0
        on_cpu = pair.device.type == "cpu"  # a GPU decode's thread waits for its device, not for a core
        while active:
            index += 1
            if on_cpu:
                THREADS.watch(first=index == 1)  # fewer threads while another process keeps a core busy
            start = clock()
            # Never draft past the budget: the step emits at most n + 1 tokens.
            proposals = [
                proposal(rows[r], max_new_tokens - rows[r].emitted - 1, pair.vocab_size) for r in active
            ]
            drafted = clock()
            feeds, scored = score_rows(target, [rows[r] for r in active], proposals)
            passed = clock()
            verdicts = [
                verify_tree_step(out, len(feed) - len(p.tokens), p, rows[r].weigh, rows[r].sampler)
                if isinstance(p, DraftTree)
                else verify_step(out, len(feed) - len(p[0]), *p, rows[r].weigh, rows[r].sampler)
                for out, feed, p, r in zip(scored, feeds, proposals, active)
            ]
            share = [
                (b - a) / len(active) for a, b in ((start, drafted), (drafted, clock()), (drafted, passed))
            ]
            still = []
            for i, (r, verdict) in enumerate(zip(active, verdicts)):
                new_ids, stopped = emitted_ids(verdict, stop_ids)
                yield r, Step(index, rows[r].sequence, verdict, new_ids, stopped, *share)
                if advance(rows[r], target, i, verdict, new_ids, stopped, max_new_tokens):
                    still.append(i)
            if len(still) < len(active):
                if still:
                    target.keep_rows(still)
                active = [active[i] for i in still]
        target.close()
        for row in rows:
            if row.draft is not None:
                row.draft.close()


def proposal(row: Row, room: int, vocab_size: int):
    """This step's drafts for the row, at most `room` deep (the step emits at most one more token): a
    DraftTree where the row drafts trees, else a chain (tokens [m], q [m, V], the draft's hidden states)."""
    if row.tree is not None:
        return propose_tree(row, room, vocab_size)
    return propose(
        row.draft,
        row.sequence,
        row.length.start(room),
        row.sampler,
        vocab_size,
        row.lookup,
        room=min(MAX_FEED - 1, room),
        length=row.length.stopper,
    )


def advance(
    row: Row, target: CachedLM, i: int, verdict: Verdict, new_ids, stopped: bool, budget: int
) -> bool:
    """Append a step's tokens to the row (the target's i-th row of the batch); whether it decodes on."""
    row.emitted += len(new_ids)
    row.length.learn(verdict)
    if verdict.tree is not None and not stopped:  # the target's cache keeps the kept path only
        path = torch.tensor(verdict.tree.decided.path, dtype=torch.long, device=row.sequence.device)
        target.keep_path(len(row.sequence), len(row.sequence) + path)
    row.sequence = torch.cat([row.sequence, row.sequence.new_tensor(new_ids)])
    if stopped or row.emitted >= budget:
        if row.draft is not None:
            row.draft.close()  # its compiled step, if it holds one, goes to the next decode now
        return False
    # Keep the caches on the new sequence minus its last token (which is fed next step).
    target.rollback(len(row.sequence) - 1, i)
    if row.draft is not None:
        row.draft.observe(len(row.sequence), verdict.target_features)
    return True


def score_rows(target: CachedLM, rows: list[Row], proposals) -> tuple[list, list]:
    """One target pass over each row's unseen tokens and its drafts: (the feeds, each row's scores)."""
    if len(rows) == 1 and isinstance(proposals[0], DraftTree):  # one sequence's tree, in tree layout
        tree, unseen = proposals[0], rows[0].sequence[target.length :]
        feed = torch.cat([unseen, tree.tokens])
        layout = tree_feed(target.length, *feed_layout(len(unseen), tree.parents, feed.device))
        return [feed], [target.forward(feed, keep=len(tree.tokens) + 1, rows=layout)]
    feeds = [
        torch.cat([row.sequence[target.lengths[i] :], p[0]])
        for i, (row, p) in enumerate(zip(rows, proposals))
    ]
    return feeds, target.forward_rows(feeds, [len(p[0]) + 1 for p in proposals])
