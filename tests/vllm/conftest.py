"""Fixtures for the vLLM plugin's tests (run in .venv-vllm: `make test`, or
`.venv-vllm/bin/python -m pytest tests/vllm`)."""

import pytest


@pytest.fixture(scope="session")
def kernels():
    """vLLM's sampling kernels usable in this process (on a CPU: its C++ overrides), with the plugin in."""
    from vllm.platforms import current_platform

    from diversed_demo.vllm.plugin import register

    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    register()


@pytest.fixture(scope="module")
def embedded_engine():
    """vLLM serving the embedded target (fp32) with assets/draft as its EAGLE-3 speculator, plugin loaded."""
    from vllm import LLM

    from diversed_demo.vllm.engine import default_draft, embedded_target_dir, engine_kwargs

    llm = LLM(**engine_kwargs(embedded_target_dir(), default_draft(), n_draft=4, dtype="float32"))
    yield llm
    llm.llm_engine.engine_core.shutdown()
