"""The project's GGUF reader (models/gguf_reader.py) reads every field as gguf's own reader does."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from diversed_demo.models.gguf_reader import GGUFReader


def assert_same_fields(path) -> None:
    theirs, ours = gguf.GGUFReader(str(path)), GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.data, mine.types) == (field.offset, field.data, field.types), name
        assert [(p.dtype, p.shape) for p in mine.parts] == [(p.dtype, p.shape) for p in field.parts], name
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts)), name
        assert mine.contents() == field.contents(), name
    assert [(t.name, t.n_bytes) for t in ours.tensors] == [(t.name, t.n_bytes) for t in theirs.tensors]


def test_every_kind_of_field_reads_as_ggufs_reader_reads_it(tmp_path):
    path = tmp_path / "fields.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny ü")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "", "héllo", "▁the", "日本"] * 40)
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3, 1, 1] * 40)
    writer.add_array("some.floats", [0.5, -1.25, 3.0])
    writer.add_array("some.empty", [])
    writer.add_array("some.nested", [[1, 2], [3]])  # arrays of arrays take gguf's own path
    writer.add_tensor("blk.0.attn_q.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_fields(path)


@pytest.mark.embedded
def test_the_embedded_gguf_reads_as_ggufs_reader_reads_it():
    from diversed_demo.models.embedded import embedded_gguf_path

    assert_same_fields(embedded_gguf_path())
