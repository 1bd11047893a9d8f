"""Rendering: token events as HTML coloured by fate with their numbers in tooltips, and the w_t chart."""

from __future__ import annotations

import math

from conftest import UI_PROMPT, decode_settings, token_event

from diversed_demo.ui import render, runs
from diversed_demo.ui.app import CSS_PATH


def test_token_html_escapes_text_and_carries_the_numbers_in_its_tooltip():
    html = render.render_token(token_event(text='<b>"&'))
    assert "&lt;b&gt;&quot;&amp;" in html and "<b>" not in html
    assert 'class="dd-tok dd-accepted"' in html
    assert "w_t = 0.500" in html and "p(x) = 0.200" in html and "q(x) = 0.400" in html
    assert "acceptance probability = 0.750" in html


def test_newlines_stay_visible_and_break_the_line():
    html = render.render_token(token_event(text="a\nb"))
    assert '<span class="dd-nl">↵</span>\nb' in html


def test_tokens_without_a_draft_say_so():
    title = render.token_title(token_event(kind="bonus", w=None, q=None, accept_prob=None))
    assert "bonus" in title and "w_t = n/a (no draft here)" in title and "acceptance" not in title


def test_every_fate_has_a_class_a_legend_entry_and_a_colour():
    legend = render.legend_html()
    css = CSS_PATH.read_text()
    for kind in ("accepted", "rejected", "resampled", "bonus", "ar"):
        assert f"dd-{kind}" in legend and kind in render.KIND_COLORS
        assert f".dd-{kind}" in css
    assert "line-through" in css.split(".dd-rejected")[1].split("}")[0]
    assert ".dd-departs" in css


def test_empty_output_shows_a_placeholder():
    assert "dd-empty" in render.render_tokens([])


def test_the_departure_mark_lands_on_the_output_token_not_on_a_rejected_draft():
    events = [
        token_event("accepted", "a", token_id=1),
        token_event("rejected", "b", token_id=2),
        token_event("resampled", "c", token_id=3),
        token_event("bonus", "d", token_id=4),
    ]
    html = render.render_tokens(events, departs_at=1)  # output tokens: a, c, d
    marked = [part for part in html.split("<span ") if "dd-departs" in part]
    assert len(marked) == 1 and marked[0].endswith(">c</span>") and "departs from target-only" in marked[0]


def test_one_number_formatter():
    assert render.fmt(None) == render.fmt(math.nan) == "n/a"
    assert render.fmt(0.12345) == "0.123" and render.fmt(0.5, ".0%") == "50%"


def test_w_chart_has_a_point_per_verified_draft(pair):
    *_, run = runs.stream_decode(pair, UI_PROMPT, decode_settings())
    figure = render.w_chart(run)
    plotted = sum(len(trace.x) for trace in figure.data)
    assert plotted == sum(e.kind in ("accepted", "rejected") for e in run.events)


def test_a_target_only_chart_has_no_points_and_says_why_however_often_it_is_drawn(pair):
    *_, target_only = runs.stream_decode(pair, UI_PROMPT, decode_settings().replace(mode="ar"))
    *_, drafted = runs.stream_decode(pair, UI_PROMPT, decode_settings())
    for _ in range(2):  # the pointless chart is built once and handed out again: nothing may add to it
        empty, full = render.w_chart(target_only), render.w_chart(drafted)
        assert sum(len(trace.x) for trace in empty.data) == 0
        assert "no draft" in empty.layout.annotations[0].text and not full.layout.annotations
        assert sum(len(trace.x) for trace in full.data) > 0


def test_a_tree_decode_shows_its_last_trees_with_each_candidates_fate_and_numbers(feature_pair):
    from diversed_demo.ui.render import TREE_STEPS, tree_steps_html
    from diversed_demo.ui.runs import APP_CONFIG, stream_decode

    settings = APP_CONFIG.replace(mode="static", tree="on", n_draft=4, max_new_tokens=24, temperature=0.0)
    *_, run = stream_decode(feature_pair, "the cat sat on the", settings)
    shown = tree_steps_html(run.events)
    trees = [event for event in run.events if event.tree]
    assert shown.count('class="dd-tree"') == min(TREE_STEPS, len(trees)) > 0
    assert f"step {trees[-1].step}" in shown  # the newest first
    assert "dd-kept" in shown and "w_t = " in shown and "CE(q, p) − H(p)" in shown
    chain = stream_decode(feature_pair, "the cat sat on the", settings.replace(tree="off"))
    assert tree_steps_html(list(chain)[-1].events) == ""
    hostile = {
        "nodes": [
            {
                "token_id": 1,
                "text": "<b>",
                "parent": -1,
                "depth": 1,
                "p": 0.5,
                "q": 0.5,
                "accept_prob": None,
                "kept": False,
            }
        ],
        "rows": [],
        "rejected_at": 0,
    }
    html_out = tree_steps_html([type("E", (), {"tree": hostile, "step": 1})()])
    assert "<b>" not in html_out and "&lt;b&gt;" in html_out and "redrawn" in html_out
