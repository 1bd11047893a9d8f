"""Helpers for the vLLM plugin's tests."""

import torch

MAX_TOKENS = 48  # new tokens per request in the engine tests


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


def generate(llm, prompts, temperature=0.0, w=None, seed=0, lam=None, head=None):
    """(token ids per prompt, acceptance over the batch) for one request per prompt, at a static w, under
    the per-token rule at λ, or with a head (and λ, for a cost head)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from diversed_demo.vllm.engine import spec_counters

    fields = {"diversed_w": w, "diversed_lambda": lam, "diversed_head": head}
    extra = {key: value for key, value in fields.items() if value is not None} or None
    params = SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, seed=seed, extra_args=extra)
    before = spec_counters(llm)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    after = spec_counters(llm)
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    acceptance = (after["num_accepted_tokens"] - before["num_accepted_tokens"]) / drafted
    return [list(o.outputs[0].token_ids) for o in outputs], acceptance


def record_head_inputs(worker) -> None:
    """In a vLLM worker (through `LLM.collective_rpc`): from now on, keep what each step's heads are fed:
    the drafted tokens and both models' hidden states at them."""
    from diversed_demo.vllm import sampler

    if not hasattr(sampler, "test_records"):
        upstream = sampler.with_head_weights

        def recording(per_token, step, num_draft_tokens, target_probs, draft_token_ids, *rest):
            target_hidden, draft_hidden = step.hidden
            sampler.test_records.append(
                {
                    "drafts": draft_token_ids.tolist(),
                    "target": target_hidden.cpu(),
                    "draft": draft_hidden.cpu(),
                }
            )
            return upstream(per_token, step, num_draft_tokens, target_probs, draft_token_ids, *rest)

        sampler.with_head_weights = recording
    sampler.test_records = []


def recorded_head_inputs(worker) -> list[dict]:
    from diversed_demo.vllm import sampler

    return sampler.test_records
