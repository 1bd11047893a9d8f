"""runtime/native_build.py: a kernel library is compiled once, whoever asks for it at the same time."""

from __future__ import annotations

import threading
import time

from diversed_demo.runtime import native_build


def test_two_processes_asking_for_one_library_at_once_compile_it_once(tmp_path, monkeypatch):
    """Two test workers (or two app starts) that find the library missing: the second waits for the
    first's compiler and loads what it wrote, instead of compiling it again beside it."""
    compiled = []

    def compile_slowly(source, flags, path, background):
        compiled.append(threading.current_thread().name)
        time.sleep(0.3)  # the compiler's seconds, during which the other asks
        path.write_bytes(b"built")

    monkeypatch.setattr(native_build, "compile_unlocked", compile_slowly)
    monkeypatch.setattr(native_build, "library_damage", lambda path: None)  # what was written is whole
    path = tmp_path / "kernels" / "kernel-0123.so"
    askers = [
        threading.Thread(target=native_build.compile_library, args=(tmp_path / "k.cpp", [], path), name=name)
        for name in ("first", "second")
    ]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert len(compiled) == 1 and path.read_bytes() == b"built"


def test_a_damaged_library_is_compiled_again_under_the_lock(tmp_path, monkeypatch):
    compiled = []
    monkeypatch.setattr(native_build, "compile_unlocked", lambda *args: compiled.append(args))
    path = tmp_path / "kernel.so"
    path.write_bytes(b"not a library")
    native_build.compile_library(tmp_path / "k.cpp", [], path)
    assert len(compiled) == 1
