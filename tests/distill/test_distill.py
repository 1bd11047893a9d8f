"""Making the feature draft: on-policy data, training with the training-time test, resumable checkpoints."""

import collections
import copy
import dataclasses
import json
import math
import re
import shutil
import types

import pytest
import torch
from tiny import tiny_model

from diversed_demo.common.files import write_jsonl_gz
from diversed_demo.distill import batches, data, ttt
from diversed_demo.distill import train as distill
from diversed_demo.distill.config import DraftTrainConfig
from diversed_demo.runtime.batch_generation import generate_batch


@pytest.fixture(scope="module")
def target():
    return tiny_model(0, 2)


@pytest.fixture(scope="module")
def records(target):
    """Responses the tiny target samples at T = 1 to random prompts (tiny on-policy data)."""
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    prompts = [
        [1] + torch.randint(4, vocab, (int(torch.randint(2, 8, (), generator=g)),), generator=g).tolist()
        for _ in range(120)
    ]
    responses = generate_batch(target, prompts, [False] * len(prompts), 24, 2, 3, g)
    return [
        {
            "key": f"tiny/{i}/s0",
            "source": "tiny",
            "greedy": False,
            "prompt_ids": p,
            "response_ids": r,
            "ended": e,
        }
        for i, (p, (r, e)) in enumerate(zip(prompts, responses))
    ]


def test_schedule_is_deterministic_keeps_the_mix_and_never_reads_spec_bench():
    prompts = {
        "instructions": [f"i{k}" for k in range(30)],
        "general": ["g"],
        "summarization": ["s"],
        "gsm8k": [f"m{k}" for k in range(400)],
        "mbpp": [f"c{k}" for k in range(60)],
        "humaneval": ["h"],
        "broad": [f"b{k}" for k in range(300)],
        "passages": [f"p{k}" for k in range(300)],
    }
    jobs = data.schedule(prompts, seed=0)
    assert [j.key for j in jobs] == [j.key for j in data.schedule(prompts, seed=0)]
    assert len({j.key for j in jobs}) == len(jobs)
    head = collections.Counter(data.SOURCE_GROUP[j.source] for j in jobs[:200])
    for group, weight in data.SOURCE_WEIGHTS.items():
        assert abs(head[group] / 200 - weight) < 0.02
    assert sum(j.greedy for j in jobs) == sum(
        len(v) for v in prompts.values()
    )  # one greedy response per prompt
    assert set(data.training_prompts()) == set(data.SAMPLES_PER_PROMPT)


def test_training_prompts_never_read_or_copy_spec_bench(monkeypatch):
    from diversed_demo.eval import tasks

    def runs_of_words(text, n=13):  # a copy shares every run of 13 words, wherever it was pasted
        words = re.findall(r"\w+", text.lower())
        return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}

    questions = tasks.load_spec_bench()
    spec_bench = set().union(*(runs_of_words(q.prompt) for q in questions))
    pasted = "Summarize this article: " + max(questions, key=lambda q: len(q.prompt)).prompt[37:900]
    assert runs_of_words(pasted) & spec_bench  # the check finds a copy pasted at any offset
    real_data_file = tasks.data_file

    def data_file(relative):
        assert not relative.startswith("spec_bench"), "training prompts read Spec-Bench"
        return real_data_file(relative)

    monkeypatch.setattr(tasks, "data_file", data_file)
    monkeypatch.setattr(
        tasks, "load_spec_bench", lambda *a, **k: pytest.fail("training prompts read Spec-Bench")
    )
    prompts = [text for texts in data.training_prompts().values() for text in texts]
    assert len(prompts) > 10_000
    assert [p for p in prompts if runs_of_words(p) & spec_bench] == []


