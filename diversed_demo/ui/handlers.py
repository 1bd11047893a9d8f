"""What every handler shares: the app's objects bound as its first arguments, and bad input as a message.

Handlers are plain module-level functions whose first arguments are what the app holds (the pair, the
examples, the training job); the tests call them directly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections import Counter

import gradio as gr

DECODES_PER_VISITOR = 1  # of the app's decode slots, what one visitor (a Gradio session) may hold at once


def bind(fn, *held):
    """`fn` with the app's objects as its first arguments, as a plain function Gradio can inspect: same name,
    the remaining parameters (so gr.Request and gr.Progress are still found), a generator if fn is one."""
    if inspect.isgeneratorfunction(fn):

        def bound(*args, **kwargs):
            yield from fn(*held, *args, **kwargs)
    else:

        def bound(*args, **kwargs):
            return fn(*held, *args, **kwargs)

    functools.update_wrapper(bound, fn)
    signature = inspect.signature(fn)
    bound.__signature__ = signature.replace(parameters=list(signature.parameters.values())[len(held) :])
    return bound


@contextlib.contextmanager
def user_errors():
    """Bad input surfaces as a readable gr.Error, never a stack trace."""
    try:
        yield
    except (ValueError, OSError) as err:  # PairError and the heads' errors are ValueErrors too
        raise gr.Error(str(err)) from None


class VisitorSlots:
    """How many decodes each visitor has running. The queue shares the decode slots among all requests;
    this keeps one visitor, or a script sending many requests in one session, from holding them all."""

    def __init__(self, per_visitor: int = DECODES_PER_VISITOR):
        self.per_visitor = per_visitor
        self.running: Counter[str] = Counter()
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, request: gr.Request | None):
        """One slot for the request's visitor while the block runs, or a gr.Error if they hold all theirs.
        Without a request (a direct call: the CLI, the tests) there is no visitor to count."""
        visitor = getattr(request, "session_hash", None)
        if visitor is None:
            yield
            return
        with self.lock:
            if self.running[visitor] >= self.per_visitor:
                raise gr.Error(
                    "You already have a decode running here: wait for it to finish, or press Stop, "
                    "then try again."
                )
            self.running[visitor] += 1
        try:
            yield
        finally:
            with self.lock:
                self.running[visitor] -= 1
                if not self.running[visitor]:
                    del self.running[visitor]


DECODE_SLOTS = VisitorSlots()  # Decode, Compare and the dial's sweep share them, as they share the queue's


def example_prompt(examples, index):
    """The chosen example's prompt, for the prompt box (no change when the choice is cleared)."""
    return examples[index].prompt if index is not None else gr.skip()
