"""Load: gradio_client clients decode at once while a training run goes on, and a storm of decodes and
replays meets a short queue; every request is served or told the queue is full."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import free_port
from tiny import save_tiny_pair

from diversed_demo import ui
from diversed_demo.runtime.plan import load_pair
from diversed_demo.ui.runs import TrainingJob

pytestmark = pytest.mark.slow

CLIENTS = 8
PROMPTS = ["the cat sat on", "a dog ran under the", "one plus two is", "def x return y"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on a tiny pair loaded like a real one, served in this process: (url, its training job)."""
    root = tmp_path_factory.mktemp("load")
    pair = load_pair(*save_tiny_pair(root), "cpu", "float32")
    job = TrainingJob()
    app = ui.build_app(pair, job=job)
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIVERSED_HEADS_DIR", str(root / "heads"))
        ui.launch(app, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/", job
        finally:
            close(app)


def close(app) -> None:
    """Stop a served app. Gradio sets its loop's asyncio event from this thread, a race it can lose (the
    event's waiters change under it): then the event is set, and closing again closes the server."""
    try:
        app.close()
    except RuntimeError:
        app.close()


def test_concurrent_decodes_during_training(served):
    from gradio_client import Client

    url, job = served
    trainer = Client(url, verbose=False)
    training = trainer.submit("general", "Built-in examples", None, 200, 2, 0.5, 3e-3, api_name="/train")
    deadline = time.monotonic() + 60
    while not job.history:  # training has really started (its first step is done)
        assert time.monotonic() < deadline and not training.done(), "the training run did not start"
        time.sleep(0.2)

    def decode(i):
        client = Client(url, verbose=False)
        mode = ["ar", "exact", "static"][i % 3]  # the mode radio's values (it shows their labels)
        tokens, stats, *_ = client.predict(
            PROMPTS[i % len(PROMPTS)], mode, 0.5, None, 3, 24, 1.0, i, api_name="/generate"
        )
        return tokens, stats

    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(decode, range(CLIENTS)))
    assert all("dd-tok" in tokens and 'data-state="done"' in stats for tokens, stats in results)
    assert job.running, "training ended before the decodes did: the test did not overlap them"
    steps_during_decoding = job.history[-1]["step"]

    # A second Start while the run goes on is turned away (with a warning), leaving the run alone.
    Client(url, verbose=False).predict(
        "general", "Built-in examples", None, 5, 2, 0.5, 3e-3, api_name="/train"
    )
    assert job.running and job.history[-1]["step"] >= steps_during_decoding

    trainer.predict(api_name="/cancel_training")
    training.result(timeout=120)
    assert not job.running and job.error is None and job.cancelled
    assert time.monotonic() - started < 150


STORM_CLIENTS, SHORT_QUEUE = 30, 4


