// Attention for a decode's few query rows over a bf16 KV cache, on AVX-512 (BF16): one row's result is the
// same bits whatever rows stand beside it, and whatever masked slots lie between the slots it sees.
//
// Each row's visible slots, in slot order, are its sequence: the j-th slot it sees is its position j. Every
// sum runs over positions in a fixed way (a score over D in the lanes of two dpbf16, reduced by one tree;
// the weights and the weighted values lane by lane in position order), so a verification row, a tree node
// and a one-token pass over the same sequence give the same bits. The positions every row of a kv head
// shares (the verified cache) are read once for all its rows; the few after them row by row.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int LANES = 16;

// exp over 16 lanes (Cephes' polynomial on [-ln2/2, ln2/2], scaled by 2^n); exp(-inf) and anything below
// the float range are exactly 0, so a masked position adds exact zeros.
inline __m512 exp16(__m512 x) {
  const __m512 tiny = _mm512_set1_ps(-87.3f);
  const __mmask16 zero = _mm512_cmp_ps_mask(x, tiny, _CMP_LT_OQ);
  x = _mm512_max_ps(x, tiny);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), 0);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(~zero, _mm512_scalef_ps(p, n));
}

// Half the lanes of x's and y's partial sums added: lane i of the result takes lanes lo[i] + hi[i] of (x, y).
inline __m512 halve(__m512 x, __m512 y, __m512i lo, __m512i hi) {
  return _mm512_add_ps(_mm512_permutex2var_ps(x, lo, y), _mm512_permutex2var_ps(x, hi, y));
}

// Lane i of the result: the sum of the 16 lanes of the i-th vector at x, by one tree (halves, quarters, ...).
inline __m512 reduce16(const float* x) {
  __m512 v[LANES];
  for (int i = 0; i < LANES; ++i) v[i] = _mm512_loadu_ps(x + i * LANES);
  const __m512i lo[4] = {_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
                         _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
                         _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
                         _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)};
  const __m512i hi[4] = {_mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31),
                         _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31),
                         _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31),
                         _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)};
  for (int level = 0, n = LANES; level < 4; ++level, n /= 2)  // 16 vectors -> 8 -> 4 -> 2 -> 1
    for (int m = 0; m < n / 2; ++m) v[m] = halve(v[2 * m], v[2 * m + 1], lo[level], hi[level]);
  return v[0];
}

inline __m512 bf16_to_f32(const uint16_t* x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)x)), 16));
}

struct Rows {  // the query rows of one kv head: what each sees
  std::vector<int64_t> count;                // positions each row sees
  std::vector<std::vector<int64_t>> tail;    // its slots after the shared ones
  int64_t shared = 0;                        // positions 0..shared-1 are slots 0..shared-1 for every row
};

Rows visible_rows(const bool* mask, int64_t k, int64_t W) {
  Rows rows;
  rows.shared = W;
  for (int64_t t = 0; t < k; ++t) {
    int64_t first_unseen = 0;
    while (first_unseen < W && mask[t * W + first_unseen]) ++first_unseen;
    rows.shared = std::min(rows.shared, first_unseen);
  }
  rows.count.resize(k);
  rows.tail.resize(k);
  for (int64_t t = 0; t < k; ++t) {
    for (int64_t s = rows.shared; s < W; ++s)
      if (mask[t * W + s]) rows.tail[t].push_back(s);
    rows.count[t] = rows.shared + int64_t(rows.tail[t].size());
  }
  return rows;
}

constexpr int TILE = 6;  // query rows that share each key and value read: 6·4 accumulators at D = 64

struct Unit {  // one kv head's query rows r0..r0+T-1 (row r: token r / group, query head h·group + r % group)
  const uint16_t* q;  // [T, D] bf16
  const uint16_t* K;
  const uint16_t* V;
  const Rows& rows;
  int64_t r0, group, blocks;
  float scale;
  float* scores;  // [T, blocks·16]: the scores, then the weights
  float* lanes;   // [T, 16, 16]
  uint16_t* const* outs;  // each row's output [D]
};

