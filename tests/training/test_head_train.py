"""Heads (save, load, pair binding) and their training: the acceptance term's sign, reward-driven updates."""

import math
import pickle

import pytest
import torch
from tiny import tiny_model, tiny_pair

from diversed_demo.core.generate import generate
from diversed_demo.models.heads import HeadError, list_heads, load_head, new_head, save_head
from diversed_demo.training.config import HeadTrainConfig
from diversed_demo.training.loop import train_head
from diversed_demo.training.objective import group_advantages, head_loss
from diversed_demo.training.rollouts import Rollouts, sample_rollouts


def test_head_round_trip_and_use_in_decoding(pair, tmp_path):
    head = new_head(pair, hidden_size=8)
    head.meta["task"] = "general"
    path = save_head(head, tmp_path / "h.safetensors")
    loaded = load_head(path, pair)
    h_t, h_d = torch.randn(5, 32), torch.randn(5, 32)
    assert torch.allclose(loaded(h_t, h_d), head(h_t, h_d))
    assert loaded.meta["task"] == "general" and ((0 <= loaded(h_t, h_d)) & (loaded(h_t, h_d) <= 1)).all()
    summary, events = generate(pair, "the cat sat", mode="dynamic", head=loaded, n_draft=3, max_new_tokens=10)
    drafted = [e for e in events if e.kind in ("accepted", "rejected")]
    assert drafted and all(0 <= e.w <= 1 for e in drafted) and summary.mean_w is not None


def test_head_of_another_pair_is_refused(pair, tmp_path):
    other = tiny_pair(draft=tiny_model(99, 1))
    path = save_head(new_head(other), tmp_path / "other.safetensors")
    with pytest.raises(HeadError, match="another pair.*draft model"):
        load_head(path, pair)


def test_malformed_and_pickled_files_are_refused(pair, tmp_path):
    pickled = tmp_path / "evil.safetensors"
    pickled.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(HeadError, match="not a head file"):
        load_head(pickled, pair)
    with pytest.raises(HeadError, match="no head"):
        load_head(tmp_path / "missing.safetensors", pair)


def test_w_min_bounds_the_head(pair):
    head = new_head(pair, w_min=0.6, w_init=0.7)
    w = head(100 * torch.randn(50, 32), 100 * torch.randn(50, 32))
    assert (w >= 0.6).all() and (w <= 1).all()


def fake_rollouts(n, t, tv, seed=0, target_entropy=1.0, cross_entropy=1.0):
    g = torch.Generator().manual_seed(seed)
    return Rollouts(
        tokens=torch.zeros(n, t, dtype=torch.long),
        mask=torch.ones(n, t),
        target_hidden=torch.randn(n, t, 32, generator=g),
        draft_hidden=torch.randn(n, t, 32, generator=g),
        target_prob=torch.rand(n, t, generator=g),
        draft_prob=torch.rand(n, t, generator=g),
        tv=torch.full((n, t), tv),
        target_entropy=torch.full((n, t), target_entropy),
        cross_entropy=torch.as_tensor(cross_entropy).expand(n, t).clone(),
        greedy_limit=torch.full((n, t), float("nan")),
    )


def test_dense_fidelity_raises_w_only_where_the_draft_costs_fidelity(pair):
    """Per token, w should rise where CE(q, p) − H(p) > λ·TV (the draft's tokens are unlikely under the
    target) and fall where the draft is nearly as faithful; the two kinds of position differ in their
    hidden states, so the head can tell them apart."""
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8, w_init=0.5)
    costly = torch.tensor([6.0, 1.0]).repeat(3)  # CE at alternating positions; H = 1, TV = 0.5, λ = 1
    rollouts = fake_rollouts(4, 6, tv=0.5, cross_entropy=costly)
    rollouts.target_hidden[:, ::2] += 3.0  # the costly positions look different
    opt = torch.optim.SGD(head.parameters(), lr=0.5)
    for _ in range(80):
        opt.zero_grad()
        head_loss(head, rollouts, torch.zeros(4), lam=1.0, dense_fidelity=1.0)[0].backward()
        opt.step()
    with torch.no_grad():
        w = head(rollouts.target_hidden, rollouts.draft_hidden)
    assert w[:, ::2].min() > 0.7 and w[:, 1::2].max() < 0.3


