"""Head files: the shipped and the user's heads, their safetensors format and metadata, and the pair each is
bound to. Loading never unpickles, and refuses a head of another pair with a clear message."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..common.files import atomic_write, cache_dir
from ..common.paths import HEADS_DIR
from ..core.head import CostHead, EnsembleHead
from .pair import text_config

HEAD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
FORMAT = "diversed-head/1"


class HeadError(ValueError):
    """A head file that is missing, malformed or belongs to another pair."""


def model_fingerprint(model) -> str:
    """A cheap identity of a model's weights that survives a change of dtype or device (a head trained
    in fp32 on a CPU serves the same models in bf16 on a GPU): the architecture, every tensor's name and
    shape, and the signs of its first values."""
    config = text_config(model)
    h = hashlib.sha256(
        json.dumps(
            [config.model_type, config.hidden_size, config.num_hidden_layers, config.vocab_size]
        ).encode()
    )
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}{tuple(tensor.shape)}".encode())
        h.update((tensor.detach().flatten()[:1024] > 0).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def pair_identity(pair) -> dict:
    """What a head is bound to. Cached on the pair: fingerprinting reads every tensor once."""
    if getattr(pair, "_identity", None) is None:
        pair._identity = {
            "target": pair.target_name,
            "draft": pair.draft_name,
            "target_fingerprint": model_fingerprint(pair.target),
            "draft_fingerprint": model_fingerprint(pair.draft),
            "target_hidden": text_config(pair.target).hidden_size,
            "draft_hidden": text_config(pair.draft).hidden_size,
            "vocab_size": pair.vocab_size,
            "tokenizer_fingerprint": pair.fingerprint,
        }
    return pair._identity


def trained_for_greedy(training) -> bool:
    """Whether a head's training record (its metadata's or its card's "training") is of greedy decoding."""
    return isinstance(training, dict) and training.get("temperature") == 0


def greedy_twin(name: str) -> str:
    """The name of a head's twin trained for greedy decoding (`<name>-greedy`)."""
    return f"{name}-greedy"


def sampled_twin(name: str) -> str:
    """The name of a greedy head's twin trained for sampling."""
    return name.removesuffix("-greedy")


HEAD_KINDS = {"ensemble": EnsembleHead, "cost": CostHead}  # a file's config names its kind; none: ensemble


def new_head(pair, kind: str = "ensemble", **kwargs) -> EnsembleHead | CostHead:
    """A fresh head of `kind` for this pair (kwargs: its constructor's; a CostHead takes hidden_size only)."""
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}: choose from {', '.join(HEAD_KINDS)}")
    if kind == "cost":
        kwargs = {k: v for k, v in kwargs.items() if k == "hidden_size"}
    identity = pair_identity(pair)
    head = HEAD_KINDS[kind](identity["target_hidden"], identity["draft_hidden"], **kwargs)
    head.meta["pair"] = identity
    return head.to(pair.target.device)


def save_head(head: EnsembleHead | CostHead, path) -> Path:
    """Write weights and metadata atomically (a crash never leaves a half-written head)."""
    from safetensors.torch import save_file

    path = Path(path)
    metadata = {"format": FORMAT, "config": json.dumps(head.config), "meta": json.dumps(head.meta)}
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))
    return path


def read_head_metadata(path) -> dict:
    """The head's config and meta without loading weights (cheap: for listings)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as err:  # safetensors raises several types for a malformed file
        raise HeadError(f"{path} is not a head file (safetensors): {err}") from None
    if metadata.get("format") != FORMAT:
        raise HeadError(
            f"{path} is not a DIVERSED head (format {metadata.get('format')!r}, expected {FORMAT!r})"
        )
    return {"config": json.loads(metadata["config"]), "meta": json.loads(metadata["meta"])}


def head_kind(path) -> str:
    """A head file's kind ("ensemble" or "cost") from its metadata, without loading its weights."""
    return read_head_metadata(path)["config"].get("kind", "ensemble")


