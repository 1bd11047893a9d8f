"""How many threads PyTorch's kernels use while decoding, watched step by step.

A parallel kernel waits for every thread of its team. Where another process keeps a core busy, the
scheduler shares that core between it and one of the team, and every parallel kernel of a pass waits for
the one put aside: on a 2-core Xeon beside one busy process, greedy decoding of the embedded pair fell from
140 to 4–17 tokens/s on 2 threads and ran at 80–95 on one (docs/measurements/speed.md, "Another process on
a core"). It shows two ways: the decoding thread gets about half the CPU time the clock shows (alone, all
of it), or, where it is the other thread that waits, a small parallel kernel takes milliseconds instead of
microseconds. So the watch reads each step's CPU time against the clock, and every WATCH_S it drops a thread
where either shows (the probe's at two looks in a row: a client or a page request on the same cores works in
bursts that a probe may meet and no step waits on). Later it tries one more again, first probing that team
for TRY_S as the steps would show it, then judging the steps on it at the next look. Threads are set per
decoding thread (OpenMP keeps the count per thread), and so is what the watch reads.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
import types
from collections.abc import Callable

import torch

SWITCH = "DIVERSED_THREAD_WATCH"  # "0": never change the count of threads
WATCH_S = 0.25  # how often a decode looks (a look costs about 0.1 ms where nothing else runs)
MIN_STEPS = 3  # a look reads the median of at least these steps: one may include a wait for its reader
SHARE = 0.75  # a step's CPU time ÷ its wall time below which it waited for a core: alone 1.0, else ~0.5
# A team waiting for a core takes milliseconds for the probe where one thread takes tens of µs; alone, the
# team is the faster. Three times is far from both.
CONTENDED = 3.0
RETRY_S = 2.0  # how long a lowered count holds before one more thread is tried
MAX_RETRY_S = 32.0  # the longest, after tries that failed
TRY_S = 0.02  # a try probes this long first (several scheduler slices), not a slow decoding step or two
PROBE_ELEMENTS = 1 << 18  # an add that ATen splits over threads (its grain is 32k elements): ~15 µs alone
PROBE_RUNS = 3  # the best of these: one run slowed by anything else does not count
MIN_JUDGED_S = 0.2  # a timing's CPU share is judged over at least this long (a real one takes seconds)


def probe_team(threads: int, seconds: float, tensor: torch.Tensor) -> tuple[float, float]:
    """A small parallel add on `threads` threads, PROBE_RUNS times and for at least `seconds`: its best
    time, and this thread's CPU time over the wall time meanwhile (this thread's count after it as before)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best, runs, start, cpu = math.inf, 0, time.perf_counter(), time.thread_time()
        while runs < PROBE_RUNS or time.perf_counter() - start < seconds:
            began = time.perf_counter()
            tensor.add_(1.0)
            best, runs = min(best, time.perf_counter() - began), runs + 1
        return best, (time.thread_time() - cpu) / max(time.perf_counter() - start, 1e-9)
    finally:
        torch.set_num_threads(previous)