inline int64_t slot_of(const Rows& rows, int64_t t, int64_t p) {  // the slot at row t's position p, or -1
  return p < rows.shared ? p : p < rows.count[t] ? rows.tail[t][p - rows.shared] : -1;
}

// The rows' scores, 16 positions at a time: each a dot over D in the lanes of dpbf16, reduced by one tree;
// then the weights exp(score − the row's best); returns nothing, leaves each row's weights' sum in `totals`.
template <int T, int D>
void weights(const Unit& u, float* totals) {
  constexpr int CHUNKS = D / 32;
  const int64_t width = u.blocks * LANES;
  __m512bh q[T][CHUNKS];
  for (int r = 0; r < T; ++r)
    for (int c = 0; c < CHUNKS; ++c) q[r][c] = (__m512bh)_mm512_loadu_si512(u.q + r * D + 32 * c);
  for (int64_t b = 0; b < u.blocks; ++b) {
    const int64_t first = b * LANES;
    for (int i = 0; i < LANES; ++i) {
      if (first + LANES <= u.rows.shared) {  // every row's position is the same slot: its key read once
        __m512bh key[CHUNKS];
        for (int c = 0; c < CHUNKS; ++c) key[c] = (__m512bh)_mm512_loadu_si512(u.K + (first + i) * D + 32 * c);
        for (int r = 0; r < T; ++r) {
          __m512 acc = _mm512_setzero_ps();
          for (int c = 0; c < CHUNKS; ++c) acc = _mm512_dpbf16_ps(acc, q[r][c], key[c]);
          _mm512_storeu_ps(u.lanes + (r * LANES + i) * LANES, acc);
        }
      } else {
        for (int r = 0; r < T; ++r) {
          const int64_t slot = slot_of(u.rows, (u.r0 + r) / u.group, first + i);
          __m512 acc = _mm512_setzero_ps();
          for (int c = 0; c < CHUNKS && slot >= 0; ++c)
            acc = _mm512_dpbf16_ps(acc, q[r][c], (__m512bh)_mm512_loadu_si512(u.K + slot * D + 32 * c));
          _mm512_storeu_ps(u.lanes + (r * LANES + i) * LANES, acc);
        }
      }
    }
    for (int r = 0; r < T; ++r) {  // positions past the row's last: -inf
      const int64_t seen = std::clamp<int64_t>(u.rows.count[(u.r0 + r) / u.group] - first, 0, LANES);
      const __m512 score = _mm512_mul_ps(reduce16(u.lanes + r * LANES * LANES), _mm512_set1_ps(u.scale));
      const __mmask16 inside = __mmask16((1u << seen) - 1u);
      _mm512_storeu_ps(u.scores + r * width + first, _mm512_mask_blend_ps(inside, _mm512_set1_ps(-INFINITY), score));
    }
  }
  for (int r = 0; r < T; ++r) {  // summed lane by lane in position order: masked positions add exact zeros
    float* row = u.scores + r * width;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t b = 0; b < u.blocks; ++b) top = _mm512_max_ps(top, _mm512_loadu_ps(row + b * LANES));
    const float best = _mm512_reduce_max_ps(top);
    __m512 total = _mm512_setzero_ps();
    for (int64_t b = 0; b < u.blocks; ++b) {
      const __m512 w = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + b * LANES), _mm512_set1_ps(best)));
      _mm512_storeu_ps(row + b * LANES, w);
      total = _mm512_add_ps(total, w);
    }
    totals[r] = _mm512_reduce_add_ps(total);
  }
}

