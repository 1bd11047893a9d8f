"""The dial in transformers: Python that reproduces the sidebar's static w with transformers' own assisted
generation, on the app's pair."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.draft import is_feature_draft

# What w weighs in transformers, and its imports: the snippet's first lines.
SNIPPET_HEADER = (
    "# transformers >= 5.14. The weight w applies to the TARGET model's distribution p: each drafted "
    "token\n"
    "# is verified against nu = w * p_target + (1 - w) * q_draft, so w = 1 is exact speculative decoding "
    "and a\n"
    "# lower w accepts more of the draft (assistant) model's tokens.\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
)


def models_code(target: str, draft: str, feature_draft: bool, local: bool) -> str:
    """The lines that load the tokenizer, the target and the draft."""
    if feature_draft:
        # An EAGLE-3 draft reads the target's features: transformers has no path for it.
        return (
            "# This pair's draft is an EAGLE-3 feature draft, which transformers cannot use as an "
            "assistant;\n"
            "# any causal LM with the target's tokenizer can be one.\n"
            f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(target)})\n"
            f"target = AutoModelForCausalLM.from_pretrained({json.dumps(target)})\n"
            'draft = AutoModelForCausalLM.from_pretrained("<a causal LM with the same tokenizer>")\n'
        )
    if local:
        return (
            "from diversed_demo import load_pair  # this pair, as the app loaded it\n"
            f"pair = load_pair({json.dumps(target)}"
            + ("" if draft.startswith("assets/") else f", {json.dumps(draft)}")
            + ")\n"
            "tokenizer, target, draft = pair.tokenizer, pair.target, pair.draft\n"
        )
    return (
        f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(target)})\n"
        f"target = AutoModelForCausalLM.from_pretrained({json.dumps(target)})\n"
        f"draft = AutoModelForCausalLM.from_pretrained({json.dumps(draft)})\n"
    )


def weight_code(w: float) -> str:
    """The generate() argument for w: transformers takes 0 < w < 1 only."""
    if w >= 1:
        return "    # w = 1: exact speculative decoding, transformers' default (no ensemble weight)\n"
    if w <= 0:
        return (
            "    # w = 0 (every draft token accepted) is outside transformers' range 0 < w < 1; "
            "the nearest:\n"
            "    assistant_ensemble_weight=0.01,\n"
        )
    return f"    assistant_ensemble_weight={w:g},\n"


def transformers_snippet(
    target: str,
    draft: str,
    w: float,
    temperature: float,
    max_new_tokens: int,
    feature_draft: bool = False,
    local: bool = False,
) -> str:
    """Python that reproduces static w with transformers' own assisted generation, on this pair.

    transformers verifies against ν = w·p_target + (1 − w)·q_draft (generation/utils.py,
    _speculative_sampling), the same ν as here, and accepts only 0 < w < 1: w = 1 is its plain (lossless)
    assisted generation. `local`: the pair is not two hub models (the embedded pair, local directories), so
    the snippet loads it with this package and hands its models to transformers, as the bench's
    transformers check does.
    """
    models = models_code(target, draft, feature_draft, local)
    weight = weight_code(w)
    sampling = "do_sample=False" if temperature == 0 else f"do_sample=True, temperature={temperature:g}"
    return (
        SNIPPET_HEADER
        + f"""
{models}
inputs = tokenizer.apply_chat_template([{{"role": "user", "content": "Why is the sky blue?"}}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = target.generate(
    **inputs,
    assistant_model=draft,
{weight}    {sampling},
    max_new_tokens={max_new_tokens},
)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
"""
    )


def pair_snippet(pair, w, temperature, max_new_tokens) -> str:
    """The snippet for the app's pair at the sidebar's settings: hub models by name, anything else (the
    embedded pair, local directories) loaded with this package."""
    local = not all(
        isinstance(name, str) and "/" in name and not Path(name).expanduser().exists()
        for name in (pair.target_name, pair.draft_name)
    )
    return transformers_snippet(
        pair.target_name,
        pair.draft_name,
        float(w),
        float(temperature),
        int(max_new_tokens),
        feature_draft=is_feature_draft(pair.draft),
        local=local,
    )
