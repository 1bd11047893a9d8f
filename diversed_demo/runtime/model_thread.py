"""One thread for all of a server's model work: loading, measuring, decoding.

PyTorch's CPU wheel runs its parallel kernels on GNU OpenMP, which keeps a team of threads for every
thread that has run one. Once two threads each have a team (the launcher's, and the server's worker
thread that decodes), they hold more threads than there are cores, and libgomp stops letting idle team
threads spin: every small kernel then waits for its team to wake. Measured on a 2-core EPYC, a one-token
pass of the embedded target took 9 ms on the thread that loaded it and 19 ms on another; the compiled pass
170 against 31 tokens/s (docs/measurements/speed.md, "One thread for the model"). So a server runs every
model call on this one thread, and its request threads only wait for results.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import warnings
from collections.abc import Callable, Iterator

# A decode's items gathered on the model thread per hand-over: one hand-over per token cost a thread switch
# each (docs/measurements/speed.md, "The app's decode"), and the page shows text at most every 0.1 s.
SLICE_S = 0.05


class ModelThread:
    """A single worker thread that runs the calls given to it, one at a time, in order."""

    def __init__(self):
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.left = collections.deque()  # iterators their consumers left: closed on the model thread
        self.thread_id: int | None = None  # the worker's, once it has run a call

    def is_current(self) -> bool:
        """Whether this code runs on the model thread."""
        return threading.get_ident() == self.thread_id

    def call(self, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) on the model thread; its result (or its exception) here."""
        return self.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable, *args, **kwargs) -> concurrent.futures.Future:
        """fn(*args, **kwargs) queued on the model thread, not waited for."""
        return self.executor.submit(self._run, fn, *args, **kwargs)

    def _run(self, fn: Callable, *args, **kwargs):
        self.thread_id = threading.get_ident()
        while self.left:
            try:
                self.left.popleft().close()
            except Exception as error:  # a decode that fails to give back what it holds: say so, go on
                warnings.warn(f"closing a left decode failed: {error}", RuntimeWarning, stacklevel=1)
        return fn(*args, **kwargs)

    def iterate(self, make: Callable[[], Iterator], slice_s: float | None = None) -> Iterator:
        """The items of the iterator `make()` returns, computed on the model thread `slice_s` seconds' worth
        at a time (at least one item; SLICE_S by default), the next slice computing while the caller handles
        this one; closing this generator (a visitor's Stop) closes that iterator there, so its decode gives
        back what it holds. Several iterations interleave slice by slice, as two decodes share the cores."""
        slice_s = SLICE_S if slice_s is None else slice_s
        items = self.call(lambda: iter(make()))
        try:
            # Two slices queued: the next one runs while the caller shows this one, and the model thread
            # never idles between them waiting for the caller's thread to wake.
            queue_slice = lambda: self.executor.submit(self._run, take, items, slice_s)  # noqa: E731
            pending = collections.deque([queue_slice(), queue_slice()])
            while pending:
                batch, ended = pending.popleft().result()
                if not ended:
                    pending.append(queue_slice())
                else:
                    pending.clear()  # the one still queued finds the iterator ended: nothing to wait for
                yield from batch
        finally:
            if hasattr(items, "close"):
                # Closed on the model thread, but never waited for here: this may run as a finalizer, in
                # the middle of any thread's work (even another thread pool's submit, whose lock it would
                # wait on forever).
                self.left.append(items)
                threading.Thread(target=self.call, args=(lambda: None,), daemon=True).start()


def take(items: Iterator, slice_s: float) -> tuple[list, bool]:
    """The next items for up to `slice_s` seconds (at least one, unless it ended), and whether it ended."""
    batch, start = [], time.perf_counter()
    for item in items:
        batch.append(item)
        if time.perf_counter() - start >= slice_s:
            return batch, False
    return batch, True


MODEL_THREAD = ModelThread()
