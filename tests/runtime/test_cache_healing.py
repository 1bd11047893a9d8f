"""A damaged cache heals: each cached artefact (a GGUF's conversion, its 4-bit operands, the AMX kernel, a
compiled package, the dtype choices) that is cut short or overwritten is found so when it is loaded, removed
and made again, with one line saying so (common/files.discard_damaged)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import Q4_NAMES, WORDS, tiny_config, tiny_eagle3, tiny_model, tiny_q4_model, tiny_tokenizer

from diversed_demo.models.gguf_cache import _converted_gguf_dir, conversion_damage
from diversed_demo.models.loading import load_target
from diversed_demo.models.pair import ModelPair
from diversed_demo.runtime import amx_gguf, compiled_build, gguf_int4
from diversed_demo.runtime.amx_gguf import AmxKernel
from diversed_demo.runtime.attention import use_grouped_attention
from diversed_demo.runtime.compiled_pass import attach, package_path
from diversed_demo.runtime.gguf_int4 import int4_operands, use_gguf_int4
from diversed_demo.runtime.lean_layer import use_lean_layers


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def damage_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "was damaged" in line]


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut a file short, as a full disk or an interrupted copy leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


GGUF_NAMES = {**Q4_NAMES, "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def tiny_gguf(path: Path, seed: int = 0):
    """A tiny Llama written as a whole GGUF that transformers converts (metadata, a sentencepiece-style
    vocabulary of the tiny words, float32 tensors in llama.cpp's layout); returns the model it holds."""
    import gguf
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(2, hidden=64)
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "<pad>"] + ["▁" + word for word in WORDS])
    writer.add_token_scores([0.0] * 4 + [-float(i) for i in range(len(WORDS))])
    writer.add_token_types([2, 3, 3, 3] + [1] * len(WORDS))  # unknown, control, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(3)
    weights = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    for i in range(config.num_hidden_layers):
        for name, gguf_name in GGUF_NAMES.items():
            weight = weights[f"model.layers.{i}.{name}.weight"]
            heads = {"attn_q": 4, "attn_k": 2}.get(gguf_name)
            if heads:  # llama.cpp's rotary permutation, which transformers undoes
                weight = weight.reshape(heads, 2, -1, weight.shape[1]).swapaxes(1, 2).reshape(weight.shape)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 6, 7, 8]])).logits


