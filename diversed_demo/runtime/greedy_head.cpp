// A greedy head's weight w_t in one call (core/head.py: EnsembleHead with the p/q terms, greedy form):
// per drafted row, the rule's terms from p and q (cost_rule.greedy_position_costs, then head.pq_terms) and
// the head's MLP over [LN(h_target; h_draft); terms]. As PyTorch operations the same work is about 26
// small calls, each paying its dispatch and its cold caches after the target's pass
// (docs/measurements/speed.md, "Where a step's time goes"). Here the two argmaxes over the vocabulary take
// ATen's vectorised `amax` over blocks, then scan one block; the first layer is one BLAS product; the rest
// is a few loops a row.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace {

constexpr float TINY = 1e-30f;  // cost_rule.TINY: a token with p = 0 costs about 69 nats
constexpr float SQRT_HALF = 0.70710678118654752f;

constexpr int64_t BLOCK = 1024;  // argmax in two steps: each block's max (ATen's fast amax), then one block

// The first index of each row's maximum of x [n, V] float (torch.max's choice): the blocks' maxima by `amax`,
// vectorised and four times faster than `max` with indices here, then the first block holding the row's
// maximum scanned. Returns (maximum, index) per row.
std::vector<std::pair<float, int64_t>> first_argmax(const at::Tensor& x) {
  const int64_t n = x.size(0), vocab = x.size(1), blocks = vocab / BLOCK;
  const float* data = x.data_ptr<float>();
  at::Tensor maxima;
  if (blocks) maxima = at::amax(x.narrow(1, 0, blocks * BLOCK).view({n, blocks, BLOCK}), 2).contiguous();
  const float* block_max = blocks ? maxima.data_ptr<float>() : nullptr;
  std::vector<std::pair<float, int64_t>> found(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = data + i * vocab;
    float best = -INFINITY;
    for (int64_t b = 0; b < blocks; ++b) best = std::max(best, block_max[i * blocks + b]);
    for (int64_t k = blocks * BLOCK; k < vocab; ++k) best = std::max(best, row[k]);
    int64_t start = blocks * BLOCK;  // the tail, unless a block holds the maximum
    for (int64_t b = 0; b < blocks; ++b) {
      if (block_max[i * blocks + b] == best) {
        start = b * BLOCK;
        break;
      }
    }
    int64_t k = start;
    while (k < vocab - 1 && row[k] != best) ++k;
    found[i] = {best, k};
  }
  return found;
}

// One row's features: [LN(h_target; h_draft); asinh(CE − H), TV, asinh(H(p))] in greedy form, into `out`.
void row_features(const float* hidden, int64_t width, float best, float drafted, bool differ, float eps,
                  float* out) {
  double sum = 0, squares = 0;
  for (int64_t k = 0; k < width; ++k) sum += hidden[k];
  const float mean = static_cast<float>(sum / width);
  for (int64_t k = 0; k < width; ++k) squares += (hidden[k] - mean) * (hidden[k] - mean);
  const float scale = 1.0f / std::sqrt(static_cast<float>(squares / width) + eps);
  for (int64_t k = 0; k < width; ++k) out[k] = (hidden[k] - mean) * scale;
  const float log_best = std::log(std::max(best, TINY));
  out[width] = std::asinh(log_best - std::log(std::max(drafted, TINY)));
  out[width + 1] = differ ? 1.0f : 0.0f;
  out[width + 2] = std::asinh(-log_best);
}

// The MLP's last layer on its first's outputs z [units]: exact GELU, the dot with w2, w_min + (1 − w_min)·σ.
float row_weight(const float* z, const float* w2, int64_t units, float b2, float w_min) {
  float logit = b2;
  for (int64_t j = 0; j < units; ++j) logit += w2[j] * 0.5f * z[j] * (1.0f + std::erf(z[j] * SQRT_HALF));
  return w_min + (1.0f - w_min) / (1.0f + std::exp(-logit));
}

// p, q [n, V] float; the hidden states [n, Ht], [n, Hd] (any float dtype); w1 [units, Ht + Hd + 3], b1 and
// w2 [units] float -> w [n] float.
at::Tensor greedy_weights(const at::Tensor& p, const at::Tensor& q, const at::Tensor& target_hidden,
                          const at::Tensor& draft_hidden, const at::Tensor& w1, const at::Tensor& b1,
                          const at::Tensor& w2, double b2, double w_min, double eps) {
  TORCH_CHECK(p.scalar_type() == at::kFloat && q.scalar_type() == at::kFloat, "p and q must be float32");
  TORCH_CHECK(p.dim() == 2 && p.sizes() == q.sizes() && p.size(1) > 0, "p and q must be [n, V] alike");
  TORCH_CHECK(target_hidden.size(0) == p.size(0) && draft_hidden.size(0) == p.size(0),
              "one row of hidden states a row of p");
  TORCH_CHECK(w1.scalar_type() == at::kFloat && b1.scalar_type() == at::kFloat &&
                  w2.scalar_type() == at::kFloat && w1.dim() == 2 && b1.numel() == w1.size(0) &&
                  w2.numel() == w1.size(0),
              "the MLP's weights must be float32, w1 [units, features], b1 and w2 [units]");
  const auto pc = p.contiguous(), w2c = w2.contiguous();
  const auto target = first_argmax(pc), draft = first_argmax(q.contiguous());
  const auto hidden = at::cat({target_hidden, draft_hidden}, 1).to(at::kFloat).contiguous();
  const int64_t n = p.size(0), vocab = p.size(1), width = hidden.size(1), units = w1.size(0);
  TORCH_CHECK(w1.size(1) == width + 3, "w1 must read the hidden states and the 3 terms");
  auto features = at::empty({n, width + 3}, p.options());
  const float* probs = pc.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {  // a few rows: threads would cost more than they share
    const int64_t drafted = draft[i].second;
    row_features(hidden.data_ptr<float>() + i * width, width, target[i].first, probs[i * vocab + drafted],
                 target[i].second != drafted, static_cast<float>(eps),
                 features.data_ptr<float>() + i * (width + 3));
  }
  const auto z = at::addmm(b1, features, w1.t()).contiguous();  // the first layer: BLAS, vectorised
  auto out = at::empty({n}, p.options());
  for (int64_t i = 0; i < n; ++i) {
    out.data_ptr<float>()[i] = row_weight(z.data_ptr<float>() + i * units, w2c.data_ptr<float>(), units,
                                          static_cast<float>(b2), static_cast<float>(w_min));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed_head, m) {
  m.def(
      "greedy_weights(Tensor p, Tensor q, Tensor target_hidden, Tensor draft_hidden, Tensor w1, Tensor b1, "
      "Tensor w2, float b2, float w_min, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(diversed_head, CPU, m) { m.impl("greedy_weights", &greedy_weights); }
