"""The Gradio app, by concern: `runs` (live run state), `render` (events as HTML, charts), `results` (the
shipped figures), `trace` (export and replay), `app` (the app built tab by tab, and its handlers)."""

from .app import build_app, launch

__all__ = ["build_app", "launch"]