def test_shards_round_trip_and_generation_resumes(tmp_path, target, monkeypatch):
    from tiny import tiny_tokenizer

    monkeypatch.setattr(
        data,
        "training_prompts",
        lambda: {
            "instructions": ["the cat", "a dog ran"],
            "gsm8k": ["one two"],
            "general": [],
            "summarization": [],
            "mbpp": [],
            "humaneval": [],
        },
    )
    tokenizer = tiny_tokenizer()
    first = data.generate_shards(
        target, tokenizer, tmp_path, target_tokens=30, batch_size=4, max_new_tokens=12
    )
    records = data.load_records(tmp_path)
    assert first["shards"] == 1 and len(records) == 4
    data.generate_shards(
        target, tokenizer, tmp_path, target_tokens=10_000, batch_size=4, max_new_tokens=12, command="go on"
    )
    again = data.load_records(tmp_path)
    shards = len(data.shard_paths(tmp_path))
    tokens = sum(len(r["response_ids"]) for r in again)
    # the card names the commands that made the data, and the digest of a prompt file they read jobs from
    assert data.read_runs(tmp_path) == [
        {"command": None, "shards_before": 0, "shards": 1, "response_tokens": first["response_tokens"]},
        {"command": "go on", "shards_before": 1, "shards": shards, "response_tokens": tokens},
    ]
    assert again[:4] == records  # the first shard is kept, never regenerated
    assert len({r["key"] for r in again}) == len(again) == len(data.schedule(data.training_prompts()))


def test_training_raises_heldout_agreement_at_every_draft_position(tmp_path, target, records):
    config = DraftTrainConfig(
        ttt_steps=3,
        lr=3e-3,
        warmup_steps=5,
        epochs=2,
        batch_tokens=512,
        eval_every=1000,
        draft_vocab_size=32,
        bf16=False,
    )
    heldout, train_records = records[:20], records[20:]
    vocab = batches.frequent_tokens(train_records, 32, always=[2])
    draft = distill.init_draft(target, vocab, config, aux_layer_ids=[0, 1, 1])
    before = distill.evaluate(draft, target, heldout, 3, config)
    embedding_before, lm_head_before = draft.embed_tokens.weight.clone(), draft.lm_head.weight.clone()
    state = distill.train(draft, target, train_records, heldout, 3, config, tmp_path, log=lambda m: None)
    after = state["best"]
    assert all(a > b + 0.1 for a, b in zip(after["agreement"], before["agreement"]))
    assert after["score"] > distill.score(before)
    assert torch.equal(draft.embed_tokens.weight, embedding_before)  # the target's own tensor, untouched
    assert torch.equal(draft.lm_head.weight, lm_head_before)
    assert (tmp_path / "best" / "model.safetensors").exists()


def test_interrupted_training_resumes_to_the_same_weights(tmp_path, target, records):
    config = DraftTrainConfig(
        ttt_steps=2,
        lr=3e-3,
        warmup_steps=2,
        epochs=1,
        batch_tokens=512,
        eval_every=3,
        draft_vocab_size=32,
        bf16=False,
    )
    vocab = batches.frequent_tokens(records, 32, always=[2])

    def run(work_dir, minutes=None):
        draft = distill.init_draft(target, vocab, config, aux_layer_ids=[0, 1, 1])
        state = distill.train(
            draft, target, records[20:], records[:20], 3, config, work_dir, lambda m: None, minutes
        )
        return draft, state

    straight, done = run(tmp_path / "a")
    _, stopped = run(tmp_path / "b", minutes=1e-9)  # stops at once, after a checkpoint
    assert stopped["step"] == 0
    clock = iter(range(10**6))  # a second per reading of the clock: the sitting stops after a few steps
    # distill's own clock only: patching time.time itself let other threads (a progress bar's monitor left
    # by an earlier test in the worker) read it too, and the sitting stopped at an evaluation
    fake_time = types.SimpleNamespace(time=lambda: float(next(clock)), strftime=distill.time.strftime)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distill, "time", fake_time)
        _, between = run(tmp_path / "c", minutes=6 / 60)
    assert 0 < between["step"] < done["total_steps"] and between["step"] % config.eval_every
    assert between["history"][-1]["step"] == between["step"]  # evaluated as it stopped, between evaluations
    resumed, finished = run(tmp_path / "b")
    assert finished["step"] == done["step"] == done["total_steps"]
    # The keys a running draft training resumes from (its checkpoint must stay readable across refactors).
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert set(saved) == {"model", "optimizer", "scheduler", "state", "config"}
    assert not any(
        k.startswith("embed_tokens") for k in saved["model"]
    )  # the target's own tensor is not stored
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(resumed.state_dict()[name], tensor, atol=1e-6), name


