"""Attention that gives a query row the same bits whatever rows stand beside it: a verification pass then
gives each position what a one-token pass gives it, and exact decoding equals target-only decoding token for
token (docs/measurements/speed.md has the probe and its cost).

A product over all the used slots, or a softmax over them, picks its summation order by their number and
by the number of query rows, so the last bits of a position's logits would depend on how many drafts were
verified with it. Here every sum runs over a fixed width: a score over the head's D, the weighted values
and the weights within blocks of BLOCK slots (the mask's masked slots pad the last), and the blocks added
one after another (a cumulative sum, to which a masked block adds exact zeros). Measured, not proven: the
score product over a width of whole blocks gave every row the same bits for any number of rows here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 64  # cache slots a sum runs over at a time
MIN_BLOCKS = 2  # masks at least this wide: an exported graph then serves every width in one piece
# Rows of zeros added to a product's query rows: on an AVX2 CPU (AMD EPYC, Zen 3) MKL's fp32 product sums a
# product of 3 rows (one token's grouped heads) in another order than one of 6 or more, which all agree
# (speed.md), so every product takes at least this many.
MIN_ROWS = 8


def padded_width(used: int) -> int:
    """The used slots rounded up to whole blocks of BLOCK, at least MIN_BLOCKS of them."""
    return max(MIN_BLOCKS, -(-used // BLOCK)) * BLOCK


def feed_rows(start: int, end: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions [k] of a feed of sequence positions start..end − 1 and its mask [k, W] (each sees
    itself and every earlier slot), W = `padded_width(end)`: the later slots masked."""
    positions = torch.arange(start, end, device=device)
    return positions, torch.arange(padded_width(end), device=device)[None, :] <= positions[:, None]


def padded_mask(visible: torch.Tensor) -> torch.Tensor:
    """A feed's mask [k, S] (what each of its rows sees of the S slots up to its own: a draft tree's rows
    see the sequence and their ancestors) padded with unseen slots to `padded_width(S)`."""
    return F.pad(visible, (0, padded_width(visible.shape[1]) - visible.shape[1]), value=False)


def own_slots(mask: torch.Tensor) -> torch.Tensor:
    """The slot each row of a feed's mask [k, W] writes: the last it sees (a row sees itself, after every
    earlier slot it sees), so a mask carries the slots of a tree's rows as well as a chain's."""
    slots = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask, slots, -1).amax(1)


def mask_bias(mask: torch.Tensor, group: int) -> torch.Tensor:
    """A mask [k, S] as an additive bias over grouped query rows [k·group, S] (row t·group + j is query
    head j of token t)."""
    k, used = mask.shape
    bias = torch.zeros(k, used, device=mask.device).masked_fill(~mask, float("-inf"))
    return bias[:, None].expand(k, group, used).reshape(k * group, used)


def attend_in_blocks(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor):
    """query [k, n_q, D] over the first W slots of a cache (keys, values [n_kv, ≥ W, D]; bias [k·group, W],
    W a multiple of BLOCK: `padded_width`) in float32 products -> [k, n_q·D] in the query's dtype.

    A row's result does not depend on k, nor on how many masked slots follow its own."""
    k, n_q, dim = query.shape
    n_kv, width = keys.shape[0], bias.shape[1]
    group = n_q // n_kv
    rows = query.reshape(k, n_kv, group, dim).permute(1, 0, 2, 3).reshape(n_kv, k * group, dim).float()
    # MIN_ROWS rows of zeros, seeing every slot, dropped at the end (always: a graph exported for any k
    # then takes no guard on k)
    rows, bias = F.pad(rows, (0, 0, 0, MIN_ROWS)), F.pad(bias, (0, 0, 0, MIN_ROWS))
    scores = torch.matmul(rows, keys[:, :width].float().transpose(-1, -2)) * dim**-0.5  # [n_kv, k·group, W]
    scores = (scores + bias).unflatten(-1, (-1, BLOCK)).transpose(1, 2)
    value_blocks = values[:, :width].float().unflatten(1, (-1, BLOCK))
    weights = torch.exp(scores - scores.amax((1, 3), keepdim=True))  # [n_kv, blocks, k·group, BLOCK]
    parts = torch.cat([torch.matmul(weights, value_blocks), weights.sum(-1, keepdim=True)], -1)
    total = parts.cumsum(1)[:, -1]  # [n_kv, k·group, D + 1]: the weighted values, then the weights' sum
    out = total[:, : k * group, :dim] / total[:, : k * group, dim:]
    return out.view(n_kv, k, group, dim).permute(1, 0, 2, 3).reshape(k, n_q * dim).to(query.dtype)
