"""A decode's count of threads, watched against other processes on the cores (common/threads.py): one fewer
where its steps wait for a busy core, one more again once they would not, never a change to the tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from diversed_demo.common import threads as watched
from diversed_demo.common.threads import MAX_RETRY_S, RETRY_S, WATCH_S, ThreadWatch
from diversed_demo.core.generate import generate

BUSY = [sys.executable, "-c", "while True: pass"]


class Cores:
    """Fake clocks and probe. A busy process shares a core with the decoding thread ("main": a step gets
    half its wall in CPU time on more than one thread) or with the rest of its team ("team": the probe's team
    waits)."""

    def __init__(self):
        self.busy, self.now, self.cpu_time, self.probes = None, 100.0, 10.0, []

    def probe(self, threads: int, seconds: float) -> tuple[float, float]:
        """The probe's best add and this thread's CPU share meanwhile."""
        self.probes.append(threads)
        self.now += seconds
        best = 5e-3 if self.busy == "team" and threads > 1 else 2e-5 if threads == 1 else 1.3e-5
        return best, 0.5 if self.busy == "main" and threads > 1 else 1.0

    def clock(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.cpu_time

    def steps(self, watch: ThreadWatch, seconds: float, step_s: float = 0.01) -> list[int]:
        """Decode for `seconds` in steps of `step_s`: the count of threads after each step's look."""
        counts = []
        for _ in range(round(seconds / step_s)):
            share = 0.5 if self.busy == "main" and torch.get_num_threads() > 1 else 1.0
            self.now, self.cpu_time = self.now + step_s, self.cpu_time + share * step_s
            counts.append(watch.watch())
        return counts


@pytest.fixture
def cores():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield Cores()
    torch.set_num_threads(before)


def started(cores: Cores, full: int = 2) -> ThreadWatch:
    watch = ThreadWatch(cores.probe, cores.clock, cores.cpu)
    watch.start(full)
    return watch


def test_steps_that_wait_for_a_core_drop_a_thread_until_it_is_free_again(cores):
    watch = started(cores)
    assert set(cores.steps(watch, 1.0)) == {2} and "fewer while" in watch.note()  # alone
    cores.busy = "main"
    counts = cores.steps(watch, 0.5, step_s=0.1)
    assert counts[-1] == 1 and counts.index(1) <= 3  # the first look that reads such steps
    assert watch.note() == "1 of 2 threads: another process keeps a core busy"
    seen = []  # another thread (the page's) reads the decoding thread's count, not its own
    reader = threading.Thread(target=lambda: seen.append(watch.note()))
    reader.start(), reader.join()
    assert seen == ["1 of 2 threads: another process keeps a core busy"]
    # still busy: each try's probe finds the team short of CPU time, so it is never raised, and tried ever
    # more rarely
    cores.probes.clear()
    counts = cores.steps(watch, 4 * MAX_RETRY_S, step_s=0.1)
    assert set(counts) == {1} and 3 <= cores.probes.count(2) <= 4 * MAX_RETRY_S / RETRY_S / 4
    cores.busy = None
    counts = cores.steps(watch, MAX_RETRY_S + 1.0)
    assert counts[-1] == 2 and set(counts[counts.index(2) :]) == {2}
    assert watch.fewer_s > 4 * MAX_RETRY_S


def test_a_try_whose_steps_wait_drops_back_and_the_next_waits_longer(cores):
    watch = started(cores)
    cores.busy = "main"
    assert cores.steps(watch, 0.5, step_s=0.1)[-1] == 1
    watch.probe = lambda threads, seconds: (1e-5, 1.0)  # a try's probe that met the core free by chance
    counts = cores.steps(watch, RETRY_S + 4 * RETRY_S + 1.0, step_s=0.1)
    raised = [i for i, (a, b) in enumerate(zip(counts, counts[1:])) if b > a]
    assert len(raised) == 2 and raised[1] - raised[0] >= 2 * RETRY_S / 0.1 and counts[-1] == 1


def test_once_the_processs_own_build_ends_decodes_try_their_full_count_at_once(cores):
    """After minutes beside the background build (tries failed, each next one later, up to MAX_RETRY_S), the
    build's end rearms the watch: the next look tries both threads, not MAX_RETRY_S later."""
    watch = started(cores)
    cores.busy = "main"
    cores.steps(watch, 4 * MAX_RETRY_S, step_s=0.1)
    cores.busy = None
    assert cores.steps(watch, 2 * WATCH_S, step_s=0.1)[-1] == 1  # the back-off holds without the rearm
    watch.rearm()
    assert cores.steps(watch, 2 * WATCH_S, step_s=0.1)[-1] == 2


