"""Live run state: a decode as it streams, a comparison of the modes, and the one background training job.

Plain Python over the decoder; nothing here knows about Gradio, so the tests drive it directly.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from ..core.config import MODES, TREE_OFF, TREE_ON, DecodeConfig
from ..core.generate import speculative_generate
from ..core.prompt import encode_prompt
from ..core.stats import Counts, Summary
from ..eval.rewards import fidelity, task_reward
from ..eval.tasks import REFERENCE_TASKS, Example
from ..models.heads import list_heads, load_head

MAX_PROMPT_CHARS = 4000


# The app's decodes: a DecodeConfig whose head, in dynamic mode, is a head's name (a visitor names a head,
# never a path on the server); greedy runs draft copies from the text too (core/lookup.py).
APP_CONFIG = DecodeConfig(max_new_tokens=64, prompt_lookup=True)


def check_prompt(prompt: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: type one or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(
            f"the prompt is {len(prompt)} characters long; the demo takes at most {MAX_PROMPT_CHARS}"
        )
    return prompt


NO_HEAD = "DIVERSED needs a trained head: pick one in the sidebar or train one in the Train tab"


def resolve_head(pair, config: DecodeConfig):
    """The head a DIVERSED run needs, loaded from the name in `config` (None for the other modes): the one
    loaded before while its file is the same (the app's decodes only read a head; loading took 2-4 ms a
    decode)."""
    if config.mode != "dynamic":
        return None
    path = list_heads(pair).get(config.head_name)  # a visitor names a head; never a path on the server
    if path is None:
        raise ValueError(f"no head {config.head_name!r} for this pair: pick one in the sidebar")
    stat = path.stat()  # the listing checked the head's pair: what else it depends on is the device
    key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size, str(pair.target.device))
    if key not in LOADED_HEADS:
        while len(LOADED_HEADS) >= MAX_LOADED_HEADS:
            LOADED_HEADS.pop(next(iter(LOADED_HEADS)))  # the oldest
        LOADED_HEADS[key] = load_head(path, pair)
    return LOADED_HEADS[key]


MAX_LOADED_HEADS = 8  # a head is a few MB at most
LOADED_HEADS: dict[tuple, object] = {}


@dataclass
class DecodeRun:
    """One decode as it streams: its events so far and their counts, then the decoder's Summary.

    The counts are the decoder's (a Summary in the making), so acceptance, τ and tokens/s are computed
    by Summary alone, live and at the end.
    """

    settings: DecodeConfig  # its head as named, not loaded
    prompt: str = ""
    events: list = field(default_factory=list)
    summary: Summary | None = None
    started: float = field(default_factory=time.perf_counter)
    counts: Counts = field(default_factory=Counts)
    event_times: list[float] = field(default_factory=list)  # seconds since start, at each event
    acceptance_per_token: list[float | None] = field(default_factory=list)  # cumulative, at each output token

    def add(self, event, elapsed_s: float | None = None) -> None:
        self.counts.add_event(event)
        self.events.append(event)
        self.event_times.append(time.perf_counter() - self.started if elapsed_s is None else elapsed_s)
        self.counts.wall_time_s = self.event_times[-1]
        if event.kind != "rejected":
            self.acceptance_per_token.append(self.counts.acceptance_rate)

    @property
    def done(self) -> bool:
        return self.summary is not None

    @property
    def stats(self) -> Summary:
        """The finished run's Summary, or the counts so far with the time elapsed until now."""
        if self.summary is not None:
            return self.summary
        c = self.counts
        return Summary(
            "",
            c.new_tokens,
            c.target_passes,
            c.drafted,
            c.accepted,
            time.perf_counter() - self.started,
            mean_w=self._mean_w(),
            rejected=c.rejected,
        )

    def _mean_w(self) -> float | None:
        ws = [e.w for e in self.events if e.w is not None and e.kind != "resampled"]
        return sum(ws) / len(ws) if ws else None

    @property
    def new_tokens(self) -> int:
        return self.stats.new_tokens

    @property
    def acceptance_rate(self) -> float | None:
        return self.stats.acceptance_rate

    @property
    def tau(self) -> float | None:
        return self.stats.tau if self.stats.target_passes else None

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def elapsed_s(self) -> float:
        return self.stats.wall_time_s

    @property
    def mean_w(self) -> float | None:
        return self.stats.mean_w

    @property
    def output_events(self) -> list:
        return [e for e in self.events if e.kind != "rejected"]

    @property
    def elapsed_per_token(self) -> list[float]:
        return [t for e, t in zip(self.events, self.event_times) if e.kind != "rejected"]