def test_rollouts_are_the_decoders_own_outputs(any_pair):
    # Rollouts come from the decoding process the head serves in, for either kind of draft.
    prompt, head = [1, 5, 6, 7], new_head(any_pair, hidden_size=8)
    rollouts = sample_rollouts(
        any_pair, head, [prompt] * 3, 12, 1.0, torch.Generator().manual_seed(0), n_draft=3
    )
    g = torch.Generator().manual_seed(0)
    seeds = [int(torch.randint(2**31 - 1, (), generator=g)) for _ in range(3)]
    for output, mask, seed in zip(rollouts.outputs, rollouts.mask, seeds):
        summary, events = generate(
            any_pair, prompt, mode="dynamic", head=head, n_draft=3, max_new_tokens=12, seed=seed
        )
        assert output == summary.token_ids
        decided = [e for e in events if e.kind in ("accepted", "resampled")]
        assert int(mask.sum()) == len(decided)
    with torch.no_grad():
        w = head(rollouts.target_hidden, rollouts.draft_hidden)
    recorded = [
        e.w
        for e in generate(
            any_pair, prompt, mode="dynamic", head=head, n_draft=3, max_new_tokens=12, seed=seeds[0]
        )[1]
        if e.kind in ("accepted", "resampled")
    ]
    assert w[0, : len(recorded)].tolist() == pytest.approx(recorded, abs=1e-5)


def test_rollouts_record_the_entropies_the_dense_term_needs(pair):
    prompt = [1, 5, 6, 7]
    rollouts = sample_rollouts(
        pair, new_head(pair, hidden_size=8), [prompt] * 2, 3, 1.0, torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        p = torch.softmax(pair.target(torch.tensor([prompt])).logits[0, -1], -1)
        q = torch.softmax(pair.draft(torch.tensor([prompt])).logits[0, -1], -1)
    assert torch.allclose(rollouts.target_entropy[:, 0], -(p * p.log()).sum().expand(2), atol=1e-4)
    assert torch.allclose(rollouts.cross_entropy[:, 0], -(q * p.log()).sum().expand(2), atol=1e-4)


def test_greedy_rollouts_record_the_one_hot_limits_the_greedy_verifier_decides_by(feature_pair):
    # At T = 0 a hand-over costs the target's log-prob of its own argmax minus that of the draft's.
    prompt, head = [1, 5, 6, 7], new_head(feature_pair, hidden_size=8, w_init=0.5)
    rollouts = sample_rollouts(feature_pair, head, [prompt] * 2, 24, 0.0, torch.Generator().manual_seed(0))
    assert rollouts.outputs[0] == rollouts.outputs[1]  # greedy: a prompt's rollouts are one
    mask = rollouts.mask[0] > 0
    tv, h, ce = rollouts.tv[0][mask], rollouts.target_entropy[0][mask], rollouts.cross_entropy[0][mask]
    assert set(tv.tolist()) == {0.0, 1.0}  # the argmaxes agree at some positions and not at others
    assert torch.allclose(h[tv == 0], ce[tv == 0]) and bool((ce[tv == 1] > h[tv == 1]).all())
    _, events = generate(
        feature_pair, prompt, mode="dynamic", head=head, n_draft=4, max_new_tokens=24, temperature=0.0
    )
    decided = [e for e in events if e.kind in ("accepted", "resampled")]
    # the emitted token is the draft's where a differing draft was kept, else the target's own argmax
    nll = torch.tensor([-math.log(e.p) for e in decided])
    kept_draft = torch.tensor([e.kind == "accepted" for e in decided]) & (tv == 1)
    assert torch.allclose(torch.where(kept_draft, ce, h), nll, atol=1e-4)
    # and a differing draft token was kept exactly where w_t lay below the position's greedy limit
    with torch.no_grad():
        w = head(rollouts.target_hidden, rollouts.draft_hidden)[0][mask]
    below = w < rollouts.greedy_limit[0][mask]
    assert (
        torch.equal(below[tv == 1], kept_draft[tv == 1])
        and bool(kept_draft.any())
        and not bool(kept_draft[tv == 1].all())
    )


def test_a_greedy_head_reads_in_training_the_p_q_terms_decoding_gives_it(feature_pair):
    # At T = 0 the recorded terms are the point-mass forms (margin, argmaxes differ, −log max p); a head
    # that reads them must get the same w_t from the record as from the decoder at every decided position.
    from diversed_demo.training.objective import head_weights

    torch.manual_seed(3)
    head = new_head(feature_pair, hidden_size=8, w_init=0.5, pq_features=True)
    with torch.no_grad():
        head.mlp[-1].weight.normal_(0, 3.0)  # w_t spread by the terms
    prompt = [1, 5, 6, 7]
    rollouts = sample_rollouts(feature_pair, head, [prompt] * 2, 24, 0.0, torch.Generator().manual_seed(0))
    _, events = generate(
        feature_pair, prompt, mode="dynamic", head=head, n_draft=4, max_new_tokens=24, temperature=0.0
    )
    decided = [e.w for e in events if e.kind in ("accepted", "resampled")]
    with torch.no_grad():
        w = head_weights(head, rollouts, lam=1.0)[0][rollouts.mask[0] > 0]
    assert len(decided) > 4 and w.tolist() == pytest.approx(decided, abs=1e-5)
    assert float(w.std()) > 0.05  # the terms move w_t: the check is not of a constant


def test_the_greedy_limit_is_where_the_ensembles_argmax_leaves_the_drafts_token():
    from diversed_demo.training.rollouts import greedy_limit

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(300, 12, generator=g), -1)
    q = torch.softmax(3 * torch.randn(300, 12, generator=g), -1)
    x = q.argmax(-1)
    limit = greedy_limit(p, q, x)
    argmax_at = lambda w: (w[:, None] * p + (1 - w[:, None]) * q).argmax(-1)  # noqa: E731
    assert torch.equal(argmax_at((limit - 1e-4).clamp_min(0)), x)
    moved = limit < 1
    assert bool(moved.any()) and bool((argmax_at(limit + 1e-4)[moved] != x[moved]).all())
    assert torch.equal(limit == 1, p.argmax(-1) == x)  # no limit where the target agrees


