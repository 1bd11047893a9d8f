"""The Gradio app: `app` assembles it from `sidebar` and `tabs/` (one module per tab, with its handlers);
beneath them `runs` (live run state), `render` (HTML and charts), `trace` (export and replay), the shipped
figures (`cards`, `frontiers`, `result_tables`, `cost_presets`), `opening` (where the app starts) and
`snippet` (the dial in transformers). Only `app`, `sidebar`, `handlers` and `tabs/` import Gradio, so the
plain functions beneath them run headless (scripts, a machine without Gradio)."""

import importlib

__all__ = ["build_app", "launch"]


def __getattr__(name: str):
    if name in __all__:  # imported on first use, so that `import diversed_demo.ui.runs` needs no Gradio
        return getattr(importlib.import_module(".app", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
