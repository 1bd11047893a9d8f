"""A standalone draft restricted to a subset of the vocabulary (q = 0 elsewhere): a cheaper draft token."""

from __future__ import annotations

import torch

from ..models.pair import PairError
from .linear import linear_product


class VocabSubsetHead(torch.nn.Module):
    """A draft LM head over a fixed subset of the vocabulary; every other token gets logit −inf (q = 0).

    For a user's small standalone draft (`restrict_draft_vocab(pair.draft, ids)`): its vocabulary-sized head
    is most of its cost, while the target rarely puts mass outside its few thousand most frequent tokens
    (FR-Spec, Zhao et al. 2025). Verification stays exact for any q, so this only trades a little
    acceptance for a much cheaper draft token. The logits keep the full vocabulary, so every caller sees
    one q.
    """

    def __init__(self, weight: torch.nn.Parameter, token_ids: torch.Tensor):
        super().__init__()
        # The full (tied) weight stays the module's parameter, so the draft's state and identity are
        # unchanged; the rows of the subset are copied once for a contiguous product.
        self.weight = weight
        self.vocab_size = weight.shape[0]
        self.register_buffer("token_ids", token_ids.to(weight.device, torch.long), persistent=False)
        self.register_buffer("subset_weight", weight.detach()[self.token_ids].clone(), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        subset_logits = linear_product(self.subset_weight, hidden)
        logits = subset_logits.new_full((*subset_logits.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids, subset_logits)


def restrict_draft_vocab(draft, token_ids) -> None:
    """Make the draft propose only `token_ids` (see VocabSubsetHead)."""
    weight = draft.get_output_embeddings().weight
    token_ids = torch.as_tensor(token_ids, dtype=torch.long)
    if token_ids.numel() == 0 or int(token_ids.min()) < 0 or int(token_ids.max()) >= weight.shape[0]:
        raise PairError(f"a draft vocabulary must be non-empty ids below {weight.shape[0]}")
    draft.set_output_embeddings(VocabSubsetHead(weight, token_ids.unique()))