def test_a_greedy_head_trains_from_its_warm_start(pair, tmp_path):
    result = run_training(
        pair,
        tmp_path,
        lam=1.0,
        steps=2,
        temperature=0.0,
        warm_start_prompts=4,
        warm_start_steps=20,
        target_acceptance=0.8,
        dense_fidelity=1.0,
    )
    head = load_head(result.path, pair)
    assert (
        head.meta["training"]["temperature"] == 0.0 and head.meta["warm_start"]["held_back"]["positions"] > 0
    )
    assert head.reads_pq  # greedy heads read the p/q terms' point-mass forms too
    assert all(r["reward"] == r["reward"] for r in result.history)  # identical rollouts: no NaN advantages


@pytest.mark.parametrize("kind", ["restricted", "feature"])
def test_a_draft_with_no_mass_outside_its_vocabulary_gives_finite_losses(kind, restricted_pair, feature_pair):
    # q = 0 outside the draft's vocabulary: a log q there (a reverse KL, q·log q) would be 0·(−inf) = NaN.
    pair = restricted_pair if kind == "restricted" else feature_pair
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8)
    rollouts = sample_rollouts(pair, head, [[1, 9, 10, 11]] * 3, 12, 1.0, torch.Generator().manual_seed(0))
    for name in ("target_prob", "draft_prob", "tv", "target_entropy", "cross_entropy"):
        assert torch.isfinite(getattr(rollouts, name)).all(), name
    loss, acceptance, _ = head_loss(
        head, rollouts, torch.tensor([1.0, -1.0, 0.0]), lam=1.0, dense_fidelity=1.0
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(acceptance)
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())


def test_acceptance_term_raises_acceptance(pair):
    """With no reward signal, gradient steps on the loss must lower w and so raise 1 − w·TV."""
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8, w_init=0.8)
    rollouts = fake_rollouts(4, 6, tv=0.5)
    opt = torch.optim.SGD(head.parameters(), lr=0.5)
    _, before, w_before = head_loss(head, rollouts, torch.zeros(4), lam=1.0)
    for _ in range(20):
        opt.zero_grad()
        head_loss(head, rollouts, torch.zeros(4), lam=1.0)[0].backward()
        opt.step()
    _, after, w_after = head_loss(head, rollouts, torch.zeros(4), lam=1.0)
    assert after > before and w_after < w_before


def test_group_advantages_are_centred_per_prompt():
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0]), 3)
    assert torch.allclose(adv.view(2, 3).sum(1), torch.zeros(2), atol=1e-5)
    assert adv[2] > adv[0] and adv[5] > adv[3]


