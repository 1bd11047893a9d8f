"""What a decode takes, and the checks that refuse a bad setting with a message naming it."""

from __future__ import annotations

MODES = ("ar", "exact", "static", "dynamic")


MAX_N_DRAFT = 32


MAX_SEED = 2**32 - 1  # past 64 bits torch's generator overflows; a browser's number box holds 32 exactly


def check_args(mode, ensemble_weight, head, n_draft, max_new_tokens, temperature, top_p, seed=0):
    """A ValueError saying which argument is wrong and why; cheap, so callers check before loading models."""
    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"the seed must be an integer from 0 to {MAX_SEED}, not {seed!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "static" and not (isinstance(ensemble_weight, (int, float)) and 0.0 <= ensemble_weight <= 1.0):
        raise ValueError(f"the ensemble weight w must be a number in [0, 1], not {ensemble_weight!r}")
    if mode == "dynamic" and head is None:
        raise ValueError("dynamic mode needs a head (--head PATH)")
    if mode != "ar" and not (isinstance(n_draft, int) and 1 <= n_draft <= MAX_N_DRAFT):
        raise ValueError(f"n_draft must be an integer from 1 to {MAX_N_DRAFT}, not {n_draft!r}")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be ≥ 0 (0 is greedy), not {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], not {top_p!r}")


def check_context(pair, prompt_ids: list[int], max_new_tokens: int) -> None:
    """A ValueError where the prompt and the new tokens would not fit the target's context."""
    limit = getattr(pair.target.config.get_text_config(), "max_position_embeddings", None)
    if limit and len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {limit} tokens"
        )