def test_losses_stay_finite_where_the_draft_vocabulary_leaves_tokens_out(target, records):
    # q is 0 outside the draft vocabulary (once `distill --loss rkl` turned that into 0·(−inf) = NaN): the
    # KL is taken over the draft vocabulary and 1 − TV needs no logarithm.
    config = DraftTrainConfig(ttt_steps=2, batch_tokens=512, bf16=False)
    vocab = batches.frequent_tokens(records, 8, always=[2])
    draft = distill.init_draft(target, vocab, config, aux_layer_ids=[0, 1, 1])
    batch = batches.make_batch(records[:8], 3, config.max_length, target.device)
    assert not torch.isin(
        batch["ids"][batch["predicts_response"]], torch.tensor(vocab)
    ).all()  # tokens outside
    loss, per_step = ttt.ttt_loss(draft, target, batch, config)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(x) for x in per_step)
    assert all(torch.isfinite(p.grad).all() for p in draft.parameters() if p.grad is not None)
    metrics = distill.evaluate(draft, target, records[:8], 3, config)
    assert all(0 <= x <= 1 for x in metrics["one_minus_tv"] + metrics["agreement"])


def test_heldout_figures_of_two_groups_merge_into_those_of_their_union(target, records):
    config = DraftTrainConfig(ttt_steps=2, draft_vocab_size=32)
    draft = distill.init_draft(target, batches.frequent_tokens(records, 32, always=[2]), config, [0, 1, 1])
    heldout = [dict(r, source="broad" if i % 3 == 0 else "gsm8k") for i, r in enumerate(records[:30])]
    figures = distill.evaluate_by_group(draft, target, heldout, 3, config)
    whole = distill.evaluate(draft, target, heldout, 3, config)
    assert figures["tokens"] == whole["tokens"] and set(figures["by_group"]) == {"broad", "earlier"}
    for key in ("agreement", "one_minus_tv"):
        assert figures[key] == pytest.approx(whole[key], abs=1e-5)
    assert distill.evaluate_by_group(draft, target, [], 3, config)["tokens"] == 0


def test_new_sources_train_with_a_seeded_share_of_the_old():
    records = [{"source": "broad" if i % 4 == 0 else "gsm8k", "key": f"k/{i}/s0"} for i in range(4000)]
    chosen = batches.select_sources(records, ["broad"], replay=0.25, seed=0)
    counts = collections.Counter(r["source"] for r in chosen)
    assert counts["broad"] == 1000 and abs(counts["gsm8k"] - 750) < 4 * (3000 * 0.25 * 0.75) ** 0.5
    assert chosen == batches.select_sources(records, ["broad"], replay=0.25, seed=0)
    assert batches.select_sources(records, None, replay=0.0, seed=0) == records


def test_frequent_tokens_and_heldout_split():
    records = [
        {"key": "gsm8k/1/s0", "response_ids": [5, 5, 6, 7, 7, 7]},
        {"key": "gsm8k/1/greedy", "response_ids": [8]},
    ]
    assert batches.frequent_tokens(records, 2) == [5, 7]
    assert batches.frequent_tokens(records, 3, always=[2]) == [2, 5, 7]
    # both responses to one prompt fall on the same side of the split
    assert len({batches.is_heldout(r, 0.5) for r in records}) == 1


