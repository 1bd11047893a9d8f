"""Reading the files the project ships (cards, bench reports): a JSON object or why not, a path as the page
names it, a nested key that may be missing."""

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


def dig(data, *keys):
    """data[k0][k1]…, or None where any level is missing or of the wrong type."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data
