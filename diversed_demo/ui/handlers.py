"""What every handler shares: the app's objects bound as its first arguments, and bad input as a message.

Handlers are plain module-level functions whose first arguments are what the app holds (the pair, the
examples, the training job); the tests call them directly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import gradio as gr


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
