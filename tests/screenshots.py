"""The README's screenshots, of the app on the embedded pair as a visitor first sees it: the arrival and each
tab at 1400 px after a first Compare, and the arrival and a Compare at 390 px; then a Decode that drafted
trees and a Compare with exact SD on trees beside the chains, at both widths. `make screenshots` runs it
(it is not a test: the browser test takes its own, of a tiny pair, to a temporary folder);
`python tests/screenshots.py trees` takes the trees' alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cold_start import builds_running
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("DIVERSED_SCREENSHOTS", ROOT / "assets" / "screenshots"))
PORT = 7899
TIMEOUT_MS = 180_000
BUILD_S = 600  # the longest a first start's background build is waited for (Zen 3: about 3 minutes)
QUIET_S = 15  # seconds with no build running: the kernel's build and the passes' follow each other


def serve() -> subprocess.Popen:
    """`diversed-demo app` on the embedded pair, once it answers and has built what a first start builds
    in the background (the GGUF kernel, the compiled passes): the README shows the app as it then runs."""
    app = subprocess.Popen([sys.executable, "-m", "diversed_demo.cli", "app", "--port", str(PORT)])
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/", timeout=2)
            break
        except OSError:
            if app.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the app did not start") from None
            time.sleep(1)
    quiet_since, deadline, said = time.monotonic(), time.monotonic() + BUILD_S, False
    while time.monotonic() - quiet_since < QUIET_S and time.monotonic() < deadline:
        if builds_running(also=(b"cc1plus",)):  # the compiled passes' worker, or g++ on the kernel
            if not said:
                print("waiting for the app's background build", flush=True)
            quiet_since, said = time.monotonic(), True
        time.sleep(2)
    return app


def shoot(page, name: str) -> None:
    page.wait_for_timeout(800)  # plotly's resize after a tab switch
    page.screenshot(path=str(OUT / name), full_page=True)
    print("wrote", OUT / name)


def run_to_end(page, button: str, done: str) -> None:
    """Click `button` and wait for `done` of this run: an earlier run's is shown until the new one starts."""
    page.locator(button).click()
    page.wait_for_selector(done, state="detached", timeout=TIMEOUT_MS)
    page.wait_for_selector(done, timeout=TIMEOUT_MS)


def compare(page, name: str) -> None:
    """Run Compare on the example it opens with, and shoot the page once its verdict is in."""
    page.get_by_role("tab", name="Compare").click()
    run_to_end(page, "#compare", "#compare-verdict .dd-verdict[data-state=done]")
    shoot(page, name)


def wide(page) -> None:
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"http://127.0.0.1:{PORT}/")
    page.wait_for_selector("#generate")
    shoot(page, "arrival.png")
    compare(page, "compare.png")
    page.get_by_role("tab", name="Decode").click()
    run_to_end(page, "#generate", "#stats .dd-stats[data-state=done]")
    shoot(page, "decode.png")
    for tab, name in (
        ("Speed–quality dial", "dial.png"),
        ("Results", "results.png"),
        ("Train", "train.png"),
        ("About", "about.png"),
    ):
        page.get_by_role("tab", name=tab).click()
        shoot(page, name)


def narrow(page) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"http://127.0.0.1:{PORT}/")
    page.wait_for_selector("#generate")
    page.wait_for_function("!document.querySelector('#sidebar.open')")
    shoot(page, "narrow.png")
    compare(page, "narrow-compare.png")


def trees(page) -> None:
    """A Decode that drafted trees ("drafts: trees" in the sidebar), its last trees under the tokens, then a
    Compare with exact SD on trees beside the chains: at 1400 px, then at 390 px (the choice made at 1400,
    where the sidebar is open)."""
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"http://127.0.0.1:{PORT}/")
    page.wait_for_selector("#generate")
    page.locator("#drafts").get_by_text("trees", exact=True).click()
    for width, height, name in ((1400, 1000, "decode-trees.png"), (390, 844, "narrow-decode-trees.png")):
        page.set_viewport_size({"width": width, "height": height})
        if width < 1000 and page.locator("#sidebar.open").count():  # it covers the page on a phone
            page.locator("#sidebar .toggle-button").click()
            page.wait_for_function("!document.querySelector('#sidebar.open')")
        page.get_by_role("tab", name="Decode").click()
        run_to_end(page, "#generate", "#stats .dd-stats[data-state=done]")
        page.wait_for_selector("#tokens .dd-tree")
        shoot(page, name)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-trees input").check()
    for width, height, name in ((1400, 1000, "compare-trees.png"), (390, 844, "narrow-compare-trees.png")):
        page.set_viewport_size({"width": width, "height": height})
        compare(page, name)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    app = serve()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium")
            )
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            if sys.argv[1:] != ["trees"]:
                wide(page)
                narrow(page)
            trees(page)
            browser.close()
    finally:
        app.terminate()
        app.wait(30)


if __name__ == "__main__":
    main()