def stream_decode(pair, prompt: str, settings: DecodeConfig, head=None):
    """Decode `prompt` by `settings` (with `head`, loaded from its name, in dynamic mode), yielding the same
    DecodeRun after every token event and once more when done.

    Raises ValueError (bad input, from here or the decoder) before the first yield.
    """
    check_prompt(prompt)
    run = DecodeRun(settings, prompt)
    stream = speculative_generate(pair, prompt, settings.replace(head=head) if head is not None else settings)
    for item in stream:
        if isinstance(item, Summary):
            run.summary = item
        else:
            run.add(item)
        yield run


def throttled(items, interval_s: float):
    """Pass on items at most every `interval_s` seconds, always including the last one."""
    last_sent, pending, has_pending = -math.inf, None, False
    for item in items:
        now = time.perf_counter()
        if now - last_sent >= interval_s:
            last_sent, has_pending = now, False
            yield item
        else:
            pending, has_pending = item, True
    if has_pending:
        yield pending


# ---------------------------------------------------------------- compare


@dataclass
class Comparison:
    """The runs of one prompt through each mode, and each finished run's quality, keyed by mode."""

    runs: dict[str, DecodeRun] = field(default_factory=dict)
    quality: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # mode → (value, metric)
    skipped: dict[str, str] = field(default_factory=dict)  # mode → why

    def departures(self) -> dict[str, int | None]:
        """Per run, the index of its first output token that differs from target-only decoding
        (None where it never departs, or no target-only run is there to compare with)."""
        baseline = self.runs.get("ar")
        if baseline is None:
            return {}
        reference = [e.token_id for e in baseline.output_events]
        return {
            mode: first_departure([e.token_id for e in run.output_events], reference, baseline.done)
            for mode, run in self.runs.items()
            if mode != "ar"
        }


def first_departure(ids: list[int], reference: list[int], reference_done: bool = True) -> int | None:
    """Index of the first token where `ids` leaves `reference`; a run that ends as a prefix of a finished
    reference (or goes beyond it) departs where the reference ends."""
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return i
    if reference_done and len(ids) > len(reference):
        return len(reference)
    return None


def quality_of(pair, prompt: str, example: Example | None, run: DecodeRun) -> tuple[float | None, str]:
    """(value, metric): ROUGE-2 or math correctness when the prompt is an example with a reference,
    else fidelity (mean target log-probability of the output); (None, "n/a") for an empty output.
    """
    if run.summary is None or not run.summary.token_ids:
        return None, "n/a"
    if example is not None and example.reference is not None and example.task in REFERENCE_TASKS:
        value = task_reward(example.task, example, run.summary.text)
        return float(value), "ROUGE-2" if example.task == "summarization" else "correct"
    return float(fidelity(pair, encode_prompt(pair.tokenizer, prompt), run.summary.token_ids)), "fidelity"


# Compare's optional run: exact SD drafting trees, beside every mode drafting chains (issue 53).
TREES = "trees"


def compare_runs(settings: DecodeConfig, trees_beside: bool = False) -> dict[str, DecodeConfig]:
    """{run: its settings} of a Compare: every mode by `settings` (DIVERSED where a head is named); with
    `trees_beside`, every mode on chains and exact SD once more on trees, to show what the tree adds."""
    modes = [mode for mode in MODES if mode != "dynamic" or settings.head_name]
    if not trees_beside:
        return {mode: settings.replace(mode=mode) for mode in modes}
    chains = settings.replace(tree=TREE_OFF)
    runs = {mode: chains.replace(mode=mode) for mode in modes}
    return {**runs, TREES: chains.replace(mode="exact", tree=TREE_ON)}


