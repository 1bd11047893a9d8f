"""Tokens in and out: a prompt's ids (through the chat template) and the ids that end a decode."""

from __future__ import annotations


def encode_prompt(tokenizer, prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt: a list of ids is taken as is; text goes through the chat template if any."""
    if isinstance(prompt, (list, tuple)):
        ids = [int(t) for t in prompt]
    else:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("the prompt is empty")
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if not isinstance(ids, list):  # some versions return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if not ids:
        raise ValueError("the prompt is empty")
    return list(ids)


def eos_ids(pair) -> set[int]:
    """The tokens that end a decode: the tokenizer's EOS and those of the target's generation config."""
    ids = set()
    for source in (pair.tokenizer.eos_token_id, getattr(pair.target.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids
