"""Greedy requests' q under probabilistic drafting.

vLLM 0.32 keeps the draft's probabilities only for a batch in which some request samples: a batch of
greedy requests alone is drafted by argmax and keeps no q, so it is verified as if q were the point mass
on each drafted x, while a greedy request batched beside sampled ones gets the draft's q (at T = 1). With
`draft_sample_method="probabilistic"` the plugin keeps q for all-greedy batches too, so that a greedy
request is verified against the same ν = w·p + (1 − w)·q whatever it is batched with, as this project's
decoder verifies it. The drafted tokens are the argmax, as before; the cost is one softmax of the logits
the draft already computed.
"""

from __future__ import annotations

import torch
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

UPSTREAM_SAMPLE_DRAFT_TOKENS = SpecDecodeBaseProposer._sample_draft_tokens


def install() -> None:
    SpecDecodeBaseProposer._sample_draft_tokens = sample_draft_tokens_keeping_q


def sample_draft_tokens_keeping_q(self, hidden_states, sampling_metadata):
    """SpecDecodeBaseProposer._sample_draft_tokens, with q kept for a batch of greedy requests."""
    keeps_q = self._enable_probabilistic_draft_probs and not self.use_heterogeneous_vocab
    if not (keeps_q and sampling_metadata.all_greedy):
        return UPSTREAM_SAMPLE_DRAFT_TOKENS(self, hidden_states, sampling_metadata)
    logits = self.model.compute_logits(hidden_states)
    return logits.argmax(dim=-1), logits.softmax(dim=-1, dtype=torch.float32)
