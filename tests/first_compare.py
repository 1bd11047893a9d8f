"""The first minute, measured: start the app's launcher as `make demo` does (the measured dtype, N and
opening settings, the compiled pass), run the first example's Compare, and print its speed-ups.
`make first-compare` runs it in five fresh processes (each an app start); not a test."""

from __future__ import annotations

import time

START = time.perf_counter()

from diversed_demo.runtime.plan import load_pair  # noqa: E402
from diversed_demo.ui.examples import load_examples  # noqa: E402
from diversed_demo.ui.opening import measured_opening  # noqa: E402
from diversed_demo.ui.runs import speed_sentence, stream_comparison  # noqa: E402


def main() -> None:
    pair = load_pair("smollm2-135m", compiled="wait")  # as a start after the first on this machine finds it
    examples = load_examples()
    start = measured_opening(pair, examples)
    settings, example = start.settings, examples[start.example_index]
    print(
        f"opened in {time.perf_counter() - START:.1f} s at N = {settings.n_draft}, "
        f"w = {settings.ensemble_weight:g}, T = {settings.temperature:g}, head {settings.head_name}"
    )
    *_, comparison = stream_comparison(pair, example.prompt, settings, example)  # run to the end
    print(speed_sentence(comparison))


if __name__ == "__main__":
    main()
