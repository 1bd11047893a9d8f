"""The frontier: interpolated margins, bootstrap, and a sweep on a tiny pair."""

import pytest
import torch

from diversed_demo.core.config import DecodeConfig
from diversed_demo.core.head import ConstantHead
from diversed_demo.core.stats import Counts
from diversed_demo.eval.frontier import Point, head_labels, sweep
from diversed_demo.eval.margins import frontier_margin, margins
from diversed_demo.eval.tasks import Example
from diversed_demo.models.heads import new_head


def test_margins_against_an_interpolated_frontier():
    static = [(0.2, 0.9), (0.6, 0.5)]  # acceptance, quality: a straight frontier
    better = margins(static, (0.4, 0.8))
    assert better["quality_margin"] == pytest.approx(0.1) and better["acceptance_margin"] == pytest.approx(
        0.1
    )
    worse = margins(static, (0.4, 0.6))
    assert worse["quality_margin"] < 0 and worse["acceptance_margin"] < 0
    assert margins(static, (0.9, 0.95))["quality_margin"] is None  # no extrapolation


def test_a_head_at_a_task_floor_is_not_beyond_a_flat_frontier():
    # pass@1 at its floor: every static w scores 0 (one lucky example at w = 0.5), so at the head's quality
    # w = 0 is as good and far faster; interpolating the curve by quality once called this head beyond.
    static = [(0.37, 0.0), (0.58, 0.02), (1.0, 0.0)]  # w = 1, 0.5, 0
    floor = margins(static, (0.5, 0.0))
    assert floor["acceptance_margin"] == pytest.approx(-0.5) and floor["quality_margin"] < 0


def test_the_frontier_is_the_best_static_point_at_least_as_fast():
    # quality not monotone in w (noise): w = 0.8 beats w = 0.9 although it is faster
    static = [(0.11, 0.053), (0.15, 0.035), (0.20, 0.037), (0.26, 0.027)]  # w = 1, 0.9, 0.8, 0.7
    head = margins(static, (0.15, 0.036))
    assert head["quality_margin"] == pytest.approx(0.036 - 0.037)  # w = 0.8, not w = 0.9's 0.035
    assert head["acceptance_margin"] == pytest.approx(0.15 - (0.20 + 0.06 * 0.1))  # on the w 0.8–0.7 segment


def point(label, w, acc, quality, n=20):
    counts = [Counts(new_tokens=5, target_passes=2, drafted=10, accepted=acc, wall_time_s=1.0)] * n
    return Point(label, w, counts, quality=[quality + 0.01 * (i % 3) for i in range(n)])


def test_bootstrap_reports_a_clear_win_with_small_uncertainty():
    static = [point("static:1", 1.0, 2, 0.9), point("static:0", 0.0, 6, 0.5)]
    result = frontier_margin(static, point("dynamic:h", None, 4, 0.8))
    assert result["beyond_frontier"]
    assert result["quality_margin"]["estimate"] == pytest.approx(0.1, abs=1e-6)
    assert result["quality_margin"]["p_positive"] == 1.0 and result["quality_margin"]["stderr"] < 0.02
    assert static[0].acceptance == 0.2 and static[0].tokens_per_second == 5.0


def test_sweep_on_a_tiny_pair_relaxing_w_raises_acceptance(pair):
    examples = [
        Example(prompt=p, task="general")
        for p in ["the cat sat on", "one two three", "the dog ran", "a big red", "then it was"]
    ]
    torch.manual_seed(0)
    spread = new_head(pair, hidden_size=8)
    with torch.no_grad():
        spread.mlp[-1].weight.mul_(50)  # an untrained head whose w clearly varies with the hidden states
    points = sweep(
        pair,
        examples,
        "general",
        weights=(0.0, 1.0),
        heads={"half": ConstantHead(0.5), "spread": spread},
        decoding=DecodeConfig(max_new_tokens=12),
    )
    by_label = {p.label: p for p in points}
    # the spread of w_t over positions: none for a constant, some for a head that reads the states
    assert by_label["dynamic:half"].row()["w_std"] == 0.0 and by_label["static:1"].row()["w_std"] is None
    assert by_label["dynamic:spread"].row()["w_std"] > 0.05
    assert by_label["static:0"].acceptance == 1.0  # w = 0 accepts every draft
    assert by_label["static:1"].acceptance < by_label["dynamic:half"].acceptance < 1.0
    assert all(len(p.quality) == len(examples) for p in points)
    # Fidelity (mean target log-prob) is best when decoding follows the target.
    assert by_label["static:1"].mean_quality > by_label["static:0"].mean_quality


