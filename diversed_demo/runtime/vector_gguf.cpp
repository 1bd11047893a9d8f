// diversed::amx_mm on AVX2 with FMA, for x86 CPUs with neither AMX nor AVX-512 VNNI: rows [M, K] bf16 times a
// GGUF-quantised weight [N, K] -> [M, N] bf16, on records amx_gguf.py packs for it.
// 4-bit blocks (the target's projections) as llama.cpp multiplies them on AVX2: each row's block of 32 inputs
// becomes 32 int8 codes and one scale (its largest magnitude / 127); `vpmaddubsw` multiplies the weight's
// codes (0..15, unsigned) by the inputs' in pairs into int16 and `vpmaddwd` adds those into int32, exactly:
// 8 output rows a register, 8 instructions a block of 32 inputs, then one conversion to float32
// (acc += d·dx·Σ q·qx + m·dx·Σ qx). Their records are the AVX-512 VNNI kernel's (a block's codes by groups
// of 4 inputs, one 32-bit lane an output row). A row's sums of float32 FMAs cost 2-3x these
// (docs/measurements/speed.md, "Integer products on AVX2").
// 8-bit blocks (a Q8_0 LM head, the draft's blocks) stay on float32 FMAs of the GGUF's own values: their
// signed codes times 8-bit inputs overflow `vpmaddubsw`'s int16 pairs, and the sign trick llama.cpp uses
// costs as many instructions as the FMAs. There the codes become float32 weights d·q, 8 at a time, each
// conversion serving up to ROWS input rows, on the AMX kernel's records (amx_gguf.cpp documents them).
// Every output element sums its inputs the same way whatever M is, so a row's result does not depend on
// the rows beside it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace {

constexpr int Q4_RECORD = 320, Q8_RECORD = 544;
constexpr int SPAN = 8;  // blocks of a group converted and multiplied between two visits of the accumulators

inline void halves(const uint8_t* x, float* out) {  // a record's 16 fp16 values as float32
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)x)));
  _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + 16))));
}

inline float sum_lanes(__m256 v) {  // one fixed tree: the halves, then pairs, then the last two
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

// A block's 32 inputs are 4 chunks of 8 float32 lanes.
constexpr int ROWS = 4;  // input rows a conversion serves: 2·4 accumulators, registers to spare
constexpr int LANES = 8, CHUNKS = 4;
using Acc = __m256;
using Weights = __m256;
using Input = float;  // the rows converted once
inline Acc load(const float* p) { return _mm256_load_ps(p); }
inline Acc zero() { return _mm256_setzero_ps(); }
inline void store(float* p, Acc v) { _mm256_store_ps(p, v); }
inline Acc madd(Weights w, const Input* x, Acc acc) { return _mm256_fmadd_ps(w, _mm256_loadu_ps(x), acc); }
inline float sum(Acc v) { return sum_lanes(v); }

// One output row pair's weights for inputs 8c..8c+7 of a block: rows 2i and 2i+1 of a record.
struct Q8 {
  static constexpr int RECORD = Q8_RECORD;
  static inline Weights row(const uint8_t* record, int j, int c, float d) {  // 8 of row j's signed codes
    const __m128i codes = _mm_loadl_epi64((const __m128i*)(record + 32 * j + 8 * c));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), _mm256_set1_ps(d));
  }
  static inline void weights(const uint8_t* record, int i, int c, const float* d, const float*, Weights& even,
                             Weights& odd) {
    even = row(record, 2 * i, c, d[2 * i]);
    odd = row(record, 2 * i + 1, c, d[2 * i + 1]);
  }
  static inline void scales(const uint8_t* record, float* d, float*) { halves(record + 512, d); }
};

