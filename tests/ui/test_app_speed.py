"""The served app decodes at the library's speed, and its first Compare shows speculative decoding paying:
the embedded pair as `make demo` runs it (compiled passes built, warm), measured by tests/served_speed.py in
a process of its own, as a server runs. Slow: the compiled passes take minutes to build on a fresh cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diversed_demo.runtime import amx_gguf

pytestmark = [pytest.mark.slow, pytest.mark.embedded, pytest.mark.timed]
SCRIPT = Path(__file__).resolve().parents[1] / "served_speed.py"


# The app's own settings, not the test run's (conftest.py keeps the tests' pairs eager, their dtype choices
# aside and their processes on one thread): the compiled passes built into the user cache, the dtype
# remembered there and every core, as a server.
TEST_ONLY = ("DIVERSED_COMPILED_PASS", "DIVERSED_DTYPE_CHOICES", "OMP_NUM_THREADS")
APP_ENV = {name: value for name, value in os.environ.items() if name not in TEST_ONLY}


@pytest.fixture(scope="module")
def figures():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800, env=APP_ENV
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["ar", "exact", "dynamic"])
def test_the_apps_decode_runs_within_a_tenth_of_the_librarys_speed(figures, mode):
    """The median over rounds of the library's seconds over the app's, each round's decodes back to back."""
    assert figures["decode_s"][mode]["pace"]["app"] >= 0.9, json.dumps(figures)


# What a visitor's first Compare must show (issue 52): exact SD paying, DIVERSED paying more.
EXACT_SPEEDUP, DIVERSED_SPEEDUP = 1.2, 1.4
NOT_SLOWER = 0.85  # drafting never makes a Compare slower than the target alone, to the host's noise (±10%)
# Of what the run's own steps cost by the pair's measured costs (`compare_priced`), the share its wall time
# gives: the Compare's steps cost their passes and little more, the host's noise aside (each mode's median
# over five Compares read 0.87-0.97 on Zen 4, where single Compares ranged 0.66-1.03)
PRICED_SHARE = 0.8
AMX_CPUS = ("AMX",)  # the GGUF kernels (`amx_gguf.name()`) on whose CPUs the Compare showed the figures


def test_the_first_compare_shows_speculative_decoding_paying(figures):
    """Exact SD at least EXACT_SPEEDUP× the target alone, DIVERSED at least DIVERSED_SPEEDUP× and faster
    than exact SD: each mode's median over five Compares of the first example through the page's handler,
    read from the trace it gives the visitor (docs/measurements/speed.md, "The app's decode"). Held on the
    CPUs whose kernels showed them (AMX_CPUS: the Xeon, 1.32× and 1.51×), whatever this run's costs say, so a
    slower step fails it there; the EPYCs' passes cannot show them with this draft (speed.md: what the
    passes allow, `compare_attainable`, read 1.01-1.08× and 1.27-1.37× on Zen 4): there it is skipped,
    saying what they allow, and the two tests below hold the Compare."""
    speedups, allowed = figures["compare_speedup"], figures["compare_attainable"]
    wanted = {"exact": EXACT_SPEEDUP, "dynamic": DIVERSED_SPEEDUP}
    if amx_gguf.name() not in AMX_CPUS:
        allows = ", ".join(f"{mode} {allowed[mode]:.2f}×" for mode in wanted)
        pytest.skip(f"this CPU's passes allow the first Compare {allows}; the figures {wanted} need AMX")
    for mode, figure in wanted.items():
        assert speedups[mode] >= figure, json.dumps(figures)
    assert speedups["dynamic"] >= speedups["exact"], json.dumps(figures)


def test_the_first_compares_steps_cost_their_passes(figures):
    """On any CPU: each drafting mode's run in the Compare takes no more than 1 / PRICED_SHARE of what its
    own steps cost by the pair's measured c, r and v[N] (a target-only step and the prompt's pass as this
    Compare's target-only run took them): a step costs its passes in the app too, whatever the mode
    drafted. (What its acceptance would allow at the best fixed N, `compare_attainable`, also weighs the
    draft length's choices, which the bench's `bound_efficiency` and its runs at fixed N hold:
    docs/measurements/speed.md, "The served app beside its client".)"""
    for mode, share in figures["compare_priced"].items():
        assert share >= PRICED_SHARE, f"{mode}: {json.dumps(figures)}"


def test_drafting_never_makes_the_first_compare_slower_than_the_target_alone(figures):
    """On any CPU: the draft length drafts only what pays (core/draft_length.py), so no mode is slower than
    target-only beyond the host's noise."""
    assert min(figures["compare_speedup"].values()) >= NOT_SLOWER, json.dumps(figures)
