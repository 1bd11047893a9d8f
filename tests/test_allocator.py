"""Freed tensors' memory is reused rather than page-faulted in afresh (common/allocator.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def transparent_huge_pages_always() -> bool:
    """With 2 MB pages on every mapping, a fresh tensor faults once per 2 MB and the count shows nothing."""
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or bool(os.environ.get("LD_PRELOAD"))
    or transparent_huge_pages_always(),
    reason="glibc's own allocator (no LD_PRELOAD) with 4 kB pages",
)

# Ten rounds of two 128 MB tensors, as a training step makes and frees them: page faults per page of one.
ROUNDS = """
import resource, sys, torch
from diversed_demo.common.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elements = 32 * 2**20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = torch.ones(elements)
    y = x * 2
    del x, y
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (elements * 4 / resource.getpagesize()))
"""


def faults_per_page(mode: str) -> float:
    result = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return float(result.stdout)


def test_large_tensors_reuse_freed_memory():
    default, kept = faults_per_page("default"), faults_per_page("keep")
    assert default >= 15  # glibc's default: nearly every tensor is faulted in anew (20 tensors)
    assert kept <= default / 2
