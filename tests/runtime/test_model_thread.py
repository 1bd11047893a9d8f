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

    model = ModelThread()
    iteration = model.iterate(decode, 0)
    assert next(iteration) == 0
    iteration.close()  # as Gradio closes a handler's generator on Stop
    model.call(lambda: None)  # any later call finds it closed
    assert len(closed_on) == 1 and closed_on[0].startswith("model")


def test_a_left_iteration_is_closed_without_waiting_on_the_thread_that_drops_it():
    """Dropped by the garbage collector inside another thread pool's submit (loading a model does that),
    where concurrent.futures' module lock is held, the iteration must not wait for the model thread there
    (a submit would wait on that lock forever): it is closed on the model thread soon after."""
    import concurrent.futures.thread
    import gc

    model, closed = ModelThread(), threading.Event()

    def decode():
        try:
            yield from range(10)
        finally:
            closed.set()

    iteration = model.iterate(decode, 0)
    next(iteration)
    cycle = [iteration]
    cycle.append(cycle)  # only the cyclic collector frees it
    del iteration, cycle

    def collect_inside_a_submit():
        with concurrent.futures.thread._global_shutdown_lock:
            gc.collect()

    collector = threading.Thread(target=collect_inside_a_submit, daemon=True)
    collector.start()
    collector.join(10)
    assert not collector.is_alive() and closed.wait(10)


def test_two_iterations_interleave_slice_by_slice():
    model = ModelThread()
    first, second = model.iterate(lambda: iter("ab"), 0), model.iterate(lambda: iter("xy"), 0)
    assert [next(first), next(second), next(first), next(second)] == ["a", "x", "b", "y"]


def test_a_slice_hands_over_several_items_in_one_call_to_the_model_thread():
    model, calls = ModelThread(), []
    submit = model.executor.submit
    model.executor.submit = lambda fn, *args: calls.append(fn) or submit(fn, *args)
    assert list(model.iterate(lambda: iter(range(100)), slice_s=10)) == list(range(100))
    assert len(calls) <= 3  # start, one slice of all, close


def test_work_can_ask_whether_it_runs_on_the_model_thread_and_queue_more_without_waiting():
    """The runtime times a pass only on the thread that decodes (runtime/plan.choose_drafts)."""
    thread = ModelThread()
    assert not thread.is_current()
    assert thread.call(thread.is_current)
    gate = threading.Event()
    queued = thread.submit(lambda: gate.wait(5) and thread.is_current())
    assert not queued.done()  # queued, not waited for
    gate.set()
    assert queued.result(timeout=5) is True
