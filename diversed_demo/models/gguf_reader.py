"""gguf's GGUF reader with its arrays read in one pass: the same fields, several times faster.

A GGUF's vocabulary is arrays of about 49k entries (tokens, merges, token types). gguf's reader builds each
entry from several numpy calls on its memory map, and a first start reads the file twice (converting it,
and packing its 4-bit blocks); here each string's length is read from the raw bytes and each entry is a
view of a plain array (docs/measurements/speed.md, "Reading the GGUF").
"""

from __future__ import annotations

import functools

import gguf
import numpy as np

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
def read_gguf(path: str) -> GGUFReader:
    """The file's reader, once per process and path (it is read-only)."""
    return GGUFReader(path)