def stream_comparison(
    pair, prompt: str, settings: DecodeConfig, example: Example | None = None, trees_beside: bool = False
):
    """Run the prompt through every mode in turn (and exact SD on trees, with `trees_beside`), all with the
    same seed, so that differences between the runs come from the verifier alone; yield the Comparison as
    it grows. An upgrade of the pair (its compiled passes, attached at a first start) lands after the whole
    comparison, not between its runs: every run is timed on the same passes."""
    check_prompt(prompt)
    comparison = Comparison()
    if not settings.head_name:
        comparison.skipped["dynamic"] = "no head selected"
    with pair.in_use():
        for key, run_settings in compare_runs(settings, trees_beside).items():
            head = resolve_head(pair, run_settings)
            for run in stream_decode(pair, prompt, run_settings, head):
                comparison.runs[key] = run
                if run.done:
                    comparison.quality[key] = quality_of(pair, prompt, example, run)
                yield comparison


def speedup(run: DecodeRun, baseline: DecodeRun | None) -> float | None:
    """tokens/s over the target-only run's (None until both have finished)."""
    if baseline is None or not (baseline.done and run.done) or not baseline.tokens_per_second:
        return None
    return run.tokens_per_second / baseline.tokens_per_second


def speed_sentence(comparison: Comparison) -> str:
    """The measured speed-ups of the speculative modes over the target alone, in plain words."""
    base, phrases = comparison.runs.get("ar"), []
    for mode in ("exact", TREES, "static", "cost", "dynamic"):
        run = comparison.runs.get(mode)
        ratio = speedup(run, base) if run is not None and run.done else None
        if ratio is not None:
            name = {
                "exact": "exact speculative decoding",
                TREES: "exact SD on draft trees",
                "static": f"a fixed w = {run.settings.ensemble_weight:g}",
                "cost": f"the per-token rule (λ = {run.settings.lam:g})",
                "dynamic": "DIVERSED",
            }[mode]
            phrases.append(f"{name} {ratio:.2f}×" + (" (slower)" if ratio < 1 else ""))
    if not phrases:
        return ""
    listed = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return f"On this prompt, against the target alone: {listed} the speed."


# ---------------------------------------------------------------- training


class TrainingJob:
    """The app's one training run at a time, in a background thread so that decoding keeps working.

    Handlers start it, poll `history`/`status` and ask it to stop; `train_fn(config, callback, should_stop)`
    does the work and returns a result with `.path`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.history: list[dict] = []
        self.result = None
        self.error: str | None = None
        self.owner: str | None = None  # session that started the run: only it may cancel

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, train_fn, owner: str | None = None) -> bool:
        """Start `train_fn` in the background; False if a run is already going."""
        with self._lock:
            if self.running:
                return False
            self._stop.clear()
            self.history, self.result, self.error, self.owner = [], None, None, owner
            self._thread = threading.Thread(
                target=self._work, args=(train_fn,), name="diversed-train", daemon=True
            )
            self._thread.start()
            return True

    def _work(self, train_fn) -> None:
        try:
            self.result = train_fn(self.history.append, self._stop.is_set)
        except Exception as err:  # noqa: BLE001 — any failure is reported to the user, not raised in a thread
            self.error = str(err) or type(err).__name__

    def cancel(self, owner: str | None = None) -> bool:
        """Ask the run to stop after its current step; False if none runs or another session owns it."""
        if not self.running or (self.owner is not None and owner != self.owner):
            return False
        self._stop.set()
        return True

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def training_status(job: TrainingJob, steps: int | None = None) -> str:
    if job.error:
        return f"Training failed: {job.error}"
    last = job.history[-1] if job.history else None
    progress = f"step {last.get('step')}" + (f" of {steps}" if steps else "") if last else "starting…"
    if job.running:
        return f"Training… {progress}" + (" (stopping after this step)" if job.cancelled else "")
    if job.result is not None and job.result.path is None:
        return f"Cancelled at {progress}; no head saved."
    if job.result is not None:
        return f"Finished: {progress}; head saved as **{job.result.path.stem}** ({job.result.path})"
    return "Idle."
