"""Load: 8 gradio_client clients decode at once while a training run goes on; every request succeeds."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import free_port
from tiny import save_tiny_pair

from diversed_demo import ui
from diversed_demo.models.loading import load_pair
from diversed_demo.ui.runs import TrainingJob

pytestmark = pytest.mark.slow

CLIENTS = 8
PROMPTS = ["the cat sat on", "a dog ran under the", "one plus two is", "def x return y"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on a tiny pair loaded like a real one, served in this process: (url, its training job)."""
    root = tmp_path_factory.mktemp("load")
    pair = load_pair(*save_tiny_pair(root), "cpu")
    job = TrainingJob()
    app = ui.build_app(pair, job=job)
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIVERSED_HEADS_DIR", str(root / "heads"))
        ui.launch(app, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/", job
        finally:
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
