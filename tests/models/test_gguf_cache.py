"""A GGUF's conversion parses the file once (models/gguf_cache.py)."""

from __future__ import annotations


def test_a_gguf_is_parsed_once_per_conversion(tmp_path):
    """transformers opens the GGUF three times during a conversion: inside it they share one reader and one
    tensor-name map, and outside it gguf is left as it was."""
    import gguf
    from gguf import GGUFWriter

    from diversed_demo.models.gguf_cache import _gguf_read_once

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
    with _gguf_read_once():
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(str(path))
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2
        )
        assert gguf_utils.load_gguf_checkpoint is not originals[2]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint) == originals
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))
