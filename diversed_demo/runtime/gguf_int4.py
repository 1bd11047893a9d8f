"""A GGUF target's 4-bit weights multiplied as stored, on the CPU: PyTorch's int4 weight-only product.

A Q4_0 or Q4_1 block holds 32 weights w = d·q + m (q in 0..15; Q4_0 has m = −8d). PyTorch's CPU kernel
computes (q − 8)·scale + zero per block of 32, so scale = d and zero = m + 8d give the same weights, with
the scales rounded to the activations' dtype. A one-token pass then streams about 4.5 bits a weight
instead of 16. The products of a few rows (decoding, verification) use it; longer ones (prompts) keep the
dense weight, which the kernel's per-4-row dequantisation would make slower. Where the CPU has AMX, the
project's own kernel (amx_gguf.py) takes PyTorch's place for products of any length: it converts each block
once however many rows there are, so a pass over 16 tokens costs about what one token's does and a prompt
runs faster than on the dense weight; and a Q8_0 LM head (SmolLM2's tied embedding) is multiplied as stored
too, at 8.5 bits a weight instead of 16.

A projection's operands are PyTorch's (packed codes, scales and zeros) or AMX's (records,): `int4_product`
tells them apart by their number.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..common.files import atomic_write, cache_dir, discard_damaged
from ..common.timing import runs_faster
from ..models.gguf_cache import gguf_key
from ..models.gguf_patches import read_gguf
from . import amx_gguf
from .amx_gguf import AmxKernel
from .class_swap import swap_class
from .row_buckets import linear_in_buckets

Q4_BLOCK = 32  # weights per GGUF block, the kernel's group size
# At most this many rows use PyTorch's int4 product, more the dense weight: every verification pass, within
# the rows where int4 is the faster (docs/measurements/speed.md). The project's kernel takes any number.
INT4_ROWS = 8
OPERANDS = 2  # the cached operands' format: 2 adds the AMX kernel's 8-bit LM head
LAYER_NAMES = {  # llama.cpp's tensor names in a block -> transformers' module names in a Llama layer
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def int4_product(rows: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
    """rows [M, K] · (the packed 4-bit weight [N, K])ᵀ -> [M, N], on the kernel its operands are for."""
    if len(operands) == 1:
        return amx_gguf.amx_product(rows, *operands)
    packed, scales_zeros = operands
    return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, Q4_BLOCK, scales_zeros)


def uses_quantised(operands: tuple[torch.Tensor, ...], rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a product of these rows [M, ·] runs on the quantised operands rather than the dense weight,
    which also serves products that need a gradient (the kernels have none) and those longer than PyTorch's
    kernel takes (`INT4_ROWS`; the project's takes any number)."""
    if torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad):
        return False
    return len(operands) == 1 or len(rows) <= INT4_ROWS


def stack_operands(*operands: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The operands of several projections of the same input as one: a product computes them all (their
    row counts must be multiples of the kernels' packing, 64 rows)."""
    if len(operands[0]) == 1:
        return (torch.cat([records for (records,) in operands]),)
    return torch.cat([packed for packed, _ in operands]), torch.cat([scales for _, scales in operands], 1)


class GgufLinear(torch.nn.Linear):
    """nn.Linear whose products use its GGUF's quantised weight (`operands`: a 4-bit kernel's, or the AMX
    records of an 8-bit LM head) where `uses_quantised`; the dense weight stays for longer products on
    PyTorch's kernel, for gradients and for stock comparisons."""

    operands: tuple[torch.Tensor, ...]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features)
        if not uses_quantised(self.operands, rows, self.weight) or input.dtype != self.weight.dtype:
            return linear_in_buckets(input, self.weight, self.bias)
        out = int4_product(rows, *self.operands)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*input.shape[:-1], self.out_features)