class ThreadWatch:
    """The count of threads of one process's decoding threads: `start` sets the most (the count a pair was
    loaded with), `watch` (once a decoding step) lowers and raises it."""

    def __init__(
        self,
        probe: Callable[[int, float], tuple[float, float]] | None = None,
        clock=time.perf_counter,
        cpu=time.thread_time,
    ):
        self.full = 0  # 0: not started (a GPU, or nothing loaded): watch does nothing
        self.clock, self.cpu = clock, cpu
        self.probe = probe or self._probe
        self._local = threading.local()  # per decoding thread: its steps' shares, its looks and changes
        self.fewer_s = 0.0  # seconds of decoding steps on fewer threads than `full`
        self.last = 0  # the count the watch last set (for `note`, read from any thread)
        self.rearmed = 0  # how often `rearm` was called: each decoding thread's looks follow it

    def _probe(self, threads: int, seconds: float) -> tuple[float, float]:
        # Made where it is first probed, never at import: filling it runs a parallel kernel, and one on the
        # importing thread gives it an OpenMP team of its own beside the model thread's (model_thread.py),
        # which slowed the served decodes 2.5-fold.
        if getattr(self, "_tensor", None) is None:
            self._tensor = torch.zeros(PROBE_ELEMENTS)
        return probe_team(threads, seconds, self._tensor)

    def start(self, threads: int | None = None) -> None:
        """Watch decodes that run on up to `threads` threads (this thread's count by default)."""
        if os.environ.get(SWITCH) != "0":
            self.full = self.last = threads or torch.get_num_threads()

    def rearm(self) -> None:
        """The process's own background work on the other core is over (its build): each decoding thread
        tries its full count at its next look, without the wait that tries failed beside it had grown."""
        self.rearmed += 1

    def contended(self, threads: int, seconds: float = 0.0) -> bool:
        """Whether a team of `threads` waits for a core that another process holds: the probe's team slower
        than one thread, or, probed for `seconds`, this thread short of CPU time meanwhile."""
        alone, _ = self.probe(1, 0.0)
        best, share = self.probe(threads, seconds)
        return best > CONTENDED * alone or (seconds > 0 and share < SHARE)

    def watch(self, first: bool = False) -> int:
        """Count the step since the last call (none at a decode's `first`: the time since was no step's);
        every WATCH_S (and MIN_STEPS), decide. The count of threads this thread decodes on."""
        threads = torch.get_num_threads()
        if self.full <= 1:
            return threads
        local, now, cpu = self._local, self.clock(), self.cpu()
        if not hasattr(local, "shares"):
            local.shares, local.looked, local.changed = [], now, -math.inf
            local.wait, local.trial, local.rearmed, local.suspect = RETRY_S, False, self.rearmed, False
        elif not first:  # at a decode's first step the time since went between decodes, not to a step
            local.shares.append((cpu - local.cpu_at) / max(now - local.at, 1e-9))
            self.fewer_s += (now - local.at) if threads < self.full else 0.0
        local.at, local.cpu_at = now, cpu
        if local.rearmed != self.rearmed:
            local.rearmed, local.changed, local.wait = self.rearmed, -math.inf, RETRY_S
        if now - local.looked < WATCH_S or len(local.shares) < MIN_STEPS:
            return threads
        waited = statistics.median(local.shares) < SHARE
        local.shares, local.looked = [], now
        return self._decide(threads, waited, now)

    def _decide(self, threads: int, waited: bool, now: float) -> int:
        """One thread fewer where the steps waited for a core, or the probe's team did at two looks in a row;
        one more where the last change is `wait` old and the probe's team would not wait: a try, which the
        next look judges."""
        local = self._local
        team_waits = threads > 1 and not waited and self.contended(threads)
        if team_waits and not local.suspect:
            # A probe of a few µs may meet a burst of another process's work (a client reading the stream,
            # a page's request) that no step waits on: the team waits only where the next look finds it too.
            local.suspect = True
            return threads
        local.suspect = False
        trial, local.trial = local.trial, False
        if threads > 1 and (waited or team_waits):
            # the count a try raised to waited too: the next try waits twice as long
            local.wait = min(2 * local.wait, MAX_RETRY_S) if trial else RETRY_S
            threads -= 1
        elif threads < self.full and now - local.changed >= local.wait:
            if self.contended(threads + 1, TRY_S):  # it would wait: no try, the next one later
                local.changed, local.wait = now, min(2 * local.wait, MAX_RETRY_S)
                return threads
            local.trial = True
            threads += 1
        else:
            return threads
        local.changed, self.last = now, threads
        torch.set_num_threads(threads)
        return threads

    @contextlib.contextmanager
    def judged(self):
        """Around a timing that is kept for later starts: yields a record whose `shared` says, after it,
        whether another process took a core meanwhile (this thread short of CPU time over at least
        MIN_JUDGED_S, or decodes dropped to fewer threads): such a timing serves this start only."""
        record = types.SimpleNamespace(shared=False)
        wall, cpu, fewer_s = time.perf_counter(), time.thread_time(), self.fewer_s
        yield record
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        record.shared = (wall >= MIN_JUDGED_S and cpu < SHARE * wall) or self.fewer_s > fewer_s

    def note(self) -> str:
        """The count of threads decodes run on, as the watch last set it, in words ("" where nothing is
        watched): the page's request threads read it while the model thread decodes."""
        if self.full <= 1:
            return ""
        if self.last >= self.full:
            return f"{self.full} threads (fewer while another process keeps a core busy)"
        return f"{self.last} of {self.full} threads: another process keeps a core busy"


THREADS = ThreadWatch()