@pytest.fixture(scope="module")
def storm_app(tmp_path_factory):
    """The app on the tiny pair, served, and a trace to replay: (app, url, trace path)."""
    from diversed_demo.ui.runs import APP_CONFIG, stream_decode
    from diversed_demo.ui.trace import trace_files

    root = tmp_path_factory.mktemp("storm")
    pair = load_pair(*save_tiny_pair(root), "cpu", "float32")
    *_, run = stream_decode(pair, PROMPTS[0], APP_CONFIG.replace(mode="static", max_new_tokens=24, seed=1))
    trace_json = trace_files({"Static ensemble": run}, pair, "decode")[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIVERSED_HEADS_DIR", str(root / "heads"))
        app = ui.build_app(pair)
        port = free_port()
        ui.launch(app, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield app, f"http://127.0.0.1:{port}/", trace_json
        finally:
            close(app)


def storm_request(url, trace_json, i):
    """Client i's request (a replay every third, else a decode): ("done", what came back), ("full", the
    message), or ("refused", the message) for anything else the server said."""
    import json

    from gradio_client import Client, handle_file

    try:
        client = Client(url, verbose=False)
        if trace_json and i % 3 == 2:
            tokens, stats, _ = client.predict(handle_file(trace_json), None, api_name="/replay")
            return "done", ("replay", tokens, stats)
        prompt, seed = PROMPTS[i % len(PROMPTS)], 100 + i
        *_, files = client.predict(prompt, "static", 0.5, None, 3, 16, 1.0, seed, api_name="/generate")
        trace = json.loads(open(next(f for f in files if f.endswith(".json"))).read())
        return "done", ("decode", prompt, seed, trace)
    except Exception as err:  # gradio_client raises the server's message
        return ("full" if "queue is full" in str(err).lower() else "refused"), str(err)


def storm(url, trace_json=None) -> list[tuple]:
    with ThreadPoolExecutor(STORM_CLIENTS) as pool:
        return list(pool.map(lambda i: storm_request(url, trace_json, i), range(STORM_CLIENTS)))


def test_thirty_clients_at_once_are_each_served_their_own_results(storm_app):
    _, url, trace_json = storm_app
    outcomes = storm(url, trace_json)
    assert all(kind == "done" for kind, _ in outcomes), [m for kind, m in outcomes if kind != "done"][:3]
    for _, result in outcomes:  # nothing lost or swapped: each decode's trace is its own request's
        if result[0] == "decode":
            _, prompt, seed, trace = result
            (record,) = trace["runs"]
            assert record["settings"]["seed"] == seed and record["prompt"] == prompt
        else:
            assert "dd-tok" in result[1] and "data-replay" in result[2]
    assert {result[0] for _, result in outcomes} == {"decode", "replay"}


def test_past_a_full_queue_clients_are_told_so_and_the_server_stays_up(storm_app):
    from gradio_client import Client

    app, url, _ = storm_app
    places = app._queue.max_size
    app._queue.max_size = SHORT_QUEUE
    try:
        outcomes = storm(url)
    finally:
        app._queue.max_size = places
    kinds = [kind for kind, _ in outcomes]
    assert set(kinds) == {"done", "full"}, [m for kind, m in outcomes if kind == "refused"][:3]
    tokens, stats, *_ = Client(url, verbose=False).predict(
        PROMPTS[0], "exact", 0.5, None, 3, 8, 1.0, 1, api_name="/generate"
    )
    assert "dd-tok" in tokens and 'data-state="done"' in stats


def test_a_visitor_who_leaves_mid_sweep_stops_it(storm_app, monkeypatch):
    import httpx

    from diversed_demo.eval import frontier

    app, url, _ = storm_app
    batches = []
    real = frontier.decode_examples

    def slow_batch(*args, **kwargs):
        batches.append(time.monotonic())
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(frontier, "MAX_BATCH_ROWS", 1)
    monkeypatch.setattr(frontier, "decode_examples", slow_batch)
    fn_index = next(i for i, f in app.fns.items() if f.api_name == "sweep")
    body = {"data": ["general", 4, [0.0, 0.25, 0.5, 0.75], 8, 2, 1.0, 0.1], "fn_index": fn_index}
    with httpx.Client(base_url=url, timeout=30) as http:
        http.post("gradio_api/queue/join", json={**body, "session_hash": "leaver"}).raise_for_status()
        with http.stream("GET", "gradio_api/queue/data", params={"session_hash": "leaver"}) as events:
            for line in events.iter_lines():
                if '"process_generating"' in line:
                    break  # the first decode is done: the visitor closes the page
    time.sleep(2)
    decoded_after_leaving = len(batches)
    time.sleep(2)
    assert len(batches) == decoded_after_leaving < 20  # 4 prompts x 5 weights, one decode per batch


IDLE_S = 3.0  # long enough for a poll every 1 ms to show: 8-9% of a core on a 2-core EPYC


@pytest.mark.timed
def test_an_idle_server_leaves_the_cores_to_decoding(tmp_path):
    """A served app that waits for requests (or whose one decode slot is busy) takes under 3% of a core:
    Gradio's own queue polls every millisecond, which decodes on a 2-core CPU would pay for."""
    pair = load_pair(*save_tiny_pair(tmp_path), "cpu", "float32")
    app = ui.build_app(pair)
    ui.launch(app, server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        time.sleep(1.0)  # the server's start-up work done
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(IDLE_S)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        close(app)
    assert share < 0.03, f"the idle server took {share:.1%} of a core"