DAMAGES = {
    "weights cut short": lambda folder: truncate(folder / "model.safetensors"),
    "weights emptied": lambda folder: (folder / "model.safetensors").write_bytes(b""),
    "config cut short": lambda folder: truncate(folder / "config.json"),
    "tokenizer overwritten": lambda folder: (folder / "tokenizer.json").write_bytes(b"\0" * 64),
    "config lost": lambda folder: (folder / "config.json").unlink(),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_conversion_is_converted_again(tmp_path, capsys, damage):
    gguf_path = tmp_path / "tiny.gguf"
    original = tiny_gguf(gguf_path)
    folder = _converted_gguf_dir(gguf_path)
    DAMAGES[damage](folder)
    capsys.readouterr()
    assert _converted_gguf_dir(gguf_path) == folder
    lines = damage_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "conversion of tiny.gguf" in lines[0] and str(folder) in lines[0]
    assert lines[0].endswith("converting it again")
    assert conversion_damage(folder) is None
    assert not list(folder.parent.glob("*.damaged*")) and not list(folder.parent.glob("*.tmp*"))
    target = load_target(str(gguf_path), torch.device("cpu"), torch.float32)
    torch.testing.assert_close(logits(target), logits(original))
    _converted_gguf_dir(gguf_path)  # whole now: found so, without a word
    assert not damage_lines(capsys.readouterr().err)


def test_a_whole_conversion_is_found_whole(tmp_path):
    gguf_path = tmp_path / "tiny.gguf"
    tiny_gguf(gguf_path)
    folder = _converted_gguf_dir(gguf_path)
    assert conversion_damage(folder) is None
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert _converted_gguf_dir(gguf_path) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again


def tiny_int4_model(tmp_path):
    path = tmp_path / "tiny-q4.gguf"
    model = tiny_q4_model(path).to(torch.bfloat16)
    use_grouped_attention(model)
    return model, path


def overwrite_with_other_tensors(path: Path) -> None:
    """A whole safetensors file, but not of operands: another file copied over it."""
    from safetensors.torch import save_file

    save_file({"model.layers.0.mlp.up_proj.0": torch.zeros(2), "lm_head.x": torch.zeros(1)}, str(path))


INT4_DAMAGES = {
    "cut short": truncate,
    "emptied": lambda path: path.write_bytes(b""),
    "another file's tensors": overwrite_with_other_tensors,
}


@pytest.mark.parametrize("damage", INT4_DAMAGES)
def test_damaged_4bit_operands_are_packed_again(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setattr(gguf_int4, "int4_kernel", lambda dtype, amx: "aten")  # the CPU's kernel, AMX or not
    model, path = tiny_int4_model(tmp_path)
    first = int4_operands(path, model, AmxKernel())
    (cached,) = (tmp_path / "cache").glob("*-int4-*.safetensors")
    INT4_DAMAGES[damage](cached)
    capsys.readouterr()
    again = int4_operands(path, model, AmxKernel())
    lines = damage_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "4-bit operands of tiny-q4.gguf" in lines[0] and str(cached) in lines[0]
    assert lines[0].endswith("packing them again")
    assert again.keys() == first.keys()
    assert all(torch.equal(a, b) for name in first for a, b in zip(first[name], again[name], strict=True))
    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: True)
    fresh, _ = tiny_int4_model(tmp_path)
    assert use_gguf_int4(fresh, path, AmxKernel()) == 14  # the rebuilt file serves the next load
    assert not damage_lines(capsys.readouterr().err)


@pytest.fixture
def amx_machine(monkeypatch, tmp_path):
    """A CPU with AMX as far as the decision can tell, whose kernel `build` compiles a stand-in library
    (the real one runs only on AMX): (the builds made, the libraries loaded)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the stand-in library")
    source = tmp_path / "stand_in.c"
    source.write_text("int diversed_stand_in = 1;\n")
    builds, libraries = [], []

    def build(path, background=False):
        builds.append(background)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)

    real_load = torch.ops.load_library

    def load_library(path):  # the real loader: a damaged library fails in it as it would
        real_load(path)
        libraries.append(path)

    monkeypatch.setattr(amx_gguf, "cpu_flags", lambda: amx_gguf.CPU_FLAGS)
    monkeypatch.setattr(amx_gguf, "build", build)
    monkeypatch.setattr(torch.ops, "load_library", load_library)
    monkeypatch.setattr(amx_gguf, "loaded", lambda: bool(libraries))  # a loaded library registers amx_mm
    monkeypatch.setattr(amx_gguf, "register_fake", lambda: None)
    monkeypatch.setattr(amx_gguf, "computes_right", lambda: True)
    monkeypatch.setattr(sys, "platform", "linux")
    return builds, libraries


@pytest.mark.parametrize("wait", [True, False])
def test_a_damaged_amx_kernel_is_compiled_again(amx_machine, capsys, wait):
    builds, libraries = amx_machine
    path = amx_gguf.library_path()
    amx_gguf.build(path)  # as an earlier start built it
    truncate(path)
    builds.clear()
    capsys.readouterr()
    if wait:
        assert amx_gguf.AmxKernel().available(wait=True)
        assert builds == [False]
    else:  # a start goes on without it, and builds it in the background
        kernel = amx_gguf.AmxKernel()
        assert not kernel.available() and kernel.pending and not path.exists()
        assert kernel.upgrade() and builds == [True]
    lines = damage_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "AMX kernel" in lines[0] and str(path) in lines[0]
    assert lines[0].endswith("compiling it again")
    assert libraries == [str(path)] and path.exists()


@pytest.fixture
def lean_pair(tmp_path, monkeypatch):
    """The tiny 4-bit target, lean as a pair runs it (compilable), with a standalone draft."""
    monkeypatch.setattr(gguf_int4, "int4_pays", lambda dtype: True)
    model, path = tiny_int4_model(tmp_path)
    use_gguf_int4(model, path, AmxKernel())
    use_lean_layers(model)
    return ModelPair(
        model, tiny_model(1, 1), tiny_tokenizer(), "tiny.gguf", "tiny-draft", torch.device("cpu")
    )


def test_a_damaged_compiled_package_is_built_again_at_the_next_start(lean_pair, monkeypatch):
    """The pass stays eager at the start that finds its package damaged; the next start builds it anew."""
    builds = []

    class Build:
        pid = -1  # no process

        def wait(self):
            return 0

    monkeypatch.setattr(
        compiled_build, "start_build", lambda pair, paths, log: builds.append(paths) or Build()
    )
    path = package_path(lean_pair.target, [])
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)  # the start of a zip, cut short
    lines = []
    compiled_build.attach_or_build(lean_pair, wait=True, log=lines.append)
    assert lean_pair.target_pass is None and not builds and not path.exists()
    assert len(lines) == 1 and "compiled pass" in lines[0] and str(path) in lines[0]
    assert damage_lines(lines[0]) and lines[0].endswith("built again at the next start")
    compiled_build.attach_or_build(lean_pair, wait=True, log=lines.append)  # the next start
    assert builds == [[path]]


@pytest.mark.slow
def test_a_real_compiled_package_cut_short_is_removed(lean_pair):
    from diversed_demo.runtime.compiled_pass import build_package

    path = build_package(lean_pair.target, [], package_path(lean_pair.target, []))
    truncate(path)
    lines = []
    assert attach(lean_pair.target, [], path, log=lines.append) is None
    assert len(damage_lines("\n".join(lines))) == 1 and not path.exists()


def test_damaged_dtype_choices_are_measured_again(tmp_path, monkeypatch, capsys):
    """A cut-short dtype-choices.json is removed with one line: the dtype is measured again and the file
    rewritten whole."""
    from tiny import save_tiny_pair

    from diversed_demo.runtime import dtype_choice
    from diversed_demo.runtime.plan import load_pair

    def costs(pair, prompt_ids, n_drafts, **kwargs):  # bf16 twice as fast: no timing in a test
        fast = pair.target.dtype == torch.bfloat16
        costs = {"c": 0.1, "r": 0.05, "v": {n: 1.0 + 0.05 * n for n in n_drafts}}
        return {"target_ms": 10.0 if fast else 20.0, **costs}

    target, draft = save_tiny_pair(tmp_path / "pair")
    choices = tmp_path / "cache" / "dtype-choices.json"
    monkeypatch.delenv(dtype_choice.CHOICES_ENV, raising=False)  # the user cache's file
    monkeypatch.setattr(dtype_choice, "measure_costs", costs)
    load_pair(target, draft, "cpu")
    truncate(choices)
    capsys.readouterr()
    pair = load_pair(target, draft, "cpu")
    assert pair.dtype_choice["dtype"] == "bfloat16" and not pair.dtype_choice.get("cached")
    damaged = [line for line in capsys.readouterr().err.splitlines() if "was damaged" in line]
    assert len(damaged) == 1 and "dtype choices" in damaged[0]
    assert len(json.loads(choices.read_text())) == 1
    again = load_pair(target, draft, "cpu")
    assert again.dtype_choice.get("cached")


def test_generate_on_a_gguf_whose_conversion_was_cut_short(tmp_path, capsys):
    """The issue's case: `diversed-demo generate` on a .gguf target whose cached conversion a full disk cut
    short converts it again, says so in one line and decodes."""
    from diversed_demo import cli

    gguf_path = tmp_path / "tiny.gguf"
    model = tiny_gguf(gguf_path)
    draft_dir = tmp_path / "draft"
    tiny_eagle3(model, aux_layer_ids=(0, 1, 2)).save(draft_dir, torch.float32)
    folder = _converted_gguf_dir(gguf_path)
    truncate(folder / "model.safetensors")
    args = ["generate", "--prompt", "the cat", "--no-chat", "--max-new-tokens", "8", "--seed", "0"]
    args += ["--target", str(gguf_path), "--draft", str(draft_dir), "--device", "cpu", "--dtype", "float32"]
    capsys.readouterr()
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "new tokens" in out
    lines = damage_lines(err)
    assert len(lines) == 1 and "conversion of tiny.gguf" in lines[0] and "model.safetensors" in lines[0]
    assert conversion_damage(folder) is None
