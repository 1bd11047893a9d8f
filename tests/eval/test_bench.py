"""The bench on a tiny pair: report structure, greedy identity with transformers, analytic bound."""

import statistics

import pytest

from diversed_demo.eval.bench import BENCH_DECODING, parse_modes, run_batch_bench, run_bench
from diversed_demo.eval.bench_report import batch_markdown, markdown_table
from diversed_demo.eval.tasks import Example
from diversed_demo.runtime.dtype_choice import cpu_name
from diversed_demo.runtime.theory import alpha_from_acceptance, analytic_speedup, wall_bound


def test_analytic_bound_limits():
    assert analytic_speedup(0.0, 4, 0.0, 1.0) == pytest.approx(1.0)  # nothing accepted, free draft: no gain
    assert analytic_speedup(1.0, 4, 0.0, 1.0) == pytest.approx(5.0)  # all accepted: N + 1 tokens per pass
    assert analytic_speedup(0.5, 4, 0.1, 1.2) == pytest.approx((1 - 0.5**5) / 0.5 / (0.4 + 1.2))


def test_projected_speedup():
    assert analytic_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert analytic_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert analytic_speedup(0.5, 2, 0.0) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    values = [analytic_speedup(a / 10, 4, 0.2) for a in range(11)]
    assert values == sorted(values)
    with pytest.raises(ValueError):
        analytic_speedup(1.5, 4, 0.1)


def test_the_wall_clock_bound_pays_the_prompt_once_per_text():
    # a prompt that took 30% of target-only's time, a step bound of 2: the decode's 70% runs twice as fast
    assert wall_bound(2.0, 0.3) == pytest.approx(1 / (0.3 + 0.35))
    assert wall_bound(2.0, 0.0) == pytest.approx(2.0) and wall_bound(1.0, 0.3) == pytest.approx(1.0)
    # a text half as long pays the same prompt for half the tokens: less of the step's bound shows
    assert wall_bound(2.0, 0.3, length=0.5) == pytest.approx(1 / (0.6 + 0.35))
    assert wall_bound(2.0, 0.3, length=0.5) < wall_bound(2.0, 0.3) < wall_bound(2.0, 0.3, length=2.0)


@pytest.mark.parametrize("alpha, n_draft", [(0.0, 4), (0.3, 1), (0.6, 4), (0.95, 8), (1.0, 3)])
def test_alpha_inverts_the_block_acceptance_rate(alpha, n_draft):
    rate = sum(alpha**k for k in range(1, n_draft + 1)) / n_draft
    assert alpha_from_acceptance(rate, n_draft) == pytest.approx(alpha, abs=1e-6)


def test_parse_modes_rejects_unknown_and_requires_ar(pair):
    with pytest.raises(ValueError, match="unknown mode"):
        parse_modes("ar,turbo", pair)
    with pytest.raises(ValueError, match="must include ar"):
        parse_modes("exact", pair)
    static = BENCH_DECODING.replace(mode="static", ensemble_weight=0.25, prompt_lookup=True)
    assert parse_modes("ar,static:0.25", pair)["static:0.25"] == static


def test_a_cost_head_runs_at_its_default_lambda_or_the_one_after_at():
    from diversed_demo.core.head import COST_HEAD_LAM

    modes = parse_modes("ar,dynamic:general-cost,dynamic:general-cost@8,dynamic:general")
    assert modes["dynamic:general-cost"].lam == COST_HEAD_LAM  # as the app and frontier run it
    assert modes["dynamic:general-cost@8"].lam == 8.0
    assert modes["dynamic:general"].lam == BENCH_DECODING.lam
    with pytest.raises(ValueError, match="only a cost head takes a λ"):
        parse_modes("ar,dynamic:general@2")
    for bad in ("x", "-1", "inf"):
        with pytest.raises(ValueError, match="λ must be a number ≥ 0"):
            parse_modes(f"ar,dynamic:general-cost@{bad}")


def test_modes_draft_with_prompt_lookup_unless_told_not_to(pair):
    modes = parse_modes("ar,exact,exact/no-lookup,static:0.5/no-lookup", pair)
    assert modes["ar"] == BENCH_DECODING.replace(mode="ar")
    assert modes["exact"].prompt_lookup and not modes["exact/no-lookup"].prompt_lookup
    assert modes["static:0.5/no-lookup"] == BENCH_DECODING.replace(
        mode="static", ensemble_weight=0.5, prompt_lookup=False
    )
    with pytest.raises(ValueError, match="an option after / is no-lookup, chain, tree"):
        parse_modes("ar,exact/turbo", pair)
    with pytest.raises(ValueError, match="drafts nothing"):
        parse_modes("ar,ar/no-lookup", pair)