def test_export_writes_the_best_draft_with_a_fresh_card(tmp_path, target, records):
    import json

    from diversed_demo.distill import card
    from diversed_demo.models.loading import load_eagle3

    config = DraftTrainConfig(
        ttt_steps=2,
        lr=3e-3,
        warmup_steps=2,
        epochs=1,
        batch_tokens=512,
        eval_every=2,
        draft_vocab_size=32,
        bf16=False,
    )
    vocab = batches.frequent_tokens(records, 32, always=[2])
    draft = distill.init_draft(target, vocab, config, aux_layer_ids=[0, 1, 1])
    work = tmp_path / "run"
    state = distill.train(draft, target, records[20:], records[:20], 3, config, work, lambda m: None)
    (work / "run.json").write_text(json.dumps({"command": "test", "config": {}, "data": {}}))
    write_jsonl_gz(tmp_path / "data" / "shard_00000.jsonl.gz", records)
    out = tmp_path / "draft"
    out.mkdir()
    (out / "card.json").write_text(json.dumps({"layers": 4, "spec_bench": {"tau": 9}}))  # an earlier draft's
    (out / "vocab.json").write_text("{}")
    card.export(work, out, data_dir=tmp_path / "data")
    written = card.read_card(out)
    assert "layers" not in written and "spec_bench" not in written and not (out / "vocab.json").exists()
    assert written["training"]["best"]["score"] == max(h["score"] for h in state["history"])
    assert written["data"]["responses"] == len(records)
    exported = load_eagle3(out, target)
    best = load_eagle3(work / "best", target)
    for name, tensor in best.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name

    # The run as it comes back from a GPU machine: no 60 MB checkpoint, no shards; the same card, and the
    # sitting it continued from beside it.
    card.portable_run(work, tmp_path / "data")
    travelled = tmp_path / "travelled"
    shutil.copytree(work, travelled, ignore=shutil.ignore_patterns("checkpoint.pt"))
    shutil.rmtree(tmp_path / "data")
    again = tmp_path / "again"
    card.export(travelled, again, data_dir=tmp_path / "data", earlier=[travelled])
    carried = card.read_card(again)
    assert carried["data"] == written["data"]
    assert {k: v for k, v in carried["training"].items() if k != "earlier_sittings"} == written["training"]
    assert carried["training"]["earlier_sittings"][0]["best"] == written["training"]["best"]


def test_shard_folders_generated_apart_merge_once_each(tmp_path):
    """Generators filled copies of one folder side by side: the merge holds the base's records once and each
    folder's own, numbered in order, with every run logged; a record in two folders is refused."""

    def shard(folder, n, keys):
        write_jsonl_gz(folder / f"shard_{n:05d}.jsonl.gz", [{"key": k} for k in keys])

    base, one, two = (tmp_path / name for name in ("base", "one", "two"))
    shard(base, 0, ["a/0", "a/1"])
    data.log_run(base, {"command": "seed"})
    for folder, keys in ((one, ["b/0"]), (two, ["c/0", "c/1"])):
        shutil.copytree(base, folder)
        shard(folder, 1, keys)
        data.log_run(folder, {"command": folder.name})
    assert data.merge_shards(tmp_path / "out", base, [one, two]) == {"shards": 3, "records": 5}
    assert [r["key"] for r in data.load_records(tmp_path / "out")] == ["a/0", "a/1", "b/0", "c/0", "c/1"]
    assert [run["command"] for run in data.read_runs(tmp_path / "out")] == ["seed", "one", "two"]
    with pytest.raises(ValueError, match="already holds shards"):
        data.merge_shards(tmp_path / "out", base, [one])
    with pytest.raises(ValueError, match="absent holds no shards"):
        data.merge_shards(tmp_path / "elsewhere", base, [one, tmp_path / "absent"])
    shard(two, 2, ["b/0"])
    with pytest.raises(ValueError, match="repeats records.*b/0"):
        data.merge_shards(tmp_path / "again", base, [one, two])


def test_training_continues_from_a_saved_draft(tmp_path, target, records):
    """`distill train --init DIR` starts from a committed draft: its weights and vocabulary, with the
    embedding and LM head still frozen; a fresh machine goes on from where the last one's export stopped."""
    config = DraftTrainConfig(
        ttt_steps=2,
        lr=3e-3,
        warmup_steps=2,
        epochs=1,
        batch_tokens=512,
        eval_every=1000,
        draft_vocab_size=32,
        bf16=False,
    )
    vocab = batches.frequent_tokens(records, 32, always=[2])
    first = distill.init_draft(target, vocab, config, aux_layer_ids=[0, 1, 1])
    state = distill.train(
        first, target, records[20:], records[:20], 3, config, tmp_path / "a", lambda m: None
    )
    again = distill.continue_from(tmp_path / "a" / "best", target)
    assert torch.equal(again.draft_token_ids, first.draft_token_ids)
    assert distill.evaluate(again, target, records[:20], 3, config)["agreement"] == state["best"]["agreement"]
    trainable = {n for n, p in again.named_parameters() if p.requires_grad}
    assert trainable and not any(n.startswith(("embed_tokens", "lm_head")) for n in trainable)
    more = distill.train(again, target, records[20:], records[:20], 3, config, tmp_path / "b", lambda m: None)
    assert more["best"]["score"] >= state["best"]["score"] - 0.02
    bf16_target = copy.deepcopy(target).bfloat16()  # a bf16 target keeps its dtype: the embedding is shared
    in_bf16 = distill.continue_from(tmp_path / "a" / "best", bf16_target)
    assert bf16_target.get_input_embeddings().weight.dtype == torch.bfloat16
    assert in_bf16.embed_tokens.weight is bf16_target.get_input_embeddings().weight
    assert in_bf16.fc.weight.dtype == torch.float32