def run_training(pair, tmp_path, lam, steps=12, callback=None, should_stop=None, lr=0.05, **kwargs):
    config = HeadTrainConfig(
        task="general",
        steps=steps,
        prompts_per_step=2,
        rollouts_per_prompt=4,
        max_new_tokens=8,
        lam=lam,
        lr=lr,
        warmup_steps=1,
        hidden_size=8,
        w_init=0.5,
        seed=0,
        out=str(tmp_path / f"h{lam}.safetensors"),
        run_dir=str(tmp_path / f"run{lam}"),
        **kwargs,
    )
    return train_head(pair, config, callback=callback, should_stop=should_stop, progress=False)


def test_training_moves_w_the_way_the_reward_favours(pair, tmp_path):
    # Fidelity rewards target-like outputs: with no acceptance pressure, REINFORCE alone (no dense term)
    # must raise w towards the target.
    toward_target = run_training(pair, tmp_path, lam=0.0, dense_fidelity=0.0)
    # A strong acceptance term must pull w down instead.
    toward_speed = run_training(pair, tmp_path, lam=5.0, dense_fidelity=0.0)
    first = toward_target.history[0]["mean_w"]
    assert toward_target.history[-1]["mean_w"] > first + 0.02
    assert toward_speed.history[-1]["mean_w"] < first - 0.02
    assert toward_speed.history[-1]["acceptance"] > toward_speed.history[0]["acceptance"]
    assert load_head(toward_target.path, pair).meta["task"] == "general"


@pytest.mark.parametrize("w_init", [0.2, 0.9])
def test_acceptance_penalty_pulls_the_mean_acceptance_to_its_target_from_either_side(pair, w_init):
    # TV 0.5: acceptance 1 − w/2 starts at 0.9 (w 0.2) or 0.55 (w 0.9); the target 0.75 lies between.
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8, w_init=w_init)
    rollouts = fake_rollouts(4, 6, tv=0.5)
    opt = torch.optim.SGD(head.parameters(), lr=0.5)
    settings = dict(lam=0.0, target_acceptance=0.75, penalty=20.0)
    before = head_loss(head, rollouts, torch.zeros(4), **settings)[1].item()
    for _ in range(30):
        opt.zero_grad()
        head_loss(head, rollouts, torch.zeros(4), **settings)[0].backward()
        opt.step()
    after = head_loss(head, rollouts, torch.zeros(4), **settings)[1].item()
    assert abs(after - 0.75) < abs(before - 0.75) / 3


def test_target_acceptance_moves_lam_against_the_gap_and_survives_resume(pair, tmp_path):
    settings = dict(lam=3.0, lr=0.01, dense_fidelity=1.0, target_acceptance=0.4)
    records = []
    cancelled = run_training(
        pair, tmp_path, callback=records.append, should_stop=lambda: len(records) >= 5, **settings
    )
    assert cancelled.cancelled
    history = run_training(pair, tmp_path, **settings).history
    assert [r["step"] for r in history] == list(range(1, 13))
    for r in history:  # λ falls while acceptance is above the target (to 0 at most) and rises while below
        if r["acceptance"] > 0.4:
            assert r["next_lam"] < r["lam"] or r["next_lam"] == 0
        else:
            assert r["next_lam"] > r["lam"]
    assert all(
        after["lam"] == before["next_lam"] for before, after in zip(history, history[1:])
    )  # across the resume too
    assert {r["next_lam"] > r["lam"] for r in history} == {True, False}


def test_cancel_keeps_a_checkpoint_and_resume_continues(pair, tmp_path):
    records = []
    config = HeadTrainConfig(
        task="general",
        steps=6,
        prompts_per_step=1,
        rollouts_per_prompt=2,
        max_new_tokens=4,
        hidden_size=8,
        out=str(tmp_path / "c.safetensors"),
        run_dir=str(tmp_path / "crun"),
    )
    result = train_head(
        pair, config, callback=records.append, should_stop=lambda: len(records) >= 3, progress=False
    )
    assert result.cancelled and result.path is None and result.checkpoint.exists()
    assert not (tmp_path / "c.safetensors").exists()
    resumed = train_head(pair, config, callback=records.append, progress=False)
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert resumed.path.exists()


