"""The served app decodes at the library's speed, and its first Compare shows speculative decoding paying:
the embedded pair as `make demo` runs it (compiled passes built, warm), the app's handlers as its API calls
them. Slow: the compiled passes take minutes to build on a fresh cache."""

from __future__ import annotations

import statistics
import time

import pytest

from diversed_demo.core.generate import generate
from diversed_demo.runtime.plan import load_pair
from diversed_demo.ui.examples import load_examples
from diversed_demo.ui.opening import measured_opening
from diversed_demo.ui.runs import resolve_head, speedup, stream_comparison
from diversed_demo.ui.tabs.decode import on_generate

pytestmark = [pytest.mark.slow, pytest.mark.embedded]
ROUNDS = 3


@pytest.fixture(scope="module")
def served():
    pair = load_pair(compiled="wait")
    examples = load_examples()
    return pair, examples, measured_opening(pair, examples)


def app_decode_s(pair, prompt, settings) -> float:
    """Seconds for one decode through the app's Decode handler, every update rendered, as a visitor's."""
    start = time.perf_counter()
    for _ in on_generate(
        pair,
        prompt,
        settings.mode,
        settings.ensemble_weight,
        settings.head_name,
        4,
        settings.max_new_tokens,
        settings.temperature,
        settings.seed,
        settings.lam,
        auto_n=True,
    ):
        pass
    return time.perf_counter() - start


@pytest.mark.parametrize("mode", ["ar", "exact", "dynamic"])
def test_the_apps_decode_runs_within_a_tenth_of_the_librarys_speed(served, mode):
    pair, examples, start = served
    prompt = examples[start.example_index].prompt
    settings = start.settings.replace(mode=mode, n_draft="auto", temperature=0.0, max_new_tokens=128)
    head = resolve_head(pair, settings)
    app, library = [], []
    for _ in range(ROUNDS):  # alternating, so that a burst of load slows both alike
        app.append(app_decode_s(pair, prompt, settings))
        began = time.perf_counter()
        generate(pair, prompt, settings.replace(head=head) if head is not None else settings)
        library.append(time.perf_counter() - began)
    assert statistics.median(library) / statistics.median(app) >= 0.9, (app, library, str(pair.runtime))


def test_the_first_compare_shows_speculative_decoding_paying(served):
    pair, examples, start = served
    example = examples[start.example_index]
    *_, comparison = stream_comparison(pair, example.prompt, start.settings.replace(n_draft="auto"), example)
    base = comparison.runs["ar"]
    assert speedup(comparison.runs["exact"], base) >= 1.2
    assert speedup(comparison.runs["dynamic"], base) >= 1.4
