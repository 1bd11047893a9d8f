"""Positions at scale: the teacher-forced record holds what the decoder would see at each position, every
response token once, split by prompt, and resumes its folder."""

import pytest
import torch
from safetensors.torch import load_file

from diversed_demo.core.draft import FeatureDraft
from diversed_demo.core.sampling import Sampler
from diversed_demo.models.eagle import target_features
from diversed_demo.training import positions
from diversed_demo.training.rollouts import RECORDED

RECORDS = [  # prompt and response ids of the tiny vocabulary
    {"prompt_ids": [1, 5, 6, 7], "response_ids": [8, 9, 10, 11, 12, 2], "held_out": False},
    {"prompt_ids": [1, 9, 10], "response_ids": [13, 14, 15], "held_out": True},
    {"prompt_ids": [1, 20, 21, 22, 23], "response_ids": [24, 25, 26, 27, 28, 29, 30], "held_out": False},
]


@pytest.mark.parametrize("n_draft", [1, 3])
def test_every_response_token_is_recorded_once_with_its_own_token(feature_pair, n_draft):
    recorded = positions.teacher_forced_positions(feature_pair, RECORDS, 1.0, n_draft)
    responses = [t for r in RECORDS for t in r["response_ids"]]
    assert recorded["tokens"].tolist() == responses
    flags = [r["held_out"] for r in RECORDS for _ in r["response_ids"]]
    assert recorded["held_out"].tolist() == flags
    assert set(RECORDED) <= set(recorded)


def test_the_record_is_what_decoding_sees_at_each_position(feature_pair):
    # Each position's p and the target's hidden state are the target pass's; at depth 1 (a block's first,
    # the response cut in blocks of N), q and the draft's hidden state are the decoder's own draft step on
    # that prefix. (Deeper depths are the draft's chain, which test_decoding_chain_equals_the_training_unroll
    # holds to decoding.)
    pair, n_draft, record = feature_pair, 3, RECORDS[2]
    recorded = positions.teacher_forced_positions(pair, [record], 1.0, n_draft)
    sequence = record["prompt_ids"] + record["response_ids"]
    with torch.no_grad():
        out = pair.target.model(torch.tensor([sequence]), output_hidden_states=True)
        features = target_features(out.hidden_states, pair.draft.aux_layer_ids)[0]
        p_all = torch.softmax(pair.target.lm_head(out.last_hidden_state[0]).float(), -1)
    first = len(record["prompt_ids"]) - 1  # the position that predicts the first response token
    checked = 0
    for k, position in enumerate(range(first, len(sequence) - 1)):
        p, token = p_all[position], sequence[position + 1]
        assert torch.allclose(recorded["target_hidden"][k], out.last_hidden_state[0, position], atol=1e-5)
        assert torch.isclose(recorded["target_prob"][k], p[token], atol=1e-6)
        assert torch.isclose(recorded["target_entropy"][k], -(p * p.log()).sum(), atol=1e-5)
        if (position - first) % n_draft:
            continue
        draft = FeatureDraft(pair.draft)
        with torch.no_grad():  # the decoder's draft, having verified the text up to this position
            draft.observe(position + 1, features[:position])
            sampler = Sampler(1.0, 1.0, torch.Generator().manual_seed(0))
            _, q, states = draft.propose(torch.tensor(sequence[: position + 1]), 1, sampler)
        assert torch.allclose(recorded["draft_hidden"][k], states[0], atol=1e-5)
        assert torch.isclose(recorded["draft_prob"][k], q[0, token], atol=1e-6)
        assert torch.isclose(recorded["tv"][k], 0.5 * (p - q[0]).abs().sum(), atol=1e-5)
        checked += 1
    assert checked >= 2


def test_held_out_prompts_are_split_by_text_and_the_pool_never_reads_spec_bench():
    prompts = [f"prompt number {i}" for i in range(2000)]
    share = sum(map(positions.held_out, prompts)) / len(prompts)
    assert abs(share - positions.HELD_OUT_SHARE) < 0.03
    assert positions.held_out("same text") == positions.held_out("same text")
    chunk = positions.chunk_prompts(prompts[:10], 0, seed=1)
    assert len(chunk) == positions.CHUNK_PROMPTS and set(chunk) == set(prompts[:10])


def test_a_folder_resumes_and_refuses_other_settings(feature_pair, tmp_path, monkeypatch):
    prompts = ["the cat sat on the", "a dog ran under", "one plus two is", "the red mat and"]
    monkeypatch.setattr(positions, "task_prompts", lambda task: prompts)
    monkeypatch.setattr(positions, "CHUNK_PROMPTS", 4)
    folder = tmp_path / "general"
    settings = dict(temperature=1.0, n_draft=2, max_new_tokens=6, seed=0, progress=False)
    positions.record_positions(feature_pair, "general", folder, 10, **settings)
    chunks = sorted(folder.glob("chunk_*.safetensors"))
    fit, held = positions.load_positions(folder)
    assert fit.tv.shape[1] >= 10 and fit.target_hidden.dtype == torch.float32
    recorded = sum(len(load_file(str(path))["tokens"]) for path in chunks)
    assert fit.tv.shape[1] + held.tv.shape[1] == recorded
    again = positions.record_positions(feature_pair, "general", folder, 10, **settings)
    assert sorted(again.glob("chunk_*.safetensors")) == chunks  # nothing more to record
    with pytest.raises(ValueError, match="other settings.*n_draft"):
        positions.record_positions(feature_pair, "general", folder, 10, **(settings | {"n_draft": 3}))
