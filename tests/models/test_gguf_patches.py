"""The patches of gguf and transformers (models/gguf_patches.py): they cover the installed code, the reader
reads every field as gguf's own does, and a conversion parses the file once."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from diversed_demo.models import gguf_patches
from diversed_demo.models.gguf_patches import GGUFReader, read_once


def test_each_patch_covers_the_installed_librarys_code():
    """Fails when gguf or transformers changes the code a patch replaces: check the patch against the new
    code, then renew its digest in COVERED (or drop the patch)."""
    for name, function in gguf_patches.patched_code().items():
        assert gguf_patches.source_digest(function) == gguf_patches.COVERED[name], f"{name} changed"


def test_code_a_patch_does_not_cover_runs_unpatched(monkeypatch, tmp_path):
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    gguf_patches.covered.cache_clear()
    monkeypatch.setitem(gguf_patches.COVERED, gguf_patches.READER, "another version")
    monkeypatch.setitem(gguf_patches.COVERED, gguf_patches.LOADER, "another version")
    try:
        path = tmp_path / "empty.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert type(gguf_patches.read_gguf.__wrapped__(str(path))) is gguf.GGUFReader
        before = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint
        with read_once():
            assert (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint) == before
    finally:
        gguf_patches.covered.cache_clear()


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


def test_a_gguf_is_parsed_once_per_conversion(tmp_path):
    """transformers opens the GGUF three times during a conversion: inside it they share one reader and one
    tensor-name map, and outside it gguf is left as it was."""
    from gguf import GGUFWriter

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint, gguf.dequantize
    with read_once():
        assert gguf.dequantize is gguf_patches.dequantize
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(str(path))
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2
        )
        assert gguf_utils.load_gguf_checkpoint is not originals[2]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint, gguf.dequantize) == (
        originals
    )
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))


def assert_dequantised_as_gguf_does(data: np.ndarray, qtype) -> None:
    ours, theirs = gguf_patches.dequantize(data, qtype), gguf.quants.dequantize(data, qtype)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))  # bit for bit


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_0", "F16"])
def test_blocks_dequantise_bit_for_bit_as_ggufs_numpy_code(qtype):
    """Q4_1 and Q8_0 in torch, the rest by gguf's own: each the same bits as gguf's, on rows of every kind of
    value (subnormal scales, zeros, large weights)."""
    qtype = gguf.GGMLQuantizationType[qtype]
    rows = np.random.default_rng(0).standard_normal((6, 256)).astype(np.float32)
    rows[1] *= 1e-6
    rows[2] = 0.0
    rows[3] *= 1e4
    assert_dequantised_as_gguf_does(gguf.quants.quantize(rows, qtype), qtype)


@pytest.mark.embedded
def test_the_embedded_ggufs_tensors_dequantise_as_ggufs_code_does():
    from diversed_demo.models.embedded import embedded_gguf_path

    for tensor in gguf.GGUFReader(embedded_gguf_path()).tensors:
        assert_dequantised_as_gguf_does(tensor.data, tensor.tensor_type)