// Output rows 32p..32p+31 for input rows x [R][K]: out[r][n] for those n. The group's records are read in
// order, SPAN blocks at a time (a few KB, in L1): each output row pair converts a block's codes once for the
// R rows and adds them to its accumulators, kept in `lanes` between spans.
template <typename Format, int R>
void output_group(const Input* x, int64_t K, const uint8_t* records, int64_t p, c10::BFloat16* out, int64_t N) {
  const int64_t blocks = K / 32;
  const uint8_t* group = records + p * blocks * 2 * Format::RECORD;
  alignas(64) float lanes[2][8][2][R][LANES];  // half, row pair, even/odd row, input row, lane (set at b0 = 0)
  alignas(64) float d[SPAN][2][16], m[SPAN][2][16];
  for (int64_t b0 = 0; b0 < blocks; b0 += SPAN) {
    const int64_t span = std::min<int64_t>(SPAN, blocks - b0);
    for (int64_t b = 0; b < span; ++b)
      for (int h = 0; h < 2; ++h) Format::scales(group + ((b0 + b) * 2 + h) * Format::RECORD, d[b][h], m[b][h]);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) {
        // the next span on its way, a sixteenth of it at each of the 16 row pairs' visits
        constexpr int LINES = (SPAN * 2 * Format::RECORD + 63) / 64;
        const uint8_t* next = group + (b0 + SPAN) * 2 * Format::RECORD;
        for (int line = (h * 8 + i) * LINES / 16; line < (h * 8 + i + 1) * LINES / 16; ++line)
          _mm_prefetch((const char*)(next + 64 * line), _MM_HINT_T0);
        Acc even[R], odd[R];
        for (int r = 0; r < R; ++r)
          even[r] = b0 ? load(lanes[h][i][0][r]) : zero(), odd[r] = b0 ? load(lanes[h][i][1][r]) : zero();
        for (int64_t b = 0; b < span; ++b) {
          const uint8_t* record = group + ((b0 + b) * 2 + h) * Format::RECORD;
          for (int c = 0; c < CHUNKS; ++c) {
            Weights w_even, w_odd;
            Format::weights(record, i, c, d[b][h], m[b][h], w_even, w_odd);
            for (int r = 0; r < R; ++r) {
              const Input* input = x + r * K + 32 * (b0 + b) + LANES * c;
              even[r] = madd(w_even, input, even[r]);
              odd[r] = madd(w_odd, input, odd[r]);
            }
          }
        }
        for (int r = 0; r < R; ++r) store(lanes[h][i][0][r], even[r]), store(lanes[h][i][1][r], odd[r]);
      }
  }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 8; ++i)
      for (int odd = 0; odd < 2; ++odd)
        for (int r = 0; r < R; ++r)
          out[r * N + 32 * p + 16 * h + 2 * i + odd] = c10::BFloat16(sum(load(lanes[h][i][odd][r])));
}

// ---- 4-bit blocks: integer products of 8-bit inputs ----

struct Codes {  // each row's blocks of 32 inputs as int8 codes, with per block its scale
  std::vector<int8_t> codes;    // [M][K]
  std::vector<float> scale;     // [M][K / 32]: dx
  std::vector<float> weighted;  // [M][K / 32]: dx · Σ qx, which the block's minima multiply
};

inline __m256 bf16_to_float(const c10::BFloat16* x) {  // 8 values
  const __m256i halfwords = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(halfwords, 16));
}

inline float max_lanes(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

Codes quantise(const c10::BFloat16* x, int64_t M, int64_t K) {  // as the AVX-512 VNNI kernel's `quantise`
  const int64_t blocks = M * K / 32;
  Codes rows{std::vector<int8_t>(M * K), std::vector<float>(blocks), std::vector<float>(blocks)};
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < blocks; ++i) {
    __m256 v[4], largest = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c)
      v[c] = bf16_to_float(x + 32 * i + 8 * c), largest = _mm256_max_ps(largest, _mm256_and_ps(v[c], magnitude));
    const float top = max_lanes(largest);
    const __m256 inverse = _mm256_set1_ps(top > 0 ? 127.0f / top : 0.0f);
    alignas(32) int32_t q[32];
    for (int c = 0; c < 4; ++c)  // rounded to nearest even
      _mm256_store_si256((__m256i*)(q + 8 * c), _mm256_cvtps_epi32(_mm256_mul_ps(v[c], inverse)));
    int32_t total = 0;
    for (int k = 0; k < 32; ++k) rows.codes[32 * i + k] = (int8_t)q[k], total += q[k];
    rows.scale[i] = top / 127.0f;
    rows.weighted[i] = rows.scale[i] * (float)total;
  }
  return rows;
}

