"""The decode log of an evaluation (JSON lines), so that a stopped frontier run resumes where it was
cut off."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..core.head import ConstantHead


class DecodeLog:
    """Per-decode results of an evaluation as JSON lines, so that a run stopped at any point (a session's
    end, a kill) resumes without decoding again. The first line holds the settings: a log written under
    other settings is refused, never mixed in."""

    def __init__(self, path, settings: dict):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings))  # as it reads back from the file
        self.records, self.reused = {}, 0
        text = self.path.read_text() if self.path.exists() else ""
        if "\n" in text and not text.endswith("\n"):  # a line cut short by a kill: dropped, decoded again
            text = text[: text.rindex("\n") + 1]
            self.path.write_text(text)
        lines = text.splitlines()
        if not lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self._append({"settings": self.settings})
            return
        try:
            logged = json.loads(lines[0]).get("settings")
        except (json.JSONDecodeError, AttributeError):
            logged = None
        if logged != self.settings:
            raise ValueError(
                f"{self.path} is the log of another evaluation (settings {logged}); "
                "name another log file or remove this one"
            )
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                self.records[record["key"]] = record
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(
                    f"{self.path}, line {number}, is not a decode record: the log is damaged; "
                    "remove that line (it is decoded again) or the file"
                ) from None

    def _append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def get(self, key: str) -> dict | None:
        record = self.records.get(key)
        self.reused += record is not None
        return record

    def put(self, key: str, record: dict) -> None:
        self.records[key] = {"key": key, **record}
        self._append(self.records[key])


def weights_key(head) -> str:
    """Which weights a head has: a retrained head of the same name never reuses the old one's decodes."""
    if isinstance(head, ConstantHead):
        return f"constant {head.value!r}"
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        digest.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
