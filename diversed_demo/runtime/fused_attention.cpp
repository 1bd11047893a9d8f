// Attention for a decode's few query rows over a bf16 KV cache, on AVX-512 (BF16) or AVX2 (FMA): one row's
// result is the same bits whatever rows stand beside it, and whatever masked slots lie between the slots it
// sees.
//
// Each row's visible slots, in slot order, are its sequence: the j-th slot it sees is its position j. Every
// sum runs over positions in a fixed way (a score over D in the lanes of the vector products, reduced by one
// tree; the weights and the weighted values lane by lane in position order), so a verification row, a tree
// node and a one-token pass over the same sequence give the same bits. The positions every row of a kv head
// shares (the verified cache) are read once for all its rows; the few after them row by row.
//
// The instruction set is chosen when the library is compiled (fused_attention.py passes its flags): 16 lanes
// and dpbf16 on AVX-512 with BF16, 8 lanes and float32 FMAs on AVX2. The two give different last bits; each
// is row-invariant on its own.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// Cephes' exp polynomial on [-ln2/2, ln2/2], scaled by 2^n; below TINY (and at -inf) exactly 0.
constexpr float TINY = -87.3f, LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#if defined(__AVX512BF16__)
constexpr int LANES = 16;
constexpr int TILE = 6;  // query rows that share each key and value read: 6·4 accumulators at D = 64
using Vec = __m512;
template <int D>
struct Operand {  // a query row or a key, as the score's products take it: bf16 pairs
  static constexpr int CHUNKS = D / 32;
  __m512bh c[CHUNKS];
  void load(const uint16_t* x) {
    for (int i = 0; i < CHUNKS; ++i) c[i] = (__m512bh)_mm512_loadu_si512(x + 32 * i);
  }
};
template <int D>
inline Vec dot_lanes(const Operand<D>& q, const Operand<D>& key) {
  Vec acc = _mm512_setzero_ps();
  for (int i = 0; i < Operand<D>::CHUNKS; ++i) acc = _mm512_dpbf16_ps(acc, q.c[i], key.c[i]);
  return acc;
}
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec load(const float* x) { return _mm512_loadu_ps(x); }
inline void store(float* x, Vec v) { _mm512_storeu_ps(x, v); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
inline float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec first_lanes(int64_t n, Vec v, float fill) {  // lanes 0..n-1 of v, the others fill
  return _mm512_mask_blend_ps(__mmask16((1u << n) - 1u), _mm512_set1_ps(fill), v);
}
inline Vec exp_lanes(Vec x) {
  const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(TINY), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(TINY));
  const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), 0);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
  Vec p = _mm512_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(~zero, _mm512_scalef_ps(p, n));
}
inline Vec load_bf16(const uint16_t* x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)x)), 16));
}
inline void store_bf16(uint16_t* x, Vec v) { _mm256_storeu_si256((__m256i*)x, (__m256i)_mm512_cvtneps_pbh(v)); }

// Half the lanes of x's and y's partial sums added: lane i of the result takes lanes lo[i] + hi[i] of (x, y).
inline Vec halve(Vec x, Vec y, __m512i lo, __m512i hi) {
  return _mm512_add_ps(_mm512_permutex2var_ps(x, lo, y), _mm512_permutex2var_ps(x, hi, y));
}

