"""How many tokens a step drafts: a fixed N, or, with n_draft="auto", as many as pay, token by token.

Terms: in target-only steps a drafted token costs c, a step that drafts pays r once besides (the draft's
first pass reads the tokens verified since its last), and the target's pass over j drafts and the bonus
position v_j (v_0 = 1: a target-only step). Where the pair measured whole decoding steps (its costs'
"steps", runtime/costs.step_costs), c and r are the drafting's alone, spent once drafted, and v_j holds
all the rest a step pays for its j positions: their verification and events, and the target's pass slowed
by the draft's steps between passes, which a position not put to the target saves. A step that drafts j ≥ 1
tokens then costs T_j = r + j·c + v_j (T_0 = 1) and emits E_j = 1 + P_1 + … + P_j tokens on average,
where P_i = α_1·…·α_i is the chance that the first i drafts are all kept. One more draft adds P_j·ᾱ tokens
(ᾱ: the next draft's chance, before it is seen) for T_{j+1} − T_j, so drafting goes on while

    P_j·ᾱ / (T_{j+1} − T_j)  ≥  E_j / T_j,

the step's rate so far; as EAGLE-2 and SpecDec++ do, a drafted path stops where its confidence falls. At
j = 0 the rule reads ᾱ ≥ r + c + v_1 − 1: where drafting returns less than it costs, the step drafts nothing
and decoding runs at the target's own pace. Once the j-th draft is drafted its cost is spent, and its own
chance α_j is known: it is put to the target only where it pays its place in the pass,

    P_{j−1}·α_j / (v_j − v_{j−1})  ≥  E_{j−1} / (r + j·c + v_{j−1}),

else the step verifies the j − 1 before it (none: a target-only step). The choice reads the drafts up to
the j-th, never a later one, so whether a position is verified never depends on its own token: sampled
verification keeps the target's law.

Exact SD's blocks of copies (lookup.py: greedy, no draft step) are priced the same way, a block of j copies
costing its pass v_j alone: a copy is taken while P_j·α / (v_{j+1} − v_j) ≥ E_j / v_j, α the copy's chance,
from the copies verified so far after a match of as many tokens. Where the text's copies are seldom the
target's tokens, a block of seven cost a pass of eight and returned about one.

α_i comes from the draft's confidence s (greedy: q(x) of the token it drafted; sampled: q's top
probability). The mode's own rule gives the prior: acceptance is 1 − w·TV(p, q), and greedy, at a drafted
token about 1 − w·(1 − s) (w = 1 for exact SD, the static w, the running mean w_t of the rule or a head,
from UNSEEN_W before any is seen). Sampled, s says less of a draft's acceptance (a flat q often meets a
flat p): its prior reads s halfway to one half, (s + 1/2)/2, and each bin learns its own from evidence.
A draft tree's later children (draft_tree.py) are kept only where the target's choice passes over the
first: about w·s.
Each verified position then corrects it: per rank (first child or later) and bin of s, the kept share of
the positions verified so far in this decode (the acceptance probability where sampling, a hit where
greedy), against PRIOR_WEIGHT positions of the prior. The choice reads the decode's own tokens only, never
the clock, so a seed replays the same decode.
"""

from __future__ import annotations

from .cache import MAX_FEED
from .config import AUTO
from .lookup import MAX_MATCH, MIN_MATCH

AUTO_MAX = MAX_FEED - 1  # the most a step drafts: one compiled pass scores 7 drafts and the bonus position
BINS = 10  # bins of the draft's confidence s in [0, 1]
PRIOR_WEIGHT = 2.0  # verified positions the prior counts for, per bin: a few positions outweigh it
# A step that drafts nothing verifies nothing: it forgets this share of the evidence, so that the prior
# pulls a poor stretch's estimate back up and drafting is tried again some steps later.
FORGET = 0.85
# The running mean of a per-token w (the rule's, a head's) before any position is verified: their w_t are
# mostly 0 or 1, either as likely. Started at exact's w = 1, a rule or head whose pair's steps made exact SD's
# first draft not pay (ᾱ = 0.5) never drafted, so never saw the w_t that would have made it pay.
UNSEEN_W = 0.5
# A sampled draft's prior reads its confidence s halfway to this: at T = 1 on README's 26 prompts, first
# drafts of top probability under 0.1 were kept 0.28 of the time, 0.5–0.6 0.52, 0.9 and over 0.93 (speed.md,
# "The draft length at T = 1"); priced at s the low ones were dropped unverified, and, counted at that
# chance, their bins never learned otherwise.
SAMPLED_CONFIDENCE = 0.5
# A copy's chance before evidence: over 26 Spec-Bench turns a copy after a match of 2 or more tokens was the
# target's greedy choice 0.54 of the time (docs/measurements/speed.md, "Prompt lookup").
COPY_PRIOR = 0.5
# Where the runtime measured no costs (a GPU, transformers' own layers): a draft a tenth of the target,
# a pass over j + 1 tokens 1 + 0.04·j target tokens (the embedded pair's eager figures on a CPU); the
# slope also carries measured v_j past the longest length measured.
DEFAULT_C = 0.1
DEFAULT_V_SLOPE = 0.04


