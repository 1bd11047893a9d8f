"""A .gguf target converted once (dequantised to safetensors) into the user cache, so later starts load
in seconds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from ..common.files import cache_dir, discard_damaged
from .gguf_patches import read_once


def gguf_key(gguf_path: Path) -> str:
    """A short key of a GGUF's content (its size and first MiB), so every virtualenv shares what is derived
    from it."""
    with open(gguf_path, "rb") as f:
        return hashlib.sha256(f"{gguf_path.stat().st_size}:".encode() + f.read(1 << 20)).hexdigest()[:12]


# 2: special tokens set from the GGUF's ids (conversions by transformers 5.17 named <|im_start|> as EOS).
CONVERSION = 2


def special_tokens_from_config(tokenizer, config) -> None:
    """Name the tokenizer's BOS, EOS, pad and unknown tokens by the ids the GGUF's metadata gives (the
    config's), whatever the transformers version made of them."""
    for name in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{name}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))


def conversion_damage(folder: Path) -> str | None:
    """What is wrong with a cached conversion, or None if nothing is: a file it needs missing, a JSON file
    that does not parse, or a weights file shorter or longer than its header says (cut short by a full
    disk, a copy or a crash). Cheap: the weights' headers are read, not the weights."""
    from safetensors import safe_open

    for name in ("config.json", "tokenizer_config.json"):
        if not (folder / name).is_file():
            return f"no {name}"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no model.safetensors"
    parsed = {}
    for file in sorted(folder.glob("*.json")):
        try:
            parsed[file.name] = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            return f"{file.name}: {err}"
    index = parsed.get("model.safetensors.index.json")  # sharded weights: every shard it names is there
    shards = index.get("weight_map", {}).values() if isinstance(index, dict) else ()
    missing = sorted({str(shard) for shard in shards if not (folder / str(shard)).is_file()})
    if missing:
        return f"no {missing[0]}"
    for file in weights:
        try:
            with safe_open(str(file), "pt"):
                pass
        except Exception as err:  # safetensors' own error type, whatever the header's fault
            return f"{file.name}: {err}"
    return None


# The conversions found whole in this process, with the sizes and times of their files when they were: a
# pair loads its target's folder several times (tokenizer, model, each dtype measured).
_whole: dict[Path, tuple] = {}


def _files_state(folder: Path) -> tuple:
    return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir()))


def _converted_gguf_dir(gguf_path: Path) -> Path:
    """Dequantising a GGUF takes seconds: do it once and keep a safetensors copy in the user cache. A copy
    found damaged (`conversion_damage`) is removed and made again, with one line saying so."""
    out = cache_dir() / f"{gguf_path.stem}-{gguf_key(gguf_path)}-v{CONVERSION}"
    if out.exists():
        state = _files_state(out)
        if _whole.get(out) == state:
            return out
        damage = conversion_damage(out)
        if damage is None:
            _whole[out] = state
            return out
        discard_damaged(out, f"conversion of {gguf_path.name}", damage, "converting it again")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    # The weights are already dequantised; rebuild a plain model so that save_pretrained accepts it.
    config = gguf_model.config
    special_tokens_from_config(tokenizer, config)
    del config.quantization_config
    config._name_or_path = gguf_path.stem
    with torch.device("meta"):  # no random init of weights that are overwritten at once
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), assign=True)
    model.tie_weights()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:  # a full disk: no half-written copy left behind to fill it further
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(out)
    return out
