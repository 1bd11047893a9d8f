"""Distillation on a tiny random Llama: draft building, loss going down, resumable checkpoints, export."""
import json

import pytest
import torch
from safetensors.torch import load_file

from diversed_demo.distill import (DRAFT_SIZE_LIMIT, build_draft, evaluate, make_batch, sample_responses,
                                   save_draft, split_records, train, trainable_parameters)
from diversed_demo.models import load_embedded_draft
from diversed_demo.tiny import tiny_model

PAD, EOS = 3, 2


def sampled_records(target, n=4, seed=0):
    """Responses the tiny target samples itself, with its top-k log-probs, as the data stage stores them."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(4, 40, (3 + i,), generator=generator).tolist() for i in range(n)]
    records = sample_responses(target, prompts, max_new_tokens=8, top_k=8, eos_id=EOS, pad_id=PAD,
                               generator=generator)
    for i, r in enumerate(records):
        r.update(key=f"tiny/{i}", source="tiny")
    return records


def test_draft_shares_and_freezes_the_embedding():
    target = tiny_model(0, num_layers=3)
    draft = build_draft(target, [0, 2])
    assert draft.config.num_hidden_layers == 2
    assert draft.get_input_embeddings().weight is target.get_input_embeddings().weight
    assert draft.get_output_embeddings().weight is target.get_output_embeddings().weight
    assert not draft.get_input_embeddings().weight.requires_grad
    trainable = {id(p) for p in trainable_parameters(draft)}
    assert id(draft.get_input_embeddings().weight) not in trainable
    assert id(draft.get_output_embeddings().weight) not in trainable
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[2].mlp.up_proj.weight)


def test_sampled_responses_match_the_targets_distribution():
    target = tiny_model(0)
    records = sampled_records(target)
    r = records[2]  # left-padded in its batch: the stored log-probs must be those of the unpadded prompt
    ids = torch.cat([r["prompt_ids"], r["response_ids"][:-1]]).long()[None]
    logprobs = torch.log_softmax(target(input_ids=ids).logits[0, len(r["prompt_ids"]) - 1:], -1)
    stored = r["target_top_logprobs"].float()
    assert torch.allclose(logprobs.gather(-1, r["target_top_ids"].long()), stored, atol=2e-2)


def test_training_reduces_the_kl_and_keeps_the_embedding(tmp_path):
    target = tiny_model(0, num_layers=2)
    records = sampled_records(target)
    draft = build_draft(target, [1])
    embedding = target.get_input_embeddings().weight.clone()
    before = evaluate(draft, records, PAD)["fkl"]
    train(draft, records, records, PAD, steps=8, batch_size=4, lr=3e-3, loss="fkl",
          checkpoint=tmp_path / "ckpt.pt", eval_every=8, checkpoint_every=8)
    after = evaluate(draft, records, PAD)["fkl"]
    assert after < before
    assert torch.equal(target.get_input_embeddings().weight, embedding)


def test_checkpoint_resumes_from_the_saved_step(tmp_path, monkeypatch):
    import diversed_demo.distill as distill
    target = tiny_model(0, num_layers=2)
    records = sampled_records(target, n=6)
    kwargs = dict(steps=5, batch_size=2, lr=3e-3, loss="tv", eval_every=2, checkpoint_every=1, seed=1)
    straight = build_draft(target, [1])
    train(straight, records, records[:2], PAD, checkpoint=tmp_path / "a.pt", **kwargs)

    calls = []

    def interrupted_make_batch(*args):  # Ctrl-C at step 4 (calls: steps 1, 2, the eval at 2, 3, then 4)
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return make_batch(*args)

    monkeypatch.setattr(distill, "make_batch", interrupted_make_batch)
    with pytest.raises(KeyboardInterrupt):
        train(build_draft(target, [1]), records, records[:2], PAD, checkpoint=tmp_path / "b.pt", **kwargs)
    monkeypatch.setattr(distill, "make_batch", make_batch)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["step"] == 3

    resumed = build_draft(target, [1])  # as in a fresh process: the layers come back from the checkpoint
    meta = train(resumed, records, records[:2], PAD, checkpoint=tmp_path / "b.pt", **kwargs)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["step"] == 5
    assert [e["step"] for e in meta["evals"]] == [2, 4, 5]  # the eval before the interrupt was kept
    for a, b in zip(trainable_parameters(straight), trainable_parameters(resumed)):
        assert torch.allclose(a, b, atol=1e-6)


def test_saved_draft_loads_without_a_stored_embedding(tmp_path):
    target = tiny_model(0, num_layers=3)
    draft = build_draft(target, [0, 2])
    save_draft(draft, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert not any("embed_tokens" in k or "lm_head" in k for k in stored)
    assert all(v.dtype == torch.float16 for v in stored.values())
    assert (tmp_path / "model.safetensors").stat().st_size <= DRAFT_SIZE_LIMIT
    loaded = load_embedded_draft(target, torch.device("cpu"), torch.float32, tmp_path)
    assert loaded.get_input_embeddings().weight is target.get_input_embeddings().weight
    batch = make_batch(sampled_records(target, n=2), PAD)
    with torch.no_grad():
        expected = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(expected, got, atol=1e-2)


def test_heldout_split_is_by_prompt():
    records = [{"key": f"instructions/{i}/s{s}", "source": "instructions"} for i in range(50) for s in range(3)]
    train_records, heldout = split_records(records, 0.2)
    held_prompts = {r["key"].rsplit("/s", 1)[0] for r in heldout}
    assert held_prompts and not held_prompts & {r["key"].rsplit("/s", 1)[0] for r in train_records}


def test_measure_reports_figures_in_range(tmp_path):
    from diversed_demo.distill import measure
    from diversed_demo.tiny import tiny_pair
    (tmp_path / "spec_bench").mkdir()
    questions = [{"question_id": i, "category": c, "turns": [f"the {w} sat on the mat", "and then ?"]}
                 for i, (c, w) in enumerate((c, w) for c in ("writing", "math") for w in ("cat", "dog", "rug"))]
    (tmp_path / "spec_bench" / "question.jsonl").write_text("\n".join(json.dumps(q) for q in questions))
    figures = measure(tiny_pair(), tmp_path, per_category=2, max_new_tokens=8, timing_steps=2)
    assert figures["prompts"] == 4
    for key in ("exact_acceptance_t1", "accepted_per_drafted_t1", "greedy_agreement", "one_minus_tv_t1_on_greedy_path"):
        assert 0.0 <= figures[key] <= 1.0
    assert 1.0 <= figures["tau_t1"] <= 5.0 and figures["cost_ratio"] > 0
