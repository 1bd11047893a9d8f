"""Loading a (target, draft) pair that shares a tokenizer, with a standalone or an EAGLE-3 draft, and the
embedded SmolLM2 pair, as transformers builds them: how they then run fast here is the runtime's
(runtime/plan.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .eagle import WEIGHTS_FILE, Eagle3Draft
from .embedded import EMBEDDED, EMBEDDED_DRAFT_DIR, embedded_gguf_path
from .gguf_cache import _converted_gguf_dir
from .pair import ModelPair, PairError


def pick_device(device: str = "auto") -> torch.device:
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device: torch.device, dtype: str | torch.dtype = "auto") -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a pair whose token ids do not mean the same thing, naming the first mismatch."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if len(t_vocab) != len(d_vocab):
        raise PairError(
            f"tokenizers differ: vocabulary size {len(t_vocab)} (target) vs {len(d_vocab)} (draft)"
        )
    if t_vocab != d_vocab:
        token = next(tok for tok in t_vocab if d_vocab.get(tok) != t_vocab[tok])
        raise PairError(
            f"tokenizers differ: token {token!r} has id {t_vocab[token]} in the target "
            f"and {d_vocab.get(token)} in the draft"
        )
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        t_id, d_id = getattr(target_tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if t_id != d_id:
            raise PairError(f"tokenizers differ: {name} is {t_id} in the target and {d_id} in the draft")


def resolve_source(name_or_path: str) -> str:
    """A hub id, a local directory, or a .gguf file (converted once into the cache)."""
    if name_or_path == EMBEDDED:
        return str(_converted_gguf_dir(embedded_gguf_path()))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise PairError(f"GGUF file not found: {path}")
        return str(_converted_gguf_dir(path))
    if path.exists() and not (path / "config.json").exists():
        raise PairError(f"{path} is not a model directory (no config.json)")
    if path.exists():
        return str(path)
    check_hub_model(name_or_path)
    return name_or_path


def gguf_file(name_or_path: str) -> Path | None:
    """The .gguf file a target is loaded from, if any."""
    if name_or_path == EMBEDDED:
        return embedded_gguf_path()
    path = Path(name_or_path).expanduser()
    return path if path.suffix == ".gguf" and path.exists() else None


def check_hub_model(name: str) -> None:
    """Fail at once, in one line, for a hub id that cannot load: transformers would retry the hub for
    about a minute when offline and end in a traceback."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # in the local cache: loads offline
    if constants.HF_HUB_OFFLINE:
        raise PairError(
            f"cannot load model {name!r}: not a local directory and not in the Hugging Face cache "
            f"(HF_HUB_OFFLINE is set)"
        )
    try:
        model_info(name, timeout=10)
    except GatedRepoError:
        raise PairError(
            f"cannot load model {name!r}: it is gated; accept its licence on the hub and log in "
            f"(hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise PairError(
            f"cannot load model {name!r}: no such model on the Hugging Face hub (or it is private)"
        ) from None
    except Exception as err:  # connection errors vary by library version; the advice does not
        raise PairError(
            f"cannot load model {name!r}: not a local directory, and the Hugging Face hub cannot "
            f"be reached ({type(err).__name__}: {err})"
        ) from None


def _load_model(source: str, device: torch.device, dtype: torch.dtype):
    """A model as transformers loads it. (A .gguf's cached conversion is checked, and made again if damaged,
    where `resolve_source` finds it; weights damaged elsewhere are named in one line, not a traceback.)"""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
    except torch.cuda.OutOfMemoryError:
        # Too big for one GPU: let accelerate spread it over all GPUs (and the CPU if need be).
        torch.cuda.empty_cache()
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map="auto")
    except OSError as err:
        raise PairError(f"cannot load model {source!r}: {err}") from err
    except SafetensorError as err:  # a weights file cut short or overwritten
        raise PairError(f"cannot load model {source!r}: its weights are damaged ({err})") from err
    return model.eval().requires_grad_(False)


def load_draft_weights(draft, path: Path, borrowed: tuple[str, ...]) -> None:
    """Load a draft's safetensors file, which must hold every weight but the `borrowed` ones (the target's own
    tensors, shared at load time), converted to the draft's dtype."""
    from safetensors.torch import load_file

    dtype = next(draft.parameters()).dtype
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    missing = [k for k in missing if not any(name in k for name in borrowed)]
    if missing or unexpected:
        raise PairError(
            f"draft weights in {path.parent} do not match its config: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )


def is_eagle3_dir(directory) -> bool:
    path = Path(directory) / "config.json"
    return path.exists() and json.loads(path.read_text()).get("speculators_model_type") == "eagle3"


def load_eagle3(directory, target) -> Eagle3Draft:
    """A saved EAGLE-3 draft for `target`, whose token embedding it borrows."""
    directory = Path(directory)
    draft = Eagle3Draft(json.loads((directory / "config.json").read_text()))
    target_hidden = target.config.get_text_config().hidden_size
    n_layers = target.config.get_text_config().num_hidden_layers
    if draft.hidden_size != target_hidden or max(draft.aux_layer_ids) > n_layers:
        raise PairError(
            f"the EAGLE-3 draft in {directory} reads hidden size {draft.hidden_size} at layers "
            f"{draft.aux_layer_ids}; the target has {target_hidden} and {n_layers} layers"
        )
    load_draft_weights(draft, directory / WEIGHTS_FILE, borrowed=("embed_tokens",))
    draft.embed_tokens.weight = target.get_input_embeddings().weight
    draft.directory = directory.resolve()  # where a background build loads it again (compiled_build)
    return draft.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


def load_target(target: str, device: torch.device, dtype: torch.dtype):
    """The target model alone."""
    return _load_model(resolve_source(target), device, dtype)


def load_models(
    target: str = EMBEDDED, draft: str | None = None, device: str = "auto", dtype: str = "auto"
) -> ModelPair:
    """Load target, draft and their shared tokenizer as transformers runs them (dtype "auto": float32 on a
    CPU). The public `load_pair` (runtime/plan.py) loads through here, then makes the pair fast.

    `target`/`draft` are hub ids, local directories or .gguf files; `smollm2-135m` is the embedded pair
    (draft defaults to the shipped one). Raises PairError with a readable message on any mismatch.
    """
    from transformers import AutoTokenizer

    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    tokenizer = AutoTokenizer.from_pretrained(resolve_source(target))
    target_model = load_target(target, dev, torch_dtype)
    if draft is None and target == EMBEDDED:
        if not is_eagle3_dir(EMBEDDED_DRAFT_DIR):
            raise PairError(
                f"the embedded draft is missing from {EMBEDDED_DRAFT_DIR} (git checkout assets/draft, "
                "or rebuild it with `diversed-demo distill`)"
            )
        draft_model, draft_name = load_eagle3(EMBEDDED_DRAFT_DIR, target_model), "assets/draft"
    elif draft is None:
        raise PairError("a draft model is needed: pass --draft (a hub id, directory or .gguf)")
    elif is_eagle3_dir(Path(draft).expanduser()):
        draft_model, draft_name = load_eagle3(Path(draft).expanduser(), target_model), draft
    else:
        draft_source = resolve_source(draft)
        check_tokenizers(tokenizer, AutoTokenizer.from_pretrained(draft_source))
        draft_model, draft_name = _load_model(draft_source, dev, torch_dtype), draft
    pair = ModelPair(target_model, draft_model, tokenizer, target, draft_name, dev)
    if pair.vocab_size < len(tokenizer):
        raise PairError(
            f"a model's vocabulary ({pair.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)})"
        )
    return pair
