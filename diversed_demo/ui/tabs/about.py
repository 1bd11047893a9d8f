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
* **DIVERSED** learns a small head that predicts a per-token w_t from both models' hidden states,
  trained with sequence-level RL to keep quality where it matters and relax where it does not.

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