def test_the_difference_to_exact_decoding_is_paired_over_examples():
    from diversed_demo.eval.margins import versus_exact

    exact = point("static:1", 1.0, 2, 0.5)
    exact.quality = [0.1 * i for i in range(20)]  # examples differ a lot; the head trails each by 0.05 ± 0.01
    head = point("dynamic:h", None, 4, 0.0)
    head.quality = [q - 0.05 + (0.01 if i % 2 else -0.01) for i, q in enumerate(exact.quality)]
    result = versus_exact([point("static:0", 0.0, 6, 0.2), exact], head)
    assert result["quality_difference"] == pytest.approx(-0.05)
    assert result["stderr"] == pytest.approx(0.01 / 19**0.5 * (20 / 20) ** 0.5, rel=0.05)
    assert result["acceptance"] == {"exact": 0.2, "head": 0.4} and result["examples"] == 20
    assert versus_exact([point("static:0", 0.0, 6, 0.2)], head) is None  # w = 1 not decoded: nothing to pair


def test_a_positive_estimate_within_the_noise_is_not_beyond_the_frontier():
    static = [point("static:1", 1.0, 2, 0.9), point("static:0", 0.0, 6, 0.5)]
    noisy = point(
        "dynamic:h", None, 4, 0.7
    )  # just above the line, ±0.5 per example: the interval straddles zero
    noisy.quality = [0.72 + (0.5 if i % 2 else -0.5) for i in range(len(noisy.quality))]
    result = frontier_margin(static, noisy)
    assert result["quality_margin"]["estimate"] > 0
    assert result["quality_margin"]["ci95"][0] < 0 < result["quality_margin"]["ci95"][1]
    assert not result["beyond_frontier"]


def test_the_verdict_names_beyond_below_floor_and_unresolved():
    static = [point("static:1", 1.0, 2, 0.9), point("static:0", 0.0, 6, 0.5)]
    assert frontier_margin(static, point("dynamic:h", None, 4, 0.8))["verdict"]["kind"] == "beyond"
    below = frontier_margin(static, point("dynamic:h", None, 4, 0.5))["verdict"]
    assert (
        below["kind"] == "below"
        and "quality margin -0.200 ± 0.000" in below["text"]
        and "n = 20" in below["text"]
    )
    noisy = point("dynamic:h", None, 4, 0.7)
    noisy.quality = [0.72 + (0.5 if i % 2 else -0.5) for i in range(len(noisy.quality))]
    assert (
        frontier_margin(static, noisy)["verdict"]["kind"] == "unresolved"
    )  # the curve spans 0.4 ≫ the noise
    # A task at its floor: every static w scores (nearly) nothing, so no margin can be resolved.
    floor = [point("static:1", 1.0, 2, 0.0), point("static:0", 0.0, 6, 0.0)]
    for p in floor:
        p.quality = [1.0 if i == 0 else 0.0 for i in range(20)]
    head = point("dynamic:h", None, 4, 0.0)
    head.quality = [1.0 if i == 1 else 0.0 for i in range(20)]
    assert frontier_margin(floor, head)["verdict"]["kind"] == "floor"


def test_heads_of_two_runs_with_one_name_are_both_evaluated():
    labels = head_labels(
        ["runs/a/general.safetensors", "runs/b/general.safetensors", "heads/code.safetensors"]
    )
    assert list(labels) == ["a/general", "b/general", "code"]