def check_head_pair(head_pair: dict, identity: dict, where: str) -> None:
    for key, label in (
        ("tokenizer_fingerprint", "tokenizer"),
        ("vocab_size", "vocabulary size"),
        ("target_hidden", "target hidden size"),
        ("draft_hidden", "draft hidden size"),
        ("target_fingerprint", "target model"),
        ("draft_fingerprint", "draft model"),
    ):
        if head_pair.get(key) != identity[key]:
            raise HeadError(
                f"{where} belongs to another pair ({head_pair.get('target')} + {head_pair.get('draft')}): "
                f"its {label} differs from this pair's ({identity['target']} + {identity['draft']})"
            )


def user_heads_dir() -> Path:
    return Path(os.environ.get("DIVERSED_HEADS_DIR") or cache_dir() / "heads")


def is_head_name(name) -> bool:
    """A head's name: letters, digits, '_', '-' and '.', never a path."""
    return isinstance(name, str) and bool(HEAD_NAME.fullmatch(name)) and name not in (".", "..")


def resolve_head_path(path_or_name) -> Path:
    """A path, or a name looked up in the user heads folder, then the shipped heads/."""
    path = Path(path_or_name).expanduser()
    if path.exists():
        return path
    if not is_head_name(str(path_or_name)):
        raise HeadError(f"no head {path_or_name!r}: not a file, nor a head name (letters, digits, _ - .)")
    for folder in (user_heads_dir(), HEADS_DIR):
        candidate = folder / f"{path_or_name}.safetensors"
        if candidate.exists():
            return candidate
    raise HeadError(f"no head {path_or_name!r}: not a file, nor a name in {user_heads_dir()} or {HEADS_DIR}")


def read_head(path, device="cpu") -> EnsembleHead | CostHead:
    """A head file's module, on `device`, ready to evaluate; its pair is not checked (load_head does)."""
    from safetensors.torch import load_file

    info = read_head_metadata(path)
    config = dict(info["config"])
    kind = config.pop("kind", "ensemble")
    if kind not in HEAD_KINDS:
        raise HeadError(f"{path}: a head of kind {kind!r}, which this version does not know")
    head = HEAD_KINDS[kind](**config, meta=info["meta"])
    try:
        head.load_state_dict(load_file(str(path)))
    except RuntimeError as err:
        raise HeadError(f"{path}: weights do not match its config: {err}") from None
    return head.to(device).eval().requires_grad_(False)


def load_head(path_or_name, pair) -> EnsembleHead | CostHead:
    """A head by path or name, refused (HeadError) unless it was trained for this pair."""
    path = resolve_head_path(path_or_name)
    check_head_pair(read_head_metadata(path)["meta"].get("pair", {}), pair_identity(pair), str(path))
    return read_head(path, pair.target.device)


def list_heads(pair) -> dict[str, Path]:
    """Heads usable with this pair: the user's (newest first), then the shipped ones; others are skipped.
    Every served decode of a head names it through this listing, so the headers are read again only where
    a head file changed (its inode, time or size: a head is written by a rename): reading every header
    took 2.7 ms a decode, the folders' entries take a few µs."""
    identity = pair_identity(pair)
    key = (json.dumps(identity, sort_keys=True), head_files())
    if key not in _LISTED:
        _LISTED.clear()  # one listing: the newest pair and files asked for
        _LISTED[key] = read_heads(identity)
    return dict(_LISTED[key])


_LISTED: dict[tuple, dict[str, Path]] = {}


def head_files() -> tuple:
    """(path, inode, time, size) of every head file in the user's folder and the shipped one."""
    files = []
    for folder in (user_heads_dir(), HEADS_DIR):
        if folder.is_dir():
            for path in sorted(folder.glob("*.safetensors")):
                stat = path.stat()
                files.append((str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return tuple(files)


def read_heads(identity: dict) -> dict[str, Path]:
    """The listing itself: every head file's header read."""
    found = {}
    user = (
        sorted(user_heads_dir().glob("*.safetensors"), key=lambda p: -p.stat().st_mtime)
        if user_heads_dir().exists()
        else []
    )
    for path in user + sorted(HEADS_DIR.glob("*.safetensors")):
        try:
            check_head_pair(read_head_metadata(path)["meta"].get("pair", {}), identity, str(path))
        except HeadError:
            continue
        found.setdefault(path.stem, path)
    return found
