"""The EAGLE-3 feature draft: decoding and training see the same model, its file format, and training."""

import json

import pytest
import torch
from conftest import PROMPTS, tiny_feature_pair

from diversed_demo.core.draft import FeatureDraft
from diversed_demo.core.generate import generate
from diversed_demo.core.sampling import Sampler
from diversed_demo.distill.ttt import ttt_forward
from diversed_demo.models.eagle import target_features
from diversed_demo.models.loading import load_eagle3
from diversed_demo.models.pair import PairError


def test_decoding_chain_equals_the_training_unroll(feature_pair):
    # The training-time test must see exactly what drafting sees, at every depth, not only the first.
    pair, context, depth = feature_pair, PROMPTS[3], 4
    draft = FeatureDraft(pair.draft)
    with torch.no_grad():
        out = pair.target.model(torch.tensor([context]), output_hidden_states=True)
        features = target_features(out.hidden_states, pair.draft.aux_layer_ids)[0]
        draft.observe(len(context), features[:-1])
        sampler = Sampler(0.0, 1.0, torch.Generator().manual_seed(0))
        tokens, _, states = draft.propose(torch.tensor(context), depth, sampler)
        ids = torch.tensor([context + tokens.tolist()])
        length = len(context) - 1
        unrolled = ttt_forward(
            pair.draft,
            features[None, :length],
            ids,
            torch.arange(length)[None],
            torch.ones(1, length, dtype=torch.bool),
            steps=depth,
        )
    for step in range(depth):
        assert torch.allclose(unrolled[step][0, length - 1], states[step], atol=1e-5), step


def test_no_event_follows_an_accepted_eos(pair):
    # An EOS among the accepted drafts ends the output: the draft rejected after it is not an event.
    for seed in range(100):
        summary, events = generate(
            pair, PROMPTS[0], mode="static", ensemble_weight=0.3, n_draft=6, max_new_tokens=40, seed=seed
        )
        if summary.token_ids and summary.token_ids[-1] == 2:
            last = max(i for i, e in enumerate(events) if e.kind != "rejected")
            assert last == len(events) - 1, seed


def test_saved_draft_reloads_identically(feature_pair, tmp_path):
    feature_pair.draft.save(tmp_path / "draft", dtype=torch.float32)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 32
    loaded = load_eagle3(tmp_path / "draft", feature_pair.target)
    for name, tensor in feature_pair.draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    bad = json.loads((tmp_path / "draft" / "config.json").read_text())
    bad["transformer_layer_config"]["hidden_size"] = 64
    (tmp_path / "draft" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(PairError, match="hidden size"):
        load_eagle3(tmp_path / "draft", feature_pair.target)


def test_feature_draft_loads_through_load_pair(tmp_path):
    from tiny import save_tiny_pair

    from diversed_demo.runtime.plan import load_pair

    target_dir, _ = save_tiny_pair(tmp_path)  # the same tiny target as tiny_feature_pair's
    base = tiny_feature_pair()
    base.draft.save(tmp_path / "eagle", dtype=torch.float32)
    loaded = load_pair(target_dir, str(tmp_path / "eagle"), "cpu", "float32")
    summary, _ = generate(loaded, PROMPTS[1], mode="exact", n_draft=3, max_new_tokens=12, temperature=0)
    reference, _ = generate(loaded, PROMPTS[1], mode="ar", max_new_tokens=12, temperature=0)
    assert loaded.draft_name == str(tmp_path / "eagle") and summary.drafted > 0
    assert summary.token_ids == reference.token_ids
