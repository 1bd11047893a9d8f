"""End-to-end: the app served on localhost with a tiny pair, driven in headless Chromium.

The pair comes with one head and a frontier card (the shipped general card's figures, rebound to the tiny
pair), so the page arrives as the embedded pair's does: an example filled in, DIVERSED selected, a drawn
frontier. Needs Debian's chromium at /usr/bin/chromium (or $CHROMIUM) and the playwright Python package;
without the browser it is skipped locally and fails in CI. Saves a screenshot of each tab (and of the
page at 390 px) to a temporary folder, or to $DIVERSED_SCREENSHOTS; the README's, of the embedded pair, come
from tests/screenshots.py (`make screenshots`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

# Slow too: the app's server and Chromium take about 10 s to start, whichever test runs first.
pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROMPT = "the cat sat on the mat and"
TIMEOUT_MS = 60_000
CARDED_HEAD = "carded"
FIRST_EXAMPLE = next(
    iter(
        json.loads(
            (Path(__file__).resolve().parents[2] / "assets" / "prompts" / "examples.json").read_text()
        ).values()
    )
)[0]["prompt"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`diversed-demo app` on a tiny pair, in a subprocess; its URL once it answers."""
    from tiny import save_tiny_pair

    root = tmp_path_factory.mktemp("browser")
    target, draft = save_tiny_pair(root)
    carded_head(target, draft, root / "heads")
    port = free_port()
    env = dict(os.environ, DIVERSED_HEADS_DIR=str(root / "heads"), GRADIO_ANALYTICS_ENABLED="False")
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diversed_demo.cli",
            "app",
            "--target",
            target,
            "--draft",
            draft,
            "--device",
            "cpu",
            "--dtype",
            "float32",  # the tests' streams are fp32's (auto would time the tiny pair and might pick bf16)
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
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


def carded_head(target: str, draft: str, heads: Path) -> None:
    """A fresh head of the tiny pair in the server's heads folder, with the shipped general head's card
    (its frontier figures) bound to it: what the dial and the header draw on arrival."""
    from diversed_demo.models.heads import HEADS_DIR, new_head, pair_identity, save_head
    from diversed_demo.runtime.plan import load_pair

    pair = load_pair(target, draft, "cpu", "float32")
    save_head(new_head(pair), heads / f"{CARDED_HEAD}.safetensors")
    card = json.loads((HEADS_DIR / "general.json").read_text())
    card.update(head=CARDED_HEAD, pair=pair_identity(pair))
    (heads / f"{CARDED_HEAD}.json").write_text(json.dumps(card))


README_SCREENSHOTS = Path(__file__).resolve().parents[2] / "assets" / "screenshots"
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
            f"no Chromium at {CHROMIUM} (make chromium, i.e. apt-get install chromium, or set $CHROMIUM)"
        )
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1440, "height": 1000},
        )
        page = context.new_page()
        track_requests(page)
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(server)
        page.wait_for_selector("#generate")
        yield page
        context.close()


def track_requests(page) -> None:
    """Keep the page's unfinished requests in `page.in_flight` (url by request), for a failure's message."""
    page.in_flight = {}
    page.on("request", lambda request: page.in_flight.__setitem__(request, request.url))
    page.on("requestfinished", lambda request: page.in_flight.pop(request, None))
    page.on("requestfailed", lambda request: page.in_flight.pop(request, None))


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def set_slider(page, elem_id: str, value: float) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(f"document.querySelector('#{elem_id} input[type=range]').value == '{value}'")


def generate(page, w: float, seed: int, prompt: str = PROMPT) -> None:
    """Press Generate in static mode at w and wait until the stats say this run (its w and seed) is done."""
    page.get_by_role("radio", name="Static ensemble").check()
    set_slider(page, "w-slider", w)
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#seed input").fill(str(seed))
    page.locator("#generate").click()
    page.wait_for_selector(f"#stats .dd-stats[data-state=done][data-w='{w:g}'][data-seed='{seed}']")


def acceptance_shown(page) -> str:
    return page.locator("#stats .dd-stat-value").first.inner_text()


# The page as it arrives: these tests run first, before any other changes it.


def test_arrival_fills_in_the_first_example(page):
    assert page.locator("#prompt textarea").input_value() == FIRST_EXAMPLE


def test_arrival_selects_diversed_with_the_carded_head(page):
    assert page.get_by_role("radio", name="DIVERSED").is_checked()
    assert page.locator("#head input").input_value() == CARDED_HEAD


def test_arrival_says_what_to_click_first(page):
    assert "Start with Compare" in page.locator(".dd-lede").inner_text()