def q4_codes(tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_0/Q4_1 tensor's (codes [N, K] int32 in 0..15, d [N, K/32], m [N, K/32]) in float32.

    Block layout (ggml): d (fp16), m (fp16, Q4_1 only), 16 bytes whose low nibbles are weights 0..15 and
    high nibbles 16..31."""
    raw = torch.from_numpy(tensor.data.copy())
    n_rows = raw.shape[0]
    with_min = tensor.tensor_type.name == "Q4_1"
    blocks = raw.view(n_rows, -1, 20 if with_min else 18)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1) if with_min else -8 * d
    nibbles = blocks[..., 4:] if with_min else blocks[..., 2:]
    codes = torch.cat([nibbles & 15, nibbles >> 4], -1).reshape(n_rows, -1).int()
    return codes, d, m


def unpermute_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary permutation of a q/k weight (transformers undoes it the
    same way when it loads a GGUF)."""
    return torch.arange(n_rows).view(n_heads, n_rows // n_heads // 2, 2).transpose(1, 2).reshape(-1)


def read_q4_layers(gguf_path: Path, config) -> dict[str, tuple]:
    """{transformers module name: (codes, d, m)} for every Q4_0/Q4_1 projection of a Llama GGUF's layers, in
    transformers' row order."""

    layers = {}
    for tensor in read_gguf(str(gguf_path)).tensors:
        parts = tensor.name.split(".")  # blk.<i>.<name>.weight
        q4 = tensor.tensor_type.name in ("Q4_0", "Q4_1")
        if not q4 or parts[0] != "blk" or parts[2] not in LAYER_NAMES:
            continue
        codes, d, m = q4_codes(tensor)
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(parts[2])
        if heads:
            order = unpermute_rows(len(codes), heads)
            codes, d, m = codes[order], d[order], m[order]
        layers[f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"] = (codes, d, m)
    return layers


def read_q8_head(gguf_path: Path, config) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes [V, H] int8, d [V, H/32]) of the GGUF's output matrix where it is stored as Q8_0 blocks (d in
    fp16, then 32 signed codes): `output.weight`, or the token embedding for a model that ties them."""

    tensors = {tensor.name: tensor for tensor in read_gguf(str(gguf_path)).tensors}
    tied = getattr(config, "tie_word_embeddings", False)
    tensor = tensors.get("output.weight") or (tensors.get("token_embd.weight") if tied else None)
    if tensor is None or tensor.tensor_type.name != "Q8_0":
        return None
    raw = torch.from_numpy(tensor.data.copy())
    blocks = raw.view(raw.shape[0], -1, 34)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)
    return blocks[..., 2:].contiguous().view(torch.int8).reshape(raw.shape[0], -1), d


def dequantised(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The float32 weights a Q4 block stores, computed as gguf-py's dequantisation computes them."""
    n_rows = len(codes)
    return (codes.view(n_rows, -1, Q4_BLOCK).float() * d[..., None] + m[..., None]).view(n_rows, -1)


def pack(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> tuple:
    """The kernel's operands: packed codes [N, K/2] uint8 and scales/zeros [K/32, N, 2] in `dtype`."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    scales_zeros = torch.stack([d, m + 8 * d], -1).transpose(0, 1).contiguous().to(dtype)
    return packed, scales_zeros


def int4_kernel(dtype: torch.dtype, amx: AmxKernel) -> str:
    """Which kernel the products take: "amx" where the pair's AMX kernel serves activations of `dtype` and
    is the faster here (timed once per pair; DIVERSED_AMX=1 takes it untimed, as the compiled pass's build
    does to follow its app), else "aten"."""
    if dtype != torch.bfloat16 or not amx.available():
        return "aten"
    if os.environ.get(amx_gguf.SWITCH) == "1":
        return "amx"
    if amx.faster is None:
        amx.faster = amx_pays()
    return "amx" if amx.faster else "aten"


def int4_operands(gguf_path: Path, model: torch.nn.Module, amx: AmxKernel) -> dict[str, tuple] | None:
    """{module name: the kernel's operands} for the model's projections stored as Q4 blocks in its GGUF (and,
    on the AMX kernel, its Q8_0 LM head), or None where the GGUF's blocks do not give exactly the model's
    weights. Built once (seconds) and kept in
    the user cache; the packing depends on the kernel, the CPU's vector width and PyTorch, so all are in
    the key. A cached file that does not load whole is packed again, with one line saying so."""
    dtype = next(model.parameters()).dtype
    projections = [m for n, m in model.named_modules() if n.endswith(tuple(LAYER_NAMES.values()))]
    fits_amx = all(p.out_features % 32 == 0 for p in projections)  # its records hold 32 rows
    kernel = int4_kernel(dtype, amx) if fits_amx else "aten"
    records = amx_gguf.records_layout() if kernel == "amx" else ""  # their layout is the kernel's
    tag = (
        f"{torch.__version__}:{torch.backends.cpu.get_cpu_capability()}:{dtype}:{kernel}{records}:{OPERANDS}"
    )
    key = f"{gguf_key(gguf_path)}-int4-{hashlib.sha256(tag.encode()).hexdigest()[:8]}"
    path = cache_dir() / f"{gguf_path.stem}-{key}.safetensors"
    if path.exists():
        try:
            return cached_operands(path, model)
        except (OSError, ValueError, SafetensorError) as err:
            discard_damaged(path, f"4-bit operands of {gguf_path.name}", err, "packing them again")
    layers = read_q4_layers(gguf_path, model.config.get_text_config())
    weights = {name: model.get_submodule(name).weight for name in layers}
    if not layers or any(not torch.equal(dequantised(*layers[n]).to(dtype), w) for n, w in weights.items()):
        return None
    if kernel == "amx":
        operands = {name: (amx_gguf.pack_q4(*blocks),) for name, blocks in layers.items()}
        operands |= q8_head_operands(gguf_path, model)
    else:
        operands = {name: pack(*blocks, dtype) for name, blocks in layers.items()}
    flat = {f"{name}.{j}": t for name, tensors in operands.items() for j, t in enumerate(tensors)}
    atomic_write(path, lambda tmp: save_file(flat, str(tmp)))
    return operands


def cached_operands(path: Path, model: torch.nn.Module) -> dict[str, tuple]:
    """{module name: operands} from their cached file ({"<name>.<j>": tensor}), or ValueError where it does
    not hold whole operands of the model's modules (safetensors' own error where it does not load)."""
    flat = load_file(str(path))
    names = {name.rsplit(".", 1)[0] for name in flat}
    count = len(flat) // max(len(names), 1)
    modules = dict(model.named_modules())
    whole = {f"{name}.{j}" for name in names for j in range(count)} == flat.keys() and count in (1, 2)
    if not whole or not names <= modules.keys():
        raise ValueError(f"{len(flat)} tensors that are not whole operands of the model's projections")
    return {name: tuple(flat[f"{name}.{j}"] for j in range(count)) for name in names}


def q8_head_operands(gguf_path: Path, model: torch.nn.Module) -> dict[str, tuple]:
    """{the LM head's module name: its AMX records} where the GGUF stores it as Q8_0 blocks that give exactly
    the model's head: half the bytes of the dense bf16 head, streamed once per decoding pass."""
    head = model.get_output_embeddings()
    blocks = read_q8_head(gguf_path, model.config.get_text_config())
    if blocks is None or head.out_features % 32 or getattr(head, "bias", None) is not None:
        return {}
    codes, d = blocks
    if not torch.equal(dequantised(codes, d, 0 * d).to(head.weight.dtype), head.weight):
        return {}
    name = next(name for name, module in model.named_modules() if module is head)
    return {name: (amx_gguf.pack_q8(codes, d),)}


def use_gguf_int4(model: torch.nn.Module, gguf_path: Path, amx: AmxKernel) -> int:
    """Switch the model's projections stored as Q4 blocks in its GGUF (and, on the AMX kernel, its Q8_0 LM
    head) to GgufLinear, where the model runs in bf16 or fp16 on the CPU and the int4 product is the faster
    here (`int4_pays`); returns how many were switched."""
    return switch_to_operands(model, quantised_operands(model, gguf_path, amx))


def quantised_operands(model: torch.nn.Module, gguf_path: Path, amx: AmxKernel) -> dict[str, tuple]:
    """{module name: operands} for `use_gguf_int4`, on the kernel that serves now, built without touching
    the model; empty where its products stay dense."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return {}
    if getattr(model.config, "model_type", None) != "llama" or not int4_pays(weight.dtype):
        return {}
    return int4_operands(gguf_path, model, amx) or {}


def switch_to_operands(model: torch.nn.Module, operands: dict[str, tuple]) -> int:
    for name, ops in operands.items():
        swap_class(model.get_submodule(name), GgufLinear, operands=ops)
    return len(operands)


@functools.cache
def int4_pays(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the int4 product beats the dense one on this machine at 1 and 4 rows, timed once per process
    (a fraction of a second) through a weight larger than the CPU's caches (32768×576: the dense one streams
    from memory, as a pass's weights do): it depends on the CPU."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (32768, 576), dtype=torch.uint8, generator=generator).int()
    scales = torch.rand(32768, 576 // Q4_BLOCK, generator=generator) / 100
    dense = dequantised(codes, scales, -8 * scales).to(dtype)
    packed = pack(codes, scales, -8 * scales, dtype)

    def faster(rows):
        hidden = torch.randn(rows, 576, generator=generator).to(dtype)
        linear = torch.nn.functional.linear
        return runs_faster(lambda: int4_product(hidden, *packed), lambda: linear(hidden, dense), 6, 2)

    return faster(1) and faster(4)


def amx_pays() -> bool:
    """Whether the AMX kernel beats PyTorch's int4 one on a 3-row product (a verification pass at N = 2)
    through a weight larger than the CPU's caches (a fraction of a second)."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8192, 1536), dtype=torch.uint8, generator=generator).int()
    scales = (torch.rand(8192, 1536 // Q4_BLOCK, generator=generator) / 100).half().float()
    records = amx_gguf.pack_q4(codes, scales, -8 * scales)
    packed = pack(codes, scales, -8 * scales, torch.bfloat16)
    hidden = torch.randn(3, 1536, generator=generator).bfloat16()
    return runs_faster(lambda: int4_product(hidden, records), lambda: int4_product(hidden, *packed), 6, 2)