def test_modes_draft_trees_where_told_to_and_the_bench_adds_tree_twins(pair):
    from diversed_demo.cli.bench import with_trees

    modes = parse_modes("ar;exact/tree;static:0.5/tree=3,3,4,7/no-lookup", pair)
    assert modes["exact/tree"].tree == "on" and modes["exact/tree"].prompt_lookup
    assert modes["static:0.5/tree=3,3,4,7/no-lookup"] == BENCH_DECODING.replace(
        mode="static", ensemble_weight=0.5, tree="3,3,4,7", prompt_lookup=False
    )
    with pytest.raises(ValueError, match="exact/tree=9,9,9,9.*W,E,D,N"):
        parse_modes("ar;exact/tree=9,9,9,9", pair)
    assert with_trees("ar,exact,static:0.5", "off") == "ar,exact,static:0.5"
    assert with_trees("ar,exact,static:0.5", "on") == "ar;exact;static:0.5;exact/tree;static:0.5/tree"
    assert set(parse_modes(with_trees("ar,exact", "2,2,3,5"), pair)) == {"ar", "exact", "exact/tree=2,2,3,5"}
    with pytest.raises(ValueError, match="tree must be"):
        with_trees("ar,exact", "big")


def test_bench_report_on_a_tiny_pair(pair):
    examples = [
        Example("the cat sat on the", "general", category="writing"),
        Example("one two three", "math", reference="#### 4", category="math_reasoning"),
        Example("a big red dog ran", "general", category="writing"),
    ]
    modes = parse_modes("ar,exact,static:0.5", pair, BENCH_DECODING.replace(max_new_tokens=16))
    report = run_bench(pair, examples, modes, n_draft=3, vs_transformers=True)
    assert set(report["per_category"]) == {"writing", "math_reasoning"}
    overall = report["overall"]
    assert overall["ar"]["speedup"] == pytest.approx(1.0) and overall["ar"]["acceptance_rate"] is None
    assert overall["static:0.5"]["acceptance_rate"] >= overall["exact"]["acceptance_rate"]
    assert report["per_category"]["math_reasoning"]["exact"]["quality"] in (0.0, 1.0)
    assert set(report["vs_transformers"]) == {"ar", "exact", "static:0.5"}
    assert all(report["greedy_text_identical_to_transformers"].values())
    assert set(report["bound_efficiency"]) == {"exact", "static:0.5"}
    assert report["costs"]["c"] > 0 and report["costs"]["v"][3] > 0
    assert 0 < report["streaming_overhead"] < 1
    table = markdown_table(report)
    assert "math_reasoning" in table and "**overall**" in table
    assert "| writing | 1.00× · τ 1.00 · α – · fid " in table  # target-only drafts nothing: no acceptance
    goal = report["goals"]["diversed"]["static:0.5"]
    assert goal["speedup"] == overall["static:0.5"]["speedup"]
    # Quality is judged per referenced category, never on the pooled mean of different metrics.
    assert set(goal["quality_vs_exact"]) == {"math_reasoning"}
    change = goal["quality_vs_exact"]["math_reasoning"]
    assert goal["met"] == (goal["speedup"] >= 1.5 and change is not None and change >= -0.05)
    assert report["goals"]["bound_efficiency"]["min"] == min(report["bound_efficiency"].values())
    assert "relaxed mode" in table and "goal" not in table and "met" not in table.split("|")
    # fp32 greedy exact SD is lossless: every output equals target-only's, token for token.
    assert report["greedy_identical_to_target_only"]["exact"] == 1.0
    ours, theirs = overall["exact"]["tokens_per_second"], overall["ar"]["tokens_per_second"]
    assert report["exact_vs_transformers_target_only"] == pytest.approx(
        ours / theirs * report["vs_transformers"]["ar"]
    )
    limit = report["memory_limit"]
    assert limit["tokens_per_second"] == pytest.approx(limit["copy_bytes_per_second"] / limit["weight_bytes"])
    assert limit["target_only_share"] == pytest.approx(theirs / limit["tokens_per_second"])
    assert "Memory-bandwidth limit" in table and "identical to target-only" in table
    assert f"{report['settings']['threads']} threads on cpu ({cpu_name()})" in table  # the CPU named
    assert "fewer_threads_s" in report["settings"]  # the report can say whether a core was taken


