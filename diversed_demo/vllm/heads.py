"""The learned heads a vLLM server serves: named at start (`additional_config={"diversed_heads": [...]}`),
checked against the pair it serves, loaded once per worker, and chosen per request (`diversed_head`).

A name is looked up as this project's `diversed-demo` does (the user's heads folder, then the shipped
heads/); `{"name": "path/to/head.safetensors"}` names a file. A head reads both models' hidden states, so it
is bound to one target and one draft: at start the served folders are fingerprinted as this project's
loader sees them (models/heads.py), and a head of another pair stops the server with its reason. A head
also reads the draft's q, which vLLM keeps only when it samples its drafts, so heads need
`draft_sample_method="probabilistic"` and an EAGLE-3 draft.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ..core.head import COST_HEAD_LAM, CostHead
from ..models.heads import (
    HeadError,
    check_head_pair,
    head_kind,
    read_head,
    read_head_metadata,
    resolve_head_path,
)
from .rule import HEAD_KEY, HEADS_KEY, Verifier, parse_head_name

IDENTITY_DTYPE = "bfloat16"  # fingerprints read signs only, so the cheapest dtype that keeps them will do


def configured_heads(additional_config) -> dict[str, Path]:
    """{name: file} of the heads a server's additional_config names (its default head included); {} for
    none. A ValueError names what is wrong: a malformed entry, or a name with no file."""
    config = additional_config if isinstance(additional_config, dict) else {}
    named = config.get(HEADS_KEY, [])
    if isinstance(named, str):
        named = [named]
    if isinstance(named, list):
        named = {
            parse_head_name(name, f"an entry of additional_config's {HEADS_KEY}"): name for name in named
        }
    if not isinstance(named, dict) or not all(isinstance(v, str) for v in named.values()):
        raise ValueError(
            f"additional_config's {HEADS_KEY} must be a list of head names or a {{name: path}} object, "
            f"not {named!r}"
        )
    if HEAD_KEY in config:  # the server's default head is served too
        default = parse_head_name(config[HEAD_KEY], f"additional_config's {HEAD_KEY}")
        named.setdefault(default, default)
    try:
        return {parse_head_name(name): resolve_head_path(source) for name, source in named.items()}
    except HeadError as err:
        raise ValueError(f"additional_config's {HEADS_KEY}: {err}") from None


def served_head_kinds(vllm_config) -> dict[str, str]:
    """The served heads' kinds by name, for checking requests (looked up once per server config)."""
    return head_kinds(json.dumps(vllm_config.additional_config, sort_keys=True, default=str))


@functools.cache
def head_kinds(additional_config_json: str) -> dict[str, str]:
    """{name: "ensemble" | "cost"} of the heads a server config names, from their files' metadata."""
    heads = configured_heads(json.loads(additional_config_json))
    return {name: head_kind(path) for name, path in heads.items()}


def check_served_heads(vllm_config) -> None:
    """At start: refuse heads the engine cannot feed, and heads trained for another pair (ValueError)."""
    heads = configured_heads(vllm_config.additional_config)
    if not heads:
        return
    spec = vllm_config.speculative_config
    if spec is None or spec.method != "eagle3":
        raise ValueError(f"{HEADS_KEY} needs an EAGLE-3 speculator: a head reads the draft's hidden states")
    if getattr(spec, "draft_sample_method", "greedy") != "probabilistic":
        raise ValueError(
            f'{HEADS_KEY} needs "draft_sample_method": "probabilistic" in the speculative config: a head '
            "reads the draft's q, which vLLM's greedy drafting does not keep"
        )
    identity = served_pair_identity(str(vllm_config.model_config.model), str(spec.model))
    for name, path in heads.items():
        meta = read_head_metadata(path)["meta"]
        try:
            check_head_pair(meta.get("pair", {}), identity, f"head {name!r} ({path})")
        except HeadError as err:
            raise ValueError(str(err)) from None


@functools.cache
def served_pair_identity(target_dir: str, draft_dir: str) -> dict:
    """What this project's loader fingerprints the served folders as: the identity a head is bound to."""
    from ..models.heads import pair_identity
    from ..models.loading import load_models

    pair = load_models(target_dir, draft_dir, device="cpu", dtype=IDENTITY_DTYPE)
    return dict(pair_identity(pair))


def check_request_head(verifier: Verifier, vllm_config) -> None:
    """A request's head must be one the server serves, and only a cost head takes a λ (ValueError)."""
    if verifier.head is None:
        return
    kinds = served_head_kinds(vllm_config)
    if verifier.head not in kinds:
        served = ", ".join(sorted(kinds)) or "none"
        raise ValueError(
            f"{HEAD_KEY} {verifier.head!r} is not served here (heads served: {served}; a server names "
            f"them at start in additional_config's {HEADS_KEY})"
        )
    if kinds[verifier.head] != "cost" and verifier.lam == verifier.lam:  # λ given (not NaN)
        raise ValueError(
            f"head {verifier.head!r} is an ensemble head: only a cost head takes a diversed_lambda"
        )


def worker_heads(runner) -> dict:
    """{name: head module on the runner's device}, loaded on first use and kept on the runner."""
    if getattr(runner, "_diversed_heads", None) is None:
        files = configured_heads(runner.vllm_config.additional_config)
        runner._diversed_heads = {name: read_head(path, runner.device) for name, path in files.items()}
    return runner._diversed_heads


def head_setting(head, lam: float) -> float:
    """The λ a head runs at: a cost head's request λ, or its default; an ensemble head has none (NaN)."""
    if isinstance(head, CostHead):
        return COST_HEAD_LAM if lam != lam else lam
    return float("nan")
