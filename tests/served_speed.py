"""The served app's speed against the library's, measured as the app runs: a fresh process whose model work
all runs on the model thread (runtime/model_thread.py: a second thread with its own OpenMP team would slow
both). Prints JSON: per mode the best seconds of a decode through the app's Decode handler and through
`generate` on the same prompt, alternating (the host's other guests only ever add time, so the best of
several rounds is each path's own speed); then the first example's Compare speed-ups over target-only, as
the page's Compare (its handler, every update rendered) reports them in its trace, each mode's median over
COMPARES Compares, the speed-up the pair's measured costs (c, v[N]) allow each mode's acceptance, and what
that allows in wall time beside the prompt's pass, which every mode pays alike.
Run by tests/ui/test_app_speed.py; `python tests/served_speed.py` prints the figures."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from diversed_demo.core.generate import generate
from diversed_demo.runtime.model_thread import MODEL_THREAD
from diversed_demo.runtime.plan import load_pair
from diversed_demo.runtime.theory import analytic_speedup
from diversed_demo.ui.examples import load_examples
from diversed_demo.ui.opening import measured_opening
from diversed_demo.ui.render import RUN_LABELS
from diversed_demo.ui.runs import resolve_head, speedup
from diversed_demo.ui.tabs.compare import on_compare
from diversed_demo.ui.tabs.decode import on_generate
from diversed_demo.ui.trace import load_trace, read_trace, run_labels

COMPARES = 5  # the Compare's speed-ups: each mode's median over this many (one run alone is noisy here)
ROUNDS = 11  # best of: on a shared 2-core host a burst of load may last several decodes


def sidebar_values(settings) -> tuple:
    """The sidebar's inputs as the page sends them for `settings` (N step by step: the slider's 4 unread)."""
    return (
        settings.ensemble_weight,
        settings.head_name,
        4,
        settings.max_new_tokens,
        settings.temperature,
        settings.seed,
        settings.lam,
    )


def app_decode_s(pair, prompt, settings) -> float:
    """Seconds for one decode through the app's Decode handler, every update rendered, as a visitor's: until
    the update that shows it done (its last, with the chart and trace files)."""
    start, done = time.perf_counter(), None
    for _tokens, stats, *_ in on_generate(
        pair, prompt, settings.mode, *sidebar_values(settings), auto_n=True
    ):
        if done is None and 'data-state="done"' in stats:
            done = time.perf_counter() - start
    return done


def compare_runs(pair, examples, prompt, settings) -> dict:
    """Each mode's run in one Compare through the page's handler, read from the trace it gives the visitor
    (its last update)."""
    *_, files = list(on_compare(pair, examples, prompt, *sidebar_values(settings), auto_n=True))[-1]
    text = Path(next(f for f in files if f.endswith(".json"))).read_text()
    labels = set(run_labels(read_trace(text)))
    return {mode: load_trace(text, label) for mode, label in RUN_LABELS.items() if label in labels}


def bound(pair, run) -> float:
    """The speed-up the pair's measured costs allow a run of this acceptance, at its best N (theory.py)."""
    # per token, as bench_report (the run's counts from its events: a trace's summary holds no rejections)
    alpha = min(max(run.counts.verified_acceptance or 0.0, 0.0), 1.0)
    costs = pair.costs
    return max(analytic_speedup(alpha, n, costs["c"], v, costs.get("r", 0.0)) for n, v in costs["v"].items())


def attainable(bound_: float, prompt_share: float) -> float:
    """The speed-up over target-only a mode of i.i.d. bound `bound_` can show in wall time, where every mode
    pays the same prompt pass, `prompt_share` of target-only's time (Amdahl)."""
    return 1.0 / (prompt_share + (1.0 - prompt_share) / bound_)


def prompt_share(run) -> float:
    """Of a finished run's wall time, the share its first pass (over the prompt) took."""
    return run.events[0].verify_ms / 1e3 / run.elapsed_s


def library_decode_s(pair, prompt, settings, head) -> float:
    start = time.perf_counter()
    generate(pair, prompt, settings.replace(head=head) if head is not None else settings)
    return time.perf_counter() - start


def main() -> None:
    pair = MODEL_THREAD.call(load_pair, compiled="wait")
    examples = load_examples()
    start = MODEL_THREAD.call(measured_opening, pair, examples)
    example = examples[start.example_index]
    if pair.target_pass is None:
        raise SystemExit(f"no compiled passes attached ({pair.runtime.passes}): not the app's decode")
    figures = {"runtime": str(pair.runtime), "decode_s": {}}
    for mode in ("ar", "exact", "dynamic"):
        settings = start.settings.replace(mode=mode, n_draft="auto", temperature=0.0, max_new_tokens=128)
        head = MODEL_THREAD.call(resolve_head, pair, settings)
        app, library = [], []
        for _ in range(ROUNDS):  # alternating, so that a burst of load slows both alike
            app.append(app_decode_s(pair, example.prompt, settings))
            library.append(MODEL_THREAD.call(library_decode_s, pair, example.prompt, settings, head))
        figures["decode_s"][mode] = {"app": min(app), "library": min(library)}
    compares = [compare_runs(pair, examples, example.prompt, start.settings) for _ in range(COMPARES)]
    speedups = [{mode: speedup(run, runs["ar"]) for mode, run in runs.items()} for runs in compares]
    figures["compare_speedup"] = {mode: statistics.median(s[mode] for s in speedups) for mode in speedups[0]}
    modes = [mode for mode in compares[0] if mode != "ar"]
    figures["compare_bound"] = {
        m: statistics.median(bound(pair, runs[m]) for runs in compares) for m in modes
    }
    figures["compare_attainable"] = {
        m: statistics.median(attainable(bound(pair, r[m]), prompt_share(r["ar"])) for r in compares)
        for m in modes
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