@pytest.mark.parametrize(
    "task, set_name, category, size",
    [
        ("math", "gsm8k", "gsm8k", 100),
        ("math", "arithmetic", "arithmetic", 100),
        ("code", "mbpp", "mbpp", 100),
        ("summarization", None, "summarization", 50),
    ],
)  # the sizes the results table asks of each
def test_held_out_sets_are_the_evaluation_splits(task, set_name, category, size):
    from diversed_demo.eval.held_out import held_out_examples
    from diversed_demo.eval.tasks import MBPP_TEST_IDS, builtin_examples

    examples = held_out_examples(task, size, set_name=set_name)
    assert (
        len(examples) == size
        and {e.category for e in examples} == {category}
        and {e.task for e in examples} == {task}
    )
    if task == "code":
        assert {int(e.id.split("/")[1]) for e in examples} <= set(MBPP_TEST_IDS)
    assert not {e.prompt for e in examples} & {e.prompt for e in builtin_examples(task, "train")}
    with pytest.raises(ValueError, match="no held-out set 'mbpp'"):
        held_out_examples("math", 5, set_name="mbpp")


def test_general_held_out_prompts_are_stratified_in_every_prefix():
    from diversed_demo.eval.held_out import held_out_examples

    examples = held_out_examples("general", 100)
    categories = [e.category for e in examples]
    assert len(set(categories)) == 13 and len(categories) == 100
    assert len(set(categories[:13])) == 13  # any first 13 cover every category once
    assert [e.prompt for e in held_out_examples("general", 30)] == [e.prompt for e in examples[:30]]


def test_a_card_keeps_one_evaluation_per_set_and_temperature(pair, tmp_path):
    import json

    from diversed_demo.eval.cards import evaluation_key, write_head_card
    from diversed_demo.models.heads import load_head, save_head

    head = new_head(pair, hidden_size=8)
    head.meta.update(task="math", training={"steps": 3}, warm_start={"lam": 2.0})
    path = save_head(head, tmp_path / "math.safetensors")

    def figures(temperature: float) -> dict:  # an evaluation as the card's schema takes it
        points = {"static_points": [{"w": 1.0, "acceptance": 0.3}], "head_point": {"acceptance": 0.4}}
        return {"beyond_frontier": False, "settings": {"temperature": temperature}, **points}

    write_head_card(path, head, figures(0.0), evaluation_key("arithmetic", 0.0), primary=False)
    write_head_card(path, head, figures(1.0), evaluation_key("gsm8k", 1.0), primary=True)
    card = write_head_card(path, head, figures(0.5), evaluation_key("gsm8k", 0.5), primary=False)
    assert list(card["evaluations"]) == ["arithmetic, greedy", "gsm8k, T=1", "gsm8k, T=0.5"]
    assert card["frontier"]["settings"]["temperature"] == 1.0  # the primary one stays what the app draws
    assert card["warm_start"] == {"lam": 2.0}
    assert json.loads(path.with_suffix(".json").read_text()) == card
    assert load_head(path, pair).meta["evaluations"] == card["evaluations"]
    head.meta["training"] = {"steps": 4}  # a new training run of the same file: its old figures go
    card = write_head_card(path, head, figures(0.0), evaluation_key("arithmetic", 0.0), primary=False)
    assert (
        list(card["evaluations"]) == ["arithmetic, greedy"]
        and card["frontier"]["settings"]["temperature"] == 0.0
    )


