"""Hugging Face Spaces entry point: the DIVERSED demo app.

The model pair comes from --target/--draft/--device, else the DIVERSED_TARGET / DIVERSED_DRAFT /
DIVERSED_DEVICE environment variables, else the embedded SmolLM2 pair on the best device.
"""
import argparse
import os
import sys

from diversed_demo.models import EMBEDDED, PairError, load_pair
from diversed_demo.ui import build_app, launch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("DIVERSED_TARGET") or EMBEDDED)
    parser.add_argument("--draft", default=os.environ.get("DIVERSED_DRAFT") or None)
    parser.add_argument("--device", default=os.environ.get("DIVERSED_DEVICE") or "auto")
    # Spaces (and some launchers) may pass their own arguments: ignore what we do not know.
    return parser.parse_known_args(argv)[0]


if __name__ == "__main__":
    args = parse_args()
    try:
        pair = load_pair(args.target, args.draft, args.device)
    except PairError as err:
        sys.exit(f"app.py: cannot load the model pair: {err}")
    launch(build_app(pair))
