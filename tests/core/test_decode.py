"""The decoder on tiny random Llama pairs: exactness, the law of emitted tokens, KV rollback, bad input."""

import collections
import contextlib

import pytest
import torch
from conftest import PROMPTS
from references import reference_step
from stats import chi_square_pvalue
from tiny import save_tiny_pair, tiny_pair, tiny_tokenizer

from diversed_demo.core import decode, draft, stats
from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.cost_rule import cost_weights, position_costs
from diversed_demo.core.events import KINDS, TokenEvent, output_events
from diversed_demo.core.generate import generate, speculative_generate
from diversed_demo.core.head import ConstantHead, CostHead, EnsembleHead, pq_terms
from diversed_demo.core.verify import ensemble_probs, total_variation
from diversed_demo.models.eagle import Eagle3Draft, target_features
from diversed_demo.models.loading import check_tokenizers, load_models
from diversed_demo.models.pair import PairError


def hf_generate(pair, prompt, n_draft, max_new_tokens, **kwargs):
    pair.draft.generation_config.num_assistant_tokens = n_draft
    pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
    pair.draft.generation_config.assistant_confidence_threshold = 0.0
    ids = torch.tensor([prompt])
    out = pair.target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        assistant_model=pair.draft,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_exact_sd_equals_greedy_target_and_transformers(pair, prompt):
    reference, _ = generate(pair, prompt, mode="ar", max_new_tokens=24, temperature=0)
    assert reference.new_tokens > 0
    for n_draft in range(1, 9):
        summary, _ = generate(pair, prompt, mode="exact", n_draft=n_draft, max_new_tokens=24, temperature=0)
        assert summary.token_ids == reference.token_ids, n_draft
    assert hf_generate(pair, prompt, 4, 24) == reference.token_ids


def test_greedy_exact_feature_draft_equals_greedy_target(feature_pair):
    for prompt in PROMPTS:
        reference, _ = generate(feature_pair, prompt, mode="ar", max_new_tokens=24, temperature=0)
        for n_draft in (1, 2, 3, 5, 8):
            summary, _ = generate(
                feature_pair, prompt, mode="exact", n_draft=n_draft, max_new_tokens=24, temperature=0
            )
            assert summary.token_ids == reference.token_ids, n_draft


@pytest.mark.parametrize("tree", ["on", "3,3,4,7", "2,1,5,6"])
def test_greedy_exact_sd_on_trees_equals_greedy_target(any_pair, tree):
    """Trees of any shape, drafted by either kind of draft: greedy exact SD is still the target's text, and a
    tree of width 1 decodes as the chain of its depth."""
    for prompt in PROMPTS:
        reference, _ = generate(any_pair, prompt, mode="ar", max_new_tokens=24, temperature=0)
        for n_draft in (4, "auto"):
            summary, events = generate(
                any_pair, prompt, mode="exact", n_draft=n_draft, max_new_tokens=24, temperature=0, tree=tree
            )
            assert summary.token_ids == reference.token_ids, (tree, n_draft)
        chain, _ = generate(any_pair, prompt, mode="static", n_draft=3, max_new_tokens=24, temperature=0)
        as_tree, _ = generate(
            any_pair, prompt, mode="static", n_draft=3, max_new_tokens=24, temperature=0, tree="1,1,3,3"
        )
        assert as_tree.token_ids == chain.token_ids


def test_auto_drafts_trees_where_the_runtime_chose_them(feature_pair, monkeypatch):
    prompt, settings = PROMPTS[1], dict(mode="exact", max_new_tokens=16, temperature=0, n_draft=3)
    for drafts, trees in (("chains", False), ("trees", True)):
        monkeypatch.setattr(feature_pair.runtime, "drafts", drafts)
        _, events = generate(feature_pair, prompt, tree="auto", **settings)
        assert any(event.tree for event in events) == trees
    _, events = generate(
        feature_pair, prompt, tree="off", **settings
    )  # off: chains whatever the runtime says
    assert not any(event.tree for event in events)