def test_bad_training_input_is_refused(pair, tmp_path):
    with pytest.raises(ValueError, match="rollouts_per_prompt"):
        train_head(pair, HeadTrainConfig(rollouts_per_prompt=1), progress=False)
    with pytest.raises(ValueError, match="unknown task"):
        train_head(pair, HeadTrainConfig(task="poetry"), progress=False)
    with pytest.raises(ValueError, match="target_acceptance"):
        train_head(pair, HeadTrainConfig(target_acceptance=1.5), progress=False)
    with pytest.raises(ValueError, match="warm_start_hidden_dropout"):
        train_head(pair, HeadTrainConfig(warm_start_hidden_dropout=1.0), progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hello"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        train_head(pair, HeadTrainConfig(prompts_path=str(bad)), progress=False)


def test_list_heads_finds_user_heads_for_this_pair_only(pair, heads_dir):
    save_head(new_head(pair), heads_dir / "mine.safetensors")
    save_head(new_head(tiny_pair(draft=tiny_model(98, 1))), heads_dir / "theirs.safetensors")
    names = list_heads(pair)
    assert "mine" in names and "theirs" not in names
    assert load_head("mine", pair).config["target_hidden"] == 32


def test_a_head_serves_its_pair_in_another_dtype(pair, tmp_path):
    path = save_head(new_head(pair, hidden_size=8), tmp_path / "fp32.safetensors")
    half = tiny_pair()
    half.target.to(torch.bfloat16)
    half.draft.to(torch.bfloat16)
    head = load_head(path, half)
    summary, _ = generate(half, "the cat sat", mode="dynamic", head=head, n_draft=2, max_new_tokens=6)
    assert summary.new_tokens >= 1 and summary.mean_w is not None


@pytest.mark.parametrize("task", ["general", "summarization", "math", "code"])
def test_cli_defaults_are_the_tasks_own_and_explicit_flags_win(task):
    """`train --task <task>` takes the task's own defaults (TASK_DEFAULTS) for what it does not name, and a
    flag it names wins. (That docs/training.md's recipe reproduces each shipped head's card:
    tests/docs/test_docs.py.)"""
    import argparse

    from diversed_demo.cli.train import add_train_arguments
    from diversed_demo.training.config import TASK_DEFAULTS

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    fields = HeadTrainConfig.__dataclass_fields__

    def config(*argv):
        return HeadTrainConfig(
            **{k: v for k, v in vars(parser.parse_args(list(argv))).items() if k in fields}
        )

    made = config("--task", task)
    for key, value in TASK_DEFAULTS.get(task, TASK_DEFAULTS["*"]).items():
        assert getattr(made, key) == value, key
    assert config("--task", task, "--lam", "0.7").lam == 0.7
    assert config("--task", task, "--warm-start-hidden-dropout", "0.5").warm_start_hidden_dropout == 0.5


def test_suggested_lam_quartiles_split_the_positions_where_the_dense_optimum_flips(pair):
    """At λ = the median of (CE − H)/TV, the dense term's per-token optimum (w → 1 where CE − H > λ·TV)
    keeps the target on half the verified positions and lets the draft through on the other half."""
    from diversed_demo.core.head import ConstantHead
    from diversed_demo.core.prompt import encode_prompt
    from diversed_demo.training.config import training_examples
    from diversed_demo.training.diagnostics import fidelity_cost_quartiles
    from diversed_demo.training.rollouts import sample_rollouts

    config = HeadTrainConfig(task="general", max_new_tokens=12, n_draft=3, seed=3)
    low, median, high = fidelity_cost_quartiles(pair, config, prompts=4)
    assert low <= median <= high
    generator = torch.Generator().manual_seed(config.seed)  # the same rollouts again
    flips = []
    for example in training_examples(config)[:4]:
        r = sample_rollouts(
            pair, ConstantHead(1.0), [encode_prompt(pair.tokenizer, example.prompt)], 12, 1.0, generator, 3
        )
        keep = (r.mask > 0) & (r.tv > 1e-6)
        flips.append(((r.cross_entropy - r.target_entropy) > median * r.tv)[keep])
    flips = torch.cat(flips).float()
    assert len(flips) >= 8 and abs(flips.mean().item() - 0.5) <= 1 / len(flips) + 1e-9


def positions_with_two_kinds(n=400, seed=0):
    """Positions of two kinds, half each, told apart by the hidden states: at 'costly' ones the draft's
    tokens cost the target 5 nats over its entropy, at the others 0.5; TV is 0.5 everywhere."""
    costly = (torch.arange(n) % 2 == 0)[None]
    rollouts = fake_rollouts(1, n, tv=0.5, seed=seed, cross_entropy=torch.where(costly, 6.0, 1.5))
    rollouts.target_hidden[costly] += 2.0
    return rollouts, costly[0]


def test_lam_for_acceptance_gives_the_threshold_rule_its_target():
    from diversed_demo.training.objective import lam_for_acceptance

    g = torch.Generator().manual_seed(1)
    rollouts = fake_rollouts(1, 500, tv=0.0, seed=1, cross_entropy=1 + 4 * torch.rand(500, generator=g))
    rollouts.tv = 0.2 + 0.6 * torch.rand(1, 500, generator=g)
    for target in (0.6, 0.75, 0.9):
        lam = lam_for_acceptance(rollouts, target)
        w = ((rollouts.cross_entropy - rollouts.target_entropy) > lam * rollouts.tv).float()
        assert float((1 - w * rollouts.tv).mean()) == pytest.approx(target, abs=0.01)
    with pytest.raises(ValueError, match="out of reach"):
        lam_for_acceptance(rollouts, 0.1)  # below exact decoding's acceptance


def test_the_offline_fit_learns_which_positions_to_hand_to_the_draft(pair):
    from diversed_demo.training.diagnostics import frontier_gain, what_separates
    from diversed_demo.training.objective import lam_for_acceptance
    from diversed_demo.training.warm_start import fit_to_positions

    train, _ = positions_with_two_kinds(seed=0)
    held_back, costly = positions_with_two_kinds(seed=1)
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8, w_init=0.7)
    lam = lam_for_acceptance(train, 0.75)  # the optimum: w = 1 on the costly half, 0 on the rest
    fit_to_positions(head, train, lam, steps=150, lr=0.01)
    with torch.no_grad():
        w = head(held_back.target_hidden, held_back.draft_hidden)[0]
    assert w[costly].mean() > 0.9 and w[~costly].mean() < 0.1
    figures = frontier_gain(w, held_back)
    assert figures["w_std"] > 0.4 and figures["acceptance"] == pytest.approx(0.75, abs=0.03)
    # at the same acceptance a static w pays (5 − 0.5)/2 nats on half the positions more than it must
    assert figures["fidelity"] - figures["static_fidelity"] > 0.9 * (
        figures["oracle_fidelity"] - figures["static_fidelity"]
    )
    assert figures["oracle_fidelity"] - figures["static_fidelity"] > 0.5
    separates = what_separates(w, held_back, pair.tokenizer)
    assert separates["spearman_w_vs"]["fidelity_cost"] > 0.8  # ranks tied within a kind: at most √0.75
    assert separates["spearman_w_vs"]["tv"] is None  # TV is the same everywhere: it tells nothing
    assert sum(k["positions"] for k in separates["mean_w_by_token"].values()) == len(w)


