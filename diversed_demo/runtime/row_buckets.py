"""Dense products over a prompt's rows, padded to a few row counts: those of the layers this runtime swaps
in (a GGUF layer's, an 8-bit draft layer's and the static draft step's dense path); a plain nn.Linear
multiplies as it is.

On a CPU PyTorch multiplies bf16 and fp16 through oneDNN, which builds (JIT-compiles) a product's kernel
the first time it meets a shape and keeps it for later calls of that shape. Decoding's products repeat
their few shapes, but every prompt has a row count of its own, so a prompt's products paid that build
anew: on the Xeon with AMX 0.6–5 ms a weight shape (64 to 700 rows), and the draft's one-layer feed of a
600–650-row prompt took 19–27 ms at a new length against 10–13 at one met before
(docs/measurements/speed.md). Padded to a bucket, a new prompt meets kernels an earlier one built: the
buckets step by 16 rows up to 256, then by a sixteenth of the power of two above, so the padding's zero
rows add under 16 rows, or under a sixteenth of that power of two, and a process meets at most 39 row
counts from 17 to 2,048 rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.config import PASS_ROWS

SMALLEST_STEP = 16


def bucket(rows: int) -> int:
    """The row count a product of `rows` rows is padded to."""
    if rows <= PASS_ROWS:  # decoding's products (a chain's step, a tree's): their shapes repeat as they are
        return rows
    step = max(SMALLEST_STEP, 1 << ((rows - 1).bit_length() - 4))  # 1/16 of the power of two above
    return -(-rows // step) * step


def linear_in_buckets(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(input, weight, bias), its rows padded to `bucket` where oneDNN serves (bf16 or fp16 on a
    CPU, no gradient asked for)."""
    rows = input.reshape(-1, input.shape[-1])
    padded = bucket(len(rows))
    on_onednn = input.device.type == "cpu" and input.dtype in (torch.bfloat16, torch.float16)
    if padded == len(rows) or not on_onednn or torch.is_grad_enabled():
        return F.linear(input, weight, bias)
    out = F.linear(F.pad(rows, (0, 0, 0, padded - len(rows))), weight, bias)[: len(rows)]
    return out.view(*input.shape[:-1], weight.shape[0])
