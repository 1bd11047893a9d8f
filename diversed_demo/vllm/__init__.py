"""DIVERSED inside vLLM: a plugin that makes vLLM's rejection sampler verify drafts against
nu = w·p + (1 − w)·q, with w per request (`diversed_w` in SamplingParams.extra_args, or top-level in an
OpenAI request) or a server default (`--additional-config '{"diversed_w": 0.5}'`); and a Spec-Bench bench
of vLLM beside this project's decoder (`python -m diversed_demo.vllm bench`). See docs/vllm.md.

`rule` is pure tensor math (no vLLM import); `sampler` and `plugin` hook it into vLLM; `engine` and
`bench` drive vLLM offline. Importing this package imports nothing from vLLM.
"""