def test_a_head_that_reads_the_pq_terms_keeps_the_optimum_where_the_hidden_states_tell_nothing(pair):
    # The cost CE − H and TV vary per position while the hidden states are noise: only the p/q terms tell
    # the optimum's positions apart, so only the head that reads them keeps its held-out gain.
    from diversed_demo.training.diagnostics import frontier_gain
    from diversed_demo.training.objective import head_weights, lam_for_acceptance
    from diversed_demo.training.warm_start import fit_to_positions

    def positions(seed):
        g = torch.Generator().manual_seed(seed)
        cost = 1 + 6 * torch.rand(3000, generator=g)
        rollouts = fake_rollouts(1, 3000, tv=0.0, seed=seed, cross_entropy=cost)
        rollouts.tv = 0.1 + 0.8 * torch.rand(1, 3000, generator=g)
        return rollouts

    train, held_back = positions(0), positions(1)
    lam = lam_for_acceptance(train, 0.7)
    shares = {}
    for reads_pq in (True, False):
        torch.manual_seed(0)
        head = new_head(pair, hidden_size=16, w_init=0.7, pq_features=reads_pq)
        fit_to_positions(head, train, lam, steps=300, lr=0.03)
        with torch.no_grad():
            shares[reads_pq] = frontier_gain(head_weights(head, held_back, lam, hard=True)[0], held_back)
    assert shares[True]["share_of_optimum"] > 0.8
    assert shares[False]["share_of_optimum"] < 0.3
    assert shares[True]["oracle_fidelity"] - shares[True]["static_fidelity"] > 0.2
    # With the hidden states' entries dropped at each step the head still learns what the terms say.
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=16, w_init=0.7, pq_features=True)
    fit_to_positions(head, train, lam, steps=300, lr=0.03, hidden_dropout=0.5)
    with torch.no_grad():
        dropped = frontier_gain(head_weights(head, held_back, lam, hard=True)[0], held_back)
    assert dropped["share_of_optimum"] > 0.8
    seen = []  # and each step sees about that share of the hidden entries zeroed, never the terms
    head.register_forward_pre_hook(lambda module, args: seen.append((args[0].eq(0).float().mean(), args[2])))
    fit_to_positions(head, train, lam, steps=3, lr=0.03, hidden_dropout=0.5)
    assert all(abs(float(zeros) - 0.5) < 0.02 and bool(terms.ne(0).any()) for zeros, terms in seen)