def test_a_gpu_report_names_the_accelerator_not_the_host_threads():
    from diversed_demo.eval.bench_report import where

    settings = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16}
    assert where(settings) == "on cuda:0 (NVIDIA H100 80GB HBM3)"
    assert where({"device": "cpu", "threads": 2}) == "2 threads on cpu"
    assert where({"device": "cpu", "threads": 2, "device_name": "AMD EPYC"}) == "2 threads on cpu (AMD EPYC)"


def test_weight_bytes_count_a_tied_embedding_once():
    from tiny import tiny_model

    from diversed_demo.runtime.costs import weight_bytes

    model = tiny_model(0)
    untied = weight_bytes(model)
    model.get_output_embeddings().weight = model.get_input_embeddings().weight  # tie them
    assert weight_bytes(model) == untied - model.get_input_embeddings().weight.numel() * 4


def test_auto_n_draft_decodes_step_by_step_and_is_held_to_the_best_fixed_bound(pair):
    examples = [Example("the cat sat on the", "general", category="writing")]
    modes = parse_modes("ar,exact,static:0.1", pair, BENCH_DECODING.replace(max_new_tokens=12))
    report = run_bench(pair, examples, modes, n_draft="auto", candidates=[1, 2, 3])
    assert report["settings"]["n_draft"] == {"exact": "auto", "static:0.1": "auto"}
    costs = report["costs"]
    for name in ("exact", "static:0.1"):
        row = report["overall"][name]
        alpha = row["verified_acceptance"]
        best = max(analytic_speedup(alpha, n, costs["c"], v, costs["r"]) for n, v in costs["v"].items())
        assert row["step_bound"] == pytest.approx(best)
        # the prompts' passes cost every mode alike, so they pull the wall-clock bound towards 1
        share = report["prompt_share"]
        assert 0 < share < 1 and min(1, best) < row["analytic_bound"] < max(1, best)
        # ... spread over each mode's own tokens (a text that ends sooner pays the same prompt over fewer)
        length = row["new_tokens"] / report["overall"]["ar"]["new_tokens"]
        assert row["analytic_bound"] == pytest.approx(1 / (share / length + (1 - share) / best))
        assert report["bound_efficiency"][name] == pytest.approx(row["speedup"] / row["analytic_bound"])
        assert 0 <= row["drafted_per_step"] <= 7
    for name, parts in report["step_breakdown"].items():  # where each step's time went, adding up to it
        row = report["overall"][name]
        assert sum(parts.values()) == pytest.approx(row["tau"] / row["tokens_per_second"] * 1e3)
        assert parts["pass"] > 0 and parts["prompt"] > 0
        assert min(parts[p] for p in ("draft", "decide", "events")) >= 0
    assert report["step_breakdown"]["ar"]["draft"] < report["step_breakdown"]["exact"]["draft"]
    with pytest.raises(ValueError, match="n_draft"):
        run_bench(pair, examples, modes, n_draft=0)


def test_a_mode_fixes_its_own_draft_length_beside_auto_in_one_run(pair):
    examples = [Example("the cat sat on the", "general", category="writing")]
    modes = parse_modes("ar,exact,exact/n=2", pair, BENCH_DECODING.replace(max_new_tokens=12))
    report = run_bench(pair, examples, modes, n_draft="auto", candidates=[1])
    assert report["settings"]["n_draft"] == {"exact": "auto", "exact/n=2": 2}
    assert 2 in report["costs"]["v"]  # its bound reads a measured pass over 3 tokens
    fixed = report["overall"]["exact/n=2"]
    assert fixed["drafted_per_step"] == pytest.approx(2, abs=0.5)  # fewer only where the budget ends first
    assert report["greedy_identical_to_target_only"]["exact/n=2"] == 1.0  # greedy exact: the target's text
    for bad in ("exact/n=0", "exact/n=two", "exact/n=99"):
        with pytest.raises(ValueError, match="n=N takes a draft length"):
            parse_modes(f"ar,{bad}", pair)


