"""The server's one model thread (runtime/model_thread.py): calls and iterations run there, in order;
errors come back to the caller; a visitor's Stop closes the decode on that thread."""

from __future__ import annotations

import threading

import pytest

from diversed_demo.runtime.model_thread import ModelThread


def test_calls_run_on_the_model_thread_and_return_their_result():
    model = ModelThread()
    assert model.call(lambda: threading.current_thread().name).startswith("model")
    assert model.call(sum, [1, 2, 3]) == 6


def test_an_error_on_the_model_thread_reaches_the_caller():
    with pytest.raises(ValueError, match="bad prompt"):
        ModelThread().call(lambda: (_ for _ in ()).throw(ValueError("bad prompt")))


def test_each_item_is_computed_on_the_model_thread():
    def decode():
        for i in range(3):
            yield i, threading.current_thread().name

    items = list(ModelThread().iterate(decode))
    assert [i for i, _ in items] == [0, 1, 2] and all(name.startswith("model") for _, name in items)


def test_closing_the_iteration_closes_the_decode_on_the_model_thread():
    closed_on = []

    def decode():
        try:
            yield from range(10)
        finally:
            closed_on.append(threading.current_thread().name)

    iteration = ModelThread().iterate(decode)
    assert next(iteration) == 0
    iteration.close()  # as Gradio closes a handler's generator on Stop
    assert len(closed_on) == 1 and closed_on[0].startswith("model")


def test_two_iterations_interleave_item_by_item():
    model = ModelThread()
    first, second = model.iterate(lambda: iter("ab")), model.iterate(lambda: iter("xy"))
    assert [next(first), next(second), next(first), next(second)] == ["a", "x", "b", "y"]