@pytest.fixture
def few_positions(monkeypatch):
    """A small prompt pool, recorded a few prompts at a time."""
    from diversed_demo.training import positions

    prompts = [
        f"the {a} {b} sat on the mat" for a in ("cat", "dog", "red", "big") for b in ("one", "two", "a")
    ]
    monkeypatch.setattr(positions, "task_prompts", lambda task: prompts)
    monkeypatch.setattr(positions, "CHUNK_PROMPTS", 6)


def test_a_warm_start_at_scale_fits_on_recorded_positions_and_reports_held_out_prompts(
    feature_pair, tmp_path, few_positions
):
    settings = dict(warm_start_positions=60, warm_start_steps=30, target_acceptance=0.7, dense_fidelity=1.0)
    result = run_training(
        feature_pair, tmp_path, lam=1.0, steps=1, positions_dir=str(tmp_path / "positions"), **settings
    )
    warm = load_head(result.path, feature_pair).meta["warm_start"]
    assert warm["positions"]["fit"] >= 60 and warm["positions"]["held_out"] > 0
    assert warm["positions"]["folder"] == "general-T1-N4"
    assert warm["held_back"]["positions"] == warm["positions"]["held_out"]
    assert warm["fit"]["positions"] == warm["positions"]["fit"] and "share_of_optimum" in warm["held_back"]
    head = load_head(result.path, feature_pair)
    assert head.reads_pq  # sampled ensemble heads read the p/q terms
    (final,) = head.meta["held_out"]  # the trained head, measured on the same held-out positions
    assert final["positions"] == warm["positions"]["held_out"] and final["lam"] == warm["lam"]


def test_a_cost_head_at_scale_is_measured_at_its_default_and_at_each_lam(
    feature_pair, tmp_path, few_positions
):
    from diversed_demo.core.head import COST_HEAD_LAM

    result = run_training(
        feature_pair, tmp_path, lam=1.0, steps=1, kind="cost", lams=(0.5, 8.0), warm_start_positions=40,
        positions_dir=str(tmp_path / "positions"),
    )  # fmt: skip
    head = load_head(result.path, feature_pair)
    warm = head.meta["warm_start"]
    # untrained, it is the rule: its share is 1 up to the few positions' discreteness (the optimum is met at
    # the head's acceptance only to within a position)
    assert warm["final_loss"] is None and warm["held_back"]["share_of_optimum"] > 0.9
    assert [f["lam"] for f in head.meta["held_out"]] == [COST_HEAD_LAM, 0.5, 8.0]
    assert all(f["positions"] == warm["positions"]["held_out"] for f in head.meta["held_out"])


def test_the_greedy_fit_hands_over_by_cost_where_static_w_cannot(pair):
    # Greedy positions whose draft token always differs (TV 1); the greedy limits are random, so static w
    # keeps the draft's token where the limit is high, whatever it costs. Costly positions are told apart
    # by the hidden states: the fitted head must go above the limit there and below it elsewhere.
    from diversed_demo.training.diagnostics import frontier_gain
    from diversed_demo.training.objective import lam_for_acceptance
    from diversed_demo.training.warm_start import fit_to_positions

    def greedy_positions(seed):
        rollouts, costly = positions_with_two_kinds(seed=seed)
        rollouts.tv = torch.ones_like(rollouts.tv)
        rollouts.greedy_limit = 0.2 + 0.6 * torch.rand(
            rollouts.tv.shape, generator=torch.Generator().manual_seed(seed)
        )
        return rollouts, costly

    train, _ = greedy_positions(0)
    held_back, costly = greedy_positions(1)
    torch.manual_seed(0)
    head = new_head(pair, hidden_size=8, w_init=0.5)
    lam = lam_for_acceptance(train, 0.5)  # the optimum: keep the costly half for the target
    fit_to_positions(head, train, lam, steps=200, lr=0.01)
    with torch.no_grad():
        w = head(held_back.target_hidden, held_back.draft_hidden)[0]
    limit = held_back.greedy_limit[0]
    assert bool((w[costly] >= limit[costly]).float().mean() > 0.85) and bool(
        (w[~costly] < limit[~costly]).float().mean() > 0.85
    )
    figures = frontier_gain(w, held_back)
    assert figures["acceptance"] == pytest.approx(0.5, abs=0.07)
    # static w at that acceptance hands over the high-limit half, costly or not: (5 − 0.5)/2 nats dearer
    assert figures["fidelity"] - figures["static_fidelity"] > 0.9 * (
        figures["oracle_fidelity"] - figures["static_fidelity"]
    )
    assert figures["oracle_fidelity"] - figures["static_fidelity"] > 0.5


