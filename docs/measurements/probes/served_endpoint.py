"""The app's first example through the served endpoint against `diversed-demo generate` (docs/measurements/
speed.md, "The served app beside its client"): app.py started on the user cache (warm: the compiled passes
built), then per mode ROUNDS rounds of one decode through /generate (a gradio_client in this process, as a
visitor's page shares the cores) followed by one CLI decode; prints the tokens/s of each and the median of the
rounds' ratios. `python docs/measurements/probes/served_endpoint.py [0]`: 0 runs the app with the thread
watch off (DIVERSED_THREAD_WATCH=0).
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import cold_start  # noqa: E402

from diversed_demo.ui.examples import load_examples  # noqa: E402

ROUNDS = 5


def main() -> None:
    env = dict(os.environ, GRADIO_SERVER_PORT=str(cold_start.PORT))
    env.pop("DIVERSED_DTYPE_CHOICES", None)
    if sys.argv[1:] == ["0"]:
        env["DIVERSED_THREAD_WATCH"] = "0"
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "served_endpoint_app.log"
    app, page_s = cold_start.start_app(env, log)
    print(f"page served after {page_s:.1f} s", flush=True)
    prompt = load_examples()[0].prompt
    try:
        time.sleep(15)  # the start's own timing work, after the page is up
        for mode in cold_start.MODES:
            apps, clis = [], []
            for _ in range(ROUNDS):
                apps.append(cold_start.decode_speed(cold_start.URL, mode, prompt, auto_n=True))
                clis.append(cold_start.cli_speed(mode, prompt, env))
            ratio = statistics.median(a / c for a, c in zip(apps, clis))
            print(json.dumps({"mode": mode, "app": apps, "cli": clis, "median_ratio": ratio}), flush=True)
    finally:
        cold_start.stop(app)


if __name__ == "__main__":
    main()