def test_a_stopped_sweep_resumes_from_its_log_with_the_same_results(pair, tmp_path):
    from diversed_demo.eval.decode_log import DecodeLog

    examples = [Example(prompt=p, task="general") for p in ["the cat sat on", "one two three", "the dog ran"]]
    heads = {"half": ConstantHead(0.5)}
    settings = {"task": "general", "temperature": 1.0}
    fresh = sweep(
        pair, examples, "general", weights=(0.0, 1.0), heads=heads, decoding=DecodeConfig(max_new_tokens=8)
    )
    log = DecodeLog(tmp_path / "log.jsonl", settings)
    sweep(
        pair,
        examples[:2],
        "general",
        weights=(0.0, 1.0),
        heads=heads,
        log=log,
        decoding=DecodeConfig(max_new_tokens=8),
    )
    assert log.reused == 0
    with (tmp_path / "log.jsonl").open("a") as f:
        f.write('{"key": "static:0||2|')  # a kill mid-write: that decode runs again
    log = DecodeLog(tmp_path / "log.jsonl", settings)
    resumed = sweep(
        pair,
        examples,
        "general",
        weights=(0.0, 1.0),
        heads=heads,
        log=log,
        decoding=DecodeConfig(max_new_tokens=8),
    )
    assert log.reused == 2 * 3  # two examples were logged at three points
    for a, b in zip(fresh, resumed):
        assert a.label == b.label and a.quality == b.quality and a.token_w == b.token_w
        assert [(c.new_tokens, c.drafted, c.accepted) for c in a.counts] == [
            (c.new_tokens, c.drafted, c.accepted) for c in b.counts
        ]
    assert len(DecodeLog(tmp_path / "log.jsonl", settings).records) == 3 * 3
    sweep(
        pair,
        examples[:1],
        "general",
        weights=(),
        heads={"half": ConstantHead(0.6)},
        log=log,
        decoding=DecodeConfig(max_new_tokens=8),
    )
    assert log.reused == 6  # a head of the same name with other weights is decoded, not read back
    with (tmp_path / "log.jsonl").open("a") as f:
        f.write("garbage\n")
    with pytest.raises(ValueError, match="line 12, is not a decode record"):
        DecodeLog(tmp_path / "log.jsonl", settings)
    with pytest.raises(ValueError, match="another evaluation"):
        DecodeLog(tmp_path / "log.jsonl", {**settings, "temperature": 0.0})


@pytest.mark.parametrize("trained_temperature", [0.0, 1.0])
def test_a_cards_drawn_evaluation_is_of_the_decoding_its_head_was_trained_for(
    pair, tmp_path, trained_temperature
):
    import json

    from diversed_demo.eval.frontier import evaluate_heads
    from diversed_demo.models.heads import save_head

    head = new_head(pair, hidden_size=8)
    head.meta.update(task="math", training={"temperature": trained_temperature})
    path = save_head(head, tmp_path / "h.safetensors")
    for temperature in (trained_temperature, 1.0 - trained_temperature):  # its own kind first, then the other
        evaluate_heads(
            pair,
            "math",
            [str(path)],
            [0.0, 1.0],
            limit=2,
            decoding=DecodeConfig(max_new_tokens=4, temperature=temperature),
            write_card=True,
            set_name="arithmetic",
        )
    card = json.loads(path.with_suffix(".json").read_text())
    assert (
        card["frontier"]["settings"]["temperature"] == trained_temperature and len(card["evaluations"]) == 2
    )
    assert card["frontier"]["verdict"]["kind"] in ("beyond", "below", "unresolved", "floor")


def test_a_decode_log_is_of_one_dtype(tmp_path):
    from tiny import save_tiny_pair

    from diversed_demo.eval.decode_log import DecodeLog
    from diversed_demo.eval.frontier import log_settings
    from diversed_demo.runtime.plan import load_pair

    target, draft = save_tiny_pair(tmp_path)
    fp32, bf16 = (load_pair(target, draft, "cpu", dtype) for dtype in ("float32", "bfloat16"))
    settings = {"n_draft": 4, "max_new_tokens": 8, "temperature": 0.0, "held_out": "x"}
    # fp32 logs keep the settings line they were written with, so the committed logs stay valid
    assert "dtype" not in log_settings(fp32, "general", "spec_bench", settings)
    path = tmp_path / "log.jsonl"
    DecodeLog(path, log_settings(fp32, "general", "spec_bench", settings))
    with pytest.raises(ValueError, match="log of another evaluation"):
        DecodeLog(path, log_settings(bf16, "general", "spec_bench", settings))