def test_diversed_goal_needs_every_referenced_category_within_five_percent():
    from diversed_demo.eval.bench_report import goals

    def row(speedup, scores=None, fidelity=-1.0):
        cell = {"speedup": speedup, "quality": scores and sum(scores) / len(scores), "fidelity": fidelity}
        return {**cell, "quality_scores": scores} if scores else cell

    exact_summaries, exact_answers = [0.10, 0.20, 0.30], [1.0, 0.0, 1.0, 1.0]
    per_category = {
        "summarization": {
            "exact": row(1.0, exact_summaries),
            "static:0.5": row(1.6, [0.30, 0.40, 0.50]),
            "static:0.9": row(1.6, [0.092, 0.192, 0.292]),
        },
        "math_reasoning": {
            "exact": row(1.0, exact_answers),
            "static:0.5": row(1.6, [1.0, 0.0, 0.0, 1.0]),
            "static:0.9": row(1.6, exact_answers),
        },
        "writing": {"exact": row(1.0), "static:0.5": row(1.6), "static:0.9": row(1.6)},
    }
    # static:0.5's pooled mean beats exact's; its math answers are a third worse all the same.
    overall = {"exact": row(1.0), "static:0.5": row(1.6), "static:0.9": row(1.6)}
    report = {"overall": overall, "per_category": per_category, "vs_transformers": {}, "bound_efficiency": {}}
    result = goals(report)["diversed"]
    assert result["static:0.5"]["quality_vs_exact"] == pytest.approx(
        {"summarization": 1.0, "math_reasoning": -1 / 3}
    )
    assert not result["static:0.5"]["met"]
    # static:0.9 is 0.008 lower on every summary (−4% of 0.2, with no spread) and identical on math.
    assert result["static:0.9"]["quality_vs_exact"] == pytest.approx(
        {"summarization": -0.04, "math_reasoning": 0.0}
    )
    assert result["static:0.9"]["quality_vs_exact_se"] == pytest.approx(
        {"summarization": 0.0, "math_reasoning": 0.0}, abs=1e-12
    )
    assert result["static:0.9"]["met"]
    # The standard error is that of the per-question differences: ±1 answer in 4 questions.
    se = result["static:0.5"]["quality_vs_exact_se"]["math_reasoning"]
    assert se == pytest.approx(statistics.stdev([0, 0, -1, 0]) / 2 / 0.75)
    overall["static:0.9"]["speedup"] = 1.4
    assert not goals(report)["diversed"]["static:0.9"]["met"]


