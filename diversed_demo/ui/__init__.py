"""The Gradio app: `app` assembles it from `sidebar` and `tabs/` (one module per tab, with its handlers);
beneath them `runs` (live run state), `render` (HTML and charts), `trace` (export and replay), the shipped
figures (`cards`, `frontiers`, `result_tables`, `cost_presets`), `opening` (where the app starts) and
`snippet` (the dial in transformers)."""

from .app import build_app, launch

__all__ = ["build_app", "launch"]