def test_the_per_token_rule_is_a_point_of_the_sweep_judged_in_quality_and_fidelity(pair):
    from diversed_demo.eval.frontier import judged

    examples = [Example(p, "general") for p in ["the cat sat on", "one two three", "a dog ran", "the big"]]
    decoding = DecodeConfig(max_new_tokens=8)
    points = sweep(pair, examples, "general", weights=(0.0, 1.0), lams=(0.0, 1e6), decoding=decoding)
    by_label = {p.label: p for p in points}
    assert list(by_label) == ["static:0", "static:1", "cost:0", "cost:1e+06"]
    # A λ above any draft's cost keeps every draft, as w = 0 does: the same decodes, seed for seed.
    assert by_label["cost:1e+06"].quality == by_label["static:0"].quality
    assert by_label["cost:1e+06"].acceptance == 1.0 and by_label["static:1"].acceptance < 1.0
    assert all(len(p.fidelity) == len(examples) for p in points)
    verdict = judged([by_label["static:0"], by_label["static:1"]], by_label["cost:0"])
    assert {"verdict", "versus_exact", "fidelity", "fidelity_versus_exact"} <= set(verdict)


def test_an_interval_without_an_estimate_is_no_claim():
    """A point just outside the static curve's range has no estimate, while some resamples fall inside
    and give an interval: that interval alone never makes it beyond (nor breaks the verdict's words)."""
    from diversed_demo.eval.margins import clears_zero, verdict

    unmeasured = {"estimate": None, "stderr": 0.01, "ci95": [0.02, 0.05], "p_positive": 1.0}
    measured = {"estimate": 0.03, "stderr": 0.01, "ci95": [0.01, 0.05], "p_positive": 1.0}
    assert not clears_zero(unmeasured) and clears_zero(measured)
    margin = {"quality_margin": unmeasured, "acceptance_margin": measured, "beyond_frontier": True}
    said = verdict(margin, [0.1, 0.5], 100)
    assert said["kind"] == "beyond" and "acceptance margin +0.030" in said["text"]
    assert "quality margin" not in said["text"]


def test_a_cost_head_is_a_curve_judged_against_the_static_frontier_and_the_rule_at_each_lam(pair, tmp_path):
    """A cost head is swept at each λ of the rule: a point per λ, each judged against the static frontier and,
    paired example by example, against the rule at the same λ; an untrained one is the rule there, decode
    for decode. Its card holds its point at the default λ."""
    import json

    from diversed_demo.core.head import COST_HEAD_LAM
    from diversed_demo.eval.frontier import evaluate_heads
    from diversed_demo.models.heads import save_head

    head = new_head(pair, "cost", hidden_size=8)
    head.meta.update(task="general", training={"temperature": 1.0})
    path = save_head(head, tmp_path / "c.safetensors")
    lams = [0.5, COST_HEAD_LAM]
    report, points = evaluate_heads(
        pair,
        "general",
        [str(path)],
        [0.0, 1.0],
        limit=3,
        decoding=DecodeConfig(max_new_tokens=6, temperature=1.0),
        write_card=True,
        set_name="spec_bench",
        lams=lams,
    )
    by_label = {p.label: p for p in points}
    for lam in lams:
        versus = report["heads"][f"c@{lam:g}"]["versus_rule"]
        assert versus["against"] == f"cost:{lam:g}" and versus["fidelity_difference"] == 0.0
        assert by_label[f"dynamic:c@{lam:g}"].quality == by_label[f"cost:{lam:g}"].quality
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["frontier"]["head_point"]["point"] == f"dynamic:c@{COST_HEAD_LAM:g}"


def test_an_ensemble_head_is_paired_with_the_rule_at_the_lam_it_was_fitted_at(pair, tmp_path):
    from diversed_demo.eval.frontier import evaluate_heads
    from diversed_demo.models.heads import save_head

    paths = {}
    for name, warm in (("fitted", {"lam": 2.0}), ("elsewhere", {"lam": 3.0})):
        head = new_head(pair, hidden_size=8)
        head.meta.update(task="general", training={"temperature": 1.0}, warm_start=warm)
        paths[name] = str(save_head(head, tmp_path / f"{name}.safetensors"))
    report, _ = evaluate_heads(
        pair, "general", list(paths.values()), [0.0, 1.0], limit=3,
        decoding=DecodeConfig(max_new_tokens=6, temperature=1.0), set_name="spec_bench", lams=[0.5, 2.0],
    )  # fmt: skip
    assert report["heads"]["fitted"]["versus_rule"]["against"] == "cost:2"
    assert "versus_rule" not in report["heads"]["elsewhere"]  # no rule point at its λ: no pairing