def test_arrival_shows_the_key_measured_result_with_its_source(page):
    """The bench report run on the kind of machine that serves the page (the server decodes on the CPU)."""
    import types

    import torch

    from diversed_demo.common.paths import shown_path
    from diversed_demo.ui.results_summary import bench_here

    source = str(shown_path(bench_here(types.SimpleNamespace(device=torch.device("cpu")))))
    assert source.startswith("results/bench") and source in page.locator(".dd-headline").inner_text()


def test_arrival_notes_the_opening_settings_in_two_short_sentences(page):
    note = page.locator("#sidebar .prose").first.inner_text()
    assert (
        "Opened with N chosen step by step (N =" in note and note.count(". ") <= 2
    )  # two short sentences, the rest folded


def test_the_first_generate_needs_no_typing(page):
    """The example and the measured settings are already there."""
    page.locator("#generate").click()
    page.wait_for_selector("#stats .dd-stats[data-state=done][data-mode=dynamic]")
    assert page.locator("#tokens .dd-tok").count() > 0


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
    # N fixed: the opening N is timed on the machine, and at some N this run's EOS lands inside a block,
    # leaving a drafted token unverified (neither accepted nor rejected).
    set_slider(page, "n-draft", 4)
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
    from playwright.sync_api import expect

    expect(page.locator("#head input")).to_have_value(
        head_name
    )  # the same update; the DOM may lag the status

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
    assert page.locator("#compare-prompt textarea").input_value() == FIRST_EXAMPLE  # filled in on arrival too
    page.locator("#compare-prompt textarea").fill(PROMPT)
    assert not page.locator("#compare-trees-panel").is_visible()  # a tree beside the chains, on request
    page.locator("#compare-trees input").check()
    page.locator("#compare-trees-panel").wait_for()
    page.locator("#compare").click()
    # The dataframe keeps hidden measuring copies of its cells, so read its text rather than locate cells.
    with_head = bool(page.locator("#head input").input_value())
    modes = ["Target only", "Exact SD", "Static ensemble", "Exact SD on trees"] + (
        ["DIVERSED"] if with_head else []
    )
    page.wait_for_function(
        "modes => modes.every(mode => document.querySelector('#compare-table').innerText.includes(mode))",
        arg=modes,
    )
    page.locator("#compare-acceptance .js-plotly-plot").wait_for()
    page.locator("#compare-elapsed .js-plotly-plot").wait_for()
    assert page.locator(".dd-panel .dd-tok").count() > 0
    verdict = page.locator("#compare-verdict .dd-verdict[data-state=done]")
    verdict.wait_for()
    text = verdict.inner_text()
    assert re.search(r"against the target alone: exact speculative decoding [\d.]+×", text), text
    assert re.search(r"(DIVERSED|Static ensemble): kept \d+% of the drafted tokens", text), text
    assert "One prompt is too few to judge quality" in text
    # Each relaxed output says where it leaves target-only decoding (a marked token, or that it never does).
    departures = page.locator(".dd-departure").all_inner_texts()
    assert any("departs from target only at token" in d or "same tokens" in d for d in departures)
    assert page.locator(".dd-panel .dd-departs").count() == sum("departs from" in d for d in departures)
    trace_link(page, "compare-trace", ".json").wait_for()
    trace_link(page, "compare-trace", ".csv").wait_for()
    page.locator("#results-link").click()
    page.locator("#results-headline").wait_for()
    open_tab(page, "Compare")
    page.screenshot(path=str(screenshots / "compare.png"), full_page=True)


def plotted_symbols(page, elem_id: str) -> list:
    return page.evaluate(
        f"[...document.querySelector('#{elem_id} .js-plotly-plot').data]"
        ".map(trace => (trace.marker || {}).symbol || null)"
    )


def open_dial(page) -> None:
    """The Speed–quality dial tab, its three charts drawn."""
    open_tab(page, "Speed–quality dial")
    for chart in ("quality", "acceptance", "projection"):
        page.locator(f"#dial-{chart} .js-plotly-plot").wait_for()


def test_the_dial_opens_on_the_shipped_frontier_without_a_sweep(page):
    open_dial(page)
    assert "Shipped frontier" in page.locator("#dial-note").inner_text()


def test_the_dial_compares_no_speeds_measured_at_different_times(page):
    open_dial(page)
    assert page.locator("#dial-speed").count() == 0


def test_the_dials_verdict_places_the_carded_head_against_the_static_frontier(page):
    open_dial(page)
    verdict = page.locator("#dial-verdict").inner_text()
    assert CARDED_HEAD in verdict and "static frontier" in verdict and "95% CI" in verdict


def test_the_dial_draws_the_head_as_a_star_beside_the_static_points(page):
    open_dial(page)
    assert "star" in plotted_symbols(page, "dial-quality")


