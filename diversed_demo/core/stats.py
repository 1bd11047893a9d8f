"""A decode's accounting: token counts, acceptance rate, τ and speed, defined once for every report."""

from __future__ import annotations

from dataclasses import dataclass, field

from .decode import Step
from .events import TokenEvent


class Rates:
    """Acceptance rate, τ and speed, defined once for whatever counts a decode's tokens in `new_tokens`,
    `target_passes`, `drafted`, `accepted` and `wall_time_s` (a Summary, the Counts of many decodes, a live
    tally): every report of them in the project reads these."""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafted tokens ÷ drafted tokens (None where nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        """Tokens emitted per target pass."""
        return self.new_tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass
class Counts(Rates):
    """Token counts of one decode or a sum of many (`+`), or a live tally of an event stream (`add_event`)."""

    new_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens kept in the output
    rejected: int = 0  # drafted tokens verified and turned down (at most one per step)
    wall_time_s: float = 0.0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f) + getattr(other, f) for f in Counts.__dataclass_fields__))

    @property
    def verified_acceptance(self) -> float | None:
        """Accepted ÷ verified drafts: the per-token acceptance α, where accepted ÷ drafted also counts the
        drafts after a rejection, which are never verified."""
        verified = self.accepted + self.rejected
        return self.accepted / verified if verified else None

    def add_event(self, event: TokenEvent) -> None:
        """Count one event of the stream (events arrive in step order); wall time is the caller's."""
        if event.step > self.target_passes:
            self.target_passes = event.step
            self.drafted += event.drafted
        if event.kind == "rejected":
            self.rejected += 1
        else:
            self.new_tokens += 1
            self.accepted += event.kind == "accepted"


@dataclass
class Summary(Rates):
    text: str
    new_tokens: int
    target_passes: int
    drafted: int
    accepted: int
    wall_time_s: float
    mean_w: float | None = None  # mean w_t over the positions where it decided a token
    token_ids: list[int] = field(default_factory=list)
    events_s: float = 0.0  # of wall_time_s, the time spent building and yielding token events
    rejected: int = 0
    # of wall_time_s, the steps' drafting, the target's passes and the decisions after them (Step's times);
    # the first pass, over the prompt, apart: every mode pays it once, whatever it drafts
    prompt_s: float = 0.0
    draft_s: float = 0.0
    pass_s: float = 0.0
    decide_s: float = 0.0

    @property
    def counts(self) -> Counts:
        return Counts(
            self.new_tokens, self.target_passes, self.drafted, self.accepted, self.rejected, self.wall_time_s
        )

    def to_dict(self) -> dict:
        """A decode's figures (not its text or ids), as the CLI's --json and the app's traces hold them."""
        return {
            "acceptance_rate": self.acceptance_rate,
            "tau": self.tau,
            "new_tokens": self.new_tokens,
            "tokens_per_second": self.tokens_per_second,
            "wall_time_s": self.wall_time_s,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "mean_w": self.mean_w,
        }


@dataclass
class Tally:
    """A decode's Summary, counted step by step."""

    summary: Summary = field(default_factory=lambda: Summary("", 0, 0, 0, 0, 0.0))
    w_total: float = 0.0
    w_count: int = 0
    token_w: list = field(default_factory=list)  # w_t at each output token that w decided

    def add(self, step: Step) -> None:
        summary, verdict, n = self.summary, step.verdict, len(step.verdict.draft_tokens)
        if summary.target_passes:
            summary.pass_s += step.pass_s
        else:
            summary.prompt_s += step.pass_s
        summary.target_passes += 1
        summary.drafted += step.drafted
        summary.accepted += min(verdict.n_accepted, len(step.new_ids))
        summary.rejected += (
            verdict.n_accepted < n and len(step.new_ids) > verdict.n_accepted
        )  # not cut by an EOS
        verified = verdict.n_accepted + (verdict.n_accepted < n)  # positions whose w mattered
        self.w_total += float(verdict.w[:verified].sum())
        self.w_count += verified
        self.token_w += verdict.w[: min(verified, len(step.new_ids))].tolist()
        summary.new_tokens += len(step.new_ids)
        summary.token_ids += step.new_ids
        summary.wall_time_s += step.draft_s + step.verify_s
        summary.draft_s += step.draft_s
        summary.decide_s += step.verify_s - step.pass_s

    def finish(self, tokenizer, wall_time_s: float | None = None) -> Summary:
        """The Summary, with its text; wall_time_s replaces the steps' own time (which leaves out the
        loop's)."""
        summary = self.summary
        if wall_time_s is not None:
            summary.wall_time_s = wall_time_s
        summary.text = tokenizer.decode(summary.token_ids, skip_special_tokens=True)
        summary.mean_w = self.w_total / self.w_count if self.w_count else None
        return summary
