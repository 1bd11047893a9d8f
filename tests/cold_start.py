"""The first minute from an empty cache, measured: start `app.py` as `make demo` does with a fresh user
cache, time until its page is served, decode at once (while the background work runs: the AMX kernel,
the compiled passes), wait for the build, and decode again. `make cold-start` runs it; not a test.

Prints, greedy, through the served app's /generate endpoint (each decode's tokens/s from its trace):
- the seconds to a served page;
- the first decodes (target-only and exact SD, N = 2) against the same decodes in starts with no
  background work (the eager passes on PyTorch's int4 kernel, as a first visitor's run): "eager alone", one
  start before (its own empty cache) and one after, since the host's speed drifts over minutes;
- once built, the app's first example (N step by step) through the endpoint against `diversed-demo
  generate` on the same prompt and mode, alternating, over ROUNDS rounds: the best of each and the median
  of the rounds' ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PORT = 7871
URL = f"http://127.0.0.1:{PORT}/"
PROMPT = "Explain why the sky is blue in two or three sentences."
MODES = ("ar", "exact")
NEW_TOKENS = 96
EXAMPLE_TOKENS = 128  # the app's own default
ROUNDS = 6
NO_BACKGROUND = {"DIVERSED_COMPILED_PASS": "off", "DIVERSED_AMX": "0"}  # nothing built or swapped in


def served(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def decode_speed(url: str, mode: str, prompt: str = PROMPT, auto_n: bool = False) -> float:
    """tokens/s of one greedy decode through the served app's /generate endpoint (from its trace): N = 2,
    or step by step with `auto_n` (the page's default). The call is Gradio's REST API read with blocking
    reads: gradio_client polls its job every millisecond, 0.2 s of CPU a decode (a fifth of a core, which
    the decode on 2 cores would lose; docs/measurements/speed.md, "The server's idle polling")."""
    tokens = EXAMPLE_TOKENS if auto_n else NEW_TOKENS
    inputs = [prompt, mode, 1.0, None, 2, tokens, 0.0, 0, 4.0, auto_n, "as the runtime chose"]
    call = urllib.request.Request(
        f"{url}gradio_api/call/generate",
        data=json.dumps({"data": inputs}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(call, timeout=30) as response:
        event_id = json.load(response)["event_id"]
    event = None
    with urllib.request.urlopen(f"{url}gradio_api/call/generate/{event_id}", timeout=600) as stream:
        for raw in stream:  # server-sent events: "event: <kind>", then "data: <json>"
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                if event == "error":
                    sys.exit(f"the app's /generate failed: {line}")
                files = json.loads(line.removeprefix("data:"))[-1]
                trace = next(f["path"] for f in files if f["path"].endswith(".json"))
                return json.loads(Path(trace).read_text())["runs"][0]["summary"]["tokens_per_second"]
    sys.exit("the app's /generate stream ended without a result")


def cli_speed(mode: str, prompt: str, env: dict) -> float:
    """tokens/s of `diversed-demo generate` (greedy, N step by step), a process of its own."""
    command = [sys.executable, "-m", "diversed_demo.cli", "generate", "--prompt", prompt, "--mode", mode]
    command += ["--max-new-tokens", str(EXAMPLE_TOKENS), "--temperature", "0", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)["summary"]["tokens_per_second"]


def builds_running(also: tuple[bytes, ...] = ()) -> bool:
    """Whether a background build of the compiled passes (runtime/build_worker.py), or a process whose
    command line holds one of `also`, is still going."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes()
        except OSError:  # the process ended while we looked
            continue
        if any(part in line for part in (b"runtime.build_worker", *also)):
            return True
    return False


def start_app(env: dict, log: Path) -> tuple[subprocess.Popen, float]:
    """app.py started with `env`, once its page is served: the process and the seconds it took."""
    start = time.perf_counter()
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, "app.py"], env=env, stdout=out, stderr=subprocess.STDOUT)
    while not served(URL):
        if app.poll() is not None:
            sys.exit(f"app.py ended: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return app, time.perf_counter() - start


def stop(app: subprocess.Popen) -> None:
    app.terminate()
    app.wait(timeout=30)


def app_against_cli(url: str, env: dict) -> dict:
    """Per mode, the tokens/s of the app's first example through the endpoint and through the CLI, round by
    round (each round's two back to back)."""
    from diversed_demo.ui.examples import load_examples

    prompt = load_examples()[0].prompt
    speeds = {mode: {"app": [], "cli": []} for mode in MODES}
    for _ in range(ROUNDS):
        for mode in MODES:
            speeds[mode]["app"].append(decode_speed(url, mode, prompt, auto_n=True))
            speeds[mode]["cli"].append(cli_speed(mode, prompt, env))
    return speeds


def paced(speeds: dict) -> str:
    """app ÷ CLI per mode: the best of each, and the median of each round's (the host's slower spells,
    which the best of each alone may meet in one path only, cancel within a round)."""
    figures = []
    for mode, runs in speeds.items():
        best = max(runs["app"]) / max(runs["cli"])
        median = statistics.median(app / cli for app, cli in zip(runs["app"], runs["cli"]))
        figures.append(f"{mode} {best:.2f} (best of each), {median:.2f} (median of the rounds')")
    return ", ".join(figures)


def eager_alone(env: dict, log: Path) -> dict:
    """The first decodes of a start with nothing in the background: tokens/s per mode."""
    app, _ = start_app(dict(env, **NO_BACKGROUND), log)
    try:
        return {mode: decode_speed(URL, mode) for mode in MODES}
    finally:
        stop(app)


def main() -> None:
    cache = Path(tempfile.mkdtemp(prefix="diversed-cold-"))
    env = dict(os.environ, DIVERSED_CACHE=str(cache), GRADIO_SERVER_PORT=str(PORT))
    env.pop("DIVERSED_DTYPE_CHOICES", None)
    url, log = URL, cache / "app.log"
    # The eager reference before and after (a start of its own cache before, this one's after): the host's
    # speed drifts over minutes, so the first decodes are set against both.
    before_cache = Path(tempfile.mkdtemp(prefix="diversed-cold-before-"))
    before = eager_alone(dict(env, DIVERSED_CACHE=str(before_cache)), before_cache / "app.log")
    print(f"eager alone, before (a start of its own, no background work): {before}", flush=True)
    app, page_s = start_app(env, log)
    began = time.perf_counter() - page_s
    try:
        print(f"page served {page_s:.1f} s after start, from an empty cache", flush=True)
        building = builds_running()
        first = {mode: decode_speed(url, mode) for mode in MODES}
        print(f"first decodes ({'during the background build' if building else 'no build running'}): {first}")
        # The compiled build starts after the AMX kernel's operands are swapped in, between decodes.
        deadline = time.perf_counter() + 900
        while (builds_running() or not list(cache.glob("compiled/*.pt2"))) and time.perf_counter() < deadline:
            time.sleep(2)
        print(f"background build done {time.perf_counter() - began:.0f} s after start")
        time.sleep(20)  # the finished build's packages are loaded and checked by the app's own thread
        decode_speed(url, "ar")  # a warm-up decode on the attached passes
        steady = {mode: decode_speed(url, mode) for mode in MODES}
        print(f"steady decodes: {steady}")
        speeds = app_against_cli(url, env)
        print("the first example, tokens/s by round: " + json.dumps(speeds))
        print("  app ÷ CLI: " + paced(speeds))
        lines = [line for line in log.read_text().splitlines() if "http" not in line and "%|" not in line]
        print("the app's log:\n" + "\n".join(lines))
    finally:
        stop(app)
    after = eager_alone(env, cache / "app-eager.log")
    print(f"eager alone, after (a second start, no background work): {after}")
    alone = {mode: (before[mode] + after[mode]) / 2 for mode in MODES}
    print(
        "first ÷ eager alone (the mean of before and after): "
        + ", ".join(f"{m} {first[m] / alone[m]:.2f}" for m in MODES)
    )
    print("first ÷ steady: " + ", ".join(f"{m} {first[m] / steady[m]:.2f}" for m in MODES))


if __name__ == "__main__":
    main()