def test_the_dials_acceptance_chart_draws_the_theory_line(page):
    open_dial(page)
    names = page.evaluate(
        "[...document.querySelector('#dial-acceptance .js-plotly-plot').data].map(t => t.name || '')"
    )
    assert any("theory" in name for name in names)


def test_the_dial_shows_the_transformers_snippet(page):
    open_dial(page)
    assert "assistant_ensemble_weight" in page.locator("#dial-snippet").inner_text()


def test_a_gpu_preset_moves_c_and_redraws_the_projection(page, screenshots):
    open_dial(page)
    title = "document.querySelector('#dial-projection .js-plotly-plot').layout.title.text"
    assert "c = 0.064" not in page.evaluate(title)
    page.locator("#cost-preset input").click()
    page.get_by_role("option", name=re.compile("Qwen2.5-7B")).click()
    page.wait_for_function(f"{title}.includes('c = 0.064')")
    page.screenshot(path=str(screenshots / "dial.png"), full_page=True)


def test_dial_sweep_redraws_with_the_users_measurements(page):
    open_tab(page, "Speed–quality dial")
    page.get_by_text("Live sweep").click()
    page.locator("#sweep").click()
    page.locator("#dial-note").get_by_text("Your sweep").wait_for()
    page.locator("#shipped").click()
    page.locator("#dial-note").get_by_text("Shipped frontier").wait_for()


def test_results_tab_leads_with_the_headline_and_folds_the_raw_tables(page, screenshots):
    open_tab(page, "Results")
    # The dataframe keeps hidden measuring copies of its cells: read its text rather than locate cells.
    page.wait_for_function(
        "text => document.querySelector('#results-headline')?.innerText.includes(text)",
        arg=CARDED_HEAD,
    )
    page.locator("#results-headline-figure .js-plotly-plot").wait_for()
    assert "goal" not in page.locator("#tabs").inner_text().lower()  # results, not the project's tracking
    page.get_by_text("Every frontier point (table)").click()
    page.wait_for_function(
        "text => document.querySelector('#results-frontier')?.innerText.includes(text)",
        arg=f"DIVERSED head {CARDED_HEAD}",
    )
    page.get_by_text("Bench report: Quality on the referenced categories").click()
    page.get_by_text("--json results/quality.json").first.wait_for()  # the report not shipped yet
    page.screenshot(path=str(screenshots / "results.png"), full_page=True)


def trace_link(page, elem_id: str, suffix: str):
    """The download link of the file ending in `suffix` in a File component's list."""
    row = page.locator(f"#{elem_id} tr", has=page.locator(".ext", has_text=suffix))
    return row.locator("td.download a").first


def visible_file_name(page, elem_id: str, name: str):
    """A File component's shown name of an uploaded file (Gradio keeps hidden copies of it too)."""
    return page.locator(f"#{elem_id}").get_by_text(name).locator("visible=true").first


def upload(page, elem_id: str, path, reopen=None) -> None:
    """Choose `path` in a File component, as a visitor does, and wait until the component shows it. A file
    left there (by an earlier test on this page: their order varies between workers) is cleared first, as
    the box takes a new one only once emptied. On a loaded machine Gradio may redraw the box just after a
    file is set (a previous update arriving late), which drops the file; a visitor would see an empty box
    and choose again, and so does this. Where the box still shows nothing (CI met it once: 105 s without
    the name), the visitor reloads the page, `reopen(page)` brings the box back, and chooses once more."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for attempt in range(3):
        if attempt == 2 and reopen is not None:
            page.reload()
            page.wait_for_selector("#generate")
            reopen(page)
        box = page.locator(f"#{elem_id}")
        clear = box.locator("button[aria-label='Clear']").locator("visible=true")
        if clear.count():
            clear.first.click()
        try:
            box.locator("input[type=file]").set_input_files(str(path), timeout=15_000)
            visible_file_name(page, elem_id, path.name).wait_for(timeout=30_000)
            return
        except PlaywrightTimeoutError:
            continue
    shown = page.locator(f"#{elem_id}").inner_text(timeout=5_000)
    pytest.fail(
        f"#{elem_id} never showed {path.name} (three choices, the last after a reload where possible); "
        f"the box shows {shown!r}; requests in flight: {sorted(page.in_flight.values())}"
    )


def test_a_decode_trace_downloads_and_replays_without_models(page, tmp_path):
    open_tab(page, "Decode")
    generate(page, 0.5, seed=7)
    decoded = shown_tokens(page)
    assert decoded
    page.get_by_text("Trace: download this run").click()
    link = trace_link(page, "decode-trace", ".json")
    with page.expect_download() as download:
        link.click()
    trace_path = tmp_path / "trace.json"
    download.value.save_as(trace_path)
    trace = json.loads(trace_path.read_text())
    assert trace["runs"][0]["settings"]["seed"] == 7 and trace["pair"]["draft"]
    assert {"kind", "w", "p", "q", "accept_prob", "elapsed_s"} <= set(trace["runs"][0]["events"][0])

    # Another decode replaces the view; the replay brings the traced one back.
    generate(page, 0.5, seed=8)
    open_replay(page)  # the fold, if a redraw closed it
    replay(page, trace_path, page.locator("#stats .dd-stats[data-state=done][data-replay][data-seed='7']"))
    assert shown_tokens(page) == decoded

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    replay(page, bad, page.get_by_text("not a DIVERSED trace").first)


def shown_tokens(page) -> list:
    """The decoded tokens as shown: each one's text, fate and tooltip."""
    return page.locator("#tokens .dd-tok").evaluate_all(
        "tokens => tokens.map(t => [t.textContent, t.className, t.title])"
    )