def confidence_bin(confidence: float) -> int:
    """The bin of a draft's confidence s in [0, 1] (s = 1 in the last)."""
    return min(max(int(confidence * BINS), 0), BINS - 1)


def prior_chance(w: float, confidence: float, later: bool = False) -> float:
    """The mode's acceptance at a draft of probability `confidence` before any evidence: 1 − w·(1 − s) for
    a first child (a chain's every draft), w·s for a tree's later children."""
    return w * confidence if later else 1.0 - w * (1.0 - confidence)


class FixedLength:
    """N drafts a step (fewer only where the budget ends first); a tree's nodes priced by the prior."""

    def __init__(self, n_draft: int, w_prior: float = 1.0):
        self.n_draft, self.w_prior = n_draft, w_prior

    def chance(self, confidence: float, later: bool = False) -> float:
        return prior_chance(self.w_prior, confidence, later)

    def start(self, room: int) -> int:
        """The most this step may draft, given `room` for drafts."""
        return min(self.n_draft, room)

    @property
    def stopper(self) -> None:
        """Nothing stops a fixed draft early: the draft need not read its confidence."""
        return None

    def learn(self, verdict) -> None:
        pass

    def copy_pays(self, copied: int, match: int) -> bool:
        """A fixed N takes every copy the text offers."""
        return True


def pass_costs(measured: dict[int, float]) -> list[float]:
    """v_0..v_AUTO_MAX from the measured v_j: between two measured lengths on the line through them, beyond
    the last at the slope of the last two (DEFAULT_V_SLOPE where fewer than two were measured)."""
    points = sorted({0: 1.0, **measured}.items())
    slope = DEFAULT_V_SLOPE
    if len(points) > 2:
        (low, v_low), (high, v_high) = points[-2:]
        slope = max((v_high - v_low) / (high - low), 0.0)

    def at(j: int) -> float:
        for (low, v_low), (high, v_high) in zip(points, points[1:]):
            if j <= high:
                return v_low + (j - low) / (high - low) * (v_high - v_low)
        last, v_last = points[-1]
        return v_last + slope * (j - last)

    return [at(j) for j in range(AUTO_MAX + 1)]