// The rows' weighted values over their positions in order (the shared ones for all rows at once, then each
// row's own), divided by their weights' sums, written as bf16.
template <int T, int D>
void weigh(const Unit& u, const float* totals) {
  constexpr int VECS = D / LANES;
  const int64_t width = u.blocks * LANES;
  __m512 acc[T][VECS];
  for (int r = 0; r < T; ++r)
    for (int v = 0; v < VECS; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < u.rows.shared; ++p) {
    __m512 value[VECS];
    for (int v = 0; v < VECS; ++v) value[v] = bf16_to_f32(u.V + p * D + v * LANES);
    for (int r = 0; r < T; ++r) {
      const __m512 w = _mm512_set1_ps(u.scores[r * width + p]);
      for (int v = 0; v < VECS; ++v) acc[r][v] = _mm512_fmadd_ps(w, value[v], acc[r][v]);
    }
  }
  for (int r = 0; r < T; ++r) {
    const int64_t t = (u.r0 + r) / u.group;
    for (int64_t p = u.rows.shared; p < u.rows.count[t]; ++p) {
      const uint16_t* value = u.V + slot_of(u.rows, t, p) * D;
      const __m512 w = _mm512_set1_ps(u.scores[r * width + p]);
      for (int v = 0; v < VECS; ++v) acc[r][v] = _mm512_fmadd_ps(w, bf16_to_f32(value + v * LANES), acc[r][v]);
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / totals[r]);
    for (int v = 0; v < VECS; ++v)
      _mm256_storeu_si256((__m256i*)(u.outs[u.r0 + r] + v * LANES),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][v], inverse)));
  }
}

template <int T, int D>
void attend_unit(const Unit& u) {
  float totals[T];
  weights<T, D>(u, totals);
  weigh<T, D>(u, totals);
}

template <int D>
void attend_tile(const Unit& u, int64_t T) {
  switch (T) {
    case 1: return attend_unit<1, D>(u);
    case 2: return attend_unit<2, D>(u);
    case 3: return attend_unit<3, D>(u);
    case 4: return attend_unit<4, D>(u);
    case 5: return attend_unit<5, D>(u);
    default: return attend_unit<TILE, D>(u);
  }
}

}  // namespace

// query [k, n_q, D] bf16 (D = 32, 64 or 128), keys and values [n_kv, ≥ W, D] bf16, mask [k, W] bool (each row
// sees at least one slot) -> [k, n_q·D] bf16: softmax(q·kᵀ/√D) v over the slots each row sees.
at::Tensor fused_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& mask) {
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
              values.scalar_type() == at::kBFloat16 && mask.scalar_type() == at::kBool);
  const int64_t k = query.size(0), n_q = query.size(1), D = query.size(2), n_kv = keys.size(0);
  const int64_t W = mask.size(1), group = n_q / n_kv;
  TORCH_CHECK((D == 32 || D == 64 || D == 128) && n_q % n_kv == 0 && keys.size(1) >= W && mask.size(0) == k);
  TORCH_CHECK(keys.stride(2) == 1 && values.stride(2) == 1 && keys.stride(1) == D && values.stride(1) == D);
  const Rows rows = visible_rows(mask.contiguous().data_ptr<bool>(), k, W);
  const int64_t R = k * group, blocks = (W + LANES - 1) / LANES, tiles = (R + TILE - 1) / TILE;
  // The query rows head by head: [n_kv, R, D], row r of head h being token r / group's head h·group + r % group.
  const auto q = query.reshape({k, n_kv, group, D}).permute({1, 0, 2, 3}).contiguous();
  auto out = at::empty({k, n_q * D}, query.options());
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(keys.data_ptr());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(values.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  std::vector<uint16_t*> outs(n_kv * R);
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t r = 0; r < R; ++r) outs[h * R + r] = op + ((r / group) * n_q + h * group + r % group) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  at::parallel_for(0, n_kv * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(TILE * blocks * LANES), lanes(TILE * LANES * LANES);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t h = unit / tiles, r0 = (unit % tiles) * TILE;
      const Unit u{qp + (h * R + r0) * D, kp + h * keys.stride(0), vp + h * values.stride(0), rows, r0, group,
                   blocks, scale, scores.data(), lanes.data(), outs.data() + h * R};
      const int T = std::min(TILE, int(R - r0));
      if (D == 32) attend_tile<32>(u, T);
      else if (D == 64) attend_tile<64>(u, T);
      else attend_tile<128>(u, T);
    }
  });
  return out;
}

TORCH_LIBRARY(diversed_attention, m) {
  m.def("attend(Tensor query, Tensor keys, Tensor values, Tensor mask) -> Tensor");
}
TORCH_LIBRARY_IMPL(diversed_attention, CPU, m) { m.impl("attend", &fused_attention); }
