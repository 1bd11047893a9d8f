// diversed::amx_mm on AVX2 with FMA, for x86 CPUs with neither AMX nor AVX-512 VNNI: rows [M, K] bf16 times a
// GGUF-quantised weight [N, K] -> [M, N] bf16, on the AMX kernel's records (amx_gguf.py packs them;
// amx_gguf.cpp documents their layout). The codes become float32 weights d·q + m, 8 at a time (the GGUF's
// own values: rounding them to bf16 first cost 1.5-2x the time there), multiplied by float32 inputs with FMAs.
// The weight streams as stored, and each conversion serves up to ROWS input rows, so a pass over a few tokens
// converts each block once per ROWS rows, and even a prompt's pass runs faster than on the dense bf16 weights
// (docs/measurements/speed.md). Every output element sums its inputs the same way whatever M is (lane by
// lane over the blocks in order, then one tree over the lanes), so a row's result does not depend on the
// rows beside it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <utility>

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
struct Q4 {
  static constexpr int RECORD = Q4_RECORD;
  static inline void weights(const uint8_t* record, int i, int c, const float* d, const float* m, Weights& even,
                             Weights& odd) {
    // byte 32i + k: row 2i's code for input k in its low nibble, row 2i+1's in its high nibble
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(record + 32 * i + 8 * c)));
    const __m256 low = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
    const __m256 high = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
    even = _mm256_fmadd_ps(low, _mm256_set1_ps(d[2 * i]), _mm256_set1_ps(m[2 * i]));
    odd = _mm256_fmadd_ps(high, _mm256_set1_ps(d[2 * i + 1]), _mm256_set1_ps(m[2 * i + 1]));
  }
  static inline void scales(const uint8_t* record, float* d, float* m) {
    halves(record + 256, d);
    halves(record + 288, m);
  }
};

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
  const at::Tensor x = rows.contiguous().to(c10::CppTypeToScalarType<Input>::value);
  at::Tensor out = at::empty({M, N}, rows.options());
  const at::Tensor weights = records.contiguous();
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    auto run = size == Q4_RECORD ? product<Q4> : product<Q8>;
    for (int64_t p = begin; p < end; ++p)
      run(x.data_ptr<Input>(), M, K, weights.data_ptr<uint8_t>(), out.data_ptr<c10::BFloat16>(), N, p);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &vector_mm); }