def test_warm_start_runs_once_and_sets_lam_for_the_target(pair, tmp_path):
    records = []
    settings = dict(warm_start_prompts=4, warm_start_steps=20, target_acceptance=0.8, dense_fidelity=1.0)
    cancelled = run_training(
        pair,
        tmp_path,
        lam=1.0,
        steps=4,
        callback=records.append,
        should_stop=lambda: len(records) >= 2,
        **settings,
    )
    checkpoint = torch.load(cancelled.checkpoint, weights_only=False)
    warm = checkpoint["warm_start"]
    assert warm["prompts"] == 4 and warm["fit"]["positions"] > 0 and warm["held_back"]["positions"] > 0
    assert set(warm["held_back"]["separates"]) == {"spearman_w_vs", "mean_w_by_token"}
    assert [r["lam"] for r in records] == [warm["lam"]] * 2  # λ from the recorded positions, then fixed
    resumed = run_training(pair, tmp_path, lam=1.0, steps=4, callback=records.append, **settings)
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4] and {r["lam"] for r in records} == {
        warm["lam"]
    }
    assert load_head(resumed.path, pair).meta["warm_start"] == warm  # the resume did not decode again


def test_lam_is_never_negative_even_where_the_draft_beats_the_target_on_its_own_tokens():
    from diversed_demo.training.objective import lam_for_acceptance

    rollouts = fake_rollouts(1, 50, tv=0.3, target_entropy=2.0, cross_entropy=1.0)  # CE < H everywhere
    assert lam_for_acceptance(rollouts, 0.7) == 0.0


@pytest.mark.parametrize(
    "text, kind",
    [
        (" the", "word start"),
        ("ing", "word piece"),
        (" 42", "number"),
        ("3.5", "number"),
        (",", "punctuation"),
        (" (", "punctuation"),
        ("\n", "whitespace"),
        ("  ", "whitespace"),
    ],
)
def test_tokens_are_told_apart_by_kind(text, kind):
    from diversed_demo.training.diagnostics import token_kind

    assert token_kind(text) == kind


def test_a_cost_head_starts_as_the_rule_trains_along_its_lams_and_round_trips(pair, tmp_path):
    """A cost head's warm start measures the rule it starts as (no fit: it holds the whole per-token
    optimum on held-back positions); RL then visits each λ of `lams` in turn and moves the correction; the
    saved file loads as a CostHead that serves the dial's λ in decoding."""
    from diversed_demo.core.head import CostHead

    records = []
    result = run_training(
        pair,
        tmp_path,
        lam=1.0,
        steps=6,
        callback=records.append,
        kind="cost",
        lams=(0.5, 4.0),
        warm_start_prompts=4,
        dense_fidelity=0.0,  # the reward alone: the correction has to move
    )
    warm = load_head(result.path, pair).meta["warm_start"]
    held_back = warm["held_back"]
    assert held_back["fidelity"] == pytest.approx(held_back["oracle_fidelity"], abs=1e-5)
    assert [r["lam"] for r in records] == [0.5, 4.0] * 3
    loaded = load_head(result.path, pair)
    assert isinstance(loaded, CostHead) and loaded.mlp[-1].weight.abs().sum() > 0
    summary, events = generate(pair, "the cat sat", mode="dynamic", head=loaded, lam=4.0, n_draft=3, seed=1)
    drafted = [e for e in events if e.kind in ("accepted", "rejected")]
    assert drafted and all(e.w in (0.0, 1.0) for e in drafted)
    with pytest.raises(ValueError, match="sampled decoding"):
        run_training(pair, tmp_path, lam=1.0, kind="cost", temperature=0.0)
