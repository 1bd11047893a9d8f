"""The About tab: how relaxed speculative decoding works, what the token colours mean, and credits."""

from __future__ import annotations

import gradio as gr

from ..render import legend_html

PAPER_URL = "https://arxiv.org/abs/2604.07622"
CODE_URL = "https://github.com/comeusr/diversed"

ABOUT_MD = f"""
## How it works
A small **draft** model proposes N tokens; the **target** model scores all of them in one forward pass.
Each drafted token x is kept with probability

$$\\min\\left(1, \\frac{{\\nu(x)}}{{q(x)}}\\right), \\qquad \\nu = w\\,p + (1 - w)\\,q$$

where p is the target's and q the draft's distribution. On a rejection a token is drawn from
norm(max(0, p − q)); when all N pass, a **bonus** token comes from the target.

* **Exact speculative decoding** is w = 1: the output follows the target's distribution exactly.
* **Static ensemble**: one w for every token. The acceptance rate is then 1 − w·TV(p, q): lower w
  accepts more drafts (faster) and moves the output towards the draft.
* **Per-token rule**: w_t from p and q alone, with one knob λ and no training. It relaxes (w_t = 0, the
  draft's token is kept) where the draft's token costs the target little, and checks exactly (w_t = 1)
  elsewhere: w_t = 1 where CE(q, p) − H(p) > λ·TV(p, q). That is the best per-token choice for the
  target's likelihood of the text plus λ times the acceptance. Greedy, it keeps the draft's own token
  where its log-probability under the target is within λ of the target's best.
* **DIVERSED** learns a small head that predicts a per-token w_t from both models' hidden states (and
  the rule's terms CE − H, TV and H(p)), fitted to the per-token optimum on 100,000 positions of the
  target's own text, then trained with sequence-level RL to keep quality where it matters. A **cost
  head** (`<task>-cost`) learns instead a correction to the rule's cost of relaxing, from the hidden
  states, and is thresholded by the same λ: it starts as the rule, moves only where the task's score
  disagrees with the target's likelihood, and the λ slider moves it along its own curve.

## Why a per-token w is judged on quality
At one position, a verifier with weight w keeps the draft with probability 1 − w·TV(p, q), and the token
it emits differs from the target's own law by TV(ν, p) = (1 − w)·TV(p, q). So every verifier, one fixed w
or a different w at each token, trades acceptance for distance from the target along the same straight
line: measured that way, the static dial is already the best there is, because everything is. A per-token
w can only win on other measures: the target's likelihood of the text (fidelity), or the task's own score
(ROUGE-2, the right answer, tests passed). That is where the Results and the dial judge the per-token rule
and the heads against the static dial.

## Glossary
* **Target**: the model whose text we want (here SmolLM2-135M-Instruct). **Draft**: a much smaller,
  faster model that guesses the target's next tokens (here an EAGLE-3 draft that reads the target's
  features).
* **Target-only decoding**: the target writes one token per forward pass, the baseline every
  speed-up is measured against.
* **Exact speculative decoding (exact SD)**: the draft proposes N tokens and the target checks them in
  one pass; the output follows the target's distribution exactly (w = 1).
* **N (draft tokens per step)**: how many tokens the draft proposes before each check.
* **Prompt lookup** (greedy decoding only): where the last few tokens occurred earlier in the prompt or
  the answer, the token that followed them there is proposed instead of the draft's guess, since
  summaries and extractions repeat their source. The target still checks every proposal, so exact SD's
  text does not change; such a token's q(x) is the draft's own probability for it, sometimes 0. Exact SD
  may also propose a run of up to 7 copies alone, without asking the draft: its q(x) is then 1.
* **w**: the dial. The check compares each draft token with ν = w·p + (1 − w)·q, a mix of the target's
  (p) and the draft's (q) distributions. w = 1 is exact; lower w keeps more guesses.
* **Static ensemble**: one w for every token. **Per-token rule**: w_t from the two distributions alone
  (λ, in the sidebar, is what a kept draft may cost). **DIVERSED head**: a small trained network that
  picks w_t for each token from both models' hidden states and distributions.
* **Acceptance**: the share of drafted tokens that are kept. **Per-token acceptance α**: the chance
  that one drafted token is kept. **τ**: tokens produced per target pass (1 for target-only).
* **Speed-up**: tokens per second against target-only decoding, measured in the same run.
* **Quality**: the task's own score: ROUGE-2 against a reference summary, the right final number for
  math, tests passed (pass@1) for code, and for general chat **fidelity**, the target's mean
  log-probability of the text (nats per token; closer to 0 is more like the target's own text).
* **Static frontier**: quality against acceptance as a static w moves from 1 to 0. A head **beyond**
  it has better quality than a static w of the same acceptance, by more than its 95% interval.
* **Frontier card**: the JSON file beside a head (`heads/<name>.json`) that records how it was
  trained and measured. **Greedy twin**: the head of the same task trained for greedy decoding
  (temperature 0), named `<task>-greedy`.
* **Temperature T**: 0 picks the likeliest token (greedy); 1 samples from the model's distribution.

## Colours
{legend_html()}

Hover any token to see w_t, p(x), q(x) and its acceptance probability.

## Credits
* DIVERSED: Relaxed Speculative Decoding via Dynamic Ensemble Verification, Ziyi Wang et al.
  (AISTATS 2026) — [paper]({PAPER_URL}), [code]({CODE_URL}). This demo is an independent re-implementation.
* [SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) by Hugging Face
  (Apache-2.0), the embedded target.
* Speculative decoding: Leviathan, Kalman & Matias, *Fast Inference from Transformers via Speculative
  Decoding* (ICML 2023); Chen et al., *Accelerating Large Language Model Decoding with Speculative
  Sampling* (2023).
"""


def build_about_tab() -> None:
    with gr.Tab("About", id="about"):
        gr.Markdown(ABOUT_MD, elem_classes="dd-about")
