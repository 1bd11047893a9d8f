"""The sidebar: the decoding settings that Decode, Compare and the dial share (w, head, N, new tokens,
temperature, seed), and turning their values into the app's DecodeConfig."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ..core.config import AUTO, MAX_N_DRAFT, MAX_SEED, DecodeConfig
from ..core.head import COST_HEAD_LAM
from ..models.heads import HeadError, list_heads, read_head_metadata, resolve_head_path
from .cards import head_cards, head_for_temperature
from .handlers import bind
from .opening import Defaults, settings_why
from .runs import APP_CONFIG, NO_HEAD

LAM_MAX = 10  # nats: past a few, the rule keeps nearly every draft


@dataclass
class Sidebar:
    """The sidebar's components: the tabs read them, and the Train tab updates the head."""

    w: gr.Slider
    lam: gr.Slider
    head: gr.Dropdown
    n_draft: gr.Slider
    max_new_tokens: gr.Slider
    temperature: gr.Slider
    seed: gr.Number
    auto_n: gr.Checkbox  # N chosen step by step (core/draft_length.py); the slider's N where unticked
    tree: gr.Radio  # chains, trees, or the runtime's choice (core/config.py's tree)

    @property
    def inputs(self) -> list:
        """The components a decode reads, in `settings_from`'s order after the mode (λ and the draft length
        rule last: the API's callers from before them keep their order)."""
        return [
            self.w,
            self.head,
            self.n_draft,
            self.max_new_tokens,
            self.temperature,
            self.seed,
            self.lam,
            self.auto_n,
            self.tree,
        ]


# The sidebar's choice of drafts, as the decoder's tree setting.
DRAFTS = {"as the runtime chose": "auto", "chains": "off", "trees": "on"}


def settings_from(
    mode,
    w,
    head_name,
    n_draft,
    max_new_tokens,
    temperature,
    seed,
    lam=APP_CONFIG.lam,
    auto_n=False,
    drafts="as the runtime chose",
) -> DecodeConfig:
    """The app's config of a decode in `mode` (a code of core.config.MODES) from the sidebar's values: N
    chosen step by step where `auto_n` (the page's default), else the slider's (an API caller's N); chains,
    trees or what the runtime chose for this machine (`drafts`: a key of DRAFTS)."""
    if drafts not in DRAFTS:
        raise ValueError(f"drafts must be one of {', '.join(DRAFTS)}, not {drafts!r}")
    if seed is None or not 0 <= float(seed) <= MAX_SEED or float(seed) != int(seed):
        raise ValueError(f"the seed must be an integer from 0 to {MAX_SEED}, not {seed!r}")
    if mode == "dynamic" and not head_name:
        raise ValueError(NO_HEAD)
    return APP_CONFIG.replace(
        mode=mode,
        ensemble_weight=float(w),
        lam=float(lam),
        head=head_name or None,
        n_draft=AUTO if auto_n else int(n_draft),
        max_new_tokens=int(max_new_tokens),
        temperature=float(temperature),
        seed=int(seed),
        tree=DRAFTS[drafts],
    )


def head_choices(pair) -> list[str]:
    return list(list_heads(pair))  # the user's newest first, then the shipped ones


def refresh_heads(pair, current):
    """The head dropdown with the heads on disk now, keeping `current` where it is still there."""
    names = head_choices(pair)
    return gr.update(choices=names, value=current if current in names else (names[0] if names else None))


def cost_head_lam(head_name):
    """The λ slider at a cost head's default where one is picked (it decodes along λ); else left alone."""
    try:
        kind = read_head_metadata(resolve_head_path(head_name))["config"].get("kind")
    except (HeadError, TypeError, ValueError, OSError):
        return gr.skip()
    return COST_HEAD_LAM if kind == "cost" else gr.skip()


def switch_head(cards: dict[str, dict], head_name, temperature):
    """The head trained for the new temperature's kind of decoding, where the chosen one was not."""
    choice = head_for_temperature(cards, head_name, temperature)
    return gr.skip() if choice is None else choice


def sliders(start: DecodeConfig) -> tuple[gr.Slider, gr.Slider, gr.Slider]:
    """N, max new tokens and temperature, at their opening values."""
    n_draft = gr.Slider(
        1,
        min(MAX_N_DRAFT, 12),
        value=start.n_draft,
        step=1,
        label="draft tokens per step N",
        elem_id="n-draft",
    )
    max_new_tokens = gr.Slider(8, 512, value=start.max_new_tokens, step=8, label="max new tokens")
    temperature = gr.Slider(
        0,
        2,
        value=start.temperature,
        step=0.05,
        label="temperature",
        info="0 = greedy",
        elem_id="temperature",
    )
    return n_draft, max_new_tokens, temperature


def build_sidebar(app: gr.Blocks, pair, heads: dict[str, Path], start: Defaults) -> Sidebar:
    """The sidebar at the opening settings, its note saying where they come from; the head dropdown lists
    the heads on disk on each page load."""
    with gr.Sidebar(label="Decoding settings", open=True, elem_id="sidebar"):
        gr.Markdown(f"### Decoding settings\nShared by Decode, Compare and the dial. {start.note}")
        with gr.Accordion("Why these settings", open=False, elem_id="sidebar-why"):
            why = gr.Markdown(settings_why(pair, start))
        w = gr.Slider(
            0,
            1,
            value=start.settings.ensemble_weight,
            step=0.05,
            label="static ensemble weight w",
            info="1 = exact SD; lower accepts more drafts",
            elem_id="w-slider",
        )
        lam = gr.Slider(
            0,
            LAM_MAX,
            value=start.settings.lam,
            step=0.25,
            label="per-token λ (the rule and cost heads)",
            info="keeps a draft where it costs the target's likelihood less than λ",
            elem_id="lam-slider",
        )
        head = gr.Dropdown(
            list(heads),
            value=start.settings.head_name,
            label="DIVERSED head",
            info="trained heads for this pair; train one in the Train tab",
            elem_id="head",
        )
        n_draft, max_new_tokens, temperature = sliders(start.settings)
        auto_n = gr.Checkbox(
            True,
            label="choose N step by step",
            info="drafting stops where one more token is expected to cost more than it returns; "
            "untick for the slider's N",
            elem_id="auto-n",
        )
        tree = gr.Radio(
            list(DRAFTS),
            value="as the runtime chose",
            label="drafts",
            info="a chain of guesses a step, or a tree of them (several candidates a position, in one "
            "target pass); the runtime drafts trees where they pay on this machine",
            elem_id="drafts",
        )
        seed = gr.Number(
            start.settings.seed, precision=0, minimum=0, maximum=MAX_SEED, label="seed", elem_id="seed"
        )

    # A task with a head for each kind of decoding: moving to or from greedy switches to the other.
    temperature.change(
        bind(switch_head, head_cards(heads)), [head, temperature], head, api_visibility="private"
    )
    head.input(cost_head_lam, head, lam, api_visibility="private")  # the visitor's pick, not a switch
    app.load(bind(refresh_heads, pair), head, head, api_visibility="private")
    app.load(bind(settings_why, pair, start), None, why, api_visibility="private")  # the runtime now
    return Sidebar(w, lam, head, n_draft, max_new_tokens, temperature, seed, auto_n, tree)