// Lane i of the result: the sum of the 16 lanes of the i-th vector at x, by one tree (halves, quarters, ...).
inline Vec reduce_rows(const float* x) {
  Vec v[LANES];
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

#elif defined(__AVX2__) && defined(__FMA__)
constexpr int LANES = 8;
constexpr int TILE = 2;  // fewer registers than AVX-512: 2·8 accumulators at D = 64
using Vec = __m256;
inline Vec load_bf16(const uint16_t* x) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)x)), 16));
}
template <int D>
struct Operand {  // a query row or a key, as the score's products take it: float32
  static constexpr int CHUNKS = D / 8;
  __m256 c[CHUNKS];
  void load(const uint16_t* x) {
    for (int i = 0; i < CHUNKS; ++i) c[i] = load_bf16(x + 8 * i);
  }
};
template <int D>
inline Vec dot_lanes(const Operand<D>& q, const Operand<D>& key) {
  Vec acc = _mm256_setzero_ps();
  for (int i = 0; i < Operand<D>::CHUNKS; ++i) acc = _mm256_fmadd_ps(q.c[i], key.c[i], acc);
  return acc;
}
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec set1(float x) { return _mm256_set1_ps(x); }
inline Vec load(const float* x) { return _mm256_loadu_ps(x); }
inline void store(float* x, Vec v) { _mm256_storeu_ps(x, v); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline __m128 halves(Vec v, bool is_max) {  // the two 128-bit halves combined, then 4 lanes -> 1 by a tree
  __m128 x = is_max ? _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
                    : _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_movehl_ps(x, x);
  x = is_max ? _mm_max_ps(x, y) : _mm_add_ps(x, y);
  const __m128 z = _mm_shuffle_ps(x, x, 1);
  return is_max ? _mm_max_ss(x, z) : _mm_add_ss(x, z);
}
inline float reduce_max(Vec v) { return _mm_cvtss_f32(halves(v, true)); }
inline float reduce_add(Vec v) { return _mm_cvtss_f32(halves(v, false)); }
inline Vec first_lanes(int64_t n, Vec v, float fill) {  // lanes 0..n-1 of v, the others fill
  const __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_blendv_ps(_mm256_set1_ps(fill), v, _mm256_castsi256_ps(inside));
}
inline Vec exp_lanes(Vec x) {
  const Vec zero = _mm256_cmp_ps(x, _mm256_set1_ps(TINY), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(TINY));
  const Vec n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
  Vec p = _mm256_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n as a float's exponent bits: n >= -126 here (x >= TINY, x <= 0), a normal number
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
}
inline void store_bf16(uint16_t* x, Vec v) {  // rounded to nearest, ties to even, as PyTorch's conversion
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i high = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
  _mm_storeu_si128((__m128i*)x, _mm256_castsi256_si128(packed));
}

// Lane i of the result: the sum of the 8 lanes of the i-th vector at x, by one tree (pairs, quads, halves).
inline Vec reduce_rows(const float* x) {
  Vec v[LANES];
  for (int i = 0; i < LANES; ++i) v[i] = _mm256_loadu_ps(x + i * LANES);
  const Vec a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const Vec b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

#else
#error "fused_attention.cpp needs AVX-512 with BF16, or AVX2 with FMA"
#endif

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

// The rows' scores, LANES positions at a time: each a dot over D in the lanes of the products, reduced by
// one tree; then the weights exp(score − the row's best); returns nothing, leaves each row's weights' sum in
// `totals`.
template <int T, int D>
void weights(const Unit& u, float* totals) {
  const int64_t width = u.blocks * LANES;
  Operand<D> q[T];
  for (int r = 0; r < T; ++r) q[r].load(u.q + r * D);
  for (int64_t b = 0; b < u.blocks; ++b) {
    const int64_t first = b * LANES;
    for (int i = 0; i < LANES; ++i) {
      if (first + LANES <= u.rows.shared) {  // every row's position is the same slot: its key read once
        Operand<D> key;
        key.load(u.K + (first + i) * D);
        for (int r = 0; r < T; ++r) store(u.lanes + (r * LANES + i) * LANES, dot_lanes(q[r], key));
      } else {
        for (int r = 0; r < T; ++r) {
          const int64_t slot = slot_of(u.rows, (u.r0 + r) / u.group, first + i);
          Operand<D> key;
          if (slot >= 0) key.load(u.K + slot * D);
          store(u.lanes + (r * LANES + i) * LANES, slot >= 0 ? dot_lanes(q[r], key) : zero());
        }
      }
    }
    for (int r = 0; r < T; ++r) {  // positions past the row's last: -inf
      const int64_t seen = std::clamp<int64_t>(u.rows.count[(u.r0 + r) / u.group] - first, 0, LANES);
      const Vec score = mul(reduce_rows(u.lanes + r * LANES * LANES), set1(u.scale));
      store(u.scores + r * width + first, first_lanes(seen, score, -INFINITY));
    }
  }
  for (int r = 0; r < T; ++r) {  // summed lane by lane in position order: masked positions add exact zeros
    float* row = u.scores + r * width;
    Vec top = set1(-INFINITY);
    for (int64_t b = 0; b < u.blocks; ++b) top = max(top, load(row + b * LANES));
    const Vec best = set1(reduce_max(top));
    Vec total = zero();
    for (int64_t b = 0; b < u.blocks; ++b) {
      const Vec w = exp_lanes(sub(load(row + b * LANES), best));
      store(row + b * LANES, w);
      total = add(total, w);
    }
    totals[r] = reduce_add(total);
  }
}

// The rows' weighted values over their positions in order (the shared ones for all rows at once, then each
// row's own), divided by their weights' sums, written as bf16.
template <int T, int D>
void weigh(const Unit& u, const float* totals) {
  constexpr int VECS = D / LANES;
  const int64_t width = u.blocks * LANES;
  Vec acc[T][VECS];
  for (int r = 0; r < T; ++r)
    for (int v = 0; v < VECS; ++v) acc[r][v] = zero();
  for (int64_t p = 0; p < u.rows.shared; ++p) {
    Vec value[VECS];
    for (int v = 0; v < VECS; ++v) value[v] = load_bf16(u.V + p * D + v * LANES);
    for (int r = 0; r < T; ++r) {
      const Vec w = set1(u.scores[r * width + p]);
      for (int v = 0; v < VECS; ++v) acc[r][v] = fmadd(w, value[v], acc[r][v]);
    }
  }
  for (int r = 0; r < T; ++r) {
    const int64_t t = (u.r0 + r) / u.group;
    for (int64_t p = u.rows.shared; p < u.rows.count[t]; ++p) {
      const uint16_t* value = u.V + slot_of(u.rows, t, p) * D;
      const Vec w = set1(u.scores[r * width + p]);
      for (int v = 0; v < VECS; ++v) acc[r][v] = fmadd(w, load_bf16(value + v * LANES), acc[r][v]);
    }
    const Vec inverse = set1(1.0f / totals[r]);
    for (int v = 0; v < VECS; ++v) store_bf16(u.outs[u.r0 + r] + v * LANES, mul(acc[r][v], inverse));
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
  switch (std::min<int64_t>(T, TILE)) {
    case 1: return attend_unit<1, D>(u);
    case 2: return attend_unit<std::min(2, TILE), D>(u);
    case 3: return attend_unit<std::min(3, TILE), D>(u);
    case 4: return attend_unit<std::min(4, TILE), D>(u);
    case 5: return attend_unit<std::min(5, TILE), D>(u);
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
