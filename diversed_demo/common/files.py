"""Files: the user cache folder, the one atomic writer (an interrupt leaves the old file or the new one),
and the one way a damaged cached file is let go of (`discard_damaged`)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """The user cache folder: $DIVERSED_CACHE, else diversed-demo in $XDG_CACHE_HOME (~/.cache)."""
    root = os.environ.get("DIVERSED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "diversed-demo"
    )
    return Path(root)


def discard_damaged(
    path, what: str, damage: Exception | str, then: str, log: Callable[[str], None] | None = None
) -> None:
    """Remove a cached file or folder that failed its check or its load (cut short by a full disk, a copy or
    a crash, or not what it should be), so that the caller makes it again, and say so in one line (on
    stderr, or to `log`): "the cached <what> at <path> was damaged (<damage>); <then>"."""
    path = Path(path)
    reason = " ".join(str(damage).split())[:300] or type(damage).__name__
    with contextlib.suppress(FileNotFoundError):  # another process may have removed it first
        if path.is_dir():  # moved aside at once: no other process loads a half-removed folder
            aside = path.with_name(f"{path.name}.damaged{os.getpid()}")
            path.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            path.unlink()
    line = f"the cached {what} at {path} was damaged ({reason}); {then}"
    if log is None:
        print(line, file=sys.stderr, flush=True)
    else:
        log(line)


def read_json_object(path) -> tuple[dict | None, str]:
    """(the file's JSON object, "") or (None, why not, in one line naming the file)."""
    name = Path(path).name
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{name} is not there"
    except (OSError, ValueError) as err:
        return None, f"{name} cannot be read ({err})"
    return (data, "") if isinstance(data, dict) else (None, f"{name} does not hold a JSON object")


def atomic_write(path, write) -> None:
    """Call write(tmp_path), then rename onto `path`: an interrupt leaves the old file or the new one,
    never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as written:  # on disk before the rename makes it the file
            os.fsync(written.fileno())
        os.replace(tmp, path)
        sync_folder(path.parent)  # and the rename itself survives a crash
    finally:
        tmp.unlink(missing_ok=True)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk, where the system allows opening a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path, text: str) -> None:
    """Write a report or card atomically, making its folder."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_jsonl_gz(path, rows: list[dict]) -> None:
    """Rows as gzipped JSON lines, atomically (shards and prompt files: small in the repository)."""

    def write(tmp):  # no time or file name in the header: the same rows make the same bytes
        with open(tmp, "wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as packed:
            for row in rows:
                packed.write((json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n").encode())

    atomic_write(path, write)


def read_jsonl_gz(path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def atomic_torch_save(obj, path) -> None:
    import torch

    atomic_write(path, lambda tmp: torch.save(obj, tmp))