// Output rows 32p..32p+31 for input rows r0..r0+R-1, a quarter (8 rows of a record) at a time over all the
// group's blocks (the group, 30 KB at K = 1536, stays in L2 between quarters): R accumulators, 8 registers
// of the quarter's codes per block.
template <int R>
void q4_group(const Codes& x, int64_t r0, int64_t K, const uint8_t* group, c10::BFloat16* out, int64_t N,
              int64_t p) {
  const int64_t blocks = K / 32;
  const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int quarter = 0; quarter < 4; ++quarter) {
    const int h = quarter / 2, s = quarter % 2;  // the record (16 rows) and its half
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* record = group + (b * 2 + h) * Q4_RECORD;
      if (quarter == 0 && b + SPAN < blocks)
        for (int line = 0; line < 2 * Q4_RECORD; line += 64)
          _mm_prefetch((const char*)(record + SPAN * 2 * Q4_RECORD + line), _MM_HINT_T0);
      __m256i w[8];  // w[u]: rows 8s..8s+7 × inputs 4u..4u+3, lane j row 8s + j
      for (int t = 0; t < 4; ++t) {  // low nibbles inputs 8t..8t+3, high nibbles 8t+4..8t+7
        const __m256i v = _mm256_loadu_si256((const __m256i*)(record + 64 * t + 32 * s));
        w[2 * t] = _mm256_and_si256(v, nibble);
        w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(record + 256 + 16 * s)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(record + 288 + 16 * s)));
      for (int r = 0; r < R; ++r) {
        const int64_t at = (r0 + r) * blocks + b;
        const int32_t* q = (const int32_t*)(x.codes.data() + 32 * at);  // 8 groups of 4 codes
        // pairs of products ≤ 2·15·127 in int16: the block's 8 groups sum to at most 30,480, no saturation
        __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(q[0]));
        for (int u = 1; u < 8; ++u) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[u], _mm256_set1_epi32(q[u])));
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(x.scale[at])), acc[r]);
        acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.weighted[at]), acc[r]);  // the minima against the codes
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[r]);
      for (int j = 0; j < 8; ++j) out[(r0 + r) * N + 32 * p + 16 * h + 8 * s + j] = c10::BFloat16(lanes[j]);
    }
  }
}

using Q4Group = void (*)(const Codes&, int64_t, int64_t, const uint8_t*, c10::BFloat16*, int64_t, int64_t);

template <size_t... R>
constexpr std::array<Q4Group, sizeof...(R)> q4_groups(std::index_sequence<R...>) {
  return {&q4_group<R + 1>...};  // entry r - 1: a group of r rows
}

at::Tensor q4_mm(const at::Tensor& rows, const at::Tensor& records) {
  const int64_t M = rows.size(0), K = rows.size(1), N = records.size(0) * 32;
  const at::Tensor x = rows.contiguous();
  const Codes codes = quantise(x.data_ptr<c10::BFloat16>(), M, K);
  at::Tensor out = at::empty({M, N}, rows.options());
  const at::Tensor weights = records.contiguous();
  const uint8_t* base = weights.data_ptr<uint8_t>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  static constexpr auto by_rows = q4_groups(std::make_index_sequence<ROWS>());
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r0 = 0; r0 < M; r0 += ROWS)  // rows in groups of ROWS, the last of 1..ROWS
        by_rows[std::min<int64_t>(ROWS, M - r0) - 1](codes, r0, K, base + p * (K / 32) * 2 * Q4_RECORD, o, N, p);
  });
  return out;
}

// ---- 8-bit blocks: float32 FMAs ----

using Group = void (*)(const Input*, int64_t, const uint8_t*, int64_t, c10::BFloat16*, int64_t);

template <typename Format, size_t... R>
constexpr std::array<Group, sizeof...(R)> groups(std::index_sequence<R...>) {
  return {&output_group<Format, R + 1>...};  // entry r - 1: a group of r rows
}

template <typename Format>
void product(const Input* x, int64_t M, int64_t K, const uint8_t* records, c10::BFloat16* out, int64_t N,
             int64_t p) {
  static constexpr auto by_rows = groups<Format>(std::make_index_sequence<ROWS>());
  for (int64_t r0 = 0; r0 < M; r0 += ROWS)  // rows in groups of ROWS, the last of 1..ROWS
    by_rows[std::min<int64_t>(ROWS, M - r0) - 1](x + r0 * K, K, records, p, out + r0 * N, N);
}

at::Tensor vector_mm(const at::Tensor& rows, const at::Tensor& records) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kBFloat16, "rows must be [M, K] bf16");
  const int64_t size = records.size(-1);
  TORCH_CHECK(records.dim() == 4 && records.size(2) == 2 && (size == Q4_RECORD || size == Q8_RECORD),
              "not packed records");
  const int64_t M = rows.size(0), K = rows.size(1), N = records.size(0) * 32;
  TORCH_CHECK(M >= 1 && K == records.size(1) * 32, "rows of the weight's input width");
  if (size == Q4_RECORD) return q4_mm(rows, records);
  const at::Tensor x = rows.contiguous().to(c10::CppTypeToScalarType<Input>::value);
  at::Tensor out = at::empty({M, N}, rows.options());
  const at::Tensor weights = records.contiguous();
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      product<Q8>(x.data_ptr<Input>(), M, K, weights.data_ptr<uint8_t>(), out.data_ptr<c10::BFloat16>(), N, p);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &vector_mm); }
