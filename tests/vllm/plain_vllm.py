"""vLLM with no plugin at all (run with VLLM_PLUGINS=""): greedy token ids for the prompts given as JSON on
stdin, printed as JSON after "REFERENCE ". The plugin's outputs without w and with w = 1 must equal them."""

import json
import sys

if __name__ == "__main__":  # vLLM's engine starts processes that import this file again
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from diversed_demo.vllm.engine import default_draft, embedded_target_dir, engine_kwargs

    request = json.load(sys.stdin)
    llm = LLM(**engine_kwargs(embedded_target_dir(), default_draft(), n_draft=4, dtype="float32"))
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    params = SamplingParams(temperature=0, max_tokens=request["max_tokens"])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    print("REFERENCE", json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)
