"""The app's decode and compare handlers on this machine's device, as a visitor's first minute runs them:
the launcher's pair (measured dtype), its opening (N, mode, example), one Decode and one Compare through
the tabs' own handlers, each with its wall time and what the page would show, as text. Run by
.device/check on a lent GPU; `python .device/app_handlers.py --device cpu` runs it here."""

from __future__ import annotations

import argparse
import html
import re
import time

START = time.perf_counter()

from diversed_demo.runtime.plan import load_pair  # noqa: E402
from diversed_demo.ui.app import build_app  # noqa: E402
from diversed_demo.ui.examples import load_examples  # noqa: E402
from diversed_demo.ui.opening import measured_opening  # noqa: E402
from diversed_demo.ui.tabs.compare import on_compare  # noqa: E402
from diversed_demo.ui.tabs.decode import on_generate  # noqa: E402


def text(fragment, sep: str = " ") -> str:
    """An HTML fragment as the words a visitor reads (sep between elements: "" for the token spans)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", sep, str(fragment))).split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    pair = load_pair("smollm2-135m", device=args.device, compiled="wait")  # CUDA graphs on a GPU
    examples = load_examples()
    start = measured_opening(pair, examples)
    build_app(pair, examples, start=start)  # every tab builds on this device
    s, prompt = start.settings, examples[start.example_index].prompt
    print(f"runtime: {pair.runtime}")
    print(f"opened in {time.perf_counter() - START:.1f} s: {s}")
    values = (s.ensemble_weight, s.head_name, s.n_draft, s.max_new_tokens, s.temperature, s.seed)

    began = time.perf_counter()
    *_, (tokens, stats, _chart, _files) = on_generate(pair, prompt, s.mode, *values)
    print(f"\nDecode ({s.mode}) in {time.perf_counter() - began:.1f} s: {text(stats)}")
    kept = re.sub(r'<span class="dd-tok dd-rejected[^>]*>[^<]*</span>', "", tokens)  # struck-through drafts
    print(f"  text: {text(kept, sep='')[:400]}")

    began = time.perf_counter()
    *_, last = on_compare(pair, examples, prompt, *values)
    *_panels, _time_chart, _acceptance_chart, table, verdict, _files = last
    print(f"\nCompare in {time.perf_counter() - began:.1f} s: {text(verdict)}")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
