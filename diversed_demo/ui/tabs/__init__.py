"""The app's tabs, one module each: its components, its wiring right under them, and its handlers."""
