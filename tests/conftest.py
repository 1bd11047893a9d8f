import socket

import pytest
import torch

from diversed_demo.tiny import tiny_pair

torch.set_num_threads(1)  # tiny models: threads only add overhead, and CI has 2 cores


@pytest.fixture(scope="session")
def pair():
    return tiny_pair()


PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13], [1, 20], [1, 4, 4, 8, 30, 31, 32, 33, 5]]


def free_port() -> int:
    """A free localhost port for a test server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