def test_bench_command_runs_the_chosen_categories(tmp_path, capsys):
    import json

    from tiny import save_tiny_pair

    from diversed_demo.cli import main

    target, draft = save_tiny_pair(tmp_path)
    pair_args = ["--target", target, "--draft", draft, "--device", "cpu"]
    assert main(["bench", *pair_args, "--categories", "poetry"]) == 2
    assert "unknown Spec-Bench categories ['poetry']" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                *pair_args,
                "--categories",
                "writing,math_reasoning",
                "--per-category",
                "1",
                "--modes",
                "ar,exact",
                "--n-draft",
                "2",
                "--max-new-tokens",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert (
        set(report["per_category"]) == {"writing", "math_reasoning"} and report["settings"]["examples"] == 2
    )
    # the app's own example prompts instead of Spec-Bench: the first is the one the app opens with
    assert (
        main(
            [
                "bench",
                *pair_args,
                "--app-examples",
                "2",
                "--modes",
                "ar,exact",
                "--n-draft",
                "2",
                "--max-new-tokens",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["settings"]["examples"] == 2


def test_vs_transformers_handles_the_end_weights_and_leaves_the_draft_config_alone(pair):
    # transformers accepts only 0 < w < 1: w = 1 is compared as plain assisted generation, w = 0 is not
    # compared.
    before = pair.draft.generation_config.to_dict()
    examples = [Example("the cat sat on the", "general", category="writing")]
    modes = parse_modes("ar,static:0,static:1", pair, BENCH_DECODING.replace(max_new_tokens=8))
    report = run_bench(pair, examples, modes, n_draft=2, vs_transformers=True)
    assert set(report["vs_transformers"]) == {"ar", "static:1"}
    assert report["greedy_text_identical_to_transformers"]["static:1"]
    assert pair.draft.generation_config.to_dict() == before


def test_bench_runs_a_feature_draft_and_compares_only_target_only_with_transformers(feature_pair):
    examples = [Example("the cat sat on the", "general", category="writing")]
    report = run_bench(
        feature_pair,
        examples,
        parse_modes("ar,exact", feature_pair, BENCH_DECODING.replace(max_new_tokens=8)),
        n_draft=2,
        vs_transformers=True,
    )
    assert set(report["vs_transformers"]) == {"ar"}
    assert report["overall"]["exact"]["acceptance_rate"] is not None and report["costs"]["c"] > 0


def test_the_batch_bench_decodes_the_same_rows_both_ways(any_pair):
    examples = [Example("the cat sat on the", "general"), Example("one two three", "math")]
    modes = parse_modes("ar,static:0.5", any_pair, BENCH_DECODING.replace(max_new_tokens=12, temperature=1.0))
    report = run_batch_bench(any_pair, examples, modes, rows=3, n_draft=3)
    for row in report["modes"].values():
        assert row["identical_outputs"] == 1.0  # a batch row decodes as its sequence would alone
        assert row["tokens_per_second_alone"] > 0 and row["batch_over_alone"] > 0
    assert "| static:0.5 |" in batch_markdown(
        report
    ) and "3 decodes of each of 2 questions" in batch_markdown(report)
    with pytest.raises(ValueError, match="at least 2 rows"):
        run_batch_bench(any_pair, examples, modes, rows=1)


def test_the_per_token_rule_is_a_bench_mode_with_its_lam(pair):
    modes = parse_modes("ar,cost:2.5,cost:0/no-lookup", pair)
    assert modes["cost:2.5"] == BENCH_DECODING.replace(mode="cost", lam=2.5, prompt_lookup=True)
    assert modes["cost:0/no-lookup"].lam == 0 and not modes["cost:0/no-lookup"].prompt_lookup
    with pytest.raises(ValueError, match="λ must be a number"):
        parse_modes("ar,cost:much", pair)
    with pytest.raises(ValueError, match="λ"):
        parse_modes("ar,cost:-1", pair)


def test_the_bench_report_keeps_each_questions_fidelity_per_mode(pair):
    examples = [Example("the cat sat on the", "general", category="writing"), Example("one two", "general")]
    modes = parse_modes("ar,exact,cost:3", pair, BENCH_DECODING.replace(max_new_tokens=6))
    report = run_bench(pair, examples, modes, n_draft=2)
    for name in modes:
        scores = report["overall"][name]["fidelity_scores"]
        assert len(scores) == 2 and report["overall"][name]["fidelity"] == pytest.approx(sum(scores) / 2)


def test_a_report_warns_where_another_process_took_a_core_from_the_decodes():
    from diversed_demo.eval.bench_report import busy_core_lines

    (line,) = busy_core_lines({"fewer_threads_s": 3.24, "threads": 2})
    assert "3.2 s" in line and "not this machine's alone" in line
    assert busy_core_lines({"fewer_threads_s": 0.0, "threads": 2}) == []
    assert busy_core_lines({"threads": 2}) == []  # reports written before the watch


def test_the_report_prints_the_step_costs_the_pairs_draft_length_weighed(pair, monkeypatch):
    """With n_draft "auto" the report's step costs are the pair's, which its decodes' lengths weighed, not a
    timing of the bench's own; a pair without them prints none."""
    examples = [Example("the cat sat on the", "general", category="writing")]
    modes = parse_modes("ar,exact", pair, BENCH_DECODING.replace(max_new_tokens=8))
    steps = {"c": 0.123, "r": 0.045, "v": {1: 1.5, 2: 1.75}}
    monkeypatch.setattr(
        pair, "costs", {"c": 0.1, "r": 0.0, "v": {1: 1.1, 2: 1.2}, "steps": steps}, raising=False
    )
    table = markdown_table(run_bench(pair, examples, modes, n_draft="auto", candidates=[1, 2]))
    assert (
        "drafting c = 0.123, r = 0.045, and with each position's share, v = 1.500 (N=1), 1.750 (N=2)" in table
    )
    monkeypatch.setattr(pair, "costs", None)
    assert "whole steps" not in markdown_table(
        run_bench(pair, examples, modes, n_draft="auto", candidates=[1, 2])
    )