@pytest.mark.parametrize("w", [0.3, 0.7])
@pytest.mark.parametrize("n_draft", [1, 3, 5])
def test_greedy_static_equals_transformers_ensemble(pair, w, n_draft):
    for prompt in PROMPTS:
        summary, _ = generate(
            pair, prompt, mode="static", ensemble_weight=w, n_draft=n_draft, max_new_tokens=20, temperature=0
        )
        theirs = hf_generate(pair, prompt, n_draft, 20, assistant_ensemble_weight=w)
        assert summary.token_ids == theirs


def test_static_w_changes_greedy_output_and_raises_acceptance(pair):
    exact, _ = generate(pair, PROMPTS[1], mode="exact", n_draft=4, max_new_tokens=30, temperature=0)
    relaxed, _ = generate(
        pair, PROMPTS[1], mode="static", ensemble_weight=0.1, n_draft=4, max_new_tokens=30, temperature=0
    )
    assert relaxed.acceptance_rate > exact.acceptance_rate


class TiltedHead:
    """A deterministic, input-dependent head: w_t varies with the hidden states."""

    def __init__(self, hidden):
        g = torch.Generator().manual_seed(7)
        self.weight = torch.randn(2 * hidden, generator=g)

    def ensemble_weight(self, target_hidden, draft_hidden):
        return torch.sigmoid(torch.cat([target_hidden, draft_hidden], -1) @ self.weight)


def cost_head(pair, scale: float = 3.0) -> CostHead:
    """A CostHead whose correction varies with the hidden states (a seeded random last layer)."""
    torch.manual_seed(11)
    hidden = pair.target.config.hidden_size  # the tiny drafts share it (as TiltedHead assumes)
    head = CostHead(hidden, hidden, hidden_size=8)
    with torch.no_grad():
        head.mlp[-1].weight.normal_(0, scale)
    return head.eval()


def pq_head(pair) -> EnsembleHead:
    """An EnsembleHead that reads the p/q terms, with weights large enough that w_t varies with them."""
    torch.manual_seed(13)
    hidden = pair.target.config.hidden_size
    head = EnsembleHead(hidden, hidden, hidden_size=8, pq_features=True)
    with torch.no_grad():
        head.mlp[-1].weight.normal_(0, 3.0)
    return head.eval()


def next_distributions(pair, context, w_or_head):
    """Exact p, q and nu for the token after `context`, and w there."""
    p, q, t, d = reference_step(pair, context)
    if isinstance(w_or_head, tuple):  # a CostHead and its λ
        head, lam = w_or_head
        w = head.weights(p[None], q[None], lam, t[None], d[None])[0]
    elif getattr(w_or_head, "reads_pq", False):  # a head that reads the rule's terms too
        w = w_or_head.ensemble_weight(t[None], d[None], pq_terms(*position_costs(p[None], q[None])))[0]
    elif hasattr(w_or_head, "ensemble_weight"):  # a head
        w = w_or_head.ensemble_weight(t[None], d[None])[0]
    elif callable(w_or_head):  # a rule from p and q
        w = w_or_head(p, q)
    else:
        w = w_or_head
    return p, q, ensemble_probs(p, q, w), float(w)


def first_two_law(pair, prompt, w_or_head, eos):
    """Law of the first two emitted tokens (EOS ends the sequence), and the mean acceptance probability
    of the first drafted token. A standalone draft drafts from the first token on; a feature draft waits
    for the target's pass over the prompt, so its first token is the target's own."""
    feature = isinstance(pair.draft, Eagle3Draft)
    p1, q1, nu1, w1 = next_distributions(pair, prompt, w_or_head)
    first = p1 if feature else nu1
    law, alpha = {}, 0.0 if feature else 1 - w1 * float(total_variation(p1, q1))
    for x1, prob1 in enumerate(first.tolist()):
        if x1 == eos:
            law[(x1,)] = prob1
            continue
        p2, q2, nu2, w2 = next_distributions(pair, prompt + [x1], w_or_head)
        if feature:
            alpha += prob1 * (1 - w2 * float(total_variation(p2, q2)))
        for x2, prob2 in enumerate(nu2.tolist()):
            law[(x1, x2)] = prob1 * prob2
    return law, alpha


