"""Reading the files the project ships: a JSON object or why not (where a file is passed on whole, as a bench
report to its markdown; eval/schemas.py reads typed ones), and a path as the page names it."""

from __future__ import annotations

import json
from pathlib import Path

from ..common.paths import RESULTS_DIR


def read_json(path: Path) -> tuple[dict | None, str]:
    """(the file's object, "") or (None, why it cannot be read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path.name} is not there"
    except (OSError, ValueError) as err:
        return None, f"{path.name} cannot be read ({err})"
    return (data, "") if isinstance(data, dict) else (None, f"{path.name} does not hold a JSON object")


def shown_path(path: Path) -> Path:
    """A file as the page names it: relative to the repository when it is in it."""
    return path.relative_to(RESULTS_DIR.parent) if path.is_relative_to(RESULTS_DIR.parent) else path