def replay(page, path, shown) -> None:
    """Choose `path` for Replay, press it and wait until `shown` (a locator) is visible. A late redraw on a
    loaded machine can drop the chosen file after it showed (`upload`), and Replay then asks for a file
    instead (CI met it twice, with the good trace and with the bad one); a visitor chooses again, and so
    does this, up to three times."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for _ in range(2):
        upload(page, "replay-file", path, reopen=open_replay)  # the file chosen before cleared first
        page.locator("#replay").click()
        try:
            shown.wait_for(timeout=20_000)
            return
        except PlaywrightTimeoutError:
            continue
    upload(page, "replay-file", path, reopen=open_replay)
    page.locator("#replay").click()
    shown.wait_for()


def open_replay(page) -> None:
    open_tab(page, "Decode")
    if not page.locator("#replay-file").is_visible():  # the trace's fold, closed on a fresh page
        page.get_by_text("Trace: download this run").click()
    page.locator("#replay-file").wait_for(state="visible")


def choose_uploaded_prompts(page) -> None:
    open_tab(page, "Train")
    page.get_by_role("radio", name="Uploaded JSONL").check()
    # The box appears on the server's answer; a file set before that is lost when it is drawn.
    page.locator("#train-upload").wait_for(state="visible")


def test_bad_input_reaches_the_user_as_a_message(page, tmp_path):
    open_tab(page, "Decode")
    page.locator("#prompt textarea").fill("")
    page.locator("#generate").click()
    page.get_by_text("the prompt is empty").first.wait_for()

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n{"prompt": \n')
    choose_uploaded_prompts(page)
    upload(page, "train-upload", prompts, reopen=choose_uploaded_prompts)
    page.locator("#train-start").click()
    page.get_by_text(re.compile("line 2: not valid JSON")).first.wait_for()


def test_about_tab(page, screenshots):
    open_tab(page, "About")
    page.get_by_text("Leviathan").first.wait_for()
    page.screenshot(path=str(screenshots / "about.png"), full_page=True)


def test_the_page_works_390_px_wide(server, page, screenshots):
    phone = page.context.new_page()
    try:
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.goto(server)
        phone.wait_for_selector("#generate")
        phone.wait_for_function("!document.querySelector('#sidebar.open')")  # closed, so it covers nothing
        assert phone.locator("#prompt textarea").input_value() == FIRST_EXAMPLE
        phone.locator("#generate").click()
        phone.wait_for_selector("#stats .dd-stats[data-state=done]")
        # Nothing is wider than the screen: no sideways scrolling of the page.
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        box = phone.locator("#generate").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
        phone.screenshot(path=str(screenshots / "narrow.png"), full_page=True)
        # Tabs that do not fit sit behind "More tabs"; the dial's charts stack into one column.
        phone.get_by_role("button", name="More tabs").click()
        phone.locator("#tabs button", has_text="Speed–quality dial").last.click()
        quality, acceptance = (
            phone.locator(f"#dial-{chart} .js-plotly-plot") for chart in ("quality", "acceptance")
        )
        acceptance.wait_for()
        assert (
            acceptance.bounding_box()["y"]
            >= quality.bounding_box()["y"] + quality.bounding_box()["height"] - 1
        )
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        phone.close()


@pytest.mark.skipif(
    bool(os.environ.get("DIVERSED_SCREENSHOTS")), reason="refreshing the README's screenshots"
)
def test_a_test_run_leaves_the_readme_screenshots_alone(page):
    assert {p.name: p.stat().st_mtime_ns for p in README_SCREENSHOTS.glob("*.png")} == TRACKED_MTIMES
