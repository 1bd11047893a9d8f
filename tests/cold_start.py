"""The first minute from an empty cache, measured: start `app.py` as `make demo` does with a fresh user
cache, time until its page is served, decode the first example at once (while the compiled passes are
built in the background), wait for the build, and decode it again. `make cold-start` runs it; not a test.

Prints the seconds to a served page and the two decodes' tokens/s (greedy target-only and exact SD, the
same text each time), and their ratio: what a first visitor gets against the steady speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PORT = 7871
PROMPT = "Explain why the sky is blue in two or three sentences."
MODES = ("ar", "exact")
NEW_TOKENS = 96


def served(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def decode_speed(url: str, mode: str) -> float:
    """tokens/s of one greedy decode through the served app's /generate endpoint (from its trace)."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    *_, files = client.predict(PROMPT, mode, 1.0, None, 2, NEW_TOKENS, 0.0, 0, api_name="/generate")
    trace = next(f for f in files if str(f).endswith(".json"))
    return json.loads(Path(trace).read_text())["runs"][0]["summary"]["tokens_per_second"]


def builds_running() -> bool:
    """Whether a background build of the compiled passes (runtime/build_worker.py) is still going."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"runtime.build_worker" in cmdline.read_bytes():
                return True
        except OSError:  # the process ended while we looked
            pass
    return False


def main() -> None:
    cache = Path(tempfile.mkdtemp(prefix="diversed-cold-"))
    env = dict(os.environ, DIVERSED_CACHE=str(cache), GRADIO_SERVER_PORT=str(PORT))
    env.pop("DIVERSED_DTYPE_CHOICES", None)
    url = f"http://127.0.0.1:{PORT}/"
    start = time.perf_counter()
    log = cache / "app.log"
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, "app.py"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not served(url):
            if app.poll() is not None:
                sys.exit(f"app.py ended: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        print(f"page served {time.perf_counter() - start:.1f} s after start, from an empty cache")
        building = builds_running()
        first = {mode: decode_speed(url, mode) for mode in MODES}
        print(f"first decodes ({'during the background build' if building else 'no build running'}): {first}")
        # The compiled build starts after the AMX kernel's operands are swapped in, between decodes.
        deadline = time.perf_counter() + 900
        while (builds_running() or not list(cache.glob("compiled/*.pt2"))) and time.perf_counter() < deadline:
            time.sleep(2)
        print(f"background build done {time.perf_counter() - start:.0f} s after start")
        time.sleep(20)  # the finished build's packages are loaded and checked by the app's own thread
        decode_speed(url, "ar")  # a warm-up decode on the attached passes
        steady = {mode: decode_speed(url, mode) for mode in MODES}
        print(f"steady decodes: {steady}")
        print("first ÷ steady: " + ", ".join(f"{m} {first[m] / steady[m]:.2f}" for m in MODES))
        lines = [line for line in log.read_text().splitlines() if "http" not in line and "%|" not in line]
        print("the app's log:\n" + "\n".join(lines))
    finally:
        app.terminate()
        app.wait(timeout=30)


if __name__ == "__main__":
    main()
