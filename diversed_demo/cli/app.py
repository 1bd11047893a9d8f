"""`diversed-demo app`: launch the Gradio app on the pair the arguments name."""

from __future__ import annotations

import sys

from . import shared


def add_app_arguments(parser) -> None:
    shared.add_pair_arguments(parser)
    parser.add_argument(
        "--host", default=None, help="interface to listen on (default 127.0.0.1; 0.0.0.0 to share on a LAN)"
    )
    parser.add_argument("--port", type=int, default=None, help="port (default 7860 or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument(
        "--allow-training",
        action="store_true",
        help="keep the Train tab on where the app is public (--share, a non-loopback --host, a Space)",
    )
    parser.set_defaults(func=run_app)


def run_app(args) -> int:
    from ..runtime.model_thread import MODEL_THREAD
    from ..runtime.plan import after_serving
    from ..ui.app import build_app, launch
    from ..ui.examples import load_examples
    from ..ui.opening import measured_opening
    from ..ui.space import mark_public

    warning = mark_public(args.host, args.share, args.allow_training)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    # The model's work all runs on one thread, the one that decodes for visitors (runtime/model_thread.py).
    pair = MODEL_THREAD.call(shared.pair_from_args, args, compiled="background", serve_first=True)
    examples = load_examples()
    app = build_app(pair, examples, start=MODEL_THREAD.call(measured_opening, pair, examples))
    MODEL_THREAD.submit(after_serving, pair)  # the draft length's timings checked while the page comes up
    launch(app, server_name=args.host, server_port=args.port, share=args.share)
    return 0
