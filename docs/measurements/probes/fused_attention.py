"""Probe (docs/measurements/speed.md, "Draft trees"): a fused attention loop against `attend_in_blocks`, one
layer's attention over 320 cached slots at 1–8 query tokens, and whether its rows are invariant.

Each kv head's query rows read each visible slot's key and value once; a row's output sums the slots it
sees in slot order, so it depends neither on the other rows nor on masked slots between its own (a tree's).
Scalar exp and dot products: the next version wants ATen's vectorised ones (at::vec).

    python docs/measurements/probes/fused_attention.py
"""

import time

import torch
from torch.utils.cpp_extension import load_inline

from diversed_demo.runtime.block_attention import attend_in_blocks, feed_rows, mask_bias

torch.set_num_threads(2)
src = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
// One kv head at a time: its R = k * group query rows read each visible slot's key and value once. A row's
// score is a dot over D, its output a sum over the slots it sees, in slot order: nothing depends on R.
torch::Tensor fused(torch::Tensor query, torch::Tensor keys, torch::Tensor values, torch::Tensor visible) {
  const int64_t k = query.size(0), n_q = query.size(1), D = query.size(2);
  const int64_t n_kv = keys.size(0), W = visible.size(1);
  const int64_t group = n_q / n_kv, S = keys.size(1), R = k * group;
  auto q = query.contiguous(), K = keys.contiguous(), V = values.contiguous();
  auto vis = visible.contiguous();
  auto out = torch::empty({k, n_q * D}, torch::kFloat);
  const at::BFloat16* qp = q.data_ptr<at::BFloat16>(); const at::BFloat16* kp = K.data_ptr<at::BFloat16>();
  const at::BFloat16* vp = V.data_ptr<at::BFloat16>();
  const bool* mp = vis.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt((float)D);
  at::parallel_for(0, n_kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(R * D), scores(R * W), acc(R * D), total(R), best(R), kf(D), vf(D);
    for (int64_t kv = begin; kv < end; ++kv) {
      for (int64_t r = 0; r < R; ++r) {
        const int64_t t = r / group, h = kv * group + r % group;
        for (int64_t d = 0; d < D; ++d) qf[r * D + d] = (float)qp[(t * n_q + h) * D + d] * scale;
        best[r] = -INFINITY; total[r] = 0.f;
        for (int64_t d = 0; d < D; ++d) acc[r * D + d] = 0.f;
      }
      for (int64_t s = 0; s < W; ++s) {
        const at::BFloat16* kr = kp + (kv * S + s) * D;
        for (int64_t d = 0; d < D; ++d) kf[d] = (float)kr[d];
        for (int64_t r = 0; r < R; ++r) {
          if (!mp[(r / group) * W + s]) continue;
          float dot = 0.f;
          for (int64_t d = 0; d < D; ++d) dot += qf[r * D + d] * kf[d];
          scores[r * W + s] = dot; best[r] = dot > best[r] ? dot : best[r];
        }
      }
      for (int64_t s = 0; s < W; ++s) {
        const at::BFloat16* vr = vp + (kv * S + s) * D;
        for (int64_t d = 0; d < D; ++d) vf[d] = (float)vr[d];
        for (int64_t r = 0; r < R; ++r) {
          if (!mp[(r / group) * W + s]) continue;
          const float w = std::exp(scores[r * W + s] - best[r]);
          float* a = acc.data() + r * D;
          for (int64_t d = 0; d < D; ++d) a[d] += w * vf[d];
          total[r] += w;
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t t = r / group, h = kv * group + r % group;
        for (int64_t d = 0; d < D; ++d) op[(t * n_q + h) * D + d] = acc[r * D + d] / total[r];
      }
    }
  });
  return out.to(torch::kBFloat16);
}
"""
mod = load_inline(
    "fa_probe2",
    cpp_sources=src,
    functions=["fused"],
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only"],
    verbose=False,
)
W = 320
keys = torch.randn(3, 2048, 64).bfloat16()
values = torch.randn(3, 2048, 64).bfloat16()


def timed(f, *a):
    for _ in range(20):
        f(*a)
    s = time.perf_counter()
    for _ in range(300):
        f(*a)
    return (time.perf_counter() - s) / 300 * 1e6


for k in (1, 2, 4, 8):
    q = torch.randn(k, 9, 64).bfloat16()
    _, mask = feed_rows(W - k, W)
    bias = mask_bias(mask, 3)
    print(
        k,
        f"blocks {timed(attend_in_blocks, q, keys, values, bias):.1f} us, "
        f"fused {timed(mod.fused, q, keys, values, mask):.1f} us",
    )
# row invariance and accuracy
q = torch.randn(8, 9, 64).bfloat16()
_, mask = feed_rows(W - 8, W)
full = mod.fused(q, keys, values, mask)
same = all(
    torch.equal(mod.fused(q[j : j + 1], keys, values, mask[j : j + 1]), full[j : j + 1]) for j in range(8)
)
ref = (
    torch.softmax(
        (q.float().view(8, 3, 3, 64).transpose(0, 1) @ keys[:, :W].float().transpose(-1, -2)[:, None])
        .div(8)
        .masked_fill(~mask[None, :, None], float("-inf")),
        -1,
    )
    @ values[:, :W].float()[:, None]
)
ref = ref.transpose(0, 1).reshape(8, 576)
print(
    "rows invariant:",
    same,
    "max err vs fp32",
    (full.float() - ref).abs().max().item(),
    "blocks err",
    (attend_in_blocks(q, keys, values, mask_bias(mask, 3)).float() - ref).abs().max().item(),
)
