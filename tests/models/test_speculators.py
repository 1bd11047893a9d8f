"""Optional: our EAGLE-3 draft files load into vLLM `speculators`' Eagle3DraftModel and compute the same
thing.

Skipped unless `speculators` is installed (it is not a dependency of this project). On CPU its draft must use
"sdpa" or "eager" attention (its default flex attention needs T to be a multiple of 128 there), and loading by
`from_pretrained` needs the verifier's files, so the model is built from the saved config and the weights are
loaded by hand; our file carries no embed_tokens, so the target's embedding is copied in, as vLLM does.
"""

import json

import pytest
import torch

speculators = pytest.importorskip("speculators")

from safetensors.torch import load_file  # noqa: E402
from speculators import SpeculatorModelConfig  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from tiny import tiny_eagle3, tiny_model  # noqa: E402

from diversed_demo.distill.ttt import ttt_forward  # noqa: E402
from diversed_demo.models.eagle import target_features  # noqa: E402

torch.set_num_threads(1)

STEPS = 3
LENGTH = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tiny_model(0, 2)
    draft = tiny_eagle3(target)
    directory = tmp_path_factory.mktemp("eagle3") / "d"
    draft.save(directory, dtype=torch.float32)

    config = SpeculatorModelConfig.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = "sdpa"  # not flex attention on CPU
    theirs = Eagle3DraftModel(config).float().eval()
    missing, unexpected = theirs.load_state_dict(
        load_file(str(directory / "model.safetensors")), strict=False
    )
    assert sorted(missing) == ["embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"]
    assert unexpected == []
    with torch.no_grad():
        theirs.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    return target, draft, theirs, config, directory


def test_config_parses(models):
    target, draft, theirs, config, directory = models
    assert isinstance(config, Eagle3SpeculatorConfig)
    assert config.speculators_model_type == "eagle3"
    assert config.draft_vocab_size == len(draft.d2t) == 32
    assert config.eagle_aux_hidden_state_layer_ids == draft.aux_layer_ids
    assert config.norm_before_residual is True
    layer = config.transformer_layer_config
    assert layer.model_type == "llama" and layer.num_hidden_layers == 1
    assert (layer.hidden_size, layer.vocab_size) == (target.config.hidden_size, target.config.vocab_size)
    assert layer.head_dim == target.config.hidden_size // target.config.num_attention_heads
    assert (layer.num_attention_heads, layer.num_key_value_heads) == (4, 2)
    assert layer.rope_parameters["rope_theta"] == target.config.rope_parameters["rope_theta"]
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Eagle3Speculator"]
    # the state dict matches speculators' shapes and vocabulary mapping
    assert theirs.use_draft_vocab
    assert torch.equal(theirs.d2t, draft.d2t) and torch.equal(theirs.t2d, draft.t2d)
    assert int(theirs.t2d.sum()) == config.draft_vocab_size
    theirs.load_vocab_mappings(theirs.t2d.clone(), theirs.d2t.clone())  # speculators' own checks pass
    ours = {k: v for k, v in draft.state_dict().items() if not k.startswith("embed_tokens")}
    for key, value in ours.items():
        assert theirs.state_dict()[key].shape == value.shape, key
        assert torch.equal(theirs.state_dict()[key], value), key
    assert not torch.isnan(theirs.lm_head.weight).any()


def run_both(models, seed=0, position_offset=0):
    target, draft, theirs, _, _ = models
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, target.config.vocab_size, (1, LENGTH + 1), generator=generator)
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
        features = target_features(out.hidden_states, draft.aux_layer_ids)[:, :LENGTH]
        positions = torch.arange(LENGTH).unsqueeze(0)
        # speculators' teacher forcing shifts the tokens left each step and pads with 0
        tokens = torch.cat([ids, ids.new_zeros(1, STEPS)], dim=1)
        hidden = ttt_forward(
            draft, features, tokens, positions, torch.ones(1, LENGTH, dtype=torch.bool), STEPS
        )
        our_logits = [draft.draft_logits(h) for h in hidden]

        captured = []
        hook = theirs.lm_head.register_forward_hook(lambda module, args, output: captured.append(output))
        try:
            their_tokens = theirs(
                hidden_states=features,
                input_ids=ids[:, 1 : LENGTH + 1],
                document_ids=torch.zeros(1, LENGTH, dtype=torch.long),
                position_ids=positions + position_offset,
                ttt_steps=STEPS,
            )
        finally:
            hook.remove()
    return our_logits, captured, their_tokens


def test_same_drafts_and_logits(models):
    for seed in range(3):
        our_logits, their_logits, their_tokens = run_both(models, seed)
        assert len(their_tokens) == len(their_logits) == STEPS
        for step in range(STEPS):
            ours = our_logits[step].argmax(-1)
            assert their_tokens[step].shape == ours.shape == (1, LENGTH)
            assert torch.equal(their_tokens[step], ours), (seed, step, ours, their_tokens[step])
            torch.testing.assert_close(their_logits[step], our_logits[step], rtol=1e-4, atol=1e-4)


def test_position_offset_is_irrelevant(models):
    """speculators trains with position ids 1 + arange(T) (shift_batch keeps position_ids[1:]); we use
    arange(T), the target position of the features. Rotary attention depends only on differences, so the
    logits agree."""
    our_logits, their_logits, _ = run_both(models, seed=5, position_offset=1)
    for step in range(STEPS):
        torch.testing.assert_close(their_logits[step], our_logits[step], rtol=1e-4, atol=1e-4)
