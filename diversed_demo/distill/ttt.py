"""EAGLE-3's training-time test: the draft unrolled over whole sequences as decoding would chain it, and
the loss of that unroll against the target's distributions."""

from __future__ import annotations

import torch

from ..models.eagle import Eagle3Draft, target_features
from .config import DraftTrainConfig


def ttt_attention(q, k0, v0, diag_keys, diag_values, mask0):
    """Training-time test (EAGLE-3): at unroll step j, the query at position i sees the step-0 keys of
    positions ≤ i (mask0 [B, 1, T, T]) and the keys of steps 1..j at position i only, exactly what the
    drafting chain rooted at i sees when decoding."""
    groups = q.shape[1] // k0.shape[1]
    k0, v0 = k0.repeat_interleave(groups, 1), v0.repeat_interleave(groups, 1)
    scale = q.shape[-1] ** -0.5
    scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~mask0, float("-inf"))
    diag_keys = [k.repeat_interleave(groups, 1) for k in diag_keys]
    diag_values = [v.repeat_interleave(groups, 1) for v in diag_values]
    diag = [(q * k).sum(-1, keepdim=True) * scale for k in diag_keys]
    weights = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    length = k0.shape[2]
    out = weights[..., :length] @ v0
    for s, v in enumerate(diag_values):
        out = out + weights[..., length + s, None] * v
    return out


def ttt_forward(
    draft: Eagle3Draft, target_features, token_ids, positions, key_mask, steps: int
) -> list[torch.Tensor]:
    """Unroll the draft `steps` times over whole sequences, as decoding would (teacher-forced tokens).

    target_features [B, T, n_aux·H] at positions 0..T−1, token_ids [B, T + steps] the sequence (the token
    after position i is token_ids[:, i + 1]), key_mask [B, T] real (not padding) positions.
    Returns the draft's hidden states per step, [B, T, H] each: step j at position i predicts the token
    at i + 2 + j, from the target's features up to i and the draft's own steps beyond.
    """
    length = target_features.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=token_ids.device).tril()
    mask0 = (causal & key_mask[:, None, :])[:, None]
    features = draft.fuse(target_features)
    k0 = v0 = None
    diag_keys, diag_values, outputs = [], [], []

    def attend(q, k, v):  # called once per step: step 0's keys are the sequence's, later ones diagonal
        nonlocal k0, v0
        if k0 is None:
            k0, v0 = k, v
            return ttt_attention(q, k0, v0, [], [], mask0)
        diag_keys.append(k)
        diag_values.append(v)
        return ttt_attention(q, k0, v0, diag_keys, diag_values, mask0)

    for step in range(steps):
        features = draft.layer(features, token_ids[:, 1 + step : 1 + step + length], positions + step, attend)
        outputs.append(features)
    return outputs


@torch.no_grad()
def target_pass(target, batch, aux_layer_ids, autocast: bool):
    """The target's aux features [B, T, n_aux·H] and final hidden states [B, T, H] (normed)."""
    with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = target.model(
            input_ids=batch["ids"], attention_mask=batch["real"].long(), output_hidden_states=True
        )
    return target_features(out.hidden_states, aux_layer_ids).float(), out.last_hidden_state.float()


def unroll(draft: Eagle3Draft, features, batch, steps: int, autocast: bool):
    """The draft's hidden states per TTT step, on positions 0..T − steps − 1 (token inputs stay in range)."""
    length = batch["ids"].shape[1] - steps
    positions = torch.arange(length, device=features.device).expand(len(features), -1)
    with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=autocast):
        return ttt_forward(
            draft, features[:, :length], batch["ids"], positions, batch["real"][:, :length], steps
        )


def label_rows(batch, steps: int, length: int):
    """For each TTT step: the mask of roots i whose label (the token at i + 2 + step, i.e. the target's
    distribution at i + 1 + step) is a response token, and where that label sits among all such positions."""
    predicts = batch["predicts_response"]
    row_of = predicts.flatten().long().cumsum(0).view_as(predicts) - 1
    out = []
    for step in range(steps):
        label_pos = slice(1 + step, 1 + step + length)
        mask = predicts[:, label_pos]
        out.append((mask, row_of[:, label_pos][mask]))
    return out


def ttt_loss(draft: Eagle3Draft, target, batch, config: DraftTrainConfig):
    """Weighted forward KL over the TTT steps, and the per-step mean KL (for logging)."""
    features, final = target_pass(target, batch, draft.aux_layer_ids, config.bf16)
    outputs = unroll(draft, features, batch, config.ttt_steps, config.bf16)
    with torch.autocast(final.device.type, dtype=torch.bfloat16, enabled=config.bf16), torch.no_grad():
        # the target's LM-head rows of the draft vocabulary are the draft's (frozen) lm_head
        target_logp = torch.log_softmax(draft.lm_head(final[batch["predicts_response"]]).float(), dim=-1)
    total, per_step = 0.0, []
    for step, (hidden, (mask, rows)) in enumerate(
        zip(outputs, label_rows(batch, config.ttt_steps, outputs[0].shape[1]))
    ):
        with torch.autocast(final.device.type, dtype=torch.bfloat16, enabled=config.bf16):
            draft_logp = torch.log_softmax(draft.draft_logits(hidden[mask]).float(), dim=-1)
        labels = target_logp[rows]
        step_loss = (labels.exp() * (labels - draft_logp)).sum(-1).mean() if len(rows) else hidden.sum() * 0
        per_step.append(step_loss.item())
        total = total + config.step_decay**step * step_loss
    return total, per_step