def test_a_team_that_waits_on_the_probe_drops_a_thread_and_is_not_tried_while_it_would(cores):
    watch = started(cores)
    cores.busy = "team"  # the decoding thread gets all its CPU time: only the probe sees it
    counts = cores.steps(watch, 0.3)
    assert counts[-1] == 2  # one look's probe: a burst, perhaps
    counts = cores.steps(watch, 0.3)
    assert counts[-1] == 1  # the next look's too: a busy core
    cores.probes.clear()
    counts = cores.steps(watch, 4 * MAX_RETRY_S)
    assert set(counts) == {1}  # never raised: each try's probe found the team waiting
    assert 3 <= cores.probes.count(2) <= 4 * MAX_RETRY_S / RETRY_S / 4  # ever more rarely


def test_a_probe_that_meets_a_burst_at_one_look_only_keeps_every_thread(cores):
    """A client reading the stream or a page's request works in bursts on the same cores: a probe that meets
    one at a look, but not at the next, drops no thread (the served app had dropped to one for seconds at a
    time, decoding at 0.72-0.76 of the library's speed where it ran at 0.86-0.87 on both)."""
    watch = started(cores)
    for _ in range(6):  # every other look meets a burst
        cores.busy = "team"
        assert set(cores.steps(watch, WATCH_S, step_s=0.01)) == {2}
        cores.busy = None
        assert set(cores.steps(watch, WATCH_S, step_s=0.01)) == {2}


def test_a_watch_looks_every_watch_s_not_before_it_starts_nor_where_told_not_to(cores, monkeypatch):
    cores.busy = "team"
    watch = ThreadWatch(cores.probe, cores.clock, cores.cpu)
    assert set(cores.steps(watch, 1.0)) == {2} and cores.probes == [] and watch.note() == ""  # not started
    watch.start(1)
    assert set(cores.steps(watch, 1.0)) == {2} and cores.probes == []  # one thread at most
    watch.start(2)
    counts = cores.steps(watch, WATCH_S * 0.9)
    assert set(counts) == {2} and cores.probes == []  # too soon for a first look
    monkeypatch.setenv(watched.SWITCH, "0")
    off = ThreadWatch(cores.probe, cores.clock, cores.cpu)
    off.start(2)
    assert set(cores.steps(off, 1.0)) == {2} and cores.probes == []


@pytest.mark.timed
def test_decodes_beside_a_busy_process_drop_a_thread_and_keep_their_tokens(pair, monkeypatch, cores):
    """Real cores (run alone: `make test` runs the timed tests after the others): decodes beside a process
    that keeps a core busy drop to one thread within a few looks, with the tokens a decode gives alone."""
    if len(os.sched_getaffinity(0)) != 2:
        pytest.skip("needs a 2-core machine")
    watch = ThreadWatch()
    monkeypatch.setattr("diversed_demo.core.decode.THREADS", watch)
    watch.start(2)
    settings = dict(mode="exact", n_draft=3, max_new_tokens=24, temperature=0.0)
    alone = generate(pair, [1, 5, 6, 7], **settings)[0].token_ids
    assert torch.get_num_threads() == 2
    busy = subprocess.Popen(BUSY)
    try:
        time.sleep(0.5)
        for _ in range(40):
            assert generate(pair, [1, 5, 6, 7], **settings)[0].token_ids == alone
            if torch.get_num_threads() == 1:
                break
        assert torch.get_num_threads() == 1
    finally:
        busy.kill()


def test_the_time_between_decodes_is_no_step_and_no_time_on_fewer_threads(cores):
    """A decode's first step does not count the time since the last decode's end: idle, the thread had no
    CPU time, which would read as a step that waited; nor is it counted as decoding on fewer threads."""
    watch = started(cores)
    cores.busy = "main"
    cores.steps(watch, 1.0, step_s=0.1)
    assert torch.get_num_threads() == 1
    cores.busy, fewer = None, watch.fewer_s
    for _decode in range(3):
        cores.now += 60.0  # a visitor reads the text for a minute: the thread idles
        before = watch.fewer_s
        watch.watch(first=True)
        assert watch.fewer_s == before
        cores.steps(watch, 0.05)  # a few steps alone: the first look after the idle minute tries two again
    assert watch.fewer_s <= fewer + 3 * 0.05 + 1e-9 and torch.get_num_threads() == 2


def test_importing_the_runtime_starts_no_openmp_team_on_the_importing_thread():
    """The app imports on its main thread and decodes on the model thread: a parallel kernel run at import
    (a probe's tensor filled there) gave the main thread an OpenMP team of its own beside the model thread's,
    and every served decode waited for a core (2.5 times slower). Native threads only, not Python's."""
    code = (
        "import os, threading, torch\n"
        "from transformers import AttentionInterface  # transformers' own import starts a native thread\n"
        "native = lambda: len(os.listdir('/proc/self/task')) - threading.active_count()\n"
        "before = native()\n"
        "import diversed_demo.runtime.plan, diversed_demo.core.generate, diversed_demo.common.threads\n"
        "after = native()\n"
        "torch.zeros(1 << 18)  # a parallel kernel: the team's threads appear\n"
        "print(before, after, native())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    before, after, team = map(
        int,
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.split(),
    )
    assert after == before and team > after  # the check sees a team where one is started
