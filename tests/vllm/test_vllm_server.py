"""The plugin behind vLLM's OpenAI-compatible server (`vllm serve`, started as docs/vllm.md says), through
the `openai` client: w, λ or a head set per request in `extra_body`, and a bad one answered with HTTP 400."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.embedded, pytest.mark.slow]
MODEL = "smollm2-diversed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, server, seconds: float = 420) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, "vllm serve exited before it was ready"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise TimeoutError("vllm serve was not ready in time")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from diversed_demo.vllm.engine import KV_CACHE_BYTES, default_draft, embedded_target_dir

    port = free_port()
    spec = {
        "method": "eagle3",
        "model": str(default_draft()),
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }
    command = [
        sys.executable, "-m", "diversed_demo.vllm", "serve", embedded_target_dir(),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        "--speculative-config", json.dumps(spec),
        "--additional-config", json.dumps({"diversed_w": 1.0, "diversed_heads": ["general", "general-cost"]}),
    ]  # fmt: skip
    log = open(tmp_path_factory.mktemp("server") / "vllm-serve.log", "w")
    # as from a shell: vLLM's CPU set-up in this process (earlier tests) put its libgomp in LD_PRELOAD
    environment = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    server = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=environment
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the engine processes it started
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.mark.parametrize(
    "field",
    [
        {"diversed_w": 0.5},
        {"diversed_lambda": 2.0},
        {"diversed_head": "general"},
        {"diversed_head": "general-cost", "diversed_lambda": 2.0},
    ],
)
def test_a_chat_request_with_a_verifier_in_extra_body_returns_text(server_url, field):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server_url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=32,
        temperature=0.7,
        extra_body=field,
    )
    assert reply.choices[0].message.content.strip()


@pytest.mark.parametrize(
    "field, bad, message",
    [
        ("diversed_w", 1.5, "diversed_w must be"),
        ("diversed_w", "abc", "diversed_w must be"),
        ("diversed_lambda", -1, "diversed_lambda must be"),
        ("diversed_head", "mine", "diversed_head 'mine' is not served here"),
        ("diversed_head", "../heads/general", "diversed_head must be a head's name"),
    ],
)
def test_a_bad_verifier_gets_a_400_that_names_it(server_url, field, bad, message):
    import openai

    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="none")
    with pytest.raises(openai.BadRequestError, match=message):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, extra_body={field: bad})