def first_two(pair, prompt, **settings) -> tuple[tuple[int, ...], str | None]:
    """A decode's first two emitted tokens (one where an EOS came first) and the fate of its first draft
    ("accepted", "rejected" or None), the decode stopped there as a visitor's Stop stops it: what comes
    later cannot change them, and the law tests draw thousands."""
    emitted, first_draft = [], None
    with contextlib.closing(speculative_generate(pair, prompt, **settings)) as stream:
        for event in stream:
            if not isinstance(event, TokenEvent):  # the summary: the decode ended first
                break
            if first_draft is None and event.kind in ("accepted", "rejected"):
                first_draft = event.kind
            if event.kind != "rejected":
                emitted.append(event.token_id)
            if len(emitted) == 2:
                break
    return tuple(emitted), first_draft


TREE = "3,3,2,6"  # a fixed tree: three children at the root, each expanded (its q known: ν past it)


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["off", TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("mode", ["exact", "static", "cost", "dynamic", "cost-head", "pq-head"])
def test_sampled_emitted_tokens_follow_nu_and_acceptance_matches_theory(any_pair, mode, tree):
    """The first two tokens follow ν, drafted as a chain or a tree. A chain's first draft is kept with
    probability 1 − w·TV; a tree's first position at least as often (its first child alone is, and the
    others are tried after it)."""
    pair, prompt, samples = any_pair, PROMPTS[0], 3000
    if mode == "exact":
        w_or_head, kwargs = 1.0, {}
    elif mode == "static":
        w_or_head, kwargs = 0.4, {"ensemble_weight": 0.4}
    elif mode == "cost":  # a λ where both kinds of tiny draft meet positions of w_t = 0 and of w_t = 1
        w_or_head, kwargs = (lambda p, q: cost_weights(p[None], q[None], 5.0)[0]), {"lam": 5.0}
    elif mode == "cost-head":  # a trained-looking correction: w_t departs from the rule's
        head = cost_head(pair)
        w_or_head, kwargs, mode = (head, 5.0), {"head": head, "lam": 5.0}, "dynamic"
    elif mode == "pq-head":
        w_or_head, mode = pq_head(pair), "dynamic"
        kwargs = {"head": w_or_head}
    else:
        w_or_head = TiltedHead(pair.target.config.hidden_size)
        kwargs = {"head": w_or_head}
    law, alpha = first_two_law(pair, prompt, w_or_head, eos=2)
    counts, first_accepted, first_drafted = collections.Counter(), 0, 0
    for seed in range(samples):
        tokens, first_draft = first_two(
            pair, prompt, mode=mode, n_draft=2, max_new_tokens=3, seed=seed, tree=tree, **kwargs
        )
        counts[tokens] += 1
        first_drafted += first_draft is not None
        first_accepted += first_draft == "accepted"
    assert chi_square_pvalue(counts, law) > 0.001
    # first-draft acceptance == 1 − w·TV(p, q) (averaged over the first token for a feature draft)
    if isinstance(pair.draft, Eagle3Draft):
        alpha *= first_drafted / samples  # drafts start after a first token that was not EOS
    se = (alpha * (1 - alpha) / samples) ** 0.5
    if tree == "off":
        assert abs(first_accepted / samples - alpha) < 4 * se
    else:
        assert first_accepted / samples > alpha - 4 * se


def test_restricted_draft_has_zero_mass_outside_and_same_logits_inside(restricted_pair):
    full = tiny_pair().draft
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        restricted_logits = restricted_pair.draft(ids).logits[0]
        full_logits = full(ids).logits[0]
    inside = torch.zeros(full_logits.shape[-1], dtype=torch.bool)
    inside[list(range(0, 40, 2))] = True
    assert torch.isneginf(restricted_logits[:, ~inside]).all()
    assert torch.allclose(restricted_logits[:, inside], full_logits[:, inside], atol=1e-5)
    summary, events = generate(
        restricted_pair, PROMPTS[1], mode="static", ensemble_weight=0.5, n_draft=3, max_new_tokens=30, seed=3
    )
    assert all(inside[e.token_id] for e in events if e.kind in ("accepted", "rejected"))


@pytest.mark.slow
@pytest.mark.parametrize("mode,w", [("exact", 1.0), ("static", 0.4)])
def test_restricted_draft_keeps_the_law_of_emitted_tokens(restricted_pair, mode, w):
    # The target puts mass on tokens the draft can never propose: the residual must supply exactly that.
    prompt, samples = PROMPTS[0], 3000
    law, _ = first_two_law(restricted_pair, prompt, w, eos=2)
    counts = collections.Counter()
    for seed in range(samples):
        tokens, _ = first_two(
            restricted_pair, prompt, mode=mode, ensemble_weight=w, n_draft=2, max_new_tokens=3, seed=seed
        )
        counts[tokens] += 1
    assert chi_square_pvalue(counts, law) > 0.001


def test_restricted_draft_greedy_matches_target_and_transformers(restricted_pair):
    for prompt in PROMPTS:
        reference, _ = generate(restricted_pair, prompt, mode="ar", max_new_tokens=20, temperature=0)
        exact, _ = generate(
            restricted_pair, prompt, mode="exact", n_draft=3, max_new_tokens=20, temperature=0
        )
        assert exact.token_ids == reference.token_ids
        ours, _ = generate(
            restricted_pair,
            prompt,
            mode="static",
            ensemble_weight=0.3,
            n_draft=3,
            max_new_tokens=20,
            temperature=0,
        )
        assert ours.token_ids == hf_generate(restricted_pair, prompt, 3, 20, assistant_ensemble_weight=0.3)


class RecomputingLM(decode.CachedLM):
    """No KV cache at all: every forward recomputes the whole prefix."""

    def __init__(self, model, vocab_size, aux_layer_ids=(), rows=1, runner=None):
        super().__init__(model, vocab_size, aux_layer_ids, rows)
        self.tokens = torch.empty(0, dtype=torch.long)

    def forward(self, tokens, keep):
        new = tokens.numel()
        self.tokens = torch.cat([self.tokens, tokens.view(-1)])
        out = self.decoder(input_ids=self.tokens.view(1, -1), output_hidden_states=True)
        hidden = out.last_hidden_state[0, -keep:]
        self.lengths = [self.tokens.numel()]
        aux = target_features(out.hidden_states, self.aux_layer_ids)[0, -new:] if self.aux_layer_ids else None
        return self.lm_head(hidden)[:, : self.vocab_size], hidden, aux

    def rollback(self, length, row=0):
        self.tokens = self.tokens[:length]
        self.lengths = [self.tokens.numel()]


class RecomputingFeatureDraft(draft.FeatureDraft):
    """A feature draft without a cache: each proposal recomputes every entry from the verified features."""

    def __init__(self, model, step=None):
        super().__init__(model)
        self.all_features = None

    def observe(self, length, target_features=None):
        # each verification's features continue where the previous ones stopped
        self.all_features = (
            target_features if self.all_features is None else torch.cat([self.all_features, target_features])
        )

    def ready(self, length):
        return self.all_features is not None

    def propose(self, sequence, n, sampler, lookup=None, length=None):
        self.cache, self.length, self.pending = [], 0, self.all_features
        return super().propose(sequence, n, sampler, lookup, length)


@pytest.mark.parametrize(
    "mode,kwargs",
    [("exact", {}), ("static", {"ensemble_weight": 0.5}), ("dynamic", {"head": ConstantHead(0.3)})],
)
def test_kv_rollback_matches_full_recomputation(any_pair, monkeypatch, mode, kwargs):
    kinds = set()
    for seed in range(3):
        cached = list(
            speculative_generate(
                any_pair, PROMPTS[1], mode=mode, n_draft=4, max_new_tokens=40, seed=seed, **kwargs
            )
        )
        monkeypatch.setattr(decode, "CachedLM", RecomputingLM)
        monkeypatch.setattr(draft, "FeatureDraft", RecomputingFeatureDraft)
        monkeypatch.setattr(draft, "StandaloneDraft", RecomputingStandaloneDraft)
        fresh = list(
            speculative_generate(
                any_pair, PROMPTS[1], mode=mode, n_draft=4, max_new_tokens=40, seed=seed, **kwargs
            )
        )
        monkeypatch.undo()
        assert [(e.token_id, e.kind) for e in cached[:-1]] == [(e.token_id, e.kind) for e in fresh[:-1]]
        assert [e.p for e in cached[:-1]] == pytest.approx([e.p for e in fresh[:-1]], rel=1e-4)
        assert [e.q or 0 for e in cached[:-1]] == pytest.approx([e.q or 0 for e in fresh[:-1]], rel=1e-4)
        kinds.update(e.kind for e in cached[:-1])
    assert "rejected" in kinds  # the rollback path was exercised
    assert mode == "exact" or "accepted" in kinds  # (exact SD between random tiny models rarely accepts)


class RecomputingStandaloneDraft(draft.StandaloneDraft):
    def __init__(self, model, vocab_size, runner=None):
        self.lm = RecomputingLM(model, vocab_size)


def test_events_and_summary_are_consistent(pair):
    summary, events = generate(
        pair, PROMPTS[2], mode="static", ensemble_weight=0.5, n_draft=3, max_new_tokens=50
    )
    emitted = [e for e in events if e.kind != "rejected"]
    assert [e.token_id for e in emitted] == summary.token_ids
    assert summary.new_tokens == len(emitted) <= 50
    drafted_decided = sum(e.kind in ("accepted", "rejected") for e in events)
    assert summary.accepted == sum(e.kind == "accepted" for e in events)
    assert summary.accepted <= drafted_decided <= summary.drafted
    assert summary.tau == pytest.approx(summary.new_tokens / summary.target_passes)
    # A live tally of the event stream counts what the Summary counts: one accounting for both.
    tally = stats.Counts(wall_time_s=summary.wall_time_s)
    for e in events:
        tally.add_event(e)
    assert tally == summary.counts and tally.rejected == sum(e.kind == "rejected" for e in events)
    assert (tally + tally).acceptance_rate == summary.acceptance_rate and (tally + tally).tau == summary.tau
    for e in events:
        assert e.kind in KINDS
        if e.kind in ("accepted", "rejected"):
            assert e.w == pytest.approx(0.5) and 0 <= e.accept_prob <= 1 and e.q > 0
    # The events' own cost is timed inside the loop (the bench prices streaming with it); the bare loop
    # has none.
    assert 0 < summary.events_s < summary.wall_time_s
    *_, bare = speculative_generate(
        pair, PROMPTS[2], mode="static", ensemble_weight=0.5, n_draft=3, max_new_tokens=50, emit_events=False
    )
    assert bare.events_s == 0 and bare.token_ids == summary.token_ids


def test_an_eos_among_accepted_drafts_ends_the_events():
    # [accepted EOS, rejected, resampled] with one output token: the rejection after the EOS is no event.
    def event(kind):
        return TokenEvent(2, "</s>", kind, step=1)

    events = [event("accepted"), event("rejected"), event("resampled")]
    assert output_events(events, 1) == events[:1]
    assert output_events(events, 2) == events
    assert output_events(events[1:], 1) == events[1:]


def test_stops_at_eos_and_max_new_tokens(pair):
    for seed in range(20):
        summary, events = generate(pair, PROMPTS[0], mode="exact", n_draft=4, max_new_tokens=7, seed=seed)
        ids = summary.token_ids
        assert len(ids) <= 7
        assert 2 not in ids[:-1]
        assert len(ids) == 7 or ids[-1] == 2


def test_ar_mode_is_target_sampling(pair):
    summary, events = generate(pair, PROMPTS[0], mode="ar", max_new_tokens=10, seed=3)
    assert all(e.kind == "ar" for e in events) and summary.acceptance_rate is None and summary.tau == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"n_draft": 0}, "n_draft"),
        ({"n_draft": 1000}, "n_draft"),
        ({"ensemble_weight": -0.1}, "ensemble weight"),
        ({"ensemble_weight": 1.5}, "ensemble weight"),
        ({"mode": "fast"}, "mode"),
        ({"mode": "dynamic"}, "head"),
        ({"temperature": -1}, "temperature"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 10_000}, "context"),
        ({"seed": 10**30}, "seed"),  # once "Overflow when unpacking long long" from torch
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_inputs_get_clear_errors(pair, kwargs, message):
    args = {"prompt": "the cat", "mode": "static", "ensemble_weight": 0.5, "n_draft": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(pair, args.pop("prompt"), **args)


def test_pair_with_different_tokenizers_is_refused(tmp_path):
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    other = tiny_tokenizer()
    other.add_tokens(["zebra"])
    other.save_pretrained(draft_dir)
    with pytest.raises(PairError, match="vocabulary size"):
        load_models(target_dir, draft_dir, "cpu")
    swapped_eos = tiny_tokenizer()
    swapped_eos.eos_token = "<pad>"
    with pytest.raises(PairError, match="eos_token_id"):
        check_tokenizers(tiny_tokenizer(), swapped_eos)
    renumbered = tiny_tokenizer()  # same tokens and size, two ids exchanged
    vocab = renumbered.get_vocab()
    vocab["cat"], vocab["dog"] = vocab["dog"], vocab["cat"]
    from tokenizers import models

    renumbered.backend_tokenizer.model = models.WordLevel(vocab=vocab, unk_token="<unk>")
    with pytest.raises(PairError, match="token '(cat|dog)' has id"):
        check_tokenizers(tiny_tokenizer(), renumbered)


def test_local_directories_load_as_a_pair(tmp_path):
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    pair = load_models(target_dir, draft_dir, "cpu")
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.num_hidden_layers == 1
    summary, _ = generate(pair, "the cat sat", mode="exact", max_new_tokens=5, temperature=0)
    assert summary.new_tokens >= 1
    with pytest.raises(PairError, match="not a model directory"):
        load_models(str(tmp_path), draft_dir, "cpu")


def run_rows(pair, prompts, seeds, mode, ensemble_weight=0.5, head=None, **kwargs):
    """Each row's steps from one batched decode: {row: [Step, …]}."""
    rows = collections.defaultdict(list)
    config = DecodeConfig(mode, ensemble_weight, head, **kwargs)
    with torch.inference_mode():
        for r, step in decode.decode_rows(pair, prompts, [config.replace(seed=seed) for seed in seeds]):
            rows[r].append(step)
    return rows


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("mode", ["exact", "static", "dynamic"])
def test_a_batch_row_decodes_as_its_sequence_would_alone(any_pair, mode, temperature):
    # Rows of different prompt lengths that stop at different steps (EOS or budget), so the batch pads
    # prompts, leaves holes where one row rejected drafts that another kept, and drops finished rows.
    kwargs = dict(
        mode=mode,
        n_draft=3,
        max_new_tokens=24,
        temperature=temperature,
        ensemble_weight=0.4,
        head=TiltedHead(any_pair.target.config.hidden_size),
    )
    prompts, seeds = PROMPTS * 2, list(range(8))
    rows = run_rows(any_pair, prompts, seeds, **kwargs)
    with torch.inference_mode():
        alone = [
            [
                step
                for _, step in decode.decode_rows(
                    any_pair, [prompts[r]], [DecodeConfig(seed=seeds[r], **kwargs)]
                )
            ]
            for r in range(8)
        ]
    for r in range(8):
        assert [s.new_ids for s in rows[r]] == [s.new_ids for s in alone[r]]
        for batched, single in zip(rows[r], alone[r]):
            assert batched.verdict.n_accepted == single.verdict.n_accepted
            assert torch.allclose(batched.verdict.target_probs, single.verdict.target_probs, atol=1e-5)
            assert torch.allclose(batched.verdict.w, single.verdict.w, atol=1e-5)
    if (mode, temperature) == (
        "static",
        1.0,
    ):  # where relaxed drafts are often kept: the paths were exercised
        assert len({len(steps) for steps in rows.values()}) > 1  # rows left the batch at different steps
        assert any(len({rows[r][i].verdict.n_accepted for r in range(8)}) > 1 for i in range(5))  # holes


def test_batched_rows_follow_nu(any_pair):
    # The law of the first two tokens over 3000 rows decoded 500 at a time, against nu computed from scratch.
    prompt, w, samples = PROMPTS[0], 0.4, 3000
    law, _ = first_two_law(any_pair, prompt, w, eos=2)
    counts = collections.Counter()
    for start in range(0, samples, 500):
        rows = run_rows(
            any_pair,
            [prompt] * 500,
            list(range(start, start + 500)),
            mode="static",
            ensemble_weight=w,
            n_draft=2,
            max_new_tokens=3,
        )
        for steps in rows.values():
            counts[tuple(sum((s.new_ids for s in steps), [])[:2])] += 1
    assert chi_square_pvalue(counts, law) > 0.001
