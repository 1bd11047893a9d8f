"""Where the project's own files are: assets, shipped heads, results, and the shared data sets beside it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (or the Space's folder)
ASSETS = ROOT / "assets"
PROMPTS_DIR = ASSETS / "prompts"
HEADS_DIR = ROOT / "heads"  # heads shipped with the project
RESULTS_DIR = ROOT / "results"
SHARED_DATA_DIR = ROOT.parent / "shared" / "data"  # Spec-Bench, GSM8K, MBPP (read by path, never copied)


def shown_path(path: Path) -> Path:
    """A file as the page names it: relative to the repository when it is in it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
