"""Helpers for the vLLM plugin's tests."""

import torch


def sampling_metadata(temperatures, generators=None):
    """vLLM's SamplingMetadata for a batch with these temperatures (0 = greedy), nothing else set."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    temperature = torch.tensor(temperatures, dtype=torch.float32)
    return SamplingMetadata(
        temperature=temperature,
        all_greedy=bool((temperature == 0).all()),
        all_random=bool((temperature > 0).all()),
        top_p=None,
        top_k=None,
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(len(temperatures)),
        presence_penalties=torch.zeros(len(temperatures)),
        repetition_penalties=torch.ones(len(temperatures)),
        output_token_ids=[[] for _ in temperatures],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
