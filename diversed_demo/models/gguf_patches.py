"""The project's two patches of others' internals, both for a first start's speed, held here alone.

1. gguf's GGUF reader with its arrays read in one pass: the same fields, several times faster. A GGUF's
   vocabulary is arrays of about 49k entries (tokens, merges, token types); gguf's reader builds each entry
   from several numpy calls on its memory map, and a first start reads the file twice (converting it, and
   packing its 4-bit blocks). Here each string's length is read from the raw bytes and each entry is a view
   of a plain array (docs/measurements/speed.md, "Reading the GGUF"). It overrides the private
   `GGUFReader._get_field_parts`.
2. One parse per conversion (`read_once`): transformers parses a GGUF's metadata three times (tokenizer,
   config, weights) and rebuilds gguf's tensor-name map for each of ~400 submodules, through module
   attributes it looks up at call time; within a conversion they are replaced by memoised ones, and gguf's
   numpy dequantisation of the 4- and 8-bit blocks (row groups in Python) by the same arithmetic in whole
   torch tensors (`dequantize`: bitwise equal, several times faster).

Neither library offers a public way to do either. Each patch applies only where the library's patched code
is the code it was written against (`COVERED`: the digest of its source); elsewhere gguf's and transformers'
own code runs, slower and the same. tests/models/test_gguf_patches.py fails when an installed version's
code differs, so that the patch is checked and its digest renewed, or the patch dropped.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import inspect

import gguf
import numpy as np
import torch

# The patched code, by the sha256 of its source (first 16 hex digits), as gguf 0.19.0 and transformers
# 5.24.0 have it.
READER, LOADER = (
    "gguf.GGUFReader._get_field_parts",
    "transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint",
)
COVERED = {READER: "e1ad1891eeb370f5", LOADER: "5db5a3fc71ae7450"}


def patched_code() -> dict:
    """{name: the installed function} for each name in COVERED."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # gguf's own reader class, whatever `read_once` has put in gguf's namespace for now
    return {READER: GGUFReader.__base__._get_field_parts, LOADER: gguf_utils.load_gguf_checkpoint}


def source_digest(function) -> str:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):  # no source shipped: nothing to compare, so nothing patched
        return ""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@functools.cache
def covered(name: str) -> bool:
    """Whether the installed code patched under `name` is the code its patch was written against."""
    return source_digest(patched_code()[name]) == COVERED[name]


UINT32, UINT64 = 4, 8  # bytes of an array's item type and of its length and of each string's length


class GGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader, whose arrays (of strings or of numbers) parse without numpy calls per element on the
    memory map: its fields hold the same parts, as views of a plain array over the same memory."""

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        item_type = gguf.GGUFValueType(int(raw_itype[0]))
        if item_type != gguf.GGUFValueType.STRING and item_type not in self.gguf_scalar_to_np:
            return super()._get_field_parts(orig_offs, raw_type)  # arrays of arrays
        length = self._get(orig_offs + UINT32, np.uint64)
        count, start = int(length[0]), orig_offs + UINT32 + UINT64
        flat = self.data.view(np.ndarray)  # slices of a memmap run Python code each; of an ndarray, not
        if item_type == gguf.GGUFValueType.STRING:
            items, end = string_parts(flat, start, count)
        else:
            dtype = np.dtype(self.gguf_scalar_to_np[item_type])
            end = start + dtype.itemsize * count
            values = flat[start:end].view(dtype)
            items = [values[i : i + 1] for i in range(count)]
        parts = [raw_itype, length, *items]
        step = 2 if item_type == gguf.GGUFValueType.STRING else 1
        data_idxs = list(range(2 + step - 1, len(parts), step))
        types = [gguf.GGUFValueType.ARRAY] + ([item_type] if count else [])
        return end - orig_offs, parts, data_idxs, types


def string_parts(flat: np.ndarray, offs: int, count: int) -> tuple[list[np.ndarray], int]:
    """`count` strings from `offs`, as gguf's _get_str makes each: its length (uint64 [1]) and its bytes
    (uint8 [length]); and the offset after them."""
    raw, parts = memoryview(flat), []
    for _ in range(count):
        size = int.from_bytes(raw[offs : offs + UINT64], "little")
        start = offs + UINT64
        parts += [flat[offs:start].view(np.uint64), flat[start : start + size]]
        offs = start + size
    return parts, offs


@functools.lru_cache(maxsize=2)
def read_gguf(path: str) -> gguf.GGUFReader:
    """The file's reader, once per process and path (it is read-only): the one-pass reader where it covers
    the installed gguf, else gguf's own."""
    return GGUFReader(path) if covered(READER) else GGUFReader.__base__(path)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """gguf's `dequantize` of a tensor's blocks, Q4_1 and Q8_0 (the embedded target's) as whole tensors in
    torch, the same operations in the same order as gguf's numpy code; every other type by gguf's."""
    if qtype not in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0):
        return gguf.quants.dequantize(data, qtype)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = torch.from_numpy(np.array(data).reshape(-1, type_size))  # a copy: the memory map is read-only
    d = blocks[:, :2].contiguous().view(torch.float16).float()
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        x = blocks[:, 2:].contiguous().view(torch.int8).float()
        weights = x * d
    else:  # Q4_1: d, m, then 16 bytes holding the block's first 16 weights low, the next 16 high
        m = blocks[:, 2:4].contiguous().view(torch.float16).float()
        qs = blocks[:, 4:]
        x = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
        weights = (d * x) + m
    shape = (*data.shape[:-1], data.shape[-1] // type_size * block_size)
    return weights.numpy().reshape(shape)


@contextlib.contextmanager
def read_once():
    """Within a conversion, transformers' three parses of the GGUF share one (the metadata handed out as a
    copy), and gguf's tensor-name map is built once per architecture; outside it, both are as they were.
    Where transformers' loader is not the code this was written against, nothing is replaced."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    if not covered(LOADER):
        yield
        return
    reader, name_map, checkpoint = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
    numpy_dequantize = gguf.dequantize
    metadata = functools.lru_cache(maxsize=2)(lambda path: checkpoint(path, return_tensors=False))

    def load_checkpoint(path, return_tensors=False, **kwargs):  # the tokenizer's and the config's reads
        if return_tensors or kwargs:
            return checkpoint(path, return_tensors, **kwargs)
        return copy.deepcopy(metadata(path))

    # transformers imports these from their modules at call time, so replacing the attributes reaches it.
    gguf.GGUFReader = read_gguf
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    gguf_utils.load_gguf_checkpoint = load_checkpoint
    gguf.dequantize = dequantize
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = (
            reader,
            name_map,
            checkpoint,
        )
        gguf.dequantize = numpy_dequantize
