"""End-to-end: the app served on localhost with a tiny pair, driven in headless Chromium.

Needs Debian's chromium at /usr/bin/chromium (or $CHROMIUM) and the playwright Python package; without
the browser it is skipped locally and fails in CI. Saves a screenshot of each tab to a temporary folder, or
to $DIVERSED_SCREENSHOTS: `make screenshots` refreshes the README's (assets/screenshots/) that way.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = "the cat sat on the mat and"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`diversed-demo app` on a tiny pair, in a subprocess; its URL once it answers."""
    from diversed_demo.tiny import save_tiny_pair
    root = tmp_path_factory.mktemp("browser")
    target, draft = save_tiny_pair(root)
    port = free_port()
    env = dict(os.environ, DIVERSED_HEADS_DIR=str(root / "heads"), GRADIO_ANALYTICS_ENABLED="False")
    log = open(root / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "diversed_demo.cli", "app", "--target", target, "--draft", draft,
                                "--device", "cpu", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the app did not start:\n{(root / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


README_SCREENSHOTS = Path(__file__).resolve().parent.parent / "assets" / "screenshots"
TRACKED_MTIMES = {p.name: p.stat().st_mtime_ns for p in README_SCREENSHOTS.glob("*.png")}


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("DIVERSED_SCREENSHOTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        # CI must run this test: there a missing browser is a failure, not a skip.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"no Chromium at {CHROMIUM} (make chromium, i.e. apt-get install chromium, or set $CHROMIUM)")
    from playwright import sync_api
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(server)
        page.wait_for_selector("#generate")
        yield page
        context.close()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def set_slider(page, elem_id: str, value: float) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(f"document.querySelector('#{elem_id} input[type=range]').value == '{value}'")


def generate(page, w: float, seed: int, prompt: str = PROMPT) -> None:
    """Press Generate and wait until the stats say this run (its w and seed) is done."""
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#seed input").fill(str(seed))
    page.locator("#generate").click()
    page.wait_for_selector(f"#stats .dd-stats[data-state=done][data-w='{w:g}'][data-seed='{seed}']")


def acceptance_shown(page) -> str:
    return page.locator("#stats .dd-stat-value").first.inner_text()


def test_generate_shows_coloured_tokens_with_w_in_tooltips(page, screenshots):
    set_slider(page, "w-slider", 0.5)
    generate(page, 0.5, seed=1)
    tokens = page.locator("#tokens .dd-tok")
    assert tokens.count() > 0
    classes = " ".join(tokens.nth(i).get_attribute("class") for i in range(tokens.count()))
    assert re.search(r"dd-(accepted|resampled|bonus)", classes)
    titles = [tokens.nth(i).get_attribute("title") for i in range(tokens.count())]
    assert all(title and "w_t = " in title and "p(x)" in title for title in titles)
    assert any(re.search(r"w_t = 0\.500", title) for title in titles)  # the static weight reached the decoder
    page.locator("#w-chart .js-plotly-plot").wait_for()
    page.screenshot(path=str(screenshots / "decode.png"), full_page=True)


def test_moving_the_slider_changes_acceptance(page):
    set_slider(page, "w-slider", 1)
    generate(page, 1, seed=2)
    exact = acceptance_shown(page)
    set_slider(page, "w-slider", 0)
    generate(page, 0, seed=2)
    relaxed = acceptance_shown(page)
    # w = 0 makes nu = q, so every draft passes; w = 1 is exact SD, which a random tiny pair mostly fails.
    assert relaxed == "100%"
    assert exact != relaxed


def test_train_a_head_then_decode_with_it_and_cancel_a_run(page, screenshots):
    open_tab(page, "Train")
    status = page.locator("#train-status")
    # A short run to the end: its head appears at once in the sidebar's dropdown.
    set_slider(page, "train-steps", 2)
    set_slider(page, "train-rollouts", 2)
    page.locator("#train-start").click()
    status.get_by_text(re.compile("Finished")).wait_for()
    head_name = re.search(r"saved as (\S+)", status.inner_text()).group(1)
    assert page.locator("#head input").input_value() == head_name

    open_tab(page, "Decode")
    page.get_by_role("radio", name="DIVERSED").check()
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#seed input").fill("5")
    page.locator("#generate").click()
    page.wait_for_selector("#stats .dd-stats[data-state=done][data-mode=dynamic][data-seed='5']")
    titles = page.locator("#tokens .dd-tok").evaluate_all("tokens => tokens.map(t => t.title)")
    assert any(re.search(r"w_t = (?!n/a)", title) for title in titles)

    # A long run, cancelled from the page.
    open_tab(page, "Train")
    set_slider(page, "train-steps", 100)
    page.locator("#train-start").click()
    status.get_by_text(re.compile("Training…")).wait_for()
    page.locator("#train-cancel").click()
    status.get_by_text(re.compile("Cancelled at")).wait_for()
    page.screenshot(path=str(screenshots / "train.png"), full_page=True)


def test_compare_shows_runs_charts_and_table(page, screenshots):
    """After the training test, DIVERSED has a head and runs too; without one it is skipped with a note."""
    set_slider(page, "w-slider", 0.5)
    open_tab(page, "Compare")
    page.locator("#compare-prompt textarea").fill(PROMPT)
    page.locator("#compare").click()
    # The dataframe keeps hidden measuring copies of its cells, so read its text rather than locate cells.
    with_head = bool(page.locator("#head input").input_value())
    modes = ["Target only", "Exact SD", "Static ensemble"] + (["DIVERSED"] if with_head else [])
    page.wait_for_function("modes => modes.every(mode => document.querySelector('#compare-table').innerText"
                           ".includes(mode))", arg=modes)
    page.locator("#compare-acceptance .js-plotly-plot").wait_for()
    page.locator("#compare-elapsed .js-plotly-plot").wait_for()
    assert page.locator(".dd-panel .dd-tok").count() > 0
    page.screenshot(path=str(screenshots / "compare.png"), full_page=True)


def test_dial_sweep_draws_charts(page, screenshots):
    open_tab(page, "Speed–quality dial")
    page.get_by_role("button", name="Run sweep").click()
    page.locator("#dial-quality .js-plotly-plot").wait_for()
    page.locator("#dial-speed .js-plotly-plot").wait_for()
    page.screenshot(path=str(screenshots / "dial.png"), full_page=True)


def test_bad_input_reaches_the_user_as_a_message(page, tmp_path):
    open_tab(page, "Decode")
    page.locator("#prompt textarea").fill("")
    page.locator("#generate").click()
    page.get_by_text("the prompt is empty").first.wait_for()

    open_tab(page, "Train")
    page.get_by_role("radio", name="Uploaded JSONL").check()
    upload = tmp_path / "prompts.jsonl"
    upload.write_text('{"prompt": "the cat"}\n{"prompt": \n')
    page.locator("#train-upload input[type=file]").set_input_files(str(upload))
    page.locator("#train-upload").get_by_text("prompts.jsonl").first.wait_for()
    page.locator("#train-start").click()
    page.get_by_text(re.compile("line 2: not valid JSON")).first.wait_for()


def test_about_tab(page, screenshots):
    open_tab(page, "About")
    page.get_by_text("Leviathan").first.wait_for()
    page.screenshot(path=str(screenshots / "about.png"), full_page=True)


@pytest.mark.skipif(bool(os.environ.get("DIVERSED_SCREENSHOTS")), reason="refreshing the README's screenshots")
def test_a_test_run_leaves_the_readme_screenshots_alone(page):
    assert {p.name: p.stat().st_mtime_ns for p in README_SCREENSHOTS.glob("*.png")} == TRACKED_MTIMES