class AdaptiveLength:
    """The rule above for one decode: its costs, its evidence per bin of confidence, this step's path."""

    def __init__(self, costs: dict | None, w_prior: float, sampled: bool = False):
        self.sampled = sampled  # a sampled decode's first children: the prior of (s + SAMPLED_CONFIDENCE) / 2
        costs = costs or {}
        costs = costs.get("steps", costs)  # as whole steps price them, where measured (runtime/costs.py)
        self.c, self.r = costs.get("c", DEFAULT_C), costs.get("r", 0.0)
        self.v = pass_costs(costs.get("v", {}))
        # per rank (0: a first child, 1: a later one) and bin of confidence; plain floats: a tree's nodes
        # each read their chance, and a tensor's element costs microseconds
        self.kept, self.seen = [[0.0] * BINS for _ in range(2)], [[0.0] * BINS for _ in range(2)]
        self.w_total, self.w_count = w_prior * PRIOR_WEIGHT, PRIOR_WEIGHT
        self.confidences: list[float] = []  # of this step's drafts
        # per length of the match a copy followed (lookup.py): copies kept and verified; this step's matches
        self.copies_kept, self.copies_seen = [0.0] * (MAX_MATCH + 1), [0.0] * (MAX_MATCH + 1)
        self.matches: list[int] = []
        self.path, self.tokens, self.limit = 1.0, 1.0, 0

    @property
    def stopper(self) -> AdaptiveLength:
        """What the draft asks, token by token, whether to keep a draft (`keeps`) and to go on (`go_on`)."""
        return self

    def _w(self) -> float:
        return self.w_total / self.w_count

    def chance(self, confidence: float, later: bool = False) -> float:
        """α of a draft the draft gave probability `confidence` (a tree's later child where `later`)."""
        b, rank = confidence_bin(confidence), int(later)
        s = (confidence + SAMPLED_CONFIDENCE) / 2 if self.sampled and not later else confidence
        prior = prior_chance(self._w(), s, later)
        return (self.kept[rank][b] + PRIOR_WEIGHT * prior) / (self.seen[rank][b] + PRIOR_WEIGHT)

    def mean_chance(self) -> float:
        """ᾱ: a first draft's chance before its confidence is known (a confidence of one half a priori)."""
        prior = prior_chance(self._w(), 0.5)
        return (sum(self.kept[0]) + PRIOR_WEIGHT * prior) / (sum(self.seen[0]) + PRIOR_WEIGHT)

    def step_cost(self, drafted: int) -> float:
        """T_j: a step's cost in target tokens when it drafts `drafted` tokens."""
        return (self.r if drafted else 0.0) + drafted * self.c + self.v[drafted]

    def _pays(self, drafted: int) -> bool:
        if drafted >= self.limit:
            return False
        gain = self.path * self.mean_chance() / (self.step_cost(drafted + 1) - self.step_cost(drafted))
        return gain >= self.tokens / self.step_cost(drafted)

    def start(self, room: int) -> int:
        """The most this step may draft (0: it drafts nothing), given `room` for drafts."""
        self.confidences, self.matches, self.path, self.tokens = [], [], 1.0, 1.0
        self.limit = min(room, AUTO_MAX)
        if self.limit <= 0:  # the budget is spent: nothing was skipped for want of pay
            return 0
        if self._pays(0):
            return self.limit
        for counts in (*self.kept, *self.seen):
            counts[:] = [c * FORGET for c in counts]
        return 0

    def keeps(self, drafted: int, confidence: float) -> bool:
        """Whether the `drafted`-th draft, which the draft gave `confidence`, is put to the target (the rule
        above); one that is not counts, as evidence, at the chance the rule gave it, so that ᾱ does not
        rise on the drafts it was sure enough to verify alone."""
        chance = self.chance(confidence)
        sunk = self.r + drafted * self.c
        place = self.v[drafted] - self.v[drafted - 1]
        if self.path * chance * (sunk + self.v[drafted - 1]) < self.tokens * place:
            self._count(0, confidence, chance)
            return False
        self.confidences.append(confidence)
        self.path *= chance
        self.tokens += self.path
        return True

    def copy_chance(self, match: int) -> float:
        """α of a copy that followed a match of `match` tokens."""
        m = min(max(match, MIN_MATCH), MAX_MATCH)
        return (self.copies_kept[m] + PRIOR_WEIGHT * COPY_PRIOR) / (self.copies_seen[m] + PRIOR_WEIGHT)

    def copy_pays(self, copied: int, match: int) -> bool:
        """Whether a block of `copied` copies takes one more, which followed a match of `match` tokens (the
        rule above, the block costing its pass alone); the step's path goes on through it where it does."""
        chance = self.copy_chance(match)
        if self.path * chance * self.v[copied] < self.tokens * (self.v[copied + 1] - self.v[copied]):
            return False
        self.matches.append(match)
        self.path *= chance
        self.tokens += self.path
        return True

    def _count(self, rank: int, confidence: float, chance: float) -> None:
        """One position of evidence: a draft of `confidence` at `rank`, kept with probability `chance`."""
        b = confidence_bin(confidence)
        self.kept[rank][b] += chance
        self.seen[rank][b] += 1.0

    def go_on(self, drafted: int) -> bool:
        """Whether to draft another token after the `drafted`-th (kept: `keeps`)."""
        return self._pays(drafted)

    def learn(self, verdict) -> None:
        """Count the step's verified positions: each one's chance of being kept, by its draft's confidence
        (a tree's: every child tried, by the confidence its value was priced from)."""
        if self.matches:  # a block of copies: each verified one by its match
            verified = min(verdict.n_accepted + 1, len(self.matches))
            for match, chance in zip(self.matches, verdict.accept_probs[:verified].tolist()):
                self.copies_kept[match] += chance
                self.copies_seen[match] += 1.0
            return
        if verdict.tree is not None:
            tree, decided = verdict.tree.tree, verdict.tree.decided
            confidences = [tree.confidences[node] for node, _ in decided.tried]
            ranks = [int(tree.later[node]) for node, _ in decided.tried]
            kept = [chance for _, chance in decided.tried]
            verified = len(verdict.w)
        else:
            verified = min(verdict.n_accepted + 1, len(self.confidences))
            confidences, ranks = self.confidences[:verified], [0] * verified
            kept = verdict.accept_probs[:verified].tolist()
        for confidence, rank, chance in zip(confidences, ranks, kept):
            self._count(rank, confidence, chance)
        if not verified:
            return
        self.w_total += float(verdict.w[:verified].sum())
        self.w_count += verified


def draft_length(config, costs: dict | None):
    """The config's draft length rule: fixed N, or adaptive for n_draft="auto" (the mode's w as prior)."""
    w_prior = {"exact": 1.0, "static": float(config.ensemble_weight)}.get(config.mode, UNSEEN_W)
    if config.n_draft != AUTO:
        return FixedLength(config.n_draft, w_prior)
    return AdaptiveLength(costs, w_prior, sampled=config.temperature > 0)