def test_a_checkpoint_resumes_only_under_its_own_settings_and_data(tmp_path):
    config = DraftTrainConfig(epochs=1)
    records = [{"key": f"gsm8k/{i}/greedy"} for i in range(5)]
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    saved = {"config": dataclasses.asdict(config), "records_sha256": distill.records_digest(records)}
    (tmp_path / "run.json").write_text(json.dumps(saved))
    distill.check_same_config(tmp_path, config, records)
    with pytest.raises(ValueError, match="other settings"):
        distill.check_same_config(tmp_path, DraftTrainConfig(epochs=2), records)
    with pytest.raises(ValueError, match="other data"):
        distill.check_same_config(tmp_path, config, records + [{"key": "broad/0/greedy"}])
    # a run saved before a setting or the data's digest existed: the setting had its default
    legacy = {"config": {k: v for k, v in saved["config"].items() if k != "replay"}}
    (tmp_path / "run.json").write_text(json.dumps(legacy))
    distill.check_same_config(tmp_path, config, records + [{"key": "broad/0/greedy"}])


def test_spec_bench_transfer_scores_the_targets_own_responses_as_training_scores_held_out(
    target, monkeypatch
):
    from types import SimpleNamespace

    from diversed_demo.distill import transfer
    from diversed_demo.eval.tasks import Example

    categories = ["writing", "math", "rag"]
    questions = [Example(f"question {i}", "general", None, f"sb/{i}", categories[i % 3]) for i in range(9)]
    monkeypatch.setattr(transfer, "load_spec_bench", lambda per_category: questions)
    monkeypatch.setattr(transfer, "encode_prompt", lambda tokenizer, prompt: [1, 5 + int(prompt.split()[1])])
    generating = SimpleNamespace(target=target, tokenizer=SimpleNamespace(pad_token_id=3, eos_token_id=2))
    records, pad_id = transfer.spec_bench_responses(generating, 3, 16, seed=0, batch_size=4)
    again, _ = transfer.spec_bench_responses(generating, 3, 16, seed=0, batch_size=4)
    other, _ = transfer.spec_bench_responses(generating, 3, 16, seed=1, batch_size=4)
    assert [r["source"] for r in records] == [q.category for q in questions]
    assert records == again and records != other  # seeded T = 1 samples of the target itself

    config = DraftTrainConfig(draft_vocab_size=32, bf16=False)
    draft = distill.init_draft(target, batches.frequent_tokens(records, 32, always=[2]), config, [0, 1, 1])
    figures = transfer.transfer_figures(draft, target, records, pad_id, False)
    held_out_way = distill.evaluate(draft, target, records, pad_id, config)
    assert figures["overall"]["expected_accepted_per_block"] == round(distill.score(held_out_way), 4)
    assert figures["overall"]["agreement"] == [round(a, 4) for a in held_out_way["agreement"]]
    assert list(figures["by_category"]) == categories
    assert sum(f["tokens"] for f in figures["by_category"].values()) == figures["overall"]["tokens"] > 0
    # a second draft against the first: the mean per-category difference, with its standard error
    other = distill.init_draft(target, batches.frequent_tokens(records, 32, always=[2]), config, [0, 1, 1])
    torch.nn.init.normal_(other.fc.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    other_figures = transfer.transfer_figures(other, target, records, pad_id, False)
    paired = transfer.paired_difference(figures, other_figures)
    differences = [
        other_figures["by_category"][c]["expected_accepted_per_block"]
        - figures["by_category"][c]["expected_accepted_per_block"]
        for c in categories
    ]
    assert paired["categories"] == 3 and paired["mean"] == pytest.approx(sum(differences) / 3, abs=1e-4)
    spread = (sum((d - paired["mean"]) ** 2 for d in differences) / 2) ** 0.5
    assert paired["standard_error"] == pytest.approx(spread / 3**0.5, abs=1e-3)
    assert transfer.paired_difference(figures, figures)["mean"] == 0
