"""The hidden states a head reads, carried to vLLM 0.32's rejection step (only on a server that serves heads).

- the target's: its last (post-norm) hidden state at each drafted position, the rows its logits came from:
  `sample_hidden_states[target_logits_indices]`. The runner keeps them between `execute_model` and
  `sample_tokens`, which clears them before it samples, so `sample_tokens` is wrapped to keep a reference.
- the draft's: the EAGLE-3 layer's pre-norm output from which it drew each drafted token (its second
  output, which it feeds back to itself), as this project's decoder gives a head. `propose` is wrapped to
  record each drafter call's output (the first call's rows at `token_indices_to_sample`, the later calls'
  first `batch` rows, as `propose` reads them); the runner keeps them per request until the next step
  verifies those drafts, as vLLM keeps `draft_probs`.

A drafter call is recorded by giving the drafter model a subclass whose `__call__` keeps the output: the
model's type checks still pass, and it works whether the call runs eagerly, compiled or as a CUDA graph
(the rows are copied before the graph's buffers are reused).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from ..runtime.class_swap import swap_class
from .head_clock import head_work
from .heads import configured_heads

UPSTREAM_SAMPLE_TOKENS = GPUModelRunner.sample_tokens
UPSTREAM_PROPOSE_DRAFTS = GPUModelRunner.propose_draft_token_ids
UPSTREAM_PROPOSE = SpecDecodeBaseProposer.propose
UPSTREAM_FIRST_PASS = SpecDecodeBaseProposer.set_inputs_first_pass


@dataclass
class Recording:
    """One `propose` call's drafter outputs: [rows, Hd] per drafter call, first call's rows to keep."""

    first_rows: torch.Tensor | None = None
    outputs: list = field(default_factory=list)


RECORDING: ContextVar[Recording | None] = ContextVar("diversed_draft_recording", default=None)
RECORDING_CLASSES: dict[type, type] = {}


def serves_heads(holder) -> bool:
    """Whether the server of a runner or drafter (anything with a vllm_config) names heads; asked once."""
    if getattr(holder, "_diversed_serves_heads", None) is None:
        holder._diversed_serves_heads = bool(configured_heads(holder.vllm_config.additional_config))
    return holder._diversed_serves_heads


def install() -> None:
    GPUModelRunner.sample_tokens = sample_tokens_keeping_hidden
    GPUModelRunner.propose_draft_token_ids = propose_keeping_draft_hidden
    SpecDecodeBaseProposer.propose = propose_recording_hidden
    SpecDecodeBaseProposer.set_inputs_first_pass = first_pass_noting_rows


def sample_tokens_keeping_hidden(self, grammar_output):
    """GPUModelRunner.sample_tokens, with the step's target hidden states kept for `_sample`."""
    state = self.execute_model_state
    self._diversed_sample_hidden = state.sample_hidden_states if state is not None else None
    try:
        return UPSTREAM_SAMPLE_TOKENS(self, grammar_output)
    finally:
        self._diversed_sample_hidden = None


def propose_keeping_draft_hidden(self, *args, **kwargs):
    """GPUModelRunner.propose_draft_token_ids, keeping the drafter's hidden states by request."""
    self._diversed_draft_hidden = self._diversed_draft_req_ids = None
    drafts = UPSTREAM_PROPOSE_DRAFTS(self, *args, **kwargs)
    hidden = getattr(self.drafter, "diversed_draft_hidden", None)
    if hidden is not None:
        self._diversed_draft_hidden, self.drafter.diversed_draft_hidden = hidden, None
        self._diversed_draft_req_ids = list(self.input_batch.req_ids)
    return drafts


def propose_recording_hidden(self, *args, **kwargs):
    """SpecDecodeBaseProposer.propose, recording the drafter's hidden state behind each drafted token:
    self.diversed_draft_hidden [batch, K, Hd]."""
    if not serves_heads(self):
        return UPSTREAM_PROPOSE(self, *args, **kwargs)
    record_calls(self.model)
    recording = Recording()
    token = RECORDING.set(recording)
    try:
        drafts = UPSTREAM_PROPOSE(self, *args, **kwargs)
    finally:
        RECORDING.reset(token)
    batch, outputs = drafts.shape[0], recording.outputs
    if drafts.shape[1] and len(outputs) >= drafts.shape[1]:
        with head_work("record"):
            rows = [outputs[0], *(o[:batch] for o in outputs[1 : drafts.shape[1]])]
            self.diversed_draft_hidden = torch.stack(rows, dim=1)
    return drafts


def first_pass_noting_rows(self, *args, **kwargs):
    """SpecDecodeBaseProposer.set_inputs_first_pass, noting which rows of the first call drafted."""
    result = UPSTREAM_FIRST_PASS(self, *args, **kwargs)
    recording = RECORDING.get()
    if recording is not None:
        recording.first_rows = result[1]  # (num_tokens, token_indices_to_sample, attention metadata)
    return result


def record_calls(model) -> None:
    """Give the drafter model a subclass whose calls, during a recorded `propose`, keep their pre-norm
    output (a no-op when it has one)."""
    cls = type(model)
    if cls in RECORDING_CLASSES.values():
        return
    if cls not in RECORDING_CLASSES:

        def call(self, *args, **kwargs):
            output = cls.__call__(self, *args, **kwargs)
            recording = RECORDING.get()
            if recording is not None and isinstance(output, tuple):
                with head_work("record"):
                    prenorm = output[1]
                    first = not recording.outputs and recording.first_rows is not None
                    recording.outputs.append(prenorm[recording.first_rows] if first else prenorm.clone())
            return output

        RECORDING_CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": call})
    swap_class(model, RECORDING_CLASSES[cls])


def step_hidden(runner, spec_decode_metadata) -> tuple[torch.Tensor, torch.Tensor] | None:
    """This step's (target hidden [num_tokens, H], draft hidden [num_tokens, Hd]) at the drafted positions,
    in the rejection sampler's flat order; None where either is missing for a request with drafts."""
    sample_hidden = getattr(runner, "_diversed_sample_hidden", None)
    draft_hidden = getattr(runner, "_diversed_draft_hidden", None)
    if sample_hidden is None or draft_hidden is None:
        return None
    row_of = {req_id: i for i, req_id in enumerate(runner._diversed_draft_req_ids)}
    rows = []
    for req_id, n in zip(runner.input_batch.req_ids, spec_decode_metadata.num_draft_tokens):
        if n == 0:
            continue
        if req_id not in row_of or n > draft_hidden.shape[1]:
            return None
        rows.append(draft_hidden[row_of[req_id], :n])
    target = sample_hidden[spec_decode_metadata.target_logits_indices]
    return target, torch.cat(rows) if rows else target.new_zeros(0, draft_hidden.shape[-1])
