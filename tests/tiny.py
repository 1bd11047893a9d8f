"""Tiny random Llama pairs with a small word-level vocabulary: for tests, the browser test and offline demos.

They share a tokenizer, load through the same `load_pair` as real pairs, and have peaked enough
distributions that target and draft disagree measurably.
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = (
    "the a cat dog sat ran on under mat rug and then it was big small red blue one two three four "
    "five plus is = ? . , : summary answer def return x y if else print"
).split()
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def tiny_config(num_layers: int = 2, hidden: int = 32, vocab_size: int | None = None):
    """A tiny Llama's config over the tiny tokenizer's vocabulary (4 query heads over 2 K/V heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size or len(SPECIALS) + len(WORDS),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )


def tiny_model(
    seed: int, num_layers: int = 2, hidden: int = 32, vocab_size: int | None = None, sharpness: float = 3.0
):
    from transformers import LlamaForCausalLM

    config = tiny_config(num_layers, hidden, vocab_size)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so p and q differ visibly
        model.lm_head.weight.mul_(sharpness / (config.initializer_range * hidden**0.5))
    return model.eval()


def save_tiny_pair(directory, target_seed: int = 0, draft_seed: int = 1) -> tuple[str, str]:
    """Write a tiny target and draft (sharing one tokenizer) under `directory`; return their paths."""
    directory = Path(directory)
    tokenizer = tiny_tokenizer()
    paths = []
    for name, seed, layers in (("target", target_seed, 2), ("draft", draft_seed, 1)):
        path = directory / name
        tiny_model(seed, layers).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]


def tiny_pair(target_seed: int = 0, draft_seed: int = 1, draft=None):
    """An in-memory ModelPair of tiny random models (no disk), run as the runtime runs a loaded pair."""
    from diversed_demo.models.pair import ModelPair
    from diversed_demo.runtime.plan import speed_up

    target = tiny_model(target_seed, 2)
    draft = draft if draft is not None else tiny_model(draft_seed, 1)
    pair = ModelPair(target, draft, tiny_tokenizer(), "tiny-target", "tiny-draft", torch.device("cpu"))
    speed_up(pair)
    return pair


def tiny_eagle3(
    target, seed: int = 1, draft_vocab_size: int = 32, aux_layer_ids=(0, 1, 2), sharpness: float = 3.0
):
    """A tiny random EAGLE-3 feature draft for `target` (a tiny model), on the target's embedding, proposing
    only the `draft_vocab_size` lowest ids (specials included) so the vocabulary subset is exercised."""
    from diversed_demo.models.eagle import Eagle3Draft, new_config

    config = new_config(target.config, aux_layer_ids, draft_vocab_size)
    torch.manual_seed(seed)
    draft = Eagle3Draft(config)
    hidden = target.config.hidden_size
    for module in draft.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=hidden**-0.5)
    draft.set_vocab(
        torch.arange(draft_vocab_size), target.get_output_embeddings().weight.detach() * sharpness
    )
    draft.embed_tokens.weight = target.get_input_embeddings().weight
    return draft.eval().requires_grad_(False)


Q4_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def tiny_q4_model(path, seed: int = 0, qtype: str = "Q4_1", layers: int = 2, q8_head: bool = False):
    """A tiny Llama (sizes the 4-bit kernel takes: multiples of 64) whose projections hold exactly the
    weights of the Q4 GGUF it writes to `path`, laid out as llama.cpp writes them (q/k rows permuted for its
    rotary embedding); with `q8_head`, its tied embedding and LM head those of the GGUF's Q8_0 token
    embedding (64 tokens), as SmolLM2's. Returns the model in float32."""
    import gguf
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(layers, hidden=128, vocab_size=64 if q8_head else None)
    config.tie_word_embeddings = q8_head
    model = LlamaForCausalLM(config).eval()
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    writer = gguf.GGUFWriter(str(path), "llama")
    if q8_head:
        embedding = model.get_input_embeddings().weight
        blocks = gguf.quants.quantize(embedding.detach().numpy() * 4, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor("token_embd.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        stored = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
        embedding.data.copy_(torch.from_numpy(stored))
    for i, layer in enumerate(model.model.layers):
        for name, gguf_name in Q4_NAMES.items():
            module = layer.get_submodule(name)
            weight = module.weight.detach().numpy() * 4  # spread beyond the init's narrow range
            heads = {"attn_q": 4, "attn_k": 2}.get(gguf_name)
            if heads:  # llama.cpp's permutation (convert_hf_to_gguf.py)
                weight = weight.reshape(heads, 2, -1, weight.shape[1]).swapaxes(1, 2).reshape(weight.shape)
            blocks = gguf.quants.quantize(weight, quant)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", blocks, raw_dtype=quant)
            stored = torch.from_numpy(gguf.quants.dequantize(blocks, quant))
            if heads:  # back to transformers' order
                stored = stored.reshape(heads, -1, 2, stored.shape[1]).transpose(1, 2).reshape(stored.shape)
            module.weight.data.copy_(stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
